#!/usr/bin/env python3
"""Golden data for nibble's data pipeline (tests/c/test_data_files.c): token streams and loss masks of the
fixtures in tests/data/ as Hugging Face `tokenizers` / `transformers` encode them, assembled by an
independent Python restatement of the rules in core/include/nibble/data.h.

Run by hand with the project venv:
    /root/nbvenv/bin/python tests/golden/gen_data_golden.py
Needs ../shared/data (stories260K's tokenizer.json, the Qwen2 vocab GGUF from llama.cpp's tests, the TinyStories
head). Writes tests/golden/data/data_golden.json.

Rules restated here (see data.h): each document is [BOS] tokens [EOS]; text is encoded without special tokens;
a run of text segments is encoded as one string and, where its mask changes, the boundary is the longest common
prefix of the encoding of the text before it with the encoding of the whole run (TRL's way); chat control tokens
are inserted by id. Masks: plain text all 1; prompt/completion: completion + EOS; messages: assistant content and
its end token (<|im_end|> or the plain template's "\n"), EOS when the last turn is the assistant's; BOS 0 in SFT.
"""
import json
import os

from tokenizers import Tokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SHARED = os.environ.get("NIBBLE_SHARED_DATA", os.path.join(ROOT, "..", "shared", "data"))
FIX = os.path.join(ROOT, "tests", "data")
WS = " \t\r\n\f\v"


class Enc:
    def __init__(self, encode, bos, eos, im_start=None, im_end=None):
        self.encode, self.bos, self.eos, self.im_start, self.im_end = encode, bos, eos, im_start, im_end


