"""`pretrain --dry-run` (issue 16.1, 15.8): figures at once, at most one micro-batch measured, and only when
that is quick, a signal ends it at once, nothing written."""

from __future__ import annotations

import functools
import signal
import subprocess
import sys

import pytest

from bertrain.train import dry_run
from tests.helpers import ROOT, explain, make_prepared_dir, pretrain_env, write_config

# albert_base as shipped wants 4096 x 512 per micro-batch; 128 accumulation steps make it 32 x 512, the
# size a small test corpus can fill (the dry run must still never run a step at that size on this CPU).
ALBERT_BASE = ("--config", "albert_base", "--set", "train.gradient_accumulation_steps=128")


@pytest.fixture(scope="module")
def unigram_data(tmp_path_factory):
    return make_prepared_dir(tmp_path_factory.mktemp("data") / "unigram", kind="unigram", num_documents=120)


def _dry_run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bertrain", "pretrain", *args, "--dry-run"], cwd=ROOT,
                          env=env or pretrain_env(), capture_output=True, text=True, timeout=600)


def test_albert_base_dry_run_prints_figures_first_and_measures_at_most_one_micro_batch(unigram_data, tmp_path):
    run_dir = tmp_path / "R"
    result = _dry_run(*ALBERT_BASE, "--data", str(unigram_data), "--run-dir", str(run_dir))
    assert result.returncode == 0, explain(result)
    text = " ".join(result.stdout.replace("│", " ").split())
    for figure in ("parameters", "tokens per epoch", "steps per epoch", "total steps 125,000", "epochs",
                   "checkpoint size", "disk needed", "micro-batch per process 32 x 128 accumulation"):
        assert figure in text, figure
    # Either the estimate is skipped, saying why, or one micro-batch of 32 (never the 4096 of a step) is measured.
    skipped, measured = "estimate skipped: one micro-batch (32 x 512 tokens" in text, \
        "measuring one micro-batch (32 x 512 tokens" in text
    assert skipped != measured, text
    assert text.index("disk needed") < text.index("estimate skipped" if skipped else "measuring one micro-batch")
    assert not run_dir.exists()


def test_the_estimate_is_skipped_when_one_micro_batch_is_slow_here(run_cli, unigram_data, tmp_path, monkeypatch,
                                                                   fresh_accelerate):
    monkeypatch.setattr(dry_run, "matmul_rate", lambda accelerator: 1e9)  # a 1 GFLOP/s device
    monkeypatch.setattr(dry_run, "measure_micro_batch", lambda *a, **k: pytest.fail("measured a slow micro-batch"))
    code, out, err = run_cli("pretrain", *ALBERT_BASE, "--data", str(unigram_data), "--run-dir", str(tmp_path / "R"),
                             "--dry-run")
    assert code == 0, err
    text = " ".join(out.split())
    flops = dry_run.training_flops(_albert_base_model(unigram_data), 32, 512, 0.15)
    assert f"{flops / 1e12:,.1f} TFLOP" in text and "over the 10 s a dry run spends" in text
    assert "rough time from FLOPs alone (not measured)" in text and "measuring" not in text
    assert not (tmp_path / "R").exists()


def test_a_quick_micro_batch_is_measured_once_at_its_own_size(run_cli, tiny_data, tmp_path, monkeypatch,
                                                             fresh_accelerate):
    calls = []
    monkeypatch.setattr(dry_run, "matmul_rate", lambda accelerator: 1e15)
    monkeypatch.setattr(dry_run, "measure_micro_batch",
                        lambda model, accelerator, batch, warmup_rows=1: calls.append(batch["input_ids"].shape) or 0.5)
    config = write_config(tmp_path / "tiny.yaml", train={"max_steps": 40, "gradient_accumulation_steps": 2})
    code, out, err = run_cli("pretrain", "--config", str(config), "--data", str(tiny_data), "--run-dir",
                             str(tmp_path / "R"), "--dry-run")
    assert code == 0, err
    assert len(calls) == 1 and calls[0][0] == 4  # batch 8 over 2 accumulation steps
    text = " ".join(out.replace("│", " ").split())
    assert "measuring one micro-batch (4 x 64 tokens" in text
    assert "measured step time 1.000 s (2 micro-batch(es))" in text and "estimated time 0m40s" in text
    assert "torch.compile off (train.compile auto: off on cpu)" in text  # what the run would do here


