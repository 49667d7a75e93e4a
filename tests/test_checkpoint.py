"""Atomic checkpoint directories: marker + checksums, finding the newest valid one, rotation."""

from __future__ import annotations

import json

from bertrain.train import checkpoint as ckpt


def save(run_dir, step, keep_last=None, payload=b"weights"):
    tmp = ckpt.begin_save(run_dir, step)
    (tmp / "model.safetensors").write_bytes(payload + str(step).encode())
    (tmp / "train_state.json").write_text(json.dumps({"step": step}))
    return ckpt.finish_save(tmp, keep_last)


def test_save_is_complete_and_verified(tmp_path):
    path = save(tmp_path, 1000)
    assert path == tmp_path / "checkpoints" / "step-00001000"
    assert sorted(p.name for p in path.iterdir()) == ["COMPLETE", "checksums.json", "model.safetensors",
                                                      "train_state.json"]
    assert set(json.loads((path / "checksums.json").read_text())) == {"model.safetensors", "train_state.json"}
    assert ckpt.verify_checkpoint(path) is None
    assert ckpt.find_latest_checkpoint(tmp_path) == path
    assert not list((tmp_path / "checkpoints").glob(".tmp-*"))


def test_latest_skips_damaged_incomplete_and_interrupted_saves(tmp_path):
    good = save(tmp_path, 10)
    damaged = save(tmp_path, 20)
    (damaged / "model.safetensors").write_bytes(b"flipped bits")
    unmarked = save(tmp_path, 30)
    (unmarked / "COMPLETE").unlink()
    missing = save(tmp_path, 40)
    (missing / "train_state.json").unlink()
    interrupted = ckpt.begin_save(tmp_path, 50)  # a crash during the save of step 50
    (interrupted / "model.safetensors").write_bytes(b"half")

    skipped = []
    assert ckpt.find_latest_checkpoint(tmp_path, skipped) == good
    reasons = {path.name: why for path, why in skipped}
    assert "checksum" in reasons["step-00000020"]
    assert "COMPLETE" in reasons["step-00000030"]
    assert "missing" in reasons["step-00000040"]
    assert "incomplete" in reasons[".tmp-step-00000050"]
    # The checksum list itself is protected by the marker.
    (good / "checksums.json").write_text("{}")
    assert "match" in ckpt.verify_checkpoint(good)
    assert ckpt.find_latest_checkpoint(tmp_path) is None


def test_rotation_keeps_last_and_only_after_the_new_one_is_complete(tmp_path):
    for step in (1, 2, 3):
        save(tmp_path, step, keep_last=2)
    assert [p.name for p in ckpt.iter_checkpoints(tmp_path)] == ["step-00000003", "step-00000002"]
    # A save that dies before finish_save removes nothing.
    tmp = ckpt.begin_save(tmp_path, 4)
    (tmp / "model.safetensors").write_bytes(b"partial")
    assert [p.name for p in ckpt.iter_checkpoints(tmp_path)] == ["step-00000003", "step-00000002"]
    # The next save clears the stale temporary directory, then rotates.
    save(tmp_path, 5, keep_last=2)
    assert [p.name for p in ckpt.iter_checkpoints(tmp_path)] == ["step-00000005", "step-00000003"]
    assert not ckpt.incomplete_saves(tmp_path)


def test_resaving_a_step_replaces_it(tmp_path):
    save(tmp_path, 7, payload=b"old")
    path = save(tmp_path, 7, payload=b"new")
    assert (path / "model.safetensors").read_bytes() == b"new7"
    assert ckpt.verify_checkpoint(path) is None


def test_names_and_empty_runs(tmp_path):
    assert ckpt.checkpoint_name(1000) == "step-00001000"
    assert ckpt.step_of("step-00001000") == 1000 and ckpt.step_of(".tmp-step-00000001") is None
    assert ckpt.find_latest_checkpoint(tmp_path / "nothing") is None
