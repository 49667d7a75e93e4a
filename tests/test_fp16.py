"""`bertrain pretrain` under fp16 with a loss scaler, as `mixed_precision: auto` trains on a GPU without bf16 (V100,
T4), emulated on this CPU: Accelerate's fp16 setup (float16 autocast in the model's forward, a GradScaler stepping the
optimizer) with torch's CPU GradScaler, which Accelerate itself does not create on a CPU."""

from __future__ import annotations

import json
import math

import pytest
import torch

import bertrain.train.loop as loop
from bertrain.rundir import iter_checkpoints
from bertrain.train.checkpoint import read_state
from tests.helpers import TINY, final_weights, write_config

STEPS = 6
OPTIMIZERS = ["adamw", "lamb"]  # fused AdamW takes found_inf, so the scaler calls its step even when it skips one


@pytest.fixture
def fp16(monkeypatch):
    """The run's Accelerator as on an fp16 GPU; returns the GradScaler settings (a test may change them) and the
    autocast dtypes the model's forward ran under (None: no autocast)."""
    settings = {"scaler": {"init_scale": 2.0 ** 16, "growth_interval": 2000}, "dtypes": set()}
    build = loop.build_model

    def fp16_accelerator(train):
        from accelerate import Accelerator
        from accelerate.state import AcceleratorState

        AcceleratorState._reset_state(True)
        accelerator = Accelerator(mixed_precision="fp16", cpu=True)
        accelerator.native_amp = True  # what Accelerate sets for fp16 on a GPU: prepare() wraps forward in autocast
        accelerator.scaler = torch.amp.GradScaler("cpu", **settings["scaler"])
        return accelerator

    def watched_model(model_config, **options):
        model = build(model_config, **options)
        model.embeddings.register_forward_hook(lambda module, inputs, output: settings["dtypes"].add(
            torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None))
        return model

    monkeypatch.setattr(loop, "build_accelerator", fp16_accelerator)
    monkeypatch.setattr(loop, "build_model", watched_model)
    return settings


def _iterations(monkeypatch, limit: int = 200) -> list[int]:
    """Count the loop's iterations (counted steps and skipped ones); fail instead of spinning past `limit`."""
    calls, one_step = [], loop.Trainer._one_step

    def counted(self, parts, session):
        calls.append(parts.state.step)
        assert len(calls) <= limit, "the loop kept going without counting steps"
        return one_step(self, parts, session)

    monkeypatch.setattr(loop.Trainer, "_one_step", counted)
    return calls


