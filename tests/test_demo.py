"""`bertrain demo`: its pieces (fast) and one end-to-end run that must show learning (slow)."""

from __future__ import annotations

import json
import keyword
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bertrain.demo import (PYTHON_WORDS, DemoResult, learning_checks, learning_figures, pretrain_overrides,
                           pydoc_documents, whole_word_tokens, write_demo_corpus)


def test_demo_corpus_keeps_every_word_of_the_topics(tmp_path):
    from pydoc_data.topics import topics

    counts = write_demo_corpus(tmp_path)
    files = sorted(tmp_path.glob("*.txt"))
    assert counts["documents"] == len(files) > 150  # enough documents for a hash-based validation split
    written = sum(len(f.read_text(encoding="utf-8").split()) for f in files)
    assert written == counts["words"] == sum(len(text.split()) for text in topics.values())
    sizes = [len(text) for _, text in pydoc_documents()]
    assert max(sizes) < 10_000  # no single topic dominates the split


def test_learning_figures_read_first_and_last_loss_and_last_eval(tmp_path):
    records = [{"step": 10, "kind": "train", "loss": 8.0, "mlm_accuracy": 0.01},
               {"step": 20, "kind": "train", "loss": 6.5},
               {"step": 20, "kind": "eval", "mlm_loss": 6.0, "mlm_accuracy": 0.10, "sentence_accuracy": 0.55},
               {"step": 30, "kind": "train", "loss": 5.0, "mlm_accuracy": 0.2},
               {"step": 30, "kind": "eval", "mlm_loss": 5.1, "mlm_accuracy": 0.21, "sentence_accuracy": 0.6}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    figures = learning_figures(tmp_path)
    assert (figures["first_step"], figures["first_loss"], figures["last_step"], figures["last_loss"]) == (10, 8.0, 30, 5.0)
    assert (figures["eval_step"], figures["val_mlm_accuracy"], figures["first_val_mlm_accuracy"]) == (30, 0.21, 0.10)
    result = DemoResult(model="albert", out=str(tmp_path), figures=dict(figures, baseline_accuracy=0.2),
                        fill_mask=[{"sentence": "s", "predictions": [{"token": "the"}, {"token": "def"}]}])
    assert list(learning_checks(result).values()) == [False, True, True]  # 0.21 is not clearly above 0.2
    result.figures["baseline_accuracy"] = 0.06
    result.fill_mask[0]["predictions"] = [{"token": "the"}, {"token": "of"}]
    assert list(learning_checks(result).values()) == [True, True, False]


def test_steps_override_evaluates_and_saves_at_the_end():
    args = pretrain_overrides(120)
    overrides = dict(a.split("=") for a in args if a != "--set")
    assert overrides["train.max_steps"] == "120" and overrides["train.save_every"] == "120"
    assert 120 % int(overrides["train.eval_every"]) == 0
    assert pretrain_overrides(None) == []


def test_demo_refuses_a_directory_it_did_not_write(run_cli, tmp_path):
    (tmp_path / "precious.txt").write_text("keep me")
    code, _, err = run_cli("demo", "--out", str(tmp_path), "--quick")
    assert code == 2
    assert "not written by `bertrain demo`" in " ".join(err.split())
    assert (tmp_path / "precious.txt").read_text() == "keep me"


def test_demo_rejects_an_unknown_model(run_cli, tmp_path):
    code, _, err = run_cli("demo", "--model", "gpt", "--out", str(tmp_path / "d"))
    assert code == 2 and "albert" in err


def test_whole_word_tokens_for_both_tokenizer_kinds():
    unigram = ["<pad>", "<unk>", "[CLS]", "[SEP]", "[MASK]", "▁", "▁def", "s", "▁the", "def", '"', "▁a"]
    assert whole_word_tokens(unigram, {0, 1, 2, 3, 4}) == [False] * 5 + [False, True, False, True, True, False, False]
    wordpiece = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "def", "##s", "the", ".", "##ef"]
    assert whole_word_tokens(wordpiece, {0, 1, 2, 3, 4}) == [False] * 5 + [True, False, True, False, False]


def test_python_words_are_python():
    assert {"def", "class", "return", "import", "lambda"} <= PYTHON_WORDS
    assert not {"the", "of", "a", "is", "function", "statement"} & PYTHON_WORDS
    assert all(keyword.iskeyword(w) or keyword.issoftkeyword(w) for w in PYTHON_WORDS - {"print", "exec", "future", "type"})


@pytest.mark.slow
def test_demo_end_to_end_shows_learning(tmp_path):
    out = tmp_path / "demo"
    env = dict(os.environ, WANDB_MODE="disabled", HF_HUB_OFFLINE="1", COLUMNS="250")
    # The default demo, as a user runs it (~3 minutes on 2 idle cores): the learning bar is its own.
    result = subprocess.run([sys.executable, "-m", "bertrain", "demo", "--out", str(out)],
                            capture_output=True, text=True, env=env, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    figures = summary["figures"]

    # Loss fell: first vs last logged training loss, read straight from metrics.jsonl.
    records = [json.loads(line) for line in (out / "run" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r.get("kind", "train") == "train"]
    assert train[-1]["step"] == 2400
    assert train[-1]["loss"] < 0.6 * train[0]["loss"]
    assert figures["first_loss"] == train[0]["loss"] and figures["last_loss"] == train[-1]["loss"]

    # Validation MLM accuracy clearly above always guessing the most frequent token.
    evals = [r for r in records if r.get("kind") == "eval"]
    assert evals and evals[-1]["step"] == 2400
    assert figures["val_mlm_accuracy"] == evals[-1]["mlm_accuracy"]
    assert 0.01 < figures["baseline_accuracy"] < 0.2
    # ~540 masked positions: the binomial std of a 5% baseline is ~0.9 points; measured 32-36% vs 4.6%.
    assert figures["val_mlm_accuracy"] > 3 * figures["baseline_accuracy"]
    assert figures["val_sentence_accuracy"] > 0.6

    # Python keywords for 'The "[MASK]" statement is used to define a function.' (measured: with,
    # global, import, yield, for), and every check the demo prints passed.
    predictions = [p["token"].strip().lower() for p in summary["fill_mask"][0]["predictions"]]
    assert set(predictions) & PYTHON_WORDS, predictions
    assert summary["checks"] and all(summary["checks"].values()), summary["checks"]

    # The export is a Hugging Face model directory, and the summary shows what happened.
    assert (out / "model" / "config.json").is_file()
    assert json.loads((out / "model" / "config.json").read_text())["model_type"] == "albert"
    assert len(summary["fill_mask"]) == 4 and all(len(item["predictions"]) == 5 for item in summary["fill_mask"])
    assert set(summary["seconds"]) == {"corpus", "prepare", "pretrain", "export", "fill-mask", "total"}
    for text in ("time per stage", "validation MLM accuracy", "most frequent token", "fill-mask", str(out / "model")):
        assert text in " ".join(result.stdout.split()) or text in result.stdout, text

    # The README's fine-tuning snippet works on the export, with the pretrained encoder weights.
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(out / "model")
    model = AutoModelForSequenceClassification.from_pretrained(out / "model", num_labels=2)
    batch = tokenizer(["a great film", "a waste of time"], padding=True, return_tensors="pt")
    assert model(**batch).logits.shape == (2, 2)
    exported = load_file(out / "model" / "model.safetensors")
    name = "albert.embeddings.word_embeddings.weight"
    assert torch.equal(model.state_dict()[name], exported[name])
