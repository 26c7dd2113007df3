#!/usr/bin/env python3
"""Golden safetensors files for tests/c/test_safetensors.c, written by the real `safetensors` package
(and huggingface_hub's shard splitter), so nibble's writer can be held to them byte for byte.

Run by hand from the repository root with the project venv:
    /root/nbvenv/bin/python tests/golden/gen_safetensors_golden.py
It also checks FORMATS.md §10 TV8 against the package and checks that the sharded set written here
matches what transformers' save_pretrained writes (same splitter, same index formatting).

Tensor contents are a byte pattern, pattern(ti, n)[k] = (37*k + 11*ti + 5) & 0xFF (BOOL: & 1), that the
C test recomputes; ti is the tensor's position in the spec lists below (keep both in sync).
"""
import json
import os
import sys
import tempfile

import torch
import safetensors
from safetensors.torch import save, save_file
from huggingface_hub import split_torch_state_dict_into_shards

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")

TORCH = {
    "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64,
    "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2, "F8_E8M0": torch.float8_e8m0fnu,
    "F4": torch.float4_e2m1fn_x2, "U8": torch.uint8, "I8": torch.int8, "I16": torch.int16,
    "U16": torch.uint16, "I32": torch.int32, "U32": torch.uint32, "I64": torch.int64, "U64": torch.uint64,
    "BOOL": torch.bool,
}
BITS = {"F32": 32, "F16": 16, "BF16": 16, "F64": 64, "F8_E4M3": 8, "F8_E5M2": 8, "F8_E8M0": 8, "F4": 4,
        "U8": 8, "I8": 8, "I16": 16, "U16": 16, "I32": 32, "U32": 32, "I64": 64, "U64": 64, "BOOL": 8}


def pattern(ti, n, dtype):
    b = bytes(((37 * k + 11 * ti + 5) & 0xFF) for k in range(n))
    if dtype == "BOOL":
        b = bytes(x & 1 for x in b)
    return b


def make(ti, dtype, shape):
    """Tensor with the logical safetensors shape `shape` (F4: last dim counts fp4 elements)."""
    numel = 1
    for d in shape:
        numel *= d
    nbytes = numel * BITS[dtype] // 8
    raw = torch.frombuffer(bytearray(pattern(ti, nbytes, dtype)) or bytearray(1), dtype=torch.uint8)[:nbytes]
    tshape = list(shape)
    if dtype == "F4":
        tshape[-1] //= 2          # float4_e2m1fn_x2 holds two fp4 values per element
    return raw.view(TORCH[dtype]).reshape(tshape).clone()


# (name, dtype, shape): the C test has the same lists.
MIXED = [
    ("w.f32", "F32", [2, 3]), ("w.bf16", "BF16", [2, 2]), ("w.f16", "F16", [3]), ("w.u8", "U8", [5]),
    ("w.e4m3", "F8_E4M3", [2, 2]), ("w.i64", "I64", [2]), ("scalar", "F32", []), ("empty", "F32", [0, 3]),
    ("empty.bf16", "BF16", [2, 0]),
]
ALLDT = [
    ("t_f32", "F32", [3]), ("t_f16", "F16", [2, 2]), ("t_bf16", "BF16", [3]), ("t_f64", "F64", [2]),
    ("t_e4m3", "F8_E4M3", [4]), ("t_e5m2", "F8_E5M2", [4]), ("t_e8m0", "F8_E8M0", [3]), ("t_f4", "F4", [2, 4]),
    ("t_u8", "U8", [3]), ("t_i8", "I8", [3]), ("t_i16", "I16", [2]), ("t_u16", "U16", [2]), ("t_i32", "I32", [2]),
    ("t_u32", "U32", [2]), ("t_i64", "I64", [1, 2]), ("t_u64", "U64", [2]), ("t_bool", "BOOL", [4]),
    ("a_f32", "F32", [1]),
]
NAMES = [
    ("na\u00efve", "F32", [1]), ("q\"uote", "F32", [1]), ("back\\slash", "F32", [1]), ("nl\nx", "U8", [1]),
    ("tab\t", "U8", [1]), ("ctl\x01", "U8", [1]), ("del\x7f", "U8", [1]), ("emoji\U0001F600", "U8", [1]),
]
NAMES_META = {"note": "h\u00e9llo\n\"w\"\\ \x02"}
SHARDED = [
    ("embed.weight", "F32", [8, 4]), ("layers.0.w", "BF16", [4, 4]), ("layers.0.scale", "F8_E4M3", [4]),
    ("big", "F32", [64]), ("layers.1.w", "BF16", [4, 8]), ("layers.1.bias", "F32", [4]),
    ("na\u00efve\"name", "F16", [3]), ("empty", "F32", [0]), ("scalar", "I64", []),
    ("emoji\U0001F600", "U8", [1]), ("del\x7f", "U8", [1]),
]
SHARD_MAX = 200

