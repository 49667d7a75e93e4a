"""Optimizer parameter groups, AdamW / LAMB and lr schedules against independent references."""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from bertrain.config import ModelConfig, OptimConfig
from bertrain.errors import ConfigError
from bertrain.model import build_model
from bertrain.train.optim import (Lamb, LRSchedule, apply_settings, build_optimizer, build_scheduler, optimizer_groups,
                                  parameter_groups, warmup_steps_for)
from bertrain.train.step import (StepResult, backward, global_norm, gradient_groups, gradient_norm, optimizer_step,
                                 unwrap_plain)
from tests.helpers import OneProcess, assert_rounding_close


def tiny_model(kind: str):
    config = ModelConfig(type=kind, vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=64, max_position_embeddings=64, hidden_dropout_prob=0.0,
                         attention_probs_dropout_prob=0.0,
                         embedding_size=16 if kind == "albert" else None)
    return build_model(config)


@pytest.mark.parametrize("kind", ["bert", "albert"])
def test_parameter_groups_split_every_parameter_once(kind):
    model = tiny_model(kind)
    decay, no_decay = parameter_groups(model, weight_decay=0.01)
    assert decay["weight_decay"] == 0.01 and no_decay["weight_decay"] == 0.0
    # Each unique parameter (tied decoder = word embeddings, shared ALBERT layers) in exactly one group.
    grouped = [id(p) for p in decay["params"] + no_decay["params"]]
    assert len(grouped) == len(set(grouped))
    assert set(grouped) == {id(p) for p in model.parameters()}
    assert len(decay["names"]) == len(decay["params"]) and len(no_decay["names"]) == len(no_decay["params"])

    layer_norm_params = {id(p) for m in model.modules() if isinstance(m, torch.nn.LayerNorm) for p in m.parameters()}
    biases = {id(p) for name, p in model.named_parameters() if name.endswith("bias")}
    assert layer_norm_params and biases
    assert {id(p) for p in no_decay["params"]} == layer_norm_params | biases
    # What is decayed: matrices and embeddings only (independent of how the groups were found).
    assert all(p.ndim == 2 for p in decay["params"])
    assert "embeddings.word_embeddings.weight" in decay["names"]
    assert "embeddings.position_embeddings.weight" in decay["names"]
    assert not any("norm" in name for name in decay["names"])
    if kind == "albert":
        assert "encoder.embedding_to_hidden.weight" in decay["names"]


@pytest.mark.cross_path
def test_adamw_is_fused_on_cpu_and_matches_reference_adamw():
    torch.manual_seed(0)
    model = tiny_model("bert")
    reference_model = tiny_model("bert")
    reference_model.load_state_dict(model.state_dict())
    config = OptimConfig(lr=1e-2, weight_decay=0.1, betas=[0.9, 0.98], eps=1e-6)
    optimizer = build_optimizer(model, config)
    assert optimizer.defaults.get("fused") is True
    reference = torch.optim.AdamW(optimizer_groups(reference_model, 0.1), lr=1e-2,
                                  betas=(0.9, 0.98), eps=1e-6, foreach=False)
    ids = torch.randint(5, 120, (4, 16))
    for m, opt in ((model, optimizer), (reference_model, reference)):
        for _ in range(3):
            out = m(ids, torch.ones_like(ids), torch.zeros_like(ids))
            out.mlm_logits.float().pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
    # 3 steps, each summing over the vocabulary or the batch's tokens (fused: the same maths, other rounding).
    for (name, a), (_, b) in zip(model.named_parameters(), reference_model.named_parameters()):
        assert_rounding_close(a, b, max(120, ids.numel()), steps=3, name=name)
    # Decay applies to matrices only: with zero gradients (and fresh moments) only they shrink.
    optimizer = build_optimizer(model, config)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()
    for name, p in model.named_parameters():
        if p.ndim == 2:  # w·(1 - lr·wd): one product (K = 1)
            assert not torch.equal(p.detach(), before[name]), name
            assert_rounding_close(p.detach(), before[name] * (1 - 1e-2 * 0.1), 1, name=name)
        else:
            assert torch.equal(p.detach(), before[name]), name


