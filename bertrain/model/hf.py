"""Hugging Face interop: export to / import from transformers' Bert/AlbertForPreTraining, and `model.init_from`.
Only names and the fused query/key/value differ; the tied decoder is left out of the file, as transformers does."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path
from typing import Any, Callable

import torch
from safetensors.torch import load_file, save_file

from bertrain import rundir
from bertrain.config import ConfigWarning, ModelConfig
from bertrain.errors import ConfigError, DataError
from bertrain.files import honour_umask, naming, write_dir_atomic
from bertrain.model import PreTrainingModel, build_model, load_weights, unwrap
from bertrain.model.bert import embedding_size
from bertrain.model.from_checkpoint import (WORDS, architecture_error, architecture_of, check_checkpoint_tokenizer,
                                            check_vocabulary, check_weights_fit, model_from_checkpoint,
                                            position_hint, read_vocabulary, unfinished_run_warning, weight_shapes)
from bertrain.special_tokens import SPECIAL_TOKENS
from bertrain.tokenizer_file import TOKENIZER_FILES, load_tokenizer, normalizer_settings

HF_WEIGHTS = "model.safetensors"  # transformers' file name (by chance also ours: rundir.WEIGHTS)

# Our layer's parameter → transformers' (BERT layer, ALBERT layer); "qkv" is split into three.
_LAYER_NAMES = {
    "attention.qkv": (("attention.self.query", "attention.self.key", "attention.self.value"),
                      ("attention.query", "attention.key", "attention.value")),
    "attention.output": (("attention.output.dense",), ("attention.dense",)),
    "attention_norm": (("attention.output.LayerNorm",), ("attention.LayerNorm",)),
    "feed_forward.up": (("intermediate.dense",), ("ffn",)),
    "feed_forward.down": (("output.dense",), ("ffn_output",)),
    "output_norm": (("output.LayerNorm",), ("full_layer_layer_norm",)),
}


def name_map(config) -> list[tuple[str, tuple[str, ...]]]:
    """(our parameter name, transformers names) for every parameter; 3 names = split along dim 0."""
    albert = config.type == "albert"
    base = "albert." if albert else "bert."
    pairs: list[tuple[str, tuple[str, ...]]] = []

    def add(ours: str, *theirs: str, params=("weight", "bias")) -> None:
        for p in params:
            pairs.append((f"{ours}.{p}", tuple(f"{t}.{p}" for t in theirs)))

    for table in ("word_embeddings", "position_embeddings", "token_type_embeddings"):
        add(f"embeddings.{table}", f"{base}embeddings.{table}", params=("weight",))
    add("embeddings.layer_norm", f"{base}embeddings.LayerNorm")
    if albert:
        add("encoder.embedding_to_hidden", "albert.encoder.embedding_hidden_mapping_in")
        layers = [(f"encoder.groups.{g}.{j}", f"albert.encoder.albert_layer_groups.{g}.albert_layers.{j}")
                  for g in range(config.num_hidden_groups) for j in range(config.inner_group_num)]
    else:
        layers = [(f"encoder.layers.{i}", f"bert.encoder.layer.{i}") for i in range(config.num_hidden_layers)]
    for ours, theirs in layers:
        for part, (bert_names, albert_names) in _LAYER_NAMES.items():
            add(f"{ours}.{part}", *(f"{theirs}.{n}" for n in (albert_names if albert else bert_names)))
    if albert:
        add("pooler", "albert.pooler")
        add("mlm_head.dense", "predictions.dense")
        add("mlm_head.layer_norm", "predictions.LayerNorm")
        pairs.append(("mlm_head.bias", ("predictions.bias",)))
        add("sentence_head", "sop_classifier.classifier")
    else:
        add("pooler", "bert.pooler.dense")
        add("mlm_head.dense", "cls.predictions.transform.dense")
        add("mlm_head.layer_norm", "cls.predictions.transform.LayerNorm")
        pairs.append(("mlm_head.bias", ("cls.predictions.bias",)))
        add("sentence_head", "cls.seq_relationship")
    return pairs


def hf_config(model_config, pad_token_id: int = 0) -> dict[str, Any]:
    """config.json for transformers (BertConfig / AlbertConfig fields)."""
    c = model_config
    albert = c.type == "albert"
    config: dict[str, Any] = {
        "architectures": ["AlbertForPreTraining" if albert else "BertForPreTraining"],
        "model_type": c.type,
        "vocab_size": c.vocab_size,
        "hidden_size": c.hidden_size,
        "num_hidden_layers": c.num_hidden_layers,
        "num_attention_heads": c.num_attention_heads,
        "intermediate_size": c.intermediate_size,
        "hidden_act": c.hidden_act,
        "hidden_dropout_prob": c.hidden_dropout_prob,
        "attention_probs_dropout_prob": c.attention_probs_dropout_prob,
        "max_position_embeddings": c.max_position_embeddings,
        "type_vocab_size": c.type_vocab_size,
        "initializer_range": c.initializer_range,
        "layer_norm_eps": c.layer_norm_eps,
        "pad_token_id": pad_token_id,
        "tie_word_embeddings": True,
        "dtype": "float32",
        # transformers 4.x and 5.x then load our tokenizer.json without a model-specific class.
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    if albert:
        config.update(embedding_size=embedding_size(c), num_hidden_groups=c.num_hidden_groups,
                      inner_group_num=c.inner_group_num, classifier_dropout_prob=0.1,
                      bos_token_id=2, eos_token_id=3)
    else:
        config.update(position_embedding_type="absolute", classifier_dropout=None)
    return config


# BertConfig / AlbertConfig defaults for keys an older config.json may leave out.
_HF_DEFAULTS = {
    "bert": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
                 hidden_act="gelu", hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
                 max_position_embeddings=512, type_vocab_size=2, initializer_range=0.02, layer_norm_eps=1e-12),
    "albert": dict(embedding_size=128, hidden_size=4096, num_hidden_layers=12, num_hidden_groups=1,
                   num_attention_heads=64, intermediate_size=16384, inner_group_num=1, hidden_act="gelu_new",
                   hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, max_position_embeddings=512,
                   type_vocab_size=2, initializer_range=0.02, layer_norm_eps=1e-12),
}
# transformers' activations that are the same function as one of ours (tanh-approximated GELU).
_ACTIVATIONS = {"gelu": "gelu", "relu": "relu", "gelu_new": "gelu_new", "gelu_pytorch_tanh": "gelu_new",
                "gelu_fast": "gelu_new", "gelu_python": "gelu"}


def model_config_from_hf(hf_dir: str | Path) -> ModelConfig:
    """Our ModelConfig for a transformers BERT/ALBERT directory's config.json."""
    path = Path(hf_dir) / "config.json"
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise DataError(f"Cannot read {path}: {error.strerror}. Is {hf_dir} a transformers model directory?") from None
    except json.JSONDecodeError as error:
        raise DataError(f"{path} is not valid JSON: {error}") from None
    kind = raw.get("model_type")
    if kind not in _HF_DEFAULTS:
        raise ConfigError(f"{path}: model_type {kind!r} is not supported; bertrain reads 'bert' and 'albert' models.")
    values = {**_HF_DEFAULTS[kind], **{k: raw[k] for k in _HF_DEFAULTS[kind] if k in raw}}
    if raw.get("position_embedding_type", "absolute") != "absolute":
        raise ConfigError(f"{path}: position_embedding_type {raw['position_embedding_type']!r} is not supported "
                          "(bertrain uses learned absolute positions).")
    act = _ACTIVATIONS.get(values["hidden_act"])
    if act is None:
        raise ConfigError(f"{path}: hidden_act {values['hidden_act']!r} is not supported "
                          f"(use one of {', '.join(sorted(_ACTIVATIONS))}).")
    if "vocab_size" not in raw:
        raise DataError(f"{path} has no vocab_size.")
    return ModelConfig(type=kind, vocab_size=raw["vocab_size"], **{**values, "hidden_act": act})


