"""`bertrain pretrain` (the CLI, run in this process) with what metrics.jsonl does not record measured around
it: host time spent in TrainStream.next (waiting for a batch), each step's host time (the first one holds
torch.compile's compile time), the positions the encoder computed (padded or packed path, per forward),
peak GPU memory, and a GEMM after the run for useful MFU. Throughput comes from metrics.jsonl's windows
over the last --last steps (each window ends with the loop's log-time device read, so it is device time;
the first window, holding the start-up, never counts). With --time-limit the run stops itself (SIGTERM:
the loop finishes the step, logs, saves, exits 75) once that many seconds have passed since this process
started and at least --min-steps steps ran, and the figures cover what it did. --profile START:COUNT runs
torch.profiler over COUNT whole loop steps after START (data, forward, backward, clipping, optimizer: the ops' self
device time, grouped as gpu_profile.py groups the bare step's), and the figures cover the steps up to START only: a
loop profiled earlier stays slower after the profiler stops (H200, bert_large compiled: 61.7 against 55.4 ms a step,
benchmarks/results/gpu_compile_loop_2026-11-28_h200.log; Kineto keeps CUPTI attached, pytorch/pytorch#144455), so
profile after the measured steps; --trace FILE also writes them as a Chrome trace (host and device on one timeline:
where the device waited); on a GPU the profile also holds the device's idle time in those steps and how much of it
the host left (trace_gaps.py). Each step's host time
inside train_step is recorded too: near the step's time, the host is the limit. --bare-steps N: after the run, the
bare step (forward, backward, fused AdamW; its layers compiled where train.compile is true) on the last N measured
steps' batches, so that the loop's own cost shows apart from what its batches (packed, shorter) change in the step
itself. --marks START:COUNT: COUNT loop steps after the first START with the host's clock and a CUDA event at each
point (the step's start, its batch taken, the forward queued, the backward, the gradient norm, train_step's end, the
optimizer step's start and end), as gpu_host_lead.py marks the bare step, and the bare step on its batches marked
too with --bare-steps: how much host time each part of the loop takes and where the device waits, without the
profiler (which slows the host it measures). Used by gpu_suite.sh; everything after `--` goes to `bertrain pretrain`.

    python benchmarks/gpu_pretrain.py --last 200 --time-limit 60 -- --config bert_base --data D --run-dir R
    python benchmarks/gpu_pretrain.py --last 200 --profile 300:3 -- --config bert_large --data D --run-dir R \
        --set train.max_steps=325
    python benchmarks/gpu_pretrain.py --last 200 --bare-steps 24 -- --config bert_large --data D --run-dir R
    python benchmarks/gpu_pretrain.py --last 200 --marks 300:10 --bare-steps 24 -- --config bert_large --data D \
        --run-dir R --set train.max_steps=315
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import resource
import signal
import statistics
import sys
import time
from pathlib import Path

STARTED = time.perf_counter()  # before `import torch`: the time limit counts the whole process

import torch  # noqa: E402
from gpu_host_lead import Marks, point_rows, points_table, whole_steps  # noqa: E402
from gpu_profile import device_profiler, grouped, self_times  # noqa: E402
from model_step import bare_step, gemm_fn, synchronize, time_alternating, useful_flops  # noqa: E402
from trace_gaps import profiler_gaps  # noqa: E402

EXIT_REQUEUE = 75  # bertrain's exit after a signal: the step finished, a checkpoint written


class Probe:
    """Per optimizer step: host seconds in TrainStream.next, start time, the step's host counts and the
    positions its forwards computed; stops the run at the time limit."""

    def __init__(self, time_limit: float | None, min_steps: int, profile: tuple[int, int] | None = None,
                 device: torch.device | None = None, trace: str | None = None,
                 marks: tuple[int, int] | None = None) -> None:
        self.waiting, self.started, self.steps, self.forwards = 0.0, None, [], []
        self.loader_workers = None  # the stream's loader workers (data.num_workers as the run resolved it)
        self.time_limit, self.min_steps, self.stopped = time_limit, min_steps, False
        self.profile, self.device, self.profiler = profile, device, None  # (start, count): steps profiled
        self.trace = trace  # the profiled steps' Chrome trace (host ops and kernels on one timeline), gzipped
        self.marks, self.mark, self.marked = marks, Marks(device or torch.device("cpu")), None  # (start, count)

    def install(self) -> list[str]:
        """Wrap TrainStream.next, the loop's train_step and the model's plan_forward (eager under train.compile,
        which compiles the layers only); returns what could not be wrapped."""
        from bertrain.model import bert
        from bertrain.train import loop, stream
        from bertrain.train import step as train_step_module

        targets = [(stream.TrainStream, "next"), (loop, "train_step"), (bert, "plan_forward")]
        if self.marks:
            targets += [(train_step_module, "backward"), (train_step_module, "gradient_norm"),
                        (loop, "optimizer_step")]
        missing = [name for owner, name in targets if not hasattr(owner, name)]
        if missing:
            return missing
        next_batch, train_step = stream.TrainStream.next, loop.train_step

        def timed_next(stream_self):
            if self.started is None:
                self.mark("step start")
            start = time.perf_counter()
            self.started, self.loader_workers = self.started or start, stream_self.workers.count
            try:
                return next_batch(stream_self)
            finally:
                self.waiting += time.perf_counter() - start
                self.mark("batch taken")

        def counted_step(model, accelerator, batches, *args, **kwargs):
            self.stop_if_due()  # before the step: train_step reads the stop flag, so this step is the last
            self.marks_if_due()
            self.profile_if_due()
            step = dict(start=self.started or time.perf_counter(), data_s=self.waiting,
                        width=max(int(b["input_ids"].shape[1]) for b in batches))
            self.waiting, self.started, self.forwards = 0.0, None, []
            launched = time.perf_counter()
            result = train_step(model, accelerator, batches, *args, **kwargs)
            self.mark("train_step end")
            step.update(train_step_s=time.perf_counter() - launched, samples=result.samples, tokens=result.tokens,
                        predicted=result.predicted,
                        computed=sum(self.forwards) if self.forwards else None)
            self.steps.append(step)
            return result

        plan_forward = bert.plan_forward

        def counted_plan(model, layout):
            plan = plan_forward(model, layout)
            if model.training:  # positions the encoder runs at: the real tokens when packed, else all of [B, T]
                self.forwards.append(layout.real_tokens if plan.encoder == "packed"
                                     else layout.batch_size * layout.width)
            return plan

        stream.TrainStream.next, loop.train_step, bert.plan_forward = timed_next, counted_step, counted_plan
        if self.marks:
            self.mark_around(train_step_module, "backward", "forward queued", "backward end")
            self.mark_around(train_step_module, "gradient_norm", None, "norm end")
            self.mark_around(loop, "optimizer_step", "optimizer start", "optimizer end")
        return []

    def mark_around(self, owner, name: str, before: str | None, after: str) -> None:
        """`owner.name` (a function the loop calls by that name) marking `before` and `after` its call."""
        function = getattr(owner, name)

        def marked(*args, **kwargs):
            if before:
                self.mark(before)
            result = function(*args, **kwargs)
            self.mark(after)
            return result
        setattr(owner, name, marked)

    def marks_if_due(self) -> None:
        """Start marking at step `start`'s train_step (after a sync), stop `count` steps later: finish keeps the
        whole steps in between (from a "step start"), and the first of them is left out, as after any sync."""
        if self.marks is None:
            return
        start, count = self.marks
        if len(self.steps) == start:
            self.mark.start()
        elif len(self.steps) == start + count and self.mark.on:
            steps = whole_steps(self.mark.finish())
            self.marked = dict(steps=len(steps), first=start + 3, points=point_rows(steps)) if steps else None

    def profile_if_due(self) -> None:
        """Start the profiler before step `start`'s forward, stop it (the device's work done) `count` steps later:
        what lies between is whole loop steps."""
        if self.profile is None:
            return
        start, count = self.profile
        if len(self.steps) == start:
            self.profiler = device_profiler(self.device)
            self.profiler.start()
        elif len(self.steps) == start + count and self.profiler is not None:
            synchronize(self.device)
            self.profiler.stop()
            if self.trace:
                export_trace(self.profiler, self.trace)

    def measured_end(self) -> int:
        """The steps the figures may cover: those before the profiler or the marks started (the run's, where
        neither did)."""
        started = [window[0] for window, on in ((self.profile, self.profiler is not None),
                                                (self.marks, self.mark.points)) if on]
        return min(started, default=len(self.steps))

    def profiled(self) -> dict | None:
        """The profiled steps' ops (ms per step), grouped."""
        if self.profiler is None or len(self.steps) < sum(self.profile):
            return None  # the run ended before the profiler stopped
        start, count = self.profile
        ops = {name: microseconds / 1e3 for name, microseconds in self_times(self.profiler, self.device,
                                                                              count).items()}
        return dict(steps=[start + 1, start + count], total_ms=sum(ops.values()), groups_ms=grouped(ops),
                    ops_ms=ops,
                    tokens=statistics.mean(s["tokens"] for s in self.steps[start:start + count]),
                    gaps=profiler_gaps(self.profiler, count, self.trace) if self.device.type == "cuda" else None)

    def stop_if_due(self) -> None:
        """SIGTERM to this process (bertrain's stop request) once the time limit has passed."""
        if (self.time_limit is not None and not self.stopped and len(self.steps) >= self.min_steps
                and time.perf_counter() - STARTED >= self.time_limit):
            self.stopped = True
            os.kill(os.getpid(), signal.SIGTERM)