@pytest.mark.cross_path
def test_lamb_step_matches_hand_computed_formula():
    torch.manual_seed(1)
    weight = torch.randn(5, 3)
    grad = torch.randn(5, 3)
    param = torch.nn.Parameter(weight.clone())
    optimizer = Lamb([param], lr=0.1, betas=(0.9, 0.99), eps=1e-6, weight_decay=0.01)
    param.grad = grad.clone()
    optimizer.step()
    # Step 1 by hand: m̂ = g, v̂ = g², update = g / (|g| + eps) + wd * w, ratio = ||w|| / ||update||.
    update = grad / (grad.abs() + 1e-6) + 0.01 * weight
    ratio = weight.norm() / update.norm()
    assert_rounding_close(param.detach(), weight - 0.1 * ratio * update, weight.numel())  # K: the norms' sums


@pytest.mark.cross_path
def test_lamb_trust_ratio_is_one_for_zero_weights_and_it_minimizes():
    param = torch.nn.Parameter(torch.zeros(4))
    optimizer = Lamb([param], lr=0.5, eps=1e-6)
    grad = torch.tensor([1.0, -1.0, 2.0, -2.0])
    param.grad = grad.clone()
    optimizer.step()
    assert_rounding_close(param.detach(), -0.5 * grad / (grad.abs() + 1e-6), 1)  # element-wise: K = 1

    target = torch.tensor([3.0, -2.0, 0.5])
    x = torch.nn.Parameter(torch.ones(3))
    optimizer = Lamb([x], lr=0.05)
    for _ in range(300):
        optimizer.zero_grad()
        ((x - target) ** 2).sum().backward()
        optimizer.step()
    # LAMB's steps scale with ||x||, so it hovers near the optimum: 1% of the initial loss.
    assert ((x.detach() - target) ** 2).sum() < 0.01 * ((torch.ones(3) - target) ** 2).sum()


def test_lamb_from_config_uses_the_same_groups():
    model = tiny_model("albert")
    optimizer = build_optimizer(model, OptimConfig(name="lamb", weight_decay=0.02))
    assert isinstance(optimizer, Lamb)
    assert [g["weight_decay"] for g in optimizer.param_groups] == [0.02, 0.0]


@pytest.mark.parametrize("schedule", ["linear", "cosine", "constant"])
def test_schedules_match_transformers(schedule):
    from transformers import (get_constant_schedule_with_warmup, get_cosine_schedule_with_warmup,
                              get_linear_schedule_with_warmup)

    def fresh():
        return torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=2.0)

    ours_optimizer = fresh()
    ours = build_scheduler(ours_optimizer, OptimConfig(schedule=schedule, warmup_steps=10, lr=2.0), total_steps=50)
    theirs_optimizer = fresh()
    theirs = {"linear": lambda o: get_linear_schedule_with_warmup(o, 10, 50),
              "cosine": lambda o: get_cosine_schedule_with_warmup(o, 10, 50),
              "constant": lambda o: get_constant_schedule_with_warmup(o, 10)}[schedule](theirs_optimizer)
    for _ in range(51):  # past the end transformers' cosine rises again; ours stays at 0
        assert ours.get_last_lr()[0] == pytest.approx(theirs.get_last_lr()[0], abs=1e-12)
        ours_optimizer.step(), theirs_optimizer.step()
        ours.step(), theirs.step()


