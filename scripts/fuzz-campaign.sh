#!/bin/sh
# A fuzzing campaign: builds the fuzz preset (clang, libFuzzer, ASan+UBSan), runs every target of
# tests/fuzz for SECONDS_PER_TARGET (two at a time; FUZZ_JOBS to change), and records per-target
# totals (executions, coverage as cov/ft, corpus size, findings) in bench/results/fuzz.json.
# With --update-corpus, the inputs that add coverage beyond the seeds and the committed corpus are
# merged (libFuzzer -merge=1, minimal; each input cut to FUZZ_MERGE_MAX_LEN bytes, default 4096,
# to keep the committed corpus small) into tests/fuzz/TARGET/corpus/ for committing.
# A finding leaves its input under build-fuzz/fuzz-out/TARGET/artifacts/; fix the parser, then
# commit that input under tests/fuzz/TARGET/crashes/ (ctest and CI replay it from then on).
# Usage: scripts/fuzz-campaign.sh [--update-corpus] SECONDS_PER_TARGET [TARGET...]
set -eu
cd "$(dirname "$0")/.."
UPDATE=0
if [ "${1:-}" = --update-corpus ]; then UPDATE=1; shift; fi
[ $# -ge 1 ] || { echo "usage: scripts/fuzz-campaign.sh [--update-corpus] SECONDS_PER_TARGET [TARGET...]" >&2; exit 2; }
SECS=$1
shift
TARGETS=${*:-"safetensors st_index gguf tokenizer_json tokenizer_model config data checkpoint readback qad_checkpoint"}
cmake --preset fuzz >/dev/null
cmake --build build-fuzz -j"$(nproc 2>/dev/null || echo 2)" --target fuzz >/dev/null
START=$(date -u +%Y-%m-%dT%H:%M:%SZ)
LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
rc=0
tests/fuzz/run.sh build-fuzz "$SECS" $TARGETS || rc=$?
LOAD1=$(cut -d' ' -f1-3 /proc/loadavg)

if [ "$UPDATE" = 1 ]; then
  for t in $TARGETS; do
    have=build-fuzz/fuzz-merge/$t
    mkdir -p tests/fuzz/"$t"/corpus
    rm -rf "$have"
    mkdir -p "$have"
    cp tests/fuzz/"$t"/corpus/* "$have"/ 2>/dev/null || true
    ls "$have" > "$have.before"
    if [ -f tests/fuzz/"$t"/seeds.txt ]; then
      # seeds count as covered already: they are replayed from where they live, never copied in
      while IFS= read -r s; do
        case $s in shared:*) f=${NIBBLE_SHARED_DATA:-../shared/data}/${s#shared:} ;; *) f=$s ;; esac
        [ -f "$f" ] && cp "$f" "$have/seed-$(echo "$s" | tr '/:' '__')"
      done < tests/fuzz/"$t"/seeds.txt
    fi
    ls "$have" > "$have.seeded"
    build-fuzz/tests/fuzz/fuzz_"$t" -merge=1 -max_len="${FUZZ_MERGE_MAX_LEN:-4096}" "$have" build-fuzz/fuzz-out/"$t"/corpus \
      > "$have.log" 2>&1 || true
    ls "$have" | while IFS= read -r f; do
      grep -qxF "$f" "$have.seeded" || cp "$have/$f" tests/fuzz/"$t"/corpus/
    done
    echo "corpus $t: $(ls tests/fuzz/"$t"/corpus | wc -l) files committed-side ($(grep -c . "$have.before" || true) before)"
  done
fi

python3 - "$SECS" "$START" "$LOAD0" "$LOAD1" $TARGETS <<'PY'
import json, os, re, subprocess, sys
secs, start, load0, load1, targets = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:]
rows, notes = [], []
total_exec = 0
for t in targets:
    d = os.path.join("build-fuzz", "fuzz-out", t)
    log = open(os.path.join(d, "log"), errors="replace").read() if os.path.exists(os.path.join(d, "log")) else ""
    rc = open(os.path.join(d, "rc")).read().strip() if os.path.exists(os.path.join(d, "rc")) else "?"
    execs = re.findall(r"stat::number_of_executed_units: (\d+)", log)
    cov = re.findall(r"cov: (\d+) ft: (\d+)", log)
    corp = len(os.listdir(os.path.join(d, "corpus"))) if os.path.isdir(os.path.join(d, "corpus")) else 0
    arts = sorted(os.listdir(os.path.join(d, "artifacts"))) if os.path.isdir(os.path.join(d, "artifacts")) else []
    n = int(execs[-1]) if execs else 0
    total_exec += n
    rows.append([t, secs, str(n), str(round(n / float(secs))) if float(secs) > 0 else "0",
                 cov[-1][0] if cov else "?", cov[-1][1] if cov else "?", str(corp), str(len(arts)),
                 ", ".join(arts) if arts else ("exit " + rc if rc != "0" else "")])
    if rc != "0":
        summary = [l for l in log.splitlines() if "SUMMARY" in l or "runtime error" in l][:2]
        notes.append("%s: finding (exit %s): %s" % (t, rc, " / ".join(summary) or "see the log"))
def sh(cmd):
    try: return subprocess.check_output(cmd, shell=True, text=True, stderr=subprocess.DEVNULL).strip()
    except Exception: return ""
cpu = sh("sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -1")
ncpu = sh("nproc")
rec = {
    "bench": "fuzz",
    "title": "Fuzzing campaign: libFuzzer + ASan + UBSan, one target per parser",
    "command": "scripts/fuzz-campaign.sh " + secs,
    "commit": sh("git rev-parse HEAD"),
    "date": start,
    "machine": {"cpu": "%s, %s CPUs" % (cpu, ncpu), "compiler": sh("clang --version | head -1"),
                "features": " ".join(f for f in sh("sed -n 's/^flags[^:]*: //p' /proc/cpuinfo | head -1").split()
                                     if f in ("avx2", "fma", "avx512f", "avx512bw", "avx512_bf16", "amx_tile")),
                "threads": int(os.environ.get("FUZZ_JOBS", ncpu or "1")),
                "blas": "not used (parsers only)", "blas_core": "-"},
    "tables": [{
        "caption": "per target: %s s of fuzzing after replaying the committed corpus, reproducers and seeds; "
                   "cov = covered edges, ft = libFuzzer features, at the end of the run" % secs,
        "columns": ["target", "seconds", "execs", "exec/s", "cov", "ft", "corpus", "findings", "finding inputs"],
        "rows": rows}],
    "notes": ["%d executions in all" % total_exec,
              "limits per input: timeout %s s, rss %s MB, single allocation %s MB, max_len %s bytes" % (
                  os.environ.get("FUZZ_TIMEOUT", "20"), os.environ.get("FUZZ_RSS_MB", "2560"),
                  os.environ.get("FUZZ_MALLOC_MB", "512"), os.environ.get("FUZZ_MAX_LEN", "600000")),
              "load average (1, 5, 15 min) before the run %s, after it %s" % (load0, load1)] + notes,
}
os.makedirs("bench/results", exist_ok=True)
with open("bench/results/fuzz.json", "w") as f:
    json.dump(rec, f, indent=2, sort_keys=True)
    f.write("\n")
print("wrote bench/results/fuzz.json (%d executions)" % total_exec)
PY
exit $rc
