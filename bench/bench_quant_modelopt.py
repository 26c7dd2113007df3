"""ModelOpt's CPU weight quantization timed on a 4096x4096 BF16 tensor (the peer of bench_quant.c).

Writes the tensor as raw little-endian bf16 (so nibble's bench quantizes the very same bytes) and
prints one line per format: `modelopt <format> <median ms>`. Formats and the ModelOpt calls timed:
  nvfp4          NVFP4QTensor.quantize(w, 16)                (amax, s2, block scales, E2M1, pack)
  nvfp4_46       four_over_six export: static block scales at 256 from a per-block amax
                 (_cast_per_block_scale_to_fp8) + NVFP4QTensor.quantize(w, 16, scales, s2)
  mxfp8          MXFP8QTensor.quantize(w)
  fp8            FP8QTensor.quantize(w)                      (per tensor, amax from the data)
  fp8_cal        FP8QTensor.quantize(w, amax / 448)          (per tensor, calibrated amax: the export path)
  fp8_channel    FP8QTensor.quantize(w, axis=0)              (per output row)
Run by bench/bench_quant_modelopt.sh with /root/nbvenv/bin/python; torch threads = --threads.
"""
import argparse
import statistics
import time

import torch
from modelopt.torch.quantization.qtensor.fp8_tensor import FP8QTensor
from modelopt.torch.quantization.qtensor.mxfp8_tensor import MXFP8QTensor
from modelopt.torch.quantization.qtensor.nvfp4_tensor import NVFP4QTensor, _cast_per_block_scale_to_fp8


def block_amax_46(w):
    """The per-block amax bench_quant.c gives four_over_six: max |w| per 16, every 3rd block x1.5."""
    a = w.float().abs().view(w.shape[0], -1, 16).amax(-1)
    flat = a.view(-1)
    idx = torch.arange(flat.numel())
    flat[idx % 3 == 0] *= 1.5
    return a


def nvfp4_46(w, bam):
    g = bam.max()
    scale = bam / 6.0
    scale[scale == 0] = 1.0
    wsf = _cast_per_block_scale_to_fp8(scale, g / 6.0, fp8_max_for_normalization=256.0)
    s2 = g / (6.0 * 256.0)
    return NVFP4QTensor.quantize(w, 16, wsf, s2)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default="/tmp/nibble_bench_w_bf16.bin", help="raw bf16 tensor written here")
    ap.add_argument("--formats", default="nvfp4,nvfp4_46,mxfp8,fp8,fp8_cal,fp8_channel")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(1234)
    w = (torch.randn(4096, 4096) * 0.02).to(torch.bfloat16)
    w.view(torch.int16).numpy().tofile(args.out)
    bam = block_amax_46(w)
    s8 = w.float().abs().amax() / 448.0   # what max calibration stores (0-d f32, as the exporter passes it)
    calls = {
        "nvfp4": lambda: NVFP4QTensor.quantize(w, 16),
        "nvfp4_46": lambda: nvfp4_46(w, bam),
        "mxfp8": lambda: MXFP8QTensor.quantize(w),
        "fp8": lambda: FP8QTensor.quantize(w),
        "fp8_cal": lambda: FP8QTensor.quantize(w, s8),
        "fp8_channel": lambda: FP8QTensor.quantize(w, axis=0),
    }
    print(f"# torch {torch.__version__}, {torch.get_num_threads()} threads, tensor {tuple(w.shape)} {w.dtype} -> {args.out}")
    for name in args.formats.split(","):
        f = calls[name]
        f()  # warm up
        times = []
        for _ in range(args.reps):
            t0 = time.perf_counter()
            f()
            times.append(time.perf_counter() - t0)
        print(f"modelopt {name} {statistics.median(times) * 1e3:.3f}", flush=True)


if __name__ == "__main__":
    main()
