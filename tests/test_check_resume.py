"""`bertrain pretrain --check-resume`: a user's own proof that stopping and resuming changes nothing."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import pytest
import torch
from rich.console import Console
from safetensors.torch import save_file

from bertrain import rundir
from bertrain.train.check_resume import _compare
from tests.helpers import TINY, explain, pretrain_env, write_config


def test_check_resume_passes_on_a_tiny_config(tmp_path, tiny_data):
    config = write_config(tmp_path / "tiny.yaml", TINY)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    result = subprocess.run([sys.executable, "-m", "bertrain", "pretrain", "--config", str(config), "--data",
                             str(tiny_data), "--check-resume"], env=pretrain_env(), cwd=cwd,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, explain(result)
    assert "PASS: resuming at step 3 gave bitwise the same losses and weights" in result.stdout
    assert "training loss, reference vs resumed" in result.stdout and "final weights" in result.stdout
    assert " NO" not in result.stdout
    assert not any(cwd.iterdir()), "the check writes only in its scratch directory (removed after a pass)"


def _fake_run(run, losses: list[float], weight: torch.Tensor) -> None:
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text("".join(json.dumps({"kind": "train", "step": i + 1, "loss": loss}) + "\n"
                                               for i, loss in enumerate(losses)))
    checkpoint = rundir.checkpoints_dir(run) / rundir.checkpoint_name(len(losses))
    checkpoint.mkdir(parents=True)
    save_file({"w": weight}, str(checkpoint / "model.safetensors"))


def test_the_comparison_sees_one_ulp_in_a_loss_or_a_weight(tmp_path):
    losses = [9.0, 8.5, 8.0, 7.5, 7.25, 7.0]
    weight = torch.arange(4.0)
    _fake_run(tmp_path / "reference", losses, weight)
    _fake_run(tmp_path / "same", losses, weight.clone())
    _fake_run(tmp_path / "loss", losses[:4] + [float(torch.nextafter(torch.tensor(7.25), torch.tensor(8.0)))]
              + losses[5:], weight.clone())
    _fake_run(tmp_path / "weight", losses, torch.nextafter(weight, weight + 1))
    console = Console(file=io.StringIO(), width=120)
    assert _compare(tmp_path / "reference", tmp_path / "same", 3, console)
    assert not _compare(tmp_path / "reference", tmp_path / "loss", 3, console)
    assert not _compare(tmp_path / "reference", tmp_path / "weight", 3, console)


@pytest.mark.slow  # 45-70 s on 2 cores: three processes, each compiling the layers with inductor
def test_a_compiled_run_resumes_bitwise(tmp_path, tiny_data):
    """train.compile=true, as `auto` sets it for long GPU runs: a compiled ALBERT layer applied twice, with dropout
    and LAMB, resumes bit for bit; inductor's code in the runs' own cache shows that the layers were compiled."""
    config = write_config(tmp_path / "albert.yaml", TINY, model={"type": "albert", "embedding_size": 16,
                                                                 "num_hidden_layers": 2},
                          optim={"name": "lamb"}, train={"compile": True})
    cache = tmp_path / "inductor-cache"
    result = subprocess.run([sys.executable, "-m", "bertrain", "pretrain", "--config", str(config), "--data",
                             str(tiny_data), "--check-resume"], env=pretrain_env(TORCHINDUCTOR_CACHE_DIR=str(cache)),
                            cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, explain(result)
    assert "PASS: resuming at step 3 gave bitwise the same losses and weights" in result.stdout
    assert list(cache.rglob("*.py")), "no code generated: the layers ran eager"
