"""Writes a bench's results as bench/results/<bench>.json (the schema bench/RESULTS.md is generated from):
{"bench", "title", "command", "commit", "date", "machine": {"cpu", "features", "threads", "blas", "blas_core"},
 "tables": [{"caption", "columns", "rows"}], "notes": [...]}. Shared by the Python drivers of the benches."""
import datetime
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def command():
    """The command as the user typed it: the .sh wrappers export it in NIBBLE_BENCH_COMMAND."""
    return os.environ.get("NIBBLE_BENCH_COMMAND") or " ".join([os.path.relpath(sys.argv[0])] + sys.argv[1:])


def run_json(cmd, env=None):
    """The last JSON line a bench program (or the PyTorch side) prints."""
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    return json.loads([ln for ln in out.splitlines() if ln.startswith("{")][-1])


def bench_env(isa):
    """The environment the compared programs run in. isa None: as the user's, minus OPENBLAS_CORETYPE (nibble
    picks its kernels itself, as it does for every user); "avx2": both sides held to AVX2 (OpenBLAS Haswell
    kernels for nibble, MKL_ENABLE_INSTRUCTIONS / ATen / oneDNN capped at AVX2 for PyTorch)."""
    env = dict(os.environ)
    for k in ("OPENBLAS_CORETYPE", "NIBBLE_BLAS_PRETEND_CORE", "NIBBLE_BLAS"):
        env.pop(k, None)
    if isa == "avx2":
        env.update(OPENBLAS_CORETYPE="Haswell", MKL_ENABLE_INSTRUCTIONS="AVX2", ATEN_CPU_CAPABILITY="avx2",
                   ONEDNN_MAX_CPU_ISA="AVX2", DNNL_MAX_CPU_ISA="AVX2")
    elif isa == "prescott-pick":
        env.update(NIBBLE_BLAS_PRETEND_CORE="Prescott")
    return env


# The --isa modes of the Python bench drivers: (title suffix, environment note).
ISA_MODES = {
    None: ("", "as given, without OPENBLAS_CORETYPE (nibble picks its kernels)"),
    "avx2": (" (both sides held to AVX2)", "OPENBLAS_CORETYPE=Haswell for nibble; MKL_ENABLE_INSTRUCTIONS=AVX2, "
             "ATEN_CPU_CAPABILITY=avx2, ONEDNN_MAX_CPU_ISA=AVX2 for PyTorch"),
    "prescott-pick": (" (OpenBLAS loaded as if it had picked Prescott, as 0.3.21 does on family 6 model 207)",
                      "NIBBLE_BLAS_PRETEND_CORE=Prescott for nibble: libnibble must switch to the CPU's kernels"),
}


def write(bench, title, nibble_json, threads, tables, notes):
    """nibble_json: one JSON line of the bench program (its "gemm" line says the CPU and the kernels)."""
    gemm = nibble_json.get("gemm", "")
    cpu = features = ""
    if "; cpu: " in gemm:
        cpu = gemm.split("; cpu: ", 1)[1].split("; features: ")[0]
        features = gemm.split("; features: ", 1)[1] if "; features: " in gemm else ""
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=HERE, capture_output=True, text=True).stdout.strip()
    except OSError:
        commit = ""
    doc = {"bench": bench, "title": title, "command": command(), "commit": commit,
           "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
           "machine": {"cpu": cpu, "features": features, "threads": threads, "blas": nibble_json.get("blas", ""),
                       "blas_core": nibble_json.get("blas_core", "")},
           "tables": tables, "notes": notes + ([gemm] if gemm else [])}
    # under bench/record.lua the record goes where it says (it completes command, commit, date, machine)
    path = os.environ.get("NIBBLE_BENCH_JSON") or os.path.join(HERE, "results", bench + ".json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print(f"wrote {os.path.relpath(path)}")
