"""`train.compile` compiles each encoder layer (layers.compile_layers): batches whose counts, lengths and packing
change at every step reach a fixed set of graphs within two steps and the losses and gradients stay the eager
model's. torch.compile's "eager" backend (the graph capture and its guards, no code generation) keeps this fast."""

from __future__ import annotations

import copy
import dataclasses
import importlib.util
import random
import types

import pytest
import torch
from rich.console import Console
from torch._dynamo.utils import counters

from bertrain.config import TrainConfig
from bertrain.model import build_model, compile_layers, layers
from bertrain.train import setup
from bertrain.train.setup import choose_compile
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


def compiled_twin(kind: str, attention: str, monkeypatch, backend: str = "eager", **changes):
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
    assert compile_layers(compiled, backend=backend) == layer_modules  # ALBERT's shared layers once each
    return model, compiled


@pytest.mark.parametrize("kind", ["bert", "albert"])
@pytest.mark.parametrize("attention", ["padded", "packed: buckets", "packed: variable-length kernel"])
def test_compiled_layers_reach_fixed_graphs_and_the_eager_results(kind, attention, monkeypatch):
    graphs = steps_until_stable(*compiled_twin(kind, attention, monkeypatch))
    assert graphs[0] > 0  # the layers did go through torch.compile
    assert graphs[2] == graphs[-1], f"new graphs after step 2: {graphs}"


@pytest.mark.parametrize("kind", ["bert", "albert"])
def test_compiled_layers_take_autocasts_weight_copies_whole(kind, monkeypatch):
    """Under bf16 autocast a shared ALBERT layer takes run_steps' half-precision copies of its weights as inputs, a
    BERT layer makes its own, and ParameterCopies hands them to the ops as views: AOTAutograd ("aot_eager": its
    forward and backward graphs, run by torch's kernels) captures both with no graph break and gives the eager
    model's loss and gradients."""
    model, compiled = compiled_twin(kind, "padded", monkeypatch, backend="aot_eager")
    batch = make_batch([5, WIDTH, 3, 9, 1, 12, WIDTH - 1, 7], seed=3)
    losses = []
    for m in (model, compiled):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = m(**batch, mlm_normalizer=1.0, sentence_normalizer=8.0).loss
        loss.backward()
        losses.append(loss.detach())
    assert counters["stats"]["unique_graphs"] > 0 and not counters["graph_break"], dict(counters["graph_break"])
    assert_rounding_close(losses[1], losses[0], WIDTH * 8, dtype=torch.bfloat16, name="loss")
    for (name, a), b in zip(model.named_parameters(), compiled.parameters()):
        assert_rounding_close(b.grad, a.grad, WIDTH * 8, dtype=torch.bfloat16, name=f"gradient of {name}")


@pytest.mark.parametrize("attention", ["padded", "packed: variable-length kernel"])
def test_compiled_layers_under_gradient_checkpointing(attention, monkeypatch):
    graphs = steps_until_stable(*compiled_twin("bert", attention, monkeypatch, gradient_checkpointing=True), steps=6)
    assert graphs[0] > 0 and graphs[2] == graphs[-1], graphs


