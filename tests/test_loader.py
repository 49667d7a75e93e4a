"""Loaders: determinism across workers, O(1) resume, rank sharding, validation, `inspect --pairs`."""

from __future__ import annotations

import dataclasses
import io
import os
import threading

import numpy as np
import pytest
import torch

from bertrain.batch_buffer import PackedBatch
from bertrain.batch_layout import IGNORE_INDEX, map_tensors
from bertrain.config import DataConfig, load_config
from bertrain.data import loader as loader_module
from bertrain.data.format import open_prepared
from bertrain.data.loader import (RunDataset, build_train_loader, build_validation_loader, iterate_micro_batches,
                                  num_micro_batches)
from bertrain.errors import UsageError
from bertrain.train.stream import TrainStream
from tests.helpers import make_prepared_dir

FIELDS = ("input_ids", "attention_mask", "token_type_ids", "labels")


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    return open_prepared(make_prepared_dir(tmp_path_factory.mktemp("loader") / "data", kind="unigram",
                                           num_documents=120, seed=2, max_paragraphs=1500))


def config(**changes) -> DataConfig:
    return DataConfig(**{"objective": "sop", "max_seq_length": 64, "masking": "ngram", **changes})


def train_batches(prepared, data_config, *, micro_batch_size=8, rank=0, world_size=1, start=0, epoch=0, seed=3):
    return list(build_train_loader(prepared, data_config, seed=seed, epoch=epoch, micro_batch_size=micro_batch_size,
                                   rank=rank, world_size=world_size, start_micro_batch=start))


def tensors(value) -> list:
    """The tensors in a batch value, its BatchLayout's included, in order."""
    found = []
    map_tensors(value, found.append)
    return found


def assert_same_batches(left, right):
    assert len(left) == len(right)
    for a, b in zip(left, right):
        assert a.keys() == b.keys()
        for key in a:
            assert all(torch.equal(x, y) for x, y in zip(tensors(a[key]), tensors(b[key]), strict=True)), key


def rows(batch) -> list[tuple]:
    """Each instance's unpadded content (padding width depends on the micro-batch, content must not)."""
    out = []
    for i in range(len(batch["input_ids"])):
        length = int(batch["attention_mask"][i].sum())
        out.append(tuple(tuple(batch[k][i, :length].tolist()) for k in FIELDS)
                   + (int(batch["sentence_label"][i]) if "sentence_label" in batch else None,))
    return out


def test_batch_fields_types_and_padding(prepared):
    batch = train_batches(prepared, config(), micro_batch_size=8)[0]
    assert set(batch) == {*FIELDS, "sentence_label", "layout"}
    assert all(batch[key].dtype == torch.int64 for key in (*FIELDS, "sentence_label"))
    width = batch["input_ids"].shape[1]
    assert width % 8 == 0 and width <= 64
    assert width - 8 < int(batch["attention_mask"].sum(1).max()) <= width
    assert (batch["labels"][batch["attention_mask"] == 0] == IGNORE_INDEX).all()
    none = train_batches(prepared, config(objective="none"), micro_batch_size=8)[0]
    assert "sentence_label" not in none and (none["token_type_ids"] == 0).all()


@pytest.mark.multiprocess
def test_same_batches_with_0_1_and_2_workers(prepared):
    reference = train_batches(prepared, config(), micro_batch_size=16)[:6]
    for workers in (1, 2):
        loader = build_train_loader(prepared, config(num_workers=workers), seed=3, epoch=0, micro_batch_size=16,
                                    rank=0, world_size=1)
        loader.stop = 6                                     # the first six micro-batches are enough
        assert_same_batches(reference, list(loader))


def test_loader_started_at_step_k_equals_the_uninterrupted_tail(prepared):
    full = train_batches(prepared, config(), micro_batch_size=8)
    assert len(full) > 20
    for k in (1, 7, len(full) - 1, len(full)):
        assert_same_batches(full[k:], train_batches(prepared, config(), micro_batch_size=8, start=k))
    with pytest.raises(UsageError):
        train_batches(prepared, config(), micro_batch_size=8, start=len(full) + 1)


def test_resume_does_not_touch_consumed_batches(prepared, monkeypatch):
    built = []
    original = loader_module.MicroBatchDataset.__getitem__
    monkeypatch.setattr(loader_module.MicroBatchDataset, "__getitem__",
                        lambda self, m: built.append(m) or original(self, m))
    loader = build_train_loader(prepared, config(), seed=3, epoch=0, micro_batch_size=8, rank=0, world_size=1,
                                start_micro_batch=30)
    next(iter(loader))
    assert built == [30]


