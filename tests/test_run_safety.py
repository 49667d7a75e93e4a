"""A RUN_DIR that is safe to share and hard to lose (issues 17, 15.2, 15.3, 15.4, 15.10).

Checkpoints hold no pickle and a pickle payload never runs; an all-invalid RUN_DIR is an error, and
`--resume restart` moves the old checkpoints aside; one run at a time per RUN_DIR; a failed write names
its file; a longer budget is a free change, and --force allows only its listed keys.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from bertrain import rundir
from bertrain.config import Config, to_dict
from bertrain.files import exclusive_lock
from bertrain.train import checkpoint as checkpoint_module
from bertrain.train.checkpoint import begin_save, finish_save
from bertrain.train.state_files import load_state
from tests.helpers import (ROOT, TINY, assert_same_weights, explain, final_weights, pretrain_env, run_pretrain,
                           train_losses, write_config)

PACKAGE = Path(rundir.__file__).parent


def _pretrain(run_cli, config, data, run_dir, *args):
    code, out, err = run_cli("pretrain", "--config", str(config), "--data", str(data), "--run-dir", str(run_dir),
                             *args)
    return code, " ".join((out + err).split())


def _reseal(checkpoint: Path) -> Path:
    """Redo checksums.json and COMPLETE after editing a checkpoint, as anyone with write access can."""
    (checkpoint / rundir.MARKER).unlink()
    (checkpoint / rundir.CHECKSUMS).unlink()
    tmp = checkpoint.with_name(checkpoint.name.replace(rundir.PREFIX, rundir.TMP_PREFIX, 1))
    checkpoint.rename(tmp)
    final = finish_save(tmp)
    assert rundir.verify_checkpoint(final) is None
    return final


def _to_older_format(checkpoint: Path, payload=None) -> Path:
    """Rewrite a checkpoint as the previous bertrain wrote it (optimizer.pt, scheduler.pt, rng-rank*.pt:
    pickles), optionally with `payload` inside scheduler.pt, and reseal it so that it verifies."""
    names = [p.stem for p in checkpoint.glob("*.safetensors") if p.name != rundir.WEIGHTS]
    assert {"optimizer", "scheduler", "rng-rank00000"} <= set(names)
    for name in names:
        state = load_state(checkpoint, name)
        if name == "scheduler" and payload is not None:
            state["extra"] = payload
        torch.save(state, checkpoint / f"{name}.pt")
        (checkpoint / f"{name}.json").unlink()
        (checkpoint / f"{name}.safetensors").unlink()
    return _reseal(checkpoint)


class Payload:
    """What an attacker plants in a pickle: unpickling it runs a shell command."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.fixture(scope="module")
def short_config(tmp_path_factory):
    return write_config(tmp_path_factory.mktemp("safety") / "tiny.yaml",
                        train={"max_steps": 6, "save_every": 3, "eval_every": 0})


# ---------------------------------------------------------------------------------------------
# No pickle (17.1)
# ---------------------------------------------------------------------------------------------


def test_no_weights_only_false_anywhere_in_the_package():
    offenders = [str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
                 if "weights_only=False" in p.read_text(encoding="utf-8")]
    assert offenders == []


def test_older_format_resumes_bitwise_only_with_trust_checkpoint(tmp_path, tiny_data, short_config):
    reference = tmp_path / "reference"
    assert run_pretrain(short_config, tiny_data, reference).returncode == 0
    run_dir = tmp_path / "old"
    first = run_pretrain(short_config, tiny_data, run_dir, "--set", "train.stop_at_step=3")
    assert first.returncode == 0, explain(first)
    checkpoint = _to_older_format(run_dir / "checkpoints" / "step-00000003")

    refused = run_pretrain(short_config, tiny_data, run_dir)
    text = " ".join(refused.stderr.split())
    assert refused.returncode == 1, explain(refused)
    assert "older format" in text and "run any code" in text and "--trust-checkpoint" in text
    assert max(train_losses(run_dir)) == 3  # nothing trained

    trusted = run_pretrain(short_config, tiny_data, run_dir, "--trust-checkpoint")
    assert trusted.returncode == 0, explain(trusted)
    ours, theirs = train_losses(run_dir), train_losses(reference)
    assert [ours[s] for s in (4, 5, 6)] == [theirs[s] for s in (4, 5, 6)]  # bitwise
    assert_same_weights(final_weights(run_dir, 6), final_weights(reference, 6))
    assert not rundir.legacy_pickle_files(run_dir / "checkpoints" / "step-00000006")  # saved in the new format
    assert rundir.legacy_pickle_files(checkpoint)  # the old one is left as it was


