"""Each encoder layer's weights copied to autocast's half type in one kernel, once a forward (run_steps,
EncoderLayer.weight_copies, ParameterCopies), against autocast casting each weight itself: the same computation,
fewer kernels; a shared ALBERT layer's applications share the copies and still sum their gradients in float32."""

from __future__ import annotations

import collections
import dataclasses

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from bertrain.model import build_model
from bertrain.model.layers import EncoderLayer
from tests.helpers import assert_rounding_close
from tests.test_model import CONFIGS, padded_batch

CASTS_PER_LAYER = 12  # 4 linears' weight and bias, 2 LayerNorms' weight and bias


class OpCount(TorchDispatchMode):
    """How many times each aten op was dispatched."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[str(func.overloadpacket).removeprefix("aten.")] += 1
        return func(*args, **(kwargs or {}))


def bf16_step(config, fused: bool, batch: dict) -> tuple[float, dict, dict]:
    """(loss, gradients by name, {"forward": ops, "backward": ops}) of one bf16 autocast step from seed 0."""
    torch.manual_seed(0)
    model = build_model(config, fused_weight_cast=fused).train()
    torch.manual_seed(1)  # the same dropout masks in both
    with OpCount() as forward_ops, torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(**batch).loss
    with OpCount() as backward_ops:
        loss.backward()
    ops = {"forward": forward_ops.counts, "backward": backward_ops.counts}
    return loss.item(), {n: p.grad for n, p in model.named_parameters()}, ops


@pytest.mark.parametrize("options", [{}, {"gradient_checkpointing": True}, {"unpad": "true"},
                                     {"float32_residual": True}], ids=["pruned", "checkpointed", "packed", "fp32-res"])
def test_bert_gets_bitwise_the_same_loss_and_gradients_from_fewer_casts(options):
    config = dataclasses.replace(CONFIGS["bert"], **options)
    batch = padded_batch()
    loss, grads, ops = bf16_step(config, False, batch)
    fused_loss, fused_grads, fused_ops = bf16_step(config, True, batch)
    assert fused_loss == loss
    for name, grad in grads.items():
        assert torch.equal(fused_grads[name], grad), name
    layers = config.num_hidden_layers
    recomputed = layers if config.gradient_checkpointing else 0  # each layer recomputed in the backward
    # float32_residual's LayerNorms compute in float32: only the linears' 8 tensors are cast, by either path
    cast = 8 if config.float32_residual else CASTS_PER_LAYER
    assert fused_ops["forward"]["_foreach_copy_"] == layers
    assert fused_ops["backward"]["_foreach_copy_"] == layers + recomputed  # recomputed casts, gradients back
    assert ops["forward"]["_foreach_copy_"] == ops["backward"]["_foreach_copy_"] == 0
    # autocast: a cast per weight in each forward (the recomputed ones in the backward) and one back per gradient
    assert ops["forward"]["_to_copy"] - fused_ops["forward"]["_to_copy"] == cast * layers
    assert ops["backward"]["_to_copy"] - fused_ops["backward"]["_to_copy"] == cast * (recomputed + layers)


def test_albert_sums_a_shared_layers_gradients_in_float32():
    """Each application's gradients go back to the float32 parameters on their own, so they meet in float32
    (AccumulateGrad), where autocast's one cached cast per forward summed them in bf16: one application is bitwise
    the same, several agree within bf16 rounding of that sum."""
    batch = padded_batch()
    single = dataclasses.replace(CONFIGS["albert"], num_hidden_layers=1)
    loss, grads, _ = bf16_step(single, False, batch)
    fused_loss, fused_grads, _ = bf16_step(single, True, batch)
    assert fused_loss == loss and all(torch.equal(fused_grads[n], g) for n, g in grads.items())

    shared = CONFIGS["albert"]
    loss, grads, _ = bf16_step(shared, False, batch)
    fused_loss, fused_grads, ops = bf16_step(shared, True, batch)
    assert fused_loss == loss  # the forward is the same computation
    # one copy a forward of the shared layer, each application's gradients cast back on their own
    assert ops["forward"]["_foreach_copy_"] == shared.num_hidden_groups * shared.inner_group_num == 1
    assert ops["backward"]["_foreach_copy_"] == shared.num_hidden_layers > 1
    assert any(not torch.equal(fused_grads[n], g) for n, g in grads.items() if ".groups." in n)
    for name, grad in grads.items():
        assert_rounding_close(fused_grads[name], grad, shared.num_hidden_layers, dtype=torch.bfloat16, name=name)


def test_without_autocast_a_layer_computes_with_its_parameters():
    layer = EncoderLayer(CONFIGS["bert"])
    weights = layer.weights()
    modules = {"qkv": layer.attention.qkv, "output": layer.attention.output, "up": layer.feed_forward.up,
               "down": layer.feed_forward.down, "attention_norm": layer.attention_norm, "output_norm": layer.output_norm}
    assert list(weights._fields) == list(modules)
    for name, module in modules.items():  # the modules' own parameters (parameter_list reads their dicts)
        assert getattr(weights, name)[0] is module.weight and getattr(weights, name)[1] is module.bias, name
    with torch.autocast("cpu", dtype=torch.bfloat16):
        cast = layer.weights()
    assert cast.qkv[0].dtype == cast.attention_norm[0].dtype == torch.bfloat16
    assert torch.equal(cast.up[0], layer.feed_forward.up.weight.to(torch.bfloat16))


@pytest.mark.parametrize("options", [{}, {"gradient_checkpointing": True}], ids=["plain", "checkpointed"])
def test_albert_applications_sharing_one_copy_equal_each_copying_its_own(options, monkeypatch):
    """run_steps copies a shared layer's weights once a forward, for its applications and their recomputations; a
    copy per application (each forward ignoring the shared copies, as every application cast its own before) is the
    same computation: bitwise the same."""
    config = dataclasses.replace(CONFIGS["albert"], **options)
    batch = padded_batch()
    shared_loss, shared_grads, shared_ops = bf16_step(config, True, batch)
    forward = EncoderLayer.forward
    monkeypatch.setattr(EncoderLayer, "forward", lambda self, x, where, rows=None, copies=None: forward(
        self, x, where, rows))
    loss, grads, ops = bf16_step(config, True, batch)
    assert shared_loss == loss and all(torch.equal(shared_grads[n], g) for n, g in grads.items())
    applications = config.num_hidden_layers
    recomputed = applications if config.gradient_checkpointing else 0
    # each application's own copy: in the forward and again in each recomputation (run_steps' copy unused)
    assert ops["forward"]["_foreach_copy_"] == applications + 1 and shared_ops["forward"]["_foreach_copy_"] == 1
    assert ops["backward"]["_foreach_copy_"] == applications + recomputed
    assert shared_ops["backward"]["_foreach_copy_"] == applications
