#!/usr/bin/env python3
"""Golden read-back of nibble's compressed-tensors exports, dequantized by compressed-tensors itself.

nibble exports stories260K in the compressed-tensors layout (`nibble quantize --layout
compressed-tensors`), and transformers loads each export with
`CompressedTensorsConfig(dequantize=True)`, which hands the weights to the compressed-tensors
package's own decompressors (NVFP4PackedCompressor, the MXFP8 and float-quantized compressors). The
cases:

  w4a16            nvfp4_w4a16 (nvfp4-pack-quantized: weight_packed, weight_scale, weight_global_scale)
  mxfp8            mxfp8 (mxfp8-quantized: E4M3 weight, U8 E8M0 weight_scale)
  fp8_per_channel  fp8_per_channel (float-quantized, channel strategy: weight_scale [o, 1])
  fp8              fp8 W8A8 (float-quantized, tensor strategy), calibrated on 8 rows of 128 tokens of
                   text/tinystories_train_head_2MiB.txt with seed 1
  mixed            tests/recipes/fixtures/mixed.lua (MXFP8 on *.mlp.*, NVFP4 elsewhere: "mixed-precision"
                   with per-module targets). transformers' loader applies one dense scheme to every
                   layer, so this case goes through compressed-tensors' ModelCompressor directly:
                   apply_quantization_config, compress_model (the compressed parameters), the
                   checkpoint's state dict, decompress_model.
  fp8_kv           fp8 W8A8 as above plus an FP8 KV cache (--kv-cache fp8): kv_cache_scheme and
                   model.layers.N.self_attn.k_scale / v_scale. Also through ModelCompressor: its
                   apply_quantization_config registers k_scale / v_scale on each attention module and the
                   checkpoint must load into them with no unexpected or missing key; the scales it loaded
                   are recorded (kv_scales). compressed-tensors 0.20 recognises a cached attention module by
                   a past_key_value(s) argument, which transformers 5 renamed to `cache`: the generator
                   widens that test to "an attention module with k_proj / v_proj" for this run.

Written into tests/golden/data/ct_readback/:
  <case>.safetensors  the dequantized float32 weights of three modules (layers.0 k_proj, layers.2 up_proj,
                      layers.4 o_proj; and layers.1 down_proj where it is quantized)
  <case>.json         for every quantized module: the float64 sum and sum of squares of its dequantized
                      weight and whether its values are bf16 (compressed-tensors dequantizes NVFP4 into
                      bfloat16); the nibble command, the versions used

Run by hand (never in CI) with a built nibble:
  /root/nbvenv/bin/python tests/golden/gen_ct_golden.py --nibble /tmp/build/nibble [--data ../shared/data]
"""
import argparse
import json
import os
import subprocess
import tempfile
import warnings

import torch
from safetensors.torch import save_file

warnings.filterwarnings("ignore")

import compressed_tensors  # noqa: E402
import transformers  # noqa: E402
from transformers import AutoModelForCausalLM, CompressedTensorsConfig  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "data", "ct_readback")

CASES = {
    "w4a16": ["--format", "nvfp4_w4a16"],
    "mxfp8": ["--format", "mxfp8"],
    "fp8_per_channel": ["--format", "fp8_per_channel"],
    "fp8": ["--format", "fp8", "--calib", "{data}/text/tinystories_train_head_2MiB.txt", "--samples", "8",
            "--seq-len", "128", "--batch", "4", "--seed", "1"],
    "mixed": ["--recipe", "tests/recipes/fixtures/mixed.lua"],
    "fp8_kv": ["--format", "fp8", "--calib", "{data}/text/tinystories_train_head_2MiB.txt", "--samples", "8",
               "--seq-len", "128", "--batch", "4", "--seed", "1", "--kv-cache", "fp8"],
}


def widen_cached_attention():
    import compressed_tensors.quantization.lifecycle.apply as app
    import compressed_tensors.quantization.lifecycle.initialize as ini

    def cached(module):
        return ini._is_attention_module(module) and any(hasattr(module, n) for n in ini._KV_CACHE_PROJECTION_NAMES)
    app.is_cached_attention_module = cached
    ini.is_cached_attention_module = cached
SAVED = ["model.layers.0.self_attn.k_proj", "model.layers.2.mlp.up_proj", "model.layers.4.self_attn.o_proj",
         "model.layers.1.mlp.down_proj"]


