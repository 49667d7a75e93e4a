"""`data.num_workers` (bertrain/data/workers.py): what `auto` starts on each device and host, and the error a loader
worker's death gives (a full /dev/shm kills one with a bus error)."""

from __future__ import annotations

import os
import signal

import pytest

from bertrain.data import workers
from bertrain.data.loader import iterate_micro_batches
from bertrain.data.workers import AUTO_MIN_SHARED_MEMORY, choose_workers
from bertrain.errors import DataError

PLENTY = 8 << 30  # bytes free in /dev/shm


@pytest.mark.parametrize("setting, device, cores, local, expected", [
    ("auto", "cpu", 64, None, 0), ("auto", "mps", 64, None, 0), ("auto", "cuda", 16, None, 4),
    ("auto", "cuda", 64, "8", 4), ("auto", "cuda", 16, "8", 1), ("auto", "cuda", 8, "8", 0), ("auto", "cuda", 1, "", 0),
    (3, "cpu", 2, None, 3), (3, "cuda", 2, "8", 3), (0, "cuda", 64, None, 0)])
def test_auto_starts_workers_on_cuda_within_the_cores_of_each_process(monkeypatch, setting, device, cores, local,
                                                                      expected):
    """`auto` makes batches in the training process off CUDA; on CUDA 4 workers, within the node's cores per training
    process less one; a number is taken as it is."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)
    environ = {} if local is None else {"LOCAL_WORLD_SIZE": local}
    assert choose_workers(setting, device, environ, shared_free=PLENTY).count == expected


def test_auto_starts_none_where_shared_memory_is_a_containers_default(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    short = choose_workers("auto", "cuda", {}, shared_free=64 << 20)
    assert short.count == 0 and "/dev/shm has 64 MiB free" in short.why_none and "--shm-size" in short.why_none
    assert short.describe().startswith("no loader workers: data.num_workers auto: /dev/shm has 64 MiB free")
    assert choose_workers("auto", "cuda", {}, shared_free=AUTO_MIN_SHARED_MEMORY).describe() == \
        "4 loader workers a process"
    assert choose_workers(2, "cuda", {}, shared_free=64 << 20).count == 2  # a number: the user's choice
    assert choose_workers("auto", "cpu", {}, shared_free=64 << 20).describe() == "no loader workers"


class DiesInTheWorker:
    """A dataset whose worker dies of SIGBUS at its second item, as one that finds /dev/shm full does."""

    def __getitem__(self, key: int) -> dict:
        if key == 1:
            os.kill(os.getpid(), signal.SIGBUS)
        return {"key": key}


def test_a_dead_worker_is_an_error_that_names_shared_memory_and_what_to_do():
    batches = iterate_micro_batches(DiesInTheWorker(), range(4), num_workers=1, pin_memory=False)
    with pytest.raises(DataError) as caught:
        list(batches)
    message = str(caught.value)
    # torch's words: "exited unexpectedly", or "is killed by signal: Bus error" where its SIGCHLD handler saw it
    assert "A data loader worker process died: DataLoader worker (pid" in message, message
    assert "exited unexpectedly" in message or "Bus error" in message, message
    assert "/dev/shm" in message and "--shm-size=8g or --ipc=host" in message and "data.num_workers=0" in message


def test_other_loader_errors_pass_through():
    class Broken:
        def __getitem__(self, key):
            raise RuntimeError("a bug in the dataset")

    with pytest.raises(RuntimeError, match="a bug in the dataset"):
        list(iterate_micro_batches(Broken(), range(2), num_workers=1, pin_memory=False))
    assert workers.shared_memory_free("/nonexistent/shm") is None
