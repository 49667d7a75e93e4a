"""`bertrain report` (issue 24): the page of a real run stopped and resumed in the middle, bad input, the size of
a 100k-step run's page, and the page in a real headless Chromium (skipped where none is installed: .ci/run
installs Debian's `chromium`)."""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
import tempfile

import pytest
import yaml
from bertrain.rundir import METRICS as METRICS_FILE
from bertrain.train.monitor import read_metrics
from bertrain.train.report import MAX_POINTS, build_page, write_report, write_run_report
from tests.helpers import explain, run_pretrain, write_config

N, STEPS = 3, 6  # stopped after step N, resumed to STEPS
TORN = '{"kind": "train", "step": 7, "lo'
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--enable-logging=stderr", "--v=0")


@pytest.fixture(scope="module")
def resumed_run(tmp_path_factory, tiny_data):
    """A tiny BERT run of STEPS steps, stopped at step N without a report, then resumed by the same command."""
    work = tmp_path_factory.mktemp("report")
    config = write_config(work / "tiny.yaml", train={"max_steps": STEPS, "save_every": N, "eval_every": N})
    run_dir = work / "run"
    first = run_pretrain(config, tiny_data, run_dir, "--set", f"train.stop_at_step={N}",
                         "--set", "logging.report=false")
    assert first.returncode == 0, explain(first)
    assert not (run_dir / "report.html").exists()
    second = run_pretrain(config, tiny_data, run_dir)
    assert second.returncode == 0, explain(second)
    return run_dir


def page_data(page: str) -> dict:
    """The JSON the page draws from."""
    return json.loads(re.search(r'<script type="application/json" id="report-data">(.*?)</script>', page,
                                re.S).group(1))


def test_the_page_holds_each_curve_and_the_resume_mark(resumed_run, run_cli, tmp_path):
    code, out, err = run_cli("report", str(resumed_run), "--out", str(tmp_path / "report.html"))
    assert code == 0 and "report.html" in out, out + err
    records = read_metrics(resumed_run)
    train = [r for r in records if r["kind"] == "train"]
    evals = [r for r in records if r["kind"] == "eval"]
    assert [r["step"] for r in evals] == [N, STEPS]
    # The page pretrain keeps in RUN_DIR (rewritten after each evaluation and at the end) and `bertrain report`'s.
    for page in ((resumed_run / "report.html").read_text(), (tmp_path / "report.html").read_text()):
        (run,) = page_data(page)["runs"]
        assert run["train"]["step"] == list(range(1, STEPS + 1))
        assert run["train"]["tokens"] == [r["tokens_seen"] for r in train]
        for key in ("loss", "mlm_loss", "sentence_loss", "mlm_accuracy", "sentence_accuracy", "lr", "grad_norm",
                    "tokens_per_s"):
            assert run["train"][key] == pytest.approx([r[key] for r in train], rel=1e-5), key
        assert len(run["train"]["mlm_loss_smooth"]) == STEPS and len(run["train"]["sentence_loss_smooth"]) == STEPS
        for key in ("mlm_loss", "sentence_loss", "mlm_accuracy", "sentence_accuracy"):
            assert run["eval"][key] == pytest.approx([r[key] for r in evals], rel=1e-5), key
        assert run["eval"]["tokens"] == [r["tokens_seen"] for r in train if r["step"] in (N, STEPS)]
        marks = {(m["kind"], m["step"]): m["text"] for m in run["marks"]}
        assert {("resume", N), ("checkpoint", N), ("checkpoint", STEPS), ("stop", STEPS)} <= marks.keys()
        assert marks["resume", N] == f"resumed at step {N} (after: stopped at train.stop_at_step={N})"
        assert run["status"].startswith("finished") and run["total_steps"] == STEPS and run["parameters"] > 0
        assert run["sessions"] == 2 and run["skipped"] == 0 and run["objective"] == "nsp" and not run["notes"]
        diff = run["config_diff"]
        assert diff["shipped"] == "tiny_bert" and ["train.max_steps", "500", str(STEPS)] in diff["rows"]
        assert run["data"]["facts"]["tokenizer"].startswith("wordpiece") and not run["data"]["audit"]["found"]
        assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)  # nothing loads from a network


