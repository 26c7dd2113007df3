#!/usr/bin/env python3
"""Golden float32 -> bfloat16 / float16 conversions from torch (`.to(torch.bfloat16)`, `.to(torch.float16)`),
the rounding nibble applies to an export's unquantized tensors (nb_f32_to_bf16 / nb_f32_to_f16, FORMATS.md
§6.3). The float32 inputs: every rounding case around 300 bf16 values (exact, just below / at / just above
the halfway point, for even and odd last bits), f16 halfway points and its subnormal and overflow edges,
bf16's overflow edge (the largest finite, the halfway to 2^128), signed zeros, infinities, NaNs (quiet and
signalling, both signs: torch gives 0x7FC0 / 0x7E00 for each) and 2000 random bit patterns.
Also FP8 E4M3 activation fake quant as compressed-tensors applies a W8A8 input_scale (its
forward_quantize -> fake_quantize with the checkpoint's QuantizationArgs: x / scale, clamp to +-448, cast,
times scale): for 3 scales s = f32(amax / 448), inputs around every E4M3 rounding midpoint times s (the
f32 product and its 3 neighbours each side, where x / s and x * (1 / s) round apart), beyond the clamp, in
the subnormal range, and random.
Written: tests/golden/data/dtype_round.json (hex bit patterns). Run by hand (never in CI):
  /root/nbvenv/bin/python tests/golden/gen_dtype_golden.py
"""
import json
import os
import random

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "data", "dtype_round.json")


def fp8_activations(rng):
    import compressed_tensors
    from compressed_tensors.quantization import QuantizationArgs
    from compressed_tensors.quantization.lifecycle.forward import fake_quantize
    args = QuantizationArgs(num_bits=8, type="float", strategy="tensor", symmetric=True, dynamic=False)
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn).float()
    vals = codes[torch.isfinite(codes)].unique().sort().values.double()
    mids = ((vals[1:] + vals[:-1]) / 2)
    out = []
    for amax in (5.1234567, 0.37, 113.0):
        a = torch.tensor([amax], dtype=torch.float32)
        s = a / 448.0
        xs = []
        for m in mids.tolist():
            c = (torch.tensor([m], dtype=torch.float32) * s).view(torch.int32).item()
            xs += [c + d for d in range(-3, 4)]
        x = torch.tensor(xs, dtype=torch.int32).view(torch.float32)
        x = torch.cat([x, s * torch.tensor([500.0, -500.0, 448.0, 464.0, 465.0, 1e-3, -3e-3, 0.0]),
                       torch.randn(500) * a])
        y = fake_quantize(x, scale=s, zero_point=None, args=args)
        # a multiplication by 1 / s would round some of these the other way: the vectors tell the two apart
        recip = ((x * (1.0 / s)).clamp(-448, 448).to(torch.float8_e4m3fn).float() * s)
        assert (recip != y).any()
        out.append({"amax": "%08x" % (a.view(torch.int32).item() & 0xFFFFFFFF),
                    "x": ["%08x" % (v & 0xFFFFFFFF) for v in x.view(torch.int32).tolist()],
                    "y": ["%08x" % (v & 0xFFFFFFFF) for v in y.view(torch.int32).tolist()],
                    "compressed_tensors": compressed_tensors.__version__})
    return out


def main():
    rng = random.Random(1)
    bits = [0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001,
            0x7FBFFFFF, 0x7F7FFFFF, 0xFF7FFFFF, 0x7F7F7FFF, 0x7F7F8000, 0x7F7F8001, 0x7F7FFFFF,
            0x00000001, 0x80000001, 0x007FFFFF, 0x00800000, 0x00008000, 0x00018000]
    for _ in range(300):
        h = rng.randrange(0, 0x10000) & 0xFF7F | rng.choice([0, 0x80])
        if (h & 0x7F80) == 0x7F80:
            continue
        for low in (0x0000, 0x0001, 0x7FFF, 0x8000, 0x8001, 0xFFFF):
            bits.append((h << 16) | low)
    # float16: halfway points between neighbours, the subnormal range and the overflow edge (65520)
    halves = torch.arange(0, 0x7C00, 31, dtype=torch.int32).to(torch.int16).view(torch.float16).float()
    nxt = (torch.arange(0, 0x7C00, 31, dtype=torch.int32) + 1).to(torch.int16).view(torch.float16).float()
    for a, b in zip(halves.tolist(), nxt.tolist()):
        m = torch.tensor([(a + b) / 2], dtype=torch.float32)
        bits.append(m.view(torch.int32).item() & 0xFFFFFFFF)
    for v in (65504.0, 65519.99, 65520.0, 65536.0, 2.0 ** -24, 2.0 ** -25, 3 * 2.0 ** -26, 2.0 ** -26, 6.1e-5):
        bits.append(torch.tensor([v], dtype=torch.float32).view(torch.int32).item() & 0xFFFFFFFF)
    bits += [rng.getrandbits(32) for _ in range(2000)]
    x = torch.tensor([b - (1 << 32) if b >= 1 << 31 else b for b in bits], dtype=torch.int32).view(torch.float32)
    bf = x.to(torch.bfloat16).view(torch.int16).to(torch.int32) & 0xFFFF
    f16 = x.to(torch.float16).view(torch.int16).to(torch.int32) & 0xFFFF
    # the tensor conversion above and torch's scalar one agree on every value but NaN
    for i in range(len(bits)):
        if not torch.isnan(x[i]):
            assert x[i].to(torch.bfloat16).view(torch.int16).item() & 0xFFFF == bf[i].item()
    res = {"torch": torch.__version__, "fp8_act": fp8_activations(rng), "f32_bits": ["%08x" % b for b in bits],
           "bf16_bits": ["%04x" % v for v in bf.tolist()], "f16_bits": ["%04x" % v for v in f16.tolist()]}
    with open(OUT, "w") as f:
        json.dump(res, f, separators=(",", ":"))
        f.write("\n")
    print(len(bits), "values")


if __name__ == "__main__":
    main()
