"""Packed (unpadded) sequences: the real tokens of a micro-batch as one [N, ...] tensor plus offsets,
and attention that never crosses sequences.

Kernel choice (measured on this 2-core AVX2 CPU, torch 2.13, forward + backward of the attention
alone on NSP batches of the prepared CPython docs, medians of 5 alternated runs on a loaded machine):

| shape              | padded + key mask | nested (jagged) SDPA | loop, 1 SDPA/seq | length buckets |
|--------------------|-------------------|----------------------|------------------|----------------|
| T 128, B 32, 768/12 | 1979 ms          | 18648 ms             | 2040 ms          | 1104 ms        |
| T 128, B 32, 256/4  | 417 ms           | 1650 ms              | 749 ms           | 609 ms         |
| T 512, B 8, 768/12  | 940 ms           | 6187 ms              | 898 ms           | 1304 ms        |
| T 512, B 8, 256/4   | 969 ms           | 6340 ms              | 826 ms           | 908 ms         |

- Nested tensors (jagged layout): on CUDA SDPA dispatches them to the variable-length flash /
  efficient kernels (cu_seqlens, no mask), but on CPU only to the math path through strided nested
  tensors: 4-10x slower than padding, with a first call of 6-12 s.
- FlexAttention with a document mask: "FlexAttention does not support backward on CPU" (it raises),
  it needs torch.compile to be fast, and it has no attention-probability dropout (BERT uses 0.1).
- Length buckets (this module): sort the sequences by length, cut them into at most MAX_BUCKETS
  groups that minimise the padded attention area, pad each group only to its own longest
  sequence and run the dense F.scaled_dot_product_attention per group: its fused flash kernel on
  CPU, flash (no mask, equal lengths) or memory-efficient attention with a broadcast [b, 1, 1, T]
  key mask on CUDA — never a materialized [T, T] mask — and dropout works as in the padded path.
  Attention is a small share of a layer (4·T·H of ~24·H² + 4·T·H FLOPs a token); what unpadding
  saves is the projections and feed-forward on padding, which buckets keep, at the cost of one
  gather in and one gather out per layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

MAX_BUCKETS = 4  # more buckets: less padded attention, more kernel calls per layer


def _moved(tensor: torch.Tensor | None, device, non_blocking: bool) -> torch.Tensor | None:
    return None if tensor is None else tensor.to(device, non_blocking=non_blocking)


def _pinned(tensor: torch.Tensor | None) -> torch.Tensor | None:
    return None if tensor is None else tensor.pin_memory()


@dataclass
class Bucket:
    """Sequences attended together, packed rows start..start+size-1 (longest first), viewed as
    [b, width] slots. Equal lengths: the rows themselves, no copy, no mask. Otherwise `gather` [b*width]
    pads each sequence by repeating its last row, `key_mask` [b, 1, 1, width] hides those keys and
    `inside` [size] picks the real slots of the output."""

    start: int
    size: int
    shape: tuple[int, int]
    gather: torch.Tensor | None = None
    key_mask: torch.Tensor | None = None
    inside: torch.Tensor | None = None

    def to(self, device, non_blocking: bool = False) -> "Bucket":
        return Bucket(self.start, self.size, self.shape, *(_moved(t, device, non_blocking)
                                                           for t in (self.gather, self.key_mask, self.inside)))

    def pin_memory(self) -> "Bucket":
        return Bucket(self.start, self.size, self.shape, *(_pinned(t) for t in (self.gather, self.key_mask,
                                                                                 self.inside)))


@dataclass
class Packing:
    """Where the real tokens of a right-padded [B, T] batch are in the packed rows, and the attention plan.

    Packed rows hold the sequences longest first (bucket order), each sequence's tokens in order, so
    a bucket of equal lengths is a plain slice of the rows. Built on the host from the lengths alone
    (the collator does it, so the step never reads the mask back from the device)."""

    token_index: torch.Tensor  # [N] flat index b*T + t of each packed row
    positions: torch.Tensor    # [N] position t of each packed row in its sequence
    first_rows: torch.Tensor   # [B] packed row of each sequence's first token ([CLS]), in batch order
    buckets: list[Bucket]
    width: int                 # T

    def to(self, device, non_blocking: bool = False) -> "Packing":
        return Packing(*(t.to(device, non_blocking=non_blocking)
                         for t in (self.token_index, self.positions, self.first_rows)),
                       [b.to(device, non_blocking) for b in self.buckets], self.width)

    def pin_memory(self) -> "Packing":
        return Packing(*(t.pin_memory() for t in (self.token_index, self.positions, self.first_rows)),
                       [b.pin_memory() for b in self.buckets], self.width)


def is_right_padded(real: np.ndarray) -> bool:
    """True when every row is real tokens from position 0 followed only by padding (what the loader
    makes); the packed path needs it (a row's [CLS] and positions stay where the padded path has them)."""
    lengths = real.sum(1)
    prefix = np.arange(real.shape[1])[None, :] < lengths[:, None]
    return bool((lengths > 0).all()) and bool((prefix == real).all())


def plan_buckets(lengths: np.ndarray, max_buckets: int = MAX_BUCKETS) -> list[np.ndarray]:
    """Sequence indices per bucket: contiguous runs of the lengths sorted longest first, cut (dynamic
    programming, O(K·B²)) to minimise Σ size·longest², the attention work including padding."""
    order = np.argsort(-lengths, kind="stable")
    longest = lengths[order].astype(np.float64)
    B = len(longest)
    i, j = np.arange(B)[:, None], np.arange(B + 1)[None, :]
    cost = np.where(j > i, (j - i) * longest[:, None] ** 2, np.inf)  # [B, B+1]: one bucket of sorted i..j-1
    best = cost[0].copy()  # best[j]: cheapest cut of the first j sequences (one bucket so far)
    best[0] = 0.0
    choices = [np.zeros(B + 1, dtype=np.int64)]
    for _ in range(min(max_buckets, B) - 1):
        total = best[:B, None] + cost  # [B, B+1]: the last bucket starts at i
        start = total.argmin(0)
        split = total[start, np.arange(B + 1)]
        better = split < best  # ties keep fewer buckets
        choices.append(np.where(better, start, -1))
        best = np.where(better, split, best)
    bounds, end = [], B
    for choice in reversed(choices):  # walk back from the last round
        if end == 0:
            break
        if choice[end] >= 0:
            bounds.append((int(choice[end]), end))
            end = int(choice[end])
    return [order[s:e] for s, e in reversed(bounds)]


def _tensor(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a))


