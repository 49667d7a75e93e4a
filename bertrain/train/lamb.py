"""LAMB in two passes over memory: lamb_triton.py on a GPU, lamb_native.c on the CPU where it builds; else torch's
fused Adam on a scratch U = weight_decay * w (lr = -1) gives LAMB's update in one pass. No host reads. README,
"Performance"."""

from __future__ import annotations

from typing import NamedTuple

import torch

from bertrain.train import lamb_native, lamb_triton
from bertrain.train.adamw import fused_adamw

KEPT_PLANS = 16  # parameter lists whose plan Lamb keeps (one a group and device; more after swapped storages)


class Lamb(torch.optim.Optimizer):
    """LAMB (You et al., 2019): Adam's update + weight_decay * w, rescaled by ||w|| / ||update|| (1 when a norm
    is 0; 1 in a group with `layer_adaptation: False`). Like fused AdamW it takes a `found_inf` device scalar (a
    non-finite step then changes nothing) and a `grad_scale` one that divides each gradient (clipping)."""

    accepts_found_inf = True  # train/step.py's optimizer_step sets `found_inf` instead of reading the flag
    accepts_grad_scale = True  # ... and clips through `grad_scale`, not in place

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-6,
                 weight_decay: float = 0.0, native: bool = True, row_blocks: dict | None = None) -> None:
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay))
        self.native = native  # False: torch ops on every device (for comparisons)
        # {parameter: n}: n weights stacked by rows (attention's fused query/key/value), each with its own trust
        # ratio and step count, as the three tensors of Google's ALBERT and of transformers have.
        self.row_blocks = dict(row_blocks or {})
        for param, count in self.row_blocks.items():
            if param.dim() == 0 or param.shape[0] % count:
                raise ValueError(f"A parameter of shape {tuple(param.shape)} has no {count} row blocks of one size.")
        self._scratch: dict[torch.Tensor, torch.Tensor] = {}
        self._plans: dict[tuple[int, ...], _Plan] = {}

    def __setstate__(self, state: dict) -> None:  # load_state_dict too: the plans' state tensors are replaced
        super().__setstate__(state)
        self._scratch, self._plans = {}, {}

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        found_inf, grad_scale = getattr(self, "found_inf", None), getattr(self, "grad_scale", None)
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            for plan in self._plans_of(params, group) if params else ():
                self._update(plan, group, found_inf, grad_scale)
        return loss

    def _update(self, plan: _Plan, group: dict, found_inf: torch.Tensor | None,
                grad_scale: torch.Tensor | None) -> None:
        """One LAMB update of a plan's parameters (one device) with `group`'s settings, of their gradients divided
        by `grad_scale` where given; none where `found_inf` is 1."""
        whole = plan.whole
        grads = [p.grad for p in whole]
        if any(g.is_sparse or g.dtype != torch.float32 for g in grads):  # one pass for the rare cases
            if any(g.is_sparse for g in grads):
                raise RuntimeError("Lamb does not support sparse gradients.")
            grads = [g if g.dtype == torch.float32 else g.float() for g in grads]
        device = whole[0].device
        if found_inf is not None:
            found_inf = found_inf.to(device, torch.float32)
        if grad_scale is not None:
            grad_scale = grad_scale.to(device, torch.float32)
        params, exp_avgs, exp_avg_sqs, steps = plan.params, plan.exp_avgs, plan.exp_avg_sqs, plan.steps
        adapt = group.get("layer_adaptation", True)
        # a row block of a contiguous gradient is contiguous: eligible as its whole
        kernel = plan.kernel if plan.kernel is not None and plan.kernel.eligible(grads) else None
        if kernel is lamb_triton:  # its table takes the blocks' addresses: no views of the gradients
            addresses = lamb_triton.address_table(device, plan.gradient_addresses(grads), plan.states_at)
            lamb_triton.lamb_update(params, None, exp_avgs, exp_avg_sqs, steps, group["lr"], *group["betas"],
                                    group["eps"], group["weight_decay"], found_inf, grad_scale, addresses)
            return  # the kernel counts the steps, on the device where found_inf is 0: no host time per tensor
        if plan.blocked:  # a row-blocked parameter is its blocks (views, updated in place), a step count each
            grads = _spliced(grads, plan.blocked, [grads[i].chunk(n) for i, n in zip(plan.blocked, plan.counts)])
        torch._foreach_add_(steps, 1)
        if kernel is not None:
            kernel.lamb_update(params, grads, exp_avgs, exp_avg_sqs, steps, group["lr"], *group["betas"],
                               group["eps"], group["weight_decay"], found_inf, grad_scale)
            fused = True
        else:  # no trust ratio: torch's fused AdamW kernel where the device has one
            fused = not adapt and self.native and adamw_step(params, grads, exp_avgs, exp_avg_sqs, steps, group,
                                                              found_inf, grad_scale)
        if fused:
            if found_inf is not None:  # the kernel changed nothing; undo the count
                torch._foreach_sub_(steps, [found_inf] * len(steps))
            return
        updates = [self._scratch_for(p) for p in whole]
        if plan.blocked:
            updates = _spliced(updates, plan.blocked, [updates[i].chunk(n) for i, n in zip(plan.blocked, plan.counts)])
        start_with_weight_decay(updates, params, group["weight_decay"])
        if not add_adam_direction(updates, grads, exp_avgs, exp_avg_sqs, steps, *group["betas"], group["eps"],
                                  found_inf, grad_scale):
            torch._foreach_sub_(steps, 1)  # skipped (the foreach path read found_inf)
            return
        if adapt:
            ratios = trust_ratios(torch.stack(torch._foreach_norm(params, 2, dtype=torch.float32)),
                                  torch.stack(torch._foreach_norm(updates, 2, dtype=torch.float32)))
        else:
            ratios = torch.ones(len(params), device=params[0].device)
        if found_inf is not None:  # the kernel skipped the moments; undo the count, update by zero
            torch._foreach_sub_(steps, [found_inf] * len(steps))
            ratios = torch.where(found_inf > 0, torch.zeros_like(ratios), ratios)  # not 0 * ratio: a NaN norm stays NaN
        torch._foreach_addcmul_(params, updates, list(ratios.unbind(0)), value=-group["lr"])

    def load_state_dict(self, state_dict: dict) -> None:
        """A checkpoint's state, with each group's `layer_adaptation` as this optimizer was built (the checkpoint's
        groups replace the built ones, and one from before the setting has none)."""
        adaptation = [group.get("layer_adaptation") for group in self.param_groups]
        super().load_state_dict(state_dict)
        for group, adapt in zip(self.param_groups, adaptation):
            group.pop("layer_adaptation", None)
            if adapt is not None:
                group["layer_adaptation"] = adapt

    def _plans_of(self, params: list[torch.Tensor], group: dict) -> list[_Plan]:
        """A plan for the parameters of each device among `params` (those with a gradient), made once per list of
        parameters (a swapped .data makes it anew): each state lookup and view costs host time, which the GPU step
        is bound by."""
        key = tuple(p.data_ptr() for p in params)
        plans = self._plans.get(key)
        if plans is None:
            by_device: dict[torch.device, list[torch.Tensor]] = {}
            for param in params:
                by_device.setdefault(param.device, []).append(param)
            if len(self._plans) >= KEPT_PLANS:
                self._plans.pop(next(iter(self._plans)))
            plans = self._plans[key] = [self._plan(on_device, group) for on_device in by_device.values()]
        return plans

    def _plan(self, params: list[torch.Tensor], group: dict) -> _Plan:
        """What _update takes of `params` (one device) besides their gradients: their states (created on first
        use), row-blocked parameters as their blocks, the kernel their tensors allow."""
        states = [self._state(p) for p in params]
        lists = (list(params), [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states],
                 [s["step"] for s in states])
        blocked = [i for i, p in enumerate(params) if p in self.row_blocks]
        counts = [self.row_blocks[params[i]] for i in blocked]
        if blocked:
            pieces = [[t.chunk(n) for t in (lists[0][i], lists[1][i], lists[2][i])] + [lists[3][i].unbind(0)]
                      for i, n in zip(blocked, counts)]
            lists = tuple(_spliced(listed, blocked, [piece[k] for piece in pieces]) for k, listed in enumerate(lists))
        adapt = group.get("layer_adaptation", True)
        kernel = own_kernel(*lists) if self.native and adapt else None
        weights, exp_avgs, exp_avg_sqs, steps = lists
        states_at = [tuple(t.data_ptr() for t in tensors) for tensors in zip(exp_avgs, exp_avg_sqs, weights, steps)
                     ] if kernel is lamb_triton else []
        return _Plan(list(params), *lists, blocked, counts, kernel, states_at)

    def _state(self, param: torch.Tensor) -> dict:
        """The parameter's step / exp_avg / exp_avg_sq, created on first use; `step` lives on the parameter's
        device (the per-parameter LAMB kept it on the CPU; the kernels read it on the device)."""
        state = self.state[param]
        if not state:  # created where it is used: a copy to the GPU would wait for the host
            state["step"] = torch.zeros((), dtype=torch.float32, device=param.device)
            state["exp_avg"] = torch.zeros_like(param, dtype=torch.float32)
            state["exp_avg_sq"] = torch.zeros_like(param, dtype=torch.float32)
        if state["step"].device != param.device or state["step"].dtype != torch.float32:
            state["step"] = state["step"].to(param.device, torch.float32)
        blocks = self.row_blocks.get(param, 1)
        if blocks > 1 and state["step"].dim() == 0:  # one count per row block (also from an older checkpoint)
            state["step"] = state["step"].repeat(blocks)
        elif blocks == 1 and state["step"].dim() > 0:  # a row-blocked checkpoint in a LAMB without row blocks
            state["step"] = state["step"][0].clone()
        return state

    def _scratch_for(self, param: torch.Tensor) -> torch.Tensor:
        buffer = self._scratch.get(param)
        if buffer is None or buffer.shape != param.shape or buffer.device != param.device:
            buffer = self._scratch[param] = torch.empty_like(param, dtype=torch.float32,
                                                             memory_format=torch.contiguous_format)
        return buffer


