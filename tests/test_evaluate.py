"""`bertrain evaluate`: metrics against scipy and closed forms, task files in every format, GLUE's own layout,
recipes, results over seeds, continuing an interrupted evaluation, and bad input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from bertrain.config.finetune import FinetuneConfig, finetune_config
from bertrain.data.tasks import GLUE, resolve_tasks
from bertrain.errors import ConfigError, DataError, UsageError
from bertrain.train import downstream
from bertrain.train.downstream_results import comparison, read_results, rows
from bertrain.train.scores import accuracy, f1, matthews, pearson, score, spearman, summarize
from tests.helpers import ROOT, pretrain_env

scipy_stats = pytest.importorskip("scipy.stats")

WORDS = ("alpha", "beta", "gamma", "delta", "river", "stone", "cloud", "light", "music", "paper", "green", "table")


# ---- metrics ----


def test_metrics_match_scipy_and_closed_forms():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=200), rng.normal(size=200)
    y_tied = np.round(y, 1)  # many ties: ranks must be averaged as scipy does
    assert pearson(x, y) == pytest.approx(scipy_stats.pearsonr(x, y)[0], abs=1e-12)
    assert spearman(x, y_tied) == pytest.approx(scipy_stats.spearmanr(x, y_tied)[0], abs=1e-12)
    labels, predictions = rng.integers(0, 2, 300), rng.integers(0, 2, 300)
    predictions[:150] = labels[:150]
    tp = np.sum((predictions == 1) & (labels == 1))
    tn = np.sum((predictions == 0) & (labels == 0))
    fp = np.sum((predictions == 1) & (labels == 0))
    fn = np.sum((predictions == 0) & (labels == 1))
    assert matthews(predictions, labels) == pytest.approx(
        (tp * tn - fp * fn) / np.sqrt(float((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))), abs=1e-12)
    precision, recall = tp / (tp + fp), tp / (tp + fn)
    assert f1(predictions, labels) == pytest.approx(2 * precision * recall / (precision + recall), abs=1e-12)
    assert accuracy(predictions, labels) == pytest.approx((tp + tn) / 300)


def test_multiclass_matthews_is_the_correlation_of_one_hot_labels():
    rng = np.random.default_rng(1)
    labels, predictions = rng.integers(0, 3, 500), rng.integers(0, 3, 500)
    predictions[:300] = labels[:300]
    x, y = np.eye(3)[predictions], np.eye(3)[labels]
    x, y = x - x.mean(0), y - y.mean(0)
    expected = (x * y).sum() / np.sqrt((x * x).sum() * (y * y).sum())  # Gorodkin's R_K
    assert matthews(predictions, labels) == pytest.approx(expected, abs=1e-12)


def test_degenerate_metrics_are_zero_not_nan():
    constant = np.zeros(10, dtype=int)
    assert matthews(constant, np.r_[np.zeros(5), np.ones(5)].astype(int)) == 0.0
    assert f1(constant, constant) == 0.0
    assert pearson(np.ones(4), np.arange(4.0)) == 0.0


def test_score_takes_logits_or_regression_outputs_and_summary_is_over_seeds():
    logits = np.array([[0.1, 0.9], [2.0, -1.0], [0.0, 1.0]])
    assert score("accuracy", logits, np.array([1, 0, 0])) == pytest.approx(2 / 3)
    assert score("pearson", np.array([[1.0], [2.0], [3.5]]), np.array([1.0, 2.0, 3.0])) > 0.98
    summary = summarize([0.5, 0.7, 0.6, 0.9, 0.1])
    assert summary == pytest.approx({"median": 0.6, "mean": 0.56, "std": float(np.std([.5, .7, .6, .9, .1], ddof=1)),
                                     "min": 0.1, "max": 0.9})
    assert summarize([0.3])["std"] is None  # undefined for one seed


# ---- task files ----


def sentence(rng, n=6) -> str:
    return " ".join(rng.choice(WORDS, n))


def task_records(count: int, seed: int) -> list[dict]:
    """Pairs labelled by whether 'river' is in the first sentence: learnable from token identity."""
    rng = np.random.default_rng(seed)
    records = []
    for i in range(count):
        first = sentence(rng)
        label = int("river" in first.split())
        records.append({"sentence1": first, "sentence2": sentence(rng, 3), "label": ["no", "yes"][label],
                        "score": float(label) + 0.1 * (i % 3)})
    return records


def write_records(path: Path, records: list[dict]) -> Path:
    suffix = path.suffix
    if suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
    elif suffix in (".csv", ".tsv"):
        import csv

        with open(path, "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(records[0]), delimiter="\t" if suffix == ".tsv" else ",")
            writer.writeheader()
            writer.writerows(records)
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(records), path)
    return path


def write_task(folder: Path, suffix: str = ".jsonl", train_rows: int = 48, dev_rows: int = 24, **keys) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    write_records(folder / f"train{suffix}", task_records(train_rows, 0))
    write_records(folder / f"dev{suffix}", task_records(dev_rows, 1))
    spec = {"name": "river", "train": f"train{suffix}", "validation": f"dev{suffix}",
            "text": ["sentence1", "sentence2"], "label": "label", "kind": "classification", "metric": "accuracy",
            **keys}
    path = folder / "task.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.mark.parametrize("suffix", [".jsonl", ".csv", ".tsv", ".parquet"])
def test_task_files_of_every_format_read_alike(tmp_path, suffix):
    (task,) = resolve_tasks(str(write_task(tmp_path / suffix.strip("."), suffix)), None)
    train, validation = task.load()
    records = task_records(48, 0)
    assert task.labels == ["no", "yes"] and task.metrics == ("accuracy",)
    assert train.texts == [(r["sentence1"], r["sentence2"]) for r in records]
    assert train.labels == [["no", "yes"].index(r["label"]) for r in records]
    assert len(validation["dev"]) == 24


@pytest.mark.parametrize("suffix", [".jsonl", ".csv", ".tsv"])
def test_a_byte_order_mark_is_no_part_of_the_first_column(tmp_path, suffix):
    # Excel's "CSV UTF-8" starts with one: "no value in column 'sentence1'" named a column the row seemed to have.
    task = write_task(tmp_path / "bom", suffix)
    for name in (f"train{suffix}", f"dev{suffix}"):
        path = task.parent / name
        path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    (resolved,) = resolve_tasks(str(task), None)
    train, validation = resolved.load()
    records = task_records(48, 0)
    assert train.texts == [(r["sentence1"], r["sentence2"]) for r in records] and len(validation["dev"]) == 24


def test_positive_label_picks_the_class_whose_f1_is_scored(tmp_path):
    # F1 was of "the larger label name": not_duplicate of duplicate / not_duplicate, and no way to say otherwise.
    (default,) = resolve_tasks(str(write_task(tmp_path / "default", metric="f1")), None)
    (chosen,) = resolve_tasks(str(write_task(tmp_path / "chosen", metric="f1", positive_label="no")), None)
    assert default.labels == ["no", "yes"] and chosen.labels == ["yes", "no"]  # id 1 is the one F1 scores
    train, _ = chosen.load()
    assert train.labels == [["yes", "no"].index(r["label"]) for r in task_records(48, 0)]
    with pytest.raises(ConfigError, match=r"'positive_label' 'maybe' is not a label of .*train.jsonl \(no, yes\)"):
        resolve_tasks(str(write_task(tmp_path / "unknown", metric="f1", positive_label="maybe")), None)
    with pytest.raises(ConfigError, match=r"'positive_label' 'no' is for metric f1 only"):
        resolve_tasks(str(write_task(tmp_path / "accuracy", positive_label="no")), None)
    booleans = write_task(tmp_path / "booleans", metric="f1", positive_label=False)  # YAML's bare `false`
    for name in ("train.jsonl", "dev.jsonl"):
        path = booleans.parent / name
        path.write_text(path.read_text().replace('"label": "yes"', '"label": true').replace('"label": "no"',
                                                                                           '"label": false'))
    (task,) = resolve_tasks(str(booleans), None)
    assert task.labels == ["true", "false"]  # "True is not a valid str | null" before


def test_regression_task_and_its_recipe_section(tmp_path):
    path = write_task(tmp_path, label="score", kind="regression", metric="pearson_spearman",
                      finetune={"epochs": 7, "lr": 5e-5})
    (task,) = resolve_tasks(str(path), None)
    train, _ = task.load()
    assert task.num_labels == 1 and task.metrics == ("pearson", "spearman")
    assert train.labels[:3] == [r["score"] for r in task_records(3, 0)]
    recipe = finetune_config(task.recipe, ["finetune.lr=1e-5"])
    assert (recipe.epochs, recipe.lr, recipe.batch_size) == (7, 1e-5, 32)  # task file, then --set, then defaults


@pytest.mark.parametrize("change, expected", [
    ({"labl": "label"}, "Did you mean 'label'?"),
    ({"metric": "pearson_spearman"}, "does not fit kind"),
    ({"text": ["a", "b", "c"]}, "give one or two"),
    ({"train": ""}, "'train' is not set"),
    ({"finetune": {"lr": -1}}, "finetune.lr"),
])
def test_bad_task_files_name_the_file_and_key(tmp_path, change, expected):
    path = write_task(tmp_path, **change)
    with pytest.raises(ConfigError) as error:
        resolve_tasks(str(path), None)[0].load()
    assert expected in str(error.value) and str(path) in str(error.value)


def test_bad_rows_name_the_file_and_line(tmp_path):
    path = write_task(tmp_path)
    lines = (tmp_path / "dev.jsonl").read_text().splitlines()
    lines[2] = json.dumps({"sentence1": "a", "sentence2": "b", "label": "maybe"})
    (tmp_path / "dev.jsonl").write_text("\n".join(lines) + "\n")
    (task,) = resolve_tasks(str(path), None)
    with pytest.raises(DataError, match=r"dev.jsonl:3: label 'maybe' is not one of the task's labels"):
        task.load()
    lines[2] = json.dumps({"sentence1": "a", "label": "no"})
    (tmp_path / "dev.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=r"dev.jsonl:3: no value in column 'sentence2'"):
        task.load()
    lines[2] = "{not json"
    (tmp_path / "dev.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=r"dev.jsonl:3: not valid JSON"):
        task.load()
    regression = write_task(tmp_path / "r", label="sentence2", kind="regression", metric="pearson_spearman")
    with pytest.raises(DataError, match=r"train.jsonl:1: label '.*' is not a number"):
        resolve_tasks(str(regression), None)[0].load()


def test_unknown_task_names_and_duplicates_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="neither a GLUE task"):
        resolve_tasks("rtee", None)
    with pytest.raises(ConfigError, match="more than once"):
        resolve_tasks("rte,RTE", None)


# ---- GLUE in its own layout ----


def write_glue(root: Path, rows: int = 12) -> Path:
    """Tiny files in the layout of GLUE's download_glue_data.py (CoLA has no header; MNLI two dev files)."""
    rng = np.random.default_rng(2)

    def tsv(path: Path, header: list[str] | None, make) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        lines = ([("\t".join(header))] if header else []) + ["\t".join(make(i)) for i in range(rows)]
        path.write_text("\n".join(lines) + "\n")

    nli, binary = ("entailment", "not_entailment"), ("0", "1")
    three = ("entailment", "neutral", "contradiction")
    for split in ("train", "dev"):
        tsv(root / "CoLA" / f"{split}.tsv", None,
            lambda i: ["gj04", binary[i % 2], "*" if i % 2 == 0 else "", sentence(rng) + ' "quoted'])
        tsv(root / "SST-2" / f"{split}.tsv", ["sentence", "label"], lambda i: [sentence(rng), binary[i % 2]])
        tsv(root / "MRPC" / f"{split}.tsv", ["Quality", "#1 ID", "#2 ID", "#1 String", "#2 String"],
            lambda i: [binary[i % 2], "1", "2", sentence(rng), sentence(rng)])
        tsv(root / "STS-B" / f"{split}.tsv", ["index", "genre", "filename", "year", "old_index", "source1", "source2",
                                              "sentence1", "sentence2", "score"],
            lambda i: [str(i), "g", "f", "y", "o", "s", "s", sentence(rng), sentence(rng), f"{i % 5}.{i}"])
        tsv(root / "QQP" / f"{split}.tsv", ["id", "qid1", "qid2", "question1", "question2", "is_duplicate"],
            lambda i: [str(i), "1", "2", sentence(rng), sentence(rng), binary[i % 2]])
        for name in ("QNLI",):
            tsv(root / name / f"{split}.tsv", ["index", "question", "sentence", "label"],
                lambda i: [str(i), sentence(rng), sentence(rng), nli[i % 2]])
        for name, labels in (("RTE", nli), ("WNLI", binary)):
            tsv(root / name / f"{split}.tsv", ["index", "sentence1", "sentence2", "label"],
                lambda i, labels=labels: [str(i), sentence(rng), sentence(rng), labels[i % 2]])
    for split in ("train", "dev_matched", "dev_mismatched"):
        tsv(root / "MNLI" / f"{split}.tsv", ["index", "promptID", "pairID", "genre", "s1b", "s2b", "s1p", "s2p",
                                             "sentence1", "sentence2", "label1", "gold_label"],
            lambda i: [str(i), "1", "2", "g", "", "", "", "", sentence(rng), sentence(rng), "x", three[i % 3]])
    with open(root / "QQP" / "train.tsv", "a") as handle:  # GLUE's QQP has a few rows with missing fields
        handle.write("999\tbroken row\n")
    return root


