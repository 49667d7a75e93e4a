"""The command line as a user meets it: refusals with exit 2, output that never wraps off a terminal,
--help that Typer renders whole, `config list`, a preemption printed as the expected outcome."""

from __future__ import annotations

import inspect
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bertrain.config import describe_yaml, shipped_files
from bertrain.console import make_console
from tests.helpers import config_help, squeezed

ROOT = Path(__file__).resolve().parents[1]


def run_bertrain(*args: str, **env: str) -> subprocess.CompletedProcess:
    """`python -m bertrain ARGS` with stdout/stderr to pipes (not a terminal) and COLUMNS unset unless given."""
    environment = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "TERMINAL_WIDTH")}
    environment.update(PYTHONPATH=str(ROOT), WANDB_MODE="disabled", **env)
    return subprocess.run([sys.executable, "-m", "bertrain", *args], capture_output=True, text=True,
                          env=environment, cwd=ROOT, timeout=300)


# ----------------------------------------------------------------------------------------------
# Issue 15.6 / 15.7: refused with exit 2, naming the key or the flag and what to do
# ----------------------------------------------------------------------------------------------


def test_pretrain_without_config_is_refused(run_cli, tmp_path):
    code, out, err = run_cli("pretrain", "--data", str(tmp_path), "--dry-run")
    assert code == 2, err
    assert "needs --config" in err and "bertrain config list" in err and "Traceback" not in err + out


def test_resume_from_a_path_that_does_not_exist_is_a_usage_error(run_cli, tmp_path):
    missing = tmp_path / "nonexistent"
    code, _, err = run_cli("pretrain", "--config", "tiny_bert", "--data", str(tmp_path), "--run-dir",
                           str(tmp_path / "run"), "--resume", str(missing))
    assert code == 2, err
    assert f"--resume {missing}: no such checkpoint or RUN_DIR" in err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("override,key", [
    ("train.max_steps=0", "train.max_steps"), ("optim.lr=-1e-3", "optim.lr"),
    ("model.hidden_dropout_prob=1.5", "model.hidden_dropout_prob")])
def test_bad_values_exit_2_naming_the_key(run_cli, tmp_path, override, key):
    code, out, err = run_cli("pretrain", "--config", "tiny_bert", "--data", str(tmp_path), "--set", override,
                             "--run-dir", str(tmp_path / "run"))
    assert code == 2, err
    assert f"Config key '{key}' must be" in err and "Traceback" not in err + out


def test_fp16_without_a_gpu_is_refused(run_cli, tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available() or torch.backends.mps.is_available():
        pytest.skip("fp16 is allowed where an accelerator exists")
    code, _, err = run_cli("pretrain", "--config", "tiny_bert", "--data", str(tmp_path), "--set",
                           "train.mixed_precision=fp16", "--run-dir", str(tmp_path / "run"))
    assert code == 2 and "'train.mixed_precision' is 'fp16', but this run is on the CPU" in err


def test_unknown_set_key_suggests_the_nearest(run_cli):
    code, _, err = run_cli("config", "show", "tiny_bert", "--set", "optim.learning_rate=1e-3")
    assert code == 2 and "Did you mean 'optim.lr'?" in err


def test_warmup_longer_than_the_run_is_a_warning_printed_once():
    result = run_bertrain("config", "show", "tiny_bert", "--set", "train.max_steps=10", "--set",
                          "optim.warmup_steps=50")
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if line.startswith("Warning: ")]
    assert len(warnings) == 1, result.stderr
    assert "optim.warmup_steps (50) is longer than the run (train.max_steps 10)" in warnings[0]


# ----------------------------------------------------------------------------------------------
# Issue 16.3: no wrapping at 80 columns when the output is not a terminal
# ----------------------------------------------------------------------------------------------


