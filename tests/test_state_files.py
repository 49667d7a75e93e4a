"""Pickle-free state files: optimizer, schedule, scaler and RNG states survive a round trip bit for bit."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from bertrain.config import OptimConfig
from bertrain.train.optim import build_optimizer, build_scheduler
from bertrain.train.state_files import has_state, load_state, save_state


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 4))


def _train(model, optimizer, scheduler, steps: int, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(5, 8, generator=generator)
        model(x).pow(2).mean().backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)


@pytest.mark.parametrize("name", ["adamw", "lamb"])
def test_optimizer_and_schedule_resume_bitwise(tmp_path, name):
    config = OptimConfig(name=name, lr=1e-2, weight_decay=0.01, warmup_steps=2)
    model = _model()
    optimizer = build_optimizer(model, config)
    scheduler = build_scheduler(optimizer, config, total_steps=10)
    _train(model, optimizer, scheduler, 3, seed=1)
    save_state(tmp_path, "optimizer", optimizer.state_dict())
    save_state(tmp_path, "scheduler", scheduler.state_dict())
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    _train(model, optimizer, scheduler, 4, seed=2)
    uninterrupted = {k: v.clone() for k, v in model.state_dict().items()}

    resumed = _model()
    resumed.load_state_dict(weights)
    optimizer2 = build_optimizer(resumed, config)
    scheduler2 = build_scheduler(optimizer2, config, total_steps=10)
    optimizer2.load_state_dict(load_state(tmp_path, "optimizer"))
    scheduler2.load_state_dict(load_state(tmp_path, "scheduler"))
    _train(resumed, optimizer2, scheduler2, 4, seed=2)
    for key, value in resumed.state_dict().items():
        assert torch.equal(value, uninterrupted[key]), key
    assert scheduler2.get_last_lr() == scheduler.get_last_lr()
    # Hyperparameters keep their Python types (betas stays a tuple).
    assert isinstance(optimizer2.param_groups[0]["betas"], tuple)


def test_rng_and_scaler_round_trip(tmp_path):
    random.seed(3), np.random.seed(3), torch.manual_seed(3)
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
             "scaler": torch.amp.GradScaler("cpu", init_scale=1024.0).state_dict()}
    save_state(tmp_path, "rng", state)
    expected = (random.random(), np.random.rand(), torch.rand(1))
    loaded = load_state(tmp_path, "rng")
    random.setstate(loaded["python"])
    np.random.set_state(loaded["numpy"])
    torch.set_rng_state(loaded["torch"])
    assert (random.random(), np.random.rand()) == expected[:2]
    assert torch.equal(torch.rand(1), expected[2])
    assert loaded["scaler"] == state["scaler"]


def test_files_are_plain_json_and_safetensors(tmp_path):
    save_state(tmp_path, "thing", {"a": (1, 2.5), 3: torch.arange(4), "none": None})
    assert has_state(tmp_path, "thing")
    assert not any(path.suffix in (".pt", ".pkl") for path in tmp_path.iterdir())
    json.loads((tmp_path / "thing.json").read_text())  # plain JSON, no pickle opcodes anywhere
    loaded = load_state(tmp_path, "thing")
    assert loaded["a"] == (1, 2.5) and loaded["none"] is None and torch.equal(loaded[3], torch.arange(4))


def test_unknown_types_are_refused_not_dropped(tmp_path):
    with pytest.raises(TypeError, match="object at thing.x"):
        save_state(tmp_path, "thing", {"x": object()})
