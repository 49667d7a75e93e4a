"""The per-parameter LAMB bertrain shipped until bertrain/train/lamb.py: the reference for tests/test_lamb.py
and the slow baseline of benchmarks/optimizer_step.py --per-parameter."""

from __future__ import annotations

import torch


class ReferenceLamb(torch.optim.Optimizer):
    """The per-parameter LAMB bertrain shipped until lamb.py (bertrain/train/optim.py), kept verbatim as
    the independent reference: once optim.py uses lamb.py, importing it from there would compare the
    new code with itself."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0):
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for param in group["params"]:
                if param.grad is None:
                    continue
                grad = param.grad.float()
                state = self.state[param]
                if not state:
                    state["step"] = torch.tensor(0.0)
                    state["exp_avg"] = torch.zeros_like(param, dtype=torch.float32)
                    state["exp_avg_sq"] = torch.zeros_like(param, dtype=torch.float32)
                state["step"] += 1
                step = state["step"].item()
                exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
                exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
                exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                m_hat = exp_avg / (1 - beta1 ** step)
                v_hat = exp_avg_sq / (1 - beta2 ** step)
                update = m_hat / (v_hat.sqrt() + group["eps"])
                if group["weight_decay"]:
                    update.add_(param.float(), alpha=group["weight_decay"])
                weight_norm = param.float().norm()
                update_norm = update.norm()
                trust_ratio = torch.where((weight_norm > 0) & (update_norm > 0),
                                          weight_norm / update_norm, torch.ones_like(weight_norm))
                if not group.get("layer_adaptation", True):  # Google's exclude_from_layer_adaptation (added since)
                    trust_ratio = torch.ones_like(weight_norm)
                param.add_((update * trust_ratio).to(param.dtype), alpha=-group["lr"])
