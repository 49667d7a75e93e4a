"""`train.compile` compiles each encoder layer (layers.compile_layers): batches whose counts, lengths and packing
change at every step reach a fixed set of graphs within two steps and the losses and gradients stay the eager
model's. torch.compile's "eager" backend (the graph capture and its guards, no code generation) keeps this fast."""

from __future__ import annotations

import copy
import dataclasses
import random

import pytest
import torch
from torch._dynamo.utils import counters

from bertrain.model import build_model, compile_layers, layers
from tests.helpers import assert_rounding_close
from tests.test_unpad import CONFIGS, WIDTH, make_batch, per_sequence_attention


@torch.library.custom_op("bertrain_test::varlen_flash", mutates_args=())
def varlen_flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, starts: torch.Tensor, longest: int
                 ) -> torch.Tensor:
    """An opaque op in the place of aten._flash_attention_forward (which only runs on a GPU): per-sequence SDPA."""
    return per_sequence_attention(q, k, v, starts)


@varlen_flash.register_fake
def _(q, k, v, starts, longest):
    return torch.empty_like(q)


def _save(ctx, inputs, output):
    ctx.save_for_backward(*inputs[:4])


def _backward(ctx, grad):
    q, k, v, starts = ctx.saved_tensors
    _, vjp = torch.func.vjp(lambda q, k, v: per_sequence_attention(q, k, v, starts), q, k, v)
    return (*vjp(grad), None, None)


varlen_flash.register_autograd(_backward, setup_context=_save)


def varlen_stand_in(qkv, packing, num_heads, dropout_p):
    """layers.varlen_attention with the opaque stand-in: the GPU path's inputs as torch.compile sees them."""
    N, H = qkv.shape[0], qkv.shape[1] // 3
    q, k, v = qkv.view(N, 3, num_heads, H // num_heads).unbind(1)
    return varlen_flash(q, k, v, packing.sequence_starts, packing.longest).reshape(N, H)


def steps_until_stable(model, compiled, steps: int = 10) -> list[int]:
    """Train-mode forward and backward of both models on `steps` batches of 8 rows with random lengths (packed or
    padded as model.unpad says); the same losses and gradients each time. Returns the graph count after each step."""
    generator = random.Random(0)
    graphs = []
    for step in range(steps):
        batch = make_batch([generator.randint(1, WIDTH) for _ in range(8)], seed=step)
        normalizers = dict(mlm_normalizer=float(max(int((batch["labels"] != -100).sum()), 1)), sentence_normalizer=8.0)
        for m in (model, compiled):
            m.zero_grad(set_to_none=True)
            m(**batch, **normalizers).loss.backward()
        losses = [m(**batch, **normalizers).loss.detach() for m in (model, compiled)]
        assert_rounding_close(losses[1], losses[0], WIDTH * 8, name=f"loss at step {step}")
        for (name, a), b in zip(model.named_parameters(), compiled.parameters()):
            assert_rounding_close(b.grad, a.grad, WIDTH * 8, name=f"gradient of {name} at step {step}")
        graphs.append(counters["stats"]["unique_graphs"])
    return graphs


def compiled_twin(kind: str, attention: str, monkeypatch, **changes):
    """(model, a copy with compile_layers applied) for the attention path; `changes`: to the model config."""
    if attention == "packed: variable-length kernel":
        monkeypatch.setattr(layers, "varlen_flash_available", lambda qkv, num_heads: True)
        monkeypatch.setattr(layers, "varlen_attention", varlen_stand_in)
    config = dataclasses.replace(CONFIGS[kind], unpad="false" if attention == "padded" else "true", **changes)
    torch.manual_seed(0)
    model = build_model(config).train()
    compiled = copy.deepcopy(model)
    torch._dynamo.reset()
    counters.clear()
    layer_modules = config.num_hidden_layers if kind == "bert" else config.num_hidden_groups * config.inner_group_num
    assert compile_layers(compiled, backend="eager") == layer_modules  # ALBERT's shared layers once each
    return model, compiled


@pytest.mark.parametrize("kind", ["bert", "albert"])
@pytest.mark.parametrize("attention", ["padded", "packed: buckets", "packed: variable-length kernel"])
def test_compiled_layers_reach_fixed_graphs_and_the_eager_results(kind, attention, monkeypatch):
    graphs = steps_until_stable(*compiled_twin(kind, attention, monkeypatch))
    assert graphs[0] > 0  # the layers did go through torch.compile
    assert graphs[2] == graphs[-1], f"new graphs after step 2: {graphs}"


@pytest.mark.parametrize("attention", ["padded", "packed: variable-length kernel"])
def test_compiled_layers_under_gradient_checkpointing(attention, monkeypatch):
    graphs = steps_until_stable(*compiled_twin("bert", attention, monkeypatch, gradient_checkpointing=True), steps=6)
    assert graphs[0] > 0 and graphs[2] == graphs[-1], graphs
