"""One optimizer step: forward/backward with losses normalized by the step's global count over all ranks and
micro-batches, and an update that skips a non-finite step. No host read: counts come from BatchLayout."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.distributed as dist
from accelerate.optimizer import AcceleratedOptimizer
from accelerate.utils import DistributedType

from bertrain.batch_buffer import to_device
from bertrain.errors import TrainingDiverged
from bertrain.train.signals import requeue_requested, stop_requested

# fairseq's min_loss_scale: no fp16 loss scale below it makes the gradients finite; the loss is diverging.
MIN_LOSS_SCALE = 1e-4
_host_group = None
_end_barriers: list = []  # end_training's barrier works, kept while the process lives


def end_training(accelerator) -> None:
    """accelerator.end_training(), on gloo after a barrier whose work Python keeps. Else gloo's worker thread may free
    that work (and the finished collectives it holds, whose tensors take the GIL to die) just as the main thread,
    holding the GIL, frees the process group and waits for that thread: both wait forever (torch 2.13; 2 of 14
    two-process CPU runs hung at exit on a busy 2-core machine)."""
    if accelerator.num_processes > 1 and dist.is_initialized() and dist.get_backend() == "gloo":
        work = dist.barrier(async_op=True)
        work.wait()
        _end_barriers.append(work)
    accelerator.end_training()


def all_reduce_sum(accelerator, values: list[float]) -> list[float]:
    """`values` summed over all processes (float64); reads them back to the host."""
    tensor = torch.tensor(values, dtype=torch.float64, device=accelerator.device)
    if accelerator.num_processes > 1:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor.tolist()


def host_sum(accelerator, values: list[int]) -> list[int]:
    """Host ints summed over all processes through a CPU (gloo) group: no device involved."""
    global _host_group
    if accelerator.num_processes == 1:
        return list(values)
    if dist.get_backend() != "gloo" and _host_group is None:
        _host_group = dist.new_group(backend="gloo")  # collective: every rank reaches it at its first step
    tensor = torch.tensor(values, dtype=torch.int64)
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=_host_group if dist.get_backend() != "gloo" else None)
    return [int(v) for v in tensor.numpy()]


@dataclass
class StepResult:
    """One step: host counts (global) and device values nobody has read yet (read() does, at log time)."""

    tokens: int
    samples: int
    predicted: int
    labelled: int
    has_sentence: bool
    stop: bool               # a stop signal reached some rank: every rank saves after this step
    requeue: bool            # … and on some rank it was SIGTERM/SIGUSR1 (exit 75), not only Ctrl-C (exit 130)
    sums: torch.Tensor       # [4] float64, this rank: MLM loss sum, MLM correct, sentence loss sum, correct
    grad_norm: torch.Tensor  # global, after DDP's all-reduce
    finite: torch.Tensor     # bool, the same on every rank: loss and gradient norm finite (fp16: the loss)
    clip_to: float | None = None  # the norm optimizer_step clips the gradients to (None: nothing, or done in place)

    def read(self, accelerator) -> dict:
        """The step's metrics as floats (one device read; an all-reduce of the sums first with several ranks)."""
        sums = self.sums
        if accelerator.num_processes > 1:
            sums = sums.clone()
            dist.all_reduce(sums, op=dist.ReduceOp.SUM)
        mlm_sum, mlm_correct, sentence_sum, sentence_correct, grad_norm = torch.cat(
            [sums, self.grad_norm.detach().double().reshape(1)]).tolist()
        predicted, labelled = max(self.predicted, 1), max(self.labelled, 1)
        mlm_loss = mlm_sum / predicted
        sentence_loss = sentence_sum / labelled if self.has_sentence else None
        return {"loss": mlm_loss + (sentence_loss or 0.0), "mlm_loss": mlm_loss, "sentence_loss": sentence_loss,
                "mlm_accuracy": mlm_correct / predicted,
                "sentence_accuracy": sentence_correct / labelled if self.has_sentence else None,
                "grad_norm": grad_norm}


