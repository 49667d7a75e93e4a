"""Exact resume, and the other ways of computing the same steps.

Resume is the same computation as the uninterrupted run: a run of 2N steps vs. runs stopped after N and resumed,
compared bit for bit (the per-step losses in metrics.jsonl at full float precision and the final weights).
fp32, deterministic algorithms, dropout 0.1 (so the per-rank RNG restore is exercised).

Gradient accumulation, the unpadded encoder and 2 processes compute the plain run's steps (1 process, 1 micro-batch
of 8, padded) in another order: their losses match within float32 rounding (`rounding_rtol`), under each of
KERNELS.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import (KERNELS, ROOT, TINY, assert_same_weights, default_ctrl_c, explain, final_weights, kernel_env,
                           make_prepared_dir, pretrain_env, rounding_rtol, run_pretrain, train_losses, wait_for_file,
                           write_config)

N = 3          # checkpoint / interruption step
STEPS = 2 * N  # uninterrupted length


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return make_prepared_dir(tmp_path_factory.mktemp("resume-data") / "wordpiece", kind="wordpiece",
                             num_documents=120)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("resume")


@pytest.fixture(scope="module")
def config(workdir):
    return write_config(workdir / "exact.yaml", train={"max_steps": STEPS, "save_every": N, "eval_every": N})


@pytest.fixture(scope="module")
def reference(workdir, config, data):
    """The uninterrupted run of 2N steps."""
    run_dir = workdir / "reference"
    result = run_pretrain(config, data, run_dir)
    assert result.returncode == 0, explain(result)
    losses = train_losses(run_dir)
    assert sorted(losses) == list(range(1, STEPS + 1))
    return run_dir


def assert_resumed_exactly(run_dir, reference_dir, start=N):
    ours, theirs = train_losses(run_dir), train_losses(reference_dir)
    assert sorted(ours) == list(range(1, STEPS + 1))  # records after the checkpoint were replaced, not duplicated
    for step in range(start + 1, STEPS + 1):
        assert ours[step] == theirs[step], (step, ours[step], theirs[step])  # bitwise: == on floats
    assert_same_weights(final_weights(run_dir, STEPS), final_weights(reference_dir, STEPS))


def resume(config, data, run_dir, *args, **kwargs):
    result = run_pretrain(config, data, run_dir, *args, **kwargs)
    assert result.returncode == 0, explain(result)
    return result


# ---------------------------------------------------------------------------------------------
# 1 process
# ---------------------------------------------------------------------------------------------


def test_stop_at_checkpoint_then_resume_is_exact(workdir, config, data, reference):
    run_dir = workdir / "stop_at"
    first = run_pretrain(config, data, run_dir, "--set", f"train.stop_at_step={N}")
    assert first.returncode == 0, explain(first)
    assert max(train_losses(run_dir)) == N
    second = resume(config, data, run_dir)
    assert f"Resuming from {run_dir}/checkpoints/step-{N:08d}" in " ".join(second.stdout.split())
    assert_resumed_exactly(run_dir, reference)


def test_sigterm_finishes_the_step_saves_exits_75_and_resumes_exactly(workdir, config, data, reference):
    run_dir = workdir / "sigterm"
    stop = N - 1  # not a save_every step: the signal itself must cause the checkpoint
    first = run_pretrain(config, data, run_dir, env=pretrain_env(BERTRAIN_TEST_SIGNAL_AT_STEP=str(stop)))
    assert first.returncode == 75, explain(first)
    assert "Stopped by a signal after step 2" in " ".join(first.stderr.split())
    assert max(train_losses(run_dir)) == stop
    assert (run_dir / "checkpoints" / f"step-{stop:08d}" / "COMPLETE").is_file()
    resume(config, data, run_dir)
    assert_resumed_exactly(run_dir, reference, start=stop)


def test_resume_from_a_given_checkpoint_into_a_new_run_dir(workdir, config, data, reference):
    run_dir = workdir / "from_path"
    resume(config, data, run_dir, "--resume", str(reference / "checkpoints" / f"step-{N:08d}"))
    ours, theirs = train_losses(run_dir), train_losses(reference)
    assert sorted(ours) == list(range(N + 1, STEPS + 1))
    assert all(ours[s] == theirs[s] for s in ours)
    assert_same_weights(final_weights(run_dir, STEPS), final_weights(reference, STEPS))


@pytest.mark.slow
def test_kill_9_right_after_a_checkpoint_then_resume_is_exact(workdir, config, data, reference):
    run_dir = workdir / "kill_after_save"
    first = run_pretrain(config, data, run_dir, env=pretrain_env(BERTRAIN_TEST_CRASH_AFTER_SAVE=str(N)))
    assert first.returncode == -signal.SIGKILL, explain(first)
    resume(config, data, run_dir)
    assert_resumed_exactly(run_dir, reference)


@pytest.mark.slow
def test_kill_9_in_the_middle_of_a_save_keeps_the_previous_checkpoint(workdir, config, data, reference):
    run_dir = workdir / "kill_during_save"
    first = run_pretrain(config, data, run_dir, env=pretrain_env(BERTRAIN_TEST_CRASH_DURING_SAVE=str(STEPS)))
    assert first.returncode == -signal.SIGKILL, explain(first)
    partial = run_dir / "checkpoints" / f".tmp-step-{STEPS:08d}"
    assert (partial / "model.safetensors").is_file() and not (partial / "COMPLETE").exists()
    assert max(train_losses(run_dir)) == STEPS  # records of steps after the checkpoint exist before resume
    second = resume(config, data, run_dir)
    text = " ".join(second.stdout.split())
    assert "Skipping invalid checkpoint" in text and f".tmp-step-{STEPS:08d}" in text
    assert f"Resuming from {run_dir}/checkpoints/step-{N:08d}" in text
    assert_resumed_exactly(run_dir, reference)


def wait_until_handling(process: subprocess.Popen, signum: int) -> None:
    """Block until `process` has a handler for `signum` (Linux: SigCgt in /proc/PID/status), however slowly
    the machine starts Python: a fixed sleep would signal before any bertrain code ran on a loaded machine."""
    status = Path(f"/proc/{process.pid}/status")
    while process.poll() is None:
        caught = next((line.split()[1] for line in status.read_text().splitlines() if line.startswith("SigCgt:")), "0")
        if int(caught, 16) >> (signum - 1) & 1:
            return
        time.sleep(0.005)
    raise AssertionError(f"the process ended (exit {process.returncode}) before handling signal {signum}")


@pytest.mark.slow
def test_sigterm_during_startup_imports_is_caught_and_resumes_exactly(workdir, config, data, reference):
    run_dir = workdir / "early_sigterm"
    process = subprocess.Popen([sys.executable, "-m", "bertrain", "pretrain", "--config", str(config), "--data",
                                str(data), "--run-dir", str(run_dir)], env=pretrain_env(), cwd=ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=default_ctrl_c)
    wait_until_handling(process, signal.SIGTERM)  # bertrain's first act, before `import torch` / accelerate
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=300)
    assert process.returncode == 75, f"{out}\n{err}"
    assert max(train_losses(run_dir)) == 1  # the first step finished, then the run stopped
    resume(config, data, run_dir)
    assert_resumed_exactly(run_dir, reference, start=1)


def start_in_a_terminal_group(config, data, run_dir, pause_at: int, marker: Path, **env: str) -> subprocess.Popen:
    """`bertrain pretrain` with 2 loader workers in a process group of its own, as a shell starts it in a terminal
    (Ctrl-C reaches the whole group, workers included); it pauses before step `pause_at` until signalled."""
    command = [sys.executable, "-m", "bertrain", "pretrain", "--config", str(config), "--data", str(data),
               "--run-dir", str(run_dir), "--set", "data.num_workers=2"]
    return subprocess.Popen(command, env=pretrain_env(BERTRAIN_TEST_PAUSE_AT_STEP=f"{pause_at}:{marker}", **env),
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=default_ctrl_c)


def test_ctrl_c_finishes_the_step_saves_exits_130_and_resumes_exactly(workdir, config, data, reference):
    run_dir, marker, stop = workdir / "ctrl_c", workdir / "ctrl_c.paused", N - 1  # not a save_every step
    process = start_in_a_terminal_group(config, data, run_dir, stop, marker)
    wait_for_file(marker, process)
    os.killpg(process.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the training process and its workers
    out, err = process.communicate(timeout=300)
    assert process.returncode == 130, f"{out}\n{err}"
    text = " ".join(err.split())
    assert f"Stopped by Ctrl-C after step {stop}; checkpoint saved" in text and "the same command resumes" in text
    assert "Traceback" not in err and "KeyboardInterrupt" not in err + out, err  # nor from the loader workers
    assert "stopped by Ctrl-C" in out  # the summary table's result
    assert max(train_losses(run_dir)) == stop
    assert (run_dir / "checkpoints" / f"step-{stop:08d}" / "COMPLETE").is_file()
    resume(config, data, run_dir, "--set", "data.num_workers=2")
    assert_resumed_exactly(run_dir, reference, start=stop)


def test_a_second_ctrl_c_stops_at_once_without_a_traceback(workdir, config, data):
    run_dir, marker = workdir / "ctrl_c_twice", workdir / "ctrl_c_twice.paused"
    # Step 1 then sleeps 600 s before its checkpoint: only the second Ctrl-C can end the run before that.
    process = start_in_a_terminal_group(config, data, run_dir, 1, marker, BERTRAIN_TEST_STEP_DELAY="600")
    wait_for_file(marker, process)
    os.killpg(process.pid, signal.SIGINT)
    first_lines = []
    while not any("Ctrl-C: finishing the current step" in line for line in first_lines):  # the first was handled
        first_lines.append(process.stderr.readline())
        assert first_lines[-1], f"the run ended before saying it got the first Ctrl-C: {first_lines}"
    os.killpg(process.pid, signal.SIGINT)
    out, err = process.communicate(timeout=300)
    err = "".join(first_lines) + err
    assert process.returncode == 130, f"{out}\n{err}"
    assert "Stopped at once by a second Ctrl-C" in " ".join(err.split())
    assert "Traceback" not in err and "KeyboardInterrupt" not in err + out, err
    assert not (run_dir / "checkpoints" / f"step-{1:08d}").exists()


def test_ctrl_c_before_the_first_step_stops_at_once(workdir, config, data):
    run_dir = workdir / "ctrl_c_setup"
    process = subprocess.Popen([sys.executable, "-m", "bertrain", "pretrain", "--config", str(config), "--data",
                                str(data), "--run-dir", str(run_dir)], env=pretrain_env(), cwd=ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=default_ctrl_c)
    wait_until_handling(process, signal.SIGTERM)  # bertrain's first act: the CLI runs, imports and setup follow
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=300)
    assert process.returncode == 130, f"{out}\n{err}"
    assert "Interrupted." in err and "Traceback" not in err, err
    assert not (run_dir / "checkpoints").exists()  # nothing trained, nothing saved


# ---------------------------------------------------------------------------------------------
# Gradient accumulation, unpadded encoder, world size: the plain run's steps in another order
# ---------------------------------------------------------------------------------------------

def longest_reduction(data: Path) -> int:
    """K of rounding_rtol (step t's loss carries the rounding of t steps): the vocabulary or the tokens of one
    batch, whichever is longer."""
    vocab_size = json.loads((data / "manifest.json").read_text())["tokenizer"]["vocab_size"]
    return max(vocab_size, TINY["train"]["batch_size"] * TINY["data"]["max_seq_length"])


# name: (changes of both runs, changes of the other path's run only, its processes)
PATHS = {
    "accumulation": ({}, {"train": {"gradient_accumulation_steps": 2}}, 1),  # 2 micro-batches of 4 ≡ 1 of 8
    "unpadded": ({}, {"model": {"unpad": "true"}, "train": {"eval_every": N}}, 1),
    "2-processes": ({}, {}, 2),  # 2 ranks × 4 sequences, the gradient all-reduced
    "2-processes-unpadded": ({}, {"model": {"unpad": "true"}}, 2),
    # objective none leaves the pooler and sentence head out of the loss: DDP must still get every gradient.
    "2-processes-mlm-only": ({"data": {"objective": "none"}}, {}, 2),
    # train.compile, as `auto` sets it for long GPU runs: each rank's layers compiled by inductor, under DDP
    "2-processes-compiled": ({}, {"train": {"compile": True}}, 2),
}


def merged(*changes: dict) -> dict:
    """Per-section config changes, the later ones winning."""
    sections: dict = {}
    for change in changes:
        for section, values in change.items():
            sections.setdefault(section, {}).update(values)
    return sections


@pytest.fixture(scope="module")
def path_runs(workdir, data):
    """run(path, kernels, plain) → the finished RUN_DIR of PATHS[path] or, plain, of its plain run (1 process,
    1 micro-batch, padded), without dropout, under KERNELS[kernels]; each distinct run once per module."""
    done: dict = {}

    def run(path: str, kernels: str = "own-kernels", plain: bool = False) -> Path:
        shared, own, nproc = PATHS[path]
        if plain:
            own, nproc = {}, 1
        changes = merged({"model": {"hidden_dropout_prob": 0.0},
                          "train": {"max_steps": STEPS, "save_every": N, "eval_every": 0}}, shared, own)
        key = json.dumps([changes, nproc, kernels], sort_keys=True)
        if key not in done:
            run_dir = workdir / f"{path}{'-plain' if plain else ''}-{kernels}"
            config = write_config(run_dir.with_suffix(".yaml"), **changes)
            # inductor's cache of this run alone: its code shows that a compiled run compiled
            env = kernel_env(kernels, nproc, TORCHINDUCTOR_CACHE_DIR=str(run_dir.with_suffix(".inductor")))
            result = run_pretrain(config, data, run_dir, nproc=nproc, env=env)
            assert result.returncode == 0, explain(result)
            done[key] = run_dir
        return done[key]

    return run


def marked(path: str):
    """A path of PATHS as a test parameter: one with several processes is slow."""
    return path if PATHS[path][2] == 1 else pytest.param(path, marks=[pytest.mark.slow, pytest.mark.multiprocess])


@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("path", [marked(path) for path in PATHS])
def test_another_order_matches_the_plain_run_within_float32_rounding(path_runs, data, path, kernels):
    run_dir = path_runs(path, kernels)
    plain, ours = train_losses(path_runs(path, kernels, plain=True)), train_losses(run_dir)
    assert sorted(ours) == sorted(plain) == list(range(1, STEPS + 1))
    state = json.loads((run_dir / "checkpoints" / f"step-{STEPS:08d}" / "train_state.json").read_text())
    assert state["world_size"] == PATHS[path][2] and state["samples_seen"] == STEPS * TINY["train"]["batch_size"]
    compiled = PATHS[path][1].get("train", {}).get("compile", False)
    assert any(run_dir.with_suffix(".inductor").rglob("*.py")) == compiled  # eager runs generate no code
    for step in plain:
        rtol = rounding_rtol(longest_reduction(data), steps=step)
        assert ours[step] == pytest.approx(plain[step], rel=rtol, abs=0), (step, abs(ours[step] / plain[step] - 1))


@pytest.mark.slow  # 40-100 s on 2 cores: every cross_path test again, in one process
def test_the_in_process_comparisons_hold_under_the_portable_kernels():
    """The comparisons that run inside pytest (marked cross_path) run here under the own kernels: again under the
    portable ones (ATEN_CPU_CAPABILITY is read once per process, hence a pytest of their own)."""
    files = [str(path) for path in sorted((ROOT / "tests").glob("test_*.py"))
             if "mark.cross_path" in path.read_text() and path.name != Path(__file__).name]
    if not files:
        pytest.skip("no test is marked cross_path")
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "cross_path",
                             *files], env=kernel_env("portable-kernels"), cwd=ROOT, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, explain(result)


@pytest.mark.parametrize("path", ["accumulation", "unpadded"])
def test_another_order_resumes_exactly(workdir, data, path_runs, path):
    reference_dir = path_runs(path)
    run_dir = workdir / f"{path}-resumed"
    config = reference_dir.with_suffix(".yaml")
    first = run_pretrain(config, data, run_dir, "--set", f"train.stop_at_step={N}")
    assert first.returncode == 0, explain(first)
    resume(config, data, run_dir)
    assert_resumed_exactly(run_dir, reference_dir)


@pytest.mark.slow
@pytest.mark.multiprocess
def test_two_processes_with_accumulation_resume_exactly_after_sigterm(workdir, data):
    config = write_config(workdir / "ddp_accumulate.yaml",
                          train={"max_steps": STEPS, "save_every": N, "eval_every": N,
                                 "gradient_accumulation_steps": 2})
    reference_dir = workdir / "ddp_ref"
    resume(config, data, reference_dir, nproc=2)
    run_dir = workdir / "ddp_sigterm"
    # Only rank 0 receives the signal: the all-reduced flag must stop both ranks after the same step.
    first = run_pretrain(config, data, run_dir, nproc=2, env=pretrain_env(BERTRAIN_TEST_SIGNAL_AT_STEP=str(N)))
    assert first.returncode == 1, explain(first)  # the ranks exit 75; torchrun reports a failed worker as 1
    assert (run_dir / "checkpoints" / f"step-{N:08d}" / "rng-rank00001.json").is_file()
    assert max(train_losses(run_dir)) == N
    resume(config, data, run_dir, nproc=2)
    assert_resumed_exactly(run_dir, reference_dir)


# ---------------------------------------------------------------------------------------------
# What may change between a checkpoint and its resumption
# ---------------------------------------------------------------------------------------------


def _resume_cli(run_cli, config, data, run_dir, *args):
    code, out, err = run_cli("pretrain", "--config", str(config), "--data", str(data), "--run-dir", str(run_dir),
                             *args)
    return code, " ".join((out + err).split())


def test_changed_settings_are_refused_with_a_diff(run_cli, workdir, config, data, reference, tmp_path,
                                                  fresh_accelerate):
    run_dir = tmp_path / "copy"
    shutil.copytree(reference, run_dir)
    code, text = _resume_cli(run_cli, config, data, run_dir, "--set", "model.hidden_size=64")
    assert code == 2 and "model.hidden_size: 32 → 64" in text and "cannot be overridden" in text
    code, text = _resume_cli(run_cli, config, data, run_dir, "--set", "model.hidden_size=64", "--force")
    assert code == 2 and "model.hidden_size" in text

    code, text = _resume_cli(run_cli, config, data, run_dir, "--set", "optim.lr=0.01")
    assert code == 2 and "optim.lr: 0.001 → 0.01" in text and "--force" in text

    other = make_prepared_dir(tmp_path / "other", kind="wordpiece", num_documents=100, seed=3)
    code, text = _resume_cli(run_cli, config, other, run_dir)
    assert code == 2 and "data fingerprint" in text

    # Changes that do not affect the result pass: log/eval cadence; with --force, the lr too.
    code, text = _resume_cli(run_cli, config, data, run_dir, "--set", "train.log_every=5")
    assert code == 0, text
    code, text = _resume_cli(run_cli, config, data, run_dir, "--set", "optim.name=lamb", "--force")
    assert code == 2 and "optim.name" in text and "cannot be overridden" in text
    # --force: the new lr and the longer schedule apply from the checkpoint on (not the saved ones).
    code, text = _resume_cli(run_cli, config, data, run_dir, "--set", "optim.lr=0.01", "--set",
                             f"train.max_steps={STEPS + 2}", "--force")
    assert code == 0 and "--force: resuming despite: optim.lr" in text and "train.max_steps" in text
    lrs = {r["step"]: r["lr"] for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
           if r["kind"] == "train"}
    warmup = TINY["optim"]["warmup_steps"]
    for step in (STEPS + 1, STEPS + 2):  # linear decay over the new length, from the new peak
        assert lrs[step] == pytest.approx(0.01 * (1 - (step - 1 - warmup) / (STEPS + 2 - warmup)))
