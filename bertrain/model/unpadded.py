"""The unpadded training path: a PreTrainingModel's own modules run on the real tokens only.

The tokens of a micro-batch are one [N, H] tensor (N real tokens, no padding) plus sequence
offsets (packing.py); embeddings, every projection, feed-forward and LayerNorm run on the N rows
and attention stays inside each sequence. No weights are copied: the functions take the model's
Embeddings, encoder layers (ALBERT's E→H mapping and shared groups included), pooler and heads.
It mirrors the padded forward: the last layer runs its output projection and feed-forward only at
[CLS] and predicted rows (needed_rows), gradient checkpointing recomputes each layer in backward,
and the MLM head sees only the predicted rows.

Why: on the prepared CPython docs 18% of the padded tokens at seq 128 and 47-51% at seq 512 are
padding (NSP, over an epoch), and nearly every batch holds one full-length row; see benchmarks/unpad.py. Training
and evaluation use it (PreTrainingModel.forward with labels); inference and export stay padded.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from bertrain.model.layout import BatchLayout
from bertrain.model.packing import Packing, packed_attention

# `auto` takes the unpadded path when padding_share >= AUTO_MIN_PADDING_SHARE, or when padding_share *
# hidden_size >= AUTO_MIN_PADDED_WIDTH. What it saves is the projections and feed-forward on padding
# (~24·H² FLOPs a padded token); what it costs is a few gathers of [N, 3H] rows and one SDPA call per
# bucket in every layer, which at a small H is a fixed cost of the same order as the work saved.
# Measured with benchmarks/unpad.py on this 2-core CPU (training step, real tokens/s, unpadded / padded,
# NSP batches of the pydoc data, load average ~1.5-1.9): seq 128 (16-18% padding): tiny (H 128) 0.94x,
# small (H 256) 1.01x, bert-base (H 768) 1.12x; seq 512 (38-59% padding): tiny 1.30x, small 1.37x,
# bert-base 1.68x. The only loss, tiny at 18%, is the only point below both thresholds.
AUTO_MIN_PADDING_SHARE = 0.30
AUTO_MIN_PADDED_WIDTH = 40.0


def use_unpadded(setting: str, layout: BatchLayout, hidden_size: int) -> bool:
    """Whether a forward with labels takes the unpadded path for `model.unpad` = auto | true | false.

    Host values only (no device read). Never in torch.compile (packing has data-dependent shapes), nor
    when the layout has no packing (rows not right-padded, or labels on padding)."""
    if setting == "false" or layout.packing is None or torch.compiler.is_compiling():
        return False
    share = layout.padding_share
    return setting == "true" or (share > 0 and (share >= AUTO_MIN_PADDING_SHARE
                                                or share * hidden_size >= AUTO_MIN_PADDED_WIDTH))


def packed_embeddings(embeddings: nn.Module, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                      packing: Packing, sparse_grad: bool) -> torch.Tensor:
    """Embeddings.forward on the packed tokens: [N] ids → [N, E], same sums in the same order."""
    embeddings.check_length(packing.width)
    return embeddings.combine(input_ids.reshape(-1).index_select(0, packing.token_index),
                              token_type_ids.reshape(-1).index_select(0, packing.token_index),
                              embeddings.position_embeddings(packing.positions), sparse_grad)


def packed_layer(layer: nn.Module, x: torch.Tensor, packing: Packing, rows: torch.Tensor | None) -> torch.Tensor:
    """EncoderLayer.forward on packed rows x [N, H] → [N, H], or [R, H] at the packed `rows` only."""
    attention = layer.attention
    p = attention.attention_dropout_prob if layer.training else 0.0
    mixed = packed_attention(attention.qkv(x), packing, attention.num_heads, p)   # [N, H]
    if rows is not None:  # later sublayers only where the losses look
        x, mixed = x.index_select(0, rows), mixed.index_select(0, rows)
    return layer.after_attention(x, attention.output(mixed))


def packed_encoder(encoder: nn.Module, x: torch.Tensor, packing: Packing, checkpointing: bool,
                   rows: torch.Tensor | None) -> torch.Tensor:
    """The encoder on packed rows [N, E] → [N, H] ([R, H] at `rows`, which only the last layer uses)."""
    mapping = getattr(encoder, "embedding_to_hidden", None)  # ALBERT's E→H
    if mapping is not None:
        x = mapping(x)
    steps = encoder.steps()
    for i, layer in enumerate(steps):
        last_rows = rows if i == len(steps) - 1 else None
        if checkpointing and torch.is_grad_enabled():
            x = checkpoint(packed_layer, layer, x, packing, last_rows, use_reentrant=False)
        else:
            x = packed_layer(layer, x, packing, last_rows)
    return x


def unpadded_encode(model: nn.Module, input_ids: torch.Tensor, token_type_ids: torch.Tensor, layout: BatchLayout,
                    sparse_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(final hidden states at the predicted positions [N_pred, H] in row-major order, like the padded
    path's; at each sequence's [CLS] [B, H], like hidden[:, 0]). `layout.packing` must be set."""
    packing, predicted_rows = layout.packing, layout.predicted_rows
    rows = torch.cat([packing.first_rows, predicted_rows]) if model.prune_last_layer else None
    x = packed_embeddings(model.embeddings, input_ids, token_type_ids, packing, sparse_grad)
    hidden = packed_encoder(model.encoder, x, packing, model.gradient_checkpointing and model.training, rows)
    if rows is None:
        return hidden.index_select(0, predicted_rows), hidden.index_select(0, packing.first_rows)
    B = layout.batch_size
    return hidden[B:], hidden[:B]
