#!/usr/bin/env python3
"""Golden perplexities of nibble's exports of stories260K as a real client runs them: transformers (5.x)
with compressed-tensors loads each export layout nibble writes and scores fixed windows of the
validation text the way llama.cpp's llama-perplexity does (n_ctx 512, BOS in the first slot of each
window, the second half scored: positions 256..510 predict tokens 257..511; the first WINDOWS windows).

Cases (each made by `nibble quantize` with the arguments recorded in the JSON, default --dtype):
  modelopt_w4a16  nvfp4_w4a16, ModelOpt layout: transformers has no "modelopt" quant_method (the
                  error is recorded; nothing is scored)
  ct_w4a16        nvfp4_w4a16, compressed-tensors (nvfp4-pack-quantized)
  ct_mxfp8        mxfp8, compressed-tensors (mxfp8-quantized)
  ct_fp8          fp8 W8A8 (static input scales), compressed-tensors (float-quantized), calibrated on
                  8 rows of 128 tokens of text/tinystories_train_head_2MiB.txt, seed 1
  ct_fp8_kv       the same plus an FP8 KV cache (--kv-cache fp8)

Per case, three runs:
  client    from_pretrained(path) as a user calls it: the model in config.json's torch_dtype (bf16),
            compressed-tensors decompressing into bf16; its PPL shows the export runs (bf16 compute:
            not compared with nibble's float32 eval)
  f32       the same checkpoint decoded in float32 (compressed-tensors' NVFP4 unpack and MXFP8 scales
            patched to float32, every module float32) with transformers' own rotary embedding, whose
            angle pos * inv_freq is a float32 product
  f32_rope64 as f32, with the rotary cos / sin computed in float64 and rounded to float32, as nibble
            computes them (llama.c rope_tables). Per-window NLLs; the test compares nibble to these.

Why f32_rope64: transformers' float32 angle is off by up to half an ulp of pos * inv_freq (1.5e-5 rad
at positions 256..511), which moves attention outputs by ~1e-6. Without activation quantization that
is invisible (PPL equal to ~1e-8 nats); with FP8 activations (W8A8, FP8 KV) it flips the FP8 rounding
of the few elements that lie that close to a rounding midpoint, and in this 64-wide model one flip
moves a window's NLL by up to ~0.01. Both sides quantize activations the same way (x / input_scale in
float32, clamp to +-448, round to nearest even E4M3, times input_scale): see docs in FORMATS-level
comments of core/src/quant/fp8.c.

The FP8 KV case: compressed-tensors 0.20 recognises a cached attention module by a past_key_value(s)
argument, which transformers 5 renamed, so stock transformers loads k_scale / v_scale as unexpected
keys and runs the KV cache in float ("kv_applied": false): the golden is then the float-KV eval.

Written: tests/golden/data/client_ppl.json. Run by hand (never in CI) with a built nibble:
  /root/nbvenv/bin/python tests/golden/gen_client_golden.py --nibble build/nibble [--data ../shared/data]
"""
import argparse
import json
import math
import os
import subprocess
import tempfile
import warnings

import torch

warnings.filterwarnings("ignore")

import compressed_tensors  # noqa: E402
import transformers  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402
from transformers.models.llama import modeling_llama  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "data", "client_ppl.json")
WINDOWS, N_CTX = 20, 512
CALIB = ["--calib", "$DATA/text/tinystories_train_head_2MiB.txt", "--samples", "8", "--seq-len", "128",
         "--batch", "4", "--seed", "1"]
CASES = {
    "modelopt_w4a16": ["--format", "nvfp4_w4a16"],
    "ct_w4a16": ["--format", "nvfp4_w4a16", "--layout", "compressed-tensors"],
    "ct_mxfp8": ["--format", "mxfp8", "--layout", "compressed-tensors"],
    "ct_fp8": ["--format", "fp8", "--layout", "compressed-tensors"] + CALIB,
    "ct_fp8_kv": ["--format", "fp8", "--layout", "compressed-tensors", "--kv-cache", "fp8"] + CALIB,
}

STOCK_ROPE = modeling_llama.LlamaRotaryEmbedding.forward


