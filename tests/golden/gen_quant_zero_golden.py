#!/usr/bin/env python3
"""Golden bytes for a zero amax (an all-zero weight, a dead output row, all-zero activations), made by
nvidia-modelopt itself (run by hand, never in CI):

  CUDA_VISIBLE_DEVICES="" /root/nbvenv/bin/python tests/golden/gen_quant_zero_golden.py

Writes tests/golden/data/quant_zero_golden.json, which tests/c/test_quant_edge.c reproduces.

ModelOpt's rule for a zero amax is TensorQuantizer._sanitize_export_amax (0.47): a zero (or NaN) amax
entry is replaced by the quantizer's maxbound (448 for FP8 E4M3, 6 for NVFP4's E2M1 with E4M3 block
scales), so the exported scale stays positive. export_amax() applies it, and with it the input scales
(get_scaling_factor, NVFP4QTensor.get_activation_scaling_factor). The weight export path of 0.47 does not
go through export_amax for every format, though; what it writes from the raw zero amax (recorded here
under "raw", measured on one nn.Linear with _export_quantized_weight, as tests/golden/gen_quant_golden.py
does):
  * FP8 per tensor, all-zero weight: weight_scale 0.0 and weight bytes 0xFF (NaN = 0/0).
  * NVFP4 dynamic, all-zero weight: weight_scale_2 0.0, block scales 0xFF (NaN), codes 0x77.
  * FP8 per channel, a zero row: weight_scale 1.0 for that row and zero codes (already sane).
nibble applies the sanitize rule everywhere, so its bytes are what ModelOpt's exporter writes once the
quantizer's amax is sanitized first ("sanitized": the same _export_quantized_weight after
_amax = _sanitize_export_amax(_amax), and for static NVFP4 _global_amax likewise). NaN stays an error in
nibble (a NaN amax means NaN data, which nibble rejects before it could be calibrated).
"""
import base64
import copy
import json
import os
import warnings

os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
warnings.filterwarnings("ignore")

import torch  # noqa: E402

import modelopt  # noqa: E402
import modelopt.torch.quantization as mtq  # noqa: E402
from modelopt.torch.export.unified_export_hf import _export_quantized_weight  # noqa: E402
from gen_quant_golden import linear_for, weight_cfg  # noqa: E402  (the same configs and modules as the main golden set)

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "data", "quant_zero_golden.json")


def b64(t):
    t = t.detach().contiguous()
    if t.dtype == torch.float8_e4m3fn:
        t = t.view(torch.uint8)
    return base64.b64encode(t.reshape(-1).view(torch.uint8).numpy().tobytes()).decode()


def f32(t):
    return b64(t.detach().to(torch.float32).reshape(-1))


CONFIGS = {
    "fp8": mtq.FP8_DEFAULT_CFG,
    "fp8_channel": weight_cfg(mtq.FP8_DEFAULT_CFG, axis=0),
    "nvfp4": mtq.NVFP4_DEFAULT_CFG,
    "nvfp4_static": weight_cfg(mtq.NVFP4_DEFAULT_CFG, block_type="static"),
}


def sanitize(q):
    for attr in ("_amax", "_global_amax"):
        a = getattr(q, attr, None)
        if a is not None:
            a.data.copy_(q._sanitize_export_amax(a))


def export(w, act, cfg, sanitized):
    m = linear_for(w)
    mtq.quantize(m, copy.deepcopy(CONFIGS[cfg]), lambda mm: mm(act))
    if sanitized:
        sanitize(m.weight_quantizer)
    try:
        _export_quantized_weight(m, m.weight.dtype)
    except Exception as e:  # recorded: the raw path may refuse
        return {"error": f"{type(e).__name__}: {e}"}
    out = {"weight": b64(m.weight)}
    for name in ("weight_scale", "weight_scale_2", "input_scale"):
        t = getattr(m, name, None)
        if t is not None:
            out[name] = b64(t) if t.dtype != torch.float32 else f32(t)
    return out


def main():
    g = torch.Generator().manual_seed(3)
    dead_row = (torch.randn(4, 64, generator=g) * 0.05).to(torch.bfloat16)
    dead_row[1] = 0.0
    zeros = torch.zeros(4, 64, dtype=torch.bfloat16)
    act = (torch.randn(8, 64, generator=g) * 2.5).to(torch.bfloat16)
    act_zero = torch.zeros(8, 64, dtype=torch.bfloat16)
    inputs = {"dead_row": dead_row, "zeros": zeros}
    doc = {
        "generator": "tests/golden/gen_quant_zero_golden.py",
        "versions": {"torch": torch.__version__, "modelopt": modelopt.__version__},
        "act": b64(act),
        "inputs": {k: {"shape": list(v.shape), "dtype": "bf16", "data": b64(v)} for k, v in inputs.items()},
        "raw": {},
        "sanitized": {},
        "input_scale_zero_act": {},
    }
    for name, w in inputs.items():
        for kind in ("raw", "sanitized"):
            doc[kind][name] = {cfg: export(w, act, cfg, kind == "sanitized") for cfg in CONFIGS}
    # all-zero activations: the exported input_scale (export_amax sanitizes it in 0.47's own path)
    for cfg in ("fp8", "nvfp4"):
        doc["input_scale_zero_act"][cfg] = export(dead_row, act_zero, cfg, False).get("input_scale")
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"wrote {OUT} ({os.path.getsize(OUT)} bytes)")


if __name__ == "__main__":
    main()