def test_two_ranks_cover_what_one_rank_covers(prepared):
    data_config = config(objective="nsp", masking="whole_word")
    one = train_batches(prepared, data_config, micro_batch_size=8, world_size=1, epoch=1)
    two = [train_batches(prepared, data_config, micro_batch_size=4, rank=r, world_size=2, epoch=1) for r in (0, 1)]
    counts = {len(one), len(two[0]), len(two[1])}
    assert len(counts) == 1                                  # equal counts on every rank
    assert num_micro_batches(prepared, data_config, seed=3, epoch=1, micro_batch_size=4, world_size=2) == len(one)
    for single, first, second in zip(one, *two):
        assert rows(single) == rows(first) + rows(second)    # 2 ranks x B == 1 rank x 2B, masks included


def test_rank_shards_are_disjoint_complete_and_drop_only_the_tail(prepared):
    data_config = config()
    plan = loader_module.epoch_plan(prepared, data_config, seed=3, epoch=0)
    for world_size in (1, 2, 3):
        micro = 5
        count = num_micro_batches(prepared, data_config, seed=3, epoch=0, micro_batch_size=micro, world_size=world_size)
        global_batch = micro * world_size
        assert count * global_batch <= len(plan) < (count + 1) * global_batch
        seen = []
        for rank in range(world_size):
            loader = build_train_loader(prepared, data_config, seed=3, epoch=0, micro_batch_size=micro, rank=rank,
                                        world_size=world_size)
            assert len(loader) == count
            seen += [p for m in range(count) for p in loader.dataset.positions(m).tolist()]
        assert sorted(seen) == list(range(count * global_batch))


def test_epochs_differ_and_repeat_exactly(prepared):
    first = train_batches(prepared, config(), epoch=0)[:3]
    loader_module._plans.clear()                             # a fresh process would rebuild the plan
    again = train_batches(prepared, config(), epoch=0)[:3]
    assert_same_batches(first, again)
    other = train_batches(prepared, config(), epoch=1)[:3]
    assert rows(other[0]) != rows(first[0])


def test_validation_loader_has_fixed_masks_and_uses_the_validation_split(prepared):
    data_config = config(objective="nsp")
    def run():
        return list(build_validation_loader(prepared, data_config, seed=3, micro_batch_size=4, rank=0, world_size=1,
                                            max_batches=3))
    first = run()
    train_batches(prepared, data_config, epoch=2)           # training in between changes nothing
    assert len(first) == 3
    assert_same_batches(first, run())
    plan = loader_module.epoch_plan(prepared, data_config, seed=3, epoch=0, split="validation")
    validation_tokens = prepared.split("validation").num_tokens
    assert (plan.a_start + plan.a_length <= validation_tokens).all()
    everything = build_validation_loader(prepared, data_config, seed=3, micro_batch_size=4, rank=0, world_size=1,
                                         max_batches=None)
    assert len(everything) == len(plan) // 4


def test_inspect_pairs_prints_instances_and_realized_statistics(prepared):
    from rich.console import Console

    from bertrain.data.inspect_pairs import MIN_STATISTICS_TOKENS, show_pairs

    full = load_config("tiny_albert", ["train.batch_size=16"])
    out = io.StringIO()
    stats = show_pairs(prepared.path, full, 4, Console(file=out, width=120))
    text = out.getvalue()
    assert "[MASK]" in text and "[SEP]" in text and "SOP positive fraction" in text
    # At least 4 batches of 16 and MIN_STATISTICS_TOKENS tokens, or the whole epoch when it is smaller.
    epoch = len(loader_module.epoch_plan(prepared, dataclasses.replace(full.data, path=str(prepared.path)),
                                         seed=full.train.seed, epoch=0))
    assert stats["instances"] >= 64
    assert stats["tokens"] >= MIN_STATISTICS_TOKENS or stats["instances"] >= epoch // 16 * 16
    assert 0.05 < stats["masked_fraction_of_eligible"] < 0.25
    assert 0.6 < stats["mask_share"] < 0.95
    assert 0.0 <= stats["padding_fraction"] < 0.5
    np.testing.assert_allclose(stats["mask_share"] + stats["random_share"] + stats["unchanged_share"], 1.0)


def test_inspect_pairs_through_the_cli(prepared, run_cli, tmp_path):
    config_file = tmp_path / "c.yaml"
    config_file.write_text("data:\n  objective: nsp\n  max_seq_length: 64\n  masking: whole_word\n"
                           "train:\n  batch_size: 8\n")
    code, out, err = run_cli("inspect", str(prepared.path), "--pairs", "--config", str(config_file), "--batches", "2")
    assert code == 0, err
    assert "NSP positive fraction" in out and "[MASK]" in out


def test_dataset_pickles_without_its_token_arrays(prepared):
    import pickle

    loader = build_train_loader(prepared, config(), seed=3, epoch=0, micro_batch_size=8, rank=0, world_size=1)
    blob = pickle.dumps(loader.dataset)                     # what a spawn/forkserver worker receives
    assert len(blob) < 64 * len(loader.dataset.plan) + 200_000
    assert_same_batches([loader.dataset[5]], [pickle.loads(blob)[5]])


