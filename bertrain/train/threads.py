"""`train.threads` (and `bertrain evaluate`'s `finetune.threads`): torch's intra-op thread count on a CPU. `auto`
times one micro-batch's forward + backward at the default count and at fewer threads (at the start, every
RECHECK_SECONDS, and sooner when the throughput drops) and trains with the fastest: where other processes keep
cores busy, OpenMP threads wait at every operation for the one whose core is taken (2 cores, one busy process:
3-5x slower than 1 thread)."""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from typing import Callable

import torch

from bertrain.config import Config
from bertrain.train.monitor import SLOW_SHARE
from bertrain.train.step_cost import MATMUL_SHARE, forward_backward, matmul_rate, training_flops
from bertrain.train.stream import TrainStream

# The default count is kept unless another one is this much faster: on an idle machine nothing changes.
KEEP_DEFAULT_WITHIN = 1.15
PROBE_PASS_SECONDS = 0.5     # a probe on a larger micro-batch runs on fewer of its sequences
RECHECK_SECONDS = 120.0      # auto measures again this often (the load of a shared machine changes) ...
SLOW_RECHECK_SECONDS = 20.0  # ... and this soon after a logged throughput fell below SLOW_SHARE of the estimate
SKIP_BEYOND = 2.0            # a count whose pass took this many times the fastest is not timed a second time


@dataclass
class ThreadPlan:
    """What `train.threads` means for this process: the counts to measure (one: just the estimate) and why."""

    candidates: list[int]
    reason: str

    @property
    def auto(self) -> bool:
        return len(self.candidates) > 1