def export_trace(profiler, path: str) -> None:
    """The profiled steps as a gzipped Chrome trace (chrome://tracing, ui.perfetto.dev): where the device waited."""
    import gzip
    import shutil
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        plain = Path(scratch) / "trace.json"
        profiler.export_chrome_trace(str(plain))
        with open(plain, "rb") as source, gzip.open(path, "wb") as target:
            shutil.copyfileobj(source, target)


def compile_encoder_whole() -> None:
    """train.compile compiles the model's encoder module (every layer inlined in one graph) instead of each layer,
    with the options compile_layers gives inductor."""
    from bertrain.model import unwrap
    from bertrain.model.layers import with_inductor_options
    from bertrain.train import setup

    def compile_encoder(model, **options) -> int:
        unwrap(model).encoder.compile(**with_inductor_options(options))
        return 1

    setup.compile_layers = compile_encoder


def bare_on_run_batches(run_dir: Path, first: int, count: int, device: torch.device, rounds: int = 3,
                        marked: bool = False) -> dict:
    """Part 1's bare step (zero_grad, forward, backward, FusedAdamW: nothing else) of a fresh model of the run's
    config on `count` of the run's own batches, micro-batches `first`.. of epoch 0, all made and on the device before
    the timing: the same packing, lengths and masks as the loop's steps, so the loop against it is the cost of the
    loop alone (its data, clipping, bookkeeping), where part 1's unpadded batches also differ in what they compute.
    Its layers are compiled as the loop's were where the run's train.compile is true. `marked`: then one more pass
    with gpu_host_lead's marks, as --marks marks the loop."""
    import gc

    from bertrain.batch_buffer import to_device
    from bertrain.config import load_config, micro_batch_size_for
    from bertrain.data.format import open_prepared
    from bertrain.model import build_model
    from bertrain.train.adamw import FusedAdamW
    from bertrain.train import setup
    from bertrain.train.precision import choose_mixed_precision
    from bertrain.train.stream import TrainStream

    config = load_config(str(run_dir / "config.yaml"))
    stream = TrainStream(open_prepared(config.data.path), config.data, seed=config.train.seed,
                         micro_batch_size=micro_batch_size_for(config, 1), rank=0, world_size=1, epoch=0,
                         micro_batch=first, device_type=device.type)
    batches = [to_device(stream.next(), device, non_blocking=device.type == "cuda") for _ in range(count)]
    stream.close()
    gc.collect()  # the run's model and optimizer: their device memory back before this model takes its own
    if device.type == "cuda":
        torch.cuda.empty_cache()
    torch.manual_seed(0)
    with device:  # its weights made on the device: bert_large's initialization took 4 s on a CPU
        model = build_model(config.model).to(device).train()  # .to: any tensor a module made on the CPU itself
    if config.train.compile is True:  # compiled as the loop was (--compile-scope encoder replaces this function)
        setup.compile_layers(model)
    optimizer = FusedAdamW(model.parameters(), lr=1e-5)
    precision = choose_mixed_precision(config.train.mixed_precision, device)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)

    def through_batches() -> None:
        for batch in batches:
            bare_step(model, optimizer, batch, device, dtype, lambda name: None)

    # a pass to warm up (kernels picked, allocator filled), then the median of the rounds' passes
    step_s = time_alternating({"bare": through_batches}, rounds, 1, device)["bare"] / count
    layouts = [batch["layout"] for batch in batches]
    flops = sum(useful_flops(config.model, x.batch_size, x.predicted, x.width) * x.real_tokens
                / (x.batch_size * x.width) for x in layouts)  # as summarize counts the run's: real tokens only
    tokens = sum(x.real_tokens for x in layouts)
    out = dict(steps=count, first_micro_batch=first, rounds=rounds, step_ms=1e3 * step_s, real_tokens=tokens,
               tokens_per_s=tokens / count / step_s, useful_flops_per_s=flops / count / step_s, precision=precision)
    if marked and count > 2:
        marks, next_batch = Marks(device), iter(batches).__next__
        steps = whole_steps(marks.run(lambda: bare_step(model, optimizer, next_batch(), device, dtype, marks),
                                      len(batches)))
        out["marks"] = dict(steps=len(steps), points=point_rows(steps))
    return out


