"""The multi-tensor LAMB (bertrain/train/lamb.py), with the CPU kernel (lamb_native.c), the GPU kernel
(lamb_triton.py, run by Triton's interpreter on the CPU) and with torch ops, against the per-parameter LAMB loop it
replaces."""

from __future__ import annotations

import copy
import os

import pytest
import torch

from bertrain.config import ModelConfig, OptimConfig
from bertrain.errors import UsageError
from bertrain.model import build_model
from bertrain.train import lamb_native, lamb_triton
from bertrain.train.lamb import Lamb, own_kernel
from bertrain.train.optim import build_optimizer, optimizer_groups, parameter_groups, row_blocks_of
from tests.helpers import assert_rounding_close, assert_same_weights, run_interpreted_tests
from tests.reference_lamb import ReferenceLamb


def tiny_model(kind: str):
    config = ModelConfig(type=kind, vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=64, max_position_embeddings=64, hidden_dropout_prob=0.0,
                         attention_probs_dropout_prob=0.0, embedding_size=16 if kind == "albert" else None)
    torch.manual_seed(0)
    return build_model(config)


def groups_of(model) -> list[dict]:
    """Two groups, weight decay 0.1 on matrices and none on biases / LayerNorm (zero biases: ratio 1)."""
    return optimizer_groups(model, 0.1)


def run_steps(models_and_optimizers, steps: int, seed: int = 1, skip: str | None = None) -> None:
    """The same random gradients for every model (none for parameters named `skip`), then a step each."""
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        grads = {name: torch.randn(p.shape, generator=generator) * 0.1
                 for name, p in models_and_optimizers[0][0].named_parameters()}
        for model, optimizer in models_and_optimizers:
            for name, param in model.named_parameters():
                param.grad = None if name == skip else grads[name].clone()
            optimizer.step()


def assert_same(model_a, model_b, optimizer_a, optimizer_b, steps: int) -> None:
    """B's weights and moments are A's after `steps` steps computed another way: within float32 rounding, K being a
    weight's norm (its elements) or, for the moments, 1 (element-wise). A trust ratio 0.1% off fails."""
    for (name, a), b in zip(model_a.named_parameters(), model_b.parameters()):
        assert_rounding_close(b, a, a.numel(), steps, name=name)
    state_a, state_b = optimizer_a.state_dict(), optimizer_b.state_dict()
    assert state_a["param_groups"] == state_b["param_groups"]
    assert state_a["state"].keys() == state_b["state"].keys()
    for index, entry in state_a["state"].items():
        assert entry.keys() == state_b["state"][index].keys() == {"step", "exp_avg", "exp_avg_sq"}
        for key, value in entry.items():
            other = state_b["state"][index][key]
            assert value.dtype == other.dtype == torch.float32
            if key == "step":
                assert torch.equal(other, value)
            else:
                assert_rounding_close(other, value, 1, steps, name=f"{key} of parameter {index}")


@pytest.fixture(params=[True, False], ids=["native", "torch ops"])
def native(request):
    """Run the test with lamb_native.c (skipped where no C compiler could build it) and with torch ops."""
    if request.param and lamb_native.library() is None:
        pytest.skip("no C compiler built lamb_native.c here")
    return request.param


@pytest.mark.cross_path
@pytest.mark.parametrize("kind", ["bert", "albert"])
def test_lamb_equals_per_parameter_lamb(kind, native):
    reference_model = tiny_model(kind)
    model = copy.deepcopy(reference_model)
    reference = ReferenceLamb(groups_of(reference_model), lr=1e-2, betas=(0.9, 0.98), eps=1e-6)
    optimizer = Lamb(groups_of(model), lr=1e-2, betas=(0.9, 0.98), eps=1e-6, native=native)
    run_steps([(reference_model, reference), (model, optimizer)], steps=5, skip="mlm_head.dense.bias")
    moved = max(float((a - b).abs().max())
                for a, b in zip(model.state_dict().values(), tiny_model(kind).state_dict().values()))
    assert moved > 1e-3  # the steps did change the weights
    assert_same(reference_model, model, reference, optimizer, steps=5)


