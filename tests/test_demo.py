"""`bertrain demo`: its pieces (fast) and one end-to-end run that must show learning (slow)."""

from __future__ import annotations

import json
import keyword
import os
import subprocess
import sys
import threading
import time

import pytest
from pydoc_data.topics import topics

from bertrain import demo
from bertrain.data.sources.pydoc import pydoc_documents, write_pydoc_corpus
from bertrain.demo import (CORPUS_OPTIONS, MARKER, PYTHON_WORDS, STATE, DemoResult, learning_checks,
                           learning_figures, pretrain_overrides)
from bertrain.errors import Interrupted
from bertrain.model.fill_mask import whole_word_tokens

# The slow demo test's only time limit: no output at all for this long means a hang. The demo prints a line per
# logged step, so a slow machine takes longer without failing.
STALL_SECONDS = 1800
DEMO_STEPS = 1200


def test_demo_corpus_keeps_every_word_of_the_topics(tmp_path):
    counts = write_pydoc_corpus(tmp_path, **CORPUS_OPTIONS)
    files = sorted(tmp_path.glob("*.txt"))
    assert counts["documents"] == len(files) > 150  # enough documents for a hash-based validation split
    written = sum(len(f.read_text(encoding="utf-8").split()) for f in files)
    assert written == counts["words"] == sum(len(text.split()) for text in topics.values())
    sizes = [len(text) for _, text in pydoc_documents(**CORPUS_OPTIONS)]
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


def test_steps_override_evaluates_4_times_and_saves_every_tenth():
    args = pretrain_overrides(120, default_steps=2400)
    overrides = dict(a.split("=") for a in args if a != "--set")
    assert overrides["train.max_steps"] == "120" and overrides["train.save_every"] == "12"
    assert 120 % int(overrides["train.eval_every"]) == 0
    assert pretrain_overrides(None, default_steps=2400) == ["--set", "train.save_every=240"]


def _interrupted_demo(tmp_path, monkeypatch, checkpoint_step):
    """OUT of a demo stopped during pretraining, its newest checkpoint at `checkpoint_step` (None: none)."""
    out = tmp_path / "demo"
    monkeypatch.setattr(demo, "_corpus_and_data", lambda model, paths, result, *rest: (
        paths["data"].mkdir(parents=True), (paths["data"] / "manifest.json").write_text("{}"),
        result.corpus.update(documents=3)))
    checkpoint = None if checkpoint_step is None else tmp_path / f"step-{checkpoint_step:08d}"
    monkeypatch.setattr(demo.rundir, "find_latest_checkpoint", lambda run_dir: checkpoint)
    stages = []

    def stage(name, args, console):
        stages.append(name)
        if name == "pretrain" and len(stages) == 1:
            raise Interrupted("The demo's pretrain stage was stopped by a signal.")

    monkeypatch.setattr(demo, "run_cli_stage", stage)
    with pytest.raises(Interrupted) as stopped:
        demo.run_demo(out=out, steps=40)
    return out, " ".join(str(stopped.value).split()), stages


@pytest.mark.parametrize("checkpoint_step, does", [
    (20, "resumes training from step 20"), (None, "keeps the corpus and prepared data and trains from step 0")])
def test_a_stopped_demo_says_what_running_it_again_does_and_does_it(tmp_path, monkeypatch, checkpoint_step, does):
    out, message, _ = _interrupted_demo(tmp_path, monkeypatch, checkpoint_step)
    assert f"Running `bertrain demo --out {out} --steps 40` again {does}" in message
    assert json.loads((out / STATE).read_text()) == {"model": "albert", "steps": 40, "corpus": {"documents": 3}}
    assert demo.resumable_step(out, "albert", 40) == (checkpoint_step or 0)
    assert demo.resumable_step(out, "albert", 60) is None and demo.resumable_step(out, "bert", 40) is None
    (out / "data" / "kept.txt").write_text("the prepared data of the stopped demo")
    monkeypatch.setattr(demo, "_corpus_and_data", lambda *a: pytest.fail("prepared the data again"))
    def stop_in_pretrain(name, args, console):
        if name == "pretrain":
            raise Interrupted("stopped again")

    monkeypatch.setattr(demo, "run_cli_stage", stop_in_pretrain)
    with pytest.raises(Interrupted):
        demo.run_demo(out=out, steps=40)
    assert (out / "data" / "kept.txt").is_file()  # resumed: the data of the first attempt is still there


def test_a_demo_stopped_before_its_data_says_it_starts_over(tmp_path):
    out = tmp_path / "demo"
    demo.prepare_out_dir(out)
    assert (out / MARKER).is_file()
    message = demo.stop_advice(out, "bert", None, quick=True)
    assert f"Running `bertrain demo --out {out} --model bert --quick` again starts it over" in message


