"""The run directory: atomic checkpoints (marker + checksums), the newest valid one, rotation, resolving
a RUN_DIR or checkpoint path, and the run's tokenizer."""

from __future__ import annotations

import json

import pytest

from bertrain import rundir
from bertrain.errors import DataError, UsageError
from bertrain.train.checkpoint import begin_save, finish_save


def save(run_dir, step, keep_last=None, payload=b"weights"):
    tmp = begin_save(run_dir, step)
    (tmp / "model.safetensors").write_bytes(payload + str(step).encode())
    (tmp / "config.yaml").write_text("model: {}\n")
    (tmp / "train_state.json").write_text(json.dumps({"step": step}))
    return finish_save(tmp, keep_last)


def test_save_is_complete_and_verified(tmp_path):
    path = save(tmp_path, 1000)
    assert path == tmp_path / "checkpoints" / "step-00001000"
    assert sorted(p.name for p in path.iterdir()) == ["COMPLETE", "checksums.json", "config.yaml",
                                                      "model.safetensors", "train_state.json"]
    assert set(json.loads((path / "checksums.json").read_text())) == {"config.yaml", "model.safetensors",
                                                                      "train_state.json"}
    assert rundir.verify_checkpoint(path) is None
    assert rundir.find_latest_checkpoint(tmp_path) == path
    assert not list((tmp_path / "checkpoints").glob(".tmp-*"))


def test_latest_skips_damaged_incomplete_and_interrupted_saves(tmp_path):
    good = save(tmp_path, 10)
    damaged = save(tmp_path, 20)
    (damaged / "model.safetensors").write_bytes(b"flipped bits")
    unmarked = save(tmp_path, 30)
    (unmarked / "COMPLETE").unlink()
    missing = save(tmp_path, 40)
    (missing / "train_state.json").unlink()
    interrupted = begin_save(tmp_path, 50)  # a crash during the save of step 50
    (interrupted / "model.safetensors").write_bytes(b"half")

    skipped = []
    assert rundir.find_latest_checkpoint(tmp_path, skipped) == good
    reasons = {path.name: why for path, why in skipped}
    assert "checksum" in reasons["step-00000020"]
    assert "COMPLETE" in reasons["step-00000030"]
    assert "missing" in reasons["step-00000040"]
    assert "incomplete" in reasons[".tmp-step-00000050"]
    # The checksum list itself is protected by the marker.
    (good / "checksums.json").write_text("{}")
    assert "match" in rundir.verify_checkpoint(good)
    assert rundir.find_latest_checkpoint(tmp_path) is None


def test_rotation_keeps_last_and_only_after_the_new_one_is_complete(tmp_path):
    for step in (1, 2, 3):
        save(tmp_path, step, keep_last=2)
    assert [p.name for p in rundir.iter_checkpoints(tmp_path)] == ["step-00000003", "step-00000002"]
    # A save that dies before finish_save removes nothing.
    tmp = begin_save(tmp_path, 4)
    (tmp / "model.safetensors").write_bytes(b"partial")
    assert [p.name for p in rundir.iter_checkpoints(tmp_path)] == ["step-00000003", "step-00000002"]
    # The next save clears the stale temporary directory, then rotates.
    save(tmp_path, 5, keep_last=2)
    assert [p.name for p in rundir.iter_checkpoints(tmp_path)] == ["step-00000005", "step-00000003"]
    assert not rundir.incomplete_saves(tmp_path)


def test_resaving_a_step_replaces_it(tmp_path):
    save(tmp_path, 7, payload=b"old")
    path = save(tmp_path, 7, payload=b"new")
    assert (path / "model.safetensors").read_bytes() == b"new7"
    assert rundir.verify_checkpoint(path) is None


def test_names_and_empty_runs(tmp_path):
    assert rundir.checkpoint_name(1000) == "step-00001000"
    assert rundir.step_of("step-00001000") == 1000 and rundir.step_of(".tmp-step-00000001") is None
    assert rundir.find_latest_checkpoint(tmp_path / "nothing") is None


def test_resolve_a_run_dir_takes_its_newest_valid_checkpoint(tmp_path):
    good = save(tmp_path, 1)
    damaged = save(tmp_path, 2)
    (damaged / "model.safetensors").write_bytes(b"flipped bits")
    skipped = []
    assert rundir.resolve_checkpoint(tmp_path, skipped) == good
    assert [(path.name, "checksum" in why) for path, why in skipped] == [("step-00000002", True)]
    assert rundir.resolve_checkpoint(good) == good
    (good / "COMPLETE").unlink()
    with pytest.raises(rundir.NoValidCheckpoint, match="none is valid"):
        rundir.resolve_checkpoint(tmp_path)
    (tmp_path / "empty" / "checkpoints").mkdir(parents=True)
    with pytest.raises(DataError, match="has no checkpoint yet"):
        rundir.resolve_checkpoint(tmp_path / "empty")


def test_resolve_a_checkpoint_dir_always_verifies_its_checksums(tmp_path):
    path = save(tmp_path, 3)
    (path / "model.safetensors").write_bytes(b"flipped bits")  # COMPLETE is still there
    with pytest.raises(DataError, match="model.safetensors is damaged"):
        rundir.resolve_checkpoint(path)


def test_resolve_refuses_what_is_neither(tmp_path):
    with pytest.raises(UsageError, match="does not exist"):
        rundir.resolve_checkpoint(tmp_path / "missing")
    (tmp_path / "notes.txt").write_text("not a model")
    with pytest.raises(UsageError, match="neither a checkpoint dir"):
        rundir.resolve_checkpoint(tmp_path)


