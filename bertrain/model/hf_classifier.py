"""A fine-tuned SequenceClassifier as a transformers Bert/AlbertForSequenceClassification directory (the encoder's
names from hf.py's name map; the head is `classifier`), and our model plus tokenizer for a MODEL argument."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from bertrain import rundir
from bertrain.errors import DataError
from bertrain.files import honour_umask
from bertrain.model import PreTrainingModel
from bertrain.model.classifier import ALBERT_CLASSIFIER_DROPOUT, SequenceClassifier
from bertrain.model.from_checkpoint import model_from_checkpoint
from bertrain.model.hf import HF_WEIGHTS, _pad_token_id, hf_config, import_hf, name_map, write_tokenizer_files

ENCODER_PARTS = ("embeddings.", "encoder.", "pooler.")


def classifier_state_dict(model: SequenceClassifier) -> dict[str, torch.Tensor]:
    """The classifier's weights under transformers' names (qkv split into query, key, value)."""
    ours = model.state_dict()
    state = {}
    for name, theirs in name_map(model.config):
        if name.startswith(ENCODER_PARTS):
            for hf_name, part in zip(theirs, ours[name].detach().chunk(len(theirs), dim=0)):
                state[hf_name] = part.contiguous().clone()
    state["classifier.weight"] = ours["classifier.weight"].detach().clone()
    state["classifier.bias"] = ours["classifier.bias"].detach().clone()
    return state


def classifier_hf_config(model: SequenceClassifier, labels: list[str] | None, pad_token_id: int = 0) -> dict:
    """config.json of Bert/AlbertForSequenceClassification: labels (names by id), or regression for one output."""
    config = hf_config(model.config, pad_token_id)
    albert = model.config.type == "albert"
    config["architectures"] = ["AlbertForSequenceClassification" if albert else "BertForSequenceClassification"]
    names = labels if labels else [f"LABEL_{i}" for i in range(model.num_labels)]
    config["id2label"] = {str(i): name for i, name in enumerate(names)}
    config["label2id"] = {name: i for i, name in enumerate(names)}
    config["problem_type"] = "regression" if model.num_labels == 1 else "single_label_classification"
    if albert:
        config["classifier_dropout_prob"] = ALBERT_CLASSIFIER_DROPOUT
    return config


def export_classifier(model: SequenceClassifier, out_dir: str | Path, tokenizer_dir: Path | None = None,
                      labels: list[str] | None = None) -> Path:
    """Write config.json, model.safetensors and the tokenizer files: AutoModelForSequenceClassification loads it."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = classifier_hf_config(model, labels, _pad_token_id(tokenizer_dir))
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    save_file(classifier_state_dict(model), str(out / HF_WEIGHTS), metadata={"format": "pt"})
    honour_umask(out / HF_WEIGHTS)
    write_tokenizer_files(tokenizer_dir, out, model.config.max_position_embeddings)
    return out


def load_pretrained(path: str | Path, skipped: list[tuple[Path, str]] | None = None
                    ) -> tuple[PreTrainingModel, Path, str]:
    """(model, tokenizer dir, what was loaded) for a transformers BERT/ALBERT dir, a checkpoint dir or a RUN_DIR (its
    newest valid checkpoint; the newer invalid ones to `skipped`). The description names the checkpoint chosen."""
    path = Path(path)
    if (path / "config.json").is_file():
        model, _ = import_hf(path)
        tokenizer, loaded = rundir.find_tokenizer_dir(path), path
    else:
        model, _, loaded = model_from_checkpoint(path, skipped)
        tokenizer = rundir.find_tokenizer_dir(loaded)
    if tokenizer is None:
        raise DataError(f"No tokenizer.json found for {path} (looked in the dir, its tokenizer/ and "
                        "RUN_DIR/tokenizer). A downloaded model needs its tokenizer.json (fast tokenizer) next to "
                        "config.json.")
    return model, tokenizer, str(loaded.resolve())