def _pretrain(run_cli, tmp_path, data, name: str, optimizer: str, *args: str, optim=None, train=None):
    # mixed_precision "no" passes the CPU's precision check (fp16 is refused there); the fixture brings fp16.
    config = write_config(tmp_path / f"{name}.yaml", TINY, optim={**TINY["optim"], "name": optimizer, **(optim or {})},
                          train={"max_steps": STEPS, "save_every": 1, "eval_every": 0, "log_every": 1, "keep_last": 20,
                                 "mixed_precision": "no", **(train or {})})
    run_dir = tmp_path / name
    code, out, err = run_cli("pretrain", "--config", str(config), "--data", str(data), "--run-dir", str(run_dir), *args)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return code, out + err, run_dir, [r for r in records if r["kind"] == "train"]


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_overflowing_steps_are_skipped_and_not_counted(run_cli, tmp_path, tiny_data, fresh_accelerate, fp16,
                                                       monkeypatch, optimizer):
    fp16["scaler"]["init_scale"] = 2.0 ** 40  # far too large: the first steps overflow until the scale fits
    iterations = _iterations(monkeypatch)
    code, text, run_dir, train = _pretrain(run_cli, tmp_path, tiny_data, "run", optimizer)
    assert code == 0, text
    assert fp16["dtypes"] == {torch.float16}  # every forward ran under float16 autocast
    # The scale halves at each overflow (and grows only after 2000 good steps): log2(init / scale) steps skipped.
    scales = [r["loss_scale"] for r in train]
    skipped = round(math.log2(2.0 ** 40 / scales[-1]))
    assert skipped >= 1 and scales == sorted(scales, reverse=True) and len(iterations) == STEPS + skipped
    # Counted steps are the applied ones: the schedule as if nothing was skipped (warmup 2, linear decay to 0) ...
    peak, warmup = TINY["optim"]["lr"], TINY["optim"]["warmup_steps"]
    expected = [peak * min((s - 1) / warmup, (STEPS - s + 1) / (STEPS - warmup)) for s in range(1, STEPS + 1)]
    assert [r["step"] for r in train] == list(range(1, STEPS + 1))
    assert [r["lr"] for r in train] == pytest.approx(expected, rel=1e-12)
    assert all(math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"]) for r in train)
    # ... every one changed the weights (step 1 runs at lr 0: its checkpoint holds the initial weights), and a
    # skipped step before step 1 saved nothing.
    assert [p.name for p in iter_checkpoints(run_dir)][::-1] == [f"step-{s:08d}" for s in range(1, STEPS + 1)]
    for step in range(2, STEPS + 1):
        before, after = final_weights(run_dir, step - 1), final_weights(run_dir, step)
        assert any(not torch.equal(before[k], after[k]) for k in after), f"step {step} changed no weight"
    # The skipped steps consumed their micro-batches (GradScaler's way): the data position says so.
    state = json.loads((run_dir / "checkpoints" / f"step-{STEPS:08d}" / "train_state.json").read_text())
    assert state["epoch"] == 0 and state["micro_batch"] == STEPS + skipped


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_a_resumed_fp16_run_equals_the_uninterrupted_one(run_cli, tmp_path, tiny_data, fresh_accelerate, fp16,
                                                         optimizer):
    # The scale grows every 2 good steps and overflows again: skips all along, so the scaler's state (scale and
    # growth tracker) must come back from the checkpoint for the resumed run to take the same steps.
    fp16["scaler"].update(init_scale=2.0 ** 30, growth_interval=2)
    code, text, reference, train = _pretrain(run_cli, tmp_path, tiny_data, "reference", optimizer)
    assert code == 0, text
    code, text, resumed, _ = _pretrain(run_cli, tmp_path, tiny_data, "resumed", optimizer,
                                       train={"stop_at_step": STEPS // 2})
    assert code == 0 and "stop_at_step" in text, text
    code, text, resumed, resumed_train = _pretrain(run_cli, tmp_path, tiny_data, "resumed", optimizer)
    assert code == 0, text
    assert len({r["loss_scale"] for r in train}) > 1  # the scale moved during the run
    for a, b in zip(train[STEPS // 2:], resumed_train[STEPS // 2:], strict=True):
        assert (a["step"], a["loss"], a["loss_scale"]) == (b["step"], b["loss"], b["loss_scale"])
    a, b = final_weights(reference, STEPS), final_weights(resumed, STEPS)
    assert all(torch.equal(a[k], b[k]) for k in a)
    saved = json.loads((resumed / "checkpoints" / f"step-{STEPS:08d}" / "scaler.json").read_text())["state"]
    assert saved["scale"] == train[-1]["loss_scale"] and saved["growth_interval"] == 2


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_a_non_finite_loss_stops_after_max_bad_steps(run_cli, tmp_path, tiny_data, fresh_accelerate, fp16,
                                                     monkeypatch, optimizer):
    # lr 1e30 makes step 1's update overflow the next forward: every later loss is NaN, and no scale helps.
    iterations = _iterations(monkeypatch)
    code, text, run_dir, train = _pretrain(run_cli, tmp_path, tiny_data, "run", optimizer,
                                           optim={"lr": 1e30, "warmup_steps": 0}, train={"max_bad_steps": 3})
    assert code == 1, text
    assert "Training stopped at step 1: 3 non-finite steps in a row" in " ".join(text.split())
    assert len(iterations) == 1 + 3 and [r["step"] for r in train] == [1]
    assert [p.name for p in iter_checkpoints(run_dir)] == ["step-00000001"]  # finite, as every checkpoint


def _faults(monkeypatch, overflow=(), infinite_loss=()) -> list[int]:
    """At these 1-based loop iterations: gradients infinite with a finite loss (`overflow`), or the loss infinite
    with finite gradients (`infinite_loss`: a constant added after the forward). Returns _iterations' list."""
    iterations, build = _iterations(monkeypatch), loop.build_model

    def faulty(model_config, **options):
        model = build(model_config, **options)
        model.embeddings.position_embeddings.weight.register_hook(
            lambda grad: grad + float("inf") if len(iterations) in overflow else grad)

        def add_infinity(module, inputs, output):
            if len(iterations) in infinite_loss and module.training:
                output.loss, output.mlm_loss_sum = output.loss + float("inf"), output.mlm_loss_sum + float("inf")
            return output

        model.register_forward_hook(add_infinity)
        return model

    monkeypatch.setattr(loop, "build_model", faulty)
    return iterations


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_gradients_that_overflow_at_every_scale_stop_the_run(run_cli, tmp_path, tiny_data, fresh_accelerate, fp16,
                                                             monkeypatch, optimizer):
    fp16["scaler"]["init_scale"] = 1.0
    iterations = _faults(monkeypatch, overflow=range(1, 201))  # a finite loss, gradients infinite at any scale
    code, text, run_dir, train = _pretrain(run_cli, tmp_path, tiny_data, "run", optimizer)
    assert code == 1, text
    # 1 / 2^14 is the first halving below fairseq's minimum loss scale, 1e-4.
    assert "the fp16 loss scale fell to 6.1e-05, below 0.0001" in " ".join(text.split())
    assert len(iterations) == 14 and not train and not list(iter_checkpoints(run_dir))


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_an_infinite_loss_with_finite_gradients_is_skipped_too(run_cli, tmp_path, tiny_data, fresh_accelerate, fp16,
                                                                monkeypatch, optimizer):
    # The scaler looks at gradients only; a non-finite loss is skipped as without fp16, and counts as a bad step.
    fp16["scaler"]["init_scale"] = 2.0 ** 8  # no overflow of its own
    iterations = _faults(monkeypatch, infinite_loss={3})
    code, text, run_dir, train = _pretrain(run_cli, tmp_path, tiny_data, "run", optimizer)
    assert code == 0, text
    assert len(iterations) == STEPS + 1 and [r["step"] for r in train] == list(range(1, STEPS + 1))
    assert [r["loss_scale"] for r in train] == [2.0 ** 8] * 2 + [2.0 ** 7] * (STEPS - 2)  # halved by the skip
    assert "non-finite loss or gradient in 1 step(s)" in " ".join(text.split())
    saved = read_state(run_dir / "checkpoints" / f"step-{STEPS:08d}", "optimizer")["state"]
    steps = {float(count) for state in saved.values() for count in torch.as_tensor(state["step"]).reshape(-1)}
    assert steps == {float(STEPS)}  # every parameter updated once a counted step, not on the skipped one


def test_a_token_budget_ends_on_an_applied_step(run_cli, tmp_path, tiny_data, fresh_accelerate, fp16, monkeypatch):
    code, text, _, reference = _pretrain(run_cli, tmp_path, tiny_data, "reference", "adamw")
    assert code == 0, text
    budget = reference[3]["tokens_seen"] + 1  # reached by the 5th micro-batch, which overflows
    _faults(monkeypatch, overflow={5})
    code, text, run_dir, train = _pretrain(run_cli, tmp_path, tiny_data, "run", "adamw",
                                           train={"max_steps": None, "max_tokens": budget, "eval_every": 1000})
    assert code == 0, text
    # The skipped 5th micro-batch's tokens count, but the run goes on to step 5: logged, evaluated and saved.
    assert train[-1]["step"] == 5 and train[-1]["tokens_seen"] >= budget
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["kind"] == "eval"] == [5]
    state = json.loads((run_dir / "checkpoints" / "step-00000005" / "train_state.json").read_text())
    assert state["tokens_seen"] == train[-1]["tokens_seen"] and state["micro_batch"] == 6
