"""The Triton LayerNorm (layer_norm_triton.py) against F.layer_norm in float64, run by Triton's interpreter on the
CPU, and compiled for the GPUs it serves."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from bertrain.errors import UsageError
from bertrain.model import build_model, layer_norm_triton
from tests.helpers import assert_rounding_close, run_interpreted_tests
from tests.test_model import CONFIGS, padded_batch

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
interpreted_only = pytest.mark.skipif(not INTERPRETED, reason="run by test_kernels_in_the_interpreter")


def test_kernels_in_the_interpreter():
    """The tests below, in a process where Triton's interpreter runs the kernels on the CPU (it must be chosen
    before Triton is imported). Not run again under the portable ATen kernels (not cross_path): the interpreter
    computes the kernels in NumPy, whatever ATen's CPU kernels are."""
    pytest.importorskip("triton", reason="Triton is not installed (.ci/run installs it)")
    run_interpreted_tests(__file__, passed=27)


def forward_backward(norm, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, dy: torch.Tensor) -> list:
    """[y, dx, dweight, dbias] of norm(x, weight, bias) with upstream gradient dy, in float64."""
    x, weight, bias = (t.detach().clone().requires_grad_() for t in (x, weight, bias))
    y = norm(x, weight, bias)
    y.backward(dy)
    return [t.double() for t in (y.detach(), x.grad, weight.grad, bias.grad)]


@interpreted_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows, width", [(37, 100), (5, 64), (1, 7)])
def test_interpreted_kernels_equal_float64_layer_norm(dtype, rows, width):
    """Rows that do not divide among the backward's programs, widths that are not a power of two. float32 agrees
    within float32 rounding; a half type within one unit in its last place (the interpreter's conversion to it
    truncates, where a GPU rounds to nearest); the parameters' gradients within float32 rounding in every case."""
    g = torch.Generator().manual_seed(rows * width)
    x = (torch.randn(rows, width, generator=g) * 3 + 1).to(dtype)
    weight, bias = torch.randn(width, generator=g), torch.randn(width, generator=g)
    dy = torch.randn(rows, width, generator=g).to(dtype)
    got = forward_backward(lambda *a: layer_norm_triton.TritonLayerNorm.apply(*a, 1e-5), x, weight, bias, dy)
    expected = forward_backward(lambda x, w, b: F.layer_norm(x, (width,), w, b, 1e-5), x.double(), weight.double(),
                                bias.double(), dy.double())
    assert got[0].shape == expected[0].shape and got[1].shape == expected[1].shape
    for name, actual, wanted in zip(("y", "dx"), got[:2], expected[:2]):
        if dtype == torch.float32:
            assert_rounding_close(actual, wanted, width, name=name)
        else:
            assert float((actual - wanted).abs().max()) <= torch.finfo(dtype).eps * float(wanted.abs().max()), name
    for name, actual, wanted in zip(("dweight", "dbias"), got[2:], expected[2:]):
        assert_rounding_close(actual, wanted, rows * width, name=name)