def rope64(self, x, position_ids):
    """cos / sin of pos * inv_freq in float64, rounded to float32 (nibble's rope_tables)."""
    dim = self.inv_freq.numel() * 2
    base = self.config.rope_parameters["rope_theta"] if hasattr(self.config, "rope_parameters") else self.config.rope_theta
    inv = 1.0 / torch.pow(torch.tensor(float(base), dtype=torch.float64),
                          torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    ang = position_ids.to(torch.float64)[..., None] * inv
    emb = torch.cat([ang, ang], dim=-1)
    return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


def decode_in(dtype):
    """compressed-tensors decompresses NVFP4 into bf16 (unpack_fp4_from_uint8's default) and MXFP8 scales
    into bf16: stock for the client run; for float32, the dequantized weights are exactly code * scale,
    as nibble's read-back makes them."""
    from compressed_tensors.compressors.mxfp8.base import MXFP8QuantizationCompressor
    from compressed_tensors.compressors.nvfp4 import base as nv
    if not hasattr(nv, "_stock_unpack"):
        nv._stock_unpack = nv.unpack_fp4_from_uint8
        MXFP8QuantizationCompressor._stock_scale = MXFP8QuantizationCompressor._decompress_scale.__func__
    unpack, dec = nv._stock_unpack, MXFP8QuantizationCompressor._stock_scale
    if dtype == torch.float32:
        nv.unpack_fp4_from_uint8 = lambda a, m, n, dtype=None: unpack(a, m, n, dtype=torch.float32)
        MXFP8QuantizationCompressor._decompress_scale = classmethod(lambda cls, s: dec(cls, s).float())
    else:
        nv.unpack_fp4_from_uint8 = unpack
        MXFP8QuantizationCompressor._decompress_scale = classmethod(dec)


def window_nlls(model, ids, bos):
    out, dt = [], None
    with torch.no_grad():
        for c in range(WINDOWS):
            x = [bos] + ids[c * N_CTX + 1:(c + 1) * N_CTX]
            logits = model(torch.tensor([x])).logits[0]
            dt = str(logits.dtype)
            lp = torch.log_softmax(logits.double(), -1)
            tgt = torch.tensor(x[N_CTX // 2 + 1:N_CTX])
            out.append(-lp[N_CTX // 2:N_CTX - 1].gather(1, tgt[:, None]).sum().item() / (N_CTX // 2 - 1))
    return out, dt


def score(path, ids, bos, mode):
    modeling_llama.LlamaRotaryEmbedding.forward = rope64 if mode == "f32_rope64" else STOCK_ROPE
    decode_in(torch.bfloat16 if mode == "client" else torch.float32)
    kw = {} if mode == "client" else {"dtype": torch.float32}
    model = AutoModelForCausalLM.from_pretrained(path, **kw).eval()
    nll, dt = window_nlls(model, ids, bos)
    kv = any(n.endswith("k_scale") for n, _ in model.named_parameters())
    mean = sum(nll) / len(nll)
    return {"nll": nll, "mean_nll": mean, "ppl": math.exp(mean), "dtype": dt}, kv   # dtype: the logits'



def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nibble", default=os.environ.get("NIBBLE_BIN", "nibble"))
    ap.add_argument("--data", default=os.path.join(HERE, "..", "..", "..", "shared", "data"))
    args = ap.parse_args()
    data = os.path.abspath(args.data)
    hf_dir = os.path.join(data, "stories260K", "hf")
    text = open(os.path.join(data, "text", "tinystories_valid_head_776KiB.txt"), encoding="utf-8").read()
    tok = AutoTokenizer.from_pretrained(hf_dir)
    ids = tok(text)["input_ids"]
    assert ids[0] == tok.bos_token_id and len(ids) == 393019, len(ids)
    res = {"text": "text/tinystories_valid_head_776KiB.txt", "windows": WINDOWS, "n_ctx": N_CTX,
           "scoring": "llama.cpp: BOS first, positions 256..510 of each window",
           "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                        "compressed_tensors": compressed_tensors.__version__},
           "cases": {}}
    for name, extra in CASES.items():
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, name)
            cmd = [args.nibble, "quantize", "--model", hf_dir, "--out", out, "--quiet"] + \
                  [a.replace("$DATA", data) for a in extra]
            subprocess.run(cmd, check=True)
            cfg = json.load(open(os.path.join(out, "config.json")))
            case = {"nibble_args": extra, "torch_dtype": cfg.get("torch_dtype")}
            # the calibrated input scales (float32 bits): another BLAS sums the calibration forward in
            # another order and may find other amaxes; the test then reads the export with these
            from safetensors.torch import load_file
            sd = load_file(os.path.join(out, "model.safetensors"))
            scales = {k[:-len(".input_scale")]: "%08x" % (v.float().view(torch.int32).item() & 0xFFFFFFFF)
                      for k, v in sd.items() if k.endswith(".input_scale")}
            if scales:
                case["input_scales"] = scales
            try:
                case["client"], case["kv_applied"] = score(out, ids, tok.bos_token_id, "client")
            except Exception as e:  # noqa: BLE001 (what the client says is the record)
                case["client_error"] = str(e).splitlines()[0][:300]
                if cfg["quantization_config"]["quant_method"] not in transformers.utils.quantization_config.QuantizationMethod._value2member_map_:
                    case["client_error"] = "transformers %s has no quant_method '%s' (it loads the packed weights as " \
                        "plain ones and fails: %s)" % (transformers.__version__, cfg["quantization_config"]["quant_method"],
                                                      case["client_error"])
                res["cases"][name] = case
                print(name, "client error:", case["client_error"])
                continue
            case["f32"], _ = score(out, ids, tok.bos_token_id, "f32")
            case["f32_rope64"], _ = score(out, ids, tok.bos_token_id, "f32_rope64")
            res["cases"][name] = case
            print(name, "client %.6f  f32 %.6f  f32_rope64 %.6f" % (case["client"]["ppl"], case["f32"]["ppl"],
                                                                   case["f32_rope64"]["ppl"]))
    with open(OUT, "w") as f:
        json.dump(res, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
