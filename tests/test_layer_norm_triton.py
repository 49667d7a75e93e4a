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


@pytest.mark.cross_path
def test_kernels_in_the_interpreter():
    """The tests below, in a process where Triton's interpreter runs the kernels on the CPU (it must be chosen
    before Triton is imported)."""
    pytest.importorskip("triton", reason="Triton is not installed (.ci/run installs it)")
    run_interpreted_tests(__file__, passed=13)


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
                options = layer_norm_triton.launch_options(width)
                block = {"BLOCK": options.pop("BLOCK")}
                signatures = {
                    "_layer_norm_forward": dict(X=f"*{half}", W=f"*{weights}", B=f"*{weights}", Y=f"*{half}",
                                                MEAN="*fp32", RSTD="*fp32", width="i32", eps="fp32", BLOCK="constexpr"),
                    "_layer_norm_backward": dict(DY=f"*{half}", X=f"*{half}", W=f"*{weights}", MEAN="*fp32",
                                                 RSTD="*fp32", DX=f"*{half}", DW="*fp32", DB="*fp32", rows="i32",
                                                 width="i32", rows_per_program="i32", BLOCK="constexpr")}
                for name, signature in signatures.items():
                    kernel = getattr(layer_norm_triton, name)
                    assert list(signature) == list(kernel.arg_names)
                    try:
                        source = ASTSource(fn=kernel, signature=signature, constexprs=block)
                    except TypeError as error:  # written against Triton 3.9; another version's API is not our failure
                        pytest.skip(f"this Triton's ahead-of-time compiler API differs: {error}")
                    try:
                        compiled = triton.compile(source, target=GPUTarget("cuda", arch, 32), options=options)
                    except (RuntimeError, FileNotFoundError) as error:
                        if "ptxas" in str(error).lower() and "error" not in str(error).lower():
                            pytest.skip(f"no ptxas with this Triton: {error}")
                        raise
                    assert ".entry" in compiled.asm["ptx"] and compiled.asm["cubin"], (arch, name, width, half)
                    usage = resource_usage(triton, compiled.asm["cubin"], tmp_path)
                    if usage:  # no spills; the backward's programs per multiprocessor fit its 64K registers
                        assert usage["STACK"] == usage["LOCAL"] == 0, (arch, name, width, half, usage)
                        warps = options["num_warps"]
                        fit = layer_norm_triton.BACKWARD_PROGRAMS_PER_SM if name == "_layer_norm_backward" else 1
                        assert usage["REG"] * 32 * warps * fit <= 65536, (arch, name, width, half, usage)


def resource_usage(triton, cubin: bytes, folder: Path) -> dict[str, int]:
    """cuobjdump's registers a thread, stack and local (spilled) bytes of a compiled kernel; {} without cuobjdump."""
    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if not cuobjdump.exists():
        return {}
    path = folder / "kernel.cubin"
    path.write_bytes(cubin)
    listing = subprocess.run([str(cuobjdump), "-res-usage", str(path)], capture_output=True, text=True).stdout
    return {key: int(value) for key, value in re.findall(r"\b(REG|STACK|LOCAL):(\d+)", listing)}
