"""Shared fixtures. Nothing here needs the network: corpora are generated or come from CPython."""

from __future__ import annotations

import os

os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from pathlib import Path

import pytest

from tests.helpers import make_prepared_dir


def pytest_configure(config):
    config.addinivalue_line("markers", "cross_path: an in-process comparison of two different computations of one "
                            "result; tests/test_resume.py runs these again under the portable kernels")


def pytest_collection_modifyitems(items):
    """The demo's end-to-end run first: it is half of one worker's time in CI's pass of the slow tests (`-m slow`,
    pytest-xdist's `-n 2 --dist worksteal`), which the other worker spends on the rest, taking over the first one's
    queue. Other slow tests keep their places: two compute-bound tests at once slow each other down more. A marker,
    not a name, so that renaming the test keeps its place."""
    items.sort(key=lambda item: item.get_closest_marker("run_first") is None)


@pytest.fixture(autouse=True)
def seeded_random_state():
    """Every test starts from the same global random state (torch, numpy, random), so its result does not depend on
    which tests ran before it in the same worker. BERTRAIN_TEST_SEED picks another state, to look for a tolerance
    that holds for one draw of random weights only."""
    import random

    import numpy as np
    import torch

    seed = int(os.environ.get("BERTRAIN_TEST_SEED", "0"))
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


@pytest.fixture(scope="session")
def pydoc_text() -> str:
    """English prose shipped with every CPython (Python's own reference topics)."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[key] for key in sorted(topics))


@pytest.fixture
def run_cli(monkeypatch):
    """Run the CLI in-process: returns (exit_code, stdout, stderr)."""

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


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory) -> Path:
    """A small prepared WordPiece DATA_DIR, built once per test module."""
    return make_prepared_dir(tmp_path_factory.mktemp("data") / "wordpiece", kind="wordpiece", num_documents=120)


@pytest.fixture
def fresh_accelerate():
    """In-process runs share Accelerate's singleton state: reset it around each test."""
    import torch
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(True)
    yield
    AcceleratorState._reset_state(True)
    torch.use_deterministic_algorithms(False)  # train.deterministic sets it process-wide
