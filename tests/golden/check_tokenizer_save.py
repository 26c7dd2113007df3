#!/usr/bin/env python3
"""Golden check for nb_tokenizer_save_json (run by hand, never in CI; it writes nothing to the repo).

    NIBBLE_LIB=/tmp/build-x/core/libnibble.so /root/nbvenv/bin/python tests/golden/check_tokenizer_save.py

For each GGUF tokenizer (llama.cpp's gpt-2 / qwen2 / llama-spm vocab GGUFs, stories260K, and
SmolLM2-135M-Instruct from ~/.cache/nibble when present), and Llama's tokenizer.model (as is and
with remove_extra_whitespaces switched on) nibble (through ctypes) writes the HF
files into a temporary directory; then
  - tokenizers.Tokenizer.from_file(tokenizer.json).encode(text) must give nibble's ids (nibble's
    GGUF tokenizer, NB_TOK_PARSE_SPECIAL, as HF always splits on added tokens), with and without
    add_special_tokens, and decode must give nibble's bytes;
  - transformers.AutoTokenizer.from_pretrained(dir) the same (its __call__ adds BOS as
    tokenizer_config.json says) and its decode;
  - transformers' own GGUF tokenizer loader (AutoTokenizer.from_pretrained(gguf_dir, gguf_file=...))
    the same, where it loads offline.
transformers' GGUF loader is compared for information only: it is not the reference. Seen with
transformers 5.24: on SmolLM2 it pre-tokenizes with plain GPT-2 ByteLevel and ignores the `smollm`
digit split that llama.cpp applies, so "4 ½" differs (3 of 140 texts); on llama-spm it uses Metaspace prepend_scheme "first", so text that starts with a space
differs from llama.cpp's vectors and Llama's own tokenizer (45 of 140); on stories260K it fails
(IndexError) on the padding id 0xFFFFFFFF.
Texts: every string of the three llama.cpp .inp files, and the first 200 KB of the TinyStories
validation text and of the Brown corpus. Prints one line per check; exits 1 on any difference.
"""
import ctypes
import glob
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SHARED = os.environ.get("NIBBLE_SHARED_DATA", os.path.normpath(os.path.join(HERE, "..", "..", "..", "shared", "data")))
LIB = os.environ.get("NIBBLE_LIB") or (glob.glob("/tmp/build-*/core/libnibble.so") + [None])[0]

NB_TOK_ADD_SPECIAL, NB_TOK_PARSE_SPECIAL = 1, 2


class Tokens(ctypes.Structure):
    _fields_ = [("ids", ctypes.POINTER(ctypes.c_int32)), ("n", ctypes.c_int64), ("cap", ctypes.c_int64)]


class Nibble:
    def __init__(self, path):
        self.lib = L = ctypes.CDLL(path)
        L.nb_ctx_new.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_void_p)]
        L.nb_ctx_last_error.restype = ctypes.c_char_p
        L.nb_ctx_last_error.argtypes = [ctypes.c_void_p]
        L.nb_tokenizer_load.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)]
        L.nb_tokenizer_save_json.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p]
        L.nb_tokenizer_encode.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int64,
                                          ctypes.c_uint32, ctypes.POINTER(Tokens)]
        L.nb_tokenizer_decode.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int32),
                                          ctypes.c_int64, ctypes.c_uint32, ctypes.c_char_p, ctypes.c_int64,
                                          ctypes.POINTER(ctypes.c_int64)]
        L.nb_tokens_free.argtypes = [ctypes.POINTER(Tokens)]
        L.nb_tokenizer_free.argtypes = [ctypes.c_void_p]
        self.ctx = ctypes.c_void_p()
        assert L.nb_ctx_new(1, ctypes.byref(self.ctx)) == 0

    def check(self, rc):
        if rc != 0:
            raise RuntimeError(self.lib.nb_ctx_last_error(self.ctx).decode())

    def load(self, path):
        t = ctypes.c_void_p()
        self.check(self.lib.nb_tokenizer_load(self.ctx, path.encode(), ctypes.byref(t)))
        return t

    def save(self, tok, d):
        self.check(self.lib.nb_tokenizer_save_json(self.ctx, tok, d.encode()))

    def encode(self, tok, text, flags):
        b = text.encode()
        t = Tokens()
        self.check(self.lib.nb_tokenizer_encode(self.ctx, tok, b, len(b), flags, ctypes.byref(t)))
        ids = [t.ids[i] for i in range(t.n)]
        self.lib.nb_tokens_free(ctypes.byref(t))
        return ids

    def decode(self, tok, ids):
        arr = (ctypes.c_int32 * max(len(ids), 1))(*ids)
        need = ctypes.c_int64()
        self.check(self.lib.nb_tokenizer_decode(self.ctx, tok, arr, len(ids), 0, None, 0, ctypes.byref(need)))
        buf = ctypes.create_string_buffer(need.value + 1)
        self.check(self.lib.nb_tokenizer_decode(self.ctx, tok, arr, len(ids), 0, buf, need.value + 1, ctypes.byref(need)))
        return buf.raw[:need.value]


