#!/usr/bin/env python3
"""Golden data for mixture-of-experts models (Mixtral, Qwen3-MoE, OLMoE), made with transformers.

Writes tiny random MoE models to tests/golden/moe/<name>/ as transformers saves them (config.json +
model.safetensors, float32, per-expert checkpoint names such as
model.layers.0.block_sparse_moe.experts.3.w1.weight / model.layers.1.mlp.experts.3.gate_proj.weight),
plus what transformers computes on them in float64 (eager attention):

  logits_f32le.bin        [B*T, vocab] logits of golden.json's ids
  loss_weights_f32le.bin  [B*T, vocab] the fixed weights R of the loss L = sum(logits * R)
  grads.safetensors       dL/d(every parameter), checkpoint names (routers included; transformers keeps
                          the experts fused as [E, 2I, H] gate_up / [E, H, I] down, and the gradients are
                          split back to the per-expert names the checkpoint uses: rows [0, I) are
                          gate_proj / w1, rows [I, 2I) up_proj / w3)
  aux_grads.safetensors   d(aux)/d(router weights), aux = transformers' load_balancing_loss_func over all
                          MoE layers (num_experts_per_tok, no attention mask), the unscaled auxiliary loss
  golden.json             ids, B, T, loss, aux_loss, the per-layer router choices (for every MoE layer and
                          token: the top-k expert indices in torch.topk order and the routing weights the
                          experts' outputs are multiplied by), the smallest top-k margin in router logits
                          (z_k - z_{k+1}) over all tokens and MoE layers, the MoE and dense layer indices, versions

Models (seeded; weights drawn larger than the initializer's so that logits are O(1) and routing is decisive):
  mixtral        MixtralForCausalLM, 4 experts, top-2 (always renormalised), untied
  qwen3moe_norm  Qwen3MoeForCausalLM, 8 experts, top-2, norm_topk_prob true, 3 layers with
                 mlp_only_layers [1] (layers 0 and 2 MoE, layer 1 a dense SwiGLU of intermediate_size)
  qwen3moe_nonorm Qwen3MoeForCausalLM, 4 experts, top-2, norm_topk_prob false, decoder_sparse_step 2
                 (layer 0 dense, layer 1 MoE), tied embeddings
  olmoe          OlmoeForCausalLM, 8 experts, top-2, norm_topk_prob false, q/k RMSNorm over the whole
                 q / k projection (hidden and kv_heads*head_dim wide)

transformers computes the router softmax in float32 even in a float64 model (softmax(..., dtype=torch.float)
/ .float()), so the routing weights carry float32 rounding (~6e-8 relative); every other operation is float64.
Tolerances for nibble (float32): logits within 1e-4 absolute+relative (|logits| are O(1) here and a float32
forward over 2-3 layers of width <= 128 accumulates ~1e-6), gradients within 1e-3 relative to each tensor's
max |grad|, router choices exact (the smallest margin, recorded, is far above float32 rounding).

Run by hand (never in CI):
  /root/nbvenv/bin/python tests/golden/gen_moe_golden.py
"""
import json
import os

import numpy as np
import torch
import transformers
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, MixtralConfig, OlmoeConfig, Qwen3MoeConfig
from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "moe")

COMMON = dict(vocab_size=128, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6,
              max_position_embeddings=256, bos_token_id=1, eos_token_id=2, pad_token_id=0,
              initializer_range=0.02, num_experts_per_tok=2, output_router_logits=False)

