"""Shared fixtures. Nothing here needs the network: corpora are generated or come from CPython."""

from __future__ import annotations

import os

os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest


@pytest.fixture(scope="session")
def pydoc_text() -> str:
    """English prose shipped with every CPython (Python's own reference topics)."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[key] for key in sorted(topics))


@pytest.fixture
def run_cli(monkeypatch):
    """Run the CLI in-process: returns (exit_code, stdout, stderr)."""
    from typer.testing import CliRunner  # noqa: F401  (keeps typer's test helpers importable)

    def run(*args: str) -> tuple[int, str, str]:
        import contextlib
        import io

        from bertrain.cli import main
        from bertrain.cli.app import console, err_console

        out, err = io.StringIO(), io.StringIO()
        old_out, old_err = console.file, err_console.file
        console.file, err_console.file = out, err
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                code = main(list(args))
        finally:
            console.file, err_console.file = old_out, old_err
        return code, out.getvalue(), err.getvalue()

    return run
