"""A batch's tensors in one buffer, so that moving it costs one storage, not one per tensor: one shared-memory
transfer from a loader worker (rebuilding each of a batch's 14 tensors from a shared-memory file of its own took
the training process 0.9-1.5x the time of making the batch itself: benchmarks/loader_transfer.py), one page-locked
copy, one copy to the device. A loader worker writes its batches into shared buffers it keeps (WorkerSlots), so that
a buffer crosses to the training process once, not with every batch (SlotReceiver)."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from bertrain.batch_layout import map_tensors

ALIGN = 16  # bytes: each tensor starts at a multiple of every element size, so its typed view is legal


@dataclasses.dataclass(frozen=True)
class Slot:
    """Where one tensor of a packed batch lies in the buffer: its bytes from `offset`, contiguous."""

    offset: int
    dtype: torch.dtype
    shape: tuple[int, ...]


class PackedBatch:
    """A batch (dicts, dataclasses, lists of tensors and host values) as one uint8 buffer plus its skeleton: the
    same structure with a Slot where each tensor was. The thread that takes a worker's batch pins it (pin_memory())."""

    def __init__(self, buffer: torch.Tensor, skeleton: Any):
        self.buffer, self.skeleton = buffer, skeleton

    @classmethod
    def pack(cls, batch: Any, pin_memory: bool = False) -> "PackedBatch":
        """Copy every tensor of `batch` into one new buffer (page-locked if asked), each at an ALIGN-byte boundary."""
        tensors, slots, skeleton, size = _layout(batch)
        buffer = torch.empty(size, dtype=torch.uint8, pin_memory=pin_memory)
        _write(buffer, tensors, slots)
        return cls(buffer, skeleton)

    def pin_memory(self) -> "PackedBatch":
        return PackedBatch(self.buffer.pin_memory(), self.skeleton)

    def unpack(self) -> Any:
        """The batch again, its tensors views of the buffer (one storage: to_device copies it once)."""
        return map_tensors(self.skeleton, lambda slot: _view(self.buffer, slot), leaf=Slot)


