"""torch's fused AdamW with its host time cut: the lists each step hands the kernel (parameters, states, step
counts) kept between steps, where torch's step rebuilds them (~0.4 ms of host time a bert-large step on a 2-core
Xeon, more on the H200 machine's host; a GPU loop that the host limits pays it in full). The same kernel with the
same arguments as torch's: bitwise torch's AdamW(fused=True), and the same state_dict."""

from __future__ import annotations

from typing import NamedTuple

import torch

KEPT_PLANS = 16  # parameter lists whose plan is kept (one a group; more where some steps leave gradients out)


class FusedAdamW(torch.optim.AdamW):
    """AdamW(fused=True) whose step reuses each parameter list's states and step counts (made once, a plan)
    instead of looking them up for every tensor each step; torch's own step makes the states on the first step and
    serves what the plan does not take (amsgrad, maximize, capturable, a tensor lr, several devices or dtypes)."""

    def __init__(self, params, **kwargs) -> None:
        super().__init__(params, fused=True, **kwargs)
        self._plans: dict[tuple[int, ...], _Plan] = {}

    def __setstate__(self, state: dict) -> None:  # load_state_dict too: the plans' state tensors are replaced
        super().__setstate__(state)
        self._plans = {}

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        work = []
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            plan = self._plan(params, group) if params else None
            if params and plan is None:
                super().step()  # torch's, for every group (its first step makes the states)
                return loss
            work += [(group, plan)] if params else []
        grad_scale, found_inf = getattr(self, "grad_scale", None), getattr(self, "found_inf", None)
        for group, plan in work:
            device = plan.params[0].device
            scale = None if grad_scale is None else grad_scale.to(device, non_blocking=True)
            inf = None if found_inf is None else found_inf.to(device, non_blocking=True)
            torch._foreach_add_(plan.steps, 1)
            fused_adamw(plan.params, [p.grad for p in plan.params], plan.exp_avgs, plan.exp_avg_sqs, plan.steps, group,
                        scale, inf)
            if inf is not None:  # the kernel changed nothing; undo the count, as torch's step does
                torch._foreach_sub_(plan.steps, [inf] * len(plan.steps))
        return loss

    def _plan(self, params: list[torch.Tensor], group: dict) -> _Plan | None:
        """The plan of `params` (those of `group` with a gradient), made once per list of parameters (the kernel
        takes the parameters themselves: a swapped .data is stepped as torch's step would); None where torch's step
        must serve: a setting the plan does not take, or a parameter without its state yet."""
        if (group["amsgrad"] or group["maximize"] or group["capturable"] or group["differentiable"]
                or not group["fused"] or not group.get("decoupled_weight_decay", True)
                or isinstance(group["lr"], torch.Tensor) or any(isinstance(b, torch.Tensor) for b in group["betas"])):
            return None
        key = tuple(map(id, params))  # the plan holds them: no other parameter takes their ids while it is kept
        if key not in self._plans:
            states = [self.state.get(p) for p in params]
            if (not all(states) or len({(p.device, p.dtype) for p in params}) > 1
                    or any(s["step"].device != params[0].device for s in states)):
                return None  # not kept: the next step (after torch's made the states) plans again
            if len(self._plans) >= KEPT_PLANS:
                self._plans.pop(next(iter(self._plans)))
            self._plans[key] = _Plan(params, [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states],
                                     [s["step"] for s in states])
        return self._plans[key]


def fused_adamw(params: list, grads: list, exp_avgs: list, exp_avg_sqs: list, steps: list, group: dict,
                grad_scale: torch.Tensor | None = None, found_inf: torch.Tensor | None = None) -> None:
    """torch's fused AdamW kernel on these lists with `group`'s lr, betas, weight decay and eps (steps already
    counted); each gradient divided by `grad_scale`, nothing changed where `found_inf` is 1."""
    torch._fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, [], steps, amsgrad=False, lr=group["lr"],
                        beta1=group["betas"][0], beta2=group["betas"][1], weight_decay=group["weight_decay"],
                        eps=group["eps"], maximize=False, grad_scale=grad_scale, found_inf=found_inf)


class _Plan(NamedTuple):
    """A parameter list's states, in its order."""

    params: list
    exp_avgs: list
    exp_avg_sqs: list
    steps: list