def plan_threads(setting: int | str, *, device_type: str, world_size: int, deterministic: bool,
                 environ=os.environ, key: str = "train.threads", compiled: bool = False) -> ThreadPlan | None:
    """Set an int `setting` (of config `key`) now; for `auto` the counts to compare. None: leave torch's threads
    and measure nothing (a GPU, or several processes, whose launcher set OMP_NUM_THREADS). compiled: the run
    compiles its layers."""
    if setting != "auto":
        torch.set_num_threads(int(setting))
    if device_type != "cpu" or world_size > 1:
        return None
    default = torch.get_num_threads()
    if setting != "auto":
        return ThreadPlan([default], f"{key}={setting}")
    kept = ("OMP_NUM_THREADS is set" if environ.get("OMP_NUM_THREADS") else
            "train.deterministic keeps one count (the count changes float rounding)" if deterministic else
            # torch.compile guards on the thread count: each count probed would compile the layers again
            "train.compile keeps one count (another recompiles)" if compiled else
            "one core" if default == 1 else None)
    if kept:
        return ThreadPlan([default], f"{key}=auto: {kept}")
    return ThreadPlan(sorted({default, max(default // 2, 1), 1}, reverse=True), f"{key}=auto")


def choose_threads(seconds: dict[int, list[float]], default: int) -> int:
    """The count with the shortest pass, or `default` when its shortest is within KEEP_DEFAULT_WITHIN of that
    (the shortest of each: other work only ever adds time to a pass)."""
    best = {threads: min(times) for threads, times in seconds.items()}
    fastest = min(best, key=lambda threads: (best[threads], -threads))
    return default if best[default] <= KEEP_DEFAULT_WITHIN * best[fastest] else fastest


def probe_rows(seconds_per_row: float, rows: int) -> int:
    """How many sequences of the micro-batch a probe pass uses so that it takes about PROBE_PASS_SECONDS."""
    return max(1, min(rows, int(PROBE_PASS_SECONDS / max(seconds_per_row, 1e-12))))


class ThreadTuner:
    """Measures one micro-batch (its own copy, the torch RNG untouched) at each candidate count and sets the
    fastest; `estimate` is the best throughput measured, in tokens/s, what the progress line compares with."""

    def __init__(self, plan: ThreadPlan, model, accelerator, batch: dict, seconds_per_row: float = 0.0,
                 clock: Callable[[], float] = time.monotonic, timer: Callable[[], float] = time.perf_counter,
                 run_pass: Callable[[dict], None] | None = None) -> None:
        """`seconds_per_row`: a pass's expected time per sequence (a larger micro-batch is probed on part of it);
        `clock` paces the re-measurements, `timer` times the passes (tests pass their own); `run_pass(batch)`:
        one forward + backward of `model` (default: pretraining's, `forward_backward`; fine-tuning passes its own)."""
        self.plan, self.model, self.accelerator, self.clock, self.timer = plan, model, accelerator, clock, timer
        self.run_pass = run_pass or (lambda part: forward_backward(self.model, self.accelerator, part))
        self.default = plan.candidates[0]
        if plan.auto:
            rows = probe_rows(seconds_per_row, len(batch["input_ids"]))
            if rows < len(batch["input_ids"]):  # the model makes the part's layout
                batch = {k: v[:rows] for k, v in batch.items() if k != "layout"}
        self.batch = batch
        self.tokens = int(self.batch["attention_mask"].sum()) if "attention_mask" in self.batch else \
            self.batch["input_ids"].numel()
        self.threads, self.estimate, self.last_probe, self.warmed = self.default, 0.0, -math.inf, False
        self.slow = self.was_slow = False  # the throughput became far below the estimate (since the last probe)

    def observe(self, tokens_per_s: float) -> None:
        """A logged throughput: once it falls far below the estimate, auto measures again sooner."""
        slow = tokens_per_s < SLOW_SHARE * self.estimate
        self.slow, self.was_slow = self.slow or (slow and not self.was_slow), slow

    def due(self) -> bool:
        """Whether to measure again now: auto only, every RECHECK_SECONDS, or SLOW_RECHECK_SECONDS after a slow log."""
        if not self.plan.auto:
            return False
        waited = self.clock() - self.last_probe
        return waited >= RECHECK_SECONDS or (self.slow and waited >= SLOW_RECHECK_SECONDS)

    def probe(self) -> str | None:
        """Time the candidates, set the fastest; a line saying what was chosen when that changed (or first)."""
        seconds = self.measure()
        chosen = choose_threads(seconds, self.default)
        changed = chosen != self.threads or self.last_probe == -math.inf
        self.threads, self.last_probe, self.slow = chosen, self.clock(), False
        torch.set_num_threads(chosen)
        self.estimate = max(self.estimate, self.tokens / min(seconds[chosen]))
        if not (changed and self.plan.auto):
            return None
        times = ", ".join(f"{threads} thread(s) {min(t) * 1e3:,.0f} ms"
                          for threads, t in sorted(seconds.items(), reverse=True))
        return f"CPU threads: {chosen} ({self.plan.reason}; one forward + backward of {len(self.batch['input_ids'])} " \
               f"sequence(s): {times})"

    def measure(self) -> dict[int, list[float]]:
        """Pass times per candidate, alternated (the current count first and last) so that a change of load hits
        all alike; a count far slower than the fastest (SKIP_BEYOND) gets one pass, not two."""
        with torch.random.fork_rng(devices=[]):
            if not self.warmed:  # the first pass at a shape allocates and picks kernels: not timed
                self.run_pass(self.batch)
                self.warmed = True
            seconds: dict[int, list[float]] = {threads: [] for threads in self.plan.candidates}
            order = [self.threads] + [threads for threads in self.plan.candidates if threads != self.threads]
            for threads in order + order[::-1] if self.plan.auto else order:
                fastest = min((t for times in seconds.values() for t in times), default=math.inf)
                if seconds[threads] and seconds[threads][0] > SKIP_BEYOND * fastest:
                    continue
                torch.set_num_threads(threads)
                begin = self.timer()
                self.run_pass(self.batch)
                seconds[threads].append(self.timer() - begin)
            torch.set_num_threads(self.threads)
        self.model.zero_grad(set_to_none=True)
        return seconds


def start_tuner(plan: ThreadPlan, model, accelerator, config: Config, prepared, micro_batch_size: int,
                message: Callable[[str], None]) -> ThreadTuner:
    """The tuner of a one-process CPU run, measured once on the run's first micro-batch (as the dry run does)."""
    stream = TrainStream(prepared, config.data, seed=config.train.seed, micro_batch_size=micro_batch_size, rank=0,
                         world_size=1, epoch=0, micro_batch=0)
    one_thread = 0.0
    if plan.auto:  # by FLOPs at one thread's matmul rate: an upper bound that another process hardly changes
        with torch.random.fork_rng(devices=[]):  # the run's dropout draws stay the same
            torch.set_num_threads(1)
            one_thread = matmul_rate(accelerator) * MATMUL_SHARE
            torch.set_num_threads(plan.candidates[0])
    flops = training_flops(config.model, 1, config.data.max_seq_length, config.data.mlm_probability)
    tuner = ThreadTuner(plan, model, accelerator, stream.next(), flops / one_thread if one_thread else 0.0)
    line = tuner.probe()
    if line:
        message(line)
    return tuner
