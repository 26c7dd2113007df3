#!/usr/bin/env python3
"""Golden bytes for nibble's quantizers, produced by the real tools (run by hand, never in CI).

  CUDA_VISIBLE_DEVICES="" /root/nbvenv/bin/python tests/golden/gen_quant_golden.py

Writes tests/golden/data/quant_golden.json: the bf16/f32 inputs (slices of stories260K's weights
plus adversarial tensors) and, per input, what nvidia-modelopt exports for NVFP4 (dynamic W4A4,
static max, static mse, four_over_six), MXFP8, FP8 per-tensor and per-channel, and what
compressed-tensors writes for the same inputs (to document where the two tools differ).
tests/c/test_quant_golden.c reproduces every ModelOpt byte.

ModelOpt paths used (0.47, torch CPU):
  * mtq.quantize(nn.Linear, <preset>, forward_loop) for calibration, then the exporter's own
    unified_export_hf._export_quantized_weight(module, bf16), which calls
    NVFP4QTensor.get_weights_scaling_factor(_from_quantizer), to_quantized_weight, MXFP8QTensor.
  * Fused q/k/v: export.quant_utils.preprocess_linear_fusion (dynamic) and ModelOpt's own
    shared-state grouping inside mtq.quantize (static).
  * ModelOpt's dynamic NVFP4 fake quant with a calibrated amax asserts "amax must be a CUDA tensor
    for dynamic block quantization", so the MSE search over a dynamic NVFP4 weight's per-tensor amax
    cannot run on CPU at all: no golden for it (nibble's MSE on dynamic NVFP4 is tested by property).
  * The other ModelOpt path that cannot run on CPU is the static NVFP4 fake quant used by the MSE
    and four_over_six weight search: tensor_quant.StaticBlockwiseFP4FakeQuantFunction requires a
    Triton GPU kernel (static_blockwise_fp4_fake_quant). We substitute a torch CPU port of that
    kernel (the block scales still come from ModelOpt's own compute_fp4_scales; the element
    rounding is fp4_round_magnitude's thresholds; IEEE division where Triton may use div.full).
    Everything around it (max calibration, promotion to the static quantizer, shared global amax,
    MseCalibrator's candidates and argmin, folding the choice into _amax, export) is ModelOpt's.
compressed-tensors (0.20) path: preset schemes, calculate_qparams / generate_gparam for the
scales (what llm-compressor's min-max observers feed it), then the registered compressors'
compress() for the bytes.

What this data showed (nibble follows ModelOpt everywhere; test_quant_golden.c checks each point):
  * NVFP4, CT vs ModelOpt: a block whose scale is 0 in fp32 (an all-zero block, or one so small next
    to the tensor max that amax/(6*s2) underflows) gets 0x20 (CT's eps 0.125) vs ModelOpt's 0x38
    (1.0); a block scale below 2^-9 gets 0x20 vs ModelOpt's clamp 0x01. Elements: CT divides by
    (scale / global_scale), ModelOpt by (scale * s2); the fp32 results differ at E2M1 ties (3 of 2048
    bytes of q_proj). Fed bf16 min/max, CT's global scale is even rounded to bf16 (we pass f32).
  * MXFP8, CT vs ModelOpt: a block max of exactly 1.75*2^k (448, 56) gets one exponent more in CT;
    near 3e38 CT's power-of-two rounding overflows and it writes exponent 0 (0x7F), saturating the block.
  * FP8, CT stores weight_scale in the model dtype (bf16), so its bytes differ where bf16(amax/448)
    does (adv: 2 of 512, adv_range: 23 of 256, q_proj: none).
  * ModelOpt FP8 per tensor under torch 2.15: q = e4m3(bf16(f32(w) / s)) with the f32 scale s itself
    (torch 1.13, as FORMATS §6.4 records, also rounded s to bf16); the e4m3 cast saturates at 448.
  * ModelOpt's per-channel FP8 weight_scale is exported as [out] (the _amax is [out, 1]).
  * ModelOpt's mse on FP8 near the bf16 maximum: every finite candidate has an inf f32 loss and the
    overflowing one a NaN loss, which torch.argmin picks: it exports weight_scale = inf and zeros.
    nibble skips candidates whose amax overflows and keeps the first of the tied ones.
  * The MSE / four_over_six choice is made with ModelOpt's fake-quant arithmetic (fp8_eager with
    torch's reciprocal-multiply for scalar/tensor, block scales that may underflow to 0), and a
    per-tensor or per-channel amax is stored in the weight's dtype (bf16), as ModelOpt's _amax is.
"""
import base64
import copy
import json
import os
import sys
import warnings