def windows(run_dir: Path, last: int, end: int) -> tuple[int, float, float, float, int]:
    """(steps, seconds, tokens, samples, last step) of metrics.jsonl's train windows within the last `last` steps of
    those up to step `end` (all but the first window when the run is shorter)."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    train = [r for r in records if r.get("kind") == "train" and r["step"] <= end]
    if not train:
        return 0, 0.0, 0.0, 0.0, 0
    end = train[-1]["step"]
    steps = seconds = tokens = samples = 0
    for before, record in zip(train, train[1:]):
        if before["step"] >= end - last:
            window_tokens = record["tokens_seen"] - before["tokens_seen"]
            steps += record["step"] - before["step"]
            seconds += window_tokens / record["tokens_per_s"]
            tokens += window_tokens
            samples += record["samples_seen"] - before["samples_seen"]
    return steps, seconds, tokens, samples, end


def gemm_peak(device: torch.device) -> float:
    """FLOP/s of a square GEMM in the run's precision (bf16 on CUDA, fp32 on a CPU), measured here and now."""
    dtype, size = (torch.bfloat16, 8192) if device.type == "cuda" else (torch.float32, 512)
    gemm, flops = gemm_fn(dtype, size, device)
    return flops / time_alternating({"gemm": gemm}, rounds=3, repeats=10, device=device)["gemm"]


