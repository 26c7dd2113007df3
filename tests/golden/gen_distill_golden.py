#!/usr/bin/env python3
"""Golden data for nibble's distillation losses and AdamW (tests/c/test_distill.c, tests/c/test_optim.c).

Run by hand with the project venv (torch 2.15 CPU, nvidia-modelopt 0.47, transformers):
    /root/nbvenv/bin/python tests/golden/gen_distill_golden.py
Writes tests/golden/data/distill_golden.json (cases and scalars) and distill_golden.bin (arrays, little endian;
the JSON's "arrays" table gives dtype, shape and byte offset of each).

Losses: float64 autograd on float32-valued logits. Forward KL with the T^2 factor is modelopt's own
LogitsDistillationLoss; top-k "renorm" follows modelopt 0.47 TopKLogitsKLLoss (both distributions softmaxed over
the teacher's top k); "ghost" follows ModelOpt main TopLogitsKLLoss (full-vocab log-probs plus a residual bucket);
"student_full" renormalizes the teacher over its top k and scores the student's full-vocab log-softmax there.
AdamW: torch.optim.AdamW (fp32, CPU single-tensor path); clip: torch.nn.utils.clip_grad_norm_;
schedule: transformers get_cosine_with_min_lr_schedule_with_warmup.
"""
import json
import math
import os
import struct

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "data")
EPS32 = float(torch.finfo(torch.float32).eps)


class Blob:
    def __init__(self):
        self.buf = bytearray()
        self.arrays = {}

    def add(self, name, arr, dtype):
        a = np.ascontiguousarray(np.asarray(arr, dtype={"f32": "<f4", "f64": "<f8", "i32": "<i4"}[dtype]))
        while len(self.buf) % 8:
            self.buf.append(0)
        self.arrays[name] = {"dtype": dtype, "shape": list(a.shape), "offset": len(self.buf)}
        self.buf += a.tobytes()
        return name


def make_inputs(gen, n, v, big_row):
    s = torch.randn(n, v, generator=gen, dtype=torch.float64) * 3.0
    s[:, 3] += 6.0  # a shared favourite token, so the distributions are peaked like a real LM's
    t = s + torch.randn(n, v, generator=gen, dtype=torch.float64) * 1.5
    s[big_row] += 80.0  # exercise the max subtraction
    t[big_row] += 75.0
    s = s.float().double()  # the C side gets float32 logits: the reference works on those exact values
    t = t.float().double()
    labels = torch.randint(0, v, (n,), generator=gen, dtype=torch.int64)
    return s, t, labels


def per_token_kd(cfg, s, t):
    T = cfg["temperature"]
    k = cfg["top_k"]
    rev = cfg["kd"] == "reverse"
    if k == 0:
        if cfg["kd"] == "forward" and cfg["t2"]:
            from modelopt.torch.distill.losses import LogitsDistillationLoss
            return LogitsDistillationLoss(temperature=T, reduction="none")(s, t)
        p = F.log_softmax(s / T, dim=-1)
        q = F.log_softmax(t / T, dim=-1)
        if rev:
            p, q = q, p
        kd = F.kl_div(p, q, reduction="none", log_target=True).sum(-1)
    else:
        vals, idx = torch.topk(t, k, dim=-1)
        norm = cfg["topk_norm"]
        if norm == "renorm":
            p = F.log_softmax(s.gather(-1, idx) / T, dim=-1)
            q = F.log_softmax(vals / T, dim=-1)
        elif norm == "student_full":
            assert not rev
            p = F.log_softmax(s / T, dim=-1).gather(-1, idx)
            q = F.log_softmax(vals / T, dim=-1)
        elif norm == "ghost":
            q = vals / T - torch.logsumexp(t / T, dim=-1, keepdim=True)
            p = s.gather(-1, idx) / T - torch.logsumexp(s / T, dim=-1, keepdim=True)
            p_kept = torch.logsumexp(p, dim=-1, keepdim=True).clamp(max=-EPS32)
            q_kept = torch.logsumexp(q, dim=-1, keepdim=True).clamp(max=-EPS32)
            p = torch.cat([p, torch.log(-torch.expm1(p_kept))], dim=-1)
            q = torch.cat([q, torch.log(-torch.expm1(q_kept))], dim=-1)
        else:
            raise ValueError(norm)
        if rev:
            p, q = q, p
        kd = (q.exp() * (q - p)).sum(-1)
    if cfg["t2"]:
        kd = kd * T * T
    return kd