def test_a_pickle_payload_never_runs(run_cli, tmp_path, tiny_data, short_config, fresh_accelerate):
    run_dir, ran = tmp_path / "run", tmp_path / "payload-ran"
    code, text = _pretrain(run_cli, short_config, tiny_data, run_dir, "--set", "train.stop_at_step=3")
    assert code == 0, text
    checkpoint = _to_older_format(run_dir / "checkpoints" / "step-00000003", payload=Payload(ran))

    code, text = _pretrain(run_cli, short_config, tiny_data, run_dir, "--force")
    assert code == 1 and "--trust-checkpoint" in text and "scheduler.pt" in text, text
    assert not ran.exists()
    code, text = _pretrain(run_cli, short_config, tiny_data, run_dir, "--trust-checkpoint")
    assert code == 1 and "cannot be loaded safely" in text and "scheduler.pt" in text and "system" in text, text
    assert not ran.exists()
    assert max(json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()) == 3
    # The payload is real: a full unpickle (what resuming did before) runs it.
    torch.load(checkpoint / "scheduler.pt", weights_only=False)  # the test's own deliberate full unpickle
    assert ran.exists()


# ---------------------------------------------------------------------------------------------
# No silent restart (17.2)
# ---------------------------------------------------------------------------------------------


def test_all_checkpoints_invalid_stops_and_restart_moves_them_aside(run_cli, tmp_path, tiny_data, short_config,
                                                                     fresh_accelerate):
    run_dir = tmp_path / "run"
    code, text = _pretrain(run_cli, short_config, tiny_data, run_dir, "--set", "train.stop_at_step=3")
    assert code == 0, text
    tampered = run_dir / "checkpoints" / "step-00000003"
    (tampered / "COMPLETE").write_text("0" * 64 + "\n")
    interrupted = begin_save(run_dir, 4)
    metrics = (run_dir / "metrics.jsonl").read_text()

    code, out, err = run_cli("pretrain", "--config", str(short_config), "--data", str(tiny_data), "--run-dir",
                             str(run_dir))
    assert code == 1, out + err
    lines = err.splitlines()
    assert f"  {tampered}: checksums.json does not match the COMPLETE marker" in lines
    assert f"  {interrupted}: incomplete save (interrupted before it finished)" in lines
    text = " ".join(err.split())
    assert "--resume PATH" in text and "--resume restart" in text and "never deleting" in text
    assert (run_dir / "metrics.jsonl").read_text() == metrics  # nothing trained, nothing truncated

    code, text = _pretrain(run_cli, short_config, tiny_data, run_dir, "--resume", "restart")
    assert code == 0, text
    [aside] = run_dir.glob("old-*")
    assert f"moved the previous checkpoints and metrics to {aside}" in text
    assert (aside / "checkpoints" / "step-00000003" / "model.safetensors").is_file()  # kept, not deleted
    assert (aside / "metrics.jsonl").read_text() == metrics
    # Its tokenizer too (it was overwritten by the new run's): the old run stays usable as a RUN_DIR.
    tokenizer = "tokenizer/tokenizer.json"
    assert (aside / tokenizer).read_bytes() == (tiny_data / tokenizer).read_bytes()
    assert (run_dir / tokenizer).is_file()
    assert sorted(train_losses(run_dir)) == [1, 2, 3, 4, 5, 6]  # a new run from step 0
    assert [p.name for p in rundir.iter_checkpoints(run_dir)] == ["step-00000006", "step-00000003"]


# ---------------------------------------------------------------------------------------------
# One run per RUN_DIR (15.3)
# ---------------------------------------------------------------------------------------------


def test_a_locked_run_dir_is_refused_naming_the_holder_but_a_dry_run_is_not(run_cli, tmp_path, tiny_data,
                                                                            short_config, fresh_accelerate):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    with exclusive_lock(run_dir / ".lock", wait=False):  # another open file: conflicts like another process
        code, text = _pretrain(run_cli, short_config, tiny_data, run_dir)
        assert code == 1 and f"pid {os.getpid()}" in text and "in use" in text and "--run-dir" in text, text
        assert not (run_dir / "checkpoints").exists() and not (run_dir / "metrics.jsonl").exists()
        code, text = _pretrain(run_cli, short_config, tiny_data, run_dir, "--dry-run")
        assert code == 0, text
    code, text = _pretrain(run_cli, short_config, tiny_data, run_dir, "--resume", "never")  # .lock alone: empty
    assert code == 0, text