def _metric_sums(out, device) -> torch.Tensor:
    """[MLM loss sum, MLM correct, sentence loss sum, sentence correct] of one micro-batch, float64."""
    zero = torch.zeros((), device=device)
    sums = [out.mlm_loss_sum, out.mlm_correct,
            zero if out.sentence_loss_sum is None else out.sentence_loss_sum,
            zero if out.sentence_correct is None else out.sentence_correct]
    return torch.stack([s.to(torch.float64) for s in sums])


# Where Accelerate's backward divides the loss by 1 and calls loss.backward(): two kernels a micro-batch saved
_PLAIN_BACKWARD = {DistributedType.NO, DistributedType.MULTI_GPU, DistributedType.MULTI_CPU}


def backward(accelerator, loss: torch.Tensor) -> None:
    """accelerator.backward(loss), without its division by the accumulation steps where those are 1 (bitwise the same
    gradients; 44-69 us of host time a micro-batch on a 2-core AMD EPYC, benchmarks/accelerate_wrappers.py)."""
    if getattr(accelerator, "gradient_accumulation_steps", None) == 1 and accelerator.scaler is None and \
            accelerator.distributed_type in _PLAIN_BACKWARD:
        loss.backward()
    else:
        accelerator.backward(loss)


def train_step(model, accelerator, batches: list[dict], max_grad_norm: float | None,
               groups: list[list[torch.nn.Parameter]] | None = None) -> StepResult:
    """Forward/backward over this step's micro-batches (each with its BatchLayout); no device read, no optimizer
    step. `groups`: gradient_groups(model), made once by the caller (else made here)."""
    world, device = accelerator.num_processes, accelerator.device
    layouts = [b["layout"] for b in batches]
    has_sentence = "sentence_label" in batches[0]
    # Instances without a sentence label (one-sentence documents, see data/pairs.py) train MLM only.
    predicted, instances, labelled, tokens = host_sum(accelerator, [
        sum(x.predicted for x in layouts), sum(x.batch_size for x in layouts),
        sum(x.labelled for x in layouts) if has_sentence else 0, sum(x.real_tokens for x in layouts)])
    normalizers = {"mlm_normalizer": max(predicted, 1.0) / world, "sentence_normalizer": max(labelled, 1.0) / world}
    sums = torch.zeros(4, dtype=torch.float64, device=device)
    non_blocking = device.type == "cuda"  # the loader pins batches for a CUDA device
    for index, batch in enumerate(batches):
        batch = to_device(batch, device, non_blocking)
        last = index == len(batches) - 1
        with contextlib.nullcontext() if last else accelerator.no_sync(model):
            out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                        token_type_ids=batch["token_type_ids"], labels=batch["labels"],
                        sentence_label=batch.get("sentence_label"), layout=batch["layout"], **normalizers)
            sums += _metric_sums(out, device)
            loss = out.loss
            if accelerator.scaler is not None:  # fp16: a non-finite loss makes every gradient NaN: the scaler skips
                loss = loss * torch.where(torch.isfinite(loss), 1.0, float("nan"))
            backward(accelerator, loss)
    grad_norm, clip_to = gradient_norm(model, accelerator, max_grad_norm, groups)
    finite = torch.isfinite(sums[0] + sums[2])
    if accelerator.scaler is None:  # fp16's scaler skips overflowed gradients itself, uncounted: not a bad step
        finite = finite & torch.isfinite(grad_norm)
    if world > 1:  # every rank must skip alike: a NaN loss on one rank may leave finite all-reduced gradients
        bad = (~finite).to(torch.int32)
        dist.all_reduce(bad, op=dist.ReduceOp.MAX)
        finite = bad == 0
    stops, requeues = host_sum(accelerator, [int(stop_requested()), int(requeue_requested())])
    return StepResult(tokens, instances, predicted, labelled, has_sentence, stops > 0, requeues > 0, sums, grad_norm,
                      finite, clip_to)


# Accelerate clips these its own way (sharded gradients, or an engine that holds them).
_OWN_CLIPPING = {"FSDP", "DEEPSPEED", "XLA", "MEGATRON_LM"}


