#!/usr/bin/env python3
"""Golden data for the model runtime (tests/c/test_model_golden.c), made with transformers.

Writes tiny random models of the other architectures nibble supports, each to
tests/golden/data/model_<name>/ as transformers saves them (config.json + model.safetensors,
float32), plus what transformers computes on them in float64:
  logits_f32le.bin   [B*T, vocab] logits of golden.json's ids
  hidden_f32le.bin   [n_layers+1, B*T, hidden] output_hidden_states
  grads.safetensors  d(mean next-token cross-entropy, labels = ids)/d(every parameter), HF names
  golden.json        ids, B, T, loss, tied, versions
and, for llama3 and qwen3, the same weights as model.gguf, written with gguf-py the way llama.cpp's
convert_hf_to_gguf.py does (llama: q/k rows permuted to the interleaved RoPE layout, llama3 scaling
as a rope_freqs.weight tensor; qwen3: NEOX RoPE, no permutation, q/k norms, no output.weight).
Weights are drawn larger than the initializer's (std 0.25, norms 1 + N(0, 0.1)) so that logits
are O(1) and a 1e-4 tolerance means something. Run by hand:
  /root/nbvenv/bin/python tests/golden/gen_model_golden.py
"""
import json
import math
import os

import gguf
import numpy as np
import torch
import transformers
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")

COMMON = dict(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2, rms_norm_eps=1e-6,
              bos_token_id=1, eos_token_id=2, initializer_range=0.02)

MODELS = {
    # Qwen3: q/k RMSNorm, head_dim 16 != hidden/heads, GQA 4:2, tied embeddings, theta 1e6
    "qwen3": (Qwen3Config, dict(COMMON, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                max_position_embeddings=512, rope_theta=1000000.0, tie_word_embeddings=True,
                                attention_bias=False)),
    # Llama 3.x style: GQA 4:1, llama3 RoPE scaling with a medium-frequency band in use, untied
    "llama3": (LlamaConfig, dict(COMMON, num_attention_heads=4, num_key_value_heads=1, head_dim=8,
                                 max_position_embeddings=1024, tie_word_embeddings=False,
                                 rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                               "high_freq_factor": 4.0, "original_max_position_embeddings": 256,
                                               "rope_theta": 500000.0},
                                 rope_theta=500000.0)),
    # Qwen2: q/k/v biases, untied
    "qwen2": (Qwen2Config, dict(COMMON, num_attention_heads=4, num_key_value_heads=2,
                                max_position_embeddings=512, rope_theta=10000.0, tie_word_embeddings=False)),
    # Mistral: sliding window 8 over 24 positions
    "mistral": (MistralConfig, dict(COMMON, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                    max_position_embeddings=512, sliding_window=8, tie_word_embeddings=False)),
}

B, T = 2, 24


def randomize(model, gen):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.25 * torch.randn(p.shape, generator=gen))


GGUF_NAMES = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
              "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
              "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate",
              "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


def gguf_name(hf):
    if hf == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf == "model.norm.weight":
        return "output_norm.weight"
    if hf == "lm_head.weight":
        return "output.weight"
    parts = hf.split(".")          # model.layers.N.<module...>.weight
    mod, leaf = ".".join(parts[3:-1]), parts[-1]
    return f"blk.{parts[2]}.{GGUF_NAMES[mod]}.{leaf}"


def permute(w, n_head):             # convert_hf_to_gguf.py LlamaModel.permute
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(path, arch, cfg, state):
    w = gguf.GGUFWriter(path, arch)
    hd = cfg.head_dim
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_rope_dimension_count(hd)
    rp = cfg.rope_parameters
    w.add_rope_freq_base(rp["rope_theta"])
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    w.add_bos_token_id(cfg.bos_token_id)
    w.add_eos_token_id(cfg.eos_token_id)
    if rp.get("rope_type") == "llama3":   # convert_hf_to_gguf.py LlamaModel.generate_extra_tensors
        base, factor = rp["rope_theta"], rp["factor"]
        lo, hi, old = rp["low_freq_factor"], rp["high_freq_factor"], rp["original_max_position_embeddings"]
        freqs = 1.0 / (base ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
        factors = []
        for f in freqs.tolist():
            wl = 2 * math.pi / f
            if wl < old / hi:
                factors.append(1)
            elif wl > old / lo:
                factors.append(factor)
            else:
                sm = (old / wl - lo) / (hi - lo)
                factors.append(1 / ((1 - sm) / factor + sm))
        w.add_tensor("rope_freqs.weight", np.array(factors, dtype=np.float32))
    for name, t in state.items():
        a = t.detach().float().numpy()
        if arch == "llama" and name.endswith("q_proj.weight"):
            a = permute(a, cfg.num_attention_heads)
        if arch == "llama" and name.endswith("k_proj.weight"):
            a = permute(a, cfg.num_key_value_heads)
        w.add_tensor(gguf_name(name), np.ascontiguousarray(a))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    for i, (name, (cls, kw)) in enumerate(MODELS.items()):
        gen = torch.Generator().manual_seed(100 + i)
        cfg = cls(**kw)
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, attn_implementation="eager")
        randomize(model, gen)
        d = os.path.join(OUT, "model_" + name)
        os.makedirs(d, exist_ok=True)
        model.save_pretrained(d, safe_serialization=True)
        if name in ("llama3", "qwen3"):
            from safetensors.torch import load_file
            write_gguf(os.path.join(d, "model.gguf"), "llama" if name == "llama3" else "qwen3", cfg,
                       load_file(os.path.join(d, "model.safetensors")))
        gc = os.path.join(d, "generation_config.json")
        if os.path.exists(gc):
            os.remove(gc)
        ids = torch.randint(0, cfg.vocab_size, (B, T), generator=gen)
        m64 = model.double()
        out = m64(ids, labels=ids, output_hidden_states=True)
        out.loss.backward()
        logits = out.logits.detach().reshape(B * T, -1).float().numpy()
        logits.astype("<f4").tofile(os.path.join(d, "logits_f32le.bin"))
        hidden = torch.stack([h.detach().reshape(B * T, -1) for h in out.hidden_states]).float().numpy()
        hidden.astype("<f4").tofile(os.path.join(d, "hidden_f32le.bin"))
        grads = {n: p.grad.detach().float().contiguous() for n, p in m64.named_parameters() if p.grad is not None}
        save_file(grads, os.path.join(d, "grads.safetensors"))
        tied = "lm_head.weight" not in set(
            __import__("safetensors").safe_open(os.path.join(d, "model.safetensors"), "pt").keys())
        meta = {"ids": ids.reshape(-1).tolist(), "B": B, "T": T, "loss": out.loss.item(), "tied": tied,
                "n_layers": cfg.num_hidden_layers, "hidden_size": cfg.hidden_size, "vocab_size": cfg.vocab_size,
                "transformers": transformers.__version__, "torch": torch.__version__,
                "note": "transformers in float64, attn_implementation=eager; labels = ids (HF shifts them)"}
        with open(os.path.join(d, "golden.json"), "w") as f:
            json.dump(meta, f, indent=1)
        print(f"{name}: loss {out.loss.item():.6f}, |logits| max {np.abs(logits).max():.3f}, tied {tied} -> {d}")


if __name__ == "__main__":
    main()
