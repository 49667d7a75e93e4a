"""Host time of LAMB's GPU step (lamb.py + lamb_triton.py), measured on any machine: the kernels' launches
replaced by no-ops and the eligibility check passed, on one-row tensors as many as a shipped config has in its
two parameter groups. In the optimizer-alone benchmark the step is launch-bound when this nears its device time
(H200, bert_base: 1.34 ms of host time against ~1.4 ms of device time); in training the host runs ahead. Prints
ms per step for each schedule (medians of alternated rounds), and the eligibility check's own ms, which
this leaves out (of the gradients: the parameters and states are checked once, when Lamb plans their list).

    python benchmarks/lamb_host.py --config bert_base
"""

from __future__ import annotations

import argparse
import contextlib
import os
from unittest import mock

import torch
from model_step import time_alternating

from bertrain.config import load_config
from bertrain.model import build_model
from bertrain.train import lamb_triton
from bertrain.train.lamb import Lamb
from bertrain.train.optim import lamb_groups, optimizer_groups, row_blocks_of

KERNELS = ("_count_steps", "_moments_and_squares", "_trust_ratios", "_apply", "_pipelined")


class NoLaunch:
    """A Triton kernel whose launch does nothing: kernel[grid](...)."""

    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


def stand_in_groups(config: str) -> tuple[list[dict], dict]:
    """(the config's parameter groups, same counts and settings, each tensor a row of 4 with a gradient, or 3 rows
    where build_optimizer gives LAMB row blocks; those row blocks)."""
    model = build_model(load_config(config, ["model.vocab_size=30522"]).model)
    blocks = row_blocks_of(model)
    groups, stand_in_blocks = [], {}
    for group in lamb_groups(optimizer_groups(model, 0.01)):
        params = [torch.zeros(4 * blocks.get(p, 1), requires_grad=True) for p in group["params"]]
        for param, original in zip(params, group["params"]):
            param.grad = torch.zeros_like(param)
            if original in blocks:
                stand_in_blocks[param] = blocks[original]
        groups.append(dict({k: v for k, v in group.items() if k != "params"}, params=params))
    return groups, stand_in_blocks


def with_schedule(step, schedule: str):
    """`step` under lamb_triton's SCHEDULE `schedule`."""
    def run() -> None:
        lamb_triton.SCHEDULE = schedule
        step()
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="bert_base")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=40, help="Steps per round.")
    parser.add_argument("--no-row-blocks", action="store_true", help="The fused query/key/value as one tensor.")
    args = parser.parse_args()
    groups, blocks = stand_in_groups(args.config)
    tensors = [p.grad for g in groups for p in g["params"]]  # what the step checks
    with mock.patch.dict(os.environ, TRITON_INTERPRET="1"):  # the check then looks at every tensor, as on a GPU
        check_ms = 1e3 * time_alternating({"check": lambda: lamb_triton.eligible(tensors)}, args.rounds,
                                          args.steps)["check"] if lamb_triton.triton else None
    optimizer = Lamb(groups, lr=1e-3, row_blocks=None if args.no_row_blocks else blocks)
    optimizer.found_inf = torch.zeros(())
    print(f"{args.config}: {sum(len(g['params']) for g in groups)} tensors in {len(groups)} groups; host ms per "
          f"LAMB step, kernels not launched")
    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.object(lamb_triton, "eligible", lambda tensors: True))
        stack.enter_context(mock.patch.object(lamb_triton, "builds", lambda device: True))
        for name in KERNELS:  # those of this commit (an older one lacks some)
            if hasattr(lamb_triton, name):
                stack.enter_context(mock.patch.object(lamb_triton, name, NoLaunch()))
        stack.enter_context(mock.patch.object(lamb_triton, "SCHEDULE", lamb_triton.SCHEDULE))  # restored after
        medians = time_alternating({schedule: with_schedule(optimizer.step, schedule)
                                    for schedule in lamb_triton.SCHEDULES}, args.rounds, args.steps)
        for schedule, seconds in medians.items():
            print(f"  {schedule:<10} {1e3 * seconds:.3f} ms")
    print("  the eligibility check, left out above: " + (f"{check_ms:.3f} ms" if check_ms is not None else
                                                          "not timed (Triton is not installed)"))


if __name__ == "__main__":
    main()