def gradient_norm(model, accelerator, max_grad_norm: float | None,
                  groups: list[list[torch.nn.Parameter]] | None = None) -> tuple[torch.Tensor, float | None]:
    """The gradients' global norm, and the norm optimizer_step is left to clip them to. fp16 (whose scaler unscales
    the gradients first) and Accelerate's sharded setups clip here, in place, as torch's clip_grad_norm_."""
    kind = getattr(getattr(accelerator, "distributed_type", None), "value", "NO")
    if accelerator.scaler is not None or kind in _OWN_CLIPPING:
        limit = max_grad_norm if max_grad_norm is not None else float("inf")
        return accelerator.clip_grad_norm_(model.parameters(), limit), None
    return global_norm(gradient_groups(model) if groups is None else groups), max_grad_norm


def gradient_groups(model) -> list[list[torch.nn.Parameter]]:
    """The trainable parameters by device and dtype (a gradient has its parameter's), to list once: walking
    model.parameters() took 0.5-0.9 ms of host time a step at bert_large's 302 tensors (2-core AMD EPYC)."""
    groups: dict = {}
    for param in model.parameters():
        if param.requires_grad:
            groups.setdefault((param.device, param.dtype), []).append(param)
    return list(groups.values())


def global_norm(groups: list[list[torch.nn.Parameter]]) -> torch.Tensor:
    """torch.nn.utils.get_total_norm (2-norm) of the groups' gradients with its kernels (a _foreach_norm per group,
    then the norm of the norms), without its Python per gradient (a type check and a .to() each)."""
    norms: list[torch.Tensor] = []
    for group in groups:
        grads = [param.grad for param in group if param.grad is not None]
        if grads:
            group_norms = torch._foreach_norm(grads)
            if norms and group[0].device != norms[0].device:  # a model over several devices: as get_total_norm
                group_norms = [norm.to(norms[0].device) for norm in group_norms]
            norms.extend(group_norms)
    if not norms:
        return torch.tensor(0.0)
    return torch.linalg.vector_norm(torch.stack(norms))


class LossScale:
    """fp16's grad scaler seen from the loop: whether it applied a step, read once a step (its scale falls exactly
    when it skips one). Accelerate's step_was_skipped is always False for an optimizer that takes found_inf (fused
    AdamW): the scaler calls its step, which then changes nothing."""

    def __init__(self, scaler) -> None:
        self.scaler, self.value = scaler, None

    def step(self, optimizer) -> bool:
        """optimizer.step() through the scaler; whether it updated the weights."""
        if self.value is None:
            self.value = self.scaler.get_scale()  # the checkpoint's, on a resumed run
        optimizer.step()
        before, self.value = self.value, self.scaler.get_scale()
        return self.value >= before

    def check(self, step: int) -> None:
        """Stop a run whose gradients overflow at every scale (fairseq's rule, at its min_loss_scale)."""
        if self.value < MIN_LOSS_SCALE:
            raise TrainingDiverged(
                f"Training stopped at step {step}: the fp16 loss scale fell to {self.value:.3g}, below "
                f"{MIN_LOSS_SCALE:g}: the gradients overflowed however small the scale, and those updates were "
                f"skipped. Lower optim.lr, keep optim.max_grad_norm set, or use bf16 (train.mixed_precision) where "
                f"the GPU has it.")


def too_many_bad_steps(step: int, bad_steps: int, last_checkpoint) -> TrainingDiverged:
    """The error that stops a run after train.max_bad_steps non-finite steps in a row."""
    return TrainingDiverged(
        f"Training stopped at step {step}: {bad_steps} non-finite steps in a row (train.max_bad_steps); their "
        f"updates were not applied and checkpoints are written only after a finite step, so the newest checkpoint "
        f"({last_checkpoint or 'none from this session'}) is finite. Lower optim.lr, keep optim.max_grad_norm set, "
        f"or use bf16 instead of fp16.")