def to_hf_state_dict(model) -> dict[str, torch.Tensor]:
    """Our weights under transformers' names (qkv split; tied decoder left out)."""
    model = unwrap(model)
    ours = model.state_dict()
    state = {}
    for name, theirs in name_map(model.config):
        tensor = ours[name].detach()
        for hf_name, part in zip(theirs, tensor.chunk(len(theirs), dim=0)):
            state[hf_name] = part.contiguous().clone()
    return state


def read_hf_weights(hf_dir: Path) -> dict[str, torch.Tensor]:
    """All tensors of a transformers directory: model.safetensors (also sharded) or pytorch_model.bin."""
    try:
        if (hf_dir / HF_WEIGHTS).is_file():
            return load_file(str(hf_dir / HF_WEIGHTS))
        index = hf_dir / "model.safetensors.index.json"
        if index.is_file():
            state = {}
            for shard in sorted(set(json.loads(index.read_text())["weight_map"].values())):
                state.update(load_file(str(hf_dir / shard)))
            return state
        if (hf_dir / "pytorch_model.bin").is_file():
            return torch.load(hf_dir / "pytorch_model.bin", map_location="cpu", weights_only=True)
    except (OSError, ValueError, RuntimeError, KeyError) as error:
        raise DataError(f"Cannot read the weights in {hf_dir}: {error}") from None
    raise DataError(f"{hf_dir} has no model.safetensors (or pytorch_model.bin): not a transformers model directory.")


