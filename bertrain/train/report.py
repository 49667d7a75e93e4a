"""`bertrain report`: one self-contained HTML page of RUN_DIRs (uPlot vendored in report_assets/); what a
RUN_DIR lacks is said on the page, never raised."""

from __future__ import annotations

import contextlib
import functools
import html
import json
import math
import os
import re
import time
from pathlib import Path

import numpy as np
import yaml

from bertrain import rundir
from bertrain.config import flatten, load_config, shipped_files, to_dict
from bertrain.data.pair_audit import AUDIT_FILE
from bertrain.files import write_atomic

ASSETS = Path(__file__).with_name("report_assets")
MAX_POINTS = 1500  # per run and curve: a 100k-step run logged at every step makes a page of ~0.2 MB
TRAIN_KEYS = ("loss", "mlm_loss", "sentence_loss", "mlm_accuracy", "sentence_accuracy", "lr", "grad_norm",
              "tokens_per_s")
EVAL_KEYS = ("mlm_loss", "sentence_loss", "mlm_accuracy", "sentence_accuracy")
RUN_SPECIFIC = ("data.path", "train.output_dir", "model.vocab_size")  # differ in every run: not in the diff
UNREADABLE = (OSError, ValueError, LookupError, TypeError, AttributeError)  # a file missing, or not what we wrote


def write_report(run_dirs: list[Path], out: Path) -> int:
    """Write the page of `run_dirs` to `out` atomically (its missing parent directories created); returns its size
    in bytes."""
    page = build_page([Path(p) for p in run_dirs])
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    write_atomic(Path(out), lambda tmp: tmp.write_text(page, encoding="utf-8"))
    return len(page.encode())


def report_file(out: str) -> Path:
    """The file `--out` names: in an existing directory (or a path ending in /), the page's usual name."""
    return Path(out) / rundir.REPORT if Path(out).is_dir() or out.endswith(("/", os.sep)) else Path(out)


def why_not_a_run_dir(path: Path) -> str | None:
    """Why `path` has nothing for the page (none of the files read here), or None for a RUN_DIR."""
    if not path.is_dir():
        return "a file, not a directory" if path.exists() else "no such directory"
    if (path / rundir.MARKER).is_file():  # a checkpoint holds a config.yaml too, but no curves
        return f"a checkpoint: its RUN_DIR is {path.parent.parent}"
    if any((path / name).exists() for name in (rundir.METRICS, rundir.CONFIG, rundir.CHECKPOINTS)) \
            or any(path.glob(f"{rundir.OLD_RUN_PREFIX}*")):
        return None
    if (path / "manifest.json").is_file():
        return "a DATA_DIR, made by `bertrain prepare`"
    if not any(path.iterdir()):
        return "an empty directory"
    return f"no {rundir.METRICS}, {rundir.CONFIG} or {rundir.CHECKPOINTS}/ in it"


def write_run_report(run_dir: Path, warn) -> None:
    """RUN_DIR/report.html, as pretrain keeps it current; a failure only warns: the page never stops a run."""
    try:
        write_report([run_dir], run_dir / rundir.REPORT)
    except Exception as error:  # noqa: BLE001 - any bug here must cost the page, not the training run
        warn(f"{run_dir / rundir.REPORT} was not rewritten ({type(error).__name__}: {error}); training goes on.")


def build_page(run_dirs: list[Path]) -> str:
    """The page: report.js draws the verdict table, the curves and a section per run from the inline data."""
    names = [p.resolve().name for p in run_dirs]
    names = [n if names.count(n) == 1 else "/".join(p.resolve().parts[-2:]) for n, p in zip(names, run_dirs)]
    runs = [read_run(path, name) for path, name in zip(run_dirs, names)]
    asset = {p.name: p.read_text(encoding="utf-8") for p in ASSETS.iterdir()}
    parts = {"title": html.escape(", ".join(names)), "generated": time.strftime("%Y-%m-%d %H:%M %Z"),
             "data": json.dumps({"runs": runs}, separators=(",", ":")).replace("</", "<\\/"),
             "uplot_css": asset["uPlot.min.css"], "report_css": asset["report.css"], "report_js": asset["report.js"],
             "uplot_js": asset["uPlot.iife.min.js"], "uplot_license": asset["uPlot.LICENSE"].replace("--", "-")}
    return re.sub(r"\{\{(\w+)\}\}", lambda m: parts[m.group(1)], asset["page.html"])


def read_records(run_dir: Path) -> tuple[list[dict], list[str]]:
    """metrics.jsonl's records (any line that is not one is skipped) and what the page should say about it."""
    path = run_dir / rundir.METRICS
    if not path.is_file():
        return [], [f"No {rundir.METRICS} in {run_dir} yet: the run has logged no step."]
    records, bad = [], []
    for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        with contextlib.suppress(ValueError):
            if isinstance(record := json.loads(line), dict) and isinstance(record.get("step"), int):
                records.append(record)
                continue
        if line.strip():
            bad.append(number)
    return records, [f"{rundir.METRICS}: {len(bad)} unreadable line(s) skipped (line {', '.join(map(str, bad[:5]))}); "
                     f"a torn last line is left by a kill or a full disk during an append."] if bad else []