def reference(cfg, s0, t, labels, weights):
    s = s0.clone().requires_grad_(True)
    n = s.shape[0]
    w = torch.ones(n, dtype=torch.float64) if weights is None else weights.clone()
    if labels is not None:
        w = w * (labels != -100).double()
    denom = w.sum().item()
    if denom == 0:
        denom = 1.0
    kd = torch.zeros((), dtype=torch.float64)
    lm = torch.zeros((), dtype=torch.float64)
    if cfg["kd"] != "none":
        kd = (w * per_token_kd(cfg, s, t)).sum() / denom
    if labels is not None:
        ce = F.cross_entropy(s, labels, reduction="none", ignore_index=-100)
        lm = (w * ce).sum() / denom
    lm_coef = 1.0 if cfg["lm_loss"] else 0.0
    if cfg["kd"] == "none":
        kd_coef = 0.0
    else:
        kd_coef = cfg["kd_loss_scale"] if cfg["lm_loss"] else 1.0
        if cfg["dynamic"] and kd.item() > 0 and lm.item() > 0:
            kd_coef = kd_coef * (lm.item() / kd.item())  # Megatron balancer: kd * sg(lm / kd)
    total = lm_coef * lm + kd_coef * kd
    total.backward()
    return total.item(), kd.item(), lm.item(), s.grad.detach(), kd_coef


def base_cfg(**kw):
    cfg = {"kd": "forward", "temperature": 1.0, "t2": True, "top_k": 0, "topk_norm": "renorm",
           "lm_loss": False, "kd_loss_scale": 1.0, "dynamic": False, "labels": False, "weights": False}
    cfg.update(kw)
    return cfg


