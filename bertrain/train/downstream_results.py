"""`bertrain evaluate`'s results: DIR/results.json (each finished (model, task, seed) as it ends, so an interrupted
evaluation continues), the summary over seeds (median, mean ± std, min, max; the GLUE-style average of the
per-task medians), DIR/results.md, the rich table, and a baseline side by side."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.table import Table

from bertrain.errors import DataError, UsageError
from bertrain.files import exclusive_lock, write_atomic
from bertrain.train.scores import summarize

RESULTS_FILE, MARKDOWN_FILE, LOCK_FILE = "results.json", "results.md", ".results.lock"
MODEL, BASELINE = "model", "baseline"


def read_results(out_dir: Path) -> dict[str, Any]:
    """DIR/results.json, or an empty record when there is none yet."""
    path = out_dir / RESULTS_FILE
    if not path.is_file():
        return {"models": {}, "runs": []}
    try:
        results = json.loads(path.read_text(encoding="utf-8"))
        assert isinstance(results.get("runs"), list) and isinstance(results.get("models"), dict)
        return results
    except (ValueError, AssertionError, AttributeError) as error:
        raise DataError(f"{path} is not a results file of bertrain evaluate ({error or 'wrong layout'}). Choose "
                        "another --out, or move the file away to start over.") from None


def find_run(results: dict, model: str, task: str, seed: int) -> dict | None:
    return next((run for run in results["runs"] if (run["model"], run["task"], run["seed"]) == (model, task, seed)),
                None)


def check_continuation(results: dict, out_dir: Path, model: str, loaded: str, task: str, recipe: dict) -> None:
    """Refuse to mix: runs already in DIR of this model and task must come from the same weights and recipe."""
    known = results["models"].get(model)
    if known is not None and known != loaded and any(r["model"] == model for r in results["runs"]):
        raise UsageError(f"{out_dir / RESULTS_FILE} holds results of {known} as the {model}, not of {loaded}. "
                         "Choose another --out (or move that results.json away to start over).")
    for run in results["runs"]:
        # More or fewer seeds extend or cut a run's set; threads change no score's meaning; any other key makes
        # other runs.
        changed = ", ".join(f"{key} {run['recipe'].get(key)} -> {value}" for key, value in recipe.items()
                            if key not in ("seeds", "threads") and run["recipe"].get(key) != value)
        if run["model"] == model and run["task"] == task and changed:
            raise UsageError(f"{out_dir / RESULTS_FILE} holds {task} runs of the {model} with another recipe "
                             f"({changed}). Choose another --out to compare recipes, or run with the same --set.")


def check_fingerprints(results: dict, out_dir: Path, model: str, loaded: str, weights: str, task: str, data: dict,
                       source: str) -> None:
    """Refuse to mix: runs of this model must come from the same weights (sha256 of its tensors as loaded), runs of
    this task (any model) from the same examples. Runs recorded without fingerprints are not checked."""
    path = out_dir / RESULTS_FILE
    before = next((run["weights_sha256"] for run in results["runs"] if run["model"] == model
                   and run.get("weights_sha256", weights) != weights), None)
    if before is not None:
        raise UsageError(f"{path} holds runs of the {model} with other weights than {loaded} has now (sha256 "
                         f"{before[:12]} then, {weights[:12]} now): it was retrained or re-exported since. Use a new "
                         f"--out, or remove {path} to start over.")
    for run in results["runs"]:
        changes = _data_changes(run.get("data"), data) if run["task"] == task else ""
        if changes:
            raise UsageError(f"{path} holds {task} runs scored on other examples ({changes}): the task's files "
                             f"({source}) changed since. Use a new --out, or remove {path} to start over.")


def _data_changes(then: dict | None, now: dict) -> str:
    """How a task's splits ({split: {examples, sha256}}) differ from those a run recorded; "" when they do not."""
    if then is None:
        return ""
    changes = []
    for split in dict.fromkeys([*then, *now]):
        old, new = then.get(split), now.get(split)
        if old == new:
            continue
        if old is None or new is None:
            changes.append(f"split {split} is {'new' if old is None else 'gone'}")
        elif old["examples"] != new["examples"]:
            changes.append(f"{split}: {old['examples']} examples then, {new['examples']} now")
        else:
            changes.append(f"{split}: {new['examples']} examples then and now, other texts or labels")
    return "; ".join(changes)


