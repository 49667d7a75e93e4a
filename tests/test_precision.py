"""Precision per device (bertrain/train/precision.py), with the CPU flags and the CUDA capability injected."""

from __future__ import annotations

import warnings

import pytest
import torch

from bertrain import console
from bertrain.train import precision

X86_AVX2 = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\n\nprocessor\t: 1\nflags\t\t: fpu sse2 avx avx2 fma\n"
X86_SAPPHIRE = "processor\t: 0\nflags\t\t: avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"
ARM_NEOVERSE_V1 = "processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\n"


@pytest.fixture
def cpu(monkeypatch, tmp_path):
    """Set the CPU the module sees: `cpu(cpuinfo_text, torch_capability)`; also forgets earlier warnings."""
    monkeypatch.setattr(console, "_warned", set())
    read_flags = precision.cpu_flags

    def set_cpu(cpuinfo: str, capability: str = "AVX2") -> None:
        path = tmp_path / "cpuinfo"
        path.write_text(cpuinfo)
        monkeypatch.setattr(precision, "cpu_flags", lambda: read_flags(path))
        monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)

    return set_cpu


def test_cpu_flags_reads_x86_and_arm_cpuinfo(tmp_path):
    for text, expected in ((X86_AVX2, {"avx2", "fma"}), (X86_SAPPHIRE, {"avx512_bf16", "amx_bf16"}),
                           (ARM_NEOVERSE_V1, {"bf16", "sve"})):
        (tmp_path / "cpuinfo").write_text(text)
        assert expected <= precision.cpu_flags(tmp_path / "cpuinfo")
    assert precision.cpu_flags(tmp_path / "missing") == set()


@pytest.mark.parametrize("cpuinfo, capability, expected", [
    (X86_AVX2, "AVX2", "no"),            # bf16 emulated: fp32 is faster
    (X86_AVX2, "AVX512", "no"),          # AVX-512 without the BF16 extension
    (X86_SAPPHIRE, "AVX512", "bf16"),    # AVX512_BF16 / AMX in the flags
    (ARM_NEOVERSE_V1, "SVE256", "bf16"),
    ("", "AMX", "bf16"),                 # no cpuinfo (not Linux), torch reports AMX
])
def test_auto_on_cpu_follows_native_bf16(cpu, cpuinfo, capability, expected):
    cpu(cpuinfo, capability)
    assert precision.choose_mixed_precision("auto", "cpu") == expected


@pytest.mark.parametrize("capability, expected", [((9, 0), "bf16"), ((8, 0), "bf16"), ((7, 5), "fp16"),
                                                   ((7, 0), "fp16"), ((6, 0), "fp16")])
def test_auto_on_cuda_is_bf16_from_ampere_else_fp16(monkeypatch, capability, expected):
    seen = []
    monkeypatch.setattr(precision, "cuda_capability", lambda device: seen.append(device) or capability)
    assert precision.choose_mixed_precision("auto", "cuda:1") == expected
    assert seen == [torch.device("cuda:1")]


def test_auto_elsewhere_is_fp32():
    assert precision.choose_mixed_precision("auto", "mps") == "no"


def test_explicit_bf16_on_cpu_without_native_bf16_warns_once_with_the_cost(cpu):
    cpu(X86_AVX2, "AVX2")
    with pytest.warns(UserWarning, match=r"bf16.*slower than fp32.*`auto` or `no`"):
        assert precision.choose_mixed_precision("bf16", "cpu") == "bf16"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert precision.choose_mixed_precision("bf16", "cpu") == "bf16"  # no second warning


def test_explicit_choices_are_kept_without_warning_where_they_are_fast(cpu):
    cpu(X86_SAPPHIRE, "AVX512")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert precision.choose_mixed_precision("bf16", "cpu") == "bf16"
        assert precision.choose_mixed_precision("no", "cpu") == "no"
        assert precision.choose_mixed_precision("fp16", "cuda") == "fp16"


def test_unknown_choice_is_refused():
    with pytest.raises(ValueError, match="auto, no, fp16, bf16"):
        precision.choose_mixed_precision("fp8", "cpu")


def test_set_tf32_switches_cuda_fp32_matmuls(monkeypatch):
    matmul = torch.backends.cuda.matmul
    if not hasattr(matmul, "fp32_precision"):
        pytest.skip("torch < 2.9: legacy allow_tf32 flags")
    before = (matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision)
    try:
        precision.set_tf32(True)
        assert (matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision) == ("tf32", "tf32")
        precision.set_tf32(False)
        assert (matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision) == ("ieee", "ieee")
    finally:
        matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision = before