def _normalize_hf_names(state: dict[str, torch.Tensor], config) -> dict[str, torch.Tensor]:
    """Accept BertModel checkpoints (no 'bert.' prefix) and TF-era LayerNorm gamma/beta names."""
    base = "albert." if config.type == "albert" else "bert."
    heads = ("cls.", "predictions.", "sop_classifier.")
    out = {}
    for name, tensor in state.items():
        name = name.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")
        if name.startswith(("embeddings.", "encoder.", "pooler.")):
            name = base + name
        elif not name.startswith((base,) + heads):
            continue  # e.g. a fine-tuning classifier
        out[name] = tensor
    # Some checkpoints hold the MLM bias only as the (tied) decoder bias.
    for decoder, bias in (("cls.predictions.decoder.bias", "cls.predictions.bias"),
                          ("predictions.decoder.bias", "predictions.bias")):
        if bias not in out and decoder in out:
            out[bias] = out[decoder]
    return out


def load_hf_state_dict(model, state: dict[str, torch.Tensor], source: str = "the transformers weights") -> list[str]:
    """Copy transformers-named weights into our model; returns the missing (freshly initialized) heads."""
    model = unwrap(model)
    state = _normalize_hf_names(state, model.config)
    ours = model.state_dict()
    new, kept_fresh = {}, []
    for name, theirs in name_map(model.config):
        if not all(t in state for t in theirs):
            if name.startswith(("pooler.", "mlm_head.", "sentence_head.")):
                kept_fresh.append(name)
                continue
            missing = [t for t in theirs if t not in state]
            raise DataError(f"{source} lack {missing[0]} (and {len(missing) - 1} more of this layer): "
                            "not a complete BERT/ALBERT checkpoint for this config.")
        tensor = torch.cat([state[t] for t in theirs], dim=0) if len(theirs) > 1 else state[theirs[0]]
        if tensor.shape != ours[name].shape:
            raise DataError(f"{source}: {theirs[0]} has shape {tuple(tensor.shape)} but the model expects "
                            f"{tuple(ours[name].chunk(len(theirs))[0].shape)}. Do model config and checkpoint agree "
                            "(vocab_size, hidden_size, layers)?")
        new[name] = tensor
    with torch.no_grad():
        for name, tensor in new.items():
            ours[name].copy_(tensor)
    return kept_fresh


def import_hf(hf_dir: str | Path) -> tuple[PreTrainingModel, ModelConfig]:
    """(model, model_config) from a local transformers BERT/ALBERT directory."""
    hf_dir = Path(hf_dir)
    config = model_config_from_hf(hf_dir)
    model = build_model(config)
    load_hf_state_dict(model, read_hf_weights(hf_dir), source=f"The weights in {hf_dir}")
    model.eval()
    return model, config