def decompress_with_model_compressor(path, qc_dict):
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import QuantizationConfig, apply_quantization_config
    from safetensors.torch import load_file
    from transformers import AutoConfig, LlamaForCausalLM

    cfg = AutoConfig.from_pretrained(path)
    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config
    model = LlamaForCausalLM(cfg).float()
    qc = QuantizationConfig.model_validate(qc_dict)
    apply_quantization_config(model, qc)
    mc = ModelCompressor(quantization_config=qc)
    mc.compress_model(model)
    missing, unexpected = model.load_state_dict(load_file(os.path.join(path, "model.safetensors")), strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    mc.decompress_model(model)
    return model


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nibble", default=os.environ.get("NIBBLE_BIN", "nibble"))
    ap.add_argument("--data", default=os.path.join(HERE, "..", "..", "..", "shared", "data"))
    ap.add_argument("--cases", default="", help="comma-separated subset of the cases (default: all)")
    args = ap.parse_args()
    data = os.path.abspath(args.data)
    hf_dir = os.path.join(data, "stories260K", "hf")
    os.makedirs(OUT, exist_ok=True)
    only = set(args.cases.split(",")) if args.cases else None
    for name, extra in CASES.items():
        if only is not None and name not in only:
            continue
        extra = [a.replace("{data}", data) for a in extra]
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "export")
            if extra[0] == "--recipe":
                cmd = [args.nibble, "run", os.path.join(HERE, "..", "..", extra[1]), "model=" + hf_dir,
                       "out=" + out, "layout=compressed-tensors"]
            else:
                cmd = [args.nibble, "quantize", "--model", hf_dir, *extra, "--layout", "compressed-tensors",
                       "--out", out, "--quiet"]
            subprocess.run(cmd, check=True, stderr=subprocess.DEVNULL)
            with open(os.path.join(out, "config.json")) as f:
                qc = json.load(f)["quantization_config"]
            kv_scales = {}
            if qc.get("format") == "mixed-precision" or qc.get("kv_cache_scheme"):
                if qc.get("kv_cache_scheme"):
                    widen_cached_attention()
                model = decompress_with_model_compressor(out, qc)
                for pname, prm in model.named_parameters():
                    if pname.endswith(".k_scale") or pname.endswith(".v_scale"):
                        kv_scales[pname] = {"value": float(prm.detach().float().reshape(-1)[0]),
                                            "shape": list(prm.shape)}
            else:
                model = AutoModelForCausalLM.from_pretrained(
                    out, dtype=torch.float32, quantization_config=CompressedTensorsConfig(dequantize=True))
            ignore = set(qc.get("ignore") or [])
            stats, tensors = {}, {}
            for mname, mod in model.named_modules():
                if not isinstance(mod, torch.nn.Linear) or mname in ignore or mname == "lm_head":
                    continue
                w = mod.weight.detach().to(torch.float32).contiguous()
                wd = w.double()
                # NVFP4PackedCompressor unpacks into bfloat16 (unpack_fp4_from_uint8's default), so its
                # weights are bf16(e2m1 * f32(e4m3 / weight_global_scale)): say which values are bf16
                bf16 = bool(torch.equal(w, w.to(torch.bfloat16).to(torch.float32)))
                stats[mname] = {"sum": float(wd.sum()), "sumsq": float((wd * wd).sum()),
                                "dtype": "bfloat16" if bf16 else "float32"}
                if mname in SAVED:
                    tensors[mname + ".weight"] = w
        save_file(tensors, os.path.join(OUT, name + ".safetensors"), metadata={"format": "pt"})
        meta = {
            "case": name,
            "nibble_args": [a.replace(data, "$DATA") for a in extra] + ["--layout", "compressed-tensors"],
            "format": qc.get("format"),
            "versions": {"compressed_tensors": compressed_tensors.__version__, "torch": torch.__version__,
                         "transformers": transformers.__version__},
            "modules": stats,
        }
        if kv_scales:
            meta["kv_scales"] = kv_scales
            meta["kv_cache_scheme"] = qc["kv_cache_scheme"]
        with open(os.path.join(OUT, name + ".json"), "w") as f:
            json.dump(meta, f, indent=1, sort_keys=True)
            f.write("\n")
        print(f"{name}: {qc.get('format')}, {len(stats)} modules, saved {sorted(tensors)}")


if __name__ == "__main__":
    main()