def main():
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1234)
    blob = Blob()
    doc = {"generator": "tests/golden/gen_distill_golden.py", "torch": torch.__version__, "arrays": blob.arrays}

    # ---------------- inputs ----------------
    data = {}
    for name, (n, v, big) in {"small": (12, 50, 5), "large": (8, 1000, 2)}.items():
        s, t, labels = make_inputs(gen, n, v, big)
        labels[[1, 6]] = -100
        if name == "small":
            labels[9] = -100
            weights = torch.ones(n, dtype=torch.float64)
            weights[[2, 10]] = 0.0
            weights[4] = 0.5
            weights[7] = 0.25
        else:
            weights = torch.ones(n, dtype=torch.float64)
            weights[3] = 0.0
            weights[5] = 0.5
        data[name] = (s, t, labels, weights)
        blob.add(f"{name}.student", s.numpy(), "f32")
        blob.add(f"{name}.teacher", t.numpy(), "f32")
        blob.add(f"{name}.labels", labels.numpy(), "i32")
        blob.add(f"{name}.weights", weights.numpy(), "f32")

    cases = [
        ("fwd_T1_plain", "small", base_cfg()),
        ("fwd_T1_mask", "small", base_cfg(labels=True, weights=True)),
        ("fwd_T2_t2", "small", base_cfg(temperature=2.0, labels=True, weights=True)),
        ("fwd_T2_no_t2", "small", base_cfg(temperature=2.0, t2=False, labels=True)),
        ("rev_T1", "small", base_cfg(kd="reverse", labels=True)),
        ("rev_T2_t2", "small", base_cfg(kd="reverse", temperature=2.0, weights=True)),
        ("topk_renorm_T1", "small", base_cfg(top_k=5, labels=True)),
        ("topk_renorm_T2_rev", "small", base_cfg(top_k=5, kd="reverse", temperature=2.0, weights=True)),
        ("topk_full_T1", "small", base_cfg(top_k=5, topk_norm="student_full", labels=True)),
        ("topk_full_T2", "small", base_cfg(top_k=5, topk_norm="student_full", temperature=2.0, weights=True)),
        ("topk_ghost_T1", "small", base_cfg(top_k=5, topk_norm="ghost", labels=True)),
        ("topk_ghost_T2_rev", "small", base_cfg(top_k=5, topk_norm="ghost", kd="reverse", temperature=2.0,
                                               labels=True, weights=True)),
        ("ce_only", "small", base_cfg(kd="none", lm_loss=True, labels=True)),
        ("ce_weights", "small", base_cfg(kd="none", lm_loss=True, labels=True, weights=True)),
        ("lm_plus_kd", "small", base_cfg(temperature=2.0, lm_loss=True, kd_loss_scale=0.5, labels=True,
                                        weights=True)),
        ("lm_plus_kd_dynamic", "small", base_cfg(lm_loss=True, kd_loss_scale=0.5, dynamic=True, labels=True)),
        ("kd_logs_lm", "small", base_cfg(labels=True)),
        ("large_fwd_T1", "large", base_cfg(labels=True)),
        ("large_rev_T2", "large", base_cfg(kd="reverse", temperature=2.0, weights=True)),
        ("large_topk_lm", "large", base_cfg(top_k=5, lm_loss=True, labels=True, weights=True)),
        ("large_ghost_T2", "large", base_cfg(top_k=5, topk_norm="ghost", temperature=2.0, labels=True)),
    ]
    out_cases = []
    for name, which, cfg in cases:
        s, t, labels, weights = data[which]
        total, kd, lm, grad, kd_coef = reference(cfg, s, t, labels if cfg["labels"] else None,
                                                 weights if cfg["weights"] else None)
        c = dict(cfg)
        c.update({"name": name, "data": which, "loss": total, "kd_mean": kd, "lm_mean": lm, "kd_coef": kd_coef,
                  "grad": blob.add(f"grad.{name}", grad.numpy(), "f64")})
        out_cases.append(c)
    doc["distill_cases"] = out_cases

    # ---------------- teacher top-k extraction (torch.topk, descending) ----------------
    s, t, _, _ = data["small"]
    vals, idx = torch.topk(t.float(), 5, dim=-1)
    blob.add("topk.vals", vals.numpy(), "f32")
    blob.add("topk.idx", idx.numpy(), "i32")
    blob.add("topk.lse_T2", torch.logsumexp(t / 2.0, dim=-1).numpy(), "f64")

    # ---------------- AdamW trajectories (torch fp32, CPU) ----------------
    adam = []
    for tag, hp in (("default", dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)),
                    ("low_beta", dict(lr=3e-3, betas=(0.3, 0.95), eps=1e-6, weight_decay=0.1))):
        g = torch.Generator().manual_seed(99)
        p0 = (torch.randn(37, generator=g) * 0.5).float()
        p1 = (torch.randn(5, generator=g) * 0.5).float()
        a = torch.nn.Parameter(p0.clone())
        b = torch.nn.Parameter(p1.clone())
        opt = torch.optim.AdamW([{"params": [a]}, {"params": [b], "weight_decay": 0.0}], **hp)
        lrs = [hp["lr"], 0.8 * hp["lr"], 0.5 * hp["lr"], 2.0 * hp["lr"], 0.1 * hp["lr"]]
        blob.add(f"adam.{tag}.p0", p0.numpy(), "f32")
        blob.add(f"adam.{tag}.p1", p1.numpy(), "f32")
        steps = []
        for k, lr in enumerate(lrs):
            scale = [1e-3, 1.0, 0.05, 10.0, 0.2][k]
            ga = (torch.randn(37, generator=g) * scale).float()
            gb = (torch.randn(5, generator=g) * scale).float()
            a.grad = ga.clone()
            b.grad = None if k == 2 else gb.clone()  # a param without a grad is skipped (its step stays)
            for grp in opt.param_groups:
                grp["lr"] = lr
            opt.step()
            blob.add(f"adam.{tag}.g0.{k}", ga.numpy(), "f32")
            blob.add(f"adam.{tag}.g1.{k}", gb.numpy(), "f32")
            blob.add(f"adam.{tag}.p0.{k}", a.detach().numpy(), "f32")
            blob.add(f"adam.{tag}.p1.{k}", b.detach().numpy(), "f32")
            blob.add(f"adam.{tag}.m0.{k}", opt.state[a]["exp_avg"].numpy(), "f32")
            blob.add(f"adam.{tag}.v0.{k}", opt.state[a]["exp_avg_sq"].numpy(), "f32")
            blob.add(f"adam.{tag}.m1.{k}", opt.state[b]["exp_avg"].numpy(), "f32")
            blob.add(f"adam.{tag}.v1.{k}", opt.state[b]["exp_avg_sq"].numpy(), "f32")
            steps.append({"lr": lr, "skip1": k == 2, "step0": int(opt.state[a]["step"].item()),
                          "step1": int(opt.state[b]["step"].item())})
        adam.append({"tag": tag, "lr": hp["lr"], "beta1": hp["betas"][0], "beta2": hp["betas"][1], "eps": hp["eps"],
                     "weight_decay0": hp["weight_decay"], "weight_decay1": 0.0, "steps": steps})
    doc["adamw"] = adam

    # ---------------- clip_grad_norm_ ----------------
    g = torch.Generator().manual_seed(7)
    clips = []
    for k, max_norm in enumerate((1.0, 1000.0, 0.37)):
        ga = (torch.randn(37, generator=g) * 2.0).float()
        gb = (torch.randn(5, generator=g) * 3.0).float()
        blob.add(f"clip.{k}.g0", ga.numpy(), "f32")
        blob.add(f"clip.{k}.g1", gb.numpy(), "f32")
        pa = torch.nn.Parameter(torch.zeros(37))
        pb = torch.nn.Parameter(torch.zeros(5))
        pa.grad, pb.grad = ga.clone(), gb.clone()
        tn = torch.nn.utils.clip_grad_norm_([pa, pb], max_norm)
        exact = math.sqrt(float((ga.double() ** 2).sum() + (gb.double() ** 2).sum()))
        blob.add(f"clip.{k}.out0", pa.grad.numpy(), "f32")
        blob.add(f"clip.{k}.out1", pb.grad.numpy(), "f32")
        clips.append({"max_norm": max_norm, "total_norm_torch_f32": float(tn.item()), "total_norm_exact": exact})
    doc["clip"] = clips

    # ---------------- LR schedule (transformers) ----------------
    from transformers.optimization import get_cosine_with_min_lr_schedule_with_warmup
    sched = []
    for lr, min_lr, warm, total in ((1e-3, 1e-4, 3, 12), (1e-5, 5e-6, 0, 7), (2e-4, 0.0, 5, 5 + 9)):
        p = torch.nn.Parameter(torch.zeros(1))
        opt = torch.optim.AdamW([p], lr=lr)
        sch = get_cosine_with_min_lr_schedule_with_warmup(opt, warm, total, min_lr=min_lr)
        vals = []
        for _ in range(total + 1):
            vals.append(opt.param_groups[0]["lr"])
            opt.step()
            sch.step()
        sched.append({"lr": lr, "min_lr": min_lr, "warmup": warm, "total": total, "values": vals})
    doc["schedule"] = sched

    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "distill_golden.bin"), "wb") as f:
        f.write(bytes(blob.buf))
    with open(os.path.join(OUT, "distill_golden.json"), "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print("wrote", len(blob.buf), "bytes of arrays,", len(out_cases), "loss cases")


if __name__ == "__main__":
    main()
