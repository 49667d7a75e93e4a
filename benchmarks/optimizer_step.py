"""Time one optimizer step at bert-base size: bertrain's LAMB (its CPU kernel, lamb_native.c, and its torch-op
path, used on GPUs and where no C compiler exists) against torch's fused AdamW (the target is LAMB <= 2x
AdamW) and, with --per-parameter, against the per-parameter LAMB loop it replaced. Same
parameters (the real BERT-base list, two weight-decay groups), same gradients, runs alternated (order
reversed every round), medians of per-round ratios. Not part of the test suite.

    python benchmarks/optimizer_step.py                      # bert-base, 8 rounds
    python benchmarks/optimizer_step.py --threads 1 --per-parameter
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

from bertrain.config import load_config
from bertrain.model import build_model
from bertrain.train import lamb_native
from bertrain.train.lamb import Lamb
from bertrain.train.optim import lamb_groups, optimizer_groups, row_blocks_of
from bertrain.train.precision import cpu_flags

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, for tests/
from tests.reference_lamb import ReferenceLamb  # noqa: E402  (one copy of the old LAMB)


def bert_base_groups(config_name: str, weight_decay: float) -> tuple[list[dict], dict]:
    """(parameter groups with random gradients, LAMB's row blocks) of the config's model."""
    config = load_config(config_name, ["model.vocab_size=30522"])
    model = build_model(config.model)
    groups = lamb_groups(optimizer_groups(model, weight_decay))
    generator = torch.Generator().manual_seed(0)
    for group in groups:
        for param in group["params"]:
            param.grad = torch.randn(param.shape, generator=generator) * 1e-3
    return groups, row_blocks_of(model)


def cpu_name() -> str:
    """The CPU's model name and widest vector extension (figures depend on both)."""
    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.exists() else []
    model = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")),
                 platform.processor() or "unknown")
    flags = cpu_flags()
    widest = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2"
    return f"{model}, {widest}, {os.cpu_count()} cores"


def time_alternating(optimizers: dict, rounds: int) -> dict[str, list[float]]:
    """Seconds of each optimizer's step per round, runs alternated (order reversed every round)."""
    for optimizer in optimizers.values():  # warm up: state allocation, first-touch of memory
        optimizer.step()
    times: dict[str, list[float]] = {name: [] for name in optimizers}
    order = list(optimizers.items())
    for r in range(rounds):
        for name, optimizer in (order if r % 2 == 0 else order[::-1]):
            start = time.perf_counter()
            optimizer.step()
            times[name].append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="bert_base", help="Shipped config whose model is built.")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--per-parameter", action="store_true", help="Also time the per-parameter LAMB loop.")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    groups, blocks = bert_base_groups(args.config, weight_decay=0.01)
    count = sum(p.numel() for g in groups for p in g["params"])
    optimizers = {"fused AdamW": torch.optim.AdamW(groups, lr=1e-4, fused=True),
                  "LAMB": Lamb(groups, lr=1e-4, row_blocks=blocks),
                  "LAMB, torch ops": Lamb(groups, lr=1e-4, native=False, row_blocks=blocks)}
    if args.per_parameter:
        optimizers["per-parameter LAMB"] = ReferenceLamb(groups, lr=1e-4)
    load = os.getloadavg()[0]
    times = time_alternating(optimizers, args.rounds)
    print(f"torch {torch.__version__}, {args.config}: {count / 1e6:.1f}M parameters, threads "
          f"{torch.get_num_threads()}, load average {load:.2f} -> {os.getloadavg()[0]:.2f}, "
          f"medians of {args.rounds} alternated rounds")
    print(f"CPU: {cpu_name()}; LAMB kernel: {'lamb_native.c' if lamb_native.library() else 'none (torch ops)'}")
    print(f"{'optimizer':<20} {'ms/step':>9} {'x fused AdamW':>14}")
    for name, values in times.items():
        ratio = statistics.median(t / a for t, a in zip(values, times["fused AdamW"]))
        print(f"{name:<20} {statistics.median(values) * 1e3:>9.1f} {ratio:>13.2f}x")


if __name__ == "__main__":
    main()