def test_the_estimate_uses_the_thread_count_the_run_would_choose(run_cli, tiny_data, tmp_path, monkeypatch,
                                                                 fresh_accelerate):
    """train.threads auto on a busy CPU: the run picks 1 thread where 2 are 8x slower; the dry run did not."""
    import torch

    from bertrain.train import threads

    monkeypatch.setattr(dry_run, "matmul_rate", lambda accelerator: 1e15)
    monkeypatch.setattr(dry_run, "plan_threads", lambda *a, **k: threads.ThreadPlan([2, 1], "train.threads=auto"))
    clock = [0.0]

    def one_pass(batch):  # what a pass takes at the current count: 8x slower at 2 threads on a busy CPU
        clock[0] += {2: 0.8, 1: 0.1}[torch.get_num_threads()]

    monkeypatch.setattr(dry_run, "ThreadTuner", functools.partial(threads.ThreadTuner, timer=lambda: clock[0],
                                                                  run_pass=one_pass))
    monkeypatch.setattr(dry_run, "measure_micro_batch", lambda *a, **k: pytest.fail("timed outside the tuner"))
    config = write_config(tmp_path / "tiny.yaml", train={"max_steps": 40, "deterministic": False, "threads": "auto"})
    code, out, err = run_cli("pretrain", "--config", str(config), "--data", str(tiny_data), "--run-dir",
                             str(tmp_path / "R"), "--dry-run")
    assert code == 0, err
    text = " ".join(out.replace("│", " ").split())
    assert "one micro-batch (measured) 0.100 s (1 thread(s), as train.threads auto would choose" in text
    assert "estimated time 0m04s" in text


def test_the_quick_enough_check_uses_the_fastest_thread_count(run_cli, tiny_data, tmp_path, monkeypatch,
                                                              fresh_accelerate):
    """Audit 4: on a busy CPU the matmul rate at the default 2 threads (5x slower than 1) judged a micro-batch too
    slow to tune, so the estimate was timed at 2 threads: 3.4x the real run's 1-thread steps."""
    import torch

    from bertrain.train import threads

    monkeypatch.setattr(dry_run, "matmul_rate", lambda accelerator: {1: 1e15}.get(torch.get_num_threads(), 1e6))
    monkeypatch.setattr(dry_run, "plan_threads", lambda *a, **k: threads.ThreadPlan([2, 1], "train.threads=auto"))
    clock = [0.0]

    def one_pass(batch):
        clock[0] += {2: 0.8, 1: 0.1}[torch.get_num_threads()]

    monkeypatch.setattr(dry_run, "ThreadTuner", functools.partial(threads.ThreadTuner, timer=lambda: clock[0],
                                                                  run_pass=one_pass))
    monkeypatch.setattr(dry_run, "measure_micro_batch", lambda *a, **k: pytest.fail("timed outside the tuner"))
    default = torch.get_num_threads()
    torch.set_num_threads(2)  # the count the rate was measured at before
    try:
        config = write_config(tmp_path / "tiny.yaml", train={"max_steps": 40, "deterministic": False,
                                                             "threads": "auto"})
        code, out, err = run_cli("pretrain", "--config", str(config), "--data", str(tiny_data), "--run-dir",
                                 str(tmp_path / "R"), "--dry-run")
    finally:
        torch.set_num_threads(default)
    assert code == 0, err
    text = " ".join(out.replace("│", " ").split())
    assert "one micro-batch (measured) 0.100 s (1 thread(s), as train.threads auto would choose" in text, text


def test_a_dry_run_on_a_run_dir_says_what_the_run_would_resume_or_refuse(run_cli, tiny_data, tmp_path,
                                                                          fresh_accelerate):
    """It resumed nothing and said nothing: a finished run's dry run planned from step 0, and a change the real run
    refuses (exit 2) went unmentioned."""
    config = write_config(tmp_path / "tiny.yaml", train={"max_steps": 4, "save_every": 2, "eval_every": 0})
    run_dir = tmp_path / "R"
    code, _, err = run_cli("pretrain", "--config", str(config), "--data", str(tiny_data), "--run-dir", str(run_dir))
    assert code == 0, err
    before = sorted(p.name for p in (run_dir / "checkpoints").iterdir())

    def dry_run_text(*sets: str) -> str:
        code, out, err = run_cli("pretrain", "--config", str(config), "--data", str(tiny_data), "--run-dir",
                                 str(run_dir), "--dry-run", *(a for s in sets for a in ("--set", s)))
        assert code == 0, err
        return " ".join(out.replace("│", " ").split())

    assert f"The run would resume from {run_dir / 'checkpoints' / 'step-00000004'} (step 4, 4 of the 8 steps left)" \
        in dry_run_text("train.max_steps=8")
    refused = dry_run_text("train.max_steps=8", "train.batch_size=16")
    assert "The run would stop here (exit 2): Cannot resume from" in refused and "train.batch_size" in refused
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == before  # nothing moved or written


