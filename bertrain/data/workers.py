"""`data.num_workers`: how many loader worker processes a training process starts, and the error a dead one gives.
Workers send their batches through shared memory (/dev/shm), which a container limits to 64 MiB by default."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass

from bertrain.errors import DataError

AUTO_WORKERS = 4  # `auto` on CUDA: at most this many, one core per training process left to that process
SHARED_MEMORY = "/dev/shm"
# `auto` starts workers only with this much free: room for the 16 batches 4 workers prefetch at over a million tokens
# each (a batch is ~50 bytes a token), where Docker's default 64 MiB holds 16 of 128 x 512 at most
AUTO_MIN_SHARED_MEMORY = 1 << 30
CONTAINER_HINT = "run the container with --shm-size=8g or --ipc=host"


@dataclass(frozen=True)
class WorkerChoice:
    """The workers `data.num_workers` starts, and why `auto` started none on a GPU (None: nothing to say)."""

    count: int
    why_none: str | None = None

    def describe(self) -> str:
        """'4 loader workers a process', or 'no loader workers: why'."""
        return f"{self.count} loader workers a process" if self.count else \
            "no loader workers" + (f": {self.why_none}" if self.why_none else "")


def shared_memory_free(path: str = SHARED_MEMORY) -> int | None:
    """Free bytes in `path` (None where there is none, off Linux)."""
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def choose_workers(setting: int | str, device_type: str = "cpu", environ=os.environ,
                   shared_free: int | None = None) -> WorkerChoice:
    """`data.num_workers` resolved. `auto`: none off CUDA (a CPU's cores run the model); on CUDA AUTO_WORKERS within
    this process's share of the cores (LOCAL_WORLD_SIZE processes on the node) less one, and none where shared
    memory is short (`shared_free`: measured when not given)."""
    if setting != "auto":
        return WorkerChoice(int(setting))
    if device_type != "cuda":
        return WorkerChoice(0)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    local_processes = max(int(environ.get("LOCAL_WORLD_SIZE") or 1), 1)
    count = max(0, min(AUTO_WORKERS, cores // local_processes - 1))
    if count == 0:
        return WorkerChoice(0, f"data.num_workers auto: {cores} cores for {local_processes} training process(es)")
    free = shared_memory_free() if shared_free is None else shared_free
    if free is not None and free < AUTO_MIN_SHARED_MEMORY:
        return WorkerChoice(0, f"data.num_workers auto: {SHARED_MEMORY} has {free / 2**20:,.0f} MiB free, under "
                               f"{AUTO_MIN_SHARED_MEMORY >> 20:,} MiB; for workers, {CONTAINER_HINT}")
    return WorkerChoice(count)


def worker_count(setting: int | str, device_type: str = "cpu", environ=os.environ) -> int:
    """choose_workers' count."""
    return choose_workers(setting, device_type, environ).count


def worker_died_error(error: BaseException) -> DataError:
    """The error for a loader worker that died (most often of a full /dev/shm: a bus error)."""
    free = shared_memory_free()
    room = f"{free / 2**20:,.0f} MiB free now" if free is not None else "not found"
    return DataError(f"A data loader worker process died: {str(error).rstrip('.')}. Workers send their batches "
                     f"through shared memory ({SHARED_MEMORY}: {room}); a container's default 64 MiB runs out: "
                     f"{CONTAINER_HINT}, or set data.num_workers=0 (batches made in the training process). The same "
                     f"command resumes from the last checkpoint.")