def test_schedule_shape_and_warmup_fraction():
    linear = LRSchedule("linear", warmup_steps=4, total_steps=12)
    assert [linear(s) for s in (0, 2, 4, 8, 12, 20)] == [0.0, 0.5, 1.0, 0.5, 0.0, 0.0]
    cosine = LRSchedule("cosine", warmup_steps=0, total_steps=10)
    assert cosine(5) == pytest.approx(0.5) and cosine(10) == pytest.approx(0.0)
    assert math.isclose(LRSchedule("constant", 2, 10)(9), 1.0)
    assert warmup_steps_for(OptimConfig(warmup_steps=7, warmup_fraction=0.25), 40) == 10
    assert warmup_steps_for(OptimConfig(warmup_steps=7), 40) == 7
    with pytest.raises(ConfigError):
        LRSchedule("exponential", 0, 10)


def test_scheduler_state_round_trips():
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = build_scheduler(optimizer, OptimConfig(warmup_steps=3), total_steps=10)
    for _ in range(5):
        optimizer.step()
        scheduler.step()
    state = scheduler.state_dict()
    optimizer2 = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler2 = build_scheduler(optimizer2, OptimConfig(warmup_steps=3), total_steps=10)
    scheduler2.load_state_dict(state)
    for _ in range(3):
        optimizer.step(), optimizer2.step()
        scheduler.step(), scheduler2.step()
        assert scheduler.get_last_lr() == scheduler2.get_last_lr()


def _stepped(config: OptimConfig, total_steps: int, steps: int):
    model = tiny_model("bert")
    optimizer = build_optimizer(model, config)
    scheduler = build_scheduler(optimizer, config, total_steps)
    for _ in range(steps):
        optimizer.step()
        scheduler.step()
    return optimizer, scheduler


@pytest.mark.parametrize("new_length", [None, 12])
def test_forced_settings_replace_the_loaded_ones_from_the_checkpoint_step_on(new_length):
    old = OptimConfig(lr=1e-3, warmup_steps=2, weight_decay=0.01, betas=[0.9, 0.999], eps=1e-6)
    saved_optimizer, saved_scheduler = _stepped(old, total_steps=8, steps=3)
    new = OptimConfig(lr=1e-2, warmup_steps=4, weight_decay=0.1, betas=[0.8, 0.95], eps=1e-8, schedule="cosine")
    optimizer, scheduler = _stepped(new, total_steps=8, steps=0)  # what a resumed run builds, then loads
    optimizer.load_state_dict(saved_optimizer.state_dict())
    scheduler.load_state_dict(saved_scheduler.state_dict())
    scheduler = apply_settings(optimizer, scheduler, new, step=3, total_steps=new_length)

    for group, decay in zip(optimizer.param_groups, (0.1, 0.0)):
        assert (group["weight_decay"], group["betas"], group["eps"]) == (decay, (0.8, 0.95), 1e-8)
    # The loaded length keeps its warmup (2 of 8); a new length derives it from the new config.
    reference = LRSchedule("cosine", 2, 8) if new_length is None else LRSchedule("cosine", 4, new_length)
    for step in range(3, 9):
        assert scheduler.get_last_lr() == pytest.approx([1e-2 * reference(step)] * 2, abs=1e-15), step
        assert [g["lr"] for g in optimizer.param_groups] == scheduler.get_last_lr()
        optimizer.step()
        scheduler.step()
    # Its state round-trips like any scheduler's (the next checkpoint saves it).
    _, resumed = _stepped(new, total_steps=8, steps=0)
    resumed.load_state_dict(scheduler.state_dict())
    assert resumed.get_last_lr() == scheduler.get_last_lr()
    resumed.optimizer.step(), resumed.step(), scheduler.optimizer.step(), scheduler.step()
    assert resumed.get_last_lr() == scheduler.get_last_lr()