def test_bad_input_gives_a_page_that_says_what_is_missing(resumed_run, run_cli, tmp_path):
    started, torn, older, garbled = (tmp_path / name for name in ("started", "torn", "older", "garbled"))
    started.mkdir()  # what pretrain has written before its first step
    shutil.copy(resumed_run / "config.yaml", started)
    shutil.copytree(resumed_run, torn)
    with open(torn / METRICS_FILE, "a") as handle:
        handle.write(TORN)
    older.mkdir()  # what an older bertrain wrote: train and eval records only, fewer keys, no config.yaml
    (older / METRICS_FILE).write_text("".join(json.dumps({"kind": "train", "step": s, "loss": 9.0 - s, "lr": 1e-4})
                                              + "\n" for s in range(1, 5)))
    garbled.mkdir()
    (garbled / METRICS_FILE).write_text('{"kind": "train", "step": 1, "loss": NaN}\nnot json\n[1, 2]\n'
                                        '{"kind": "stop", "step": "x", "time": "y"}\n{"kind": "eval", "step": 2}\n')
    (garbled / "config.yaml").write_text("model: [not, a, section]\ndata: {path: /nonexistent}\n")
    out_page = tmp_path / "page.html"
    code, out, err = run_cli("report", *(str(p) for p in (started, torn, older, garbled)), "--out", str(out_page))
    assert code == 0, out + err
    runs = page_data(out_page.read_text())["runs"]
    assert [r["name"] for r in runs] == ["started", "torn", "older", "garbled"]
    notes = [" ".join(run["notes"]) for run in runs]
    assert "No metrics.jsonl in" in notes[0] and runs[0]["status"] == "no metrics yet"
    assert "1 unreadable line(s) skipped (line" in notes[1] and "torn last line" in notes[1]
    assert "written by an older bertrain" in notes[2] and re.search(r"hold no [^.]*sentence_loss[^.]*tokens_seen",
                                                                       notes[2])
    assert "No readable config.yaml" in notes[2] and runs[2]["status"] == "unknown (an older bertrain)"
    assert "3 unreadable line(s) skipped (line 2, 3, 4)" in notes[3]
    assert "No readable manifest at /nonexistent/manifest.json" in notes[3]
    assert runs[1]["train"]["step"] == list(range(1, STEPS + 1))  # the torn line is skipped, the rest drawn
    assert runs[2]["train"]["loss"] == [8.0, 7.0, 6.0, 5.0] and runs[2]["train"]["tokens"] == [None] * 4
    assert runs[3]["train"]["step"] == [1] and "loss" not in runs[3]["train"]  # a NaN loss is not drawn
    code, out, err = run_cli("report", str(tmp_path / "missing"), "--out", str(out_page))
    assert code == 2 and "missing (no such directory)" in out + err and "Traceback" not in out + err


def test_a_100k_step_run_makes_a_page_under_2_mb(tmp_path):
    train = ('{"kind": "train", "step": %d, "loss": %.6f, "mlm_loss": %.6f, "sentence_loss": 0.69, '
             '"mlm_accuracy": 0.5, "sentence_accuracy": 0.7, "lr": %.8f, "grad_norm": %.5f, "tokens_per_s": 123456.7, '
             '"tokens_seen": %d}\n')
    lines = ['{"kind": "start", "step": 0, "total_steps": 100000, "parameters": 110000000}\n']
    for step in range(1, 100_001):
        lines.append(train % (step, 10 / (1 + step / 1e4) + step % 7 / 10, 9 / (1 + step / 1e4),
                              1e-4 * (1 - step / 1e5), 1 + step % 13 / 10, 32768 * step))
        if step % 1000 == 0:
            lines.append('{"kind": "eval", "step": %d, "mlm_loss": 3.2, "mlm_accuracy": 0.4}\n' % step)
            lines.append('{"kind": "checkpoint", "step": %d}\n' % step)
        if step == 50_000:
            lines.append('{"kind": "stop", "step": 50000, "reason": "stopped by SIGUSR1"}\n'
                         '{"kind": "start", "step": 50000}\n')
    (tmp_path / METRICS_FILE).write_text("".join(lines))
    page = build_page([tmp_path])
    assert len(page.encode()) < 2 * 1024 * 1024
    (run,) = page_data(page)["runs"]
    assert len(run["train"]["step"]) == MAX_POINTS and run["train"]["step"][0] == 1
    assert run["train"]["step"][-1] == 100_000 and len(run["eval"]["step"]) == 100
    assert ("resume", 50_000) in {(m["kind"], m["step"]) for m in run["marks"]}
    assert (tmp_path / METRICS_FILE).read_text() == "".join(lines)  # what is stored is untouched


