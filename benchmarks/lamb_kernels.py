"""LAMB's Triton kernel in each configuration against torch's fused AdamW on a shipped config's parameters (random
gradients, `found_inf` set as the loop sets it): lamb_triton's two-pass schedule (the default: 1024 x 4) and its
pipelined one, each at a few block sizes and warps, the pipelined one at a few group and item sizes. Per
configuration: device ms per step with the host ahead (the device sleeps while the host queues the steps, as in
training, where the forward and backward keep the device busy while the host queues the optimizer), wall ms
(medians of rounds alternated with fused AdamW's), and its weights after 3 steps from the same start against the
default's and, pipelined, against the two-pass kernel's at the same block and warps (bitwise). On a CPU Triton's
interpreter runs the kernels (tested, a tiny shape): its times mean nothing.

    python benchmarks/lamb_kernels.py --config bert_base --results OUT.jsonl
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import sys
import traceback

import torch
from gpu_checks import relative_difference
from model_step import synchronize, time_alternating

DEFAULT = dict(schedule="two_pass", block=1024, warps=4)


def pipelined(block: int, warps: int, group_mb: int, items: int) -> dict:
    """A pipelined configuration: block x warps, group size in MB, blocks an item."""
    return dict(schedule="pipelined", block=block, warps=warps, group_mb=group_mb, items=items)


# most telling first (a command cut short keeps the rows before): each pipelined row after the two-pass row at its
# block and warps, which its weights are compared with bitwise
# (H200, 2026-11-26: two-pass 1024 x 4 1.18x fused AdamW's device time, 4096 x 8 1.49x, pipelined 2048 x 8 1.26x)
CONFIGS = [DEFAULT, pipelined(1024, 4, 8, 4), dict(schedule="two_pass", block=512, warps=4), pipelined(512, 4, 8, 4),
           dict(schedule="two_pass", block=1024, warps=2), dict(schedule="two_pass", block=2048, warps=4),
           dict(schedule="two_pass", block=512, warps=2), dict(schedule="two_pass", block=4096, warps=8)]
QUICK_CONFIGS = [DEFAULT, pipelined(1024, 4, 1, 2)]
SLEEP_CYCLES = 400_000_000  # the device's head start: 0.2-0.3 s at 1.4-2 GHz, against ~40 ms of queuing


def label(config: dict) -> str:
    name = f"{config['schedule']} {config['block']}x{config['warps']}"
    if config["schedule"] != "pipelined":
        return name
    return f"{name}, {config['group_mb']} MB groups, {config['items']} block{'s' * (config['items'] > 1)} an item"


@contextlib.contextmanager
def configured(config: dict):
    """lamb_triton's schedule, block, warps, group size and blocks an item set to `config` (restored after)."""
    from bertrain.train import lamb_triton

    names = ("SCHEDULE", "BLOCK", "NUM_WARPS", "GROUP_BYTES", "ITEM_BLOCKS")
    saved = [getattr(lamb_triton, name) for name in names]
    grouped = config["schedule"] == "pipelined"
    values = (config["schedule"], config["block"], config["warps"],
              config["group_mb"] * 2**20 if grouped else saved[3], config["items"] if grouped else saved[4])
    for name, value in zip(names, values):
        setattr(lamb_triton, name, value)
    try:
        yield
    finally:
        for name, value in zip(names, saved):
            setattr(lamb_triton, name, value)


def weights_after(start: list[torch.Tensor], grads: list[list[torch.Tensor]], config: dict) -> list[torch.Tensor]:
    """The weights after one LAMB step per gradient list from `start`, under `config`."""
    from bertrain.train.lamb import Lamb

    params = [w.clone().requires_grad_() for w in start]
    optimizer = Lamb(params, lr=1e-2, weight_decay=0.01)
    with configured(config):
        for step_grads in grads:
            for param, grad in zip(params, step_grads):
                param.grad = grad.clone()
            optimizer.step()
    return [p.detach() for p in params]


