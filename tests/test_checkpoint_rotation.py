"""Removing old checkpoints survives a kill: rename to .del-step-* first, and the next run removes what a kill left
(.del-* dirs, and unmarked step-* dirs older than the newest valid checkpoint) with one line saying so."""

from __future__ import annotations

import contextlib
import io
import shutil
from types import SimpleNamespace

import pytest
from rich.console import Console

from bertrain import rundir
from bertrain.train.checkpoint import agree_on_checkpoint, begin_save, finish_save, remove_checkpoint
from tests.test_checkpoint import save


def start(run_dir, resume="auto"):
    """What a run's rank 0 does on start; returns the checkpoint chosen and the console's text."""
    out = io.StringIO()
    accelerator = SimpleNamespace(is_main_process=True, num_processes=1)
    with contextlib.ExitStack() as held:
        found = agree_on_checkpoint(accelerator, run_dir, resume, False, held, Console(file=out, width=400))
    return found, " ".join(out.getvalue().split())


def unmarked_step_dirs(run_dir):
    return [p.name for p in rundir.iter_checkpoints(run_dir) if not (p / rundir.MARKER).is_file()]


def test_removal_renames_first_so_no_half_deleted_checkpoint_is_ever_visible(tmp_path, monkeypatch):
    path = save(tmp_path, 1)
    deleted, real_rmtree = [], shutil.rmtree
    monkeypatch.setattr(shutil, "rmtree", lambda target, **kw: (deleted.append(target.name), real_rmtree(target, **kw)))
    remove_checkpoint(path)
    assert deleted == [".del-step-00000001"]
    assert not path.exists() and not list((tmp_path / "checkpoints").iterdir())
    remove_checkpoint(path)  # already gone: nothing to do
    assert deleted == [".del-step-00000001"]


def test_a_kill_during_rotation_leaves_only_a_hidden_dir_that_the_next_start_removes(tmp_path, monkeypatch):
    for step in (1, 2):
        save(tmp_path, step, keep_last=2)
    tmp = begin_save(tmp_path, 3)
    (tmp / "model.safetensors").write_bytes(b"weights3")
    real_rmtree = shutil.rmtree

    def killed_half_way(path, *args, **kwargs):  # deletes one file, then the process "dies"
        next(p for p in sorted(path.iterdir()) if p.is_file()).unlink()
        raise KeyboardInterrupt("kill -9 during rmtree")

    monkeypatch.setattr(shutil, "rmtree", killed_half_way)
    with pytest.raises(KeyboardInterrupt):
        finish_save(tmp, keep_last=2)
    monkeypatch.setattr(shutil, "rmtree", real_rmtree)

    checkpoints = tmp_path / "checkpoints"
    assert [p.name for p in rundir.iter_checkpoints(tmp_path)] == ["step-00000003", "step-00000002"]
    assert unmarked_step_dirs(tmp_path) == []  # before the change: step-00000001 without COMPLETE
    assert (checkpoints / ".del-step-00000001").is_dir()
    found, text = start(tmp_path)
    assert found == checkpoints / "step-00000003"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step-00000002", "step-00000003"]
    assert f"Removed what interrupted checkpoint removals left in {checkpoints}: .del-step-00000001 (" in text
    assert "Skipping invalid checkpoint" not in text


def test_start_removes_older_unmarked_step_dirs_and_del_dirs_and_keeps_a_newer_unmarked_one(tmp_path):
    old = save(tmp_path, 10)
    (old / rundir.MARKER).unlink()  # what a kill inside the previous remove_checkpoint left
    (old / rundir.WEIGHTS).write_bytes(b"x" * 3000)
    (old / rundir.CHECKSUMS).unlink()
    good = save(tmp_path, 20)
    newer = save(tmp_path, 30)
    (newer / rundir.MARKER).unlink()  # a save that died half-way: reported, not removed
    stale = tmp_path / "checkpoints" / ".del-step-00000005"
    stale.mkdir()
    (stale / "optimizer.safetensors").write_bytes(b"y" * 2048)
    interrupted = begin_save(tmp_path, 40)

    found, text = start(tmp_path)
    assert found == good
    assert not old.exists() and not stale.exists()
    assert newer.is_dir() and interrupted.is_dir()
    assert (f"Removed what interrupted checkpoint removals left in {tmp_path / 'checkpoints'}: "
            f".del-step-00000005 (2.0 KB), step-00000010 (3.") in text
    assert f"Skipping invalid checkpoint {newer}: no COMPLETE marker" in text
    assert text.count("Removed") == 1
    _, again = start(tmp_path)  # nothing left to remove: no line
    assert "Removed" not in again


def test_a_run_that_stops_deletes_nothing_and_one_without_checkpoints_loses_only_del_dirs(tmp_path):
    unmarked = save(tmp_path, 1)
    (unmarked / rundir.MARKER).unlink()
    stale = tmp_path / "checkpoints" / ".del-step-00000000"
    stale.mkdir()
    with pytest.raises(rundir.NoValidCheckpoint, match="Nothing was loaded, changed or deleted"):
        start(tmp_path)
    assert unmarked.is_dir() and stale.is_dir()
    shutil.rmtree(unmarked)  # no step-* at all now: a fresh start
    found, text = start(tmp_path)
    assert found is None and not stale.exists() and ".del-step-00000000 (0 B)" in text