def _pad_token_id(tokenizer_dir: Path | None) -> int:
    if tokenizer_dir is None:
        return 0
    tokenizer = load_tokenizer(tokenizer_dir)
    for token in (tokens["pad"] for tokens in SPECIAL_TOKENS.values()):
        if tokenizer.token_to_id(token) is not None:
            return tokenizer.token_to_id(token)
    return 0


def write_tokenizer_files(tokenizer: Path | None, out: Path, max_positions: int) -> list[str]:
    """Copy the tokenizer files into an export dir, with model_max_length = the model's positions, the case and accent
    settings, and a WordPiece vocab.txt; the names written."""
    copied = []
    if tokenizer is not None and tokenizer.resolve() != out.resolve():
        for name in TOKENIZER_FILES:
            if (tokenizer / name).is_file():
                shutil.copyfile(tokenizer / name, out / name)
                copied.append(name)
    # transformers truncates to model_max_length: more than the model's positions and a long text crashes it.
    if (out / "tokenizer.json").is_file():
        wrapper_path = out / "tokenizer_config.json"
        wrapper = json.loads(wrapper_path.read_text(encoding="utf-8")) if wrapper_path.is_file() else {}
        wrapper["model_max_length"] = max_positions
        # Data prepared before the wrapper kept the accent setting: BertTokenizer would strip accents the model kept.
        loaded = load_tokenizer(out)
        wrapper.update(normalizer_settings(loaded))
        if json.loads(loaded.to_str())["model"]["type"] == "WordPiece":
            # Google's format, one token a line in id order: what TensorFlow BERT code and older tools read.
            vocab = sorted(loaded.get_vocab(with_added_tokens=True).items(), key=lambda item: item[1])
            (out / "vocab.txt").write_text("".join(token + "\n" for token, _ in vocab), encoding="utf-8")
            copied = list(dict.fromkeys(copied + ["vocab.txt"]))
        wrapper_path.write_text(json.dumps(wrapper, indent=2, ensure_ascii=False), encoding="utf-8")
    return copied