def test_a_demo_with_other_settings_says_which_earlier_demo_it_replaces(tmp_path, monkeypatch):
    import io

    from rich.console import Console

    out = tmp_path / "demo"
    demo.prepare_out_dir(out)
    (out / STATE).write_text(json.dumps({"model": "albert", "steps": None, "corpus": {}}))
    (out / "summary.json").write_text("{}")

    def stop(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(demo, "prepare_out_dir", stop)  # the replacement is said before anything is removed
    console = Console(file=io.StringIO(), width=200)
    with pytest.raises(Interrupted):
        demo.run_demo(model="bert", out=out, quick=True, console=console)
    said = " ".join(console.file.getvalue().split())
    assert f"Replacing the finished albert demo (default steps) in {out} (pass --out DIR to keep both" in said
    assert (out / "summary.json").is_file()


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
@pytest.mark.run_first
def test_demo_end_to_end_shows_learning(tmp_path):
    out = tmp_path / "demo"
    env = dict(os.environ, WANDB_MODE="disabled", HF_HUB_OFFLINE="1", COLUMNS="250")
    # The README's demo at half its default length (`--steps 1200`: the same stages, its schedule and checkpoints
    # scaled to 1200 steps): the default's 2400 took 556 s of one of the suite's two workers on an AVX2-only CPU,
    # the longest test by 3.8x. 1200 steps clear every learning bar below (measured there: 25.1% validation accuracy
    # against 4.6%, "try except finally with true" for the keyword). Only a hang fails it, see STALL_SECONDS.
    returncode, stdout = _run_watching_for_stalls(
        [sys.executable, "-m", "bertrain", "demo", "--out", str(out), "--steps", str(DEMO_STEPS)], env)
    assert returncode == 0, stdout[-6000:]
    # Off a terminal, pretraining says where it is and when it ends.
    assert f"train step {DEMO_STEPS} / {DEMO_STEPS} (100.0%)" in stdout and "ETA" in stdout
    summary = json.loads((out / "summary.json").read_text())
    figures = summary["figures"]

    # Loss fell: first vs last logged training loss, read straight from metrics.jsonl.
    records = [json.loads(line) for line in (out / "run" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r.get("kind", "train") == "train"]
    assert train[-1]["step"] == DEMO_STEPS
    assert train[-1]["loss"] < 0.6 * train[0]["loss"]
    assert figures["first_loss"] == train[0]["loss"] and figures["last_loss"] == train[-1]["loss"]

    # Validation MLM accuracy clearly above always guessing the most frequent token.
    evals = [r for r in records if r.get("kind") == "eval"]
    assert evals and evals[-1]["step"] == DEMO_STEPS
    assert figures["val_mlm_accuracy"] == evals[-1]["mlm_accuracy"]
    assert 0.01 < figures["baseline_accuracy"] < 0.2
    # ~540 masked positions: the binomial std of a 5% baseline is ~0.9 points; measured 25.1% vs 4.6% (32-36% after
    # the default 2400 steps).
    assert figures["val_mlm_accuracy"] > 3 * figures["baseline_accuracy"]
    # SOP accuracy is reported, and honest: the pairs no longer leak the label through lengths or mid-word
    # cuts (tests/test_pair_audit.py), and at 32-token pairs this tiny model stays near chance (measured
    # 54.1% at 1200 steps, 47.7% at 2400; 78.1% before, almost all of it the shortcut). A figure this high
    # again would mean a new leak.
    assert 0.35 < figures["val_sentence_accuracy"] < 0.72

    # Python keywords for 'The "[MASK]" statement is used to define a function.' (measured: try,
    # except, finally, with, true; after 2400 steps with, global, import, yield, for), and every check the
    # demo prints passed.
    predictions = [p["token"].strip().lower() for p in summary["fill_mask"][0]["predictions"]]
    assert set(predictions) & PYTHON_WORDS, predictions
    assert summary["checks"] and all(summary["checks"].values()), summary["checks"]

    # The export is a Hugging Face model directory, and the summary shows what happened.
    assert (out / "model" / "config.json").is_file()
    assert json.loads((out / "model" / "config.json").read_text())["model_type"] == "albert"
    assert len(summary["fill_mask"]) == 4 and all(len(item["predictions"]) == 5 for item in summary["fill_mask"])
    assert set(summary["seconds"]) == {"corpus", "prepare", "pretrain", "export", "fill-mask", "total"}
    for text in ("time per stage", "validation MLM accuracy", "most frequent token", "fill-mask", str(out / "model")):
        assert text in " ".join(stdout.split()) or text in stdout, text

    # On a CPU without native bf16 (this AVX2 one), the demo trains in fp32: emulated bf16 is many times slower.
    from bertrain.config import load_config
    from bertrain.train.precision import choose_mixed_precision, cpu_has_native_bf16

    if not cpu_has_native_bf16():
        run_config = load_config(out / "run" / "config.yaml")
        assert choose_mixed_precision(run_config.train.mixed_precision, "cpu") == "no"

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


def _run_watching_for_stalls(command: list[str], env: dict) -> tuple[int, str]:
    """Run `command` to its end, however long it takes; kill it (and fail) only after STALL_SECONDS without output."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    lines: list[str] = []
    last_output = [time.monotonic()]

    def read() -> None:
        for line in process.stdout:
            lines.append(line)
            last_output[0] = time.monotonic()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    while process.poll() is None:
        if time.monotonic() - last_output[0] > STALL_SECONDS:
            process.kill()
            pytest.fail(f"no output for {STALL_SECONDS} s: a hang. Last lines:\n" + "".join(lines[-20:]))
        time.sleep(2)
    reader.join()
    return process.returncode, "".join(lines)
