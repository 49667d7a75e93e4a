"""Parameter groups, AdamW / LAMB, and learning-rate schedules."""

from __future__ import annotations

import math

import torch

from bertrain.config import OptimConfig
from bertrain.errors import ConfigError
from bertrain.train.adamw import FusedAdamW
from bertrain.train.lamb import Lamb


def parameter_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Decay on weight matrices and embeddings, none on biases and LayerNorm; each tensor once, with names."""
    decay, no_decay = {}, {}
    seen: set[int] = set()
    for module_name, module in model.named_modules():
        for name, param in module.named_parameters(recurse=False):
            if id(param) in seen or not param.requires_grad:
                continue
            seen.add(id(param))
            full_name = f"{module_name}.{name}" if module_name else name
            if isinstance(module, torch.nn.LayerNorm) or name == "bias" or name.endswith("_bias"):
                no_decay[full_name] = param
            else:
                decay[full_name] = param
    return [
        {"params": list(decay.values()), "names": list(decay), "weight_decay": weight_decay},
        {"params": list(no_decay.values()), "names": list(no_decay), "weight_decay": 0.0},
    ]


def optimizer_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """parameter_groups without their names: the groups as an optimizer takes them."""
    return [{k: v for k, v in group.items() if k != "names"} for group in parameter_groups(model, weight_decay)]


def lamb_groups(groups: list[dict]) -> list[dict]:
    """parameter_groups' two groups (decay, no decay) as LAMB takes them: as Google's LAMB (BERT, ALBERT:
    exclude_from_layer_adaptation defaults to the decay exclusions) and NVIDIA's (use_nvlamb off), no trust ratio
    for what has no weight decay, the biases and LayerNorms. AdamW ignores the setting."""
    decay, no_decay = groups
    return [decay, dict(no_decay, layer_adaptation=False)]


def row_blocks_of(model: torch.nn.Module) -> dict[torch.Tensor, int]:
    """{parameter: n} of the modules that stack n weights by rows (`row_blocks`, e.g. the fused query/key/value)."""
    return {param: module.row_blocks for module in model.modules() if getattr(module, "row_blocks", 1) > 1
            for param in module.parameters(recurse=False)}


def fused_supported(device: torch.device) -> bool:
    """Whether torch's fused AdamW runs on this device (CPU since torch 2.4, CUDA, MPS...)."""
    try:
        probe = torch.zeros(1, device=device, requires_grad=True)
        optimizer = torch.optim.AdamW([probe], fused=True)
        probe.grad = torch.zeros_like(probe)
        optimizer.step()
        return True
    except (RuntimeError, TypeError, ValueError):
        return False


def build_optimizer(model: torch.nn.Module, config: OptimConfig,
                    device: torch.device | None = None) -> torch.optim.Optimizer:
    """AdamW (torch's fused kernel through FusedAdamW where the device has it, else foreach) or LAMB over
    `parameter_groups`."""
    groups = optimizer_groups(model, config.weight_decay)
    betas = (float(config.betas[0]), float(config.betas[1]))
    if config.name == "lamb":
        return Lamb(lamb_groups(groups), lr=config.lr, betas=betas, eps=config.eps, row_blocks=row_blocks_of(model))
    if config.name == "adamw":
        device = device or next(model.parameters()).device
        if fused_supported(device):  # torch's fused kernel, its lists kept between steps (host time)
            return FusedAdamW(groups, lr=config.lr, betas=betas, eps=config.eps)
        return torch.optim.AdamW(groups, lr=config.lr, betas=betas, eps=config.eps, foreach=True)
    raise ConfigError(f"Config key 'optim.name': unknown optimizer {config.name!r} (adamw or lamb).")


def warmup_steps_for(config: OptimConfig, total_steps: int) -> int:
    """Warmup length in steps: `warmup_fraction` of the total when set, else `warmup_steps`."""
    if config.warmup_fraction is not None:
        return int(round(config.warmup_fraction * total_steps))
    return config.warmup_steps


class LRSchedule:
    """Multiplier of the peak lr after `step` optimizer steps: linear warmup, then linear/cosine/constant."""

    def __init__(self, schedule: str, warmup_steps: int, total_steps: int) -> None:
        if schedule not in ("linear", "cosine", "constant"):
            raise ConfigError(f"Config key 'optim.schedule': unknown schedule {schedule!r}.")
        self.schedule, self.warmup_steps, self.total_steps = schedule, warmup_steps, max(total_steps, 1)

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return step / self.warmup_steps
        if self.schedule == "constant":
            return 1.0
        progress = (step - self.warmup_steps) / max(self.total_steps - self.warmup_steps, 1)
        progress = min(max(progress, 0.0), 1.0)
        if self.schedule == "linear":
            return 1.0 - progress
        return 0.5 * (1.0 + math.cos(math.pi * progress))


def build_scheduler(optimizer: torch.optim.Optimizer, config: OptimConfig,
                    total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """A LambdaLR stepped once per optimizer step (lr of step s+1 is peak * multiplier(s))."""
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, LRSchedule(config.schedule, warmup_steps_for(config, total_steps), total_steps))


def apply_settings(optimizer: torch.optim.Optimizer, scheduler: torch.optim.lr_scheduler.LambdaLR,
                   config: OptimConfig, step: int, total_steps: int | None = None
                   ) -> torch.optim.lr_scheduler.LambdaLR:
    """After `--force`: the loaded optimizer follows `config` (lr, betas, eps, weight decay) and a new schedule of
    `config.schedule` (`total_steps` long, or as long as the loaded one when None) continues at `step`; returns it."""
    loaded = scheduler.lr_lambdas[0]
    if total_steps is None:
        schedule = LRSchedule(config.schedule, loaded.warmup_steps, loaded.total_steps)
    else:
        schedule = LRSchedule(config.schedule, warmup_steps_for(config, total_steps), total_steps)
    betas = (float(config.betas[0]), float(config.betas[1]))
    for group, decay in zip(optimizer.param_groups, (config.weight_decay, 0.0)):
        group.update(weight_decay=decay, eps=config.eps, betas=betas, initial_lr=config.lr)
    return continue_schedule(optimizer, schedule, step)


def stretch_schedule(optimizer: torch.optim.Optimizer, scheduler: torch.optim.lr_scheduler.LambdaLR, step: int,
                     total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """The loaded schedule with a new length (a longer budget), continuing at `step`; returns it. The decay ends at
    the new total as if planned from the start (the lr rises to where it would be); the warmup keeps its length."""
    loaded = scheduler.lr_lambdas[0]
    return continue_schedule(optimizer, LRSchedule(loaded.schedule, loaded.warmup_steps, total_steps), step)


def continue_schedule(optimizer: torch.optim.Optimizer, schedule: LRSchedule, step: int
                      ) -> torch.optim.lr_scheduler.LambdaLR:
    """A scheduler following `schedule` from optimizer step `step` on (the groups' initial_lr is the peak)."""
    # last_epoch = step - 1: the scheduler's first step (in its constructor) sets the lr of `step`.
    return torch.optim.lr_scheduler.LambdaLR(optimizer, schedule, last_epoch=step - 1)
