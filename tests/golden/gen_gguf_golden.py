#!/usr/bin/env python3
"""Golden data for nibble's GGUF reader and ggml dequantizers (run by hand, never in CI).

    /root/nbvenv/bin/python tests/golden/gen_gguf_golden.py

Uses gguf-py (package `gguf` 0.19), whose numpy `gguf.quants` ports ggml's reference
quantize/dequantize_row_* code. Writes into tests/golden/data/:

ggml_<type>.bin (one per type; little-endian), consumed by tests/c/test_gguf.c:
    offset 0   char[4]  magic "NBGQ"
           4   u32      layout version (1)
           8   u32      ggml type number (ggml's enum ggml_type)
          12   u32      block size (elements per block)
          16   u32      type size (bytes per block)
          20   u32      n_blocks
          24   u8[n_blocks * type_size]     the blocks, exactly as they sit in a GGUF file
          ..   f32[n_blocks * block_size]   gguf.quants.dequantize of those blocks
  Blocks of the types gguf-py can quantize (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, MXFP4) come from
  deterministic rows, adversarial ones included (zeros, a constant, huge ~3e4 values, tiny values
  that give subnormal fp16 scales, one outlier in a normal row). gguf-py has no quantizer for the
  K-quants and NVFP4, and every byte pattern is a valid block, so those blocks are random bytes
  with chosen fp16 scales (subnormal, largest finite, negative) plus all-zero / all-ones
  blocks; NVFP4 scale bytes include 0x00, 0x7F (decodes as 0), 0xFF (bit 7 ignored) and
  subnormals. Every type also gets two random-byte blocks. No block decodes to NaN or inf.

small.gguf: GGUF v3 written by gguf.GGUFWriter with general.alignment = 64, one key of every
  metadata type (arrays of every numeric type, bools, strings with a NUL inside, an array of
  arrays) and tensors F32 (1-D, 3-D), F16, BF16, I32, Q8_0, Q4_K, Q6_K, NVFP4; each quantized
  tensor `X` has a companion F32 tensor `X.expected` = gguf.quants.dequantize(X). The expected
  metadata values are written out literally in test_gguf.c.
"""
import os
import struct

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T, GGUFValueType as V
from gguf.quants import quantize, dequantize

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "data")
SIZES = gguf.constants.GGML_QUANT_SIZES

# fp16 fields (byte offsets inside a block) per type: set to chosen finite values.
F16_FIELDS = {
    T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0],
    T.Q2_K: [80, 82], T.Q3_K: [108], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208],
    T.MXFP4: [], T.NVFP4: [],
}
QUANTIZABLE = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.MXFP4]
ALL = [T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.MXFP4, T.NVFP4]

# interesting finite fp16 bit patterns: min/max subnormal, min normal, +-1, ~0.1, largest finite, negatives
F16_SPECIAL = [0x0001, 0x03FF, 0x0400, 0x3C00, 0xBC00, 0x2E66, 0x7BFF, 0xFBFF, 0x1400, 0x8001]


def rng_for(name):
    return np.random.default_rng(sum(map(ord, name)) * 7919 + 17)   # stable across runs


def rows_for(t, rng):
    blck = SIZES[t][0]
    n = 2 * blck
    rows = [
        rng.standard_normal(n),                          # ordinary weights
        np.zeros(n),                                     # all zeros: d = 0
        np.full(n, 0.75),                                # constant: Q4_1/Q5_1 d = 0
        rng.uniform(-3e4, 3e4, n),                       # huge (fp16 scales near their top)
        rng.uniform(-1e-4, 1e-4, n),                     # tiny: subnormal fp16 scales
        rng.standard_normal(n),                          # one outlier
        -np.abs(rng.standard_normal(n)),                 # all negative
        np.linspace(-1, 1, n) * ((-1.0) ** np.arange(n)),  # alternating ramp
    ]
    rows[5][7] = 1000.0
    return np.stack(rows).astype(np.float32)


def random_blocks(t, rng, count):
    blck, tsize = SIZES[t]
    b = rng.integers(0, 256, size=(count, tsize), dtype=np.uint8)
    for k in range(count):
        for off in F16_FIELDS[t]:
            h = int(rng.choice(F16_SPECIAL)) if rng.random() < 0.5 else int(rng.integers(0, 0x7800)) | (int(rng.integers(0, 2)) << 15)
            b[k, off:off + 2] = np.frombuffer(struct.pack("<H", h), dtype=np.uint8)
        if t == T.MXFP4:
            b[k, 0] = min(int(b[k, 0]), 250)   # keep 12 * 2^(e-128) finite
    return b


def adversarial_blocks(t, rng):
    blck, tsize = SIZES[t]
    out = [np.zeros(tsize, dtype=np.uint8), np.full(tsize, 0xFF, dtype=np.uint8)]
    for blk in out:
        for off in F16_FIELDS[t]:
            blk[off:off + 2] = [0xFF, 0x7B]   # 65504, largest finite fp16
    extra = random_blocks(t, rng, 3)
    for k, pat in enumerate([(0x0001, 0x8001), (0xBC00, 0x03FF), (0x2E66, 0xFBFF)]):
        for j, off in enumerate(F16_FIELDS[t]):
            extra[k, off:off + 2] = np.frombuffer(struct.pack("<H", pat[j % 2]), dtype=np.uint8)
    if t == T.NVFP4:
        extra[0, 0:4] = [0x00, 0x7F, 0xFF, 0x01]
        extra[1, 0:4] = [0x80, 0x07, 0x08, 0x7E]
        extra[2, 0:4] = [0xFE, 0x38, 0x40, 0x3F]
    if t == T.MXFP4:
        extra[0, 0] = 0
        extra[1, 0] = 1
        extra[2, 0] = 127
    return np.concatenate([np.stack(out), extra])