os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
warnings.filterwarnings("ignore")

import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

import modelopt  # noqa: E402
import modelopt.torch.quantization as mtq  # noqa: E402
import modelopt.torch.quantization.nn.modules.tensor_quantizer as tqmod  # noqa: E402
from modelopt.torch.export.quant_utils import preprocess_linear_fusion  # noqa: E402
from modelopt.torch.export.unified_export_hf import _export_quantized_weight  # noqa: E402
from modelopt.torch.kernels.quantization.gemm.fp4_kernel import compute_fp4_scales  # noqa: E402

import compressed_tensors  # noqa: E402
from compressed_tensors.compressors.mxfp8.base import MXFP8QuantizationCompressor  # noqa: E402
from compressed_tensors.compressors.naive_quantized.base import NaiveQuantizationCompressor  # noqa: E402
from compressed_tensors.compressors.nvfp4.base import NVFP4PackedCompressor  # noqa: E402
from compressed_tensors.quantization import preset_name_to_scheme  # noqa: E402
from compressed_tensors.quantization.utils import calculate_qparams, generate_gparam  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL = os.path.join(ROOT, "..", "shared", "data", "stories260K", "hf", "model.safetensors")
OUT = os.path.join(ROOT, "tests", "golden", "data", "quant_golden.json")


def b64(t):
    t = t.detach().contiguous()
    if t.dtype in (torch.float8_e4m3fn,):
        t = t.view(torch.uint8)
    return base64.b64encode(t.view(torch.uint8).numpy().tobytes()).decode()


def f32(t):
    return b64(t.detach().to(torch.float32).reshape(-1))


# ---- the CPU port of ModelOpt's Triton static NVFP4 fake-quant kernel --------------------------------

def _fp4_round_magnitude(a):
    return torch.where(a <= 0.25, 0.0, torch.where(a < 0.75, 0.5, torch.where(a <= 1.25, 1.0, torch.where(
        a < 1.75, 1.5, torch.where(a <= 2.5, 2.0, torch.where(a < 3.5, 3.0, torch.where(a <= 5.0, 4.0, 6.0)))))))


def static_blockwise_fp4_fake_quant_cpu(x, amax, global_amax=None, quantize_block_scales=True,
                                        fp8_max_for_normalization=448.0, out_dtype=None, pass_through_bwd=False):
    nb = amax.numel()
    scale = compute_fp4_scales(amax, global_amax, quantize_block_scales,
                               fp8_max_for_normalization=fp8_max_for_normalization).reshape(nb, 1).float()
    xf = x.contiguous().reshape(nb, -1).float()
    zero = scale == 0.0
    safe = torch.where(zero | torch.isnan(scale) | torch.isinf(scale), torch.ones_like(scale), scale)
    q = _fp4_round_magnitude(xf.abs() / safe) * safe
    y = torch.where(zero, torch.zeros_like(q), torch.where(xf >= 0, q, -q))
    return y.to(out_dtype or x.dtype).reshape(x.shape)


tqmod.static_blockwise_fp4_fake_quant = static_blockwise_fp4_fake_quant_cpu


# ---- configs ----------------------------------------------------------------------------------------

def weight_cfg(base, **weight_updates):
    cfg = copy.deepcopy(base)
    for e in cfg["quant_cfg"]:
        if e.get("quantizer_name") == "*weight_quantizer":
            for k, v in weight_updates.items():
                if k == "block_type":
                    e["cfg"]["block_sizes"]["type"] = v
                else:
                    e["cfg"][k] = v
    return cfg


NVFP4_STATIC = weight_cfg(mtq.NVFP4_DEFAULT_CFG, block_type="static")
NVFP4_STATIC_MSE = copy.deepcopy(NVFP4_STATIC)
NVFP4_STATIC_MSE["algorithm"] = {"method": "mse"}           # multipliers 0.25..4.0 step 0.1 (39)
FP8_CHANNEL = weight_cfg(mtq.FP8_DEFAULT_CFG, axis=0)
FP8_MSE = copy.deepcopy(mtq.FP8_DEFAULT_CFG)
FP8_MSE["algorithm"] = {"method": "mse"}