def test_a_console_off_a_terminal_never_wraps_a_line(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    out = io.StringIO()
    console = make_console(file=out)
    line = "step 120/2400 " + " ".join(f"metric_{i}=0.{i:04d}" for i in range(30))
    console.print(line)
    assert out.getvalue() == line + "\n"


def test_config_list_lines_are_whole_in_a_pipe():
    result = run_bertrain("config", "list")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    for kind in ("configs", "data_recipes"):
        for path in shipped_files(kind):
            description = describe_yaml(path)
            assert description
            assert any(line.split() and line.split()[0] == path.stem and line.endswith(description)
                       for line in lines), f"{path.stem}: {description!r} not on one line"
    assert max(len(line) for line in lines) > 120  # long enough that 80 columns would have wrapped it


def test_config_show_explain_never_cuts_a_meaning(run_cli):
    code, out, _ = run_cli("config", "show", "tiny_bert", "--explain")
    assert code == 0
    assert squeezed(config_help("train.deterministic")) in squeezed(out)
    narrow = run_bertrain("config", "show", "tiny_bert", "--explain", COLUMNS="80")
    assert narrow.returncode == 0 and "…" not in narrow.stdout  # folded into the column, not cut
    assert squeezed(config_help("train.deterministic")) in squeezed(narrow.stdout)


def test_config_show_prints_auto_precision_for_every_shipped_config(run_cli):
    for path in shipped_files("configs"):
        code, out, err = run_cli("config", "show", path.stem)
        assert code == 0, err
        assert "  mixed_precision: auto\n" in out and "  tf32: true\n" in out, path.stem


# ----------------------------------------------------------------------------------------------
# Issue 16.6: --help that reads well
# ----------------------------------------------------------------------------------------------


def _all_commands():
    import typer

    from bertrain.cli import _command_modules
    from bertrain.cli.app import app

    _command_modules()
    found = {}

    def walk(group, prefix):
        for name, command in group.commands.items():
            found[f"{prefix}{name}"] = command
            if hasattr(command, "commands"):
                walk(command, f"{prefix}{name} ")

    walk(typer.main.get_command(app), "")
    return found


def test_every_help_keeps_paragraphs_whole_and_examples_on_one_line(run_cli, monkeypatch):
    # Typer keeps a help's line breaks after its first paragraph, and renders at 80 columns in a pipe.
    commands = _all_commands()
    assert "config list" in commands
    for name, command in commands.items():
        paragraphs = inspect.cleandoc(command.help).split("\n\n")[1:]
        assert all("\n" not in paragraph for paragraph in paragraphs), f"`bertrain {name}`: a paragraph breaks"
        monkeypatch.setenv("COLUMNS", "1000")
        code, out, err = run_cli(*name.split(), "--help")
        assert code == 0, (name, err)
        assert all(paragraph in out for paragraph in paragraphs), f"`bertrain {name} --help` splits a paragraph"
        monkeypatch.delenv("COLUMNS")
        code, out, _ = run_cli(*name.split(), "--help")
        lines = [line.strip() for line in out.splitlines()]
        examples = [paragraph for paragraph in paragraphs if paragraph.startswith("Example: ")]
        assert examples and all(example in lines for example in examples), f"`bertrain {name} --help` wraps an example"


def test_help_names_the_way_to_list_shipped_configs(run_cli):
    for args in (("--help",), ("pretrain", "--help"), ("config", "show", "--help")):
        code, out, _ = run_cli(*args)
        assert code == 0 and "config list" in out, args


# ----------------------------------------------------------------------------------------------
# Issue 16.9: a preemption is the expected outcome, not an error
# ----------------------------------------------------------------------------------------------


def test_a_preempted_run_is_not_printed_as_an_error(run_cli, tmp_path, monkeypatch):
    loop = pytest.importorskip("bertrain.train.loop")
    from bertrain.errors import Interrupted

    def preempted(*args, **kwargs):
        stopped = Interrupted("Stopped by a signal after step 29; checkpoint runs/x/checkpoints/step-00000029. "
                              "Exit code 75: requeue the job (or run the same command) to resume.")
        stopped.exit_code = 75
        raise stopped

    monkeypatch.setattr(loop, "pretrain", preempted)
    code, _, err = run_cli("pretrain", "--config", "tiny_bert", "--data", str(tmp_path))
    assert code == 75
    assert "Error" not in err and "after step 29" in err and "to resume" in err


@pytest.mark.parametrize("args", [("inspect", "DATA", "--documents", "-1"),
                                  ("inspect", "DATA", "--pairs", "--batches", "0"),
                                  ("inspect-model", "tiny_albert", "--vocab-size", "0")])
def test_counts_out_of_range_are_usage_errors_naming_the_option(run_cli, args):
    """Before, --vocab-size 0 was read as "not given" (the default vocabulary) and the others were accepted."""
    code, out, err = run_cli(*args)
    assert code == 2 and args[-2] in out + err


def test_ctrl_c_in_a_command_without_its_own_stop_says_interrupted(run_cli, monkeypatch):
    """typer turns a KeyboardInterrupt into a silent exit 130; commands that say their own stop raise Interrupted."""
    from bertrain.model import summary

    def ctrl_c(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(summary, "parameter_summary", ctrl_c)
    code, out, err = run_cli("inspect-model", "tiny_bert")
    assert code == 130 and "Interrupted." in err
