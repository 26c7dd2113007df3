#!/usr/bin/env python3
"""Rewrite a GGUF with every tensor dequantized to F32 (or F16), metadata copied unchanged except
general.file_type. bench_llamacpp.sh uses it so llama.cpp can run the very weights nibble computes
with (nibble dequantizes quantized GGUF tensors to float32 at load): a like-for-like comparison.
Usage: gguf_dequant.py IN.gguf OUT.gguf [--type f32|f16]   (needs the `gguf` and numpy packages)"""
import argparse

import numpy as np
import gguf


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src")
    ap.add_argument("dst")
    ap.add_argument("--type", choices=["f32", "f16"], default="f32")
    a = ap.parse_args()
    r = gguf.GGUFReader(a.src)
    arch = r.get_field(gguf.Keys.General.ARCHITECTURE).contents()
    w = gguf.GGUFWriter(a.dst, arch)
    ftype = gguf.LlamaFileType.ALL_F32 if a.type == "f32" else gguf.LlamaFileType.MOSTLY_F16
    for f in r.fields.values():
        if f.name == gguf.Keys.General.ARCHITECTURE or f.name.startswith("GGUF."):
            continue
        if f.name == gguf.Keys.General.FILE_TYPE:
            w.add_key_value(f.name, int(ftype), gguf.GGUFValueType.UINT32)
            continue
        vt = f.types[0]
        st = f.types[-1] if vt == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(f.name, f.contents(), vt, sub_type=st)
    for t in r.tensors:
        x = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        # 1-D tensors (norms) stay F32 as llama.cpp's converters keep them
        if a.type == "f16" and x.ndim > 1:
            x = x.astype(np.float16)
        # the reader's shape is ggml order (ne0 first); numpy arrays are row-major (ne0 last)
        x = x.reshape([int(d) for d in reversed(t.shape)])
        w.add_tensor(t.name, x)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
