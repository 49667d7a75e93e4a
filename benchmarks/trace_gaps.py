"""Where a GPU waited, from a torch.profiler Chrome trace: the device's idle time between its kernels and copies, split
into gaps the host left (the next kernel's launch began only after the device had run out of work: the host was late,
the step host-bound there) and gaps where the kernel was already queued (a sync, a stream wait, a copy), and the host
ops that launched late, ranked by the idle time before their kernels. gpu_pretrain.py --profile (the loops) and
gpu_profile.py (the bare steps) record it on a GPU; the suite's report prints it in part 7.

    python benchmarks/trace_gaps.py TRACE.json[.gz] [--steps 3]
"""

from __future__ import annotations

import argparse
import bisect
import collections
import gzip
import json
from pathlib import Path

DEVICE = {"kernel", "gpu_memcpy", "gpu_memset"}  # what runs on the device
LAUNCH = {"cuda_runtime", "cuda_driver"}          # the host calls that queue it (Triton launches through the driver)
HOST_OPS = {"cpu_op", "user_annotation"}          # what the host was doing when it launched


def load_events(path: str | Path) -> list[dict]:
    """The trace's complete ("X") events, from a plain or gzipped Chrome trace (by its first bytes: gpu_pretrain.py's
    --trace gzips whatever the name)."""
    with open(path, "rb") as handle:
        zipped = handle.read(2) == b"\x1f\x8b"
    with (gzip.open if zipped else open)(path, "rt") as handle:
        trace = json.load(handle)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    return [e for e in events if e.get("ph") == "X" and "ts" in e]


def outermost_ops(events: list[dict]) -> dict:
    """Per host thread, its outermost ops as sorted (starts, ends, names)."""
    threads = collections.defaultdict(list)
    for e in events:
        if e.get("cat") in HOST_OPS:
            threads[(e.get("pid"), e.get("tid"))].append((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)),
                                                          e["name"]))
    out = {}
    for thread, ops in threads.items():
        starts, ends, names = [], [], []
        for start, end, name in sorted(ops, key=lambda op: (op[0], -op[1])):  # an enclosing op before its children
            if not ends or start >= ends[-1]:
                starts.append(start)
                ends.append(end)
                names.append(name)
        out[thread] = (starts, ends, names)
    return out


def device_gaps(events: list[dict], steps: int = 1, min_gap_us: float = 2.0, top: int = 10) -> dict | None:
    """The device's busy and idle time (ms a step) over the trace's kernels, the idle split into host-late gaps,
    queued gaps and gaps under `min_gap_us`, the outermost host ops whose launches came late, and how far ahead the
    host launched the kernels (the median and the 10th percentile of launch-to-start, ms). None: no kernel."""
    work = sorted((e for e in events if e.get("cat") in DEVICE), key=lambda e: float(e["ts"]))
    if not work:
        return None
    launches = {e["args"]["correlation"]: e for e in events
                if e.get("cat") in LAUNCH and "correlation" in e.get("args", {})}
    ops = outermost_ops(events)
    busy = host_late = queued = short = 0.0
    late_by_op: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0])
    leads = []  # how long before its start each kernel was launched: how far the host ran ahead
    end = float(work[0]["ts"])
    for e in work:
        start, finish = float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))
        launch = launches.get(e.get("args", {}).get("correlation"))
        if launch is not None:
            leads.append(start - float(launch["ts"]))
        if start > end:  # the device had nothing running from `end` to `start`
            idle = start - end
            if idle < min_gap_us:
                short += idle
            elif launch is not None and float(launch["ts"]) >= end:
                host_late += idle
                record = late_by_op[enclosing_op(ops, launch)]
                record[0] += idle
                record[1] += 1
            else:
                queued += idle
        busy += max(finish - max(start, end), 0.0)
        end = max(end, finish)
    span = end - float(work[0]["ts"])
    per_step = 1e-3 / steps  # microseconds over the trace -> ms a step
    ranked = sorted(late_by_op.items(), key=lambda item: -item[1][0])[:top]
    leads.sort()
    lead = {f"lead_p{p}_ms": leads[len(leads) * p // 100] * 1e-3 for p in (10, 50)} if leads else {}
    return dict(steps=steps, span_ms=span * per_step, busy_ms=busy * per_step,
                idle_ms=(span - busy) * per_step, host_late_ms=host_late * per_step, queued_ms=queued * per_step,
                short_ms=short * per_step, min_gap_us=min_gap_us, **lead,
                late_ops=[dict(op=name, ms=idle * per_step, gaps=count / steps) for name, (idle, count) in ranked])


def profiler_gaps(profiler, steps: int, trace: str | None = None) -> dict:
    """device_gaps over a stopped torch.profiler's steps, from its Chrome trace (`trace` where already written; else
    exported to a scratch file); a trace it cannot read gives {"error": why}, not an exception."""
    import tempfile

    try:
        with tempfile.TemporaryDirectory() as scratch:
            path = trace or str(Path(scratch) / "trace.json")
            if not trace:
                profiler.export_chrome_trace(path)
            return device_gaps(load_events(path), steps)
    except Exception as error:  # the caller's other figures must survive it
        return dict(error=f"{type(error).__name__}: {error}")


def enclosing_op(ops: dict, launch: dict) -> str:
    """The outermost host op on the launching thread that holds the launch call (its name), or '(no op)'."""
    starts, ends, names = ops.get((launch.get("pid"), launch.get("tid")), ([], [], []))
    at = float(launch["ts"])
    index = bisect.bisect_right(starts, at) - 1
    return names[index] if index >= 0 and at <= ends[index] else "(no op)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trace", help="A torch.profiler Chrome trace (gpu_pretrain.py --trace writes one).")
    parser.add_argument("--steps", type=int, default=1, help="Steps the trace holds (figures are per step).")
    parser.add_argument("--min-gap-us", type=float, default=2.0, help="Shorter gaps are counted apart.")
    args = parser.parse_args()
    gaps = device_gaps(load_events(args.trace), args.steps, args.min_gap_us)
    if gaps is None:
        print("No device kernels in this trace (a CPU run, or the profiler did not record CUDA).")
        return
    print(f"ms a step over {args.steps} step(s): device busy {gaps['busy_ms']:.2f} of {gaps['span_ms']:.2f}; idle "
          f"{gaps['idle_ms']:.2f}: host late {gaps['host_late_ms']:.2f}, kernel queued but waiting "
          f"{gaps['queued_ms']:.2f}, gaps under {args.min_gap_us:g} us {gaps['short_ms']:.2f}")
    if "lead_p50_ms" in gaps:
        print(f"the host launched each kernel a median {gaps['lead_p50_ms']:.3f} ms before it started (10th "
              f"percentile {gaps['lead_p10_ms']:.3f} ms)")
    for row in gaps["late_ops"]:
        print(f"  {row['ms']:7.3f} ms  {row['gaps']:6.1f} gaps  {row['op']}")


if __name__ == "__main__":
    main()