CONFIGS = {
    "nvfp4": mtq.NVFP4_DEFAULT_CFG,          # dynamic weight + dynamic NVFP4 input quantizer (W4A4)
    "nvfp4_static": NVFP4_STATIC,
    "nvfp4_static_mse": NVFP4_STATIC_MSE,
    "nvfp4_46": mtq.NVFP4_FOUR_OVER_SIX_CFG,
    "mxfp8": mtq.MXFP8_DEFAULT_CFG,
    "fp8": mtq.FP8_DEFAULT_CFG,
    "fp8_mse": FP8_MSE,
    "fp8_channel": FP8_CHANNEL,
}


class Attn(torch.nn.Module):
    """A parent with q/k/v children, so ModelOpt's own fused-sibling grouping applies."""

    def __init__(self, wq, wk, wv):
        super().__init__()
        self.q_proj = torch.nn.Linear(wq.shape[1], wq.shape[0], bias=False)
        self.k_proj = torch.nn.Linear(wk.shape[1], wk.shape[0], bias=False)
        self.v_proj = torch.nn.Linear(wv.shape[1], wv.shape[0], bias=False)
        with torch.no_grad():
            self.q_proj.weight.copy_(wq)
            self.k_proj.weight.copy_(wk)
            self.v_proj.weight.copy_(wv)
        self.to(wq.dtype)

    def forward(self, x):
        return self.q_proj(x) + self.k_proj(x).repeat(1, 2) + self.v_proj(x).repeat(1, 2)


def linear_for(w):
    lin = torch.nn.Linear(w.shape[1], w.shape[0], bias=False)
    with torch.no_grad():
        lin.weight = torch.nn.Parameter(w.clone())
    return lin


def read_export(m):
    """Export one quantized linear with ModelOpt's exporter and read what it registered."""
    wq = m.weight_quantizer
    state = {}
    amax = getattr(wq, "_amax", None)
    if amax is not None:
        state["amax"] = f32(amax)
        state["amax_shape"] = list(amax.shape)
        state["amax_dtype"] = str(amax.dtype)
    ga = getattr(wq, "_global_amax", None)
    if ga is not None:
        state["global_amax"] = f32(ga)
    if getattr(m, "input_quantizer", None) is not None and m.input_quantizer.is_enabled and \
            getattr(m.input_quantizer, "_amax", None) is not None:
        state["input_amax"] = f32(m.input_quantizer._amax)
    _export_quantized_weight(m, m.weight.dtype)    # export in the model's own dtype (bf16, or f32 for f32_edges)
    out = {"weight": b64(m.weight), "weight_dtype": str(m.weight.dtype), "weight_shape": list(m.weight.shape)}
    for name in ("weight_scale", "weight_scale_2", "input_scale"):
        t = getattr(m, name, None)
        if t is not None:
            out[name] = b64(t) if t.dtype != torch.float32 else f32(t)
            out[name + "_dtype"] = str(t.dtype)
            out[name + "_shape"] = list(t.shape)
    out.update(state)
    return out


def modelopt_case(w, act, cfg_name):
    m = linear_for(w)
    mtq.quantize(m, copy.deepcopy(CONFIGS[cfg_name]), lambda mm: mm(act))
    return read_export(m)


def modelopt_fused_dynamic(ws, act):
    mods = []
    for w in ws:
        m = linear_for(w)
        mtq.quantize(m, copy.deepcopy(CONFIGS["nvfp4"]), lambda mm: mm(act))
        mods.append(m)
    preprocess_linear_fusion(mods)
    return [read_export(m) for m in mods]


def modelopt_fused_static(ws, act, cfg_name):
    parent = Attn(*ws)
    mtq.quantize(parent, copy.deepcopy(CONFIGS[cfg_name]), lambda mm: mm(act))
    return [read_export(m) for m in (parent.q_proj, parent.k_proj, parent.v_proj)]


# ---- compressed-tensors -------------------------------------------------------------------------------

def ct_nvfp4(w):
    scheme = preset_name_to_scheme("NVFP4A16", ["Linear"])
    args = scheme.weights
    # min/max in f32, as the observers hand them over (bf16 min/max would round the scales to bf16)
    gs = generate_gparam(w.amin().float(), w.amax().float())
    g = w.reshape(w.shape[0], -1, 16).float()
    scale, _ = calculate_qparams(g.amin(-1), g.amax(-1), args, global_scale=gs)
    sd = NVFP4PackedCompressor.compress({"weight": w, "weight_scale": scale, "weight_global_scale": gs}, scheme)
    return {"weight_packed": b64(sd["weight_packed"]), "weight_scale": b64(sd["weight_scale"]),
            "weight_global_scale": f32(sd["weight_global_scale"])}


