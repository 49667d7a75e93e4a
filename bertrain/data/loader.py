"""Training and validation batches: resumable, rank-sharded, deterministic. The last incomplete global micro-batch
is dropped (uneven counts stall DDP); item m is a pure function of (data, config, seed, epoch, m, rank)."""

from __future__ import annotations

import dataclasses
import signal
from collections import OrderedDict
from pathlib import Path
from typing import Any, Iterable, Iterator

import numpy as np

from bertrain.batch_buffer import PackedBatch, SlotMessage, SlotReceiver, WorkerSlots
from bertrain.data.format import PreparedData, open_prepared
from bertrain.data.masking import (AssembledBatch, Collator, MaskingSettings, instance_keys, sentence_final_table,
                                   word_start_table)
from bertrain.data.pairs import EpochPlan, build_plan
from bertrain.data.split_index import SplitIndex, gather_tokens, index_split, read_bits, read_spans, read_values
from bertrain.data.workers import worker_count, worker_died_error
from bertrain.errors import DataError, UsageError

_KEY_STREAMS = {"train": 1, "validation": 2}
VALIDATION_EPOCH = 0     # the validation plan and masks are those of "epoch 0" of the validation split
_plans: OrderedDict = OrderedDict()
_indexes: OrderedDict = OrderedDict()
_word_starts: OrderedDict = OrderedDict()


def _remember(cache: OrderedDict, key: tuple, build, size: int) -> Any:
    if key in cache:
        cache.move_to_end(key)
        return cache[key]
    value = cache[key] = build()
    while len(cache) > size:
        cache.popitem(last=False)
    return value


def split_index(prepared: PreparedData, split: str) -> SplitIndex:
    """The global offset index of a split (cached per data directory and fingerprint)."""
    key = (str(Path(prepared.path).resolve()), prepared.fingerprint, split)
    return _remember(_indexes, key, lambda: index_split(prepared.split(split)), size=4)


def nsp_split_index(prepared: PreparedData, split: str) -> SplitIndex:
    """The split index with which sentences end on . ! ? (an NSP negative's B ends like the positive's)."""
    def build() -> SplitIndex:
        index = split_index(prepared, split)
        if not index.num_sentences:
            return dataclasses.replace(index, sentence_final=np.zeros(0, bool))
        table = sentence_final_table(prepared.tokenizer_dir, prepared.vocab_size)
        last = gather_tokens([shard.tokens for shard in prepared.split(split).shards], index.token_base,
                             np.maximum(index.sentence_cum[1:] - 1, 0))
        return dataclasses.replace(index, sentence_final=table[last] & (np.diff(index.sentence_cum) > 0))
    key = (str(Path(prepared.path).resolve()), prepared.fingerprint, split, "nsp")
    return _remember(_indexes, key, build, size=4)


def epoch_plan(prepared: PreparedData, data_config, *, seed: int, epoch: int, split: str = "train") -> EpochPlan:
    """The (cached) plan of an epoch: built once, shared by num_micro_batches and the loaders."""
    key = (str(Path(prepared.path).resolve()), prepared.fingerprint, split, data_config.objective,
           data_config.max_seq_length, data_config.short_seq_prob, seed, epoch)
    index = nsp_split_index if data_config.objective == "nsp" else split_index
    return _remember(_plans, key, lambda: build_plan(
        index(prepared, split), objective=data_config.objective, max_seq_length=data_config.max_seq_length,
        short_seq_prob=data_config.short_seq_prob, seed=seed, epoch=epoch, split=split), size=3)


def masking_settings(prepared: PreparedData, data_config) -> MaskingSettings:
    """Masking settings from the config, with vocab, [MASK] id and word starts from the prepared data."""
    word_start = None
    if data_config.masking != "token":
        tokenizer = prepared.manifest.get("tokenizer", {})
        key = (str(Path(prepared.path).resolve()), prepared.fingerprint)
        word_start = _remember(_word_starts, key, lambda: word_start_table(
            prepared.tokenizer_dir / "tokenizer.json", tokenizer.get("kind"), tokenizer.get("word_marker"),
            prepared.vocab_size), size=2)
    return MaskingSettings(vocab_size=prepared.vocab_size, mask_token_id=prepared.special_tokens["mask"],
                           masking=data_config.masking, mlm_probability=data_config.mlm_probability,
                           mask_prob=data_config.mask_prob, random_prob=data_config.random_prob,
                           ngram_max=data_config.ngram_max, max_predictions_per_seq=data_config.max_predictions_per_seq,
                           word_start=word_start)


def _check_ranks(micro_batch_size: int, rank: int, world_size: int) -> None:
    if micro_batch_size < 1:
        raise UsageError(f"The micro-batch size must be at least 1, got {micro_batch_size}.")
    if world_size < 1 or not 0 <= rank < world_size:
        raise UsageError(f"Rank {rank} is not in a world of {world_size} process(es).")


