"""Where the eager step's device waits for its host, measured without a profiler: at points of each step (its start,
each encoder layer's forward and backward, the forward's, backward's and optimizer's ends) the host's time when it
got there and the device's time when it had run everything queued before it (a CUDA event), so the host's lead there:
near 0, the device has caught up and waits for the host's next launch. The profiler's own host work makes the host
late where it is not (CUPTI stays attached, pytorch#144455), so gpu_suite's part 7 cannot tell how much of the
bert-large step's 4.3 ms between its ops' device time and its step time is the device waiting for the host; this
tells where the host's lead runs out. Steps run as gpu_step.py times them (`--repeats` after a sync), our model only;
the first step of each run starts from an idle device and is left out. The marks' own host time is shown as the
marked steps' time against unmarked ones, alternated. On a CPU every op has finished when it returns: the lead is 0
(a tiny shape runs in the tests).

    python benchmarks/gpu_host_lead.py                          # bert-large seq 128 x 128, bf16
    python benchmarks/gpu_host_lead.py --shape bert-base --seq 128
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from gpu_step import SHAPES, model_config
from model_step import make_batch, step_fn, synchronize

from bertrain.model import build_model
from bertrain.model.layers import EncoderLayer


class Marks:
    """Named points of the steps: the host's time at each, and an event the device runs when it gets there (CUDA)."""

    def __init__(self, device: torch.device):
        self.device, self.points, self.on = device, [], False

    def __call__(self, name: str) -> None:
        if not self.on:
            return
        event = None
        if self.device.type == "cuda":
            event = torch.cuda.Event(enable_timing=True)
            event.record()
        self.points.append((name, time.perf_counter(), event))

    def start(self) -> None:
        """Marking on, from a sync: the run's start, where the host and the device begin together."""
        synchronize(self.device)
        self.points, self.on = [], True
        self("run start")

    def finish(self) -> list[list[tuple[str, float, float]]]:
        """Marking off, then a sync: each step's points from its "step start" as (name, host ms, device ms) from the
        run's start; a step's last point, "step end", is the next step's start (the last step has none)."""
        self.on = False
        synchronize(self.device)
        _, host_zero, event_zero = self.points[0]
        timed = [(name, (host - host_zero) * 1e3, event_zero.elapsed_time(event) if event_zero else
                  (host - host_zero) * 1e3) for name, host, event in self.points[1:]]
        starts = [i for i, (name, _, _) in enumerate(timed) if name == "step start"] + [len(timed)]
        return [timed[a:b] + ([("step end", *timed[b][1:])] if b < len(timed) else [])
                for a, b in zip(starts, starts[1:])]

    def run(self, step, repeats: int) -> list[list[tuple[str, float, float]]]:
        """`repeats` marked steps after a sync (finish's steps)."""
        self.start()
        for _ in range(repeats):
            step()
        return self.finish()


def whole_steps(steps: list[list[tuple[str, float, float]]]) -> list[list[tuple[str, float, float]]]:
    """Marks.finish's steps that reached the next step's start ("step end"), the first of them left out (it starts
    from the device the sync left idle)."""
    return [s for s in steps if s and s[-1][0] == "step end"][1:]


def mark_layers(model, marks: Marks) -> list:
    """Marks after each encoder layer's forward and where the backward reaches its output; the hooks' handles (one
    a layer), to remove them for the unmarked steps."""
    handles = []
    for i, layer in enumerate((m for m in model.modules() if isinstance(m, EncoderLayer)), 1):
        def forward_done(module, inputs, output, i=i):
            marks(f"layer {i} forward")
            if output.requires_grad:
                output.register_hook(lambda grad: marks(f"layer {i} backward"))
        handles.append(layer.register_forward_hook(forward_done))
    return handles