def texts():
    out = []
    for name in ("gpt-2", "qwen2", "llama-spm"):
        with open(f"{SHARED}/tokenizers/llama.cpp-vocab-tests/ggml-vocab-{name}.gguf.inp", encoding="utf-8") as f:
            out += f.read().split("\n__ggml_vocab_test__\n")[:-1]
    for rel in ("text/tinystories_valid_head_776KiB.txt", "text/brown_corpus_plain.txt"):
        with open(f"{SHARED}/{rel}", "rb") as f:
            b = f.read()
        cut = b.rfind(b"\n", 0, 200 * 1024) + 1
        out.append(b[:cut].decode("utf-8"))
    return out


def main():
    if not LIB:
        sys.exit("set NIBBLE_LIB to libnibble.so")
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    nb = Nibble(LIB)
    cases = [(n, f"{SHARED}/tokenizers/llama.cpp-vocab-tests/ggml-vocab-{n}.gguf") for n in ("gpt-2", "qwen2", "llama-spm")]
    cases.append(("stories260K", f"{SHARED}/stories260K/stories260K.gguf"))
    # Llama's tokenizer.model, and the same with remove_extra_whitespaces on (one NormalizerSpec byte)
    model = f"{SHARED}/tokenizers/llama2-32k/tokenizer.model"
    cases.append(("llama2-32k.model", model))
    with open(model, "rb") as f:
        data = f.read()
    spec = b"identity\x12\x00\x18\x01\x20\x00"
    assert data.count(spec) == 1
    ws = tempfile.NamedTemporaryFile(suffix=".model", delete=False)
    ws.write(data.replace(spec, spec[:-1] + b"\x01"))
    ws.close()
    cases.append(("llama2-32k.model ws", ws.name))
    smol = os.path.expanduser("~/.cache/nibble/SmolLM2-135M-Instruct.Q4_1.gguf")
    if os.path.exists(smol):
        cases.append(("SmolLM2-135M-Instruct", smol))
    tx = texts()
    bad = 0

    def report(name, what, eq, total, n_ids, note=""):
        nonlocal bad
        bad += eq != total
        print(f"{name:22s} {what:34s} {eq}/{total} equal ({n_ids} ids){note}")

    for name, gguf in cases:
        tok = nb.load(gguf)
        with tempfile.TemporaryDirectory() as d:
            nb.save(tok, d)
            want = [nb.encode(tok, s, NB_TOK_PARSE_SPECIAL) for s in tx]
            want_bos = [nb.encode(tok, s, NB_TOK_PARSE_SPECIAL | NB_TOK_ADD_SPECIAL) for s in tx]
            n_ids = sum(len(w) for w in want_bos)

            hf = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
            got = [e.ids for e in hf.encode_batch(tx, add_special_tokens=False)]
            report(name, "tokenizers (no specials)", sum(a == b for a, b in zip(got, want)), len(tx), n_ids)
            got = [e.ids for e in hf.encode_batch(tx, add_special_tokens=True)]
            report(name, "tokenizers (add_special_tokens)", sum(a == b for a, b in zip(got, want_bos)), len(tx), n_ids)
            dec = [hf.decode(w, skip_special_tokens=False) for w in want]
            report(name, "tokenizers decode", sum(a.encode() == nb.decode(tok, w) for a, w in zip(dec, want)), len(tx), n_ids)

            at = AutoTokenizer.from_pretrained(d)
            got = [at(s)["input_ids"] for s in tx]
            report(name, f"AutoTokenizer ({type(at).__name__})", sum(a == b for a, b in zip(got, want_bos)), len(tx), n_ids)
            dec = [at.decode(w) for w in want]
            report(name, "AutoTokenizer decode", sum(a.encode() == nb.decode(tok, w) for a, w in zip(dec, want)), len(tx), n_ids)
            if at.chat_template:
                chat = at.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False,
                                              add_generation_prompt=True)
                print(f"{name:22s} {'chat template':34s} {chat!r}")
        if not gguf.endswith(".gguf"):
            nb.lib.nb_tokenizer_free(tok)
            continue
        try:
            gt = AutoTokenizer.from_pretrained(os.path.dirname(gguf), gguf_file=os.path.basename(gguf))
        except Exception as e:   # noqa: BLE001 (report whatever stops transformers' GGUF loader)
            print(f"{name:22s} AutoTokenizer(gguf_file=) does not load: {type(e).__name__}: {str(e)[:200]}")
        else:
            got = [gt(s)["input_ids"] for s in tx]
            eq = sum(a == b for a, b in zip(got, want_bos))
            diff = [i for i, (a, b) in enumerate(zip(got, want_bos)) if a != b]
            note = f"; first difference in text {diff[0]}: {tx[diff[0]][:40]!r}" if diff else ""
            # informational: transformers' GGUF loader is not the reference (see the docstring)
            print(f"{name:22s} {'AutoTokenizer(gguf_file=)':34s} {eq}/{len(tx)} equal ({n_ids} ids){note}")
        nb.lib.nb_tokenizer_free(tok)
    os.unlink(ws.name)
    print("all equal" if bad == 0 else f"{bad} checks differ")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