def _wait_for(path: Path, process: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.1)


@pytest.mark.slow
def test_a_second_run_is_refused_and_kill_9_leaves_no_stale_lock(tmp_path, tiny_data):
    config = write_config(tmp_path / "tiny.yaml", train={"max_steps": 8, "save_every": 1, "eval_every": 0})
    run_dir = tmp_path / "run"
    command = [sys.executable, "-m", "bertrain", "pretrain", "--config", str(config), "--data", str(tiny_data),
               "--run-dir", str(run_dir)]
    first = subprocess.Popen(command, env=pretrain_env(BERTRAIN_TEST_STEP_DELAY="2"), cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(run_dir / "checkpoints" / "step-00000001" / "COMPLETE", first)
        second = run_pretrain(config, tiny_data, run_dir)
        text = " ".join(second.stderr.split())
        assert second.returncode == 1 and f"pid {first.pid}" in text and "in use" in text, explain(second)
    finally:
        first.kill()  # kill -9: the lock goes with the process
        first.communicate()
    third = run_pretrain(config, tiny_data, run_dir)
    assert third.returncode == 0, explain(third)
    assert "Resuming from" in third.stdout and sorted(train_losses(run_dir)) == list(range(1, 9))


# ---------------------------------------------------------------------------------------------
# A failed write names its file (15.2)
# ---------------------------------------------------------------------------------------------


def test_disk_full_during_a_save_names_the_file_and_keeps_the_previous_checkpoint(
        run_cli, tmp_path, tiny_data, short_config, fresh_accelerate, monkeypatch):
    real_save_state = checkpoint_module.save_state

    def full_disk(directory, name, obj):
        if name == "optimizer" and "00000006" in str(directory):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(Path(directory) / "optimizer.safetensors"))
        return real_save_state(directory, name, obj)

    monkeypatch.setattr(checkpoint_module, "save_state", full_disk)
    run_dir = tmp_path / "run"
    code, text = _pretrain(run_cli, short_config, tiny_data, run_dir)
    assert code == 1, text
    assert f"{run_dir}/checkpoints/.tmp-step-00000006/optimizer.safetensors: No space left on device (ENOSPC)" in text
    assert "Free space" in text and "--run-dir" in text and "Errno" not in text
    assert f"The newest checkpoint ({run_dir}/checkpoints/step-00000003) is intact" in text
    assert rundir.find_latest_checkpoint(run_dir, require_valid=True) == run_dir / "checkpoints" / "step-00000003"


def test_read_only_metrics_names_the_file(run_cli, tmp_path, tiny_data, short_config, fresh_accelerate,
                                          monkeypatch):
    from bertrain.train.monitor import Monitor

    real_log = Monitor.log

    def read_only(self, record):
        if record.get("step") == 4:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self.metrics_path))
        return real_log(self, record)

    monkeypatch.setattr(Monitor, "log", read_only)
    run_dir = tmp_path / "run"
    code, text = _pretrain(run_cli, short_config, tiny_data, run_dir)
    assert code == 1, text
    assert f"{run_dir}/metrics.jsonl: Read-only file system (EROFS) while training (step 4)" in text
    assert "read-only" in text and "step-00000003) is intact" in text


# ---------------------------------------------------------------------------------------------
# A longer budget is free; --force allows a listed set of changes only (15.10)
# ---------------------------------------------------------------------------------------------


def test_every_config_key_has_a_resume_rule():
    from bertrain.config.resume_keys import BUDGET_KEYS, FORCE_KEYS, NEVER_KEYS
    from bertrain.train.resume_rules import is_free

    def flat(tree, prefix=""):
        for key, value in tree.items():
            yield from flat(value, f"{prefix}{key}.") if isinstance(value, dict) else [f"{prefix}{key}"]

    for key in flat(to_dict(Config())):
        rules = [is_free(key), key in BUDGET_KEYS, key in FORCE_KEYS, key in NEVER_KEYS]
        assert sum(rules) == 1, (key, rules)