class _Plan(NamedTuple):
    """Lamb._plan's parameters as given (whole), its lists (blocks spliced in), the blocked parameters' indices and
    block counts, and the kernel."""

    whole: list
    params: list
    exp_avgs: list
    exp_avg_sqs: list
    steps: list
    blocked: list[int]
    counts: list[int]
    kernel: object
    states_at: list  # (exp_avg, exp_avg_sq, param, step) addresses of each tensor of `params`: lamb_triton's table

    def gradient_addresses(self, grads: list[torch.Tensor]) -> list[int]:
        """The gradients' addresses in the order of `params`: a row-blocked one's blocks at their offsets."""
        addresses = [g.data_ptr() for g in grads]
        if self.blocked:
            pieces = [[addresses[i] + k * (grads[i].numel() // n) * grads[i].element_size() for k in range(n)]
                      for i, n in zip(self.blocked, self.counts)]
            addresses = _spliced(addresses, self.blocked, pieces)
        return addresses


def _spliced(tensors: list, at: list[int], pieces: list) -> list:
    """`tensors` with the one at each index of `at` (ascending) replaced by the tensors of its piece."""
    out, last = [], 0
    for index, piece in zip(at, pieces):
        out.extend(tensors[last:index])
        out.extend(piece)
        last = index + 1
    out.extend(tensors[last:])
    return out


def own_kernel(*tensor_lists: list[torch.Tensor]):
    """The two-pass kernel for these tensors (float32, contiguous): lamb_triton on a GPU with Triton, lamb_native
    on the CPU where a C compiler built it; None elsewhere (torch ops)."""
    tensors = [t for tensors in tensor_lists for t in tensors]
    if lamb_triton.eligible(tensors) and lamb_triton.builds(tensors[0].device):
        return lamb_triton
    if tensors[0].device.type == "cpu" and lamb_native.library() is not None and lamb_native.eligible(tensors):
        return lamb_native
    return None


def adamw_step(params: list, grads: list, exp_avgs: list, exp_avg_sqs: list, steps: list, group: dict,
               found_inf: torch.Tensor | None, grad_scale: torch.Tensor | None = None) -> bool:
    """A group without layer adaptation: Adam's step plus decoupled weight decay, which is LAMB's update with a
    trust ratio of 1, by torch's fused AdamW kernel (steps already counted). False where the device has none."""
    try:
        fused_adamw(params, grads, exp_avgs, exp_avg_sqs, steps, group, grad_scale, found_inf)
    except (NotImplementedError, RuntimeError):
        return False
    return True


def start_with_weight_decay(updates: list[torch.Tensor], params: list[torch.Tensor], weight_decay: float) -> None:
    """updates = weight_decay * params (the Adam direction is added on top)."""
    if not weight_decay:
        torch._foreach_zero_(updates)
    elif updates[0].device.type == "cpu":  # one pass instead of foreach copy + multiply
        for update, param in zip(updates, params):
            torch.mul(param, weight_decay, out=update)
    else:
        torch._foreach_copy_(updates, params)
        torch._foreach_mul_(updates, weight_decay)


def add_adam_direction(updates: list, grads: list, exp_avgs: list, exp_avg_sqs: list, steps: list,
                       beta1: float, beta2: float, eps: float, found_inf: torch.Tensor | None = None,
                       grad_scale: torch.Tensor | None = None) -> bool:
    """Update the Adam moments in place (from the gradients divided by `grad_scale` where given) and add
    m̂ / (sqrt(v̂) + eps) to `updates` (steps already counted); where `found_inf` is 1 the fused kernel changes
    nothing. False: skipped by the foreach fallback."""
    try:  # lr = -1 turns the kernel's `w -= lr * direction` into `U += direction`
        torch._fused_adam_(updates, grads, exp_avgs, exp_avg_sqs, [], steps, lr=-1.0, beta1=beta1, beta2=beta2,
                           weight_decay=0.0, eps=eps, amsgrad=False, maximize=False, grad_scale=grad_scale,
                           found_inf=found_inf)
    except (NotImplementedError, RuntimeError):  # a device without the fused kernel: same maths, foreach ops
        if found_inf is not None and bool(found_inf):  # one host read, on such devices only
            return False
        if grad_scale is not None:
            grads = torch._foreach_div(grads, grad_scale)
        add_adam_direction_foreach(updates, grads, exp_avgs, exp_avg_sqs, steps, beta1, beta2, eps)
    return True


def add_adam_direction_foreach(updates: list, grads: list, exp_avgs: list, exp_avg_sqs: list, steps: list,
                               beta1: float, beta2: float, eps: float) -> None:
    """add_adam_direction with plain foreach ops, bias corrections kept on the device (no host read)."""
    torch._foreach_lerp_(exp_avgs, grads, 1 - beta1)
    torch._foreach_mul_(exp_avg_sqs, beta2)
    torch._foreach_addcmul_(exp_avg_sqs, grads, grads, value=1 - beta2)
    correction1 = torch._foreach_neg(torch._foreach_pow(beta1, steps))
    torch._foreach_add_(correction1, 1)
    correction2_sqrt = torch._foreach_neg(torch._foreach_pow(beta2, steps))
    torch._foreach_add_(correction2_sqrt, 1)
    torch._foreach_sqrt_(correction2_sqrt)
    denominators = torch._foreach_sqrt(exp_avg_sqs)
    torch._foreach_div_(denominators, correction2_sqrt)
    torch._foreach_add_(denominators, eps)
    torch._foreach_mul_(denominators, correction1)
    torch._foreach_addcdiv_(updates, exp_avgs, denominators)


def trust_ratios(weight_norms: torch.Tensor, update_norms: torch.Tensor) -> torch.Tensor:
    """||w|| / ||update|| per tensor where both are positive, else 1 (computed on the device, no host read)."""
    usable = (weight_norms > 0) & (update_norms > 0)
    return torch.where(usable, weight_norms / update_norms, torch.ones_like(weight_norms))