def _bucket(members: np.ndarray, lengths: np.ndarray, start: int) -> Bucket:
    size = lengths[members]
    b, width = len(members), int(size.max())
    if bool((size == width).all()):
        return Bucket(start, b * width, (b, width))
    column = np.arange(width)[None, :]
    seq_start = start + np.concatenate([[0], np.cumsum(size)[:-1]])
    gather = seq_start[:, None] + np.minimum(column, size[:, None] - 1)         # [b, width]
    inside = column < size[:, None]
    return Bucket(start, int(size.sum()), (b, width), _tensor(gather.reshape(-1).astype(np.int64)),
                  _tensor(inside)[:, None, None, :], _tensor(np.flatnonzero(inside).astype(np.int64)))


def pack_lengths(lengths: np.ndarray, width: int, max_buckets: int = MAX_BUCKETS) -> tuple[Packing, np.ndarray]:
    """(the packing of right-padded rows of these lengths as CPU tensors, [B, T] packed row of each
    position (garbage at padding)); host work only."""
    lengths = np.asarray(lengths, dtype=np.int64)
    buckets, start, order = [], 0, []
    for members in plan_buckets(lengths, max_buckets):
        buckets.append(_bucket(members, lengths, start))
        start += int(lengths[members].sum())
        order.append(members)
    sequence = np.concatenate(order)                                           # batch rows, packed order
    sorted_lengths = lengths[sequence]
    sequence_start = np.concatenate([[0], np.cumsum(sorted_lengths)[:-1]])
    position = np.arange(start) - np.repeat(sequence_start, sorted_lengths)   # [N]
    token_index = np.repeat(sequence, sorted_lengths) * width + position
    first = np.empty(len(lengths), dtype=np.int64)
    first[sequence] = sequence_start
    packing = Packing(_tensor(token_index.astype(np.int64)), _tensor(position.astype(np.int64)), _tensor(first),
                      buckets, width)
    return packing, first[:, None] + np.arange(width)[None, :]


def packed_attention(qkv: torch.Tensor, packing: Packing, num_heads: int, dropout_p: float) -> torch.Tensor:
    """[N, 3H] fused query/key/value rows → [N, H] attention output; each row attends only to the
    real tokens of its own sequence (one dense SDPA per length bucket)."""
    H = qkv.shape[1] // 3
    d = H // num_heads
    outputs = []
    for bucket in packing.buckets:
        b, width = bucket.shape
        if bucket.gather is None:
            slots = qkv[bucket.start:bucket.start + bucket.size]                  # a view: no copy
        else:
            slots = qkv.index_select(0, bucket.gather)                           # [b*width, 3H]
        q, k, v = slots.view(b, width, 3, num_heads, d).permute(2, 0, 3, 1, 4)  # 3 × [b, heads, width, d]
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=bucket.key_mask, dropout_p=dropout_p)
        y = y.transpose(1, 2).reshape(b * width, H)
        outputs.append(y if bucket.inside is None else y.index_select(0, bucket.inside))
    return outputs[0] if len(outputs) == 1 else torch.cat(outputs)             # [N, H]
