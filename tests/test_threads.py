"""train.threads (issue 26.2): the choice between thread counts from injected pass timings (no wall clock), when
`auto` leaves torch's count alone, re-measuring, the progress's note when training is far below the estimate,
and the key's validation."""

from __future__ import annotations

import io
import subprocess
import sys

import pytest
import torch

from bertrain.config import load_config
from bertrain.console import make_console
from bertrain.errors import ConfigError
from bertrain.train import threads
from bertrain.train.monitor import Monitor, slowness_note
from bertrain.train.threads import (KEEP_DEFAULT_WITHIN, RECHECK_SECONDS, SLOW_RECHECK_SECONDS, ThreadPlan,
                                    ThreadTuner, choose_threads, plan_threads, probe_rows)


@pytest.fixture(autouse=True)
def keep_torch_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_the_default_count_is_kept_unless_another_is_clearly_faster():
    assert choose_threads({2: [0.10, 0.11], 1: [0.16, 0.15]}, default=2) == 2          # idle: more threads win
    assert choose_threads({2: [0.60, 0.75], 1: [0.20, 0.22]}, default=2) == 1          # a busy core: 1 thread
    near = 0.10 * KEEP_DEFAULT_WITHIN * 0.99
    assert choose_threads({2: [near, near], 1: [0.10, 0.10]}, default=2) == 2          # within the margin
    assert choose_threads({8: [0.9, 1.0], 4: [0.3, 0.3], 1: [0.5, 0.6]}, default=8) == 4
    assert choose_threads({2: [0.50, 0.10], 1: [0.20, 0.20]}, default=2) == 2          # one pass held up


def test_a_large_micro_batch_is_probed_on_part_of_it():
    assert probe_rows(seconds_per_row=0.001, rows=128) == 128
    assert probe_rows(seconds_per_row=threads.PROBE_PASS_SECONDS / 10, rows=128) == 10
    assert probe_rows(seconds_per_row=100.0, rows=128) == 1


def test_auto_compares_counts_only_where_it_is_the_process_own_choice(monkeypatch):
    monkeypatch.setattr(torch, "get_num_threads", lambda: 8)
    common = dict(world_size=1, deterministic=False, environ={})
    assert plan_threads("auto", device_type="cpu", **common).candidates == [8, 4, 1]
    assert plan_threads("auto", device_type="cuda", **common) is None
    assert plan_threads("auto", device_type="cpu", **{**common, "world_size": 2}) is None
    launched = plan_threads("auto", device_type="cpu", **{**common, "environ": {"OMP_NUM_THREADS": "1"}})
    assert launched.candidates == [8] and "OMP_NUM_THREADS" in launched.reason and not launched.auto
    exact = plan_threads("auto", device_type="cpu", **{**common, "deterministic": True})
    assert exact.candidates == [8] and "deterministic" in exact.reason
    compiled = plan_threads("auto", device_type="cpu", **{**common, "compiled": True})
    assert compiled.candidates == [8] and "train.compile" in compiled.reason and not compiled.auto
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    assert plan_threads("auto", device_type="cpu", **common).candidates == [1]


def test_a_number_is_set_whatever_the_device():
    plan = plan_threads(1, device_type="cpu", world_size=1, deterministic=False, environ={"OMP_NUM_THREADS": "4"})
    assert torch.get_num_threads() == 1 and plan.candidates == [1] and not plan.auto
    torch.set_num_threads(2)
    assert plan_threads(1, device_type="cuda", world_size=1, deterministic=False, environ={}) is None
    assert torch.get_num_threads() == 1


class FakeMachine:
    """Pass times per thread count (seconds per sequence), on a clock of its own; each pass draws random numbers."""

    def __init__(self, per_row: dict[int, float]) -> None:
        self.per_row, self.now, self.passes = per_row, 0.0, []

    def forward_backward(self, model, accelerator, batch) -> None:
        torch.rand(3)  # dropout would: the run's RNG must not see it
        rows = len(batch["input_ids"])
        self.passes.append((torch.get_num_threads(), rows))
        self.now += self.per_row[torch.get_num_threads()] * rows


class Model:
    def zero_grad(self, set_to_none: bool = True) -> None: ...