class MicroBatchDataset:
    """Map-style dataset: item m is this rank's part of global micro-batch m of one epoch."""

    def __init__(self, prepared: PreparedData, data_config, plan: EpochPlan, settings: MaskingSettings, *,
                 split: str, seed: int, epoch: int, micro_batch_size: int, rank: int, world_size: int):
        self.data_path = prepared.path
        self.split_name = split
        self.plan = plan
        self.collator = Collator(settings)
        self.special_tokens = prepared.special_tokens
        self.pairs = data_config.objective != "none"
        self.max_seq_length = data_config.max_seq_length
        self.multiple = max(data_config.pad_to_multiple_of, 1)
        self.seed, self.epoch = seed, epoch
        self.micro_batch_size, self.rank, self.world_size = micro_batch_size, rank, world_size
        self.token_base = split_index(prepared, split).token_base
        # Word units stored by prepare (format 2) when the masking needs them; else the tokenizer's marks.
        self.stored_word_starts = settings.masking != "token" and prepared.has_word_starts
        self._open(prepared)

    def _open(self, prepared: PreparedData) -> None:
        shards = prepared.split(self.split_name).shards
        self._tokens = [shard.tokens for shard in shards]
        self._word_starts = [shard.word_starts for shard in shards] if self.stored_word_starts else None

    def __len__(self) -> int:
        return len(self.plan) // (self.micro_batch_size * self.world_size)

    def __getstate__(self) -> dict:
        # Worker processes reopen the memory maps instead of receiving a copy of the tokens.
        return {k: v for k, v in self.__dict__.items() if k not in ("_tokens", "_word_starts")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._open(open_prepared(self.data_path))

    def positions(self, micro_batch: int) -> np.ndarray:
        """[B] positions in the epoch order of this rank's instances of a micro-batch."""
        first = micro_batch * self.micro_batch_size * self.world_size + self.rank * self.micro_batch_size
        return np.arange(first, first + self.micro_batch_size, dtype=np.int64)

    def assemble(self, positions: np.ndarray) -> AssembledBatch:
        """[CLS] A [SEP] B [SEP] (or [CLS] A [SEP]) of each instance, padded to a multiple of 8."""
        plan, ids = self.plan, self.plan.order[positions]
        a_start, a_length = plan.a_start[ids], plan.a_length[ids].astype(np.int64)
        b_start, b_length = plan.b_start[ids], plan.b_length[ids].astype(np.int64)
        length = a_length + 2 + (b_length + 1 if self.pairs else 0)                  # [B]
        width = -(-int(length.max()) // self.multiple) * self.multiple
        width = min(width, max(self.max_seq_length, int(length.max())))           # never past the position table
        rows = np.arange(len(ids))
        # The text as spans (A, then B, of each row), read span by span and written to their flat [B * T] places.
        if self.pairs:
            starts, lengths = np.stack([a_start, b_start], 1).ravel(), np.stack([a_length, b_length], 1).ravel()
            places = np.stack([rows * width + 1, rows * width + a_length + 2], 1).ravel()
        else:
            starts, lengths, places = a_start, a_length, rows * width + 1
        input_ids = np.full((len(ids), width), self.special_tokens["pad"], dtype=np.int64)
        targets = [(self._tokens, input_ids.reshape(-1), read_values)]
        word_start = None
        if self._word_starts is not None:
            word_start = np.zeros(input_ids.shape, dtype=bool)
            targets.append((self._word_starts, word_start.reshape(-1), read_bits))
        text_at = read_spans(self.token_base, starts, lengths, places, targets)
        special = np.ones(input_ids.shape, dtype=bool)
        special.reshape(-1)[text_at] = False
        input_ids[:, 0] = self.special_tokens["cls"]
        input_ids[rows, a_length + 1] = self.special_tokens["sep"]
        if self.pairs:
            input_ids[rows, length - 1] = self.special_tokens["sep"]
        column = np.arange(width)[None, :]                                         # [1, T]
        attention = column < length[:, None]
        token_type = (attention & (column >= (a_length + 2)[:, None])).astype(np.int64) if self.pairs \
            else np.zeros_like(input_ids)
        keys = instance_keys(self.seed, _KEY_STREAMS[self.split_name], self.epoch, positions)
        label = plan.sentence_label[ids] if self.pairs else None
        return AssembledBatch(input_ids, token_type, attention, special, label, keys, word_start)

    def __getitem__(self, micro_batch: int) -> dict[str, Any]:
        if not 0 <= micro_batch < len(self):
            raise IndexError(f"micro-batch {micro_batch} is outside 0..{len(self) - 1}")
        return self.collator(self.assemble(self.positions(micro_batch)))


class MicroBatchLoader:
    """Iterates micro-batches start..stop-1 of a MicroBatchDataset, in-process or with workers."""

    def __init__(self, dataset: MicroBatchDataset, start: int, stop: int, num_workers: int = 0):
        self.dataset, self.start, self.stop, self.num_workers = dataset, start, stop, num_workers

    def __len__(self) -> int:
        return max(self.stop - self.start, 0)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        if len(self) == 0:
            return iter(())
        return iterate_micro_batches(self.dataset, range(self.start, self.stop), self.num_workers, pin_memory=False)


# DataLoader sends a worker a task only as it hands a batch over: at most PREFETCH x workers tasks are sent and not yet
# taken, so a slot's next task comes 2 x workers tasks after its batch was copied out (and DataLoader's round robin
# gives each slot one worker: 6 buffers a worker)
PREFETCH = 4
SLOTS_PER_WORKER = PREFETCH + 2


def iterate_micro_batches(dataset, keys: Iterable, num_workers: int, pin_memory: bool) -> Iterator[dict[str, Any]]:
    """dataset[key] for each key, in-process or from `num_workers` workers (prefetching 4), pinned if asked. A
    worker's batch, or a pinned one, comes as views of one buffer (PackedBatch): one storage to copy. A worker writes
    its batches into shared buffers it keeps (slots, batch_buffer.WorkerSlots), which this thread copies them out of
    (and page-locks) as it takes them: DataLoader's pin thread ran beside the one that launches the kernels, and with
    it the H200's bert_large loop took 74 instead of 64 ms of host time a step in train_step."""
    if num_workers <= 0:
        for key in keys:
            batch = dataset[key]
            yield PackedBatch.pack(batch, pin_memory=True).unpack() if pin_memory else batch
        return
    from torch.utils.data import DataLoader  # seconds to import: in-process loading does not need it

    # batch_size=None: each item already is a micro-batch; the sampler is the tasks (key, slot, task number).
    slots = SLOTS_PER_WORKER * num_workers
    tasks = ((key, task % slots, task) for task, key in enumerate(keys))
    loader = DataLoader(SlotItems(dataset), batch_size=None, sampler=tasks, num_workers=num_workers,
                        persistent_workers=True, prefetch_factor=PREFETCH, worker_init_fn=ignore_ctrl_c)
    receiver = SlotReceiver()
    try:
        for message in loader:
            yield receiver.take(message, pin_memory).unpack()
    except RuntimeError as error:  # torch's words for a worker killed (a bus error: /dev/shm full) or gone
        if "DataLoader worker (pid" not in str(error):
            raise
        raise worker_died_error(error) from None


class SlotItems:
    """dataset[key] written by the worker that makes it into the slot its task names (WorkerSlots)."""

    def __init__(self, dataset):
        self.dataset, self.slots = dataset, None

    def __getitem__(self, task: tuple[Any, int, int]) -> SlotMessage:
        key, slot, number = task
        if self.slots is None:  # in the worker: its own buffers
            from torch.utils.data import get_worker_info

            self.slots = WorkerSlots(get_worker_info().id)
        return self.slots.put(self.dataset[key], slot, number)


def ignore_ctrl_c(worker_id: int = 0) -> None:
    """In a loader worker: a Ctrl-C reaches the terminal's whole process group, workers included; the training
    process finishes its step and saves, and needs its workers alive (and silent) until then."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class RunDataset:
    """This rank's training micro-batches of every epoch, item (epoch, m) = micro-batch m of that epoch: one
    dataset for a whole run, so that worker processes live across epochs (each builds an epoch's plan, cached,
    when it first meets the epoch)."""

    def __init__(self, prepared: PreparedData, data_config, *, seed: int, micro_batch_size: int, rank: int,
                 world_size: int):
        _check_ranks(micro_batch_size, rank, world_size)
        self.prepared, self.data_config, self.seed = prepared, data_config, seed
        self.micro_batch_size, self.rank, self.world_size = micro_batch_size, rank, world_size
        self._epoch: MicroBatchDataset | None = None

    def __getitem__(self, key: tuple[int, int]) -> dict[str, Any]:
        epoch, micro_batch = key
        if self._epoch is None or self._epoch.epoch != epoch:
            self._epoch = train_dataset(self.prepared, self.data_config, seed=self.seed, epoch=epoch,
                                        micro_batch_size=self.micro_batch_size, rank=self.rank,
                                        world_size=self.world_size)
        return self._epoch[micro_batch]

    def __getstate__(self) -> dict:
        # Worker processes reopen the prepared data (memory maps) instead of receiving a copy.
        return {**{k: v for k, v in self.__dict__.items() if k not in ("prepared", "_epoch")},
                "data_path": self.prepared.path}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.prepared, self._epoch = open_prepared(self.__dict__.pop("data_path")), None


def num_micro_batches(prepared: PreparedData, data_config, *, seed: int, epoch: int, micro_batch_size: int,
                      world_size: int) -> int:
    """Micro-batches per rank in an epoch (the same on every rank)."""
    _check_ranks(micro_batch_size, 0, world_size)
    return len(epoch_plan(prepared, data_config, seed=seed, epoch=epoch)) // (micro_batch_size * world_size)


def epoch_tokens(prepared: PreparedData, data_config, *, seed: int, epoch: int, instances: int) -> int:
    """Tokens an epoch's first `instances` instances train on (special tokens included: what a step counts), from
    its plan: NSP's negatives and re-read segments make it differ from the split's size by 25% or more."""
    plan = epoch_plan(prepared, data_config, seed=seed, epoch=epoch)
    used = plan.order[:instances]
    specials = 2 if data_config.objective == "none" else 3  # [CLS] A [SEP], or [CLS] A [SEP] B [SEP]
    return int(plan.a_length[used].sum()) + int(plan.b_length[used].sum()) + specials * len(used)


def train_dataset(prepared: PreparedData, data_config, *, seed: int, epoch: int, micro_batch_size: int, rank: int,
                  world_size: int) -> MicroBatchDataset:
    """This rank's micro-batches of an epoch as a map-style dataset; refuses an epoch with none."""
    _check_ranks(micro_batch_size, rank, world_size)
    plan = epoch_plan(prepared, data_config, seed=seed, epoch=epoch)
    dataset = MicroBatchDataset(prepared, data_config, plan, masking_settings(prepared, data_config), split="train",
                                seed=seed, epoch=epoch, micro_batch_size=micro_batch_size, rank=rank,
                                world_size=world_size)
    if len(dataset) == 0:
        raise empty_epoch_error(prepared, len(plan), micro_batch_size, world_size)
    return dataset


class EmptyEpochError(DataError):
    """A training epoch with no complete global micro-batch: less data than one micro-batch (`pretrain --dry-run`
    prints its plan before this error)."""


def empty_epoch_error(prepared: PreparedData, instances: int, micro_batch_size: int,
                      world_size: int) -> EmptyEpochError:
    """The error for a training epoch with no complete global micro-batch (the trainer's and the loader's)."""
    return EmptyEpochError(f"{prepared.path}: the training split yields no complete micro-batch of {micro_batch_size} "
                           f"x {world_size} instances (it has {instances}). Use a smaller train.batch_size or more "
                           f"data.")


def build_train_loader(prepared: PreparedData, data_config, *, seed: int, epoch: int, micro_batch_size: int,
                       rank: int, world_size: int, start_micro_batch: int = 0) -> MicroBatchLoader:
    """This rank's micro-batches of an epoch from `start_micro_batch` in O(1), for CPU-side tools."""
    dataset = train_dataset(prepared, data_config, seed=seed, epoch=epoch, micro_batch_size=micro_batch_size,
                            rank=rank, world_size=world_size)
    total = len(dataset)
    if not 0 <= start_micro_batch <= total:
        raise UsageError(f"Cannot start epoch {epoch} at micro-batch {start_micro_batch}: it has {total}.")
    return MicroBatchLoader(dataset, start_micro_batch, total, worker_count(data_config.num_workers))


def build_validation_loader(prepared: PreparedData, data_config, *, seed: int, micro_batch_size: int, rank: int,
                            world_size: int, max_batches: int | None) -> MicroBatchLoader:
    """Up to `max_batches` validation micro-batches with fixed masks (identical every evaluation).
    Empty (len 0) when the data has no validation documents. `num_workers: auto` is 0 here: workers would
    start anew for a few batches at every evaluation."""
    _check_ranks(micro_batch_size, rank, world_size)
    entry = prepared.manifest.get("splits", {}).get("validation")
    empty = MicroBatchLoader(None, 0, 0)  # type: ignore[arg-type]
    if not entry or not entry.get("documents"):
        return empty
    plan = epoch_plan(prepared, data_config, seed=seed, epoch=VALIDATION_EPOCH, split="validation")
    dataset = MicroBatchDataset(prepared, data_config, plan, masking_settings(prepared, data_config),
                                split="validation", seed=seed, epoch=VALIDATION_EPOCH,
                                micro_batch_size=micro_batch_size, rank=rank, world_size=world_size)
    stop = len(dataset) if max_batches is None else min(len(dataset), max_batches)
    return MicroBatchLoader(dataset, 0, stop, worker_count(data_config.num_workers))