def stream_batches(prepared, data_config, count, *, micro_batch=0):
    stream = TrainStream(prepared, data_config, seed=3, micro_batch_size=8, rank=0, world_size=1, epoch=0,
                         micro_batch=micro_batch)
    return [stream.next() for _ in range(count)], (stream.epoch, stream.micro_batch)


def test_stream_crosses_epochs_with_the_same_batches_and_workers_as_one_loader_per_epoch(prepared, monkeypatch):
    data_config = config(num_workers=2)
    per_epoch = num_micro_batches(prepared, data_config, seed=3, epoch=0, micro_batch_size=8, world_size=1)
    expected = train_batches(prepared, config(), start=per_epoch - 3) + train_batches(prepared, config(), epoch=1)[:4]
    original = loader_module.RunDataset.__getitem__

    def remember_worker(self, key):  # runs in the worker process; the pid travels back in the batch
        return {**original(self, key), "pid": torch.tensor(os.getpid())}

    monkeypatch.setattr(loader_module.RunDataset, "__getitem__", remember_worker)
    batches, position = stream_batches(prepared, data_config, 7, micro_batch=per_epoch - 3)
    pids = {int(batch.pop("pid")) for batch in batches}
    assert_same_batches(batches, expected)
    assert position == (1, 4)
    assert len(pids) == 2 and os.getpid() not in pids  # the same two workers before and after the epoch's end


def test_closing_the_stream_stops_its_workers_at_once(prepared):
    import multiprocessing

    stream = TrainStream(prepared, config(num_workers=2), seed=3, micro_batch_size=8, rank=0, world_size=1, epoch=0,
                         micro_batch=0)
    earlier = set(multiprocessing.active_children())  # other tests' streams may still have theirs
    stream.next()
    workers = set(multiprocessing.active_children()) - earlier
    assert len(workers) == 2
    stream.close()  # without it the workers live on until garbage collection, at the latest at exit
    assert not any(worker.is_alive() for worker in workers)
    stream.close()  # twice is harmless


def test_stream_resumed_mid_run_equals_the_uninterrupted_stream(prepared):
    per_epoch = num_micro_batches(prepared, config(), seed=3, epoch=0, micro_batch_size=8, world_size=1)
    whole, _ = stream_batches(prepared, config(), per_epoch + 2)
    tail, _ = stream_batches(prepared, config(), 4, micro_batch=per_epoch - 2)
    assert_same_batches(whole[-4:], tail)


def test_the_training_stream_makes_batches_in_process_under_auto_on_any_device(prepared):
    streams = [TrainStream(prepared, config(num_workers=setting), seed=3, micro_batch_size=8, rank=0, world_size=1,
                           epoch=0, micro_batch=0, device_type=device)
               for device, setting in (("cpu", "auto"), ("cuda", "auto"), ("cuda", 2))]
    assert [stream.workers.count for stream in streams] == [0, 0, 2]
    assert [stream.pin_memory for stream in streams] == [False, True, True]


def test_unprepared_data_gets_the_command_that_prepares_it_never_one_that_writes_over_it(tmp_path):
    """A raw file or folder given as --data is sent to `prepare --source`, an unfinished prepare to its rerun."""
    from bertrain.data.format import PREPARE_WORK
    from bertrain.errors import DataError

    raw = tmp_path / "corpus.jsonl"
    raw.write_text('{"text": "A sentence."}\n')
    with pytest.raises(DataError, match=r"is a file, not a prepared DATA_DIR.*--source .*corpus.jsonl --out DATA_DIR"):
        open_prepared(raw)
    folder = tmp_path / "texts"
    folder.mkdir()
    with pytest.raises(DataError, match=r"not a prepared DATA_DIR.*--source .*texts --out DATA_DIR"):
        open_prepared(folder)
    (folder / PREPARE_WORK).mkdir()
    with pytest.raises(DataError, match="did not finish.*Run the same prepare command again"):
        open_prepared(folder)


def test_a_workers_batch_is_pinned_by_the_thread_that_takes_it(prepared, monkeypatch):
    """With loader workers and a GPU, the training thread pins each batch itself (DataLoader's pin thread ran beside
    the thread that launches the kernels and cost the H200's loop host time); the batches are the in-process ones."""
    pinned_by = []

    def pin_memory(self):  # a CPU cannot page-lock: record who pins, and hand back a copy as pin_memory() would
        pinned_by.append(threading.get_ident())
        return PackedBatch(self.buffer.clone(), self.skeleton)

    monkeypatch.setattr(PackedBatch, "pin_memory", pin_memory)
    dataset = RunDataset(prepared, config(), seed=3, micro_batch_size=8, rank=0, world_size=1)
    keys = [(0, m) for m in range(5)]
    taken = list(iterate_micro_batches(dataset, keys, num_workers=2, pin_memory=True))
    assert pinned_by == [threading.get_ident()] * 5
    assert_same_batches(taken, [dataset[key] for key in keys])
