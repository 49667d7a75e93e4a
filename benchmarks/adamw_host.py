"""Host time of an AdamW step, torch's AdamW(fused=True) against bertrain's FusedAdamW (train/adamw.py: the same
kernel, its lists kept between steps), on one-row tensors as many as a shipped config has in its two parameter
groups: the kernels' own time is small, the rest is what a host-bound GPU loop pays a step. Also the kernels
alone (adamw.fused_adamw on ready lists), the floor. Medians of alternated rounds.

    python benchmarks/adamw_host.py --config bert_large
"""

from __future__ import annotations

import argparse

import torch
from model_step import time_alternating

from bertrain.config import load_config
from bertrain.model import build_model
from bertrain.train.adamw import FusedAdamW, fused_adamw
from bertrain.train.optim import optimizer_groups


def stand_in_groups(config: str) -> list[dict]:
    """The config's parameter groups, same counts and settings, each tensor a row of 4 with a gradient."""
    model = build_model(load_config(config, ["model.vocab_size=30522"]).model)
    groups = []
    for group in optimizer_groups(model, 0.01):
        params = [torch.zeros(4, requires_grad=True) for _ in group["params"]]
        for param in params:
            param.grad = torch.zeros_like(param)
        groups.append(dict(group, params=params))
    return groups


def kernels_alone(optimizer: torch.optim.Optimizer):
    """The kernels FusedAdamW launches, on lists made beforehand."""
    lists = [(group, group["params"], [p.grad for p in group["params"]],
              *([optimizer.state[p][key] for p in group["params"]] for key in ("exp_avg", "exp_avg_sq", "step")))
             for group in optimizer.param_groups]

    def run() -> None:
        for group, params, grads, exp_avgs, exp_avg_sqs, steps in lists:
            torch._foreach_add_(steps, 1)
            fused_adamw(params, grads, exp_avgs, exp_avg_sqs, steps, group)
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="bert_large")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=100, help="Steps per round.")
    args = parser.parse_args()
    optimizers = {"torch's AdamW(fused=True)": torch.optim.AdamW(stand_in_groups(args.config), lr=1e-3, fused=True),
                  "FusedAdamW": FusedAdamW(stand_in_groups(args.config), lr=1e-3)}
    for optimizer in optimizers.values():
        optimizer.step()  # the states
    functions = {name: optimizer.step for name, optimizer in optimizers.items()}
    functions["the kernels alone"] = kernels_alone(optimizers["FusedAdamW"])
    medians = time_alternating(functions, args.rounds, args.steps)
    count = sum(len(group["params"]) for group in optimizers["FusedAdamW"].param_groups)
    print(f"{args.config}: {count} tensors in 2 groups; host ms per AdamW step")
    reference = medians["torch's AdamW(fused=True)"]
    for name, seconds in medians.items():
        print(f"  {name:<26} {1e3 * seconds:.3f} ms  {seconds / reference:.2f}x torch's")


if __name__ == "__main__":
    main()
