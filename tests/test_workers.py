"""`data.num_workers` (bertrain/data/workers.py): what `auto` and a number start, the warning a short /dev/shm gives,
and the error a loader worker's death gives (a full /dev/shm kills one with a bus error)."""

from __future__ import annotations

import os
import signal

import pytest

from bertrain.data import workers
from bertrain.data.loader import iterate_micro_batches
from bertrain.data.workers import MIN_SHARED_MEMORY, choose_workers
from bertrain.errors import DataError

PLENTY = 8 << 30  # bytes free in /dev/shm


@pytest.mark.parametrize("setting, expected", [("auto", 0), (0, 0), (3, 3), ("2", 2)])
def test_auto_makes_batches_in_the_training_process_and_a_number_starts_that_many(setting, expected):
    assert choose_workers(setting, shared_free=PLENTY) == workers.WorkerChoice(expected)
    assert workers.worker_count(setting) == expected


def test_workers_with_a_containers_default_shared_memory_are_warned_about():
    short = choose_workers(4, shared_free=64 << 20)
    assert short.count == 4, "a number is the user's choice: started, with a warning"
    assert short.describe().startswith("4 loader workers a process; /dev/shm has 64 MiB free, under 1,024 MiB")
    assert "--shm-size=8g" in short.describe()
    assert choose_workers(4, shared_free=MIN_SHARED_MEMORY).describe() == "4 loader workers a process"
    assert choose_workers("auto", shared_free=64 << 20).describe() == "no loader workers", "no workers, no warning"


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