def test_a_longer_budget_continues_a_finished_run_without_force(run_cli, tmp_path, tiny_data, short_config,
                                                                fresh_accelerate):
    run_dir = tmp_path / "run"
    code, text = _pretrain(run_cli, short_config, tiny_data, run_dir)
    assert code == 0, text
    before = train_losses(run_dir)
    code, text = _pretrain(run_cli, short_config, tiny_data, run_dir, "--set", "train.max_steps=4")
    assert code == 2 and "train.max_steps: 6 → 4" in text and "--force" in text, text
    code, text = _pretrain(run_cli, short_config, tiny_data, run_dir, "--set", "model.hidden_act=relu", "--force")
    assert code == 2 and "model.hidden_act" in text and "cannot be overridden" in text, text

    code, text = _pretrain(run_cli, short_config, tiny_data, run_dir, "--set", "train.max_steps=8")
    assert code == 0 and "Longer budget (train.max_steps: 6 → 8)" in text and "--force:" not in text, text
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    lrs = {r["step"]: r["lr"] for r in records if r["kind"] == "train"}
    assert {s: train_losses(run_dir)[s] for s in before} == before
    peak, warmup = TINY["optim"]["lr"], TINY["optim"]["warmup_steps"]
    for step in (7, 8):  # the decay recomputed to end at step 8 (lr of step s: the multiplier after s - 1 steps)
        assert lrs[step] == pytest.approx(peak * (1 - (step - 1 - warmup) / (8 - warmup)))
    saved = json.loads((run_dir / "checkpoints" / "step-00000008" / "train_state.json").read_text())
    assert saved["step"] == 8 and saved["total_steps"] == 8


# ---------------------------------------------------------------------------------------------
# The launcher dies (15.4)
# ---------------------------------------------------------------------------------------------

LAUNCHER = ("import subprocess, sys, time\n"
            "out = open(sys.argv[1], 'w')\n"
            "subprocess.Popen(sys.argv[2:], stdout=out, stderr=subprocess.STDOUT)\n"
            "time.sleep(600)\n")


@pytest.mark.slow
def test_a_run_whose_launcher_is_killed_9_saves_and_stops(tmp_path, tiny_data):
    config = write_config(tmp_path / "tiny.yaml", train={"max_steps": 50, "save_every": 1000, "eval_every": 0})
    run_dir, log = tmp_path / "run", tmp_path / "worker.log"
    command = [sys.executable, "-m", "bertrain", "pretrain", "--config", str(config), "--data", str(tiny_data),
               "--run-dir", str(run_dir)]
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(log), *command], cwd=ROOT,
                                env=pretrain_env(BERTRAIN_TEST_STEP_DELAY="1", TORCHELASTIC_RUN_ID="test"))
    try:
        _wait_for(run_dir / "metrics.jsonl", launcher)
    finally:
        launcher.send_signal(signal.SIGKILL)
        launcher.wait()
    deadline = time.monotonic() + 120
    while "pretrain summary" not in log.read_text():
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.2)
    text = " ".join(log.read_text().split())
    assert "stopped by SIGTERM" in text, text
    [checkpoint] = rundir.iter_checkpoints(run_dir)  # the signal's checkpoint (save_every is 1000)
    assert rundir.verify_checkpoint(checkpoint) is None and rundir.step_of(checkpoint) < 50


def test_the_disk_check_asks_for_two_checkpoints_fresh_and_one_on_resume(tmp_path, monkeypatch):
    """A fresh run needs room for two checkpoints (the second is written before the first goes), a resumed one,
    whose checkpoints are already on disk, for one more: the margin is stated, so freeing what it says is enough."""
    size, margin = 10 << 20, checkpoint_module.SAVE_MARGIN_BYTES
    monkeypatch.setattr(checkpoint_module, "free_disk_bytes", lambda path: size + margin)
    with pytest.raises(checkpoint_module.DataError) as refused:
        checkpoint_module.check_disk(tmp_path, size)
    message = " ".join(str(refused.value).split())
    assert "need about 84.0 MB: 2 checkpoints of 10.0 MB" in message and "64.0 MB for metrics and logs" in message
    kept = rundir.checkpoints_dir(tmp_path) / rundir.checkpoint_name(20)
    kept.mkdir(parents=True)
    (kept / rundir.MARKER).write_text("x\n")
    checkpoint_module.check_disk(tmp_path, size)  # resumed: one more checkpoint and the margin fit exactly
    monkeypatch.setattr(checkpoint_module, "free_disk_bytes", lambda path: size + margin - 1)
    with pytest.raises(checkpoint_module.DataError, match="1 checkpoint of 10.0 MB"):
        checkpoint_module.check_disk(tmp_path, size)