def test_glue_dir_layout_loads_every_task_with_hub_label_ids(tmp_path):
    glue = write_glue(tmp_path / "glue")
    tasks = {task.name: task for task in resolve_tasks("glue,wnli", glue)}
    assert list(tasks) == list(GLUE)
    for name, task in tasks.items():
        train, validation = task.load()
        assert len(train) == 12, name  # QQP's broken row is left out (and listed)
        assert list(validation) == (["m", "mm"] if name == "mnli" else ["dev"])
        assert all(len(text) == (1 if name in ("cola", "sst2") else 2) for text in train.texts), name
    cola_train, _ = tasks["cola"].load()
    assert cola_train.labels[:2] == [0, 1] and cola_train.texts[0][0].endswith('"quoted')
    assert tasks["mnli"].load()[0].labels[:3] == [0, 1, 2]  # the hub's order: entailment, neutral, contradiction
    assert tasks["rte"].load()[0].labels[:2] == [0, 1]
    assert tasks["stsb"].load()[0].labels[1] == pytest.approx(1.1)
    assert "QQP/train.tsv:14: no value for question1, question2, is_duplicate" in tasks["qqp"].load()[0].skipped[0]
    assert tasks["mrpc"].metrics == ("f1", "accuracy") and tasks["cola"].metrics == ("matthews",)


