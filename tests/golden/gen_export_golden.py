#!/usr/bin/env python3
"""Golden ModelOpt exports of stories260K, made by nvidia-modelopt's own exporter on CPU.

For each case, stories260K (../shared/data/stories260K/hf, float32) is loaded as a transformers
LlamaForCausalLM, quantized with ModelOpt's stock config (`mtq.quantize`, max calibration over one
fixed batch of token ids), and written with the real `export_hf_checkpoint`. The cases:

  w4a16   W4A16_NVFP4_CFG   weight-only NVFP4 (down_proj disabled: 172 is not a multiple of 16)
  nvfp4   NVFP4_DEFAULT_CFG W4A4 NVFP4, input_scale from the calibrated input amax (down_proj disabled)
  mxfp8   MXFP8_DEFAULT_CFG MXFP8 weights, dynamic MX activations (down_proj disabled: 172 % 32 != 0)
  fp8     FP8_DEFAULT_CFG   FP8 per tensor, weights and activations (every linear but lm_head)
  mixed   W4A16_NVFP4_CFG with MXFP8 weights on *mlp* (MIXED_PRECISION; down_proj disabled), the
          same as tests/recipes/fixtures/mixed.lua
  w4a16_kv  W4A16_NVFP4_CFG + FP8_KV_CFG: weight-only NVFP4 and an FP8 KV cache (the attention's
          k_bmm_quantizer / v_bmm_quantizer, calibrated on K after RoPE and V; exported as
          self_attn.k_proj.k_scale / v_proj.v_scale = amax / 448, kv_cache_quant_algo "FP8")

Weight amax under max calibration is max|w| (deterministic); nibble computes the same from the same
weights. Input amax depends on the forward pass, so it is recorded here (before export) and the test
gives nibble the same values; so do the K/V amaxes (kv_amax: {layer: [k, v]}), which the test also
compares with nibble's own calibration on the same token ids. For the KV case the forward with ModelOpt's
own K/V fake quant (weight quantizers switched off) is recorded too: kv_nll, the mean NLL of the first
512 validation tokens (stories260K/reference/valid_chunk0.json) over positions 256..510, as llama.cpp
scores a chunk; base_nll the same without quantization. Written into tests/golden/data/modelopt_export/:

  <case>.safetensors  every tensor of the quantized modules (weight, weight_scale, weight_scale_2,
                      input_scale) exactly as ModelOpt wrote it
  <case>.json         hf_quant_config.json, config.json's quantization_config, the input amaxes,
                      the sha256 of ModelOpt's whole model.safetensors, the versions used

Run by hand with the venv that has nvidia-modelopt (never in CI):
  /root/nbvenv/bin/python tests/golden/gen_export_golden.py [--data ../shared/data]
"""
import argparse
import copy
import hashlib
import json
import os
import tempfile
import warnings

import torch
from safetensors import safe_open
from safetensors.torch import save_file

warnings.filterwarnings("ignore")

import modelopt  # noqa: E402
import modelopt.torch.quantization as mtq  # noqa: E402
import transformers  # noqa: E402
from modelopt.torch.export import export_hf_checkpoint  # noqa: E402
from transformers import LlamaForCausalLM  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "data", "modelopt_export")

CASES = {
    "w4a16": ("W4A16_NVFP4_CFG", True),
    "nvfp4": ("NVFP4_DEFAULT_CFG", True),
    "mxfp8": ("MXFP8_DEFAULT_CFG", True),
    "fp8": ("FP8_DEFAULT_CFG", False),
    "mixed": ("W4A16_NVFP4_CFG", True),
    "w4a16_kv": ("W4A16_NVFP4_CFG", True),
}

# One fixed calibration batch: BOS then a deterministic walk over the 512-token vocabulary.
CALIB_IDS = [[1] + [(i * 37 + 11 + 101 * b) % 512 for i in range(127)] for b in range(2)]


def amax_of(q):
    if q is None:
        return None
    a = getattr(q, "amax", None)
    if a is None or not q.is_enabled:
        return None
    a = a.detach().float().reshape(-1)
    return float(a[0]) if a.numel() == 1 else None


def chunk_nll(model, hf_dir):
    with open(os.path.join(hf_dir, "..", "reference", "valid_chunk0.json")) as f:
        ids = torch.tensor([json.load(f)["ids"]])
    with torch.no_grad():
        lp = model(ids).logits[0].double().log_softmax(-1)
    return float(-sum(lp[p, ids[0, p + 1]] for p in range(256, 511)) / 255)