@interpreted_only
def test_interpreted_bert_step_with_triton_layer_norms_matches_torchs(monkeypatch):
    """A bf16 autocast step of a small BERT (float32 LayerNorm inputs and half ones, the residual stream and the
    embeddings) with BERTRAIN_LAYER_NORM=triton against torch's kernels: the same loss and gradients within bf16
    rounding through the layers."""
    config = dataclasses.replace(CONFIGS["bert"], hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    calls = []
    monkeypatch.setattr(layer_norm_triton, "_builds", {"cpu": True})  # no trial run among the counted calls
    original = layer_norm_triton.TritonLayerNorm.apply
    monkeypatch.setattr(layer_norm_triton.TritonLayerNorm, "apply", lambda *a: calls.append(1) or original(*a))
    results = {}
    for kernel in ("torch", "triton"):
        monkeypatch.setenv("BERTRAIN_LAYER_NORM", kernel)
        torch.manual_seed(0)
        model = build_model(config).train()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(**padded_batch()).loss
        loss.backward()
        results[kernel] = loss.detach().double(), {n: p.grad.double() for n, p in model.named_parameters()}
    # the encoder's two LayerNorms a layer and the MLM head's; the embeddings' float32 sum goes to torch's kernel
    assert len(calls) == 2 * config.num_hidden_layers + 1
    steps = config.num_hidden_layers + 2
    assert_rounding_close(results["triton"][0], results["torch"][0], config.hidden_size, steps, torch.bfloat16)
    for name, grad in results["torch"][1].items():
        assert_rounding_close(results["triton"][1][name], grad, config.hidden_size, steps, torch.bfloat16, name)


def fused(x, weight, bias, residual, p, dy) -> list:
    """[y, d x, d residual, d weight, d bias, the sum it normalized] of TritonLayerNorm(residual + dropout(x, p)),
    in float64."""
    x, weight, bias, residual = (t.detach().clone().requires_grad_() for t in (x, weight, bias, residual))
    y = layer_norm_triton.TritonLayerNorm.apply(x, weight, bias, 1e-5, residual, p)
    summed = y.grad_fn.saved_tensors[0]  # kept for the backward
    y.backward(dy)
    return [t.double() for t in (y.detach(), x.grad, residual.grad, weight.grad, bias.grad, summed)]


@interpreted_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("p", [0.0, 0.1, 0.5])
@pytest.mark.parametrize("rows, width", [(37, 100), (3, 7)])
def test_interpreted_residual_dropout_layer_norm_equals_float64(dtype, p, rows, width):
    """LN(residual + dropout(x, p)) in one kernel against the float64 ops on the positions it kept, which the
    backward gives away: x's gradient is residual's / (1 - p) where kept, 0 elsewhere; the forward on any other
    positions would fail the comparison. The sum is rounded to x's dtype before the statistics, as the ops' add: the
    reference normalizes the kernel's rounded sum (the interpreter truncates where a GPU rounds), within one unit in
    the last place of the exact sum."""
    g = torch.Generator().manual_seed(rows * width)
    x, residual = ((torch.randn(rows, width, generator=g) * 3 + 1).to(dtype) for _ in range(2))
    weight, bias = torch.randn(width, generator=g), torch.randn(width, generator=g)
    dy = torch.randn(rows, width, generator=g).to(dtype)
    torch.manual_seed(1)
    y, dx, dresidual, dweight, dbias, kernel_sum = fused(x, weight, bias, residual, p, dy)
    kept = dx != 0
    scale = 1 / (1 - p)
    tolerance = 2 * torch.finfo(dtype).eps * float(dresidual.abs().max()) * scale
    assert float((dx - torch.where(kept, dresidual * scale, 0.0)).abs().max()) <= tolerance
    if p == 0:
        assert bool(kept.all())
    else:  # a loose bound here; test_interpreted_dropout_draws checks the statistics
        assert 0 < float(kept.double().mean()) < 1

    x64, w64, b64, r64 = (t.double().requires_grad_() for t in (x, weight, bias, residual))
    summed = r64 + torch.where(kept, x64 * scale, 0.0)
    error = (kernel_sum - summed).detach().abs().max()
    assert float(error) <= torch.finfo(dtype).eps * float(summed.detach().abs().max())
    rounded = summed + (kernel_sum - summed).detach()  # the kernel's rounding, the gradient through it
    expected = F.layer_norm(rounded, (width,), w64, b64, 1e-5)
    expected.backward(dy.double())
    for name, actual, wanted in (("y", y, expected), ("dx", dx, x64.grad), ("dresidual", dresidual, r64.grad)):
        if dtype == torch.float32:
            assert_rounding_close(actual, wanted, width, name=name)
        else:  # one unit in a half type's last place (the interpreter truncates where a GPU rounds)
            wanted = wanted.detach()
            assert float((actual - wanted).abs().max()) <= torch.finfo(dtype).eps * float(wanted.abs().max()), name
    for name, actual, wanted in (("dweight", dweight, w64.grad), ("dbias", dbias, b64.grad)):
        assert_rounding_close(actual, wanted, rows * width, name=name)


@interpreted_only
def test_interpreted_dropout_draws():
    """The kept share within 5 standard deviations of 1 - p (binomial), in each of the four draws a counter gives
    (positions 4j + i) and for neighbours drawn from one counter as for independent ones: P(same) = p² + (1-p)²;
    rows differ; the seed comes from torch's generator (same seed, same masks; the next call, new ones); p = 0
    draws nothing and is bitwise the LayerNorm of its sum."""
    rows, width, p = 64, 1024, 0.5
    x, residual = torch.ones(rows, width).requires_grad_(), torch.zeros(rows, width)
    weight, bias = torch.ones(width), torch.zeros(width)

    def kept() -> torch.Tensor:
        x.grad = None
        layer_norm_triton.TritonLayerNorm.apply(x, weight, bias, 1e-5, residual, p).backward(torch.randn(rows, width))
        return x.grad != 0

    torch.manual_seed(3)
    first = kept()
    n = first.numel() // 4
    for i in range(4):
        assert abs(float(first[:, i::4].double().mean()) - (1 - p)) <= 5 * (p * (1 - p) / n) ** 0.5, i
    same = float((first[:, 0::4] == first[:, 1::4]).double().mean())
    assert abs(same - (p * p + (1 - p) ** 2)) <= 5 * (0.25 / n) ** 0.5
    assert len({tuple(row.tolist()) for row in first}) == rows
    second = kept()
    torch.manual_seed(3)
    assert torch.equal(kept(), first) and not torch.equal(second, first)
    x = torch.randn(rows, width).bfloat16().requires_grad_()
    residual = torch.randn(rows, width).bfloat16()
    state = torch.get_rng_state()
    y = layer_norm_triton.TritonLayerNorm.apply(x, weight, bias, 1e-5, residual, 0.0)
    assert torch.equal(torch.get_rng_state(), state)
    summed = y.grad_fn.saved_tensors[0]  # the interpreter truncates to bf16 where the ops' add (and a GPU) rounds
    assert float((summed - (residual + x)).abs().max()) <= torch.finfo(torch.bfloat16).eps * float(summed.abs().max())
    assert torch.equal(y, layer_norm_triton.TritonLayerNorm.apply(summed, weight, bias, 1e-5))


@interpreted_only
def test_interpreted_bert_step_draws_its_dropout_in_the_kernel_and_checkpointing_draws_it_again(monkeypatch):
    """With BERTRAIN_LAYER_NORM=triton, a bf16 training step of BERT (dropout 0.1) adds each sublayer's output to its
    residual with dropout in the kernel (p 0.1 in training, 0 in evaluation); gradient checkpointing's recomputed
    forward draws the same masks (the generator restored first): bitwise the same loss and gradients."""
    config = CONFIGS["bert"]
    monkeypatch.setenv("BERTRAIN_LAYER_NORM", "triton")
    monkeypatch.setattr(layer_norm_triton, "_builds", {"cpu": True})
    calls = []
    original = layer_norm_triton.TritonLayerNorm.apply
    monkeypatch.setattr(layer_norm_triton.TritonLayerNorm, "apply",
                        lambda *a: calls.append((*a, None, 0.0)[4:6]) or original(*a))  # (residual, p)

    def step(checkpointing: bool):
        torch.manual_seed(0)
        model = build_model(dataclasses.replace(config, gradient_checkpointing=checkpointing)).train()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(**padded_batch()).loss
        loss.backward()
        return loss.detach(), {n: p.grad for n, p in model.named_parameters()}, model

    loss, grads, model = step(False)
    assert [p for residual, p in calls if residual is not None] == [config.hidden_dropout_prob] * (
        2 * config.num_hidden_layers)
    again, again_grads, _ = step(True)
    assert torch.equal(again, loss)
    for name, grad in grads.items():
        assert torch.equal(again_grads[name], grad), name
    calls.clear()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        model.eval()(**padded_batch())
    assert [p for residual, p in calls if residual is not None] == [0.0] * (2 * config.num_hidden_layers)


@interpreted_only
def test_interpreted_layer_norm_keeps_torchs_kernel_unless_chosen(monkeypatch):
    x = torch.randn(4, 16)
    weight, bias = torch.ones(16), torch.zeros(16)
    monkeypatch.delenv("BERTRAIN_LAYER_NORM", raising=False)
    monkeypatch.setattr(layer_norm_triton.TritonLayerNorm, "apply", None)  # a call would fail
    assert torch.equal(layer_norm_triton.layer_norm(x, (16,), weight, bias, 1e-5), F.layer_norm(x, (16,), weight,
                                                                                                bias, 1e-5))


@interpreted_only
def test_interpreted_first_use_under_inference_mode_builds_without_touching_the_random_stream(monkeypatch):
    """The trial run needs a graph (an evaluation may come first) and draws no random number (else a resumed run's
    dropout would shift)."""
    monkeypatch.setenv("BERTRAIN_LAYER_NORM", "triton")
    monkeypatch.setattr(layer_norm_triton, "_builds", {})
    x, weight, bias = torch.randn(4, 16), torch.randn(16), torch.randn(16)
    state = torch.get_rng_state()
    with torch.inference_mode():
        y = layer_norm_triton.layer_norm(x, (16,), weight, bias, 1e-5)
    assert layer_norm_triton._builds == {"cpu": True}
    assert torch.equal(torch.get_rng_state(), state)
    assert_rounding_close(y, F.layer_norm(x, (16,), weight, bias, 1e-5), 16)


@interpreted_only
def test_interpreted_kernels_that_fail_to_build_leave_torchs_with_a_warning(monkeypatch):
    class Unbuildable:
        def __getitem__(self, grid):
            raise RuntimeError("no such instruction on this GPU")

    monkeypatch.setenv("BERTRAIN_LAYER_NORM", "triton")
    monkeypatch.setattr(layer_norm_triton, "_layer_norm_forward", Unbuildable())
    monkeypatch.setattr(layer_norm_triton, "_builds", {})
    x, weight, bias = torch.randn(4, 16), torch.randn(16), torch.randn(16)
    with pytest.warns(RuntimeWarning, match="Triton LayerNorm kernels failed on cpu.*no such instruction.*torch's"):
        y = layer_norm_triton.layer_norm(x, (16,), weight, bias, 1e-5)
    assert torch.equal(y, F.layer_norm(x, (16,), weight, bias, 1e-5))
    assert torch.equal(layer_norm_triton.layer_norm(x, (16,), weight, bias, 1e-5), y)  # tried once


def test_an_unknown_layer_norm_kernel_is_a_usage_error_naming_the_choices(monkeypatch):
    monkeypatch.setenv("BERTRAIN_LAYER_NORM", "apex")
    with pytest.raises(UsageError, match="BERTRAIN_LAYER_NORM='apex'.*torch or triton"):
        layer_norm_triton.layer_norm(torch.randn(2, 8), (8,), torch.ones(8), torch.zeros(8), 1e-5)


def test_layer_norm_kernels_compile_for_the_gpus_they_serve(tmp_path):
    """Both kernels through Triton's compiler and ptxas for an A100 (sm_80) and an H100/H200 (sm_90) at BERT's widths
    and the dtypes training gives them, no GPU needed; with Triton's cuobjdump, their registers checked too."""
    triton = pytest.importorskip("triton", reason="Triton is not installed (.ci/run installs it)")
    try:
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
    except ImportError as error:
        pytest.skip(f"this Triton has no ahead-of-time compiler API: {error}")
    for arch in (80, 90):
        for width in (768, 1024):
            for half, weights in (("bf16", "bf16"), ("fp16", "fp16"), ("bf16", "fp32")):
                options = dict(layer_norm_triton.launch_options(width))  # a copy: the function caches
                block = options.pop("BLOCK")
                seed = "*i64"  # with dropout; without, any pointer the kernel does not read
                forward = dict(X=f"*{half}", RESIDUAL=f"*{half}", SEED=seed, W=f"*{weights}", B=f"*{weights}",
                               Y=f"*{half}", H=f"*{half}", STATS="*fp32", rows="i32", width="i32", p="fp32",
                               eps="fp32", ADD="constexpr", DROPOUT="constexpr", BLOCK="constexpr")
                backward = dict(DY=f"*{half}", X=f"*{half}", SEED=seed, W=f"*{weights}", STATS="*fp32", DX=f"*{half}",
                                DDROPPED=f"*{half}", PARTIALS="*fp32", rows="i32", width="i32",
                                rows_per_program="i32", p="fp32", DROPOUT="constexpr", BLOCK="constexpr")
                # LayerNorm alone, and with the residual and dropout (the residual alone is the latter less code)
                variants = [("_layer_norm_forward", forward, dict(ADD=False, DROPOUT=False)),
                            ("_layer_norm_forward", forward, dict(ADD=True, DROPOUT=True)),
                            ("_layer_norm_backward", backward, dict(DROPOUT=False)),
                            ("_layer_norm_backward", backward, dict(DROPOUT=True))]
                for name, signature, flags in variants:
                    kernel = getattr(layer_norm_triton, name)
                    assert list(signature) == list(kernel.arg_names)
                    try:
                        source = ASTSource(fn=kernel, signature=signature, constexprs=dict(flags, BLOCK=block))
                    except TypeError as error:  # written against Triton 3.9; another version's API is not our failure
                        pytest.skip(f"this Triton's ahead-of-time compiler API differs: {error}")
                    try:
                        compiled = triton.compile(source, target=GPUTarget("cuda", arch, 32), options=options)
                    except (RuntimeError, FileNotFoundError) as error:
                        if "ptxas" in str(error).lower() and "error" not in str(error).lower():
                            pytest.skip(f"no ptxas with this Triton: {error}")
                        raise
                    where = (arch, name, flags, width, half, weights)
                    assert ".entry" in compiled.asm["ptx"] and compiled.asm["cubin"], where
                    assert "fma.rn.f32" in compiled.asm["ptx"], where  # launch_options' FMAs, whatever the default
                    usage = resource_usage(triton, compiled.asm["cubin"], tmp_path)
                    if usage:  # no spills; the backward's programs per multiprocessor fit its 64K registers
                        assert usage["STACK"] == usage["LOCAL"] == 0, (where, usage)
                        warps = options["num_warps"]
                        fit = layer_norm_triton.BACKWARD_PROGRAMS_PER_SM if name == "_layer_norm_backward" else 1
                        assert usage["REG"] * 32 * warps * fit <= 65536, (where, usage)


def resource_usage(triton, cubin: bytes, folder: Path) -> dict[str, int]:
    """cuobjdump's registers a thread, stack and local (spilled) bytes of a compiled kernel; {} without cuobjdump."""
    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if not cuobjdump.exists():
        return {}
    path = folder / "kernel.cubin"
    path.write_bytes(cubin)
    listing = subprocess.run([str(cuobjdump), "-res-usage", str(path)], capture_output=True, text=True).stdout
    return {key: int(value) for key, value in re.findall(r"\b(REG|STACK|LOCAL):(\d+)", listing)}