def lcp(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def encode_record(enc, segs, bos_mask, eos_mask):
    """segs: list of (str or int, mask). Returns ids, mask."""
    ids, mask = [], []
    if enc.bos is not None:
        ids.append(enc.bos)
        mask.append(bos_mask)
    i = 0
    while i < len(segs):
        if isinstance(segs[i][0], int):
            ids.append(segs[i][0])
            mask.append(segs[i][1])
            i += 1
            continue
        j = i
        while j < len(segs) and isinstance(segs[j][0], str):
            j += 1
        run = segs[i:j]
        text = "".join(s for s, _ in run)
        full = enc.encode(text) if text else []
        prev, prefix = 0, ""
        for k, (s, m) in enumerate(run):
            prefix += s
            if k + 1 < len(run) and run[k + 1][1] != m:
                b = lcp(enc.encode(prefix), full) if prefix else 0
                b = max(b, prev)
                ids += full[prev:b]
                mask += [m] * (b - prev)
                prev = b
        ids += full[prev:]
        mask += [run[-1][1]] * (len(full) - prev)
        i = j
    if enc.eos is not None:
        ids.append(enc.eos)
        mask.append(eos_mask)
    return ids, mask


def content_texts(c):
    if c is None:
        return []
    if isinstance(c, str):
        return [c]
    return [p["text"] for p in c]


def record(enc, obj):
    if "messages" in obj:
        segs, last = [], 0
        for msg in obj["messages"]:
            m = 1 if msg["role"] == "assistant" else 0
            if enc.im_start is not None:
                segs += [(enc.im_start, 0), (msg["role"], 0), ("\n", 0)]
                segs += [(t, m) for t in content_texts(msg["content"])]
                segs += [(enc.im_end, m), ("\n", 0)]
            else:
                segs += [(msg["role"], 0), (": ", 0)]
                segs += [(t, m) for t in content_texts(msg["content"])]
                segs += [("\n", m)]
            last = m
        return encode_record(enc, segs, 0, last)
    if "prompt" in obj or "completion" in obj:
        return encode_record(enc, [(obj["prompt"], 0), (obj["completion"], 1)], 0, 1)
    return encode_record(enc, [(obj["text"], 1)], 1, 1)


def stream(enc, records):
    ids, mask, starts = [], [], []
    for rec in records:
        starts.append(len(ids))
        a, b = rec
        ids += a
        mask += b
    return {"ids": ids, "mask": mask, "doc_start": starts, "n_tokens": len(ids)}


def jsonl(enc, path):
    recs = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip(WS):
                recs.append(record(enc, json.loads(line)))
    return stream(enc, recs)


def text_blank_lines(enc, path):
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    docs, cur = [], []
    for ln in lines:
        if ln.strip(WS) == "":
            if cur:
                docs.append("\n".join(cur))
            cur = []
        else:
            cur.append(ln)
    if cur:
        docs.append("\n".join(cur))
    return [d.strip(WS) for d in docs if d.strip(WS)]


def text_separator(path, sep):
    with open(path, encoding="utf-8") as f:
        return [d.strip(WS) for d in f.read().split(sep) if d.strip(WS)]


def text_docs(enc, docs):
    return stream(enc, [encode_record(enc, [(d, 1)], 1, 1) for d in docs])


def main():
    out = {}
    st = Tokenizer.from_file(os.path.join(SHARED, "stories260K", "hf", "tokenizer.json"))
    # stories260K: tokenizer_config.json says add_bos_token true; <s> = 1, </s> = 2; no ChatML tokens
    s_enc = Enc(lambda t: st.encode(t, add_special_tokens=False).ids, 1, 2)
    out["stories260K"] = {
        "mixed.jsonl": jsonl(s_enc, os.path.join(FIX, "mixed.jsonl")),
        "chat.jsonl": jsonl(s_enc, os.path.join(FIX, "chat.jsonl")),
        "docs.txt": text_docs(s_enc, text_blank_lines(s_enc, os.path.join(FIX, "docs.txt"))),
        "stories.txt": text_docs(s_enc, text_separator(os.path.join(FIX, "stories.txt"), "<|endoftext|>")),
    }
    # the 2 MiB TinyStories head split at <|endoftext|>: counts, ends and a checksum only
    ts = text_separator(os.path.join(SHARED, "text", "tinystories_train_head_2MiB.txt"), "<|endoftext|>")
    big = text_docs(s_enc, ts)
    out["stories260K"]["tinystories_train_head_2MiB.txt"] = {
        "n_tokens": big["n_tokens"], "n_docs": len(big["doc_start"]), "head": big["ids"][:64], "tail": big["ids"][-64:],
        "sum_ids_mod_2_31": sum((i + 1) * v for i, v in enumerate(big["ids"])) % (2 ** 31),
        "doc_start_100": big["doc_start"][100],
    }
    # Qwen2 (ChatML tokens; byte-level BPE) from llama.cpp's vocab GGUF, converted by transformers
    from transformers import AutoTokenizer
    import gguf
    vdir = os.path.join(SHARED, "tokenizers", "llama.cpp-vocab-tests")
    q = AutoTokenizer.from_pretrained(vdir, gguf_file="ggml-vocab-qwen2.gguf")
    r = gguf.GGUFReader(os.path.join(vdir, "ggml-vocab-qwen2.gguf"))

    def kv(name, default=None):
        f = r.fields.get(name)
        return default if f is None else f.parts[f.data[0]][0].item()

    add_bos = bool(kv("tokenizer.ggml.add_bos_token", False))
    bos = kv("tokenizer.ggml.bos_token_id")
    eos = kv("tokenizer.ggml.eos_token_id")
    im = q.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"])
    q_enc = Enc(lambda t: q(t, add_special_tokens=False).input_ids, bos if add_bos else None, eos, im[0], im[1])
    out["qwen2"] = {
        "add_bos": add_bos, "bos": bos, "eos": eos, "im_start": im[0], "im_end": im[1],
        "mixed.jsonl": jsonl(q_enc, os.path.join(FIX, "mixed.jsonl")),
        "chat.jsonl": jsonl(q_enc, os.path.join(FIX, "chat.jsonl")),
    }
    os.makedirs(os.path.join(HERE, "data"), exist_ok=True)
    with open(os.path.join(HERE, "data", "data_golden.json"), "w") as f:
        json.dump(out, f, separators=(",", ":"))
        f.write("\n")
    print("wrote", os.path.join(HERE, "data", "data_golden.json"))


if __name__ == "__main__":
    main()
