"""An encoder layer's weights in autocast's half type, copied in one kernel a layer and their gradients cast back in one
(EncoderLayer.weights), where autocast casts each weight in a kernel and host op of its own."""

from __future__ import annotations

import torch


def half_copies(tensors: list[torch.Tensor], dtype: torch.dtype) -> list[torch.Tensor]:
    """Copies of `tensors` in `dtype`, all in one kernel (torch._foreach_copy_), outside autograd: ParameterCopies or
    CastCopies connects each use to its parameter. Autocast casts each weight in a kernel and host op of its own: ~600 a
    bert-large step, in a loop the H200 trace found host-bound (2026-11-26)."""
    with torch.no_grad():
        copies = [torch.empty_like(t, dtype=dtype) for t in tensors]
        torch._foreach_copy_(copies, tensors)
    return copies


class ParameterCopies(torch.autograd.Function):
    """(parameters, their half_copies) → the copies, for one application of a layer; backward: the copies' gradients
    cast back to the parameters' dtype, in one kernel. Each application of a shared ALBERT layer has its own, so its
    applications' gradients meet in float32 (AccumulateGrad), not in bf16 as on one copy (autocast's cached casts)."""

    @staticmethod
    def forward(ctx, count: int, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.set_materialize_grads(False)
        ctx.dtypes = [t.dtype for t in tensors[:count]]
        return tuple(half.view_as(half) for half in tensors[count:])  # views: no copy here

    @staticmethod
    def backward(ctx, *grads: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
        return (None, *cast_back(ctx.dtypes, grads), *[None] * len(grads))  # none for the copies: not parameters


class CastCopies(torch.autograd.Function):
    """(dtype, parameters) → their half_copies, made here; backward as ParameterCopies'. For a layer applied once
    (BERT's): one Function over the parameters, where half_copies then ParameterCopies take two steps and a Function
    over twice the tensors, host time a host-bound loop spends on every layer (benchmarks/gpu_step.py's
    bert-large-narrow)."""

    @staticmethod
    def forward(ctx, dtype: torch.dtype, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.set_materialize_grads(False)
        ctx.dtypes = [t.dtype for t in tensors]
        return tuple(half_copies(tensors, dtype))

    @staticmethod
    def backward(ctx, *grads: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
        return (None, *cast_back(ctx.dtypes, grads))


def cast_back(dtypes: list[torch.dtype], grads: tuple[torch.Tensor | None, ...]) -> list[torch.Tensor | None]:
    """The copies' gradients in their parameters' `dtypes`, all in one kernel (None where a copy got none)."""
    given = [i for i, grad in enumerate(grads) if grad is not None]
    results = [torch.empty_like(grads[i], dtype=dtypes[i]) for i in given]
    if results:
        torch._foreach_copy_(results, [grads[i] for i in given])
    out = dict(zip(given, results))
    return [out.get(i) for i in range(len(grads))]
