#!/usr/bin/env python3
"""Golden data for nibble's tokenizers (run by hand, never in CI).

    /root/nbvenv/bin/python tests/golden/gen_tokenizer_golden.py

Uses Hugging Face `tokenizers` (0.23) as the reference. Writes into tests/golden/data/tokenizers/:

<name>/tokenizer.json  small BPE tokenizers trained here on the first 200 KB of the Brown corpus
    (../shared/data/text/brown_corpus_plain.txt), each with a different normalizer / pre-tokenizer /
    decoder / added-token setup, to exercise the parts of tokenizer.json the real vocabularies in
    ../shared/data do not: ByteLevel add_prefix_space, every Split behavior (+ invert, String
    patterns), Digits, Metaspace (prepend_scheme first / always, split on / off), byte fallback,
    added tokens with lstrip / rstrip, special vs non-special added tokens, a BOS/EOS template,
    and Llama-3's pre-tokenizer regex with ignore_merges (plus vocabulary entries no merge makes).
cases.json  {"cases": [{"tok", "text", "ids", "ids_special", "ids_noparse", "decoded"}]}:
    ids          Tokenizer.encode(text, add_special_tokens=False).ids
    ids_special  the same with add_special_tokens=True (the post_processor template)
    ids_noparse  with encode_special_tokens=True (special added tokens are plain text)
    decoded      Tokenizer.decode(ids, skip_special_tokens=False)
  tok "llama2-32k" cases use ../shared/data/tokenizers/llama2-32k/tokenizer.json; "qwen2" and
  "gpt-2" cases use the tokenizer.json transformers builds from the llama.cpp vocab GGUFs in
  ../shared/data/tokenizers/llama.cpp-vocab-tests (AutoTokenizer.from_pretrained(gguf_file=...)),
  and test_tokenizer_vocab.c checks them against nibble's GGUF loader.
"""
import json
import os
import shutil
import tempfile

from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers,
                        processors, trainers)

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "data", "tokenizers")
SHARED = os.path.normpath(os.path.join(HERE, "..", "..", "..", "shared", "data"))

TEXTS = [
    "Hello world",
    " Hello world",
    "Hello, world! How are you?",
    "   leading spaces",
    "trailing spaces   ",
    "tabs\tand\nnewlines\n\n  mixed \t\n",
    "numbers 1 22 333 4444 55555 3.14159",
    "Cửa Việt нещо на Български 我想在apple工作1314151天～",
    "🚀 (normal) 😶\u200d🌫️ emoji ✅",
    "I've been 'told he's there, 'RE you sure? We'Ve a'lL",
    "!!!!!!?????? ......",
    "x",
    " ",
    "",
    "<|end|>",
    "Hello<|end|>world",
    "Hello <|end|> world",
    "a  <|end|>  b<|end|>c",
    "<tool>call<tool> <tool>x",
    "<|start|>hi<|end|>",
    "spaces    <tool>   after",
    " tokenization Tokenization tokenizations",
    "I'M 12345 years, HE'S 1234567\r\n\r\nnew",
]


LLAMA3_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
             r"\s*[\r\n]+|\s+(?!\S)|\s+")


def corpus():
    with open(os.path.join(SHARED, "text", "brown_corpus_plain.txt"), encoding="utf-8") as f:
        return f.read(200_000).splitlines()


def train(pre, decoder, normalizer=None, byte_level=False, byte_fallback=False, vocab=420):
    tok = Tokenizer(models.BPE(byte_fallback=byte_fallback, unk_token=None if byte_level else "<unk>"))
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre
    tok.decoder = decoder
    alphabet = pre_tokenizers.ByteLevel.alphabet() if byte_level else []
    tr = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<unk>"] if not byte_level else [],
                             initial_alphabet=alphabet, show_progress=False)
    tok.train_from_iterator(corpus(), tr)
    if byte_fallback:
        # SentencePiece-style byte tokens live in the model vocabulary (not as added tokens)
        d = json.loads(tok.to_str())
        v = d["model"]["vocab"]
        for b in range(256):
            name = "<0x%02X>" % b
            if name not in v:
                v[name] = len(v)
        tok = Tokenizer.from_str(json.dumps(d))
    tok.add_special_tokens([AddedToken("<|end|>", lstrip=True, rstrip=True, special=True),
                            AddedToken("<|start|>", special=True)])
    tok.add_tokens([AddedToken("<tool>", special=False)])
    return tok


def template(tok):
    s, e = tok.token_to_id("<|start|>"), tok.token_to_id("<|end|>")
    tok.post_processor = processors.TemplateProcessing(
        single="<|start|> $A <|end|>", pair="<|start|> $A <|end|> $B:1 <|end|>:1",
        special_tokens=[("<|start|>", s), ("<|end|>", e)])


