"""`bertrain inspect-model`: the parameters of each module of the model a config describes, and the published
count of the paper's model of that shape."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import nn

from bertrain.config import ModelConfig
from bertrain.model import build_model

DEFAULT_VOCAB = {"bert": 30522, "albert": 30000}  # bert-base-uncased / albert-base-v2 vocabularies
# (type, hidden, layers, heads, intermediate, embedding) → published parameter count (papers / model cards)
PUBLISHED = {
    ("bert", 768, 12, 12, 3072, None): ("BERT-base", "110M"),
    ("bert", 1024, 24, 16, 4096, None): ("BERT-large", "340M"),
    ("albert", 768, 12, 12, 3072, 128): ("ALBERT-base", "12M"),
    ("albert", 1024, 24, 16, 4096, 128): ("ALBERT-large", "18M"),
    ("albert", 2048, 24, 16, 8192, 128): ("ALBERT-xlarge", "60M"),
    ("albert", 4096, 12, 64, 16384, 128): ("ALBERT-xxlarge", "235M"),
}


@dataclass
class ParameterSummary:
    """What `bertrain inspect-model` prints."""

    model_config: ModelConfig            # with vocab_size set
    rows: list[tuple[str, int, str]]     # (module, parameters, note)
    total: int
    published: tuple[str, str] | None    # (model name, count), e.g. ("BERT-base", "110M")


def _count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def parameter_rows(model: nn.Module) -> list[tuple[str, int, str]]:
    """(module, parameters, note) per module, two levels deep; identical repeated layers fold into one row."""
    rows: list[tuple[str, int, str]] = []

    def visit(name: str, module: nn.Module, depth: int) -> None:
        children = list(module.named_children())
        if isinstance(module, nn.ModuleList) and len(children) > 1:
            counts = {_count(child) for _, child in children}
            if len(counts) == 1:
                rows.append((f"{name}.0–{len(children) - 1}", _count(module), f"{len(children)} × {counts.pop():,}"))
                return
        note = ""
        if name == "encoder.groups":
            note = f"shared: {len(children)} group(s) applied {model.config.num_hidden_layers} times"
        rows.append((name, _count(module), note))
        if depth < 2:
            for child_name, child in children:
                visit(f"{name}.{child_name}", child, depth + 1)

    for name, child in model.named_children():
        visit(name, child, 1)
    rows += [(name, parameter.numel(), "") for name, parameter in model.named_parameters(recurse=False)]
    return rows


def parameter_summary(model_config: ModelConfig, vocab_size: int | None = None) -> ParameterSummary:
    """The model of `model_config`, built on the meta device (shapes only: no memory, no initialization time)."""
    vocab = vocab_size or model_config.vocab_size or DEFAULT_VOCAB[model_config.type]
    c = dataclasses.replace(model_config, vocab_size=vocab)
    with torch.device("meta"):
        model = build_model(c)
    shape = (c.type, c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.intermediate_size,
             c.embedding_size if c.type == "albert" else None)
    return ParameterSummary(c, parameter_rows(model), model.num_parameters(), PUBLISHED.get(shape))
