"""A sequence classification / regression head on our BERT and ALBERT encoders, as transformers'
Bert/AlbertForSequenceClassification: [CLS] → pooler (tanh) → dropout → linear to the labels (1: regression)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from bertrain.batch_layout import Packing
from bertrain.config import AUTO_MIN_PADDED_WIDTH, AUTO_MIN_PADDING_SHARE
from bertrain.model.bert import PreTrainingModel
from bertrain.model.layers import attention_bias, dropout

# transformers' AlbertConfig.classifier_dropout_prob default; BERT uses hidden_dropout_prob (classifier_dropout None).
ALBERT_CLASSIFIER_DROPOUT = 0.1


@dataclass
class ClassifierOutput:
    """Logits [B, labels] and, with labels, the mean loss (cross-entropy, or MSE for one label)."""

    logits: torch.Tensor
    loss: torch.Tensor | None = None


def should_pack(padding_share: float, hidden_size: int, unpad: str = "auto") -> bool:
    """Whether a right-padded batch runs packed (real tokens only): model.unpad's rule (config/schema.py)."""
    if padding_share <= 0 or unpad == "false":
        return False
    return unpad == "true" or padding_share >= AUTO_MIN_PADDING_SHARE or \
        padding_share * hidden_size >= AUTO_MIN_PADDED_WIDTH


class SequenceClassifier(nn.Module):
    """A pretrained encoder's embeddings, encoder and pooler (the same modules, not copies) plus a new linear head.
    The last layer runs only at [CLS], the one row the head reads."""

    def __init__(self, pretrained: PreTrainingModel, num_labels: int, generator: torch.Generator | None = None):
        super().__init__()
        self.config = pretrained.config
        self.num_labels = num_labels
        self.embeddings, self.encoder, self.pooler = pretrained.embeddings, pretrained.encoder, pretrained.pooler
        self.classifier = nn.Linear(self.config.hidden_size, num_labels)
        self.classifier_dropout = (ALBERT_CLASSIFIER_DROPOUT if self.config.type == "albert"
                                   else self.config.hidden_dropout_prob)
        with torch.no_grad():  # BERT's initialization, from the seed's generator
            self.classifier.weight.normal_(0.0, self.config.initializer_range, generator=generator)
            self.classifier.bias.zero_()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                packing: Packing | None = None) -> ClassifierOutput:
        """`packing`: the batch's real tokens only (batch_layout.pack_lengths), else the padded path."""
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        if packing is not None:
            x = self.embeddings(input_ids, token_type_ids, False, packing)  # [N, E]
            first = self.encoder(x, packing, False, packing.first_rows)  # [B, H]
        else:
            x = self.embeddings(input_ids, token_type_ids)  # [B, T, E]
            cls_rows = torch.zeros(input_ids.shape[0], 1, dtype=torch.long, device=input_ids.device)
            first = self.encoder(x, attention_bias(attention_mask), False, cls_rows)[:, 0]  # [B, H]
        pooled = dropout(torch.tanh(self.pooler(first)), self.classifier_dropout, self.training)
        # The head in float32 under autocast too: bf16 keeps 8 bits of a score, so a regression's outputs tied (one
        # distinct value scored a seed Pearson 0.0) and close logits swapped. One small matmul: no cost.
        with torch.autocast(pooled.device.type, enabled=False):
            logits = self.classifier(pooled.float())  # [B, labels]
        loss = None
        if labels is not None:
            if self.num_labels == 1:
                loss = F.mse_loss(logits.float().view(-1), labels.float().view(-1))
            else:
                loss = F.cross_entropy(logits.float(), labels.view(-1))
        return ClassifierOutput(logits, loss)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
