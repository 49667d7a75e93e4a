"""BERT for pretraining: encoder, pooler, MLM head (tied decoder) and the 2-way sentence head (NSP).

`PreTrainingModel` holds everything BERT and ALBERT share (embeddings, pooler, heads, losses);
subclasses name their encoder. In training the MLM head runs only at positions whose label
is not -100: full-vocabulary logits at every position are most of the step for small models.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from bertrain.model.layers import (Embeddings, EncoderLayer, MLMHead, attention_bias, init_weights, needed_rows,
                                   run_layer)


def embedding_size(config) -> int:
    """E: ALBERT's factorized embedding size, or H (BERT, or ALBERT with embedding_size null)."""
    return config.embedding_size if config.type == "albert" and config.embedding_size else config.hidden_size


@dataclass
class PreTrainingOutput:
    """What the model returns; losses are None when their labels are not given."""

    loss: torch.Tensor | None
    mlm_loss: torch.Tensor | None
    sentence_loss: torch.Tensor | None
    # [N, V] at labels != -100 (row-major) with labels, else [B, T, V]. In training (grad enabled, no
    # autocast) they live in a buffer the next forward overwrites, and carry no gradient.
    mlm_logits: torch.Tensor
    sentence_logits: torch.Tensor  # [B, 2]


class PreTrainingModel(nn.Module):
    """Shared pretraining wrapper: encode → pool [CLS] → MLM and sentence heads → losses."""

    prune_last_layer = True  # with labels, run the last layer only where the losses look (needed_rows)
    sparse_embedding_grad = True  # with labels, see Embeddings.forward

    def __init__(self, config, encoder_class: type[nn.Module]):
        super().__init__()
        self.config = config
        self.gradient_checkpointing = config.gradient_checkpointing
        H, E = config.hidden_size, embedding_size(config)
        self.embeddings = Embeddings(config.vocab_size, E, config.max_position_embeddings, config.type_vocab_size,
                                     config.layer_norm_eps, config.hidden_dropout_prob)
        self.encoder = encoder_class(config)
        self.pooler = nn.Linear(H, H)
        self.mlm_head = MLMHead(H, E, config.vocab_size, config.hidden_act, config.layer_norm_eps)
        self.sentence_head = nn.Linear(H, 2)
        init_weights(self, config.initializer_range)

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
               token_type_ids: torch.Tensor | None, sparse_grad: bool = False,
               rows: torch.Tensor | None = None) -> torch.Tensor:
        """Final hidden states [B, T, H], or [B, K, H] at `rows` (see needed_rows; sparse_grad: see
        Embeddings.forward)."""
        x = self.embeddings(input_ids, token_type_ids, sparse_grad)  # [B, T, E]
        return self.encoder(x, attention_bias(attention_mask), self.gradient_checkpointing and self.training, rows)

    @property
    def decoder_weight(self) -> torch.Tensor:
        """The MLM decoder weight: the word embeddings themselves (tied)."""
        return self.embeddings.word_embeddings.weight

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                sentence_label: torch.Tensor | None = None) -> PreTrainingOutput:
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        mlm_loss = sentence_loss = loss = None
        if labels is None:
            hidden = self.encode(input_ids, attention_mask, token_type_ids)  # [B, T, H]
            mlm_logits = self.mlm_head(hidden, self.decoder_weight)  # [B, T, V], for inference
        else:
            predicted = labels != -100
            targets = labels[predicted]  # [N], row-major like hidden[predicted] below
            # With labels the tied decoder always yields a dense embedding gradient, so the lookup's can be sparse.
            sparse_grad = (self.sparse_embedding_grad and self.training and torch.is_grad_enabled()
                           and self.decoder_weight.requires_grad
                           and not torch.compiler.is_compiling())
            rows = needed_rows(predicted) if self.prune_last_layer else None
            hidden = self.encode(input_ids, attention_mask, token_type_ids, sparse_grad, rows)  # [B, K or T, H]
            if rows is not None:
                predicted = predicted.gather(1, rows)  # [B, K]; padding rows are never predicted
            # Gather first, then transform and decode: N ≈ 15% of B*T rows instead of all of them.
            mlm_loss, mlm_logits = self.mlm_head.loss(hidden[predicted], self.decoder_weight, targets)
            loss = mlm_loss
        sentence_logits = self.sentence_head(torch.tanh(self.pooler(hidden[:, 0])))  # [B, 2]; rows start with [CLS]
        if sentence_label is not None:
            sentence_loss = F.cross_entropy(sentence_logits.float(), sentence_label.view(-1))
            loss = sentence_loss if loss is None else loss + sentence_loss
        elif loss is not None and self.training:
            # Same value; keeps pooler and sentence head in the graph so DDP (objective none) finds a
            # gradient for every parameter without find_unused_parameters.
            loss = loss + 0.0 * sentence_logits.sum()
        return PreTrainingOutput(loss, mlm_loss, sentence_loss, mlm_logits, sentence_logits)

    def num_parameters(self) -> int:
        """Unique parameters (shared ALBERT layers and the tied decoder counted once)."""
        return sum(p.numel() for p in self.parameters())


class BertEncoder(nn.Module):
    """A stack of independent post-LayerNorm layers."""

    def __init__(self, config):
        super().__init__()
        self.layers = nn.ModuleList(EncoderLayer(config) for _ in range(config.num_hidden_layers))

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, checkpointing: bool = False,
                rows: torch.Tensor | None = None) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            x = run_layer(layer, x, mask, checkpointing, rows if i == len(self.layers) - 1 else None)
        return x


class BertPreTrainingModel(PreTrainingModel):
    """BERT (Devlin et al. 2018) with MLM and NSP heads, weights laid out like BertForPreTraining."""

    def __init__(self, config):
        super().__init__(config, BertEncoder)
