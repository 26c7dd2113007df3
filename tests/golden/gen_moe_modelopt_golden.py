#!/usr/bin/env python3
"""Golden ModelOpt exports of the tiny MoE models in tests/golden/moe/ (made by gen_moe_golden.py).

Each model is loaded with transformers (float32, experts_implementation="eager", the only one ModelOpt's
fused-expert wrapper intercepts), quantized with ModelOpt's stock config (`mtq.quantize`, max calibration)
and written with the real `export_hf_checkpoint`. Cases:

  w4a16  W4A16_NVFP4_CFG    weight-only NVFP4
  nvfp4  NVFP4_DEFAULT_CFG  W4A4 NVFP4 (input_scale from the calibrated input amax)
  fp8    FP8_DEFAULT_CFG    FP8 per tensor, weights and activations

Every expert gets calibration data: during the calibration forward each MoE block runs twice, once with
the router's top_k = num_experts (every token through every expert; output discarded, for the statistics
only) and once with the real top-k for the block's output (llm-compressor's calibrate_all_experts, and what
ModelOpt's own moe_calib_experts_ratio = 1.0 does for the blocks it wraps). The script does this itself
because in ModelOpt 0.47 with transformers 5 the MoE block is not wrapped (only the fused experts are), so
{"moe_calib_experts_ratio": 1.0} is accepted and silently changes nothing (checked: identical amaxes). The
gate_up input amax is the same either way (every token reaches some expert and the input quantizer is
shared); the down_proj input amax is the max over all experts' SwiGLU outputs, routed or not. The
calibration rows are CALIB_IDS (two fixed rows of 32 ids); routed_tokens in the json gives, per MoE layer,
how many of them the real top-k sent to each expert.

ModelOpt 0.47 with transformers 5 (fused [E, 2I, H] experts, _QuantFusedExperts) keeps one weight quantizer
per expert over the fused gate_up slice (so w1/w3 = gate_proj/up_proj share one global amax and
weight_scale_2) and one down_proj weight quantizer per expert, but ONE input quantizer per layer for all
experts' gate_up input and one for all experts' down_proj input: every expert of a layer exports the same
input_scale. The router (gate) and lm_head stay unquantized. Written into tests/golden/moe/modelopt/:

  <model>_<case>.safetensors  every tensor of the quantized modules (weight, weight_scale, weight_scale_2,
                              input_scale) exactly as ModelOpt wrote it
  <model>_<case>.json         hf_quant_config.json, config.json's quantization_config, the calibrated input
                              amaxes (per module name, before export), the sha256 of ModelOpt's whole
                              model.safetensors, the versions used

Run by hand after gen_moe_golden.py, with the venv that has nvidia-modelopt (never in CI):
  /root/nbvenv/bin/python tests/golden/gen_moe_modelopt_golden.py
"""
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
from transformers import AutoModelForCausalLM  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(HERE, "moe")
OUT = os.path.join(SRC, "modelopt")

MODELS = ["mixtral", "qwen3moe_norm", "qwen3moe_nonorm", "olmoe"]
CASES = {"w4a16": "W4A16_NVFP4_CFG", "nvfp4": "NVFP4_DEFAULT_CFG", "fp8": "FP8_DEFAULT_CFG"}

# two fixed calibration rows: BOS then a deterministic walk over the 128-token vocabulary
CALIB_IDS = [[1] + [(i * 37 + 11 + 53 * b) % 128 for i in range(31)] for b in range(2)]

QUANT_LEAVES = ("weight", "weight_scale", "weight_scale_2", "input_scale")


def input_amaxes(model):
    """Calibrated amax of every enabled input quantizer, by module name (before export folds them)."""
    out = {}
    for n, m in model.named_modules():
        if n.endswith("input_quantizer") and getattr(m, "is_enabled", False) and getattr(m, "amax", None) is not None:
            a = m.amax.detach().float().reshape(-1)
            if a.numel() == 1:
                out[n] = float(a[0])
    return out


def calibrate_all_experts(model, ids):
    """One calibration forward in which every MoE block also runs every token through every expert."""
    routed = {}
    blocks = [(n, m) for n, m in model.named_modules()
              if hasattr(m, "experts") and hasattr(getattr(m, "gate", None), "top_k")]
    for n, b in blocks:
        def both(hidden_states, _b=b, _n=n, _f=b.forward):
            k = _b.gate.top_k
            _b.gate.top_k = _b.gate.num_experts
            try:
                _f(hidden_states.clone())        # statistics only
            finally:
                _b.gate.top_k = k
            _, _, idx = _b.gate(hidden_states.reshape(-1, hidden_states.shape[-1]))
            routed[_n.split(".")[2]] = torch.bincount(idx.reshape(-1), minlength=_b.gate.num_experts).tolist()
            return _f(hidden_states)
        b.forward = both
    try:
        model(ids)
    finally:
        for _, b in blocks:
            del b.forward
    return routed


def main():
    os.makedirs(OUT, exist_ok=True)
    ids = torch.tensor(CALIB_IDS)
    for name in MODELS:
        for case, cfg_name in CASES.items():
            model = AutoModelForCausalLM.from_pretrained(os.path.join(SRC, name), dtype=torch.float32,
                                                         experts_implementation="eager")
            model.eval()
            cfg = copy.deepcopy(getattr(mtq, cfg_name))
            cfg["algorithm"] = {"method": "max"}
            routed = {}
            with torch.no_grad():
                model = mtq.quantize(model, cfg, forward_loop=lambda m: routed.update(calibrate_all_experts(m, ids)))
            amax = input_amaxes(model)
            with tempfile.TemporaryDirectory() as d:
                with torch.no_grad():
                    export_hf_checkpoint(model, export_dir=d)
                with open(os.path.join(d, "hf_quant_config.json")) as f:
                    hfq = json.load(f)
                with open(os.path.join(d, "config.json")) as f:
                    qc = json.load(f).get("quantization_config")
                st = os.path.join(d, "model.safetensors")
                with open(st, "rb") as f:
                    sha = hashlib.sha256(f.read()).hexdigest()
                tensors = {}
                with safe_open(st, "pt") as f:
                    quantized = {k.rsplit(".", 1)[0] for k in f.keys() if k.endswith(".weight_scale")
                                 or k.endswith(".input_scale")}
                    for k in f.keys():
                        mod, leaf = k.rsplit(".", 1)
                        if mod in quantized and leaf in QUANT_LEAVES:
                            tensors[k] = f.get_tensor(k).contiguous()
            save_file(tensors, os.path.join(OUT, f"{name}_{case}.safetensors"))
            meta = {"model": name, "case": case, "config": cfg_name,
                    "algorithm": cfg["algorithm"], "calib_ids": CALIB_IDS, "calibrate_all_experts": True,
                    "routed_tokens": routed,
                    "hf_quant_config": hfq, "quantization_config": qc, "input_amax": amax,
                    "model_safetensors_sha256": sha, "modelopt": modelopt.__version__,
                    "transformers": transformers.__version__, "torch": torch.__version__}
            with open(os.path.join(OUT, f"{name}_{case}.json"), "w") as f:
                json.dump(meta, f, indent=1)
            print(f"{name} {case}: {len(tensors)} tensors, {len(amax)} input amaxes, "
                  f"quant_algo {hfq['quantization']['quant_algo']}")


if __name__ == "__main__":
    main()