def measure(args) -> dict:
    device = torch.device(args.device)
    config = model_config(args.shape, args.seq)
    batch_size = args.batch or SHAPES[args.shape][2][args.seq]
    torch.manual_seed(0)
    model = build_model(config).train().to(device)
    batch = {k: v.to(device) for k, v in make_batch(config, batch_size, torch.Generator().manual_seed(0),
                                                    args.seq).items()}
    dtype = None if args.dtype == "fp32" else torch.bfloat16
    marks = Marks(device)
    step = step_fn(model, batch, False, config.type, dtype, device, mark=marks)
    for _ in range(2):  # warm up: kernels picked, allocator filled, optimizer state made
        step()
    synchronize(device)
    steps, marked_s, plain_s = [], [], []
    for _ in range(args.rounds):  # marked and unmarked runs alternated; the unmarked without the layers' hooks
        handles = mark_layers(model, marks)
        started = time.perf_counter()
        steps += marks.run(step, args.repeats)[1:]
        marked_s.append((time.perf_counter() - started) / args.repeats)
        layers = len(handles)
        for handle in handles:
            handle.remove()
        synchronize(device)
        started = time.perf_counter()
        for _ in range(args.repeats):
            step()
        synchronize(device)
        plain_s.append((time.perf_counter() - started) / args.repeats)
    steps = [s[:-1] if s[-1][0] == "step end" else s for s in steps]  # the step's start to the optimizer's end
    return dict(shape=args.shape, seq=args.seq, batch=batch_size, layers=layers, dtype=args.dtype,
                device=torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU",
                steps_measured=len(steps), marked_step_ms=statistics.median(marked_s) * 1e3,
                plain_step_ms=statistics.median(plain_s) * 1e3, points=point_rows(steps))


def point_rows(steps: list[list[tuple[str, float, float]]]) -> list[dict]:
    """Per point of the steps (which all pass the same points): medians of the host's and the device's ms from the
    step's start, and of the host's lead there (from the run's start), and its lowest."""
    names = [name for name, _, _ in steps[0]]
    assert all([name for name, _, _ in s] == names for s in steps), "every step passes the same points"
    rows = []
    for i, name in enumerate(names):  # times from the step's start; the lead from the run's
        host, device_ms = (statistics.median(s[i][k] - s[0][k] for s in steps) for k in (1, 2))
        leads = sorted(s[i][2] - s[i][1] for s in steps)
        rows.append(dict(point=name, host_ms=host, device_ms=device_ms, lead_ms=statistics.median(leads),
                         lowest_lead_ms=leads[0]))
    return rows


def points_table(rows: list[dict], near_ms: float) -> list[str]:
    lines = ["| point | host ms from the step's start | device ms | host's lead ms (median) | lowest lead ms |",
             "|---|---|---|---|---|"]
    for row in rows:
        flag = " **device waits**" if row["lead_ms"] < near_ms else ""
        lines.append(f"| {row['point']} | {row['host_ms']:.3f} | {row['device_ms']:.3f} | {row['lead_ms']:.3f}{flag} "
                     f"| {row['lowest_lead_ms']:.3f} |")
    return lines


def report(result: dict, near_ms: float) -> str:
    return "\n".join([f"{result['device']}: {result['shape']} seq {result['seq']} batch {result['batch']} "
                      f"{result['dtype']}, {result['steps_measured']} steps: marked {result['marked_step_ms']:.2f} ms "
                      f"a step, unmarked {result['plain_step_ms']:.2f} ms"] + points_table(result["points"], near_ms))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--shape", choices=list(SHAPES), default="bert-large")
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batch", type=int, default=None, help="default: gpu_step.py's batch for the shape")
    parser.add_argument("--dtype", choices=("bf16", "fp32"), default=None, help="default: bf16 on a GPU, else fp32")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3, help="steps a run after a sync, as gpu_step.py times them")
    parser.add_argument("--near-ms", type=float, default=0.05, help="a lead under this is flagged: the device waits")
    parser.add_argument("--results", default=None, help="write the figures here as JSON")
    args = parser.parse_args(argv)
    args.dtype = args.dtype or ("bf16" if args.device.startswith("cuda") else "fp32")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    result = measure(args)
    print(report(result, args.near_ms))
    if args.results:
        with open(args.results, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