def ct_mxfp8(w):
    scheme = preset_name_to_scheme("MXFP8A16", ["Linear"])
    g = w.reshape(w.shape[0], -1, 32).float()
    scale, zp = calculate_qparams(g.amin(-1), g.amax(-1), scheme.weights)
    sd = MXFP8QuantizationCompressor.compress({"weight": w, "weight_scale": scale, "weight_zero_point": zp}, scheme)
    return {"weight": b64(sd["weight"]), "weight_scale": b64(sd["weight_scale"])}


def ct_fp8(w):
    scheme = preset_name_to_scheme("FP8", ["Linear"])
    scale, zp = calculate_qparams(w.amin().reshape(1), w.amax().reshape(1), scheme.weights)
    sd = NaiveQuantizationCompressor.compress({"weight": w, "weight_scale": scale, "weight_zero_point": zp}, scheme)
    return {"weight": b64(sd["weight"]), "weight_scale": b64(sd["weight_scale"]),
            "weight_scale_dtype": str(sd["weight_scale"].dtype)}


# ---- inputs ----------------------------------------------------------------------------------------------

def adversarial():
    """NVFP4/FP8 corner cases in one [8, 64] bf16 tensor (global amax 2688, so s2 = 1.0 exactly)."""
    t = torch.zeros(8, 64)
    tv1 = [0, .25, .75, 1.25, 1.75, 2.5, 3.5, 5, 6, -.25, -.75, -1.75, -3.5, -5, 0.3, -6]
    t[0, 0:16] = torch.tensor(tv1)                                   # E2M1 ties at scale 1
    t[0, 16:32] = torch.tensor([2688, -1344, 896, 448, 100, 300, -700, 1104, 1600, 2000, -2208, 0, 50, -120,
                                1504, -2688])                       # saturation, block scale 448
    t[0, 32:48] = 0.0                                                # zero block
    t[0, 48:64] = torch.linspace(-1e-3, 1e-3, 16)                    # block scale clamps to 2^-9
    t[1, 0:16] = torch.tensor([-0.1, 0.1, -0.2, 0.24, -0.26, 6, -0.0, 0.0] * 2)  # -0 codes, exact -0.0
    t[1, 16:32] = 1e-6 * torch.arange(16)                            # underflowing block
    t[1, 32:48] = torch.tensor([3.0 * 2 ** -k for k in range(16)])   # powers of two
    t[1, 48:64] = -torch.tensor([5.5, 4.5, 3.25, 2.75, 1.8, 1.2, 0.8, 0.7] * 2)
    g = torch.Generator().manual_seed(7)
    t[2:, :] = torch.randn(6, 64, generator=g) * torch.tensor([1e-4, 1e-2, 1.0, 30.0, 300.0, 1000.0]).reshape(6, 1)
    t[3, 5] = 1.0                                                    # one outlier per block row
    return t.to(torch.bfloat16)


def adversarial_range():
    """Huge and tiny magnitudes (bf16 range edges) and exact power-of-two / 1.75*2^k block maxima."""
    t = torch.zeros(4, 64)
    g = torch.Generator().manual_seed(11)
    t[0, :32] = torch.randn(32, generator=g) * 1e30
    t[0, 32:] = torch.randn(32, generator=g) * 1e-30
    t[1, :16] = 3.0e38
    t[1, 16:32] = torch.randn(16, generator=g) * 1e-38               # bf16 subnormals
    t[1, 32:64] = 2.0 ** -133                                        # bf16's smallest subnormal
    t[2, :32] = torch.tensor([448.0] + [1.0] * 31)                   # amax exactly 448 = 1.75*2^8
    t[2, 32:] = torch.tensor([56.0, -3.0] + [0.5] * 30)              # 1.75*2^5
    t[3, :32] = torch.tensor([480.0, -300, 17, 0.5, -1, 2, 3, 100] + [0.25 * i for i in range(24)])  # TV5
    t[3, 32:] = torch.tensor([100.0] + [-7.25] * 31)
    return t.to(torch.bfloat16)