def a_run_dir(path):
    """A RUN_DIR as an older bertrain left it: two training records, nothing else (enough for a page)."""
    path.mkdir(parents=True)
    (path / METRICS_FILE).write_text('{"kind": "train", "step": 1, "loss": 9.0}\n{"kind": "train", "step": 2, '
                                     '"loss": 8.0}\n')
    return path


def test_out_may_be_a_directory_or_under_missing_ones_and_nothing_lands_beside_it(run_cli, tmp_path, monkeypatch):
    run_dir, work = a_run_dir(tmp_path / "run"), tmp_path / "work"
    (work / "existing").mkdir(parents=True)
    monkeypatch.chdir(work)
    before = set(tmp_path.rglob("*"))
    written = {"existing": "existing/report.html", str(work / "existing"): f"{work}/existing/report.html",
               ".": "report.html", "new/": "new/report.html", "nodir/sub/r.html": "nodir/sub/r.html"}
    for out, page in written.items():  # --out: the file `Wrote` names
        code, text, err = run_cli("report", str(run_dir), "--out", out)
        assert code == 0 and f"Wrote {page} (" in text, (out, text + err)
        assert page_data((work / page).read_text())["runs"][0]["train"]["loss"] == [9.0, 8.0]
    code, text, err = run_cli("report", str(run_dir))  # no --out: the same name as in a directory
    assert code == 0 and "Wrote report.html" in text, text + err
    new = {p.relative_to(tmp_path).as_posix() for p in set(tmp_path.rglob("*")) - before}
    assert new == {"work/existing/report.html", "work/report.html", "work/new", "work/new/report.html",
                   "work/nodir", "work/nodir/sub", "work/nodir/sub/r.html"}


def test_a_directory_that_is_not_a_run_dir_is_refused_by_name(run_cli, tmp_path):
    run_dir, data_dir, empty, checkpoint = (tmp_path / name for name in ("run", "data", "empty", "checkpoint"))
    a_run_dir(run_dir)
    data_dir.mkdir()
    (data_dir / "manifest.json").write_text("{}")  # what `bertrain prepare` leaves, beside the shards
    empty.mkdir()
    checkpoint.mkdir()
    (checkpoint / "COMPLETE").touch()
    (checkpoint / "config.yaml").touch()
    page = tmp_path / "page.html"
    code, out, err = run_cli("report", str(run_dir), str(data_dir), str(empty), str(checkpoint), "--out", str(page))
    text = out + err
    assert code == 2 and "Traceback" not in text, text
    assert f"{data_dir} (a DATA_DIR, made by `bertrain prepare`)" in text and f"{empty} (an empty directory)" in text
    assert f"{checkpoint} (a checkpoint: its RUN_DIR is" in text
    assert f"{run_dir} " not in text and f"{run_dir})" not in text  # the good one is not named
    assert "the --run-dir of `bertrain pretrain`" in text and not page.exists()


