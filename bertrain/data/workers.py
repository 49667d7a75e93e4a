"""`data.num_workers`: how many loader worker processes a training process starts, and the error a dead one gives.
Workers send their batches through shared memory (/dev/shm), which a container limits to 64 MiB by default."""

from __future__ import annotations

import shutil
from dataclasses import dataclass

from bertrain.errors import DataError

SHARED_MEMORY = "/dev/shm"
# Workers with less than this free get a warning: 4 workers keep 24 batch buffers (batch_buffer.WorkerSlots) of ~50
# bytes a token, 130k tokens each at 256 x 512 (160 MB in all), where Docker's default 64 MiB holds 16 of 128 x 512
MIN_SHARED_MEMORY = 1 << 30
CONTAINER_HINT = "run the container with --shm-size=8g or --ipc=host"


@dataclass(frozen=True)
class WorkerChoice:
    """The workers `data.num_workers` starts, and a warning about them (None: nothing to say)."""

    count: int
    warning: str | None = None

    def describe(self) -> str:
        """'no loader workers', '4 loader workers a process' or '4 loader workers a process; warning'."""
        if not self.count:
            return "no loader workers"
        return f"{self.count} loader workers a process" + (f"; {self.warning}" if self.warning else "")


def shared_memory_free(path: str = SHARED_MEMORY) -> int | None:
    """Free bytes in `path` (None where there is none, off Linux)."""
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def choose_workers(setting: int | str, shared_free: int | None = None) -> WorkerChoice:
    """`data.num_workers` resolved: `auto` makes batches in the training process (an H200 measured that the faster
    loop); a number starts that many, with a warning where /dev/shm is short (`shared_free`: measured when None)."""
    count = worker_count(setting)
    if count == 0:
        return WorkerChoice(0)
    free = shared_memory_free() if shared_free is None else shared_free
    if free is not None and free < MIN_SHARED_MEMORY:
        return WorkerChoice(count, f"{SHARED_MEMORY} has {free / 2**20:,.0f} MiB free, under "
                                   f"{MIN_SHARED_MEMORY >> 20:,} MiB: a worker dies when it fills; {CONTAINER_HINT}")
    return WorkerChoice(count)


def worker_count(setting: int | str) -> int:
    """The workers `data.num_workers` starts."""
    return 0 if setting == "auto" else int(setting)


def worker_died_error(error: BaseException) -> DataError:
    """The error for a loader worker that died (most often of a full /dev/shm: a bus error)."""
    free = shared_memory_free()
    room = f"{free / 2**20:,.0f} MiB free now" if free is not None else "not found"
    return DataError(f"A data loader worker process died: {str(error).rstrip('.')}. Workers send their batches "
                     f"through shared memory ({SHARED_MEMORY}: {room}); a container's default 64 MiB runs out: "
                     f"{CONTAINER_HINT}, or set data.num_workers=0 (batches made in the training process). The same "
                     f"command resumes from the last checkpoint.")