def separate_blocks(model) -> tuple[dict, list[dict]]:
    """The model's weights with each row-blocked parameter (the fused query/key/value) as separate tensors, as
    transformers and Google's ALBERT hold them: ({name: tensors}, their groups for ReferenceLamb)."""
    blocks = row_blocks_of(model)
    separate = {name: [t.detach().clone() for t in param.chunk(blocks.get(param, 1))]
                for name, param in model.named_parameters()}
    return separate, [{"params": [t for name in group["names"] for t in separate[name]],
                       "weight_decay": group["weight_decay"]} for group in parameter_groups(model, 0.1)]


def steps_with_separate_blocks(model, optimizer, separate: dict, reference, steps: int) -> None:
    """The same random gradients for the model and, cut into its blocks, for the separate tensors; a step each."""
    generator = torch.Generator().manual_seed(1)
    for _ in range(steps):
        for name, param in model.named_parameters():
            param.grad = torch.randn(param.shape, generator=generator) * 0.1
            for tensor, grad in zip(separate[name], param.grad.chunk(len(separate[name]))):
                tensor.grad = grad.clone()
        optimizer.step()
        reference.step()


def mismatched(model, separate: dict, steps: int) -> list[str]:
    """The names whose weights are not the separate tensors' (concatenated) within float32 rounding."""
    off = []
    for name, param in model.named_parameters():
        try:
            assert_rounding_close(param, torch.cat(separate[name]), param.numel(), steps, name=name)
        except AssertionError:
            off.append(name)
    return off


@pytest.mark.cross_path
@pytest.mark.parametrize("kind", ["bert", "albert"])
def test_fused_query_key_value_get_a_trust_ratio_each_as_three_tensors_do(kind, native):
    # One ratio for the fused [3H, H] tensor was 27-56x the rounding off transformers' three after 10 steps.
    model = tiny_model(kind)
    for blocked in (True, False):
        trained = copy.deepcopy(model)
        separate, groups = separate_blocks(trained)
        blocks = row_blocks_of(trained)
        assert blocks and all(len(separate[name]) == 3 for name, p in trained.named_parameters() if p in blocks)
        optimizer = Lamb(groups_of(trained), lr=1e-2, betas=(0.9, 0.98), native=native,
                         row_blocks=blocks if blocked else None)
        steps_with_separate_blocks(trained, optimizer, separate, ReferenceLamb(groups, lr=1e-2, betas=(0.9, 0.98)), 5)
        off = mismatched(trained, separate, 5)
        if blocked:
            assert not off, off
            assert all(torch.equal(optimizer.state[p]["step"], torch.full((3,), 5.0)) for p in blocks)
        else:  # one ratio over the three, as bertrain did
            assert off and all(".qkv." in name for name in off), off


@pytest.mark.cross_path
def test_lamb_without_fused_kernel_uses_foreach_ops_with_same_result(monkeypatch):
    def unavailable(*args, **kwargs):
        raise NotImplementedError("no fused adam here")

    monkeypatch.setattr(torch, "_fused_adam_", unavailable)
    reference_model = tiny_model("bert")
    model = copy.deepcopy(reference_model)
    # The foreach ops compute 1 - beta2^t in float32 (the fused kernel in float64), a cancellation that multiplies
    # its rounding by beta2 / (1 - beta2^t): with beta2 = 0.999, 3e-5 of the update. Float32 holds the powers of
    # 0.875 = 1 - 2^-3 exactly, which leaves only the rounding that assert_same allows.
    betas = (0.9, 0.875)
    reference = ReferenceLamb(groups_of(reference_model), lr=1e-2, betas=betas)
    optimizer = Lamb(groups_of(model), lr=1e-2, betas=betas, native=False)
    run_steps([(reference_model, reference), (model, optimizer)], steps=4)
    assert_same(reference_model, model, reference, optimizer, steps=4)