def test_glue_recipes_and_overrides():
    tasks = {task.name: task for task in resolve_tasks("glue,wnli", Path("unused"))}
    recipes = {name: finetune_config(task.recipe, []) for name, task in tasks.items()}
    assert recipes["rte"] == FinetuneConfig()
    assert (recipes["mrpc"].epochs, recipes["wnli"].epochs) == (5, 5)
    assert (recipes["mnli"].seeds, recipes["qqp"].seeds, recipes["sst2"].seeds) == (3, 3, 5)
    assert finetune_config(tasks["mnli"].recipe, ["finetune.seeds=2"]).seeds == 2
    assert finetune_config(tasks["mnli"].recipe, [], seeds=1).seeds == 1
    with pytest.raises(ConfigError, match="Did you mean 'finetune.lr'"):
        finetune_config({}, ["finetune.learning_rate=1e-5"])


def test_glue_without_a_dir_or_the_hub_says_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    (task,) = resolve_tasks("rte", None)
    with pytest.raises(DataError, match="Cannot load GLUE task 'rte' from the Hugging Face hub.*--glue-dir"):
        task.load()
    (task,) = resolve_tasks("rte", tmp_path)
    with pytest.raises(DataError, match="has no RTE/ folder"):
        task.load()


def test_glue_with_the_hub_unreachable_fails_at_once_without_asking_datasets(monkeypatch):
    import datasets

    from bertrain.data import tasks as tasks_module

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setattr(tasks_module, "hub_reachable", lambda timeout=5.0: False)
    monkeypatch.setattr(datasets, "load_dataset", lambda *args, **kwargs: pytest.fail("datasets was asked"))
    (task,) = resolve_tasks("rte", None)
    with pytest.raises(DataError, match="'rte': the Hugging Face hub is not reachable.*DATASETS_OFFLINE=1.*glue-dir"):
        task.load()


