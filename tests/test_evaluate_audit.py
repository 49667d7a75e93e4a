"""`bertrain evaluate` after audit 2: continuing refuses changed task files or weights, a smaller --seeds reports
those asked, Ctrl-C says how to continue, validation that is training data is warned about, one seed has no std,
the baseline table has min-max, and an empty training file is named as empty."""

from __future__ import annotations

import io
import json
import signal

import pytest

from bertrain.data.tasks import resolve_tasks
from bertrain.errors import DataError, UsageError
from bertrain.train import downstream
from bertrain.train.downstream_results import read_results, results_markdown, rows
from bertrain.train.scores import summarize
from tests.helpers import default_ctrl_c
from tests.test_evaluate import (QUICK, quiet_console, run_cli, signal_after_the_first_run, tiny_model_dir,
                                 write_task)

FAST = QUICK + ["finetune.max_train_examples=16"]


def test_continuing_refuses_changed_task_files_or_weights_and_keeps_results_json(tmp_path):
    model = tiny_model_dir(tmp_path / "m")
    task = write_task(tmp_path / "task")
    out = tmp_path / "eval"
    downstream.evaluate(model, resolve_tasks(str(task), None), out, quiet_console(), FAST, seeds=1)
    before = (out / "results.json").read_text()
    dev = task.parent / "dev.jsonl"
    lines = dev.read_text().splitlines(keepends=True)

    dev.write_text("".join(lines[:10]))  # the user trims the validation file
    with pytest.raises(UsageError, match=r"holds river runs scored on other examples \(dev: 24 examples then, 10 "
                                         r"now\).* Use a new --out, or remove .*results.json to start over"):
        downstream.evaluate(model, resolve_tasks(str(task), None), out, quiet_console(), FAST, seeds=2)

    record = json.loads(lines[0])
    record["label"] = {"yes": "no", "no": "yes"}[record["label"]]
    dev.write_text(json.dumps(record) + "\n" + "".join(lines[1:]))  # same count, one label fixed
    with pytest.raises(UsageError, match="dev: 24 examples then and now, other texts or labels"):
        downstream.evaluate(model, resolve_tasks(str(task), None), out, quiet_console(), FAST, seeds=2)

    dev.write_text("".join(lines))
    tiny_model_dir(tmp_path / "m", seed=1)  # other weights re-exported at the same path
    with pytest.raises(UsageError, match=rf"holds runs of the model with other weights than {model} has now "
                                         r"\(sha256 \w{12} then, \w{12} now\).* remove .*results.json to start over"):
        downstream.evaluate(model, resolve_tasks(str(task), None), out, quiet_console(), FAST, seeds=2)
    assert (out / "results.json").read_text() == before


def test_results_without_fingerprints_are_continued_with_one_warning(tmp_path):
    model = tiny_model_dir(tmp_path)
    tasks = resolve_tasks(str(write_task(tmp_path / "task")), None)
    out = tmp_path / "eval"
    downstream.evaluate(model, tasks, out, quiet_console(), FAST, seeds=2)
    old = read_results(out)
    for run in old["runs"]:  # as written before fingerprints were recorded
        del run["data"], run["weights_sha256"]
    (out / "results.json").write_text(json.dumps(old))
    warnings = []
    results = downstream.evaluate(model, tasks, out, quiet_console(), FAST, seeds=3, warn=warnings.append)
    unchecked = [w for w in warnings if "without fingerprints" in w]
    assert len(unchecked) == 1 and "holds 2 run(s)" in unchecked[0], warnings
    assert results["summary"]["model"]["tasks"]["river"]["seeds"] == [1, 2, 3]
    assert {run["seed"]: "data" in run for run in read_results(out)["runs"]} == {1: False, 2: False, 3: True}


def test_fewer_seeds_than_results_json_holds_reports_the_first_ones_and_says_so(tmp_path, monkeypatch):
    from bertrain.console import make_console

    model = tiny_model_dir(tmp_path)
    tasks = resolve_tasks(str(write_task(tmp_path / "task")), None)
    out = tmp_path / "eval"
    downstream.evaluate(model, tasks, out, quiet_console(), FAST, seeds=3)
    monkeypatch.setattr(downstream, "finetune", lambda *a, **k: pytest.fail("every asked seed is in results.json"))
    printed = io.StringIO()
    results = downstream.evaluate(model, tasks, out, make_console(file=printed), FAST, seeds=2)
    river = results["summary"]["model"]["tasks"]["river"]
    assert river["seeds"] == [1, 2] and river["planned_seeds"] == 2
    assert read_results(out)["summary"] == results["summary"] and "| river | accuracy | 2 |" in (
        out / "results.md").read_text()
    assert "river: results.json holds 3 seeds; reporting seeds 1-2 as asked (--seeds 3 reports them all)." in \
        " ".join(printed.getvalue().split())


def test_cli_ctrl_c_exits_130_and_says_how_to_continue(tmp_path):
    model = tiny_model_dir(tmp_path)
    task = write_task(tmp_path / "task", train_rows=200)
    out = tmp_path / "eval"
    process = run_cli("evaluate", str(model), "--tasks", str(task), "--seeds", "30", "--out", str(out),
                      *[item for override in QUICK for item in ("--set", override)], preexec_fn=default_ctrl_c)
    _, stderr = signal_after_the_first_run(process, out, signal.SIGINT)
    assert process.returncode == 130, stderr
    assert "evaluate stopped by Ctrl-C: every finished (task, seed) is in results.json; run the same command to " \
        "continue from there." in " ".join(stderr.split()) and "Traceback" not in stderr
    assert 1 <= len(read_results(out)["runs"]) < 30