def run_case(hf_dir, name, cfg_name, disable_down):
    model = LlamaForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    model.eval()
    cfg = copy.deepcopy(getattr(mtq, cfg_name))
    if name == "mixed":
        mx = copy.deepcopy(mtq.MXFP8_DEFAULT_CFG["quant_cfg"][1]["cfg"])   # the MXFP8 weight quantizer
        cfg["quant_cfg"].append({"quantizer_name": "*mlp*weight_quantizer", "cfg": mx})
    if name.endswith("_kv"):
        cfg["quant_cfg"] += copy.deepcopy(mtq.FP8_KV_CFG["quant_cfg"])
    if disable_down:
        cfg["quant_cfg"].append({"enable": False, "quantizer_name": "*down_proj*"})
    ids = torch.tensor(CALIB_IDS)

    def loop(m):
        with torch.no_grad():
            m(ids)

    base_nll = chunk_nll(model, hf_dir) if name.endswith("_kv") else None
    mtq.quantize(model, cfg, loop)
    kv_nll = None
    if name.endswith("_kv"):
        wqs = [m.weight_quantizer for m in model.modules()
               if getattr(m, "weight_quantizer", None) is not None and m.weight_quantizer.is_enabled]
        for q in wqs:
            q.disable()
        kv_nll = chunk_nll(model, hf_dir)
        for q in wqs:
            q.enable()
    input_amax, weight_amax, kv_amax = {}, {}, {}
    for l, layer in enumerate(model.model.layers):
        att = layer.self_attn
        k, v = amax_of(getattr(att, "k_bmm_quantizer", None)), amax_of(getattr(att, "v_bmm_quantizer", None))
        if k is not None or v is not None:
            kv_amax[str(l)] = [k, v]
    for mname, mod in model.named_modules():
        iq, wq = getattr(mod, "input_quantizer", None), getattr(mod, "weight_quantizer", None)
        if wq is None or not wq.is_enabled:
            continue
        if iq is not None and amax_of(iq) is not None:
            input_amax[mname] = amax_of(iq)
        if amax_of(wq) is not None:
            weight_amax[mname] = amax_of(wq)
    with tempfile.TemporaryDirectory() as d:
        export_hf_checkpoint(model, export_dir=d)
        with open(os.path.join(d, "hf_quant_config.json")) as f:
            hf_quant_config = json.load(f)
        with open(os.path.join(d, "config.json")) as f:
            qc = json.load(f)["quantization_config"]
        st_path = os.path.join(d, "model.safetensors")
        with open(st_path, "rb") as f:
            sha = hashlib.sha256(f.read()).hexdigest()
        tensors, quantized = {}, []
        with safe_open(st_path, "pt") as f:
            for k in f.keys():
                t = f.get_tensor(k)
                mod = k.rsplit(".", 1)[0]
                if k.endswith(".weight") and t.dtype in (torch.uint8, torch.float8_e4m3fn):
                    quantized.append(mod)
            for k in f.keys():
                if k.rsplit(".", 1)[0] in quantized or k.endswith("_scale") and ".self_attn." in k:
                    tensors[k] = f.get_tensor(k).contiguous()
    save_file(tensors, os.path.join(OUT, name + ".safetensors"), metadata={"format": "pt"})
    meta = {
        "case": name,
        "modelopt_config": cfg_name,
        "down_proj_disabled": disable_down,
        "versions": {"modelopt": modelopt.__version__, "torch": torch.__version__,
                     "transformers": transformers.__version__},
        "calib_ids": CALIB_IDS,
        "quantized_modules": sorted(quantized),
        "input_amax": input_amax,
        "weight_amax": weight_amax,
        "kv_amax": kv_amax,
        "kv_nll": kv_nll,
        "base_nll": base_nll,
        "hf_quant_config": hf_quant_config,
        "quantization_config": qc,
        "model_safetensors_sha256": sha,
    }
    with open(os.path.join(OUT, name + ".json"), "w") as f:
        json.dump(meta, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"{name}: {len(quantized)} quantized modules, {len(tensors)} tensors, {len(input_amax)} input amax, sha {sha[:12]}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=os.path.join(HERE, "..", "..", "..", "shared", "data"))
    ap.add_argument("--cases", default="", help="comma-separated subset of the cases (default: all)")
    args = ap.parse_args()
    hf_dir = os.path.join(args.data, "stories260K", "hf")
    os.makedirs(OUT, exist_ok=True)
    only = set(args.cases.split(",")) if args.cases else None
    for name, (cfg_name, disable_down) in CASES.items():
        if only is None or name in only:
            run_case(hf_dir, name, cfg_name, disable_down)


if __name__ == "__main__":
    main()