def takes_grad_scale(optimizer) -> bool:
    """Whether `optimizer` (or the one in Accelerate's wrapper) is torch's fused Adam/AdamW or our LAMB: it divides
    each gradient by its `grad_scale` and skips the update where `found_inf` is 1, as it reads them (device scalars,
    no host read)."""
    inner = getattr(optimizer, "optimizer", optimizer)
    return bool(getattr(inner, "accepts_grad_scale", False) or (
        getattr(inner, "_step_supports_amp_scaling", False) and getattr(inner, "defaults", {}).get("fused")))


def clip_scale(grad_norm: torch.Tensor, max_norm: float) -> torch.Tensor:
    """The grad_scale that clips gradients of norm `grad_norm` to `max_norm`, as torch's clip_grad_norm_ does by
    multiplying them by max_norm / (norm + 1e-6) where that is below 1; a pass over every gradient fewer (0.74 ms of
    a bert-large step on the H200, 2026-11-26)."""
    return ((grad_norm + 1e-6) / max_norm).clamp(min=1.0).to(torch.float32)


def unwrap_plain(optimizer):
    """The optimizer inside Accelerate's wrapper where the wrapper's step and zero_grad would only call it (no grad
    scaler, no XLA, gradients synced): they look up a package twice and read a signature each step, 0.20-0.26 ms of
    host time a step on a 2-core AMD EPYC (benchmarks/accelerate_wrappers.py), in a loop the host limits."""
    if type(optimizer) is not AcceleratedOptimizer or optimizer.scaler is not None:
        return optimizer
    synced = optimizer.gradient_state.sync_gradients
    return optimizer.optimizer if synced and optimizer.accelerator_state.distributed_type != DistributedType.XLA \
        else optimizer


def optimizer_step(optimizer, result: StepResult, loss_scale: LossScale | None) -> bool:
    """Clip, step and zero the gradients so that nothing changes where `result.finite` is False, without a host read
    when the optimizer takes `found_inf` (else one sync). Under fp16 the grad scaler skips by itself (`loss_scale`
    reads whether it did). Returns whether the step counts."""
    inner = getattr(optimizer, "optimizer", optimizer)  # inside Accelerate's AcceleratedOptimizer
    optimizer = unwrap_plain(optimizer)  # the wrapper stays where it does more (fp16's scaler: loss_scale.step)
    scaled, clip_to = takes_grad_scale(inner), result.clip_to
    if clip_to is not None and not scaled:  # scaled in place, as torch's clip_grad_norm_ does
        params = [p for group in inner.param_groups for p in group["params"] if p.grad is not None]
        torch.nn.utils.clip_grads_with_norm_(params, clip_to, result.grad_norm)
        clip_to = None
    applied = True
    if loss_scale is not None:
        applied = loss_scale.step(optimizer)
    elif scaled or getattr(inner, "accepts_found_inf", False):
        inner.found_inf = (~result.finite).to(torch.float32)
        if clip_to is not None:
            inner.grad_scale = clip_scale(result.grad_norm, clip_to)
        try:
            optimizer.step()
        finally:
            del inner.found_inf
            inner.__dict__.pop("grad_scale", None)
    elif bool(result.finite):
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return applied


class NonFiniteWatch:
    """Skipped (non-finite) steps counted on the device; read() at log and save time only."""

    def __init__(self) -> None:
        self.counts: torch.Tensor | None = None  # [2] int64: skipped since the last read, skipped in a row now

    def add(self, finite: torch.Tensor) -> None:
        bad = (~finite).to(torch.int64)
        if self.counts is None:
            self.counts = torch.zeros(2, dtype=torch.int64, device=finite.device)
        self.counts = torch.stack([self.counts[0] + bad, (self.counts[1] + 1) * bad])

    def read(self) -> tuple[int, int]:
        """(steps skipped since the last read, steps skipped in a row up to now); one device read."""
        if self.counts is None:
            return 0, 0
        since, in_a_row = self.counts.tolist()
        self.counts = torch.stack([torch.zeros_like(self.counts[0]), self.counts[1]])
        return since, in_a_row