def summarize(probe: Probe, run_dir: Path, last: int, device: torch.device) -> dict:
    """The figures of the last `last` steps before any profiled ones (see the module docstring)."""
    from bertrain.config import load_config

    out: dict = {"steps_run": len(probe.steps)}
    steps, seconds, tokens, samples, end = windows(run_dir, last, probe.measured_end())
    kept = probe.steps[:end]
    starts = [s["start"] for s in probe.steps[:end + 1]]  # step `end`'s host time ends where the next one starts
    host_steps = [b - a for a, b in zip(starts, starts[1:])]
    if host_steps:
        out["first_step_s"] = host_steps[0]
        out["host_step_ms_median"] = 1e3 * statistics.median(host_steps[-last:])
        # the host's time in train_step (forward and backward queued): near the step's time, the host is the limit
        out["host_train_step_ms_median"] = 1e3 * statistics.median(s["train_step_s"] for s in kept[-last:])
    if steps:
        out.update(measured_steps=steps, seconds=seconds, tokens_per_s=tokens / seconds,
                   samples_per_s=samples / seconds, step_ms=1e3 * seconds / steps)
    if not steps or len(kept) < steps:  # the probe missed the steps (a renamed function): no more figures
        return out
    out["measured_end"] = end
    measured = kept[-steps:]
    model = load_config(str(run_dir / "config.yaml")).model
    flops = sum(useful_flops(model, s["samples"], s["predicted"], s["width"]) * s["tokens"]
                / (s["samples"] * s["width"]) for s in measured)  # the real tokens' FLOPs: padding is no useful work
    positions = sum(s["samples"] * s["width"] for s in measured)
    peak = gemm_peak(device)
    out.update(mean_width=statistics.mean(s["width"] for s in measured),
               padding_share=1 - sum(s["tokens"] for s in measured) / positions,
               data_wait_share=sum(s["data_s"] for s in measured) / seconds, peak_flops=peak,
               useful_mfu=flops / seconds / peak)
    if all(s["computed"] for s in measured):  # padding the encoder computed: none where it ran packed
        out["computed_padding_share"] = 1 - sum(s["tokens"] for s in measured) / sum(s["computed"] for s in measured)
    profile = probe.profiled()
    if profile:
        out["profile"] = profile
    if probe.marked:
        out["marks"] = probe.marked
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--last", type=int, default=200, help="Steps at the end the figures cover.")
    parser.add_argument("--time-limit", type=float, default=None,
                        help="Stop the run (as SIGTERM does) once this many seconds have passed since start.")
    parser.add_argument("--min-steps", type=int, default=0, help="Steps run before --time-limit may stop it.")
    parser.add_argument("--results", default=None, help="Append the figures as a JSON line to this file.")
    parser.add_argument("--label", default="", help="Name of this run in the results.")
    parser.add_argument("--profile", default=None, metavar="START:COUNT",
                        help="Profile COUNT loop steps after the first START (the figures cover steps 1-START).")
    parser.add_argument("--trace", default=None, metavar="FILE.json.gz",
                        help="With --profile: write the profiled steps' Chrome trace (host and device) here.")
    parser.add_argument("--compile-backend", default=None,
                        help="torch.compile backend for train.compile=true (e.g. eager for a quick CPU run).")
    parser.add_argument("--compile-scope", choices=("layers", "encoder"), default="layers",
                        help="What train.compile compiles: each encoder layer (bertrain's way) or the encoder "
                             "whole, all its layers in one graph (one guard check and one AOTAutograd call a "
                             "direction instead of one a layer: 14-31%% less time a step on a 2-core CPU at width 64).")
    parser.add_argument("--marks", default=None, metavar="START:COUNT",
                        help="Mark COUNT loop steps after the first START: host time and the device's progress at "
                             "each part of the step (the figures cover steps 1-START); the bare steps too.")
    parser.add_argument("--bare-steps", type=int, default=0, metavar="N",
                        help="After the run: the bare step on the last N measured steps' batches (the loop's own "
                             "cost).")
    args, pretrain_args = parser.parse_known_args()
    pretrain_args = [a for a in pretrain_args if a != "--"]
    run_dir = Path(pretrain_args[pretrain_args.index("--run-dir") + 1])
    from bertrain.cli import main as cli
    from bertrain.train import setup
    from bertrain.train.precision import local_device_type

    if args.compile_scope == "encoder":
        compile_encoder_whole()
    if args.compile_backend:  # what train.compile and the bare steps compile with (inductor's options: inductor only)
        setup.compile_layers = functools.partial(setup.compile_layers, backend=args.compile_backend)

    profile, marks = (tuple(int(n) for n in a.split(":")) if a else None for a in (args.profile, args.marks))
    probe = Probe(args.time_limit, args.min_steps, profile, torch.device(local_device_type()), args.trace, marks)
    result: dict = {"label": args.label, "not_wrapped": probe.install()}
    started = time.perf_counter()
    result["exit_code"] = cli(["pretrain", *pretrain_args])
    result["wall_s"] = time.perf_counter() - started
    result["time_limited"], result["loader_workers"] = probe.stopped, probe.loader_workers
    device = probe.device
    if device.type == "cuda":
        result["peak_memory_gb"] = torch.cuda.max_memory_allocated() / 2**30
        result["peak_reserved_gb"] = torch.cuda.max_memory_reserved() / 2**30
    else:  # no device memory: the process's peak resident memory instead
        result["peak_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    finished = result["exit_code"] == 0 or (probe.stopped and result["exit_code"] == EXIT_REQUEUE)
    if finished:
        result.update(summarize(probe, run_dir, args.last, device))
    if finished and args.bare_steps and "measured_end" in result:  # the suite's runs: one micro-batch a step
        end = result["measured_end"]
        first = max(end - args.bare_steps, 0)
        same = result["bare_same_batches"] = bare_on_run_batches(run_dir, first, end - first, device,
                                                                 marked=marks is not None)
        same["run_tokens"] = sum(s["tokens"] for s in probe.steps[first:end])  # = its real_tokens: the same batches
    for whose, marked in (("the loop's", result.get("marks")),
                          ("the bare step's", result.get("bare_same_batches", {}).get("marks"))):
        if marked:
            print(f"{whose} marked steps ({marked['steps']}):\n" + "\n".join(points_table(marked["points"], 0.05)))
    from torch._dynamo.utils import counters

    if counters["stats"].get("unique_graphs"):  # train.compile ran: the graphs (recompiles, graph breaks)
        result["compiled_graphs"] = counters["stats"]["unique_graphs"]
        # each break splits a layer's graph, which adds a compiled call's host work (the compiled loop's limit)
        result["graph_breaks"] = sum(counters["graph_break"].values())
    result["process_s"] = time.perf_counter() - STARTED
    print("RESULT " + json.dumps(result), flush=True)
    if args.results:
        with open(args.results, "a") as handle:
            handle.write(json.dumps(result) + "\n")
    sys.stderr.flush()
    # No interpreter teardown: after a finished GPU run it took ~20 s (the loader's worker shutdown, it seems),
    # which the figures do not need; the suite ends what is left of the process group.
    os._exit(0 if finished and "measured_steps" in result else result["exit_code"] or 1)


if __name__ == "__main__":
    main()
