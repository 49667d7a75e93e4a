"""This rank's training micro-batches across epochs, started in O(1) at a saved position; never draws from the
global torch RNG, so a resumed run sees the batches an uninterrupted one would."""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch

from bertrain.data.loader import (RunDataset, empty_epoch_error, epoch_plan, iterate_micro_batches,
                                  num_micro_batches)
from bertrain.data.workers import choose_workers


@contextlib.contextmanager
def isolated_torch_rng() -> Iterator[None]:
    """Run data code without consuming the global torch RNG, so dropout depends only on the steps taken."""
    state = torch.get_rng_state()
    try:
        yield
    finally:
        torch.set_rng_state(state)


class TrainStream:
    """This rank's micro-batches from a saved (epoch, micro_batch) position on, across epochs."""

    def __init__(self, prepared, data_config, *, seed: int, micro_batch_size: int, rank: int, world_size: int,
                 epoch: int, micro_batch: int, device_type: str = "cpu") -> None:
        """device_type: where the batches go (on CUDA they are page-locked, for non_blocking copies); worker
        processes serve every epoch."""
        self.prepared, self.data_config, self.seed = prepared, data_config, seed
        self.pin_memory = device_type == "cuda"
        self.workers = choose_workers(data_config.num_workers)  # how many loader workers, and any warning
        self.micro_batch_size, self.rank, self.world_size = micro_batch_size, rank, world_size
        self.epoch, self.micro_batch = epoch, micro_batch
        self._iterator: Iterator | None = None
        self._epoch_lengths: dict[int, int] = {}

    def epoch_length(self, epoch: int) -> int:
        """Global micro-batches in `epoch` (the same on every rank)."""
        if epoch not in self._epoch_lengths:
            with isolated_torch_rng():
                length = num_micro_batches(self.prepared, self.data_config, seed=self.seed, epoch=epoch,
                                           micro_batch_size=self.micro_batch_size, world_size=self.world_size)
            if length == 0:  # never cached: every call for such an epoch refuses it
                instances = len(epoch_plan(self.prepared, self.data_config, seed=self.seed, epoch=epoch))
                raise empty_epoch_error(self.prepared, instances, self.micro_batch_size, self.world_size)
            self._epoch_lengths[epoch] = length
        return self._epoch_lengths[epoch]

    def next(self) -> dict:
        """The next micro-batch; (epoch, micro_batch) then points after it."""
        with isolated_torch_rng():
            if self.micro_batch >= self.epoch_length(self.epoch):
                self.epoch, self.micro_batch = self.epoch + 1, 0
                self.epoch_length(self.epoch)  # refuses an epoch with no complete micro-batch
            if self._iterator is None:
                dataset = RunDataset(self.prepared, self.data_config, seed=self.seed,
                                     micro_batch_size=self.micro_batch_size, rank=self.rank,
                                     world_size=self.world_size)
                self._iterator = iterate_micro_batches(dataset, self._positions(), self.workers.count,
                                                       self.pin_memory)
            batch = next(self._iterator)
        self.micro_batch += 1
        return batch

    def close(self) -> None:
        """Stop the loader workers now, while the interpreter is whole, rather than at its exit."""
        if self._iterator is not None:
            self._iterator.close()
            self._iterator = None

    def _positions(self) -> Iterator[tuple[int, int]]:
        """(epoch, micro_batch) from the current position on, through every later epoch."""
        epoch, micro_batch = self.epoch, self.micro_batch
        while True:
            with isolated_torch_rng():
                length = self.epoch_length(epoch)
            yield from ((epoch, m) for m in range(micro_batch, length))
            epoch, micro_batch = epoch + 1, 0
