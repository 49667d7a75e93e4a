"""Where one training step's time goes: torch.profiler over bertrain's step (forward, backward, fused AdamW; bf16
autocast on a GPU) at one of gpu_step.py's shapes, the ops' self device time grouped into GEMMs, attention,
normalization, dropout, activation, loss, casts and copies, optimizer and the rest, then the top ops. For finding
what keeps a shape from its MFU target (issue 25); `--device cpu` runs a tiny shape in fp32 (tested). `--compile`:
the layers as train.compile compiles them; inductor's Triton kernels are counted by name (no aten op launches them),
each in the group of the first op its name lists, in the order of GROUPS.

    python benchmarks/gpu_profile.py --shape bert-large --seq 128
    python benchmarks/gpu_profile.py --shape bert-large --seq 128 --compile
    python benchmarks/gpu_profile.py --device cpu --shape tiny --seq 64 --batch 4
"""

from __future__ import annotations

import argparse
import json
import re

import torch
from gpu_step import SHAPES, model_config
from model_step import make_batch, step_fn, synchronize
from trace_gaps import profiler_gaps

from bertrain.model import build_model, compile_layers

GROUPS = [  # (group, pattern of aten op names): the first match wins
    ("GEMM", r"\b(mm|addmm|bmm|baddbmm|matmul|linear|_addmm_activation)\b"),
    ("attention", r"attention|sdpa|flash|efficient"),
    ("normalization", r"layer_norm"),
    ("dropout", r"dropout|bernoulli"),
    ("activation", r"gelu|tanh|relu"),
    ("loss", r"cross_entropy|log_softmax|nll_loss|_softmax"),
    ("optimizer", r"adam|_foreach"),
    ("casts and copies", r"copy_|_to_copy|\bto\b|clone|contiguous|cat|index|gather|scatter|embedding"),
]


def group_of(name: str) -> str:
    return next((group for group, pattern in GROUPS if re.search(pattern, name)), "other")


def profile_step(shape: str, seq: int, batch_size: int, steps: int, device: torch.device, dtype,
                 compile_options: dict | None = None) -> tuple[dict, dict | None]:
    """Self time per op over `steps` profiled steps (after 3 warm-up steps, the first compiling the layers where
    `compile_options` is given), in microseconds; and on a GPU where the device waited (trace_gaps.py)."""
    config = model_config(shape, seq)
    torch.manual_seed(0)
    model = build_model(config).to(device).train()
    if compile_options is not None:
        compile_layers(model, **compile_options)
    batch = {k: v.to(device) for k, v in make_batch(config, batch_size, torch.Generator().manual_seed(0), seq).items()}
    step = step_fn(model, batch, False, config.type, dtype, device)
    for _ in range(3):
        step()
    synchronize(device)
    with device_profiler(device) as profiler:
        for _ in range(steps):
            step()
        synchronize(device)
    return self_times(profiler, device, steps), profiler_gaps(profiler, steps) if device.type == "cuda" else None


def device_profiler(device: torch.device) -> torch.profiler.profile:
    """A profiler of the host's ops and, on a GPU, their kernels."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    return torch.profiler.profile(activities=activities)


def self_times(profiler: torch.profiler.profile, device: torch.device, steps: int) -> dict:
    """Each aten op's self time per step in microseconds (device time on a GPU, host time on a CPU), and each of
    inductor's Triton kernels' (`triton_...`: compiled layers launch them from Python, outside any aten op)."""
    attribute = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    return {event.key: getattr(event, attribute) / steps for event in profiler.key_averages()
            if event.key.startswith(("aten::", "triton_")) and getattr(event, attribute) > 0}


def grouped(ops: dict) -> dict:
    """The ops' times added up by group_of."""
    groups: dict[str, float] = {}
    for name, time in ops.items():
        groups[group_of(name)] = groups.get(group_of(name), 0.0) + time
    return groups


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--shape", default="bert-large", choices=sorted(SHAPES))
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batch", type=int, default=None, help="Sequences per step (default: gpu_step.py's).")
    parser.add_argument("--steps", type=int, default=3, help="Profiled steps.")
    parser.add_argument("--top", type=int, default=20, help="Ops listed one by one.")
    parser.add_argument("--results", default=None, help="Append the grouped figures as a JSON line to this file.")
    parser.add_argument("--compile", action="store_true", help="Each encoder layer torch.compiled (train.compile).")
    parser.add_argument("--compile-backend", default=None, help="torch.compile backend (e.g. eager on a CPU).")
    args = parser.parse_args()
    device = torch.device(args.device)
    batch_size = args.batch or SHAPES[args.shape][2][args.seq]
    dtype = torch.bfloat16 if device.type == "cuda" else None
    compile_options = None  # eager
    if args.compile:  # as gpu_step.py --compile passes them
        compile_options = {"backend": args.compile_backend} if args.compile_backend else {}
    ops, gaps = profile_step(args.shape, args.seq, batch_size, args.steps, device, dtype, compile_options)
    total, groups = sum(ops.values()), grouped(ops)
    print(f"{args.shape} seq {args.seq} batch {batch_size} on {device} ({'bf16' if dtype else 'fp32'}"
          f"{', compiled layers' if args.compile else ''}): {total / 1e3:.2f} ms of op self time per step")
    print("| group | ms per step | share |\n|---|---|---|")
    for group, microseconds in sorted(groups.items(), key=lambda item: -item[1]):
        print(f"| {group} | {microseconds / 1e3:.3f} | {100 * microseconds / total:.1f}% |")
    if gaps and "error" not in gaps:
        print(f"device idle {gaps['idle_ms']:.2f} ms a step, {gaps['host_late_ms']:.2f} of it after the host's late "
              f"launches (trace_gaps.py)")
    print("\n| op | group | ms per step | share |\n|---|---|---|---|")
    for name, microseconds in sorted(ops.items(), key=lambda item: -item[1])[:args.top]:
        print(f"| {name} | {group_of(name)} | {microseconds / 1e3:.3f} | {100 * microseconds / total:.1f}% |")
    if args.results:
        with open(args.results, "a") as handle:
            handle.write(json.dumps(dict(shape=args.shape, seq=args.seq, batch=batch_size, device=str(device),
                                         compiled=args.compile, total_ms=total / 1e3,
                                         groups_ms={k: v / 1e3 for k, v in groups.items()},
                                         ops_ms={k: v / 1e3 for k, v in ops.items()}, gaps=gaps)) + "\n")


if __name__ == "__main__":
    main()