def test_glue_from_the_hub_reads_the_hub_columns_and_splits(monkeypatch):
    # No network here: datasets.load_dataset stands in with the hub's own schema (nyu-mll/glue, MNLI's two dev splits).
    import datasets

    def fake_load_dataset(path, name):
        assert (path, name) == ("nyu-mll/glue", "mnli")
        rows = {"premise": ["p0", "p1"], "hypothesis": ["h0", "h1"], "label": [2, 0], "idx": [0, 1]}
        return datasets.DatasetDict({split: datasets.Dataset.from_dict(rows) for split in
                                     ("train", "validation_matched", "validation_mismatched", "test_matched")})

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    (task,) = resolve_tasks("mnli", None)
    train, dev = task.load()
    assert train.texts == [("p0", "h0"), ("p1", "h1")] and train.labels == [2, 0]
    assert sorted(dev) == ["m", "mm"] and dev["mm"].labels == [2, 0]


# ---- evaluation runs ----


def tiny_model_dir(path: Path, seed: int = 0) -> Path:
    """A tiny random BERT exported as a transformers dir with a WordPiece tokenizer of the test words."""
    import torch
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

    from bertrain.config import ModelConfig
    from bertrain.data.tokenizer import add_post_processor
    from bertrain.model import build_model
    from bertrain.model.hf import export_hf

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tokenizer = Tokenizer(models.WordPiece({t: i for i, t in enumerate(specials + list(WORDS))}, unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    add_post_processor(tokenizer, "[CLS]", "[SEP]")
    (path / "tok").mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(path / "tok" / "tokenizer.json"))
    torch.manual_seed(seed)
    model = build_model(ModelConfig(type="bert", vocab_size=len(specials) + len(WORDS), hidden_size=16,
                                    num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                                    max_position_embeddings=32))
    export_hf(model, path / "model", tokenizer_dir=path / "tok")
    return path / "model"


# One thread: a seed's scores must not depend on the count finetune.threads=auto picks under the machine's load.
QUICK = ["finetune.epochs=2", "finetune.batch_size=8", "finetune.lr=1e-3", "finetune.max_seq_length=24",
         "finetune.threads=1"]


def quiet_console():
    from bertrain.console import make_console
    import io

    return make_console(file=io.StringIO())


def test_evaluate_records_each_seed_and_continues_where_it_stopped(tmp_path, monkeypatch):
    model = tiny_model_dir(tmp_path)
    tasks = resolve_tasks(str(write_task(tmp_path / "task")), None)
    out = tmp_path / "eval"
    results = downstream.evaluate(model, tasks, out, quiet_console(), QUICK, seeds=2)
    summary = results["summary"]["model"]["tasks"]["river"]
    assert summary["seeds"] == [1, 2] and len(summary["scores"]) == 2 and summary["metric"] == "accuracy"
    assert results["summary"]["model"]["average"] == pytest.approx(summary["median"])
    on_disk = read_results(out)
    assert on_disk["runs"] == results["runs"] and (out / "results.md").read_text().count("| river |") == 1
    first = {run["seed"]: run for run in on_disk["runs"]}
    assert first[1]["recipe"]["epochs"] == 2 and first[1]["steps"] == 12  # 48 examples / 8 x 2 epochs

    calls = []
    real_finetune = downstream.finetune
    monkeypatch.setattr(downstream, "finetune", lambda *a, **k: calls.append(a[3]) or real_finetune(*a, **k))
    results = downstream.evaluate(model, tasks, out, quiet_console(), QUICK, seeds=3)
    assert calls == [3]  # seeds 1 and 2 were in results.json
    again = {run["seed"]: run for run in results["runs"]}
    assert again[1] == first[1] and again[2] == first[2] and results["summary"]["model"]["tasks"]["river"][
        "seeds"] == [1, 2, 3]
    with pytest.raises(UsageError, match="another recipe .*lr 0.001 -> 0.002"):
        downstream.evaluate(model, tasks, out, quiet_console(), QUICK + ["finetune.lr=2e-3"], seeds=3)


def test_same_seed_same_score_and_baseline_side_by_side(tmp_path):
    model, other = tiny_model_dir(tmp_path / "a", seed=0), tiny_model_dir(tmp_path / "b", seed=1)
    tasks = resolve_tasks(str(write_task(tmp_path / "task")), None)
    one = downstream.evaluate(model, tasks, tmp_path / "one", quiet_console(), QUICK, seeds=2)
    both = downstream.evaluate(model, tasks, tmp_path / "both", quiet_console(), QUICK, seeds=2, baseline_path=other)
    mine = [r["scores"] for r in both["runs"] if r["model"] == "model"]
    assert mine == [r["scores"] for r in one["runs"]]  # a seed fixes head, dropout and order
    compared = comparison(both)["river"]
    tasks_of = both["summary"]
    assert compared["difference"] == pytest.approx(tasks_of["model"]["tasks"]["river"]["median"]
                                                   - tasks_of["baseline"]["tasks"]["river"]["median"])
    header, body = rows(both)
    assert header[2].startswith("model") and header[4].startswith("baseline") and body[0][0] == "river"
    assert body[0][6] == ("yes" if compared["beyond_spread"] else "no")
    console = quiet_console()  # the same directory without --baseline: the stored baseline stays, and says so
    again = downstream.evaluate(model, tasks, tmp_path / "both", console, QUICK, seeds=2)
    assert "baseline" in again["summary"]
    assert (f"baseline: its rows come from an earlier evaluation in this directory ({both['models']['baseline']}); "
            "this one did not run it") in " ".join(console.file.getvalue().split())


def test_random_baseline_and_a_training_subset(tmp_path):
    model = tiny_model_dir(tmp_path)
    tasks = resolve_tasks(str(write_task(tmp_path / "task")), None)
    warnings = []
    results = downstream.evaluate(model, tasks, tmp_path / "eval", quiet_console(),  # the model has 32 positions
                                  QUICK + ["finetune.max_train_examples=16", "finetune.max_seq_length=64"], seeds=1,
                                  baseline_path=Path("random"), warn=warnings.append)
    # (16 examples: a seed may collapse to one class, which is warned about too; see test_evaluate_audit)
    assert [w for w in warnings if "collapsed" not in w] == [
        f"river: finetune.max_seq_length 64 exceeds the {key}'s max_position_embeddings 32: its examples are "
        "truncated to 32 tokens." for key in ("model", "baseline")]
    assert results["models"]["baseline"].startswith("random weights (bert")
    assert {run["model"]: run["steps"] for run in results["runs"]} == {"model": 4, "baseline": 4}  # 16 / 8 x 2


def test_auto_threads_are_measured_said_once_and_change_no_score(tmp_path, monkeypatch):
    """finetune.threads=auto with injected pass times (2 threads 3x slower than 1, as on a busy machine): every
    step runs at 1 thread, the choice is said once for two seeds, scores are finetune.threads=1's."""
    import functools
    import io

    import torch

    from bertrain.console import make_console
    from bertrain.train import finetune as finetune_module
    from bertrain.train.threads import ThreadTuner

    model = tiny_model_dir(tmp_path)
    tasks = resolve_tasks(str(write_task(tmp_path / "task")), None)
    fixed = downstream.evaluate(model, tasks, tmp_path / "fixed", quiet_console(), QUICK, seeds=2)
    clock = [0.0]

    def timer() -> float:  # a pass lasts what its end reading adds
        clock[0] += {2: 0.3, 1: 0.1}[torch.get_num_threads()]
        return clock[0]

    monkeypatch.setattr(finetune_module, "ThreadTuner", functools.partial(ThreadTuner, timer=timer))
    step_threads, real_finetune = [], downstream.finetune

    def recording(*args, on_step, **kwargs):
        return real_finetune(*args, on_step=lambda done, total: step_threads.append(torch.get_num_threads())
                             or on_step(done, total), **kwargs)

    monkeypatch.setattr(downstream, "finetune", recording)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # a launcher's count would be kept
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        out = io.StringIO()
        auto = downstream.evaluate(model, tasks, tmp_path / "auto", make_console(file=out),
                                   QUICK + ["finetune.threads=auto"], seeds=2)
        assert torch.get_num_threads() == 2  # the caller's count is back
    finally:
        torch.set_num_threads(before)
    said = " ".join(out.getvalue().split())
    assert said.count("CPU threads:") == 1 and "CPU threads: 1 (finetune.threads=auto; one forward + backward of " \
        "8 sequence(s): 2 thread(s) 300 ms, 1 thread(s) 100 ms)" in said
    assert step_threads == [1] * 24  # 12 steps per seed
    assert [r["scores"] for r in auto["runs"]] == [r["scores"] for r in fixed["runs"]]  # the probes left no trace
    again = downstream.evaluate(model, tasks, tmp_path / "fixed", quiet_console(), QUICK[:-1] + ["finetune.threads=2"],
                                seeds=2)  # not part of the recipe: the evaluation continues, nothing to run
    assert again["runs"] == fixed["runs"]


def run_cli(*args: str, **popen) -> subprocess.Popen:
    env = {**os.environ, **pretrain_env(), "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "bertrain", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **popen)


def signal_after_the_first_run(process: subprocess.Popen, out: Path, sig: int) -> tuple[str, str]:
    """Send `sig` once the evaluation in `out` has recorded a run (or ended); its (stdout, stderr)."""
    deadline = time.time() + 120
    while not (out / "results.json").is_file() and time.time() < deadline and process.poll() is None:
        time.sleep(0.05)
    process.send_signal(sig)
    return process.communicate(timeout=120)


def test_cli_sigterm_exits_75_and_the_same_command_continues(tmp_path):
    model = tiny_model_dir(tmp_path)
    task = write_task(tmp_path / "task", train_rows=400)
    out = tmp_path / "eval"
    args = ["evaluate", str(model), "--tasks", str(task), "--seeds", "3", "--out", str(out),
            *[item for override in QUICK for item in ("--set", override)]]
    process = run_cli(*args)
    stdout, stderr = signal_after_the_first_run(process, out, signal.SIGTERM)
    assert process.returncode == 75, stderr
    assert "evaluate stopped by SIGTERM" in stderr
    recorded = read_results(out)["runs"]
    assert 1 <= len(recorded) < 3
    process = run_cli(*args)
    stdout, stderr = process.communicate(timeout=300)
    assert process.returncode == 0, stderr
    runs = read_results(out)["runs"]
    assert sorted(run["seed"] for run in runs) == [1, 2, 3] and runs[:len(recorded)] == recorded
    assert "average (of medians)" in stdout and "river" in stdout


def test_cli_bad_input_exits_2_with_a_message(tmp_path):
    model = tiny_model_dir(tmp_path)
    for args, expected in ((["--tasks", "nope"], "neither a GLUE task"),
                           (["--tasks", "rte", "--glue-dir", str(tmp_path / "none")], "--glue-dir"),
                           (["--set", "finetune.lrr=1"], "Did you mean 'finetune.lr'")):
        process = run_cli("evaluate", str(model), "--out", str(tmp_path / "o"), *args)
        _, stderr = process.communicate(timeout=120)
        assert process.returncode == 2 and expected in stderr and "Traceback" not in stderr, stderr


# ---- end to end: pretraining must help ----


def word_kind_task(root: Path) -> tuple[Path, Path]:
    """A corpus and a task where only pretraining can help. 40 made-up words in two kinds, each kind seen in its own
    contexts in the corpus (animals, vehicles); the task asks a word's kind in neutral sentences, and its validation
    words never occur in its training set: a random-init model can only guess them, a pretrained one has placed
    them near their kind from the corpus contexts (its embeddings are tied to the MLM decoder)."""
    import random

    rng = random.Random(0)
    made_up: set[str] = set()
    while len(made_up) < 40:
        made_up.add("".join(rng.choice("bcdfghjklmnprstvz") + rng.choice("aeiou") for _ in range(3)))
    vocabulary = sorted(made_up)
    kinds = {word: int(i >= 20) for i, word in enumerate(vocabulary)}
    contexts = (["i saw a {} eat the grass", "the {} ran across the field", "a small {} sleeps in the barn",
                 "the farmer fed the {}", "my {} likes to run and play"],
                ["she drove the {} to town", "the {} needs new fuel", "he parked his {} near the road",
                 "the {} has four wheels", "we washed the old {} today"])
    lines = []
    for _ in range(400):
        for _ in range(6):
            word = rng.choice(vocabulary)
            lines.append(rng.choice(contexts[kinds[word]]).format(word))
        lines.append("")
    root.mkdir(parents=True, exist_ok=True)
    (root / "corpus.txt").write_text("\n".join(lines) + "\n")
    neutral = ["i think the {} is nice", "look at that {}", "there is a {} here", "we talked about the {}"]
    seen = vocabulary[:12] + vocabulary[20:32]
    unseen = vocabulary[12:20] + vocabulary[32:]
    for name, words in (("train", seen), ("dev", unseen)):
        records = [{"sentence": t.format(w), "label": kinds[w]} for w in words for t in neutral]
        write_records(root / f"{name}.jsonl", records)
    task = root / "task.yaml"
    task.write_text(yaml.safe_dump({"name": "word_kind", "train": "train.jsonl", "validation": "dev.jsonl",
                                    "text": "sentence", "label": "label", "metric": "accuracy",
                                    "finetune": {"lr": 1e-3, "epochs": 10, "batch_size": 16, "max_seq_length": 32}}))
    return root / "corpus.txt", task


def pretrain_word_kind_model(root: Path, steps: int) -> tuple[Path, Path]:
    """(RUN_DIR of a tiny BERT pretrained `steps` steps on word_kind_task's corpus, the task file); the benchmark
    benchmarks/evaluate_vs_trainer.py uses it too."""
    corpus, task = word_kind_task(root / "task")
    env = pretrain_env()
    prepare = subprocess.run([sys.executable, "-m", "bertrain", "prepare", "--source", str(corpus), "--out",
                              str(root / "data"), "--vocab-size", "400", "--workers", "1", "--num-shards", "1"],
                             env=env, capture_output=True, text=True, timeout=300)
    assert prepare.returncode == 0, prepare.stderr
    config = root / "tiny.yaml"
    config.write_text(yaml.safe_dump({
        "data": {"objective": "none", "max_seq_length": 32, "eval_batches": 2},
        "model": {"type": "bert", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
                  "intermediate_size": 128, "max_position_embeddings": 32},
        "optim": {"lr": 3e-3, "warmup_steps": 20},
        "train": {"batch_size": 32, "max_steps": steps, "save_every": steps, "eval_every": 0, "log_every": 100},
        "logging": {"report": False}}))
    pretrain = subprocess.run([sys.executable, "-m", "bertrain", "pretrain", "-c", str(config), "--data",
                               str(root / "data"), "--run-dir", str(root / "run")],
                              env=env, capture_output=True, text=True, timeout=600)
    assert pretrain.returncode == 0, pretrain.stderr
    return root / "run", task


@pytest.mark.slow
def test_a_briefly_pretrained_model_beats_random_weights_on_held_out_words(tmp_path):
    run_dir, task = pretrain_word_kind_model(tmp_path, 600)
    env = pretrain_env()
    out = tmp_path / "eval"
    evaluate = subprocess.run([sys.executable, "-m", "bertrain", "evaluate", str(run_dir), "--tasks",
                               str(task), "--baseline", "random", "--seeds", "3", "--out", str(out)],
                              env=env, capture_output=True, text=True, timeout=600)
    assert evaluate.returncode == 0, evaluate.stderr
    summary = read_results(out)["summary"]
    pretrained, random_init = (summary[key]["tasks"]["word_kind"] for key in ("model", "baseline"))
    # Measured (3 seeds, 64 validation sentences): pretrained ~0.9, random ~0.5 (chance on unseen words).
    assert pretrained["min"] > random_init["median"] and pretrained["median"] >= random_init["median"] + 0.2, (
        pretrained, random_init)
    assert comparison(read_results(out))["word_kind"]["beyond_spread"]


@pytest.mark.slow  # ~100 s on the loaded 2-core machine (two processes, torchrun)
def test_under_launch_two_processes_share_the_runs(tmp_path):
    model = tiny_model_dir(tmp_path)
    task = write_task(tmp_path / "task")
    out = tmp_path / "eval"
    process = run_cli("launch", "--nproc", "2", "evaluate", str(model), "--tasks", str(task), "--seeds", "4",
                      "--out", str(out), *[item for override in QUICK for item in ("--set", override)])
    stdout, stderr = process.communicate(timeout=300)
    assert process.returncode == 0, stderr
    runs = read_results(out)["runs"]
    assert sorted(run["seed"] for run in runs) == [1, 2, 3, 4]
    assert {run["seed"]: run["rank"] for run in runs} == {1: 0, 2: 1, 3: 0, 4: 1}
    single = downstream.evaluate(model, resolve_tasks(str(task), None), tmp_path / "one", quiet_console(), QUICK,
                                 seeds=4)
    assert {r["seed"]: r["scores"] for r in runs} == {r["seed"]: r["scores"] for r in single["runs"]}
    assert stdout.count("average (of medians)") == 1  # rank 0 prints the summary once every run is in


def test_fine_tuning_clips_as_the_fused_steps_grad_scale_as_torchs_clip_grad_norm(tmp_path, monkeypatch):
    """Fused AdamW clips through its grad_scale (no pass over the gradients of its own): the weights trained are
    torch's clip_grad_norm_'s within rounding, and a max_grad_norm below the gradients' norms changes them."""
    import torch

    from bertrain.train import finetune as finetune_module
    from bertrain.train.adamw import FusedAdamW
    from tests.helpers import assert_rounding_close

    model = tiny_model_dir(tmp_path)
    tasks = resolve_tasks(str(write_task(tmp_path / "task")), None)
    trained, scales, real_step = {}, [], FusedAdamW.step

    def step(optimizer, *args, **kwargs):
        scales.append(getattr(optimizer, "grad_scale", None))
        return real_step(optimizer, *args, **kwargs)

    monkeypatch.setattr(FusedAdamW, "step", step)
    for label, grad_scale, max_grad_norm in (("grad_scale", True, "0.05"), ("in place", False, "0.05"),
                                             ("unclipped", True, "null")):
        monkeypatch.setattr(finetune_module, "evaluate_splits", lambda model, *args, label=label: trained.update(
            {label: {k: v.clone() for k, v in model.state_dict().items()}}) or ({"accuracy": 0.5}, False))
        monkeypatch.setattr(finetune_module, "takes_grad_scale", lambda optimizer, on=grad_scale: on)
        scales.clear()
        downstream.evaluate(model, tasks, tmp_path / label.replace(" ", "-"), quiet_console(),
                            QUICK + [f"finetune.max_grad_norm={max_grad_norm}"], seeds=1)
        assert len(scales) == 12  # the run's steps
        if label == "grad_scale":  # every step clipped (a divisor above 1), by the step itself
            assert all(s is not None and float(s) > 1 for s in scales), scales
        else:
            assert scales == [None] * 12
    steps, longest = 12, 8 * 24  # a batch's tokens: the longest sum of a weight gradient
    for name, value in trained["grad_scale"].items():
        assert_rounding_close(value, trained["in place"][name], longest, steps=steps, name=name)
    assert any(not torch.allclose(value, trained["unclipped"][name]) for name, value in trained["grad_scale"].items())