class Calls(TorchDispatchMode):
    """Each op's name, its keyword arguments and the data pointers of its tensor arguments, in order."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        tensors = [t for a in args for t in (a if isinstance(a, (list, tuple)) else [a]) if isinstance(t, torch.Tensor)]
        self.calls.append((func.overloadpacket.__name__, kwargs or {}, {t.data_ptr() for t in tensors}))
        return func(*args, **(kwargs or {}))


def set_random_gradients(model: torch.nn.Module, step: int) -> None:
    """Gradients of norm ~10, the same for every model at the same step."""
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=torch.Generator().manual_seed(step)) * 10 / 200


def _clipped_steps(optimizer_of, max_grad_norm: float, steps: int = 3) -> tuple[torch.nn.Module, list, list]:
    """`steps` steps of a tiny BERT through gradient_norm + optimizer_step, each on gradients of norm ~10: the
    model, the gradient norms, each step's ops in optimizer_step (names and keyword arguments)."""
    torch.manual_seed(0)
    model = tiny_model("bert")
    optimizer = optimizer_of(model)
    norms, ops = [], []
    for step in range(steps):
        set_random_gradients(model, step)
        norm, clip_to = gradient_norm(model, OneProcess(), max_grad_norm)
        result = StepResult(0, 0, 0, 0, False, False, False, torch.zeros(4), norm, torch.isfinite(norm), clip_to)
        grads = {p.grad.data_ptr() for p in model.parameters()}
        with Calls() as calls:
            optimizer_step(optimizer, result, loss_scale=None)
        norms.append(norm)
        ops.append([(name, kwargs, bool(pointers & grads)) for name, kwargs, pointers in calls.calls])
    return model, norms, ops


def _torch_clipped_steps(optimizer_of, max_grad_norm: float, steps: int = 3) -> tuple[torch.nn.Module, list]:
    """The same steps as _clipped_steps through torch's clip_grad_norm_ and optimizer.step()."""
    torch.manual_seed(0)
    model = tiny_model("bert")
    optimizer = optimizer_of(model)
    norms = []
    for step in range(steps):
        set_random_gradients(model, step)
        norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return model, norms


CONFIG = OptimConfig(lr=1e-2, weight_decay=0.1, betas=[0.9, 0.98], eps=1e-6)


def _unfused(model):
    groups = optimizer_groups(model, 0.1)
    return torch.optim.AdamW(groups, lr=1e-2, betas=(0.9, 0.98), eps=1e-6, foreach=True)


@pytest.mark.parametrize("max_grad_norm", [1.0, 1e6])
def test_clipping_is_fused_adamws_grad_scale_and_matches_torchs_clip_grad_norm(max_grad_norm):
    """Fused AdamW reads the clipping as grad_scale, a divisor it applies as it reads each gradient: no pass over the
    gradients of its own (0.74 ms of a bert-large step on the H200). The same steps as torch's clip_grad_norm_:
    bitwise when nothing is clipped (a divisor of 1), within rounding when clipped (x / s against x * (1 / s))."""
    model, norms, ops = _clipped_steps(lambda m: build_optimizer(m, CONFIG), max_grad_norm)
    reference, reference_norms = _torch_clipped_steps(lambda m: build_optimizer(m, CONFIG), max_grad_norm)
    assert all(torch.equal(a, b) for a, b in zip(norms, reference_norms))  # the same norm function
    clipped = max_grad_norm < min(float(n) for n in norms)
    assert clipped or max_grad_norm > max(float(n) for n in norms)
    for step_ops, norm in zip(ops, norms):
        assert {name for name, _, reads_grads in step_ops if reads_grads} == {"_fused_adamw_"}, step_ops
        scales = [kwargs["grad_scale"] for name, kwargs, _ in step_ops if name == "_fused_adamw_"]
        assert len(scales) == 2  # the two parameter groups, each with the step's divisor
        expected = (norm + 1e-6) / max_grad_norm if clipped else torch.tensor(1.0)
        assert all(float(s) == float(expected) for s in scales), (scales, expected)
    for (name, a), (_, b) in zip(model.named_parameters(), reference.named_parameters()):
        if clipped:
            assert_rounding_close(a, b, 1, steps=3, name=name)
        else:
            assert torch.equal(a, b), name