def test_sigterm_ends_a_dry_run_at_once_with_its_figures(tiny_data, tmp_path):
    config = write_config(tmp_path / "tiny.yaml")
    env = pretrain_env(BERTRAIN_TEST_STEP_DELAY="600")  # the measured micro-batch would take 10 minutes
    process = subprocess.Popen([sys.executable, "-m", "bertrain", "pretrain", "--config", str(config), "--data",
                                str(tiny_data), "--run-dir", str(tmp_path / "R"), "--dry-run"], cwd=ROOT, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = []
    for line in process.stdout:
        lines.append(line)
        if "measuring one micro-batch" in line:
            break
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=300)
    out = "".join(lines) + out
    assert process.returncode == 128 + signal.SIGTERM, out + err
    assert "disk needed" in out and "pretrain --dry-run stopped by SIGTERM; exit code 143" in err
    assert not (tmp_path / "R").exists()


def _run_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)


def test_a_signal_received_during_setup_ends_the_dry_run_on_entry():
    result = _run_python("import os, signal\n"
                         "from bertrain.train import signals\n"
                         "signals.install_handlers()\n"
                         "os.kill(os.getpid(), signal.SIGTERM)\n"  # recorded only: training would finish its step
                         "assert signals.stop_requested()\n"
                         "with signals.stop_at_once('pretrain --dry-run'):\n"
                         "    print('not reached')\n")
    assert result.returncode == 143 and "not reached" not in result.stdout
    assert "pretrain --dry-run stopped by SIGTERM" in result.stderr


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR1])
def test_the_first_signal_ends_a_dry_run_started_from_the_command_line(sig):
    # What bertrain.cli installs before `import torch` when the command line has --dry-run.
    result = _run_python("import os, sys, time\n"
                         "sys.argv = ['bertrain', 'pretrain', '--dry-run']\n"
                         "from bertrain.train import signals\n"
                         "signals.install_handlers()\n"
                         f"os.kill(os.getpid(), {int(sig)})\n"
                         "time.sleep(30)\n"
                         "print('still alive')\n")
    assert result.returncode == 128 + sig and "still alive" not in result.stdout


def test_stop_at_once_gives_the_handlers_back():
    before = signal.getsignal(signal.SIGINT)
    from bertrain.train.signals import stop_at_once

    with stop_at_once("test"):
        assert signal.getsignal(signal.SIGINT) is not before
    assert signal.getsignal(signal.SIGINT) is before


def test_the_training_loops_ctrl_c_handler_keeps_an_ignored_sigint_ignored():
    from bertrain.train.signals import _handle, ctrl_c_saves

    before = signal.signal(signal.SIGINT, signal.SIG_IGN)    # as `nohup bertrain pretrain ... &` starts it
    try:
        with ctrl_c_saves():
            assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
        signal.signal(signal.SIGINT, signal.default_int_handler)
        with ctrl_c_saves():
            assert signal.getsignal(signal.SIGINT) == _handle
        assert signal.getsignal(signal.SIGINT) == signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, before)


SWALLOWED_CTRL_C = """
import signal, sys
from bertrain.train import signals
if sys.argv[1] == "cli":
    signals.interrupt_at_startup()
class Finalized:
    def __del__(self):  # Python ignores an exception raised here, as in importlib's module-lock callback
        signal.raise_signal(signal.SIGINT)
        sum(range(1000))  # bytecode after the signal: its handler runs here, inside the finalizer
Finalized()
print("startup went on", flush=True)
try:
    with signals.ctrl_c_saves():
        print("training", flush=True)
except KeyboardInterrupt:
    print("interrupted before the first step", flush=True)
"""