def unchecked_runs(results: dict) -> int:
    """Runs recorded before results.json held fingerprints of the weights and examples."""
    return sum(1 for run in results["runs"] if "data" not in run or "weights_sha256" not in run)


def beyond_plan(results: dict, plan: list[dict], models: list[str]) -> list[str]:
    """A note per task whose results.json holds more seeds than this evaluation asks for (only those are reported),
    and per model in the table that this evaluation did not run (a baseline of an earlier one)."""
    notes = [f"{model}: its rows come from an earlier evaluation in this directory ({results['models'][model]}); "
             f"this one did not run it" for model in results.get("models", {}) if model not in models]
    for item in plan:
        stored = sorted({run["seed"] for run in results["runs"] if run["task"] == item["task"]})
        if stored and stored[-1] > item["seeds"]:
            asked = f"seeds 1-{item['seeds']}" if item["seeds"] > 1 else "seed 1"
            notes.append(f"{item['task']}: {RESULTS_FILE} holds {len(stored)} seeds; reporting {asked} as asked "
                         f"(--seeds {stored[-1]} reports them all).")
    return notes


def record_run(out_dir: Path, model: str, loaded: str, run: dict, plan: list[dict]) -> dict:
    """Add one finished run to DIR/results.json (under a lock: several processes may share DIR), then rewrite the
    summary and DIR/results.md; returns the results as now on disk."""
    with exclusive_lock(out_dir / LOCK_FILE, wait=True):
        results = read_results(out_dir)
        results["models"][model] = loaded
        results["runs"] = [r for r in results["runs"]
                           if (r["model"], r["task"], r["seed"]) != (model, run["task"], run["seed"])] + [run]
        _write(out_dir, results, plan)
    return results


def refresh_summary(out_dir: Path, plan: list[dict]) -> dict:
    """DIR/results.json with its summary over this evaluation's plan (its seeds may be fewer than a previous one's),
    rewritten (with DIR/results.md) when that changes it."""
    with exclusive_lock(out_dir / LOCK_FILE, wait=True):
        results = read_results(out_dir)
        if results["runs"] and summary(results, plan) != results.get("summary"):
            _write(out_dir, results, plan)
    return results


def _write(out_dir: Path, results: dict, plan: list[dict]) -> None:
    results["summary"] = summary(results, plan)
    text = json.dumps(results, indent=1) + "\n"
    write_atomic(out_dir / RESULTS_FILE, lambda tmp: tmp.write_text(text, encoding="utf-8"))
    markdown = results_markdown(results)
    write_atomic(out_dir / MARKDOWN_FILE, lambda tmp: tmp.write_text(markdown, encoding="utf-8"))


def summary(results: dict, plan: list[dict]) -> dict:
    """Per model and task: metric, seeds, per-seed scores (and per metric), median, mean, std, min, max; the average
    of the task medians once every planned task has all its seeds. `plan`: [{task, metrics, seeds}] in order."""
    out: dict[str, Any] = {}
    for model in results["models"]:
        tasks = {}
        for item in plan:
            runs = sorted((r for r in results["runs"] if r["model"] == model and r["task"] == item["task"]
                           and r["seed"] <= item["seeds"]), key=lambda r: r["seed"])  # seeds 1..N of this plan
            if not runs:
                continue
            keys = list(runs[0]["scores"])
            tasks[item["task"]] = {"metric": "/".join(keys), "seeds": [r["seed"] for r in runs],
                                   "planned_seeds": item["seeds"], "scores": [r["score"] for r in runs],
                                   "per_metric": {k: [r["scores"][k] for r in runs] for k in keys},
                                   # MNLI-m/mm, MRPC's F1/accuracy: papers report them apart, not their mean
                                   "per_metric_median": {k: summarize([r["scores"][k] for r in runs])["median"]
                                                         for k in keys},
                                   **summarize([r["score"] for r in runs])}
        complete = len(tasks) == len(plan) and all(len(t["seeds"]) >= t["planned_seeds"] for t in tasks.values())
        medians = [t["median"] for t in tasks.values()]
        out[model] = {"tasks": tasks, "complete": complete,
                      "average": sum(medians) / len(medians) if complete and medians else None}
    return out


def _points(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}"


