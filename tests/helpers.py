"""Helpers for tests that run `bertrain pretrain` end to end (test_pretrain, test_resume, test_slurm).

    from tests.helpers import TINY, run_pretrain, write_config
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import torch
import yaml
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parent.parent

TINY = {
    "data": {"objective": "nsp", "max_seq_length": 64, "eval_batches": 2},
    "model": {"type": "bert", "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
              "intermediate_size": 64, "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.0,
              "max_position_embeddings": 64},
    "optim": {"lr": 1.0e-3, "warmup_steps": 2},
    "train": {"batch_size": 8, "max_steps": 6, "save_every": 3, "eval_every": 3, "log_every": 1,
              "deterministic": True, "keep_last": 5},
}


def write_config(path: Path, base: dict = TINY, **sections: dict) -> Path:
    """A config YAML: `base` with per-section updates (e.g. train={"max_steps": 4})."""
    tree = {k: dict(v) for k, v in base.items()}
    for section, values in sections.items():
        tree.setdefault(section, {}).update(values)
    path.write_text(yaml.safe_dump(tree))
    return path


def pretrain_env(**extra: str) -> dict:
    """The environment of a pretrain subprocess: offline, one thread, no test hooks unless given."""
    env = dict(os.environ, WANDB_MODE="disabled", OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT),
               TOKENIZERS_PARALLELISM="false", COLUMNS="250")
    for key in [k for k in env if k.startswith("BERTRAIN_TEST_")]:
        del env[key]
    env.update(extra)
    return env


def run_pretrain(config: Path, data: Path, run_dir: Path, *args: str, nproc: int = 1, env: dict | None = None,
                 timeout: float = 300) -> subprocess.CompletedProcess:
    """`python -m bertrain pretrain ...` (or torchrun with `nproc` processes) in a subprocess."""
    command = ["pretrain", "--config", str(config), "--data", str(data), "--run-dir", str(run_dir), *args]
    if nproc == 1:
        launcher = [sys.executable, "-m", "bertrain"]
    else:
        port = str(29500 + (os.getpid() % 400) + hash(str(run_dir)) % 90)
        launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
                    "--master_port", port, "-m", "bertrain"]
    return subprocess.run(launcher + command, env=env or pretrain_env(), capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


def train_losses(run_dir: Path) -> dict[int, float]:
    """step → loss of the train records in RUN_DIR/metrics.jsonl."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in records if r["kind"] == "train"}


def final_weights(run_dir: Path, step: int) -> dict:
    """The model weights of RUN_DIR's checkpoint at `step`."""
    return load_file(str(run_dir / "checkpoints" / f"step-{step:08d}" / "model.safetensors"))


def assert_same_weights(a: dict, b: dict) -> None:
    """Bitwise equality of two state dicts."""
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def explain(result: subprocess.CompletedProcess) -> str:
    """Exit code and the tails of stdout/stderr, for assertion messages."""
    return f"exit {result.returncode}\nstdout:\n{result.stdout[-3000:]}\nstderr:\n{result.stderr[-3000:]}"


class OneProcess:
    """What train_step uses of an Accelerator, for one CPU process (tests/test_sync_free.py,
    benchmarks/loop_overhead.py): Accelerate adds nothing per step there."""

    num_processes, device, scaler = 1, torch.device("cpu"), None

    def no_sync(self, model):
        return contextlib.nullcontext()

    def backward(self, loss):
        loss.backward()

    def clip_grad_norm_(self, parameters, max_norm):
        return torch.nn.utils.clip_grad_norm_(parameters, max_norm)