def device_ms(step, device: torch.device, steps: int) -> tuple[float, bool]:
    """Device ms per step with the host ahead, and whether it was (else the figure is the host's pace). On a
    CPU: wall ms."""
    synchronize(device)
    if device.type != "cuda":
        return 1e3 * time_alternating({"step": step}, 1, steps, device)["step"], True
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(SLEEP_CYCLES)
    start.record()
    for _ in range(steps):
        step()
    end.record()
    ahead = not start.query()  # the device still asleep once every step was queued
    end.synchronize()
    return start.elapsed_time(end) / steps, ahead


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="bert_base", help="The shipped config whose parameters are updated.")
    parser.add_argument("--vocab-size", type=int, default=30522)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--quick", action="store_true",
                        help="Two configurations, one timed step, the config's model at width 32 (CPU tests).")
    parser.add_argument("--steps", type=int, default=20, help="Steps per device-time figure.")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--results", default=None, help="Append each row as a JSON line to this file.")
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cpu":
        if importlib.util.find_spec("triton") is None:  # the CPU test's machine may lack it; a GPU's torch has it
            print("Triton is not installed: no LAMB kernel configuration to time on the CPU.")
            return
        os.environ["TRITON_INTERPRET"] = "1"  # read when Triton is first imported (by lamb_triton, below)
    from bertrain.config import load_config
    from bertrain.model import build_model
    from bertrain.train import lamb_triton
    from bertrain.train.lamb import Lamb, own_kernel

    configs, steps = (QUICK_CONFIGS, 1) if args.quick else (CONFIGS, args.steps)
    # --quick: Triton's interpreter takes ~3 s a LAMB step on tiny_albert's 0.3M parameters; the same tensors at
    # width 32 run the same code paths in a fraction of that
    narrow = ["model.hidden_size=32", "model.intermediate_size=64", "model.embedding_size=16",
              "model.num_attention_heads=2"] if args.quick else []
    overrides = [f"model.vocab_size={args.vocab_size}"] + narrow
    model = build_model(load_config(args.config, overrides).model).to(device)
    params = list(model.parameters())
    if own_kernel(params) is not lamb_triton:
        sys.exit(f"LAMB's Triton kernel does not run on {device} here (Triton missing or the kernel did not build)")
    generator = torch.Generator(device).manual_seed(0)
    grads = [[torch.randn(p.shape, generator=generator, device=device) * 1e-3 for p in params] for _ in range(3)]
    start = [p.detach().clone() for p in params]
    for param, grad in zip(params, grads[0]):
        param.grad = grad
    found_inf = torch.zeros((), device=device)
    adamw, lamb = torch.optim.AdamW(params, lr=1e-4, fused=True), Lamb(params, lr=1e-4, weight_decay=0.01)
    adamw.found_inf = lamb.found_inf = found_inf
    print(f"{args.config}: {sum(p.numel() for p in params) / 1e6:.1f}M parameters on {device}; device ms: host "
          f"ahead, {steps} steps; wall ms: medians of rounds alternated with fused AdamW's")
    print(f"{'configuration':<52} {'device ms':>9} {'/ AdamW':>8} {'wall ms':>8} {'/ AdamW':>8}  weights")
    weights = {}

    def measure(config: dict, name: str) -> dict:
        """The configuration's row: its weights against the default's, then its device and wall times."""
        with configured(config):
            if own_kernel(params) is not lamb_triton:  # it warned; LAMB would time its torch ops under this name
                return dict(config, config=name, error="did not build")
        weights[name] = weights_after(start, grads, config)

        def step():
            with configured(config):
                lamb.step()
        walls = time_alternating({"adamw": adamw.step, name: step}, 1 if args.quick else args.rounds,
                                 1 if args.quick else args.repeats, device)
        (adamw_ms, adamw_ahead), (ms, ahead) = (device_ms(f, device, steps) for f in (adamw.step, step))
        row = dict(config, config=name, device_ms=ms, adamw_device_ms=adamw_ms, device_ratio=ms / adamw_ms,
                   wall_ms=1e3 * walls[name], adamw_wall_ms=1e3 * walls["adamw"],
                   wall_ratio=walls[name] / walls["adamw"], host_ahead=ahead and adamw_ahead)
        if label(DEFAULT) in weights:
            row["vs_default"] = relative_difference(weights[name], weights[label(DEFAULT)], start)
        two_pass = label(dict(config, schedule="two_pass"))
        if config["schedule"] == "pipelined" and two_pass in weights:
            row["same_as_two_pass"] = all(torch.equal(a, b) for a, b in zip(weights[name], weights[two_pass]))
        return row

    for config in configs:  # each row written when measured: a configuration that hangs costs only the ones after
        name = label(config)
        try:
            row = measure(config, name)
        except Exception as error:  # noqa: BLE001 - one configuration's failure is its row's, not the others'
            traceback.print_exc()
            row = dict(config, config=name, error=f"failed: {type(error).__name__}: {error}"[:200])
        if "error" in row:
            print(f"{name:<52} {row['error']}", flush=True)
        else:
            same = {True: ", bitwise = two-pass", False: ", differ from two-pass"}.get(row.get("same_as_two_pass"), "")
            print(f"{name:<52} {row['device_ms']:>9.3f} {row['device_ratio']:>7.2f}x {row['wall_ms']:>8.3f} "
                  f"{row['wall_ratio']:>7.2f}x  {row.get('vs_default', float('nan')):.1e} of the default's change{same}"
                  + ("" if row["host_ahead"] else "  (host-bound: the device caught up)"), flush=True)
        write(args.results, dict(row, parameters_of=args.config))


def write(results: str | None, row: dict) -> None:
    """Append the row to the results file as a JSON line (none without --results)."""
    if results:
        with open(results, "a") as handle:
            handle.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