def test_split_heads_backward_compiles_with_inductor_on_sdpa_math_path():
    """SDPA's math path (a CPU's with attention dropout) hands split_heads strided gradients; under inductor its
    `stack(out=)` kept their strides and the backward's flatten failed (the pruned last layer's one part). Now the
    compiled backward gives the eager gradients, for one, two and three parts."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    torch.manual_seed(0)
    B, T, K, heads, H = 4, 7, 3, 4, 64
    x, weight = torch.randn(B, T, H, requires_grad=True), torch.randn(3 * H, H, requires_grad=True)
    rows = torch.randint(0, T, (B, K))

    def attention(x, weight, rows):
        with sdpa_kernel(SDPBackend.MATH):
            q, k, v = layers.split_heads(torch.nn.functional.linear(x, weight), 3, heads)  # every row
            whole = torch.nn.functional.scaled_dot_product_attention(q, k, v)
            q, = layers.split_heads(torch.nn.functional.linear(x.gather(1, rows[..., None].expand(-1, -1, H)),
                                                               weight[:H]), 1, heads)  # the pruned layer's rows
            k, v = layers.split_heads(torch.nn.functional.linear(x, weight[H:]), 2, heads)
            pruned = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        return whole.square().sum() + pruned.square().sum()

    torch._dynamo.reset()
    gradients = []
    for function in (attention, torch.compile(attention, backend="inductor")):
        gradients.append(torch.autograd.grad(function(x, weight, rows), (x, weight)))
    for name, eager, compiled in zip(("x", "weight"), *gradients):
        assert_rounding_close(compiled, eager, H, name=f"gradient of {name}")


def test_compile_layers_gives_inductor_its_options_and_other_backends_none(monkeypatch):
    """Inductor (the default backend) gets INDUCTOR_OPTIONS under the caller's own; another backend gets no options
    (the eager backend would warn that it ignores them)."""
    calls = []
    monkeypatch.setattr(torch, "compile", lambda function, **kwargs: calls.append(kwargs) or function)
    for options in ({}, {"options": {"cpp_wrapper": True, "size_asserts": True}}, {"backend": "eager"}):
        compile_layers(build_model(CONFIGS["bert"]), **options)
    layer_count = CONFIGS["bert"].num_hidden_layers
    assert calls == [{"options": {"size_asserts": False}}] * layer_count + [
        {"options": {"cpp_wrapper": True, "size_asserts": True}}] * layer_count + [{"backend": "eager"}] * layer_count


def test_inductor_layers_check_no_input_sizes_at_each_call():
    """The code inductor makes for a compiled layer's forward and backward checks no input's sizes and strides at each
    call (host time in a host-bound compiled loop), and the gradients stay the eager model's."""
    from torch._inductor.utils import run_and_get_code

    config = dataclasses.replace(CONFIGS["bert"], num_hidden_layers=1, unpad="false")
    torch.manual_seed(0)
    model = build_model(config).train()
    compiled = copy.deepcopy(model)
    torch._dynamo.reset()
    compile_layers(compiled)
    batch = make_batch([WIDTH, WIDTH // 2, 3], seed=1)
    normalizers = dict(mlm_normalizer=float(max(int((batch["labels"] != -100).sum()), 1)), sentence_normalizer=3.0)
    model(**batch, **normalizers).loss.backward()
    _, code = run_and_get_code(lambda: compiled(**batch, **normalizers).loss.backward())
    assert len(code) >= 2 and all("def call(" in wrapper for wrapper in code), len(code)  # forward and backward
    assert not any("assert_size_stride(" in wrapper for wrapper in code)
    for (name, a), b in zip(model.named_parameters(), compiled.parameters()):
        assert_rounding_close(b.grad, a.grad, WIDTH * 3, name=f"gradient of {name}")


CUDA = torch.device("cuda", 0)


@pytest.mark.parametrize("setting, device, steps, deterministic, triton, capability, compiled, why", [
    ("auto", CUDA, 5000, False, True, (9, 0), True, "auto: 5,000 steps on a CUDA GPU"),
    ("auto", CUDA, 4999, False, True, (9, 0), False, "off for 4,999 steps (compiles 5,000 or more)"),
    ("auto", torch.device("cpu"), 10**6, False, True, (9, 0), False, "off on cpu"),
    ("auto", CUDA, 10**6, True, True, (9, 0), False, "off with train.deterministic"),
    ("auto", CUDA, 10**6, False, False, (9, 0), False, "needs Triton"),
    ("auto", CUDA, 10**6, False, True, (6, 0), False, "compute capability 7.0+"),
    (True, torch.device("cpu"), 1, True, False, (6, 0), True, "train.compile is true"),
    (False, CUDA, 10**6, False, True, (9, 0), False, "train.compile is false")])
def test_train_compile_auto_compiles_long_gpu_runs_only(setting, device, steps, deterministic, triton, capability,
                                                        compiled, why, monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "triton" and not triton
                        else find_spec(name, *a))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    train = TrainConfig(compile=setting, deterministic=deterministic)
    chosen, reason = choose_compile(train, device, steps)
    assert chosen is compiled and why in reason


@pytest.mark.parametrize("setting, compiled", [("auto", False), ("true", True), ("false", False)])
def test_pretrain_compiles_the_layers_as_train_compile_says(setting, compiled, run_cli, tiny_data, tmp_path,
                                                            monkeypatch, fresh_accelerate):
    """The loop's wiring on the CPU: `auto` stays eager here, `true` compiles (recorded, not run) and says so."""
    calls = []
    monkeypatch.setattr(setup, "compile_layers", lambda model: calls.append(model))
    monkeypatch.setattr(torch._dynamo.config, "suppress_errors", False)
    code, out, err = run_cli("pretrain", "--config", "tiny_bert", "--data", str(tiny_data), "--run-dir",
                             str(tmp_path / "run"), "--set", "train.max_steps=1", "--set", f"train.compile={setting}")
    assert code == 0, out + err
    assert len(calls) == int(compiled)
    assert ("torch.compile: the encoder layers are compiled (train.compile is true)" in out) is compiled
    assert torch._dynamo.config.suppress_errors is False  # only `auto` falls back to eager, and only on a GPU


def test_train_compile_takes_true_false_or_auto_and_names_the_key_otherwise(run_cli, tiny_data, tmp_path):
    code, _, err = run_cli("pretrain", "--config", "tiny_bert", "--data", str(tiny_data), "--run-dir",
                           str(tmp_path / "run"), "--set", "train.compile=sometimes")
    assert code == 2 and "train.compile" in err and "auto" in err, err


def test_auto_on_a_gpu_compiles_with_the_eager_fallback_and_says_why(monkeypatch):
    """`auto` compiles a long GPU run with dynamo's suppress_errors on (a failing frame runs eager, warned)."""
    calls = []
    monkeypatch.setattr(setup, "compile_layers", lambda model: calls.append(model))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object())  # Triton, as on a GPU machine
    monkeypatch.setattr(torch._dynamo.config, "suppress_errors", False)
    console = Console(record=True, width=200)
    accelerator = types.SimpleNamespace(device=CUDA, is_main_process=True)
    assert setup.compile_if_chosen("model", TrainConfig(), accelerator, 125_000, console)
    assert calls == ["model"] and torch._dynamo.config.suppress_errors is True
    assert "compiled (train.compile auto: 125,000 steps on a CUDA GPU)" in console.export_text()


@pytest.mark.parametrize("attention", ["padded", "packed: buckets"])
def test_evaluation_between_steps_adds_a_fixed_set_of_graphs(attention, monkeypatch):
    """train.eval_every's no-grad eval-mode forwards between training steps: their graphs are made once, so a long
    run never reaches dynamo's recompile limit (past it, dynamo runs the layers eager)."""
    compiled = compiled_twin("bert", attention, monkeypatch)[1]
    monkeypatch.setattr(torch._dynamo.config, "fail_on_recompile_limit_hit", True)  # an error, not eager
    generator, graphs = random.Random(0), []
    for step in range(9):
        batch = make_batch([generator.randint(1, WIDTH) for _ in range(8)], seed=step)
        compiled.train()
        compiled(**batch, mlm_normalizer=1.0, sentence_normalizer=8.0).loss.backward()
        compiled.eval()
        with torch.no_grad():
            compiled(**make_batch([generator.randint(1, WIDTH) for _ in range(5)], seed=100 + step),
                     mlm_normalizer=1.0, sentence_normalizer=5.0)
        graphs.append(counters["stats"]["unique_graphs"])
    assert graphs[2] == graphs[-1], graphs