def comparison(results: dict) -> dict[str, dict]:
    """Per task both have: the difference of medians (model - baseline) and whether it exceeds the seed spread
    (the larger of the two standard deviations; None with a single seed)."""
    mine, theirs = results["summary"].get(MODEL, {}).get("tasks", {}), results["summary"].get(BASELINE, {}).get(
        "tasks", {})
    out = {}
    for task in mine:
        if task in theirs:
            difference = mine[task]["median"] - theirs[task]["median"]
            stds = [mine[task]["std"], theirs[task]["std"]]
            spread = None if None in stds else max(stds)  # one seed has no spread: no verdict
            out[task] = {"difference": difference, "spread": spread,
                         "beyond_spread": None if spread is None else abs(difference) > spread}
    return out


def _mean_std(t: dict) -> str:
    return f"{_points(t['mean'])} ± {_points(t['std'])}"


def rows(results: dict) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of the results table, in points (x100): one model, or model and baseline side by side."""
    tasks_of = {model: s["tasks"] for model, s in results.get("summary", {}).items()}
    if BASELINE not in tasks_of:
        header = ["task", "metric", "seeds", "median", "mean ± std", "min", "max"]
        body = [[task, t["metric"], str(len(t["seeds"])), _points(t["median"]),
                 _mean_std(t), _points(t["min"]), _points(t["max"])]
                for task, t in tasks_of.get(MODEL, {}).items()]
        average = results["summary"].get(MODEL, {}).get("average")
        body.append(["average (of medians)", "", "", _points(average), "", "", ""])
        return header, body
    compared = comparison(results)
    header = ["task", "metric", "model median (mean ± std)", "min-max", "baseline median (mean ± std)",
              "difference", "beyond seed spread?"]
    body = []
    for task in dict.fromkeys([*tasks_of.get(MODEL, {}), *tasks_of[BASELINE]]):
        cells = []
        for model in (MODEL, BASELINE):
            t = tasks_of.get(model, {}).get(task)
            seeds = "" if t is None else f"{len(t['seeds'])} seed{'s' * (len(t['seeds']) != 1)}"
            cells.append("-" if t is None else f"{_points(t['median'])} ({_mean_std(t)}, {seeds})")
        mine = tasks_of.get(MODEL, {}).get(task)
        min_max = "-" if mine is None else f"{_points(mine['min'])}-{_points(mine['max'])}"
        c = compared.get(task)
        verdict = "-" if c is None or c["beyond_spread"] is None else ("yes" if c["beyond_spread"] else "no")
        metric = (mine or tasks_of[BASELINE][task])["metric"]
        body.append([task, metric, cells[0], min_max, cells[1], "-" if c is None else f"{100 * c['difference']:+.1f}",
                     verdict])
    averages = [results["summary"].get(model, {}).get("average") for model in (MODEL, BASELINE)]
    difference = averages[0] - averages[1] if None not in averages else None
    body.append(["average (of medians)", "", _points(averages[0]), "", _points(averages[1]),
                 "-" if difference is None else f"{100 * difference:+.1f}", ""])
    return header, body


def results_table(results: dict, title: str) -> Table:
    header, body = rows(results)
    table = Table(title=title)
    for index, name in enumerate(header):
        table.add_column(name, justify="left" if index < 2 else "right", style="cyan" if index == 0 else None)
    for row in body:
        table.add_row(*row)
    return table


def results_markdown(results: dict) -> str:
    header, body = rows(results)
    lines = ["# bertrain evaluate", ""]
    lines += [f"- {model}: `{loaded}`" for model, loaded in results["models"].items()]
    lines += ["", "Scores x 100 over fine-tuning seeds; a task's score is the mean of its metrics; the average is "
              "over the per-task medians.", "", "| " + " | ".join(header) + " |",
              "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in body]
    split = [(task, model, t["per_metric_median"]) for model, s in results.get("summary", {}).items()
             for task, t in s["tasks"].items() if len(t.get("per_metric_median", {})) > 1]
    if split:  # the tasks whose score is a mean of several metrics, each on its own
        lines += ["", "Each metric of those tasks (median over seeds, x 100):", "",
                  "| task | model | metric | median |", "|---|---|---|---|"]
        lines += [f"| {task} | {model} | {metric} | {_points(value)} |" for task, model, medians in split
                  for metric, value in medians.items()]
    return "\n".join(lines) + "\n"
