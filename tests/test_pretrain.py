"""`bertrain pretrain`: an end-to-end tiny run, dry run, errors before training, non-finite steps, wandb."""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys

import pytest

from tests.helpers import (KERNELS, ROOT, TINY, explain, final_weights, kernel_env, make_prepared_dir, run_pretrain,
                           train_losses, write_config)

# ---------------------------------------------------------------------------------------------
# End to end
# ---------------------------------------------------------------------------------------------


def test_pretrain_logs_evaluates_checkpoints_and_rotates(tmp_path, tiny_data):
    config = write_config(tmp_path / "tiny.yaml", train={"log_every": 2, "save_every": 2, "keep_last": 2})
    run_dir = tmp_path / "run"
    result = run_pretrain(config, tiny_data, run_dir)
    assert result.returncode == 0, explain(result)
    assert "pretrain summary" in result.stdout

    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["kind"] == "train"]
    evals = [r for r in records if r["kind"] == "eval"]
    assert [r["step"] for r in train] == [2, 4, 6]
    assert [r["step"] for r in evals] == [3, 6]
    for record in train:
        for key in ("loss", "mlm_loss", "sentence_loss", "mlm_accuracy", "sentence_accuracy", "lr", "grad_norm",
                    "tokens_per_s", "samples_per_s"):
            assert isinstance(record[key], float), key
        assert record["loss"] == pytest.approx(record["mlm_loss"] + record["sentence_loss"])
        assert 0 <= record["mlm_accuracy"] <= 1 and record["grad_norm"] > 0
    for record in evals:
        assert {"mlm_loss", "mlm_accuracy", "sentence_accuracy"} <= set(record)
    # Linear warmup over 2 steps to 1e-3, then linear decay to 0 at step 6 (lr used by each step).
    assert [r["lr"] for r in train] == pytest.approx([0.5e-3, 0.75e-3, 0.25e-3])

    # Rotation kept the newest two; both valid; the run's files for export exist.
    from bertrain.rundir import find_latest_checkpoint, iter_checkpoints, legacy_pickle_files, verify_checkpoint

    kept = [p.name for p in iter_checkpoints(run_dir)]
    assert kept == ["step-00000006", "step-00000004"]
    assert all(verify_checkpoint(p) is None for p in iter_checkpoints(run_dir))
    latest = find_latest_checkpoint(run_dir)
    state = json.loads((latest / "train_state.json").read_text())
    assert state["step"] == 6 and state["samples_seen"] == 6 * 8
    assert (latest / "rng-rank00000.json").is_file() and (latest / "optimizer.safetensors").is_file()
    assert not legacy_pickle_files(latest)  # no pickle anywhere in a checkpoint

    from bertrain.config import load_config
    from bertrain.data.format import open_prepared

    prepared = open_prepared(tiny_data)
    resolved = load_config(run_dir / "config.yaml")
    assert resolved.model.vocab_size == prepared.vocab_size and resolved.data.path == str(tiny_data)
    assert (run_dir / "tokenizer" / "tokenizer.json").read_bytes() == \
        (tiny_data / "tokenizer" / "tokenizer.json").read_bytes()
    wrapper = json.loads((run_dir / "tokenizer" / "tokenizer_config.json").read_text())
    assert wrapper["model_max_length"] == resolved.model.max_position_embeddings != 512  # the model's, as exported

    # tokens_seen against an independent count from the loader: non-padding tokens of 6 micro-batches.
    from bertrain.data.loader import build_train_loader

    loader = build_train_loader(prepared, resolved.data, seed=resolved.train.seed, epoch=0, micro_batch_size=8,
                                rank=0, world_size=1)
    expected = 0
    for index, batch in enumerate(loader):
        if index == 6:
            break
        expected += int(batch["attention_mask"].sum())
    assert state["tokens_seen"] == train[-1]["tokens_seen"] == expected


ALBERT = {**TINY, "data": {**TINY["data"], "objective": "sop", "masking": "ngram"},
          "model": {**TINY["model"], "type": "albert", "embedding_size": 16, "hidden_act": "gelu_new",
                    "num_hidden_layers": 2, "hidden_dropout_prob": 0.0}}
