"""Monitor and evaluation: a torn metrics.jsonl survived (15.1), plain progress lines with step N / total
and an ETA off a terminal (16.2), evaluation on a validation split smaller than one micro-batch (15.9)."""

from __future__ import annotations

import io
import json

import pytest
from bertrain import console, rundir
from bertrain.config import load_config
from bertrain.console import make_console
from bertrain.errors import DataError
from bertrain.train.monitor import Monitor, read_metrics, truncate_metrics
from tests.helpers import TINY, explain, make_prepared_dir, run_pretrain, train_losses, write_config

RECORDS = [{"kind": "train", "step": 1, "loss": 9.0}, {"kind": "eval", "step": 2, "mlm_loss": 8.0},
           {"kind": "train", "step": 2, "loss": 8.5}]
TORN = '{"kind": "train", "step": 3, "lo'  # an append cut short by a full disk or a kill


def _write(run_dir, text):
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / rundir.METRICS).write_text(text)
    console._warned.clear()


def test_a_torn_last_line_is_skipped_with_one_warning(tmp_path, capsys):
    _write(tmp_path, "".join(json.dumps(r) + "\n" for r in RECORDS) + TORN)
    assert read_metrics(tmp_path) == RECORDS
    assert read_metrics(tmp_path) == RECORDS
    err = " ".join(capsys.readouterr().err.split())
    assert err.count("ends in a torn line") == 1 and str(tmp_path / rundir.METRICS) in err


def test_truncate_repairs_a_torn_last_line(tmp_path):
    _write(tmp_path, "".join(json.dumps(r) + "\n" for r in RECORDS) + TORN)
    assert truncate_metrics(tmp_path, last_step=1) == 2  # step 2's records; the fragment is not a record
    text = (tmp_path / rundir.METRICS).read_text()
    assert text.endswith("\n") and [json.loads(line) for line in text.splitlines()] == RECORDS[:1]
    _write(tmp_path, json.dumps(RECORDS[0]))  # complete, but no final newline: the next append would join it
    assert truncate_metrics(tmp_path, last_step=5) == 0
    assert (tmp_path / rundir.METRICS).read_text() == json.dumps(RECORDS[0]) + "\n"


def test_a_bad_line_before_the_last_names_the_file_and_line(tmp_path):
    _write(tmp_path, json.dumps(RECORDS[0]) + "\n" + TORN + "\n" + json.dumps(RECORDS[2]) + "\n")
    with pytest.raises(DataError, match=r"metrics.jsonl, line 2: not a metrics record"):
        read_metrics(tmp_path)


def test_a_run_resumes_after_a_torn_metrics_line(tmp_path, tiny_data):
    config = write_config(tmp_path / "tiny.yaml", train={"max_steps": 4, "save_every": 2, "eval_every": 0})
    run_dir = tmp_path / "run"
    assert run_pretrain(config, tiny_data, run_dir).returncode == 0
    with open(run_dir / rundir.METRICS, "a") as handle:
        handle.write(TORN)
    config = write_config(tmp_path / "tiny.yaml", train={"max_steps": 6, "save_every": 2, "eval_every": 0})
    second = run_pretrain(config, tiny_data, run_dir)
    assert second.returncode == 0, explain(second)
    assert "ends in a torn line" in " ".join(second.stderr.split())
    assert sorted(train_losses(run_dir)) == [1, 2, 3, 4, 5, 6]  # every line parses again


def test_off_a_terminal_each_logged_step_says_step_n_of_total_and_the_eta(tmp_path):
    out = io.StringIO()
    monitor = Monitor(tmp_path, load_config(None), make_console(file=out))  # not a terminal
    monitor.start(start_step=0, total_steps=400)
    monitor.clock = (monitor.clock[0] - 50.0, 0)  # 50 s since the start: 2 steps/s after 100 steps
    monitor.log({"kind": "train", "step": 100, "loss": 5.0, "lr": 1e-3, "tokens_per_s": 1234.5})
    monitor.close()
    line = out.getvalue().splitlines()[0]
    assert line.startswith("train step 100 / 400 (25.0%): loss=5.0000")
    assert "tokens_per_s=1234 " in line and line.endswith("ETA 2m30s")  # 300 steps left at 2 steps/s


def test_evaluation_uses_a_validation_split_smaller_than_one_micro_batch(tmp_path, fresh_accelerate):
    import torch
    from accelerate import Accelerator

    from bertrain.data.format import open_prepared
    from bertrain.data.loader import build_validation_loader
    from bertrain.model import build_model
    from bertrain.train.evaluate import evaluate, validation_loader

    prepared = open_prepared(make_prepared_dir(tmp_path / "data", num_documents=60, validation_documents=2,
                                                      max_paragraphs=600))
    config = load_config(write_config(tmp_path / "c.yaml"))
    config.model.vocab_size = prepared.vocab_size
    layout = dict(seed=0, rank=0, world_size=1)
    assert len(build_validation_loader(prepared, config.data, micro_batch_size=64, max_batches=2, **layout)) == 0
    loader = validation_loader(prepared, config.data, micro_batch_size=64, **layout)
    instances = len(loader.dataset.plan)
    assert 0 < instances < 64 and len(loader) == 1 and next(iter(loader))["input_ids"].shape[0] == instances

    torch.manual_seed(0)
    warnings, progress = [], []
    record = evaluate(build_model(config.model), Accelerator(cpu=True), prepared, config.data, seed=0,
                      micro_batch_size=64, progress=lambda done, total: progress.append((done, total)),
                      warn=warnings.append)
    assert 0 <= record["mlm_accuracy"] <= 1 and record["mlm_loss"] > 0 and "sentence_accuracy" in record
    assert progress == [(0, 1), (1, 1)] and warnings == []


def test_evaluation_without_validation_data_warns_once(tmp_path, fresh_accelerate):
    from accelerate import Accelerator

    from bertrain.data.format import open_prepared
    from bertrain.model import build_model
    from bertrain.train.evaluate import evaluate

    prepared = open_prepared(make_prepared_dir(tmp_path / "data", num_documents=60, validation_documents=0))
    config = load_config(write_config(tmp_path / "c.yaml", base=TINY))
    config.model.vocab_size = prepared.vocab_size
    model, accelerator, warnings = build_model(config.model), Accelerator(cpu=True), []
    for _ in range(2):
        assert evaluate(model, accelerator, prepared, config.data, seed=0, micro_batch_size=8,
                        warn=warnings.append) == {}
    assert len(warnings) == 1 and "evaluation skipped" in warnings[0] and str(prepared.path) in warnings[0]