def test_a_report_that_cannot_be_written_only_warns(tmp_path):
    (tmp_path / "report.html").mkdir()  # the rename onto it fails
    warnings = []
    write_run_report(tmp_path, warnings.append)
    assert len(warnings) == 1 and "was not rewritten" in warnings[0] and "training goes on" in warnings[0]


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium installed (.ci/run installs Debian's chromium)")
def test_the_page_renders_in_headless_chromium(resumed_run, tmp_path):
    from bertrain.train.downstream_results import results_markdown, summary

    (tmp_path / "empty").mkdir()
    run_dir = tmp_path / "run"  # a copy, with an evaluation: its results.md is drawn as a table (it was raw text)
    shutil.copytree(resumed_run, run_dir)
    runs = [{"model": "model", "task": "river", "seed": seed, "scores": {"accuracy": a}, "score": a}
            for seed, a in ((1, 0.75), (2, 0.8))]
    results = {"models": {"model": str(run_dir)}, "runs": runs}
    results["summary"] = summary(results, [{"task": "river", "metrics": ["accuracy"], "seeds": 2}])
    (run_dir / "eval").mkdir()
    (run_dir / "eval" / "results.md").write_text(results_markdown(results))
    page = tmp_path / "report.html"
    write_report([run_dir, tmp_path / "empty"], page)

    def chromium(url: str, *args: str) -> subprocess.CompletedProcess:
        profile = tempfile.mkdtemp(dir=tmp_path)  # a new, empty profile each time
        return subprocess.run([CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args, url],
                              capture_output=True, text=True, timeout=120)

    for url in (page.as_uri(), page.as_uri() + "#tokens"):  # x axis: steps, then tokens seen
        result = chromium(url, "--dump-dom")
        console = [line for line in result.stderr.splitlines() if ":CONSOLE" in line]
        assert result.returncode == 0 and not console, result.stderr[-3000:]
        assert 'data-charts="6"' in result.stdout and "data-errors" not in result.stdout, result.stdout[-3000:]
        text = html.unescape(result.stdout)  # what report.js wrote into the page
        assert f"resumed at step {N}" in text and "closest shipped config, tiny_bert" in text
        assert "Trained in 2 sessions (resumed 1 time(s))." in text and "Validation NSP accuracy" in text
        assert "Data" in text and "No metrics.jsonl in" in text
        assert "Evaluation (eval/results.md)" in text and "<th>median</th>" in text and "<td>river</td>" in text
        assert "<td>77.5</td>" in text and "<pre># bertrain evaluate" not in text
    shot = tmp_path / "report.png"
    result = chromium(page.as_uri(), f"--screenshot={shot}", "--window-size=1400,2000")
    assert result.returncode == 0 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", result.stderr[-3000:]
    assert shot.stat().st_size > 30_000  # charts drawn, not a blank page
    print(f"screenshot of the report: {shot}")


def test_the_pair_audit_of_the_run_s_data_is_on_the_page(resumed_run, tiny_data, run_cli, tmp_path):
    data, run_dir = tmp_path / "data", tmp_path / "run"  # copies: the audit is written into its DATA_DIR
    shutil.copytree(tiny_data, data)
    shutil.copytree(resumed_run, run_dir)
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    config["data"]["path"] = str(data)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    code, out, err = run_cli("inspect", str(data), "--pairs", "--audit", "--config", str(run_dir / "config.yaml"),
                             "--audit-instances", "400")
    assert code == 0, out + err
    (run,) = page_data(build_page([run_dir]))["runs"]
    audit = run["data"]["audit"]
    assert audit["found"] and audit["objective"] == "NSP"
    assert audit["max_seq_length"] == config["data"]["max_seq_length"] and audit["held_out"] > 0
    assert [probe[0] for probe in audit["probes"]][-1] == "all seven features above, jointly"


def test_evaluation_tables_at_any_depth_under_the_run_dir_are_shown(tmp_path):
    from bertrain.train.report import read_run

    run_dir = tmp_path / "run"
    for folder in ("", "eval", "eval/glue/deep", "checkpoints/step-00000001"):
        (run_dir / folder).mkdir(parents=True, exist_ok=True)
        (run_dir / folder / "results.md").write_text(f"| table of {folder or 'the run'} |\n")
    (run_dir / "metrics.jsonl").write_text('{"kind": "train", "step": 1, "loss": 9.0, "time": 1.0}\n')
    shown = [path for path, _ in read_run(run_dir, "run")["evaluation"]]
    # It looked one folder down only: `evaluate --out RUN_DIR/eval/glue/deep` was missing from the page.
    assert shown == ["results.md", "eval/results.md", "eval/glue/deep/results.md"]  # not a checkpoint's copy