@pytest.mark.parametrize("how", ["cli", "in-process"])
def test_a_startup_ctrl_c_that_python_swallowed_stops_the_cli_before_the_first_step(how):
    """A KeyboardInterrupt raised inside a finalizer is printed and ignored; the CLI records Ctrl-C at startup, so
    the loop's start raises it again. A caller in-process keeps Python's own handler (nothing recorded)."""
    result = subprocess.run([sys.executable, "-c", SWALLOWED_CTRL_C, how], capture_output=True, text=True,
                            cwd=ROOT, timeout=120)
    assert "Exception ignored" in result.stderr and "KeyboardInterrupt" in result.stderr  # Python swallowed it
    assert "startup went on" in result.stdout
    if how == "cli":
        assert "interrupted before the first step" in result.stdout and "training" not in result.stdout
    else:
        assert "training" in result.stdout and "interrupted" not in result.stdout


def _albert_base_model(data):
    from bertrain.config import load_config
    from bertrain.data.format import open_prepared

    model = load_config("albert_base").model
    model.vocab_size = open_prepared(data).vocab_size
    return model


# Issue 26.7: a corpus smaller than one batch, and a plan that repeats the data too often


def test_a_corpus_smaller_than_one_batch_gets_the_plan_then_the_problem(run_cli, tiny_data, tmp_path, monkeypatch,
                                                                       fresh_accelerate):
    from bertrain.data.loader import epoch_plan
    from bertrain.data.format import open_prepared
    from bertrain.config import load_config

    monkeypatch.setattr(dry_run, "measure_micro_batch", lambda *a, **k: pytest.fail("measured without a batch"))
    config = write_config(tmp_path / "tiny.yaml", train={"batch_size": 100_000})
    code, out, err = run_cli("pretrain", "--config", str(config), "--data", str(tiny_data), "--run-dir",
                             str(tmp_path / "R"), "--dry-run")
    instances = len(epoch_plan(open_prepared(tiny_data), load_config(config).data, seed=42, epoch=0))
    assert code == 1  # as without --dry-run: a data error
    text = " ".join(out.replace("│", " ").split())
    assert "parameters" in text and "steps per epoch 0 (less data than one micro-batch)" in text
    assert "sequences per step 100,000 x 64 tokens" in text and "epochs -" in text
    assert f"no complete micro-batch of 100000 x 1 instances (it has {instances})" in " ".join(err.split())
    assert not (tmp_path / "R").exists()


def test_a_plan_that_repeats_the_data_over_100_times_is_warned_about(run_cli, tiny_data, tmp_path, monkeypatch,
                                                                      fresh_accelerate):
    monkeypatch.setattr(dry_run, "matmul_rate", lambda accelerator: 1e9)  # no measurement: the figures only
    monkeypatch.setattr(dry_run, "measure_micro_batch", lambda *a, **k: 0.1)

    def figures(max_steps):
        config = write_config(tmp_path / "tiny.yaml", train={"max_steps": max_steps})
        code, out, err = run_cli("pretrain", "--config", str(config), "--data", str(tiny_data), "--run-dir",
                                 str(tmp_path / "R"), "--dry-run")
        assert code == 0, err
        text = " ".join(out.replace("│", " ").split())
        steps_per_epoch = float(text.split("steps per epoch ")[1].split()[0].replace(",", ""))
        return text, steps_per_epoch

    _, steps_per_epoch = figures(10)
    hundred = int(100 * steps_per_epoch)
    text, _ = figures(hundred)  # exactly 100 epochs: no warning
    assert "Warning" not in text
    text, _ = figures(hundred * 30)
    assert f"Warning: the plan repeats the training data {hundred * 30 / steps_per_epoch:,.0f} times" in text
    assert f"--set train.max_steps={hundred} is 100 epochs" in text and "Add data" in text


def test_pretrain_warns_at_start_when_the_plan_repeats_the_data(run_cli, tiny_data, tmp_path, fresh_accelerate):
    config = write_config(tmp_path / "tiny.yaml", train={"max_steps": 100_000, "stop_at_step": 1,
                                                         "save_every": 1, "eval_every": 0})
    code, out, err = run_cli("pretrain", "--config", str(config), "--data", str(tiny_data), "--run-dir",
                             str(tmp_path / "R"))
    assert code == 0, err
    text = " ".join((out + err).split())
    assert "Warning: the plan repeats the training data" in text and "(100,000 steps" in text