def read_run(run_dir: Path, name: str) -> dict:
    """One run's curves and marks (for report.js), its verdict row and its HTML section."""
    records, notes = read_records(run_dir)
    train = [r for r in records if r.get("kind", "train") == "train"]
    evals = [r for r in records if r.get("kind") == "eval"]
    seen = {r["step"]: r["tokens_seen"] for r in train if type(r.get("tokens_seen")) in (int, float)}
    steps = sorted(seen)
    tokens_at = (lambda xs: np.interp(xs, steps, [seen[s] for s in steps]).round().astype(int).tolist()) \
        if steps else (lambda xs: [None] * len(xs))
    marks, status, facts = _marks(records, run_dir, notes)
    for mark in marks:
        mark["tokens"] = tokens_at([mark["step"]])[0]
    config = _read_config(run_dir / rundir.CONFIG, notes)
    missing = [k for k in TRAIN_KEYS + ("tokens_seen",) if train and all(r.get(k) is None for r in train)]
    if missing:
        notes.append(f"The training records hold no {', '.join(missing)} (an older bertrain, or not logged).")
    aside = sorted(p.name for p in run_dir.glob(f"{rundir.OLD_RUN_PREFIX}*") if p.is_dir())  # --resume restart
    if aside:
        notes.append(f"Restarted from step 0 (--resume restart): the earlier run is in {', '.join(aside)}; "
                     f"`bertrain report {run_dir / aside[-1]} {run_dir}` shows both.")
    return {"name": name, "path": str(run_dir.resolve()), "notes": notes, "status": status, "marks": marks,
            "model": config.get("model"), "parameters": facts.get("parameters"),
            "total_steps": facts.get("total_steps") or config.get("train", {}).get("max_steps"),
            "objective": config.get("data", {}).get("objective"), "sessions": facts["starts"],
            "skipped": facts["skipped"], "data": _data(config["data"], notes) if "data" in config else None,
            "config_diff": _config_diff(config) if config else None,
            "evaluation": [  # the tables `bertrain evaluate --out` wrote under this RUN_DIR
                [str(p.relative_to(run_dir)), p.read_text(encoding="utf-8", errors="replace")]
                for p in evaluation_tables(run_dir)],
            "train": _series(train, TRAIN_KEYS, tokens_at, ("mlm_loss", "sentence_loss")),
            "eval": _series(evals, EVAL_KEYS, tokens_at)}


def evaluation_tables(run_dir: Path) -> list[Path]:
    """Every results.md under RUN_DIR, at any depth, shallowest first; checkpoints and wandb's files not walked (a
    long run holds thousands of them)."""
    found = []
    for root, folders, files in os.walk(run_dir):
        folders[:] = [name for name in folders if name not in (rundir.CHECKPOINTS, "wandb")]
        found += [Path(root) / rundir.EVALUATION] if rundir.EVALUATION in files else []
    return sorted(found, key=lambda path: (len(path.parts), path))


def _marks(records: list[dict], run_dir: Path, notes: list[str]) -> tuple[list[dict], str, dict]:
    """Marks on the curves (checkpoints, resumes, the last stop, skipped steps), the run's status, and facts."""
    marks, stop, facts = [], None, {"skipped": 0, "starts": 0}
    for record in (r for r in records if r.get("kind") in ("start", "checkpoint", "nonfinite", "stop")):
        kind, step = record["kind"], record["step"]
        if kind == "start" and step > 0:
            after = f"after: {stop.get('reason')}" if stop else "the session before left no stop record: killed?"
            marks.append({"step": step, "kind": "resume", "text": f"resumed at step {step} ({after})"})
        if kind == "start":
            stop, facts = None, {**facts, **record, "starts": facts["starts"] + 1, "skipped": facts["skipped"]}
        elif kind == "checkpoint":
            marks.append({"step": step, "kind": kind, "text": f"checkpoint at step {step}"})
        elif kind == "nonfinite":
            facts["skipped"] += _number(record.get("skipped")) or 0
            marks.append({"step": step, "kind": kind, "text": f"non-finite steps skipped by step {step}"})
        else:
            stop = record
    saved = {m["step"] for m in marks if m["kind"] == "checkpoint"}
    marks += [{"step": rundir.step_of(p), "kind": "checkpoint", "text": f"checkpoint at step {rundir.step_of(p)} "
               "(on disk)"} for p in rundir.iter_checkpoints(run_dir) if rundir.step_of(p) not in saved]
    if records and not facts["starts"]:
        notes.append("No start/stop/checkpoint records: this run was written by an older bertrain, so resumes and "
                     "stops cannot be marked; checkpoint marks come from the checkpoints still on disk.")
    if stop:
        marks.append({"step": stop["step"], "kind": "stop", "text": f"{stop.get('reason')} at step {stop['step']}"})
    last = max((r["time"] for r in records if type(r.get("time")) in (int, float)), default=0)
    status = (str(stop.get("reason")) if stop else "running, or stopped without a record (killed)" if facts["starts"]
              else "unknown (an older bertrain)" if records else "no metrics yet")
    status += time.strftime(" (last record %Y-%m-%d %H:%M)", time.localtime(last)) if last else ""
    return sorted(marks, key=lambda m: m["step"]), status, facts


