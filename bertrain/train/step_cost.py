"""What a training step costs on this device: its FLOPs, the device's matmul rate and one timed forward + backward
pass; the dry run's estimate and `train.threads: auto`'s measurements both use them."""

from __future__ import annotations

import time

import torch

from bertrain.config import ModelConfig

# A training step reaches only part of a device's plain matmul rate (attention, softmax, layer norm, memory
# traffic): the share assumed when a time is estimated from FLOPs alone.
MATMUL_SHARE = 0.5


def training_flops(model: ModelConfig, sequences: int, seq_len: int, mlm_probability: float) -> float:
    """Forward + backward FLOPs of one micro-batch of `sequences` x `seq_len` tokens (3 x the forward pass)."""
    h, layers, inner = model.hidden_size, model.num_hidden_layers, model.intermediate_size
    embedding = model.embedding_size or h
    per_token = layers * (2 * (4 * h * h + 2 * h * inner) + 4 * seq_len * h)   # projections, FFN, attention
    per_token += 2 * embedding * h if embedding != h else 0                     # ALBERT's E → H projection
    per_token += mlm_probability * 2 * (h * embedding + embedding * int(model.vocab_size or 0))  # MLM head
    return 3.0 * per_token * sequences * seq_len


def matmul_rate(accelerator) -> float:
    """FLOP/s of square matmuls on this process's device, in the run's autocast precision (~0.1 s)."""
    device = accelerator.device
    n = 2048 if device.type == "cuda" else 384
    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    with accelerator.autocast():
        torch.matmul(a, b)  # warm-up
        _synchronize(device)
        begin, repeats = time.perf_counter(), 0
        while repeats < 3 or (time.perf_counter() - begin < 0.1 and repeats < 200):
            torch.matmul(a, b)
            repeats += 1
        _synchronize(device)
    return 2.0 * n ** 3 * repeats / max(time.perf_counter() - begin, 1e-9)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def forward_backward(model, accelerator, batch: dict) -> None:
    """One forward + backward pass of `batch` on the process's device, in the run's autocast, waited for."""
    device = accelerator.device
    model.to(device).train()
    with accelerator.autocast():
        loss = model(**{k: v.to(device) for k, v in batch.items()}).loss
    loss.backward()
    _synchronize(device)


def measure_micro_batch(model, accelerator, batch: dict, warmup_rows: int = 1) -> float:
    """Seconds of one forward + backward pass of `batch`, after a warm-up pass on its first `warmup_rows`
    sequences (first-call allocations and kernel choice stay out of the measurement); no optimizer step."""
    # The model makes the warm-up part's layout.
    forward_backward(model, accelerator, {k: v[:warmup_rows] for k, v in batch.items() if k != "layout"})
    model.zero_grad(set_to_none=True)
    begin = time.perf_counter()
    forward_backward(model, accelerator, batch)
    seconds = time.perf_counter() - begin
    model.zero_grad(set_to_none=True)
    return seconds