TV8 = bytes.fromhex("4001000000000000") + (
    b'{"__metadata__":{"format":"pt"},"layer.input_scale":{"dtype":"F32","shape":[],"data_offsets":[0,4]},'
    b'"layer.weight_scale_2":{"dtype":"F32","shape":[],"data_offsets":[4,8]},"layer.weight_scale":{"dtype":'
    b'"F8_E4M3","shape":[1,2],"data_offsets":[8,10]},"layer.weight":{"dtype":"U8","shape":[1,16],'
    b'"data_offsets":[10,26]}}    ') + bytes.fromhex("0000003f0000803f387e0022446687caeef1d724104b660e90f5")


def state(spec):
    return {name: make(ti, dt, shape) for ti, (name, dt, shape) in enumerate(spec)}


def save_sharded(sd, d, max_size, metadata=None, extra_index_meta=None):
    """What transformers' save_pretrained does with a state dict (modeling_utils.py, v5.24)."""
    split = split_torch_state_dict_into_shards(sd, filename_pattern="model{suffix}.safetensors",
                                               max_shard_size=max_size)
    for fname, names in split.filename_to_tensors.items():
        save_file({n: sd[n].contiguous() for n in names}, os.path.join(d, fname), metadata=metadata or {"format": "pt"})
    if split.is_sharded:
        index = {"metadata": {**(extra_index_meta or {}), **split.metadata}, "weight_map": split.tensor_to_filename}
        with open(os.path.join(d, "model.safetensors.index.json"), "w", encoding="utf-8") as f:
            f.write(json.dumps(index, indent=2, sort_keys=True) + "\n")
    return split


def check_against_save_pretrained():
    """A tiny Llama saved by transformers vs the emulation above: every file must be identical."""
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
    except Exception as e:  # pragma: no cover
        print("save_pretrained check skipped:", e)
        return
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True)
    model = LlamaForCausalLM(cfg)
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        model.save_pretrained(a, max_shard_size=3000)
        sd = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}
        save_sharded(sd, b, 3000, extra_index_meta={"total_parameters": model.num_parameters()})
        fa = sorted(f for f in os.listdir(a) if "safetensors" in f)
        fb = sorted(os.listdir(b))
        same = fa == fb and all(open(os.path.join(a, f), "rb").read() == open(os.path.join(b, f), "rb").read()
                                for f in fa)
        print(f"save_pretrained vs emulation: {len(fa)} files, identical={same}")
        if not same:
            print(" transformers:", fa, "\n emulation:  ", fb)
            sys.exit(1)


def main():
    print("safetensors", safetensors.__version__, "torch", torch.__version__)
    os.makedirs(OUT, exist_ok=True)

    # FORMATS.md §10 TV8 (hand-built there): the package must give the same 354 bytes.
    tv8 = {
        "layer.input_scale": torch.tensor(0.5, dtype=torch.float32),
        "layer.weight_scale_2": torch.tensor(1.0, dtype=torch.float32),
        "layer.weight_scale": torch.tensor([[0x38, 0x7E]], dtype=torch.uint8).view(torch.float8_e4m3fn),
        "layer.weight": torch.frombuffer(bytearray(TV8[-16:]), dtype=torch.uint8).reshape(1, 16).clone(),
    }
    got = save(tv8, metadata={"format": "pt"})
    if got != TV8:
        print("TV8 MISMATCH: package wrote", len(got), "bytes:", got)
        sys.exit(1)
    print("TV8: the package writes exactly the 354 bytes of FORMATS.md §10")
    with open(os.path.join(OUT, "st_tv8.safetensors"), "wb") as f:
        f.write(got)

    save_file(state(MIXED), os.path.join(OUT, "st_mixed.safetensors"), metadata={"format": "pt"})
    save_file(state(ALLDT), os.path.join(OUT, "st_alldtypes.safetensors"))
    save_file(state(NAMES), os.path.join(OUT, "st_names.safetensors"), metadata=NAMES_META)

    d = os.path.join(OUT, "st_sharded")
    os.makedirs(d, exist_ok=True)
    for f in os.listdir(d):
        os.remove(os.path.join(d, f))
    split = save_sharded(state(SHARDED), d, SHARD_MAX)
    print("sharded:", {k: v for k, v in split.filename_to_tensors.items()}, split.metadata)
    check_against_save_pretrained()
    for f in sorted(os.listdir(OUT)):
        p = os.path.join(OUT, f)
        print(f"  {f}: {os.path.getsize(p) if os.path.isfile(p) else sorted(os.listdir(p))}")


if __name__ == "__main__":
    main()