def test_the_tuner_follows_the_load_and_leaves_the_rng_alone(monkeypatch):
    machine = FakeMachine({2: 0.006, 1: 0.002})  # busy: 2 threads 3x slower than 1
    monkeypatch.setattr(threads, "forward_backward", machine.forward_backward)
    clock = [0.0]
    batch = {"input_ids": torch.ones(16, 8, dtype=torch.long), "attention_mask": torch.ones(16, 8, dtype=torch.long)}
    torch.manual_seed(0)
    rng = torch.get_rng_state()
    tuner = ThreadTuner(ThreadPlan([2, 1], "train.threads=auto"), Model(), None, batch, clock=lambda: clock[0],
                        timer=lambda: machine.now)
    line = tuner.probe()
    assert torch.equal(torch.get_rng_state(), rng)
    assert tuner.threads == 1 and torch.get_num_threads() == 1
    assert line.startswith("CPU threads: 1 (train.threads=auto") and "2 thread(s) 96 ms, 1 thread(s) 32 ms" in line
    # After the warm-up: 2, 1, 1, and not 2 again (its pass took over SKIP_BEYOND times the fastest).
    assert [threads for threads, rows in machine.passes][1:] == [2, 1, 1]
    assert tuner.estimate == pytest.approx(16 * 8 / 0.032)
    assert not tuner.due()
    clock[0] = SLOW_RECHECK_SECONDS
    tuner.observe(0.4 * tuner.estimate)  # far below: measured again sooner
    assert tuner.due()
    machine.per_row = {2: 0.001, 1: 0.002}  # the other process ended
    assert tuner.probe() .startswith("CPU threads: 2") and torch.get_num_threads() == 2
    assert tuner.estimate == pytest.approx(16 * 8 / 0.016) and not tuner.due()
    clock[0] += SLOW_RECHECK_SECONDS
    tuner.observe(0.1 * tuner.estimate)  # the same slow stretch: once was enough, until RECHECK_SECONDS
    assert not tuner.due()
    clock[0] += RECHECK_SECONDS
    assert tuner.due() and tuner.probe() is None  # unchanged: nothing to say
    assert torch.equal(torch.get_rng_state(), rng)


def test_a_fixed_count_is_measured_once_for_the_estimate(monkeypatch):
    machine = FakeMachine({1: 0.002})
    monkeypatch.setattr(threads, "forward_backward", machine.forward_backward)
    torch.set_num_threads(1)
    batch = {"input_ids": torch.ones(4, 8, dtype=torch.long), "attention_mask": torch.ones(4, 8, dtype=torch.long)}
    tuner = ThreadTuner(ThreadPlan([1], "train.threads=1"), Model(), None, batch, timer=lambda: machine.now)
    assert tuner.probe() is None and tuner.estimate == pytest.approx(32 / 0.008)
    assert len(machine.passes) == 2 and not tuner.due()  # a warm-up and one timed pass; never again


def test_the_progress_says_when_training_is_far_below_the_estimate(tmp_path):
    assert slowness_note(9000, estimate=10000) is None and slowness_note(9000, estimate=0) is None
    out = io.StringIO()
    monitor = Monitor(tmp_path, load_config(None), make_console(file=out))  # not a terminal
    monitor.start(start_step=0, total_steps=100)
    monitor.expect(10000.0)
    for step, rate in ((10, 1000.0), (20, 2000.0), (30, 2500.0), (40, 8000.0), (50, 1000.0)):
        monitor.log({"kind": "train", "step": step, "loss": 5.0, "tokens_per_s": rate})
    monitor.close()
    warnings = [line for line in out.getvalue().splitlines() if line.startswith("Warning:")]
    assert len(warnings) == 2  # once each time it becomes slow (steps 20 and 50), not in the first window
    assert warnings[0].startswith("Warning: step 20: running at 0.2x the estimate (2,000 of 10,000 tokens/s")
    assert "other processes use the CPU (train.threads)" in warnings[0] and "step 50: running at 0.1x" in warnings[1]


def test_the_key_is_auto_or_a_positive_count(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("data:\n  path: d\n")
    assert load_config(str(path)).train.threads == "auto"
    assert load_config(str(path), ["train.threads=3"]).train.threads == 3
    for bad, why in (("many", "not a valid int"), ("0", "at least 1, or auto"), ("-2", "at least 1, or auto")):
        with pytest.raises(ConfigError, match=rf"'train\.threads'.*{why}"):
            load_config(str(path), [f"train.threads={bad}"])


def test_the_finetune_key_is_auto_or_a_positive_count(monkeypatch):
    from bertrain.config.finetune import finetune_config

    assert finetune_config({}, []).threads == "auto" and finetune_config({}, ["finetune.threads=3"]).threads == 3
    for bad, why in (("many", "not a valid int"), ("0", "at least 1, or auto"), ("-2", "at least 1, or auto")):
        with pytest.raises(ConfigError, match=rf"'finetune\.threads'.*{why}"):
            finetune_config({}, [f"finetune.threads={bad}"])
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    plan = plan_threads("auto", device_type="cpu", world_size=1, deterministic=False, environ={},
                        key="finetune.threads")
    assert plan.candidates == [2, 1] and plan.reason == "finetune.threads=auto"


def test_an_auto_run_says_which_count_it_measured_and_trains(tmp_path, tiny_data):
    from tests.helpers import explain, pretrain_env, run_pretrain, train_losses, write_config

    env = pretrain_env()
    del env["OMP_NUM_THREADS"]  # set by a launcher (or the tests' default): auto would keep it
    config = write_config(tmp_path / "tiny.yaml", train={"max_steps": 3, "save_every": 3, "eval_every": 0,
                                                          "deterministic": False})
    result = run_pretrain(config, tiny_data, tmp_path / "run", env=env)
    assert result.returncode == 0, explain(result)
    if "CPU threads: " not in result.stdout:  # only where torch's default is one thread: nothing to compare
        default = subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"], env=env,
                                 capture_output=True, text=True, check=True).stdout
        assert default.strip() == "1", result.stdout
    assert sorted(train_losses(tmp_path / "run")) == [1, 2, 3]