def test_the_run_tokenizer_is_found_next_to_the_checkpoint_or_in_the_run_dir(tmp_path):
    path = save(tmp_path, 1)
    assert rundir.find_tokenizer_dir(path) is None and rundir.find_tokenizer_dir(None) is None
    (tmp_path / "tokenizer").mkdir()
    (tmp_path / "tokenizer" / "tokenizer.json").write_text("{}")
    assert rundir.find_tokenizer_dir(path) == tmp_path / "tokenizer"
    (path / "tokenizer.json").write_text("{}")
    assert rundir.find_tokenizer_dir(path) == path
    # An explicit choice wins; a DATA_DIR or RUN_DIR means its tokenizer/.
    assert rundir.find_tokenizer_dir(path, tmp_path) == tmp_path / "tokenizer"
    assert rundir.find_tokenizer_dir(path, tmp_path / "tokenizer" / "tokenizer.json") == tmp_path / "tokenizer"
    with pytest.raises(DataError, match="no tokenizer.json"):
        rundir.find_tokenizer_dir(path, tmp_path / "checkpoints")


def test_a_run_whose_checkpoints_are_all_invalid_is_an_error_never_a_fresh_start(tmp_path):
    tampered = save(tmp_path, 10)
    (tampered / "COMPLETE").write_text("0" * 64 + "\n")
    unmarked = save(tmp_path, 20)
    (unmarked / "COMPLETE").unlink()
    interrupted = begin_save(tmp_path, 30)
    assert rundir.find_latest_checkpoint(tmp_path) is None  # without require_valid: as before
    skipped = []
    with pytest.raises(rundir.NoValidCheckpoint) as caught:
        rundir.find_latest_checkpoint(tmp_path, skipped, require_valid=True)
    error = caught.value
    assert isinstance(error, DataError) and error.exit_code == 1 and error.run_dir == tmp_path
    assert [p.name for p, _ in error.rejected] == [p.name for p, _ in skipped] == [
        interrupted.name, unmarked.name, tampered.name]
    lines = str(error).splitlines()
    assert lines[0] == f"RUN_DIR {tmp_path} has 3 checkpoint(s) but none is valid:"
    assert lines[1:4] == [f"  {interrupted}: incomplete save (interrupted before it finished)",
                          f"  {unmarked}: no COMPLETE marker (the save did not finish)",
                          f"  {tampered}: checksums.json does not match the COMPLETE marker"]
    assert "--resume PATH" in lines[4] and "new run dir" in lines[4] and "deleted" in lines[4]
    assert all(p.exists() for p in (tampered, unmarked, interrupted))  # nothing is removed
    # The trainer words its own advice.
    assert str(rundir.NoValidCheckpoint(tmp_path, skipped, advice="Do X.")) == "\n".join(lines[:4] + ["Do X."])


def test_require_valid_allows_a_fresh_run_and_a_first_save_that_never_finished(tmp_path):
    assert rundir.find_latest_checkpoint(tmp_path, require_valid=True) is None
    begin_save(tmp_path, 1)  # killed during the very first save: no checkpoint ever existed
    skipped = []
    assert rundir.find_latest_checkpoint(tmp_path, skipped, require_valid=True) is None
    assert [p.name for p, _ in skipped] == [".tmp-step-00000001"]
    good = save(tmp_path, 2)
    (save(tmp_path, 3) / "COMPLETE").unlink()
    assert rundir.find_latest_checkpoint(tmp_path, require_valid=True) == good


def test_checksums_cover_whatever_files_a_save_holds(tmp_path):
    tmp = begin_save(tmp_path, 5)
    names = ["model.safetensors", "config.yaml", "optimizer.json", "optimizer.safetensors",
             "rng-rank00000.json", "rng-rank00000.safetensors", "extra/notes.json"]
    for name in names:
        (tmp / name).parent.mkdir(exist_ok=True)
        (tmp / name).write_text(name)
    path = finish_save(tmp)
    assert sorted(json.loads((path / "checksums.json").read_text())) == sorted(names)
    assert rundir.verify_checkpoint(path) is None
    (path / "extra" / "notes.json").write_text("changed")
    assert rundir.verify_checkpoint(path) == "extra/notes.json is damaged (checksum mismatch)"


def test_a_file_added_after_the_save_makes_the_checkpoint_invalid(tmp_path):
    path = save(tmp_path, 1)
    (path / "tokenizer.json").write_text("{}")  # handing the tokenizer on with a checkpoint is fine
    (path / "tokenizer").mkdir()
    (path / "tokenizer" / "vocab.txt").write_text("[PAD]\n")
    assert rundir.verify_checkpoint(path) is None
    (path / "scheduler.pt").write_bytes(b"planted")  # checksums.json and COMPLETE left as they were
    assert rundir.verify_checkpoint(path) == "scheduler.pt is not listed in checksums.json (added after the save)"


def test_legacy_pickle_files_lists_the_old_format_state(tmp_path):
    tmp = begin_save(tmp_path, 1)
    for name in ("model.safetensors", "config.yaml", "train_state.json", "optimizer.pt", "scheduler.pt",
                 "scaler.pt", "rng-rank00000.pt", "rng-rank00001.pt"):
        (tmp / name).write_text(name)
    old = finish_save(tmp)
    assert [p.name for p in rundir.legacy_pickle_files(old)] == [
        "optimizer.pt", "rng-rank00000.pt", "rng-rank00001.pt", "scaler.pt", "scheduler.pt"]
    assert rundir.legacy_pickle_files(save(tmp_path, 2)) == []