BF16_EPS = 2.0 ** -7  # torch.finfo(torch.bfloat16).eps


@pytest.fixture(scope="module")
def albert_runs(tmp_path_factory):
    """run(kernels, accumulation) → (DATA_DIR, RUN_DIR) of 3 bf16 steps of a tiny ALBERT (SOP, n-gram masking,
    no dropout) under KERNELS[kernels], each run once per module; the default one also logs to wandb offline."""
    root = tmp_path_factory.mktemp("albert")
    data = make_prepared_dir(root / "unigram", kind="unigram", num_documents=80, vocab_size=600)
    done = set()

    def run(kernels: str = "own-kernels", accumulation: int = 2):
        run_dir = root / f"{kernels}-accumulation-{accumulation}"
        if run_dir not in done:
            wandb = (kernels, accumulation) == ("own-kernels", 2)
            train = {"mixed_precision": "bf16", "max_steps": 3, "eval_every": 3, "deterministic": False,
                     "gradient_accumulation_steps": accumulation}
            config = write_config(run_dir.with_suffix(".yaml"), ALBERT, train=train,
                                  logging={"wandb": "offline" if wandb else "off"})
            env = kernel_env(kernels)
            if wandb:
                env.pop("WANDB_MODE")
            result = run_pretrain(config, data, run_dir, env=env)
            assert result.returncode == 0, explain(result)
            done.add(run_dir)
        return data, run_dir

    return run


def test_albert_sop_bf16_with_accumulation_logs_to_wandb_offline_and_exports(albert_runs):
    data, run_dir = albert_runs()
    offline_runs = list((run_dir / "wandb").glob("offline-run-*"))
    assert len(offline_runs) == 1 and list(offline_runs[0].glob("*.wandb"))

    # The result loads in transformers.
    import torch
    from transformers import AlbertForPreTraining

    from bertrain.model import hf

    out = run_dir.parent / "hf"
    hf.export_hf(run_dir / "checkpoints" / "step-00000003", out)
    model = AlbertForPreTraining.from_pretrained(out)
    assert model.config.vocab_size == json.loads((data / "manifest.json").read_text())["tokenizer"]["vocab_size"]
    assert torch.isfinite(model.albert.embeddings.word_embeddings.weight).all()


@pytest.mark.parametrize("kernels", KERNELS)
def test_albert_bf16_accumulation_matches_one_micro_batch_within_bf16_rounding(albert_runs, kernels):
    # 2 micro-batches of 4 and 1 of 8 train on the same instances. Under bf16 autocast the products are rounded to
    # bfloat16 while sums and the loss stay float32; the two layouts may round a product to either neighbour, one
    # bf16 unit (eps_bf16 relative), which moves a step's loss by about eps_bf16 relative at most, and each update
    # carries it into the later steps: rtol(t) = eps_bf16 · t (the float32 rounding of the sums is far below it).
    accumulated, whole = (train_losses(albert_runs(kernels, accumulation)[1]) for accumulation in (2, 1))
    assert sorted(accumulated) == sorted(whole) == [1, 2, 3]
    for step in whole:
        assert accumulated[step] == pytest.approx(whole[step], rel=BF16_EPS * step, abs=0), step