def golden_blocks(t):
    rng = rng_for(t.name)
    parts = []
    if t in QUANTIZABLE:
        parts.append(quantize(rows_for(t, rng), t).reshape(-1, SIZES[t][1]))
    else:
        parts.append(adversarial_blocks(t, rng))
        parts.append(random_blocks(t, rng, 2))
    parts.append(random_blocks(t, rng, 2))
    return np.ascontiguousarray(np.concatenate(parts).astype(np.uint8))


def write_golden(t):
    blck, tsize = SIZES[t]
    blocks = golden_blocks(t)
    vals = dequantize(blocks.reshape(-1), t).astype(np.float32).reshape(-1)
    assert vals.size == blocks.shape[0] * blck
    assert np.all(np.isfinite(vals)), t.name
    path = os.path.join(OUT, f"ggml_{t.name.lower()}.bin")
    with open(path, "wb") as f:
        f.write(b"NBGQ" + struct.pack("<5I", 1, int(t), blck, tsize, blocks.shape[0]))
        f.write(blocks.tobytes())
        f.write(vals.astype("<f4").tobytes())
    print(f"{path}: {blocks.shape[0]} blocks, {os.path.getsize(path)} bytes")


def write_small_gguf():
    path = os.path.join(OUT, "small.gguf")
    w = gguf.GGUFWriter(path, "nbtest")
    w.add_custom_alignment(64)
    w.add_uint8("t.u8", 200)
    w.add_int8("t.i8", -100)
    w.add_uint16("t.u16", 60000)
    w.add_int16("t.i16", -30000)
    w.add_uint32("t.u32", 4000000000)
    w.add_int32("t.i32", -2000000000)
    w.add_float32("t.f32", 0.1)
    w.add_uint64("t.u64", 0xFFFFFFFFFFFFFFF0)
    w.add_int64("t.i64", -9000000000000000000)
    w.add_float64("t.f64", 1e300)
    w.add_bool("t.true", True)
    w.add_bool("t.false", False)
    w.add_string("t.str", "h\u00e9llo w\u00f6rld")
    w.add_key_value("t.empty", "", V.STRING)   # add_string skips empty strings
    w.add_key_value("t.arr_u8", [0, 1, 255], V.ARRAY, sub_type=V.UINT8)
    w.add_key_value("t.arr_i8", [-128, 0, 127], V.ARRAY, sub_type=V.INT8)
    w.add_key_value("t.arr_u16", [0, 65535], V.ARRAY, sub_type=V.UINT16)
    w.add_key_value("t.arr_i16", [-32768, 32767], V.ARRAY, sub_type=V.INT16)
    w.add_key_value("t.arr_u32", [4294967295, 7], V.ARRAY, sub_type=V.UINT32)
    w.add_array("t.arr_i32", [1, -2, 3])
    w.add_key_value("t.arr_u64", [18446744073709551615, 5], V.ARRAY, sub_type=V.UINT64)
    w.add_key_value("t.arr_i64", [-9223372036854775808, 9223372036854775807], V.ARRAY, sub_type=V.INT64)
    w.add_array("t.arr_f32", [0.5, -1.25, 1e-3])
    w.add_key_value("t.arr_f64", [3.141592653589793, -2.5e-310], V.ARRAY, sub_type=V.FLOAT64)
    w.add_array("t.arr_bool", [True, False, True])
    w.add_array("t.arr_str", ["a", "", "\u00fcn\u00ef", "nul\x00inside"])
    w.add_key_value("t.arr_nested", [[1, 2], [3, 4, 5]], V.ARRAY, sub_type=V.ARRAY)

    rng = np.random.default_rng(1234)
    w.add_tensor("f32.vec", np.array([1.0, -2.0, 0.5, 3.25, -0.0], dtype=np.float32))
    w.add_tensor("f32.cube", np.arange(24, dtype=np.float32).reshape(2, 3, 4))
    w.add_tensor("f16.mat", (np.arange(24, dtype=np.float32) * 0.25 - 3).astype(np.float16).reshape(3, 8))
    bf = np.array([[1.0, -2.0, 0.15625, 3e38], [-0.0, 1e-30, 65504.0, -7.5]], dtype=np.float32)
    w.add_tensor("bf16.mat", (bf.view(np.uint32) >> 16).astype("<u2").view(np.uint8), raw_dtype=T.BF16)
    w.add_tensor("i32.idx", np.array([[7, -1, 2147483647]], dtype=np.int32))
    q8 = quantize(rng.standard_normal((4, 64)).astype(np.float32), T.Q8_0)
    w.add_tensor("q8_0.w", q8, raw_dtype=T.Q8_0)
    w.add_tensor("q8_0.w.expected", dequantize(q8, T.Q8_0))
    for t, name in [(T.Q4_K, "q4_k.w"), (T.Q6_K, "q6_k.w"), (T.NVFP4, "nvfp4.w")]:
        blck, tsize = SIZES[t]
        rows = 2
        nblk = 512 // blck
        b = random_blocks(t, np.random.default_rng(int(t)), rows * nblk).reshape(rows, nblk * tsize)
        w.add_tensor(name, b, raw_dtype=t)
        w.add_tensor(name + ".expected", dequantize(b, t))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"{path}: {os.path.getsize(path)} bytes")
    r = gguf.GGUFReader(path)
    for t in r.tensors:
        print(f"  {t.name:18s} {t.tensor_type.name:6s} ne={list(map(int, t.shape))} offset={t.data_offset}")


def main():
    os.makedirs(OUT, exist_ok=True)
    for t in ALL:
        write_golden(t)
    write_small_gguf()


if __name__ == "__main__":
    main()