def test_validation_that_is_training_data_is_warned_about(tmp_path):
    model = tiny_model_dir(tmp_path)
    same = write_task(tmp_path / "same", validation="./train.jsonl")
    copied = write_task(tmp_path / "copied")
    train_lines = (copied.parent / "train.jsonl").read_text().splitlines(keepends=True)
    (copied.parent / "dev.jsonl").write_text("".join(train_lines[::3]))
    separate = write_task(tmp_path / "separate")
    said = {}
    for task in (same, copied, separate):
        warnings = []
        downstream.evaluate(model, resolve_tasks(str(task), None), tmp_path / task.parent.name, quiet_console(),
                            FAST, seeds=1, warn=warnings.append)
        said[task.parent.name] = [w for w in warnings if "recalls examples it was trained on" in w]
    assert len(said["same"]) == 1 and f"validation file {same.parent / 'train.jsonl'} is its training file" in \
        said["same"][0]
    assert len(said["copied"]) == 1 and "all 16 validation examples (dev) are also in its training file" in \
        said["copied"][0]
    assert said["separate"] == []


def one_task_results(model_scores: list[float], baseline_scores: list[float] | None = None) -> dict:
    summary = {"model": {"tasks": {"river": {"metric": "accuracy", "seeds": list(range(1, len(model_scores) + 1)),
                                             **summarize(model_scores)}}, "average": None}}
    if baseline_scores is not None:
        summary["baseline"] = {"tasks": {"river": {"metric": "accuracy",
                                                   "seeds": list(range(1, len(baseline_scores) + 1)),
                                                   **summarize(baseline_scores)}}, "average": None}
    return {"models": {name: name for name in summary}, "runs": [], "summary": summary}


def test_one_seed_has_no_std_and_the_baseline_table_has_min_max():
    assert summarize([0.475])["std"] is None
    header, body = rows(one_task_results([0.475]))
    assert body[0][header.index("mean ± std")] == "47.5 ± -"

    header, body = rows(one_task_results([0.80, 0.90, 0.85], [0.475]))
    assert header == ["task", "metric", "model median (mean ± std)", "min-max", "baseline median (mean ± std)",
                      "difference", "beyond seed spread?"]
    assert body[0][2:] == ["85.0 (85.0 ± 5.0, 3 seeds)", "80.0-90.0", "47.5 (47.5 ± -, 1 seed)", "+37.5", "-"]
    assert "| min-max |" in results_markdown(one_task_results([0.80, 0.90], [0.5, 0.6]))


def test_an_empty_training_file_is_named_as_empty(tmp_path):
    task = write_task(tmp_path / "task")
    (task.parent / "train.jsonl").write_text("")
    with pytest.raises(DataError, match=r"train.jsonl is empty: a training file needs examples"):
        resolve_tasks(str(task), None)


def test_a_seed_that_predicts_one_class_for_every_example_is_warned_about(tmp_path, monkeypatch):
    # Audit 6: such seeds scored F1 / MCC / correlation 0 silently and widened the spread.
    from bertrain.train import finetune

    model = tiny_model_dir(tmp_path)
    task = write_task(tmp_path / "task")
    real, warnings, results = finetune.predict, {}, {}
    for case in ("both classes", "one class"):
        def predict(*args, **kwargs):
            outputs = real(*args, **kwargs)
            outputs[:] = [1.0, 0.0]
            if case == "both classes":
                outputs[1::2] = [0.0, 1.0]
            return outputs

        monkeypatch.setattr(finetune, "predict", predict)
        warnings[case] = []
        results[case] = downstream.evaluate(model, resolve_tasks(str(task), None), tmp_path / case, quiet_console(),
                                            FAST, seeds=1, warn=warnings[case].append)
    assert not [w for w in warnings["both classes"] if "collapsed" in w] and results["both classes"]["runs"][0][
        "constant"] == []
    said = [w for w in warnings["one class"] if "collapsed" in w]
    assert len(said) == 1 and "river seed 1 gave every validation example one prediction (dev)" in said[0]
    assert results["one class"]["runs"][0]["constant"] == ["dev"]
    assert all(r["runs"][0]["threads"] == 1 for r in results.values())  # finetune.threads=1: the count used


def test_a_task_of_several_metrics_reports_each_one_s_median_too():
    # Audit 6: MRPC's F1 and accuracy (and MNLI-m/mm) were shown only as their mean, which no paper reports.
    from bertrain.train.downstream_results import summary

    scores = [{"f1": 0.90, "accuracy": 0.80}, {"f1": 0.70, "accuracy": 0.84}, {"f1": 0.86, "accuracy": 0.60}]
    runs = [{"model": "model", "task": "mrpc", "seed": seed, "scores": s, "score": (s["f1"] + s["accuracy"]) / 2}
            for seed, s in enumerate(scores, 1)]
    results = {"models": {"model": "m"}, "runs": runs}
    results["summary"] = summary(results, [{"task": "mrpc", "metrics": ["f1", "accuracy"], "seeds": 3}])
    assert results["summary"]["model"]["tasks"]["mrpc"]["per_metric_median"] == {"f1": 0.86, "accuracy": 0.80}
    text = results_markdown(results)
    assert "| mrpc | model | f1 | 86.0 |" in text and "| mrpc | model | accuracy | 80.0 |" in text
    assert "| mrpc | f1/accuracy | 3 | 77.0 |" in text  # the task's own score: the median of the per-seed means