def test_dry_run_reports_size_and_time_and_writes_nothing(run_cli, tmp_path, tiny_data, fresh_accelerate):
    config = write_config(tmp_path / "tiny.yaml", train={"max_steps": 40})
    run_dir = tmp_path / "run"
    code, out, err = run_cli("pretrain", "--config", str(config), "--data", str(tiny_data), "--run-dir", str(run_dir),
                             "--dry-run")
    assert code == 0, err
    text = " ".join(out.replace("│", " ").split())
    from bertrain.config import load_config
    from bertrain.data.format import open_prepared
    from bertrain.data.loader import num_micro_batches, train_dataset
    from bertrain.model import build_model

    prepared = open_prepared(tiny_data)
    resolved = load_config(config)
    resolved.model.vocab_size = prepared.vocab_size
    parameters = sum(p.numel() for p in build_model(resolved.model).parameters())
    steps = num_micro_batches(prepared, resolved.data, seed=42, epoch=0, micro_batch_size=8, world_size=1)
    assert f"parameters {parameters:,}" in text
    assert f"steps per epoch {steps:,.1f}" in text
    assert "total steps 40" in text
    dataset = train_dataset(prepared, resolved.data, seed=42, epoch=0, micro_batch_size=8, rank=0, world_size=1)
    trained = sum(int(dataset[i]["attention_mask"].sum()) for i in range(len(dataset)))  # what the epoch's steps count
    assert f"tokens per epoch {trained:,} (its instances" in text
    for label in ("checkpoint size", "disk needed", "estimated time"):
        assert label in text
    assert not run_dir.exists()


def test_a_run_evaluates_after_its_last_step_too(run_cli, tmp_path, tiny_data, fresh_accelerate):
    """A run shorter than train.eval_every (or not a multiple of it) ended without validation figures."""
    config = write_config(tmp_path / "tiny.yaml", train={"max_steps": 5, "eval_every": 3, "save_every": 100})
    run_dir = tmp_path / "run"
    code, out, err = run_cli("pretrain", "--config", str(config), "--data", str(tiny_data), "--run-dir", str(run_dir))
    assert code == 0, err
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r.get("kind") == "eval"] == [3, 5]
    assert "eval mlm_accuracy" in " ".join(out.replace("│", " ").split())