MODELS = {
    "mixtral": (MixtralConfig, dict(COMMON, num_hidden_layers=2, intermediate_size=32, num_local_experts=4,
                                    head_dim=16, rope_theta=1000000.0, tie_word_embeddings=False,
                                    router_jitter_noise=0.0, sliding_window=None)),
    "qwen3moe_norm": (Qwen3MoeConfig, dict(COMMON, num_hidden_layers=3, intermediate_size=48,
                                           moe_intermediate_size=32, num_experts=8, norm_topk_prob=True,
                                           decoder_sparse_step=1, mlp_only_layers=[1], head_dim=16,
                                           rope_theta=1000000.0, tie_word_embeddings=False,
                                           attention_bias=False, use_sliding_window=False)),
    "qwen3moe_nonorm": (Qwen3MoeConfig, dict(COMMON, num_hidden_layers=2, intermediate_size=48,
                                             moe_intermediate_size=32, num_experts=4, norm_topk_prob=False,
                                             decoder_sparse_step=2, mlp_only_layers=[], head_dim=16,
                                             rope_theta=1000000.0, tie_word_embeddings=True,
                                             attention_bias=False, use_sliding_window=False)),
    "olmoe": (OlmoeConfig, dict(COMMON, num_hidden_layers=2, intermediate_size=32, num_experts=8,
                                norm_topk_prob=False, rope_theta=10000.0, tie_word_embeddings=False,
                                clip_qkv=None, attention_bias=False)),
}

B, T = 2, 16
MIN_MARGIN = 1e-2   # in router logits, which a float32 forward gets right to ~1e-5 here

# checkpoint names of an expert's three matrices, as transformers saves them
EXPERT_NAMES = {"mixtral": ("block_sparse_moe", "w1", "w3", "w2")}
DEFAULT_EXPERT_NAMES = ("mlp", "gate_proj", "up_proj", "down_proj")


def randomize(model, gen):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            elif name.endswith("gate.weight"):          # routers: wide logits, decisive top-k
                p.copy_(0.5 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.15 * torch.randn(p.shape, generator=gen))


def hook_for(mod_name, seen):
    """A forward hook on a router: its top-k choices, their weights and the smallest top-k router-logit margin."""
    def f(mod, args, out):
        logits, scores, idx = out
        top = torch.topk(logits.detach().double(), mod.top_k + 1, dim=-1).values   # softmax is monotonic
        seen[mod_name] = dict(experts=idx.tolist(), weights=scores.detach().double().tolist(),
                              margin=float((top[:, mod.top_k - 1] - top[:, mod.top_k]).min()))
    return f


def checkpoint_grads(name, model):
    """Gradients under the checkpoint's names (fused expert tensors split per expert)."""
    block, gname, uname, dname = EXPERT_NAMES.get(name, DEFAULT_EXPERT_NAMES)
    out = {}
    for n, p in model.named_parameters():
        g = torch.zeros(p.shape, dtype=torch.float32) if p.grad is None else p.grad.detach().float()
        if n.endswith("experts.gate_up_proj"):
            prefix = n[: -len("experts.gate_up_proj")].replace(".mlp.", f".{block}.")
            inter = g.shape[1] // 2
            for e in range(g.shape[0]):
                out[f"{prefix}experts.{e}.{gname}.weight"] = g[e, :inter].contiguous()
                out[f"{prefix}experts.{e}.{uname}.weight"] = g[e, inter:].contiguous()
        elif n.endswith("experts.down_proj"):
            prefix = n[: -len("experts.down_proj")].replace(".mlp.", f".{block}.")
            for e in range(g.shape[0]):
                out[f"{prefix}experts.{e}.{dname}.weight"] = g[e].contiguous()
        else:
            out[n.replace(".mlp.gate.", f".{block}.gate.")] = g.contiguous()
    return out