def build():
    toks = {}
    t = train(pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True), decoders.ByteLevel(), byte_level=True)
    template(t)
    toks["bl_prefix"] = t
    toks["split_prev_digits"] = train(pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\s+"), behavior="merged_with_previous"),
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]), decoders.ByteLevel(), byte_level=True)
    toks["split_next_contig"] = train(pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"[,.!?]"), behavior="merged_with_next"),
        pre_tokenizers.Split(Regex(r"\d"), behavior="contiguous"),
        pre_tokenizers.Digits(individual_digits=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]), decoders.ByteLevel(), byte_level=True)
    toks["split_removed_invert"] = train(pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\p{L}+|\p{N}+|[^\s\p{L}\p{N}]+"), behavior="removed", invert=True),
        pre_tokenizers.Split(" ", behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]), decoders.ByteLevel(), byte_level=True)
    toks["meta_first"] = train(pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=True),
                               decoders.Metaspace(replacement="▁", prepend_scheme="first"), byte_fallback=True)
    toks["meta_always_nosplit"] = train(pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=False),
                                        decoders.Sequence([decoders.Metaspace(replacement="▁", prepend_scheme="always"),
                                                           decoders.ByteFallback(), decoders.Fuse()]),
                                        byte_fallback=True)
    t = train(pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_RE), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]), decoders.ByteLevel(), byte_level=True)
    # Llama-3 style: whole pre-tokens found in the vocabulary skip the merges; give it some that
    # no merge sequence produces, so ignore_merges changes the result
    d = json.loads(t.to_str())
    d["model"]["ignore_merges"] = True
    v = d["model"]["vocab"]
    for w in ["\u0120tokenization", "Tokenization", "\u0120years"]:
        if w not in v:
            v[w] = max(v.values()) + 1
    n = max(v.values()) + 1
    for a in d["added_tokens"]:
        a["id"] = n
        n += 1
    toks["llama3_ignore_merges"] = Tokenizer.from_str(json.dumps(d))
    t = train(None, decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                       decoders.Strip(" ", 1, 0)]),
              normalizer=normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")]),
              byte_fallback=True)
    template(t)
    toks["spm_norm"] = t
    return toks


def cases_for(name, tok, texts):
    out = []
    for s in texts:
        tok.encode_special_tokens = False
        ids = tok.encode(s, add_special_tokens=False).ids
        ids_sp = tok.encode(s, add_special_tokens=True).ids
        tok.encode_special_tokens = True
        ids_np = tok.encode(s, add_special_tokens=False).ids
        tok.encode_special_tokens = False
        out.append({"tok": name, "text": s, "ids": ids, "ids_special": ids_sp, "ids_noparse": ids_np,
                    "decoded": tok.decode(ids, skip_special_tokens=False)})
    return out


def main():
    if os.path.isdir(OUT):
        shutil.rmtree(OUT)
    os.makedirs(OUT)
    cases = []
    for name, tok in build().items():
        os.makedirs(os.path.join(OUT, name))
        tok.save(os.path.join(OUT, name, "tokenizer.json"))
        cases += cases_for(name, Tokenizer.from_file(os.path.join(OUT, name, "tokenizer.json")), TEXTS)

    real_texts = ["<s>Hello</s>", "Hello <s> world</s>", "<unk> x", "<|im_start|>user\nHi there<|im_end|>\n",
                  "Hello<|endoftext|>World", "  <|endoftext|>  ", "<|im_end|><|im_start|>"]
    llama = Tokenizer.from_file(os.path.join(SHARED, "tokenizers", "llama2-32k", "tokenizer.json"))
    cases += cases_for("llama2-32k", llama, real_texts)
    from transformers import AutoTokenizer
    vt = os.path.join(SHARED, "tokenizers", "llama.cpp-vocab-tests")
    with tempfile.TemporaryDirectory() as tmp:
        for name in ["qwen2", "gpt-2"]:
            AutoTokenizer.from_pretrained(vt, gguf_file="ggml-vocab-%s.gguf" % name).save_pretrained(os.path.join(tmp, name))
            t = Tokenizer.from_file(os.path.join(tmp, name, "tokenizer.json"))
            cases += cases_for(name, t, real_texts)
    with open(os.path.join(OUT, "cases.json"), "w", encoding="utf-8") as f:
        json.dump({"cases": cases}, f, ensure_ascii=False, indent=0)
    print("wrote", len(cases), "cases")


if __name__ == "__main__":
    main()
