"""FusedAdamW (train/adamw.py) against torch's AdamW(fused=True): the same kernel with the same arguments, so
bitwise the same weights, moments and step counts, and state_dicts either loads."""

from __future__ import annotations

import copy

import pytest
import torch

from bertrain.config import OptimConfig
from bertrain.train.adamw import FusedAdamW
from bertrain.train.optim import build_optimizer, optimizer_groups
from tests.test_optim import tiny_model


def pair(**settings) -> tuple:
    """(model, FusedAdamW) and (model, torch's AdamW(fused=True)) from the same weights and groups."""
    torch.manual_seed(0)
    ours_model = tiny_model("bert")
    torch_model = copy.deepcopy(ours_model)
    settings = dict(dict(lr=1e-2, betas=(0.9, 0.98), eps=1e-6), **settings)
    return ((ours_model, FusedAdamW(optimizer_groups(ours_model, 0.1), **settings)),
            (torch_model, torch.optim.AdamW(optimizer_groups(torch_model, 0.1), fused=True, **settings)))


def step(model, optimizer, seed: int, skip: str | None = None) -> None:
    """A forward and backward on a seeded batch (`skip`: a parameter left without a gradient), then the step."""
    ids = torch.randint(5, 120, (4, 16), generator=torch.Generator().manual_seed(seed))
    out = model(ids, torch.ones_like(ids), torch.zeros_like(ids))
    out.mlm_logits.float().pow(2).mean().backward()
    for name, param in model.named_parameters():
        if name == skip:
            param.grad = None
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def assert_same(ours: tuple, theirs: tuple) -> None:
    for (name, a), b in zip(ours[0].named_parameters(), theirs[0].parameters()):
        assert torch.equal(a, b), name
    for a, b in zip(ours[1].state_dict()["state"].values(), theirs[1].state_dict()["state"].values()):
        assert all(torch.equal(a[key], b[key]) for key in ("step", "exp_avg", "exp_avg_sq"))


def test_steps_bitwise_as_torchs_fused_adamw_with_an_lr_that_changes_and_a_parameter_without_gradient():
    ours, theirs = pair()
    for seed in range(4):
        for model, optimizer in (ours, theirs):
            for group in optimizer.param_groups:
                group["lr"] = 1e-2 * (seed + 1)  # a schedule sets it between steps
            step(model, optimizer, seed, skip="encoder.layers.0.attention.qkv.weight" if seed == 2 else None)
    assert_same(ours, theirs)
    assert len(ours[1]._plans) == 3  # each group's full list and the decay group's without the skipped weight


def test_grad_scale_divides_and_found_inf_skips_the_step_uncounted_as_torchs():
    ours, theirs = pair()
    for model, optimizer in (ours, theirs):
        step(model, optimizer, 0)
        optimizer.grad_scale = torch.tensor(3.0)
        step(model, optimizer, 1)
        optimizer.found_inf = torch.tensor(1.0)
        before = copy.deepcopy(model.state_dict())
        step(model, optimizer, 2)
        assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
        del optimizer.grad_scale, optimizer.found_inf
    assert_same(ours, theirs)
    assert all(torch.equal(s["step"], torch.tensor(2.0)) for s in ours[1].state_dict()["state"].values())


def test_state_dicts_load_both_ways_and_a_loaded_state_ends_the_plans():
    ours, theirs = pair()
    for model, optimizer in (ours, theirs):
        step(model, optimizer, 0)
    step(*ours, 1)  # ours on ahead with its plan; then both continue from torch's state
    ours[0].load_state_dict(theirs[0].state_dict())
    ours[1].load_state_dict(copy.deepcopy(theirs[1].state_dict()))
    assert not ours[1]._plans
    for seed in (5, 6):
        for model, optimizer in (ours, theirs):
            step(model, optimizer, seed)
    assert_same(ours, theirs)
    fresh = torch.optim.AdamW(optimizer_groups(theirs[0], 0.1), fused=True, lr=1e-2)
    fresh.load_state_dict(copy.deepcopy(ours[1].state_dict()))
    assert fresh.state_dict()["state"].keys() == ours[1].state_dict()["state"].keys()


def test_a_swapped_storage_is_stepped_as_torchs():
    ours, theirs = pair()
    for seed in range(2):
        for model, optimizer in (ours, theirs):
            step(model, optimizer, seed)
            if seed == 0:  # e.g. model.to(): the parameter object stays, its storage moves
                weight = dict(model.named_parameters())["encoder.layers.1.feed_forward.up.weight"]
                weight.data = weight.data.clone()
    assert_same(ours, theirs)


@pytest.mark.parametrize("setting", [dict(amsgrad=True), dict(maximize=True), dict(decoupled=False)])
def test_settings_the_plan_does_not_take_step_through_torchs(setting):
    """amsgrad, maximize, and a group switched to Adam's coupled weight decay (torch's AdamW takes no such argument;
    its groups carry the flag)."""
    decoupled = setting.pop("decoupled", True)
    ours, theirs = pair(**setting)
    for group in ours[1].param_groups + theirs[1].param_groups:
        group["decoupled_weight_decay"] = decoupled
    for seed in range(3):
        for model, optimizer in (ours, theirs):
            step(model, optimizer, seed)
    assert not ours[1]._plans
    assert_same(ours, theirs)


def test_build_optimizer_gives_fused_adamw_where_the_device_has_the_kernel():
    optimizer = build_optimizer(tiny_model("bert"), OptimConfig(lr=1e-3))
    assert type(optimizer) is FusedAdamW and optimizer.defaults["fused"] is True
