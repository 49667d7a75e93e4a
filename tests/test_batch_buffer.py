"""A batch in one buffer (bertrain/batch_buffer.py): the same tensors and host values after packing, one storage
from a loader worker, one copy to a device."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from bertrain.batch_buffer import ALIGN, PackedBatch, SlotReceiver, WorkerSlots, move_storage, to_device
from bertrain.batch_layout import map_tensors
from bertrain.config import DataConfig
from bertrain.data.format import open_prepared
from bertrain.data.loader import RunDataset, build_train_loader, iterate_micro_batches
from tests.helpers import make_prepared_dir


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    return open_prepared(make_prepared_dir(tmp_path_factory.mktemp("buffer") / "data", kind="wordpiece",
                                           num_documents=60, seed=4, max_paragraphs=600))


def first_batch(prepared, workers: int = 0) -> dict:
    """A training micro-batch with its layout and packing (NSP, right-padded rows)."""
    config = DataConfig(objective="nsp", max_seq_length=64, masking="token", num_workers=workers)
    loader = build_train_loader(prepared, config, seed=1, epoch=0, micro_batch_size=8, rank=0, world_size=1)
    loader.stop = loader.start + 1
    return next(iter(loader))


def tensors(value) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []
    map_tensors(value, found.append)
    return found


def host_values(value) -> list:
    """Everything but the tensors (counts, widths, the packing's numpy lengths), in order."""
    if dataclasses.is_dataclass(value):
        return [host_values(getattr(value, field.name)) for field in dataclasses.fields(value)]
    if isinstance(value, dict):
        return [(key, host_values(item)) for key, item in value.items()]
    if isinstance(value, torch.Tensor):
        return ["tensor"]
    return [value.tolist() if isinstance(value, np.ndarray) else value]


def assert_same(batch, other) -> None:
    assert host_values(other) == host_values(batch)
    for a, b in zip(tensors(batch), tensors(other), strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


def storages(batch) -> set[int]:
    return {tensor.untyped_storage().data_ptr() for tensor in tensors(batch)}


def test_a_packed_batch_unpacks_to_the_same_tensors_and_values_in_one_storage(prepared):
    batch = first_batch(prepared)
    assert batch["layout"].packing is not None and len(tensors(batch)) >= 12
    packed = PackedBatch.pack(batch)
    unpacked = packed.unpack()
    assert_same(batch, unpacked)
    assert storages(unpacked) == {packed.buffer.untyped_storage().data_ptr()}
    used = sum(t.numel() * t.element_size() for t in tensors(batch))
    assert used <= packed.buffer.numel() < used + ALIGN * len(tensors(batch))
    assert all(t.storage_offset() * t.element_size() % ALIGN == 0 for t in tensors(unpacked))


@pytest.mark.multiprocess
def test_a_workers_batch_arrives_as_views_of_one_storage(prepared):
    """A worker sends one storage a batch, not one per tensor (each costs the training process a shared-memory
    file's handshake)."""
    reference, batch = first_batch(prepared), first_batch(prepared, workers=1)
    assert_same(reference, batch)
    assert len(storages(batch)) == 1 and len(storages(reference)) > 1


def test_a_slot_is_sent_once_and_written_again_in_place(prepared):
    """WorkerSlots and SlotReceiver in one process: a slot's buffer goes with its first batch and again only when a
    larger batch outgrows it; a taken batch is a copy in one storage of its own, which later batches in the slot leave
    as it was."""
    config = DataConfig(objective="nsp", max_seq_length=64, masking="token")
    batches = [RunDataset(prepared, config, seed=1, micro_batch_size=rows, rank=0, world_size=1)[(0, 0)]
               for rows in (8, 7, 8, 16, 4)]
    worker, receiver = WorkerSlots(worker=0), SlotReceiver()
    message = worker.put(batches[0], slot=0, task=0)
    assert message.buffer is not None  # the slot's first use: its buffer goes with the batch
    first = receiver.take(message, pin_memory=False).unpack()
    sent = []
    for task, batch in enumerate(batches[1:], start=1):
        message = worker.put(batch, slot=0, task=task)
        sent.append(message.buffer is not None)
        taken = receiver.take(message, pin_memory=False).unpack()
        assert_same(batch, taken)
        assert len(storages(taken)) == 1 and storages(taken).isdisjoint(storages(first))
    assert sent == [False, False, True, False]  # 7 and 8 rows fit the first 8 rows' buffer; 16 grew it
    assert_same(batches[0], first)  # written over in the slot four times since it was taken


def test_a_slot_written_again_before_its_batch_was_taken_is_an_error(prepared):
    worker, receiver = WorkerSlots(worker=1), SlotReceiver()
    early = worker.put(first_batch(prepared), slot=2, task=2)
    worker.put(first_batch(prepared), slot=2, task=8)  # the slot's next task, before task 2 was taken
    with pytest.raises(RuntimeError, match="worker 1's slot 2 holds task 8 where task 2 was expected"):
        receiver.take(early, pin_memory=False)


@pytest.mark.multiprocess
def test_workers_batches_through_their_slots_are_the_in_process_ones(prepared):
    """Two workers, 12 slots, 40 batches held to the end: each slot written three or four times, every batch taken
    bitwise the one made in the training process."""
    config = DataConfig(objective="nsp", max_seq_length=64, masking="token")
    dataset = RunDataset(prepared, config, seed=2, micro_batch_size=4, rank=0, world_size=1)
    keys = [(epoch, m) for epoch in range(2) for m in range(20)]
    taken = list(iterate_micro_batches(dataset, keys, num_workers=2, pin_memory=False))
    assert len(taken) == len(keys)
    for key, batch in zip(keys, taken):
        assert_same(dataset[key], batch)


class CountCopies(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.copies = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.copies += func.__name__.startswith(("_to_copy", "copy_"))
        return func(*args, **(kwargs or {}))


def test_to_device_moves_a_packed_batch_in_one_copy_and_others_tensor_by_tensor(prepared):
    batch = first_batch(prepared)
    packed = PackedBatch.pack(batch).unpack()
    meta = torch.device("meta")  # a device this CPU has: shapes, dtypes and strides without data
    for value, copies in ((packed, 1), (batch, len(tensors(batch)))):
        with CountCopies() as counter:
            moved = to_device(value, meta)
        assert counter.copies == copies
        assert all(t.device == meta for t in tensors(moved))
        assert [(t.dtype, t.shape, t.stride()) for t in tensors(moved)] == \
            [(t.dtype, t.shape, t.stride()) for t in tensors(value)]
        assert host_values(moved) == host_values(value)
    assert to_device(batch, torch.device("cpu")) is batch  # already there


def test_a_moved_storage_holds_the_same_values_in_new_memory(prepared):
    packed = PackedBatch.pack(first_batch(prepared)).unpack()
    moved = move_storage(packed, tensors(packed)[0].untyped_storage(), torch.device("cpu"))
    assert_same(packed, moved)
    assert len(storages(moved)) == 1 and storages(moved).isdisjoint(storages(packed))


def test_a_view_of_a_larger_storage_is_moved_alone(prepared):
    """A tensor that is a slice of a large storage moves alone, not with the rest of its storage."""
    large = torch.arange(1000)
    with CountCopies() as counter:
        moved = to_device({"x": large[:10]}, torch.device("meta"))
    assert counter.copies == 1 and moved["x"].shape == (10,) and moved["x"].untyped_storage().nbytes() == 80