def test_the_gradient_norm_over_parameters_listed_once_is_torchs_get_total_norm():
    """gradient_groups lists the trainable parameters once by device and dtype; global_norm runs get_total_norm's
    kernels on their gradients: bitwise its norm on one group, and within rounding of it over several dtypes (the
    groups' order may differ from torch's), frozen parameters and missing gradients left out as torch leaves them."""
    torch.manual_seed(0)
    model = tiny_model("bert")
    set_random_gradients(model, 0)
    groups = gradient_groups(model)
    assert len(groups) == 1 and groups[0] == [p for p in model.parameters()]
    grads = [p.grad for p in model.parameters()]
    assert torch.equal(global_norm(groups), torch.nn.utils.get_total_norm(grads))
    for step in (1, 2):  # new gradient tensors each step (zero_grad sets them to None): read at each call
        set_random_gradients(model, step)
        assert torch.equal(global_norm(groups), torch.nn.utils.get_total_norm([p.grad for p in model.parameters()]))

    mixed = torch.nn.ParameterList([torch.nn.Parameter(torch.randn(n, dtype=dtype) * scale)
                                    for n, dtype, scale in ((300, torch.float32, 1.0), (70, torch.bfloat16, 3.0),
                                                            (50, torch.float64, 0.5), (20, torch.float32, 2.0),
                                                            (10, torch.bfloat16, 1.0))])
    mixed[3].requires_grad_(False)
    for p in mixed:
        p.grad = torch.randn_like(p) if p.requires_grad else None
    mixed[4].grad = None  # a trainable parameter that got no gradient this step
    groups = gradient_groups(mixed)
    assert [[p.dtype for p in group] for group in groups] == [[torch.float32], [torch.bfloat16] * 2, [torch.float64]]
    expected = torch.nn.utils.get_total_norm([p.grad for p in mixed if p.grad is not None])
    norm = global_norm(groups)
    assert norm.dtype == expected.dtype
    assert_rounding_close(norm, expected, reduction_length=3)  # the norm of 3 tensor norms in another order
    by_hand = math.sqrt(sum(float(p.grad.double().square().sum()) for p in mixed if p.grad is not None))
    assert abs(float(norm) - by_hand) <= torch.finfo(torch.bfloat16).eps * by_hand  # bf16 norms: one rounding each
    assert float(global_norm([[mixed[3]]])) == 0.0  # nothing with a gradient: torch's empty norm


@pytest.mark.parametrize("optimizer_name", ["adamw", "lamb"])
def test_optimizer_step_skips_accelerates_wrapper_where_it_only_passes_the_call_on(fresh_accelerate, monkeypatch,
                                                                                    optimizer_name):
    """Accelerate's optimizer wrapper, without a grad scaler, only calls the optimizer (after a package lookup and a
    signature read, host time each step): optimizer_step calls the optimizer itself, and the steps are bitwise those
    made through the wrapper."""
    from accelerate import Accelerator
    from accelerate.optimizer import AcceleratedOptimizer

    accelerator = Accelerator(cpu=True)
    config = OptimConfig(name=optimizer_name, lr=1e-2, weight_decay=0.1, betas=[0.9, 0.98], eps=1e-6)
    through_wrapper, _, _ = _clipped_steps(lambda m: accelerator.prepare_optimizer(build_optimizer(m, config)), 1.0)
    assert accelerator.prepare_optimizer(build_optimizer(tiny_model("bert"), config)).step_was_skipped is False

    def refuse(*args, **kwargs):
        raise AssertionError("optimizer_step went through Accelerate's wrapper")

    monkeypatch.setattr(AcceleratedOptimizer, "step", refuse)
    monkeypatch.setattr(AcceleratedOptimizer, "zero_grad", refuse)
    direct, _, _ = _clipped_steps(lambda m: accelerator.prepare_optimizer(build_optimizer(m, config)), 1.0)
    for (name, a), (_, b) in zip(through_wrapper.named_parameters(), direct.named_parameters()):
        assert torch.equal(a, b), name

    wrapper = accelerator.prepare_optimizer(build_optimizer(tiny_model("bert"), config))
    assert unwrap_plain(wrapper) is wrapper.optimizer and unwrap_plain(wrapper.optimizer) is wrapper.optimizer
    wrapper.scaler = torch.amp.GradScaler("cpu")  # fp16: the wrapper's step runs the scaler's
    assert unwrap_plain(wrapper) is wrapper
    wrapper.scaler = None
    # inside accelerator.accumulate, before the last micro-batch, the wrapper skips (GradientState is process-wide)
    monkeypatch.setattr(accelerator.gradient_state, "sync_gradients", False)
    assert unwrap_plain(wrapper) is wrapper


