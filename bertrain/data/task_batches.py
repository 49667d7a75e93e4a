"""A fine-tuning task's examples as token ids ([CLS] A [SEP] (B [SEP]), truncated longest text first) and batches
padded to their own longest example (dynamic padding), with the packing of their real tokens."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
from tokenizers import Tokenizer

from bertrain.batch_layout import Packing, pack_lengths
from bertrain.data.task_files import Examples
from bertrain.special_tokens import SPECIAL_TOKENS


@dataclass
class EncodedSplit:
    """Token ids and token types of every example, concatenated, with each example's offset and length."""

    ids: np.ndarray        # [total tokens] int64
    types: np.ndarray      # [total tokens] int64
    offsets: np.ndarray    # [examples]
    lengths: np.ndarray    # [examples]
    labels: np.ndarray     # [examples] int64 class ids or float32 targets
    max_length: int        # the truncation length, within the model's position table

    def __len__(self) -> int:
        return len(self.lengths)


@dataclass
class TaskBatch:
    """One batch: right-padded [B, T] tensors, labels [B], and the packing of its real tokens."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    token_type_ids: torch.Tensor
    labels: torch.Tensor
    packing: Packing | None = None


def pad_id(tokenizer: Tokenizer) -> int:
    """The tokenizer's padding token id ([PAD] or <pad>), else 0 as transformers' BertConfig."""
    for tokens in SPECIAL_TOKENS.values():
        token_id = tokenizer.token_to_id(tokens["pad"])
        if token_id is not None:
            return token_id
    return 0


def encode(tokenizer: Tokenizer, examples: Examples, max_length: int, regression: bool) -> EncodedSplit:
    """Tokenize every example in batches (the tokenizer's post-processor adds [CLS] and [SEP])."""
    tokenizer = Tokenizer.from_str(tokenizer.to_str())  # a copy: truncation and padding are set on it
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length, strategy="longest_first")
    ids, types, lengths = [], [], []
    chunk = 4096
    for start in range(0, len(examples.texts), chunk):
        texts = examples.texts[start:start + chunk]
        inputs = [t[0] if len(t) == 1 else (t[0], t[1]) for t in texts]
        for encoding in tokenizer.encode_batch(inputs):
            ids.append(np.asarray(encoding.ids, dtype=np.int64))
            types.append(np.asarray(encoding.type_ids, dtype=np.int64))
            lengths.append(len(encoding.ids))
    lengths_array = np.asarray(lengths, dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths_array)[:-1]]).astype(np.int64)
    labels = np.asarray(examples.labels, dtype=np.float32 if regression else np.int64)
    return EncodedSplit(np.concatenate(ids), np.concatenate(types), offsets, lengths_array, labels, max_length)


def collate(split: EncodedSplit, indices: np.ndarray, pad_token_id: int,
            pack_when: Callable[[float], bool] | None = None, multiple_of: int = 1) -> TaskBatch:
    """The batch of these examples, padded to the longest (rounded up to `multiple_of`, but never past the
    truncation length: a position table of 100 would have no row for a width of 104); packed when
    `pack_when(padding share)` says so."""
    lengths = split.lengths[indices]
    longest = int(lengths.max())
    width = min(-(-longest // multiple_of) * multiple_of, max(longest, split.max_length))
    ids = np.full((len(indices), width), pad_token_id, dtype=np.int64)
    types = np.zeros((len(indices), width), dtype=np.int64)
    columns = np.arange(width)[None, :]
    real = columns < lengths[:, None]
    source = (split.offsets[indices][:, None] + columns)[real]
    ids[real], types[real] = split.ids[source], split.types[source]
    share = 1.0 - float(real.mean())
    packing = pack_lengths(lengths, width)[0] if pack_when is not None and pack_when(share) else None
    return TaskBatch(torch.from_numpy(ids), torch.from_numpy(real.astype(np.int64)), torch.from_numpy(types),
                     torch.from_numpy(split.labels[indices]), packing)