@pytest.mark.cross_path
def test_native_kernel_splits_the_work_between_threads_with_the_same_result(monkeypatch):
    monkeypatch.setattr(lamb_native, "MIN_ELEMENTS_PER_THREAD", 1)  # the tiny model on 3 threads
    if lamb_native.library() is None:
        pytest.skip("no C compiler built lamb_native.c here")
    threads = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        reference_model = tiny_model("albert")
        model = copy.deepcopy(reference_model)
        reference, optimizer = ReferenceLamb(groups_of(reference_model), lr=1e-2), Lamb(groups_of(model), lr=1e-2)
        run_steps([(reference_model, reference), (model, optimizer)], steps=4)
    finally:
        torch.set_num_threads(threads)
    assert_same(reference_model, model, reference, optimizer, steps=4)


def test_cpu_float32_lamb_runs_the_native_kernel(monkeypatch):
    if lamb_native.library() is None:
        pytest.skip("no C compiler built lamb_native.c here")
    calls = []
    original = lamb_native.lamb_update
    monkeypatch.setattr(lamb_native, "lamb_update", lambda *args: calls.append(len(args[0])) or original(*args))
    model = tiny_model("bert")
    run_steps([(model, Lamb(groups_of(model), lr=1e-2))], steps=1)
    assert calls and sum(calls) == len(list(model.parameters()))  # both groups, every parameter
    calls.clear()
    run_steps([(model, Lamb(groups_of(model), lr=1e-2, native=False))], steps=1)
    assert not calls


@pytest.mark.parametrize("sizes, parts", [([5], 2), ([3, 0, 7, 1], 3), ([1, 1], 4), ([100, 1, 37], 7)])
def test_split_evenly_covers_each_element_once_in_equal_shares(sizes, parts):
    shares = lamb_native.split_evenly(sizes, parts)
    assert len(shares) == parts
    amounts = [sum(end - first for _, first, end in share) for share in shares]
    assert max(amounts) - min(amounts) <= 1
    covered = sorted((t, i) for share in shares for t, first, end in share for i in range(first, end))
    assert covered == [(t, i) for t, size in enumerate(sizes) for i in range(size)]


@pytest.mark.cross_path
def test_without_a_compiler_lamb_warns_once_and_uses_torch_ops(monkeypatch):
    monkeypatch.setattr(lamb_native, "_tried", False)
    monkeypatch.setattr(lamb_native, "_library", None)
    monkeypatch.setattr(lamb_native.shutil, "which", lambda name: None)
    reference_model = tiny_model("bert")
    model = copy.deepcopy(reference_model)
    reference, optimizer = ReferenceLamb(groups_of(reference_model), lr=1e-2), Lamb(groups_of(model), lr=1e-2)
    with pytest.warns(RuntimeWarning, match="no C compiler") as warned:
        run_steps([(reference_model, reference), (model, optimizer)], steps=2)
    assert len(warned) == 1 and lamb_native.library() is None
    assert_same(reference_model, model, reference, optimizer, steps=2)