def _series(records: list[dict], keys: tuple[str, ...], tokens_at, smoothed: tuple[str, ...] = ()) -> dict:
    """Columns to draw: step, tokens seen and each key present (also smoothed for `smoothed`), downsampled."""
    by_step = {r["step"]: r for r in records}  # a step logged twice keeps its newest record
    steps = sorted(by_step)
    keep = (np.unique(np.linspace(0, len(steps) - 1, MAX_POINTS).round().astype(int)).tolist()
            if len(steps) > MAX_POINTS else list(range(len(steps))))
    tokens = tokens_at(steps)
    columns = {"step": [steps[i] for i in keep], "tokens": [tokens[i] for i in keep]}
    for key in keys:
        values = [by_step[s].get(key) for s in steps]
        values = [float(v) if type(v) in (int, float) else math.nan for v in values]  # inline: 1M values take 1 s
        if not all(math.isnan(v) for v in values):
            columns[key] = [_number(values[i]) for i in keep]
            if key in smoothed:
                average = _smooth(values)
                columns[key + "_smooth"] = [_number(average[i]) for i in keep]
    return columns


def _smooth(values: list[float]) -> list[float]:
    """Bias-corrected exponential moving average over about a fortieth of the records (NaN gaps carried)."""
    alpha, average, weight, out = 2 / (max(2, len(values) // 40) + 1), 0.0, 0.0, []
    for value in values:
        if value == value:
            average, weight = average * (1 - alpha) + alpha * value, weight * (1 - alpha) + alpha
        out.append(average / weight if weight else math.nan)
    return out


def _number(value):
    """A finite number at 6 significant digits (what the page draws), else None (a gap)."""
    if type(value) in (int, float) and math.isfinite(value):
        return value if type(value) is int else float(f"{value:.6g}")
    return None


def _read_config(path: Path, notes: list[str]) -> dict:
    """RUN_DIR/config.yaml's sections (mappings only, so that every lookup may use .get); {} when unreadable."""
    try:
        return {k: v for k, v in yaml.safe_load(path.read_text(encoding="utf-8")).items() if isinstance(v, dict)}
    except (*UNREADABLE, yaml.YAMLError) as error:
        notes.append(f"No readable {path.name} ({type(error).__name__}): model, data and config diff unknown.")
        return {}


def _data(data: dict, notes: list[str]) -> dict | None:
    """The run's DATA_DIR: its manifest (tokenizer, documents and tokens per split) and its pair audit."""
    path, objective = Path(str(data.get("path"))), str(data.get("objective"))
    try:
        manifest = json.loads((path / "manifest.json").read_text(encoding="utf-8"))
        tokenizer, splits = manifest["tokenizer"], manifest["splits"]
        shown = {"facts": {"DATA_DIR": str(path), "sources": ", ".join(str(s.get("path")) for s in manifest["sources"]),
                           "tokenizer": f"{tokenizer['kind']}, vocabulary {tokenizer['vocab_size']}"},
                 "splits": [[name, s["documents"], s["sentences"], s["tokens"]] for name, s in splits.items()]}
    except UNREADABLE as error:
        notes.append(f"No readable manifest at {path}/manifest.json ({type(error).__name__}): the data is not shown.")
        return None
    shown["audit"] = {"objective": objective.upper(), "found": False}  # report.js says how to make one
    with contextlib.suppress(*UNREADABLE):
        audit = json.loads((path / AUDIT_FILE.format(objective=objective)).read_text(encoding="utf-8"))
        shown["audit"].update(found=True, held_out=int(audit["held_out"]), max_seq_length=audit["max_seq_length"],
                              probes=[[p["feature"], float(p["accuracy"]), float(p["majority"]), bool(p["shortcut"])]
                                      for p in audit["probes"]])
    return shown


@functools.lru_cache(maxsize=1)
def _shipped_configs() -> dict[str, dict]:
    return {path.stem: flatten(to_dict(load_config(path))) for path in shipped_files("configs")}


def _config_diff(config: dict) -> dict:
    """The run's config as a diff against the closest shipped config (the fewest differing keys)."""
    def shown(tree: dict, key: str) -> str:
        return json.dumps(tree[key], default=str) if key in tree else "(absent)"
    ours = flatten(config)
    diffs = {name: [(k, shown(shipped, k), shown(ours, k)) for k in sorted(shipped.keys() | ours.keys())
                    if shown(shipped, k) != shown(ours, k) and k not in RUN_SPECIFIC]
             for name, shipped in _shipped_configs().items()}
    name = min(diffs, key=lambda n: len(diffs[n]))
    return {"shipped": name, "rows": diffs[name]}