def f32_edges():
    """f32 weights whose block max sits a few ulps around 448*2^k (MXFP8's log2 rounding) and NVFP4 ties."""
    t = torch.zeros(2, 64, dtype=torch.float32)
    base = torch.tensor(448.0)
    t[0, 0] = torch.nextafter(base, torch.tensor(1e9))               # 448*(1+2^-23): ceil rule edge
    t[0, 32] = torch.nextafter(torch.nextafter(base, torch.tensor(0.0)), torch.tensor(0.0))
    t[0, 1:32] = torch.linspace(-3, 3, 31)
    t[0, 33:64] = torch.linspace(-100, 100, 31)
    t[1, 0] = 896.0 * (1 + 2 ** -20)
    t[1, 1:32] = 0.1
    t[1, 32] = 3.5e-3
    t[1, 33:64] = torch.linspace(-1e-3, 2e-3, 31)
    return t


def main():
    sd = load_file(MODEL)
    w = {k: v.to(torch.bfloat16) for k, v in sd.items()}
    inputs = {
        "q_proj": w["model.layers.0.self_attn.q_proj.weight"],             # [64, 64]
        "k_proj": w["model.layers.0.self_attn.k_proj.weight"],             # [32, 64]
        "v_proj": w["model.layers.0.self_attn.v_proj.weight"],             # [32, 64]
        "gate_proj": w["model.layers.3.mlp.gate_proj.weight"][:32].contiguous(),  # [32, 64] of [172, 64]
        "adv": adversarial(),
        "adv_range": adversarial_range(),
        "f32_edges": f32_edges(),
    }
    g = torch.Generator().manual_seed(1)
    act = (torch.randn(8, 64, generator=g) * 2.5).to(torch.bfloat16)      # calibration activations
    doc = {
        "generator": "tests/golden/gen_quant_golden.py",
        "versions": {"torch": torch.__version__, "modelopt": modelopt.__version__,
                     "compressed_tensors": compressed_tensors.__version__},
        "act": {"dtype": "bf16", "shape": list(act.shape), "data": b64(act)},
        "inputs": {},
        "modelopt": {},
        "modelopt_fused": {},
        "ct": {},
        "linspace": {},
    }
    for name, t in inputs.items():
        doc["inputs"][name] = {"dtype": "bf16" if t.dtype == torch.bfloat16 else "f32", "shape": list(t.shape),
                               "data": b64(t)}
    for name, t in inputs.items():
        if name == "v_proj":
            continue                       # only used as a fused sibling (keeps the file small)
        a = act if t.dtype == torch.bfloat16 else act.float()
        doc["modelopt"][name] = {}
        for cfg in CONFIGS:
            try:
                doc["modelopt"][name][cfg] = modelopt_case(t, a, cfg)
            except Exception as e:  # recorded, so the test knows which paths ModelOpt itself rejects
                doc["modelopt"][name][cfg] = {"error": f"{type(e).__name__}: {e}"}
                print(f"modelopt {name} {cfg}: {type(e).__name__}: {e}", file=sys.stderr)
        if t.dtype == torch.bfloat16 and name in ("q_proj", "adv", "adv_range"):
            doc["ct"][name] = {"nvfp4": ct_nvfp4(t), "mxfp8": ct_mxfp8(t), "fp8": ct_fp8(t)}
    qkv = [inputs["q_proj"], inputs["k_proj"], inputs["v_proj"]]
    doc["modelopt_fused"]["nvfp4"] = modelopt_fused_dynamic(qkv, act)
    doc["modelopt_fused"]["nvfp4_static"] = modelopt_fused_static(qkv, act, "nvfp4_static")
    doc["modelopt_fused"]["nvfp4_46"] = modelopt_fused_static(qkv, act, "nvfp4_46")
    for (a, b, s) in [(0.25, 4.0, 0.1), (1.0, 1.5, 0.5), (0.5, 2.0, 0.05), (0.1, 10.0, 0.1), (0.25, 4.0, 0.01)]:
        import math
        n = math.ceil((b - a) / s) + 1
        doc["linspace"][f"{a},{b},{s}"] = {"start": a, "stop": b, "step": s, "n": n,
                                           "values": f32(torch.linspace(a, b, steps=n))}
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"wrote {OUT} ({os.path.getsize(OUT)} bytes)")


if __name__ == "__main__":
    main()