def test_a_token_budget_plans_the_schedule_it_runs(run_cli, tmp_path, tiny_data, fresh_accelerate):
    """train.max_tokens: the lr schedule's length is the step the budget ends at (NSP's negatives make an epoch
    train ~25% more tokens than the split holds: sized from the split, the run stopped at 80% of its schedule)."""
    from bertrain.config import load_config
    from bertrain.data.format import open_prepared
    from bertrain.data.loader import train_dataset

    prepared = open_prepared(tiny_data)
    config = write_config(tmp_path / "tiny.yaml", train={"max_steps": None, "save_every": 1000, "eval_every": 0})
    data_config = load_config(config, ["train.max_tokens=1"]).data
    dataset = train_dataset(prepared, data_config, seed=42, epoch=0, micro_batch_size=8, rank=0, world_size=1)
    per_step = [int(dataset[i]["attention_mask"].sum()) for i in range(len(dataset))]
    budget = sum(per_step[:len(per_step) * 2 // 3])  # ends inside the first epoch, whose plan sizes the schedule
    run_dir = tmp_path / "run"
    code, out, err = run_cli("pretrain", "--config", str(config), "--data", str(tiny_data), "--run-dir", str(run_dir),
                             "--set", f"train.max_tokens={budget}")
    assert code == 0, err
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    planned = next(r["total_steps"] for r in records if r.get("kind") == "start")
    stopped = next(r for r in records if r.get("kind") == "stop")
    assert stopped["reason"] == "finished" and stopped["step"] == len(per_step) * 2 // 3
    # the schedule: the budget over the epoch's mean tokens per step (counted here from its batches); the steps
    # actually taken differ from it only by how the first steps' sizes differ from the epoch's mean
    assert planned == math.ceil(budget / (sum(per_step) / len(per_step))), (planned, stopped["step"])
    assert abs(planned - stopped["step"]) < 0.05 * stopped["step"]  # 25% before: an NSP epoch's extra tokens


# ---------------------------------------------------------------------------------------------
# Errors before any training
# ---------------------------------------------------------------------------------------------


def _pretrain(run_cli, config, data, run_dir, *args):
    code, out, err = run_cli("pretrain", "--config", str(config), "--data", str(data), "--run-dir", str(run_dir),
                             *args)
    return code, " ".join((out + err).split())


def test_missing_or_invalid_data_dir(run_cli, tmp_path, fresh_accelerate):
    config = write_config(tmp_path / "tiny.yaml")
    code, text = _pretrain(run_cli, config, tmp_path / "nowhere", tmp_path / "run")
    assert code == 1 and "nowhere" in text and "does not exist" in text and "bertrain prepare" in text
    (tmp_path / "empty").mkdir()
    code, text = _pretrain(run_cli, config, tmp_path / "empty", tmp_path / "run")
    assert code == 1 and "no manifest.json" in text
    assert not (tmp_path / "run").exists()


def test_whole_word_masking_needs_a_known_tokenizer_kind(run_cli, tmp_path, tiny_data, fresh_accelerate):
    import shutil

    from bertrain.data.format import write_manifest

    odd = tmp_path / "bpe_data"
    shutil.copytree(tiny_data, odd)
    manifest = json.loads((odd / "manifest.json").read_text())
    manifest["tokenizer"]["kind"] = "bpe"
    write_manifest(odd, {k: v for k, v in manifest.items() if k not in ("fingerprint", "format_version")})
    config = write_config(tmp_path / "tiny.yaml")
    code, text = _pretrain(run_cli, config, odd, tmp_path / "run", "--set", "data.masking=whole_word")
    assert code == 2 and "data.masking" in text and "'bpe'" in text


def test_the_batch_must_divide_over_processes_and_accumulation():
    from bertrain.config import load_config, micro_batch_size_for
    from bertrain.errors import ConfigError

    config = load_config(None, ["train.batch_size=6", "train.gradient_accumulation_steps=3"])
    assert micro_batch_size_for(config, 1) == 2
    with pytest.raises(ConfigError, match=r"train.batch_size.*2 x 3 = 6|divisible"):
        micro_batch_size_for(load_config(None, ["train.batch_size=6", "train.gradient_accumulation_steps=2"]), 2)


@pytest.mark.parametrize("overrides, code, words", [
    (["train.batch_size=100000"], 1, ["no complete micro-batch of 100000 x 1", "smaller train.batch_size"]),
    (["model.vocab_size=100"], 2, ["model.vocab_size", "(100)"]),
    (["train.batch_size=9", "train.gradient_accumulation_steps=2"], 2, ["train.batch_size"]),
    (["train.max_step=3"], 2, ["train.max_step", "max_steps"]),
], ids=["batch-over-the-split", "vocab-under-the-tokenizer", "batch-not-divisible", "key-typo"])
def test_a_setting_that_cannot_train_is_refused_before_training(run_cli, tmp_path, tiny_data, fresh_accelerate,
                                                                 overrides, code, words):
    config = write_config(tmp_path / "tiny.yaml")
    sets = [arg for override in overrides for arg in ("--set", override)]
    exit_code, text = _pretrain(run_cli, config, tiny_data, tmp_path / "run", *sets)
    assert exit_code == code and all(word in text for word in words), text
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_full_disk_is_refused_before_training(run_cli, tmp_path, tiny_data, fresh_accelerate, monkeypatch):
    import bertrain.train.checkpoint as checkpoint

    monkeypatch.setattr(checkpoint, "free_disk_bytes", lambda path: 10_000)
    config = write_config(tmp_path / "tiny.yaml")
    code, text = _pretrain(run_cli, config, tiny_data, tmp_path / "run")
    assert code == 1 and "free" in text and "checkpoint" in text
    assert not (tmp_path / "run" / "checkpoints").exists() and not (tmp_path / "run" / "metrics.jsonl").exists()


def test_resume_never_refuses_a_used_run_dir(run_cli, tmp_path, tiny_data, fresh_accelerate):
    config = write_config(tmp_path / "tiny.yaml")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text("")
    code, text = _pretrain(run_cli, config, tiny_data, tmp_path / "run", "--resume", "never")
    assert code == 2 and "not empty" in text


# ---------------------------------------------------------------------------------------------
# Non-finite steps, signals, wandb
# ---------------------------------------------------------------------------------------------


def _not_strict_json(constant: str):
    raise AssertionError(f"metrics.jsonl holds {constant}: strict JSON readers (jq, JavaScript) reject it")


def test_non_finite_steps_are_skipped_then_stop_naming_the_step(run_cli, tmp_path, tiny_data, fresh_accelerate):
    # lr 1e30 makes step 1's update overflow the next forward: every later loss is NaN.
    config = write_config(tmp_path / "tiny.yaml", optim={"lr": 1e30, "warmup_steps": 0},
                          train={"max_bad_steps": 3, "save_every": 1})
    code, text = _pretrain(run_cli, config, tiny_data, tmp_path / "run")
    assert code == 1
    # Skipped updates still count as steps (the flag is read at log/save time, not every step): 2, 3, 4.
    assert "Training stopped at step 4: 3 non-finite steps in a row" in text
    assert text.count("step skipped") == 3
    records = [json.loads(line, parse_constant=_not_strict_json)
               for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert any(r["kind"] == "train" and r["loss"] is None for r in records)  # NaN is written as null
    assert records[-1]["kind"] == "stop" and records[-1]["reason"] == "failed: TrainingDiverged"  # not "DataError"
    # Only step 1 (finite) was checkpointed; nothing non-finite reached a checkpoint.
    import torch

    from bertrain.rundir import iter_checkpoints

    assert [p.name for p in iter_checkpoints(tmp_path / "run")] == ["step-00000001"]
    weights = final_weights(tmp_path / "run", 1)
    assert all(torch.isfinite(t).all() for t in weights.values())


def test_second_signal_exits_at_once(tmp_path):
    code = ("import os, signal, time\n"
            "from bertrain.train import signals\n"
            "signals.install_handlers()\n"
            "os.kill(os.getpid(), signal.SIGUSR1)\n"
            "os.kill(os.getpid(), signal.SIGUSR1)\n"  # the same request twice (srun + launcher): no exit
            "time.sleep(0.2)\n"
            "assert signals.stop_requested() and signals.received_signal_name() == 'SIGUSR1'\n"
            "print('first signal recorded', flush=True)\n"
            "signals.DUPLICATE_WINDOW = 0.1\n"
            "os.kill(os.getpid(), signal.SIGTERM)\n"
            "time.sleep(5)\n"
            "print('still alive')\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30, cwd=ROOT)
    assert "first signal recorded" in result.stdout and "still alive" not in result.stdout
    assert result.returncode == 128 + signal.SIGTERM


def test_wandb_online_without_network_falls_back_to_offline(tmp_path, monkeypatch):
    from bertrain.config import LoggingConfig
    from bertrain.train.monitor import init_wandb

    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")  # nothing listens there
    warnings: list[str] = []
    run = init_wandb(LoggingConfig(wandb="online", wandb_init_timeout=5), tmp_path, {"x": 1}, warnings.append)
    try:
        assert run.settings.mode == "offline"
        run.log({"train/loss": 1.5}, step=1)
    finally:
        run.finish()
    assert len(warnings) == 1 and "logging offline" in warnings[0]
    assert list((tmp_path / "wandb").glob("offline-run-*"))


def test_token_budget_stops_at_the_first_step_that_reaches_it(run_cli, tmp_path, tiny_data, fresh_accelerate):
    config = write_config(tmp_path / "tiny.yaml", train={"max_steps": None, "max_tokens": 1500, "eval_every": 0})
    run_dir = tmp_path / "run"
    code, text = _pretrain(run_cli, config, tiny_data, run_dir)
    assert code == 0, text
    # The summary ends with the command to run next, on this RUN_DIR.
    assert text.endswith(f"Next: bertrain export {run_dir} exported/run --verify (a transformers model directory)")
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    seen = [r["tokens_seen"] for r in records if r["kind"] == "train"]
    assert seen[-1] >= 1500 > seen[-2]
    state = json.loads((run_dir / "checkpoints" / f"step-{len(seen):08d}" / "train_state.json").read_text())
    assert state["tokens_seen"] == seen[-1]
    # The schedule length was estimated from the data (tokens per step), close to the steps actually taken.
    assert abs(state["total_steps"] - len(seen)) <= 2