def main():
    os.makedirs(OUT, exist_ok=True)
    for i, (name, (cls, kw)) in enumerate(MODELS.items()):
        gen = torch.Generator().manual_seed(1900 + i)
        cfg = cls(**kw)
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, attn_implementation="eager",
                                                 experts_implementation="eager")
        randomize(model, gen)
        model.eval()
        d = os.path.join(OUT, name)
        os.makedirs(d, exist_ok=True)
        model.save_pretrained(d, safe_serialization=True)
        gc = os.path.join(d, "generation_config.json")
        if os.path.exists(gc):
            os.remove(gc)

        m64 = model.double()
        routers = [(n, m) for n, m in m64.named_modules() if type(m).__name__.endswith("TopKRouter")]
        seen = {}
        # ids drawn until every token's top-k choice is decisive in every MoE layer (router-logit margin z_k - z_{k+1}
        # >= MIN_MARGIN), so that a float32 implementation must route exactly as this float64 reference does
        handles = [m.register_forward_hook(hook_for(n, seen)) for n, m in routers]
        for attempt in range(1000):
            ids = torch.randint(3, cfg.vocab_size, (B, T), generator=gen)
            with torch.no_grad():
                m64(ids)
            if min(v["margin"] for v in seen.values()) >= MIN_MARGIN:
                break
        else:
            raise SystemExit(f"{name}: no ids with top-k margins >= {MIN_MARGIN}")
        for h in handles:
            h.remove()

        handles = [m.register_forward_hook(hook_for(n, seen)) for n, m in routers]
        out = m64(ids, output_router_logits=True)
        for h in handles:
            h.remove()
        R = torch.randn(out.logits.shape, generator=gen, dtype=torch.float32)
        loss = (out.logits * R.double()).sum()
        loss.backward()
        grads = checkpoint_grads(name, m64)
        # the auxiliary loss alone, w.r.t. the routers
        m64.zero_grad()
        out2 = m64(ids, output_router_logits=True)
        aux = load_balancing_loss_func(out2.router_logits, cfg.num_experts if hasattr(cfg, "num_experts")
                                       else cfg.num_local_experts, cfg.num_experts_per_tok, None)
        aux.backward()
        aux_grads = {k: v for k, v in checkpoint_grads(name, m64).items() if k.endswith(".gate.weight")}

        # the saved checkpoint and the gradients name the same tensors with the same shapes
        from safetensors import safe_open
        with safe_open(os.path.join(d, "model.safetensors"), "pt") as f:
            saved = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
        tied = "lm_head.weight" not in saved
        want = {k: tuple(v.shape) for k, v in grads.items() if not (tied and k == "lm_head.weight")}
        assert want == saved, (sorted(set(want) ^ set(saved)))

        logits = out.logits.detach().reshape(B * T, -1).float().numpy()
        logits.astype("<f4").tofile(os.path.join(d, "logits_f32le.bin"))
        R.reshape(B * T, -1).numpy().astype("<f4").tofile(os.path.join(d, "loss_weights_f32le.bin"))
        save_file(grads, os.path.join(d, "grads.safetensors"))
        save_file(aux_grads, os.path.join(d, "aux_grads.safetensors"))

        layers = {}
        for n, _ in routers:                      # model.layers.N.mlp.gate
            layers[n.split(".")[2]] = seen[n]
        moe_layers = sorted(int(k) for k in layers)
        meta = {"ids": ids.reshape(-1).tolist(), "B": B, "T": T, "loss": loss.item(), "aux_loss": aux.item(),
                "loss_definition": "sum(logits[b*T+t, v] * loss_weights[b*T+t, v]) over all b, t, v",
                "aux_definition": "transformers load_balancing_loss_func(router_logits of every MoE layer, "
                                  "num_experts, num_experts_per_tok, attention_mask=None), unscaled",
                "tied": tied, "n_layers": cfg.num_hidden_layers, "moe_layers": moe_layers,
                "dense_layers": [l for l in range(cfg.num_hidden_layers) if l not in moe_layers],
                "top_k": cfg.num_experts_per_tok,
                "min_topk_margin": min(v["margin"] for v in layers.values()),
                "routes": {k: {"experts": v["experts"], "weights": v["weights"]} for k, v in layers.items()},
                "transformers": transformers.__version__, "torch": torch.__version__,
                "note": "transformers in float64 (router softmax in float32, as transformers computes it), "
                        "attn_implementation=eager, experts_implementation=eager; "
                        "routes[layer].experts[token] in torch.topk order"}
        with open(os.path.join(d, "golden.json"), "w") as f:
            json.dump(meta, f, indent=1)
        print(f"{name}: loss {loss.item():.6f} aux {aux.item():.6f} |logits| max {np.abs(logits).max():.3f} "
              f"min top-k margin {meta['min_topk_margin']:.3e} moe layers {moe_layers} tied {tied} -> {d}")


if __name__ == "__main__":
    main()