def test_native_kernel_is_built_into_the_cache_once(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(lamb_native, "_tried", False)
    monkeypatch.setattr(lamb_native, "_library", None)
    if lamb_native.shutil.which(lamb_native.os.environ.get("CC", "cc")) is None:
        pytest.skip("no C compiler here")
    assert lamb_native.library() is not None
    built = list((tmp_path / "bertrain" / "kernels").glob("lamb-*.so"))
    assert len(built) == 1
    monkeypatch.setattr(lamb_native, "_tried", False)
    monkeypatch.setattr(lamb_native, "_compile", lambda *a: pytest.fail("compiled again"))
    assert lamb_native.library() is not None


@pytest.mark.cross_path
def test_lamb_resumes_from_a_per_parameter_lamb_checkpoint(native):
    reference_model = tiny_model("albert")
    reference = ReferenceLamb(groups_of(reference_model), lr=1e-2)
    run_steps([(reference_model, reference)], steps=3)
    model = copy.deepcopy(reference_model)
    optimizer = Lamb(groups_of(model), lr=1e-2, native=native)
    optimizer.load_state_dict(copy.deepcopy(reference.state_dict()))
    run_steps([(reference_model, reference), (model, optimizer)], steps=3, seed=2)
    assert_same(reference_model, model, reference, optimizer, steps=3)


def test_a_checkpoint_from_before_row_blocks_resumes_with_a_step_count_per_block(native):
    model = tiny_model("albert")
    before = Lamb(groups_of(model), lr=1e-2, native=native)   # one count per tensor, as checkpoints had it
    run_steps([(model, before)], steps=3)
    blocks = row_blocks_of(model)
    optimizer = Lamb(groups_of(model), lr=1e-2, native=native, row_blocks=blocks)
    optimizer.load_state_dict(copy.deepcopy(before.state_dict()))
    run_steps([(model, optimizer)], steps=1, seed=2)
    assert all(torch.equal(optimizer.state[p]["step"], torch.full((3,), 4.0)) for p in blocks)
    assert all(optimizer.state[p]["step"].shape == () for p in model.parameters() if p not in blocks)
    plain = Lamb(groups_of(model), lr=1e-2, native=native)   # and back: one count again
    plain.load_state_dict(copy.deepcopy(optimizer.state_dict()))
    run_steps([(model, plain)], steps=1, seed=3)
    assert all(torch.equal(plain.state[p]["step"], torch.tensor(5.0)) for p in model.parameters())


def test_row_blocks_skip_a_non_finite_step_and_follow_a_swapped_storage(native):
    model = tiny_model("bert")
    blocks = row_blocks_of(model)
    optimizer = Lamb(groups_of(model), lr=1e-2, native=native, row_blocks=blocks)
    run_steps([(model, optimizer)], steps=2)
    before = copy.deepcopy((model.state_dict(), optimizer.state_dict()["state"]))
    optimizer.found_inf = torch.ones(())
    run_steps([(model, optimizer)], steps=1, seed=2)
    assert all(torch.equal(before[0][k], v) for k, v in model.state_dict().items())
    assert all(torch.equal(before[1][i][k], v) for i, entry in optimizer.state_dict()["state"].items()
               for k, v in entry.items())
    optimizer.found_inf = torch.zeros(())
    qkv = next(iter(blocks))
    qkv.data = qkv.data.clone()   # the cached views are of the old storage: they must not be used
    run_steps([(model, optimizer)], steps=1, seed=2)
    assert not torch.equal(qkv.detach(), before[0][next(k for k, v in model.named_parameters() if v is qkv)])
    assert torch.equal(optimizer.state[qkv]["step"], torch.full((3,), 3.0))


def test_a_loaded_state_replaces_the_one_lamb_stepped_with(native):
    """Lamb keeps each parameter list's states and row-block views between steps (host time); a load_state_dict
    into an optimizer that has stepped must end them: the next step is a fresh optimizer's from that state."""
    model = tiny_model("bert")
    optimizer = Lamb(groups_of(model), lr=1e-2, native=native, row_blocks=row_blocks_of(model))
    run_steps([(model, optimizer)], steps=2)
    saved = copy.deepcopy((model.state_dict(), optimizer.state_dict()))
    run_steps([(model, optimizer)], steps=2, seed=2)  # on with the kept plan
    model.load_state_dict(saved[0])  # in place: the parameters keep their storage
    optimizer.load_state_dict(copy.deepcopy(saved[1]))
    fresh_model = tiny_model("bert")
    fresh_model.load_state_dict(saved[0])
    fresh = Lamb(groups_of(fresh_model), lr=1e-2, native=native, row_blocks=row_blocks_of(fresh_model))
    fresh.load_state_dict(copy.deepcopy(saved[1]))
    run_steps([(model, optimizer), (fresh_model, fresh)], steps=1, seed=3)
    assert_same_weights(model.state_dict(), fresh_model.state_dict())
    for (index, entry), other in zip(optimizer.state_dict()["state"].items(), fresh.state_dict()["state"].values()):
        assert all(torch.equal(value, other[key]) for key, value in entry.items()), index


def scaled_against_divided(native: bool = True, scale: float = 3.0, steps: int = 2):
    """Two LAMBs (row blocks on) from the same weights: one given gradients g and grad_scale `scale` (clipping, as
    train/step.py gives it), one g / scale divided by torch beforehand. Returns both (model, optimizer) pairs."""
    pairs = []
    for _ in range(2):
        model = tiny_model("bert")
        pairs.append((model, Lamb(groups_of(model), lr=1e-2, native=native, row_blocks=row_blocks_of(model))))
    pairs[0][1].grad_scale = torch.tensor(scale)
    generator = torch.Generator().manual_seed(1)
    for _ in range(steps):
        grads = {name: torch.randn(p.shape, generator=generator) * 0.1 for name, p in pairs[0][0].named_parameters()}
        for (model, optimizer), divide in zip(pairs, (False, True)):
            for name, param in model.named_parameters():
                param.grad = torch.div(grads[name], torch.tensor(scale)) if divide else grads[name].clone()
            optimizer.step()
    return pairs


def assert_same_lamb(pairs) -> None:
    """The two LAMBs' weights and states, bitwise."""
    (model_a, optimizer_a), (model_b, optimizer_b) = pairs
    assert_same_weights(model_a.state_dict(), model_b.state_dict())
    for (index, entry), other in zip(optimizer_a.state_dict()["state"].items(),
                                     optimizer_b.state_dict()["state"].values()):
        assert all(torch.equal(value, other[key]) for key, value in entry.items()), index


def test_grad_scale_divides_each_gradient_as_dividing_them_first(native):
    """Clipping through grad_scale (no pass over the gradients of its own) is the step on the divided gradients,
    bitwise: the kernels divide as torch does (x / 3 rounds otherwise than x * (1 / 3))."""
    assert_same_lamb(scaled_against_divided(native))


def test_row_blocks_must_cut_a_parameter_into_equal_blocks():
    with pytest.raises(ValueError, match=r"shape \(4, 2\) has no 3 row blocks"):
        weight = torch.nn.Parameter(torch.zeros(4, 2))
        Lamb([weight], row_blocks={weight: 3})


def test_a_group_without_layer_adaptation_steps_as_adamw_and_keeps_the_setting_from_a_checkpoint(native):
    # Google's LAMB (BERT, ALBERT) and NVIDIA's give biases and LayerNorms no trust ratio; bertrain gave them one.
    model, reference_model = tiny_model("albert"), tiny_model("albert")
    groups = [dict(g, layer_adaptation=False) for g in groups_of(model)]
    optimizer = Lamb(groups, lr=1e-2, betas=(0.9, 0.98), native=native)
    reference = torch.optim.AdamW(groups_of(reference_model), lr=1e-2, betas=(0.9, 0.98), eps=1e-6, foreach=False)
    run_steps([(reference_model, reference), (model, optimizer)], steps=3)
    for (name, a), b in zip(reference_model.named_parameters(), model.parameters()):
        assert_rounding_close(b, a, 1, 3, name=name)   # element-wise: no norm
    built = build_optimizer(model, OptimConfig(name="lamb"))
    assert [g.get("layer_adaptation", True) for g in built.param_groups] == [True, False]
    built.load_state_dict(Lamb(groups_of(model)).state_dict())   # groups saved without the setting
    assert [g.get("layer_adaptation", True) for g in built.param_groups] == [True, False]


def test_lamb_step_reads_no_tensor_value_on_the_host(monkeypatch, native):
    model = tiny_model("bert")
    optimizer = Lamb(groups_of(model), lr=1e-2, native=native)
    run_steps([(model, optimizer)], steps=1)  # state created

    def host_read(*args, **kwargs):
        raise AssertionError("the LAMB step read a tensor value on the host")

    for name in ("item", "tolist", "__bool__", "__float__", "__int__", "nonzero"):
        monkeypatch.setattr(torch.Tensor, name, host_read)
    run_steps([(model, optimizer)], steps=2)


INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


@pytest.mark.slow  # 120-200 s on 2 cores: Triton's interpreter runs each program in Python
def test_triton_kernel_in_the_interpreter_equals_per_parameter_lamb():
    """The tests below, in a process where Triton's interpreter runs the GPU kernel on the CPU (it must be chosen
    before Triton is imported). Not run again under the portable ATen kernels (not cross_path): the interpreter
    computes the kernels in NumPy, whatever ATen's CPU kernels are."""
    pytest.importorskip("triton", reason="Triton is not installed (.ci/run installs it)")
    run_interpreted_tests(__file__, passed=8)


def small_triton_blocks(monkeypatch) -> None:
    """Blocks of 128 elements and 4 partial sums: tensors span many programs and a norm many additions."""
    monkeypatch.setattr(lamb_triton, "BLOCK", 128)
    monkeypatch.setattr(lamb_triton, "RATIO_BLOCK", 4)


@pytest.mark.skipif(not INTERPRETED, reason="run by test_triton_kernel_in_the_interpreter_equals_per_parameter_lamb")
@pytest.mark.parametrize("kind", ["bert", "albert"])
def test_interpreted_triton_kernel_equals_per_parameter_lamb(kind, monkeypatch):
    small_triton_blocks(monkeypatch)
    reference_model = tiny_model(kind)
    model = copy.deepcopy(reference_model)
    assert own_kernel(list(model.parameters())) is lamb_triton
    reference = ReferenceLamb(groups_of(reference_model), lr=1e-2, betas=(0.9, 0.98), eps=1e-6)
    optimizer = Lamb(groups_of(model), lr=1e-2, betas=(0.9, 0.98), eps=1e-6)
    run_steps([(reference_model, reference), (model, optimizer)], steps=5, skip="mlm_head.dense.bias")
    assert_same(reference_model, model, reference, optimizer, steps=5)


@pytest.mark.skipif(not INTERPRETED, reason="run by test_triton_kernel_in_the_interpreter_equals_per_parameter_lamb")
@pytest.mark.parametrize("schedule", lamb_triton.SCHEDULES)
def test_interpreted_triton_kernel_divides_by_grad_scale_as_dividing_first(schedule, monkeypatch):
    small_triton_blocks(monkeypatch)
    monkeypatch.setattr(lamb_triton, "SCHEDULE", schedule)
    pairs = scaled_against_divided()
    assert own_kernel(list(pairs[0][0].parameters())) is lamb_triton
    assert_same_lamb(pairs)


@pytest.mark.skipif(not INTERPRETED, reason="run by test_triton_kernel_in_the_interpreter_equals_per_parameter_lamb")
def test_interpreted_kernel_trial_draws_no_random_number(monkeypatch):
    """builds() runs the kernels once per process: a random draw there would come again after a resume restored the
    generator, and every later dropout mask would differ from the run that never stopped."""
    small_triton_blocks(monkeypatch)
    monkeypatch.setattr(lamb_triton, "_builds", {})
    state = torch.get_rng_state()
    assert lamb_triton.builds(torch.device("cpu"))
    assert torch.equal(torch.get_rng_state(), state)


@pytest.mark.skipif(not INTERPRETED, reason="run by test_triton_kernel_in_the_interpreter_equals_per_parameter_lamb")
def test_interpreted_triton_kernel_gives_row_blocks_a_trust_ratio_and_a_step_count_each(monkeypatch):
    small_triton_blocks(monkeypatch)
    model = tiny_model("bert")
    separate, groups = separate_blocks(model)
    blocks = row_blocks_of(model)
    optimizer = Lamb(groups_of(model), lr=1e-2, betas=(0.9, 0.98), row_blocks=blocks)
    assert own_kernel(list(model.parameters())) is lamb_triton
    steps_with_separate_blocks(model, optimizer, separate, ReferenceLamb(groups, lr=1e-2, betas=(0.9, 0.98)), 3)
    assert not mismatched(model, separate, 3)
    assert all(torch.equal(optimizer.state[p]["step"], torch.full((3,), 3.0)) for p in blocks)  # each counted once


@pytest.mark.skipif(not INTERPRETED, reason="run by test_triton_kernel_in_the_interpreter_equals_per_parameter_lamb")
def test_interpreted_triton_kernel_changes_nothing_on_a_non_finite_step(monkeypatch):
    small_triton_blocks(monkeypatch)
    model = tiny_model("albert")
    optimizer = Lamb(groups_of(model), lr=1e-2)
    run_steps([(model, optimizer)], steps=2)
    before = copy.deepcopy((model.state_dict(), optimizer.state_dict()["state"]))
    optimizer.found_inf = torch.ones(())
    run_steps([(model, optimizer)], steps=1, seed=2)
    after = (model.state_dict(), optimizer.state_dict()["state"])
    assert all(torch.equal(a, b) for a, b in zip(before[0].values(), after[0].values()))
    assert all(torch.equal(before[1][i][key], after[1][i][key]) for i in before[1] for key in before[1][i])
    optimizer.found_inf = torch.zeros(())
    run_steps([(model, optimizer)], steps=1, seed=2)
    assert not torch.equal(before[0]["mlm_head.dense.weight"], model.state_dict()["mlm_head.dense.weight"])


@pytest.mark.skipif(not INTERPRETED, reason="run by test_triton_kernel_in_the_interpreter_equals_per_parameter_lamb")
def test_interpreted_pipelined_kernel_equals_the_two_pass_kernel_bitwise(monkeypatch):
    """Both passes in one launch, groups of a few tensors (one empty, one over many blocks), items of 3 blocks,
    a non-finite step among them: the two-pass kernel's weights and moments, bit for bit."""
    small_triton_blocks(monkeypatch)
    monkeypatch.setattr(lamb_triton, "GROUP_BYTES", 12 * 600)
    monkeypatch.setattr(lamb_triton, "ITEM_BLOCKS", 3)
    models, optimizers = [], []
    for schedule in lamb_triton.SCHEDULES:
        model = tiny_model("albert")
        groups = groups_of(model)
        groups[0]["params"].insert(1, torch.zeros(0, requires_grad=True))
        models.append([p for g in groups for p in g["params"]])
        optimizers.append(Lamb(groups, lr=1e-2, weight_decay=0.1))
    assert len(lamb_triton._pipeline(torch.device("cpu"), tuple(p.numel() for p in models[0][:25]),
                                     lamb_triton.GROUP_BYTES)[3]) > 3  # several groups
    generator = torch.Generator().manual_seed(3)
    for found_inf in (0.0, 0.0, 1.0, 0.0):
        grads = [torch.randn(p.shape, generator=generator) * 0.1 for p in models[0]]
        for schedule, params, optimizer in zip(lamb_triton.SCHEDULES, models, optimizers):
            monkeypatch.setattr(lamb_triton, "SCHEDULE", schedule)
            for param, grad in zip(params, grads):
                param.grad = grad.clone()
            optimizer.found_inf = torch.tensor(found_inf)
            assert own_kernel(params) is lamb_triton
            optimizer.step()
        assert all(torch.equal(a, b) for a, b in zip(*models))
        states = [o.state_dict()["state"] for o in optimizers]
        assert all(torch.equal(states[0][i][key], states[1][i][key]) for i in states[0] for key in states[0][i])


def test_pipelined_schedule_takes_each_block_once_per_pass_and_its_pass_two_a_group_later():
    """Blocks of 128 elements, items of up to 3 blocks of one tensor, groups closed at 4800 bytes (400 elements of
    weight and moments)."""
    sizes = (300, 0, 50, 1000, 7, 7, 7, 129)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(lamb_triton, "BLOCK", 128)
        patch.setattr(lamb_triton, "ITEM_BLOCKS", 3)
        items, item_blocks, tensor_group, group_tensors = (t.tolist() for t in lamb_triton._pipeline(
            torch.device("cpu"), sizes, 12 * 400))
    block_tensor = [t for t, size in enumerate(sizes) for _ in range(max(1, -(-size // 128)))]  # empty: one block
    # groups: 300 + 0 + 50 + 1000 elements (closed past 400), then 7 + 7 + 7 + 129 (the last, not full)
    assert group_tensors == [4, 4] and [tensor_group[t] for t in (0, 1, 2, 3, 4, 7)] == [0, 0, 0, 0, 1, 1]
    # items: the 1000-element tensor's 8 blocks as 3 + 3 + 2; the 300-element one's 3 as one
    assert [count for code, count in zip(items, item_blocks) if code % 2 == 0] == [3, 1, 1, 3, 3, 2, 1, 1, 1, 2]
    taken = [(code % 2, code // 2 + b) for code, count in zip(items, item_blocks) for b in range(count)]
    for kind in (0, 1):
        assert sorted(block for k, block in taken if k == kind) == list(range(len(block_tensor)))
    assert all(len({block_tensor[code // 2 + b] for b in range(count)}) == 1 for code, count in zip(items, item_blocks))
    position = {entry: index for index, entry in enumerate(taken)}
    group_of_block = [tensor_group[t] for t in block_tensor]
    for block, group in enumerate(group_of_block):  # pass 2 after its group's pass 1 and the next group's
        later = [b for b, g in enumerate(group_of_block) if g in (group, group + 1)]
        assert position[(1, block)] > max(position[(0, b)] for b in later)


def test_an_unknown_lamb_schedule_is_a_usage_error_naming_the_choices(monkeypatch):
    monkeypatch.setattr(lamb_triton, "SCHEDULE", "one_pass")
    with pytest.raises(UsageError, match="BERTRAIN_LAMB_SCHEDULE='one_pass'.*two_pass or pipelined"):
        lamb_triton.builds(torch.device("cpu"))


def test_lamb_kernels_compile_for_the_gpus_they_serve():
    """Every Triton kernel through Triton's compiler and ptxas for an A100 (sm_80) and an H100/H200 (sm_90), no GPU
    needed: a kernel that only a GPU would reject (e.g. two cache hints PTX cannot combine) fails here."""
    triton = pytest.importorskip("triton", reason="Triton is not installed (.ci/run installs it)")
    try:
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
    except ImportError as error:
        pytest.skip(f"this Triton has no ahead-of-time compiler API: {error}")
    pointer, index, number = "*fp32", "*i64", "fp32"
    blocks = dict(BLOCK=lamb_triton.BLOCK, RATIO_BLOCK=lamb_triton.RATIO_BLOCK)
    signatures = {
        "_moments_and_squares": "addresses:I chunk_tensor:I chunk_start:I numels:I corrections:P found_inf:P "
                                "grad_scale:P partials:P one_minus_beta1:F beta2:F one_minus_beta2:F eps:F "
                                "weight_decay:F BLOCK:C",
        "_count_steps": "addresses:I betas:D found_inf:P corrections:P",
        "_trust_ratios": "partials:P first_chunk:I chunk_count:I scales:P lr:F RATIO_BLOCK:C",
        "_apply": "addresses:I chunk_tensor:I chunk_start:I numels:I corrections:P found_inf:P scales:P eps:F "
                  "weight_decay:F BLOCK:C",
        "_pipelined": "addresses:I items:I item_blocks:I item_count:N chunk_tensor:I chunk_start:I numels:I "
                      "first_chunk:I chunk_count:I tensor_group:I group_tensors:I counters:Q tensor_count:N "
                      "corrections:P found_inf:P grad_scale:P partials:P scales:P lr:F one_minus_beta1:F beta2:F "
                      "one_minus_beta2:F eps:F weight_decay:F BLOCK:C RATIO_BLOCK:C"}
    kinds = dict(P=pointer, I=index, F=number, D="*fp64", N="i32", Q="*i32", C="constexpr")
    for arch in (80, 90):
        for name, text in signatures.items():
            signature = dict((arg, kinds[kind]) for arg, kind in (pair.split(":") for pair in text.split()))
            assert list(signature) == list(getattr(lamb_triton, name).arg_names)
            constants = {k: v for k, v in blocks.items() if k in signature}
            try:
                source = ASTSource(fn=getattr(lamb_triton, name), signature=signature, constexprs=constants)
            except TypeError as error:  # written against Triton 3.9; another version's API is not our failure
                pytest.skip(f"this Triton's ahead-of-time compiler API differs: {error}")
            try:
                compiled = triton.compile(source, target=GPUTarget("cuda", arch, 32),
                                          options=dict(num_warps=lamb_triton.NUM_WARPS, **lamb_triton.FP_FUSION))
            except (RuntimeError, FileNotFoundError) as error:
                if "ptxas" in str(error).lower() and "error" not in str(error).lower():
                    pytest.skip(f"no ptxas with this Triton: {error}")
                raise
            assert ".entry" in compiled.asm["ptx"] and compiled.asm["cubin"], (arch, name)
            if name in ("_moments_and_squares", "_apply", "_pipelined"):  # FP_FUSION's FMAs, whatever the default
                assert "fma.rn.f32" in compiled.asm["ptx"], (arch, name)