def _layout(batch: Any) -> tuple[list[torch.Tensor], list[Slot], Any, int]:
    """(the batch's tensors, their Slots, the skeleton with a Slot for each, the bytes they take one after another)."""
    tensors, slots, size = [], [], 0

    def place(tensor: torch.Tensor) -> Slot:  # the skeleton and the layout in one walk through the batch
        nonlocal size
        size = -(-size // ALIGN) * ALIGN
        tensors.append(tensor)
        slots.append(Slot(size, tensor.dtype, tuple(tensor.shape)))
        size += tensor.numel() * tensor.element_size()
        return slots[-1]

    skeleton = map_tensors(batch, place)
    return tensors, slots, skeleton, size


def _write(buffer: torch.Tensor, tensors: list[torch.Tensor], slots: list[Slot]) -> None:
    for tensor, slot in zip(tensors, slots):
        _view(buffer, slot).copy_(tensor)


# Bytes at a slot buffer's end: the stamp, the task whose batch the buffer holds (-1 while a worker writes one).
STAMP = 8


@dataclasses.dataclass(frozen=True)
class SlotMessage:
    """What a loader worker sends for a batch it wrote into a slot: where to find it, its skeleton (PackedBatch's),
    and the slot's buffer itself only when the training process does not have it yet (first use, or grown)."""

    worker: int
    slot: int
    task: int
    size: int
    skeleton: Any
    buffer: torch.Tensor | None = None


class WorkerSlots:
    """A loader worker's shared-memory buffers by slot, kept and written again by each later task of that slot:
    sending a new shared buffer with every batch cost the training process a round trip to the worker for its file
    descriptor, as long as making the batch itself (benchmarks/loader_transfer.py)."""

    def __init__(self, worker: int):
        self.worker, self.buffers = worker, {}

    def put(self, batch: Any, slot: int, task: int) -> SlotMessage:
        tensors, slots, skeleton, size = _layout(batch)
        buffer, fresh = self.buffers.get(slot), False
        if buffer is None or buffer.numel() < size + STAMP:  # 25% more: batches' sizes vary a little
            buffer = self.buffers[slot] = torch.empty(-(-(size * 5 // 4) // STAMP) * STAMP + STAMP,
                                                      dtype=torch.uint8).share_memory_()
            fresh = True
        stamp = buffer[-STAMP:].view(torch.int64)
        stamp.fill_(-1)
        _write(buffer, tensors, slots)
        stamp.fill_(task)
        return SlotMessage(self.worker, slot, task, size, skeleton, buffer if fresh else None)


class SlotReceiver:
    """The training process's side of WorkerSlots: each worker's slot buffers, kept from the message that brought
    them; a batch copied out of its slot as it is taken (page-locked if asked), so that later tasks may reuse it."""

    def __init__(self):
        self.buffers: dict[tuple[int, int], torch.Tensor] = {}

    def take(self, message: SlotMessage, pin_memory: bool) -> PackedBatch:
        key = (message.worker, message.slot)
        if message.buffer is not None:
            self.buffers[key] = message.buffer
        buffer = self.buffers[key]
        written = buffer[:message.size]
        self._check(buffer, message)
        packed = PackedBatch(written, message.skeleton).pin_memory() if pin_memory else \
            PackedBatch(written.clone(), message.skeleton)
        self._check(buffer, message)  # not written over while copied
        return packed

    @staticmethod
    def _check(buffer: torch.Tensor, message: SlotMessage) -> None:
        found = int(buffer[-STAMP:].view(torch.int64))
        if found != message.task:
            raise RuntimeError(f"loader worker {message.worker}'s slot {message.slot} holds task {found} where task "
                               f"{message.task} was expected: a slot was written again before its batch was taken "
                               "(a bug: please report it; data.num_workers=0 makes batches without slots)")


def _tensors_in(batch: Any) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []
    map_tensors(batch, found.append)
    return found


def _view(buffer: torch.Tensor, slot: Slot) -> torch.Tensor:
    """The tensor of `slot` as a contiguous view of `buffer` (a uint8 tensor that starts its storage)."""
    return torch.empty(0, dtype=slot.dtype, device=buffer.device).set_(
        buffer.untyped_storage(), slot.offset // slot.dtype.itemsize, slot.shape)  # no stride given: contiguous


def to_device(batch: Any, device: torch.device, non_blocking: bool = False) -> Any:
    """`batch` with its tensors on `device`: in one copy when they fill one storage (PackedBatch.unpack's), else
    one by one."""
    tensors = _tensors_in(batch)
    if not tensors or all(tensor.device == device for tensor in tensors):
        return batch
    if fill_one_storage(tensors):
        return move_storage(batch, tensors[0].untyped_storage(), device, non_blocking)
    return map_tensors(batch, lambda tensor: tensor.to(device, non_blocking=non_blocking))


def fill_one_storage(tensors: list[torch.Tensor]) -> bool:
    """Whether the tensors are views of one storage that holds little else (a large one is not copied for them)."""
    storage = tensors[0].untyped_storage()
    used = sum(tensor.numel() * tensor.element_size() for tensor in tensors)
    return (all(tensor.untyped_storage().data_ptr() == storage.data_ptr() for tensor in tensors)
            and storage.nbytes() <= used + ALIGN * len(tensors))


def move_storage(batch: Any, storage: torch.UntypedStorage, device: torch.device, non_blocking: bool = False) -> Any:
    """`batch`, whose tensors are views of `storage`, as views of a copy of that storage on `device`."""
    whole = torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)
    whole = whole.to(device, non_blocking=non_blocking, copy=True)
    return map_tensors(batch, lambda tensor: torch.empty(0, dtype=tensor.dtype, device=whole.device).set_(
        whole.untyped_storage(), tensor.storage_offset(), tensor.shape, tensor.stride()))