def test_backward_skips_accelerates_division_by_one_with_the_same_gradients(fresh_accelerate, monkeypatch):
    """Accelerate's backward divides the loss by its accumulation steps first: where those are 1, train_step's
    backward calls loss.backward() itself, and the gradients are bitwise those of accelerator.backward."""
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)
    grads = []
    for through_accelerate in (True, False):
        torch.manual_seed(0)
        model = tiny_model("bert")
        ids = torch.randint(5, 120, (2, 16), generator=torch.Generator().manual_seed(1))
        loss = model(input_ids=ids, labels=torch.where(ids % 3 == 0, ids, -100)).loss
        if through_accelerate:
            accelerator.backward(loss)
        else:
            monkeypatch.setattr(Accelerator, "backward", lambda self, loss: pytest.fail("went through Accelerate"))
            backward(accelerator, loss)
        grads.append([p.grad for p in model.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*grads))

    called = []
    monkeypatch.setattr(Accelerator, "backward", lambda self, loss: called.append(loss))
    monkeypatch.setattr(accelerator, "gradient_accumulation_steps", 2)  # Accelerate's own accumulation divides by 2
    backward(accelerator, torch.ones((), requires_grad=True))
    assert len(called) == 1


def test_clipping_for_other_optimizers_scales_the_gradients_in_place_as_torch_does():
    model, norms, _ = _clipped_steps(_unfused, 1.0)
    reference, reference_norms = _torch_clipped_steps(_unfused, 1.0)
    assert all(float(n) > 1.0 for n in norms)  # every step clipped
    for (name, a), (_, b) in zip(model.named_parameters(), reference.named_parameters()):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("native", [True, False], ids=["kernel", "torch ops"])
def test_lamb_clips_through_its_grad_scale_as_torchs_clip_grad_norm(native):
    """LAMB takes the clipping as grad_scale too (its kernels divide as they read; tests/test_lamb.py checks them
    bitwise against divided gradients): torch's clip_grad_norm_ then LAMB, within rounding; no op but the fused
    Adam kernels reads a gradient (LAMB's own kernel is no torch op)."""
    def optimizer_of(model):
        optimizer = build_optimizer(model, OptimConfig(name="lamb", lr=1e-2))
        optimizer.native = native
        return optimizer

    model, norms, ops = _clipped_steps(optimizer_of, 1.0)
    reference, _ = _torch_clipped_steps(optimizer_of, 1.0)
    assert all(float(n) > 1.0 for n in norms)  # every step clipped
    for step_ops, norm in zip(ops, norms):
        reading = {name for name, _, reads_grads in step_ops if reads_grads}
        assert reading <= {"_fused_adam_", "_fused_adamw_", "split"}, reading  # split: row blocks' views, no pass
        scales = [kwargs["grad_scale"] for name, kwargs, _ in step_ops if name in ("_fused_adam_", "_fused_adamw_")]
        assert scales and all(float(s) == float((norm + 1e-6) / 1.0) for s in scales), scales
    for (name, a), (_, b) in zip(model.named_parameters(), reference.named_parameters()):
        assert_rounding_close(a, b, a.numel(), steps=3, name=name)  # a norm over the tensor: K its elements