def export_hf(checkpoint_or_model, out_dir: str | Path, tokenizer_dir: str | Path | None = None) -> dict[str, Any]:
    """Write a transformers directory (config.json, model.safetensors, tokenizer files) from a model,
    a checkpoint dir or a RUN_DIR. Returns what was written, the model, and the invalid checkpoints
    skipped on the way to a RUN_DIR's newest valid one."""
    checkpoint: Path | None = None
    skipped: list[tuple[Path, str]] = []
    if isinstance(checkpoint_or_model, torch.nn.Module):
        model = unwrap(checkpoint_or_model)
    else:
        model, _, checkpoint = model_from_checkpoint(checkpoint_or_model, skipped)
    tokenizer = rundir.find_tokenizer_dir(checkpoint, tokenizer_dir)
    out = Path(out_dir)
    config = hf_config(model.config, pad_token_id=_pad_token_id(tokenizer))

    def write(directory: Path) -> list[str]:
        # Each file named in a failed write: safetensors' error and a full disk's write() name none.
        with naming(directory / "config.json"):
            (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
        with naming(directory / HF_WEIGHTS):
            # One metadata key: safetensors writes metadata in hash-map order, and the bytes must be reproducible.
            save_file(to_hf_state_dict(model), str(directory / HF_WEIGHTS), metadata={"format": "pt"})
        honour_umask(directory / HF_WEIGHTS)
        with naming(directory):
            return write_tokenizer_files(tokenizer, directory, model.config.max_position_embeddings)

    # Never half an export (config.json without weights, which transformers fails to load), nor a failed export
    # over an earlier one: written aside, put in place when complete.
    copied = write_dir_atomic(out, write)
    for name in set(TOKENIZER_FILES) - set(copied):  # an earlier export's: a WordPiece vocab.txt beside ALBERT's
        (out / name).unlink(missing_ok=True)
    return {"out_dir": out, "checkpoint": checkpoint, "tokenizer_dir": tokenizer, "tokenizer_files": copied,
            "architecture": config["architectures"][0], "parameters": model.num_parameters(), "model": model,
            "skipped": skipped}


def initialize_from(model, path: str | Path, run_tokenizer: str | Path | None = None,
                    warn: Callable[[str], None] | None = None) -> str:
    """`model.init_from`: load a transformers dir, checkpoint, RUN_DIR or safetensors file; a one-line description.
    With `run_tokenizer` (the run's DATA_DIR/tokenizer), weights of another vocabulary are refused."""
    warn = warn or (lambda message: warnings.warn(message, ConfigWarning, stacklevel=3))
    model = unwrap(model)
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"model.init_from: {path} does not exist.")
    here = None
    if run_tokenizer is not None and (Path(run_tokenizer) / "tokenizer.json").is_file():
        run_tokenizer = Path(run_tokenizer)
        here = read_vocabulary(run_tokenizer)
    if path.is_file():
        shapes = weight_shapes(path)
        if here is not None:
            there = read_vocabulary(path.parent)
            if there is None:
                warn(f"model.init_from: {path} comes without a tokenizer (no tokenizer.json beside it), so it could "
                     "not be checked that its ids mean this run's tokens; make sure its vocabulary is this run's.")
            else:
                check_vocabulary(there, here, str(path), path.parent, _rows_fit(model, shapes), warn)
        check_weights_fit(model, path, shapes, str(path))
        load_weights(model, path)
        return f"weights from {path}"
    if (path / "config.json").is_file():
        _check_hf_dir(model, path, here, warn)
        fresh = load_hf_state_dict(model, read_hf_weights(path), source=f"The weights in {path}")
        return f"transformers weights from {path}" + (f" (freshly initialized: {', '.join(fresh)})" if fresh else "")
    checkpoint = rundir.resolve_checkpoint(path)
    weights = checkpoint / rundir.WEIGHTS
    shapes = weight_shapes(weights)
    unfinished = unfinished_run_warning(checkpoint)
    if unfinished:
        warn(unfinished)
    theirs = architecture_of(shapes or {})
    if theirs is not None and theirs != model.config.type:
        raise architecture_error(f"checkpoint {checkpoint}", theirs, model.config.type)
    if here is not None:
        check_checkpoint_tokenizer(checkpoint, run_tokenizer, here, _rows_fit(model, shapes), warn)
    check_weights_fit(model, weights, shapes, f"checkpoint {checkpoint}")
    load_weights(model, weights)
    return f"bertrain checkpoint {checkpoint}"


def _rows_fit(model, shapes: dict[str, tuple[int, ...]] | None) -> bool:
    return shapes is not None and shapes.get(WORDS, (None,))[0] == model.config.vocab_size


def _check_hf_dir(model, path: Path, here: dict[str, int] | None, warn: Callable[[str], None]) -> None:
    """A transformers dir's config against the model's (architecture first), and its tokenizer against the run's."""
    theirs = model_config_from_hf(path)
    mine = model.config
    if theirs.type != mine.type:
        raise architecture_error(str(path), theirs.type, mine.type)
    if here is not None:
        there = read_vocabulary(path)
        if there is None:
            warn(f"model.init_from: {path} has no tokenizer.json or vocab.txt, so it could not be checked that its "
                 "ids mean this run's tokens; make sure its vocabulary is this run's.")
        else:
            check_vocabulary(there, here, str(path), path, theirs.vocab_size == mine.vocab_size, warn)
    keys = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
            "max_position_embeddings", "type_vocab_size", "hidden_act")
    if theirs.type == "albert":
        keys += ("embedding_size", "num_hidden_groups", "inner_group_num")
    differ = [f"{k}: {getattr(theirs, k)} there, {getattr(mine, k)} here" for k in keys
              if getattr(theirs, k) != getattr(mine, k)]
    if differ:
        hint = position_hint(theirs.max_position_embeddings, mine.max_position_embeddings)
        raise ConfigError(f"model.init_from: {path} does not match the model config ({'; '.join(differ)})."
                          + (hint or " Set the model section to the checkpoint's shape."))
