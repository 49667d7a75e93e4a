"""Typed configuration: dataclasses loaded from YAML, `--set section.key=value` overrides, validation.

Every key is documented in its field's `help`; `docs/config.md` is generated from these (see
`config_reference_markdown`) and a test keeps it in sync.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Optional

import yaml

from bertrain.errors import ConfigError


def opt(default: Any, help: str, **kwargs: Any) -> Any:
    """A dataclass field with documentation (lists and dicts get a factory)."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata={"help": help}, **kwargs)
    return field(default=default, metadata={"help": help}, **kwargs)


# ----------------------------------------------------------------------------------------------
# Sections of a training config
# ----------------------------------------------------------------------------------------------


@dataclass
class DataConfig:
    """Which prepared corpus to train on and how batches are built from it."""

    path: str = opt("", "Prepared DATA_DIR written by `bertrain prepare` (also `--data`).")
    objective: Literal["nsp", "sop", "none"] = opt(
        "sop", "Sentence-level task: `nsp` (BERT), `sop` (ALBERT) or `none` (MLM only, one segment).")
    max_seq_length: int = opt(128, "Tokens per instance including [CLS] and [SEP]s.")
    short_seq_prob: float = opt(0.1, "Probability of a random shorter target length (Google's short_seq_prob).")
    masking: Literal["token", "whole_word", "ngram"] = opt(
        "token", "Masking unit: single tokens, whole words, or n-grams of up to `ngram_max` words (ALBERT).")
    mlm_probability: float = opt(0.15, "Fraction of eligible (non-special, non-padding) tokens chosen for prediction.")
    mask_prob: float = opt(0.8, "Of the chosen tokens, fraction replaced by [MASK].")
    random_prob: float = opt(0.1, "Of the chosen tokens, fraction replaced by a random non-special token.")
    ngram_max: int = opt(3, "Longest n-gram (in words) for `masking: ngram`; n is drawn with probability ∝ 1/n.")
    max_predictions_per_seq: Optional[int] = opt(None, "Cap on predicted tokens per sequence (null: no cap).")
    pad_to_multiple_of: int = opt(8, "Dynamic padding rounds the batch length up to a multiple of this.")
    num_workers: int = opt(0, "DataLoader worker processes (batches are identical for any value).")
    eval_batches: int = opt(20, "Validation batches per evaluation (fixed masks, same every time).")


@dataclass
class TokenizerConfig:
    """How `bertrain prepare` / `bertrain tokenizer train` trains the tokenizer."""

    kind: Literal["wordpiece", "unigram"] = opt(
        "wordpiece", "`wordpiece` (BERT, `##` continuations) or `unigram` (ALBERT/SentencePiece, `▁` word starts).")
    vocab_size: int = opt(30522, "Target vocabulary size including special tokens.")
    lowercase: bool = opt(True, "Lowercase text before tokenizing (WordPiece: BERT uncased).")
    strip_accents: Optional[bool] = opt(None, "Strip accents; null follows `lowercase` as BERT does.")
    min_frequency: int = opt(2, "WordPiece: minimum pair frequency for a merge.")
    max_bytes: int = opt(1_000_000_000, "Train on a seeded sample of at most this many bytes of text.")
    seed: int = opt(0, "Seed of the training sample; same seed and corpus give the same tokenizer.")
    path: Optional[str] = opt(None, "Use this existing tokenizer (dir or tokenizer.json) instead of training one.")


@dataclass
class ModelConfig:
    """Model shape. Field names follow transformers' BertConfig / AlbertConfig."""

    type: Literal["bert", "albert"] = opt("bert", "Architecture: `bert` or `albert`.")
    vocab_size: Optional[int] = opt(None, "Vocabulary size; null takes it from the prepared data's manifest.")
    hidden_size: int = opt(768, "Hidden size H.")
    num_hidden_layers: int = opt(12, "Number of encoder layers (ALBERT: layer applications).")
    num_attention_heads: int = opt(12, "Attention heads; must divide hidden_size.")
    intermediate_size: int = opt(3072, "Feed-forward inner size.")
    hidden_act: Literal["gelu", "gelu_new", "relu"] = opt(
        "gelu", "Activation: `gelu` (exact erf, BERT) or `gelu_new` (tanh approximation, ALBERT).")
    hidden_dropout_prob: float = opt(0.1, "Dropout on embeddings and sublayer outputs.")
    attention_probs_dropout_prob: float = opt(
        0.1, "Dropout on attention probabilities (BERT: 0.1). 0 lets scaled_dot_product_attention use its fused "
        "(flash) kernel: 2-5x faster attention (forward + backward, measured on CPU) and no [B, heads, T, T] "
        "probabilities kept for backward; "
        "ALBERT v2 uses 0; the BERT paper and bert_base.yaml use 0.1.")
    max_position_embeddings: int = opt(512, "Learned absolute positions; must be >= data.max_seq_length.")
    type_vocab_size: int = opt(2, "Token type (segment) vocabulary.")
    initializer_range: float = opt(0.02, "Std of the normal initialization of weights.")
    layer_norm_eps: float = opt(1e-12, "LayerNorm epsilon.")
    embedding_size: Optional[int] = opt(None, "ALBERT factorized embedding size E (null: BERT, E = H).")
    num_hidden_groups: int = opt(1, "ALBERT: number of groups of shared layer parameters.")
    inner_group_num: int = opt(1, "ALBERT: layers inside each shared group.")
    gradient_checkpointing: bool = opt(False, "Recompute activations in backward to save memory.")
    init_from: Optional[str] = opt(
        None, "Start from existing weights: a local transformers BERT/ALBERT directory (continued pretraining) "
        "or a bertrain checkpoint dir / RUN_DIR (e.g. BERT phase 2 from phase 1). Shapes must match this section.")


@dataclass
class OptimConfig:
    """Optimizer and learning-rate schedule."""

    name: Literal["adamw", "lamb"] = opt("adamw", "`adamw`, or `lamb` for large-batch recipes (ALBERT).")
    lr: float = opt(1e-4, "Peak learning rate.")
    weight_decay: float = opt(0.01, "Decoupled weight decay on weight matrices and embeddings (never biases or LayerNorm).")
    betas: list[float] = opt([0.9, 0.999], "Adam betas.")
    eps: float = opt(1e-6, "Adam epsilon.")
    max_grad_norm: Optional[float] = opt(1.0, "Clip the global gradient norm to this (null: no clipping).")
    schedule: Literal["linear", "cosine", "constant"] = opt(
        "linear", "After warmup: linear decay to 0, cosine decay to 0, or constant.")
    warmup_steps: int = opt(10000, "Linear warmup length in optimizer steps.")
    warmup_fraction: Optional[float] = opt(None, "Warmup as a fraction of total steps; overrides warmup_steps when set.")


@dataclass
class TrainConfig:
    """The training run: budget, batch, precision, checkpoints, evaluation."""

    output_dir: str = opt("runs/bertrain", "RUN_DIR: checkpoints, metrics.jsonl and the resolved config (also `--run-dir`).")
    seed: int = opt(42, "Seed of initialization, pair plans, masking and data order.")
    batch_size: int = opt(256, "Global batch in sequences per optimizer step (all processes, all accumulation steps).")
    gradient_accumulation_steps: int = opt(1, "Micro-batches per optimizer step on each process.")
    max_steps: Optional[int] = opt(100000, "Budget in optimizer steps (a step is one optimizer update).")
    max_tokens: Optional[int] = opt(None, "Budget in (non-padding) training tokens; overrides max_steps when set.")
    mixed_precision: Literal["no", "fp16", "bf16"] = opt("no", "Autocast precision; bf16 also speeds up recent CPUs.")
    save_every: int = opt(1000, "Checkpoint every N optimizer steps (also at the end and on a signal).")
    keep_last: int = opt(3, "Checkpoints kept; older ones are removed only after a new one is complete.")
    eval_every: int = opt(1000, "Evaluate on the validation split every N steps (0: never).")
    log_every: int = opt(10, "Log metrics every N steps.")
    max_bad_steps: int = opt(10, "Stop after this many non-finite losses in a row (such steps are skipped).")
    requeue_exit_code: int = opt(75, "Exit code after a signal-triggered checkpoint, for job scripts to requeue.")
    deterministic: bool = opt(False, "torch.use_deterministic_algorithms (exact resume tests use it).")
    compile: bool = opt(False, "torch.compile the model (slow start, faster steps on GPU).")
    stop_at_step: Optional[int] = opt(
        None, "Save and stop (exit 0) after this step without changing the schedule: splits a run into jobs; "
        "resume with the same config.")


@dataclass
class LoggingConfig:
    """Where metrics go besides RUN_DIR/metrics.jsonl."""

    wandb: Literal["off", "online", "offline", "disabled"] = opt(
        "off", "Weights & Biases mode; `online` falls back to offline when the network is unreachable.")
    wandb_project: str = opt("bertrain", "wandb project name.")
    wandb_run_name: Optional[str] = opt(None, "wandb run name (null: RUN_DIR's name).")
    wandb_init_timeout: float = opt(30.0, "Seconds to wait for wandb online before falling back to offline.")


@dataclass
class Config:
    """A training config: one section per concern."""

    data: DataConfig = field(default_factory=DataConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)


# ----------------------------------------------------------------------------------------------
# A data recipe (`bertrain prepare --recipe`)
# ----------------------------------------------------------------------------------------------


@dataclass
class SourceConfig:
    """One input: a path or glob of files, a `load_from_disk` directory, or a hub dataset name."""

    path: str = opt("", "File, directory, glob (`corpus/**/*.txt`) or, with `format: hub`, a dataset name.")
    format: Literal["auto", "text", "jsonl", "json", "parquet", "arrow", "hub"] = opt(
        "auto", "Input format; `auto` decides by extension (.gz/.zst are decompressed); "
        "`arrow` is a `datasets.save_to_disk` directory; `hub` uses datasets.load_dataset(streaming=True).")
    text_field: str = opt("text", "Field holding the document text in JSON/Parquet/datasets records.")
    text_layout: Literal["auto", "sentence_per_line", "paragraphs"] = opt(
        "auto", "`.txt` layout: BERT's one sentence per line with blank lines between documents, or plain "
        "text whose blank lines separate paragraphs of one document per file; `auto` guesses per file.")
    name: Optional[str] = opt(None, "Hub dataset configuration name (e.g. `20231101.en`).")
    split: str = opt("train", "Hub/datasets split to read.")
    data_files: Optional[list[str]] = opt(None, "Hub format: explicit data files passed to load_dataset.")
    max_documents: Optional[int] = opt(None, "Read at most this many documents from this source.")


@dataclass
class PrepareConfig:
    """Reading, cleaning, deduplicating, splitting and sharding the corpus."""

    sources: list[SourceConfig] = opt([], "Inputs, each a `SourceConfig` mapping.")
    validation_fraction: float = opt(0.005, "Fraction of documents (by hash) kept for validation.")
    num_shards: int = opt(8, "Output shards (balanced by size).")
    workers: int = opt(2, "Parallel worker processes for tokenizing shards.")
    dedup: bool = opt(True, "Remove exact-duplicate documents.")
    on_decode_error: Literal["error", "replace", "skip"] = opt(
        "error", "Invalid UTF-8: stop with file/line/byte, or replace / skip the line and count it.")
    on_bad_record: Literal["error", "skip"] = opt(
        "error", "JSON record without a string text field: stop naming file and line, or skip and count it.")
    max_line_chars: int = opt(1_000_000, "Longer lines are split into pieces of at most this many characters (counted).")
    min_sentence_chars: int = opt(1, "Sentences shorter than this are dropped (counted).")
    max_document_chars: int = opt(
        10_000_000, "Plain-text files (one document per file) longer than this are cut into several "
        "documents at paragraph boundaries (counted), which keeps memory bounded.")


@dataclass
class Recipe:
    """A data recipe: what `bertrain prepare --recipe` reads."""

    prepare: PrepareConfig = field(default_factory=PrepareConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)


# ----------------------------------------------------------------------------------------------
# Loading
# ----------------------------------------------------------------------------------------------


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys (PyYAML silently keeps the last one)."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise ConfigError(
                f"{loader.name}: duplicate key '{key}' at line {key_node.start_mark.line + 1} "
                f"(first at line {seen[key]}). Remove one of them.")
        seen[key] = key_node.start_mark.line + 1
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def read_yaml(path: str | Path) -> dict:
    """Read a YAML mapping with duplicate keys refused; errors name the file and line."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise ConfigError(f"Cannot read config file {path}: {error.strerror}.") from None
    loader = _StrictLoader(text)
    loader.name = str(path)
    try:
        data = loader.get_single_data()
    except yaml.YAMLError as error:
        raise ConfigError(f"{path} is not valid YAML: {error}") from None
    finally:
        loader.dispose()
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a mapping of sections (data:, model:, ...), not a {type(data).__name__}.")
    return data


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is list:
        (inner,) = typing.get_args(tp)
        return f"list[{_type_name(inner)}]"
    if tp is type(None):
        return "null"
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Convert a YAML value to the annotated type or raise a ConfigError naming key, value, type."""
    origin = typing.get_origin(tp)

    def bad() -> ConfigError:
        return ConfigError(f"Config key '{key}': {value!r} is not a valid {_type_name(tp)}.")

    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, key)
            except ConfigError:
                pass
        raise bad()
    if origin is Literal:
        choices = typing.get_args(tp)
        if isinstance(value, bool):  # YAML 1.1 reads `no`/`off` as False: map back to the spelled choice
            spelled = [c for c in (("no", "off", "false") if not value else ("yes", "on", "true")) if c in choices]
            if spelled:
                return spelled[0]
        if value in choices and not isinstance(value, bool):
            return value
        close = difflib.get_close_matches(str(value), [str(c) for c in choices], n=1)
        hint = f" Did you mean '{close[0]}'?" if close else ""
        raise ConfigError(f"Config key '{key}': {value!r} is not one of {', '.join(map(repr, choices))}.{hint}")
    if origin is list:
        (inner,) = typing.get_args(tp)
        if isinstance(value, tuple):
            value = list(value)
        if not isinstance(value, list):
            raise bad()
        return [_coerce(item, inner, f"{key}[{i}]") for i, item in enumerate(value)]
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            raise ConfigError(f"Config key '{key}' must be a mapping of {tp.__name__} keys, not {value!r}.")
        return build_dataclass(tp, value, prefix=key)
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "yes", "on", "false", "no", "off"):
            return value.lower() in ("true", "yes", "on")
        raise bad()
    if tp is int:
        if isinstance(value, bool):
            raise bad()
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                number = float(value.replace("_", ""))
            except ValueError:
                raise bad() from None
            if number.is_integer():
                return int(number)
        raise bad()
    if tp is float:
        if isinstance(value, bool):
            raise bad()
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):  # PyYAML reads 1e-4 (no dot) as a string
            try:
                return float(value.replace("_", ""))
            except ValueError:
                raise bad() from None
        raise bad()
    if tp is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        raise bad()
    if tp is Any:
        return value
    raise bad()


def _suggest(key: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(key, choices, n=1, cutoff=0.5)
    return f" Did you mean '{close[0]}'?" if close else f" Valid keys: {', '.join(choices)}."


def build_dataclass(cls: type, values: dict, prefix: str = "") -> Any:
    """Build `cls` from a mapping, refusing unknown keys (with a suggestion) and wrong types."""
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in values.items():
        dotted = f"{prefix}.{key}" if prefix else str(key)
        if key not in names:
            raise ConfigError(f"Unknown config key '{dotted}'.{_suggest(str(key), names)}")
        kwargs[key] = _coerce(value, hints[key], dotted)
    return cls(**kwargs)


def _set_dotted(tree: dict, dotted: str, value: Any, root_cls: type) -> None:
    """Apply one `section.key=value` override to a raw mapping, validating the path against `root_cls`."""
    parts = dotted.split(".")
    cls, node = root_cls, tree
    for depth, part in enumerate(parts):
        names = [f.name for f in dataclasses.fields(cls)]
        path = ".".join(parts[: depth + 1])
        if part not in names:
            raise ConfigError(f"Unknown config key '{path}' in --set {dotted}=... .{_suggest(part, names)}")
        if depth == len(parts) - 1:
            node[part] = value
            return
        sub = typing.get_type_hints(cls)[part]
        if not dataclasses.is_dataclass(sub):
            raise ConfigError(f"--set {dotted}: '{path}' is a value, not a section.")
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"--set {dotted}: '{path}' is not a mapping in the config file.")
        cls = sub


def parse_override(text: str) -> tuple[str, Any]:
    """Split `a.b=value`; the value is read as YAML (so `null`, `3e-4`, `[0.9, 0.98]` work)."""
    if "=" not in text:
        raise ConfigError(f"Override '{text}' must look like section.key=value (e.g. optim.lr=3e-4).")
    key, raw = text.split("=", 1)
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key.strip(), value


def shipped_dir(kind: str) -> list[Path]:
    """Directories holding the shipped `configs` or `data_recipes` (package data; the top-level
    `configs/` and `data_recipes/` of a checkout are symlinks to them)."""
    directory = Path(__file__).resolve().parent / kind
    return [directory] if directory.is_dir() else []


def resolve_config_path(name: str | Path, kind: str = "configs") -> Path:
    """A path as given if it exists, else the shipped file of that name (`albert_base`, `albert_base.yaml`)."""
    path = Path(name)
    if path.exists():
        return path
    stem = path.name if path.suffix in (".yaml", ".yml") else path.name + ".yaml"
    for directory in shipped_dir(kind):
        candidate = directory / stem
        if candidate.is_file():
            return candidate
    available = sorted({p.stem for d in shipped_dir(kind) for p in d.glob("*.yaml")})
    close = difflib.get_close_matches(path.stem, available, n=1)
    hint = f" Did you mean '{close[0]}'?" if close else ""
    raise ConfigError(
        f"Config file '{name}' does not exist, and no shipped {kind} file has that name.{hint} "
        f"Shipped: {', '.join(available) or 'none'}.")


def load_tree(cls: type, path: str | Path | None, overrides: typing.Iterable[str] = (), kind: str = "configs") -> Any:
    """Load a YAML file (or nothing) plus overrides into the dataclass tree `cls`."""
    tree: dict = {}
    if path is not None:
        tree = read_yaml(resolve_config_path(path, kind))
    for text in overrides:
        key, value = parse_override(text)
        _set_dotted(tree, key, value, cls)
    config = build_dataclass(cls, tree)
    validate(config)
    return config


def load_config(path: str | Path | None, overrides: typing.Iterable[str] = ()) -> Config:
    """Load a training config (file or shipped name) with `section.key=value` overrides."""
    return load_tree(Config, path, overrides, kind="configs")


def load_recipe(path: str | Path | None, overrides: typing.Iterable[str] = ()) -> Recipe:
    """Load a data recipe (file or shipped name) with `section.key=value` overrides."""
    return load_tree(Recipe, path, overrides, kind="data_recipes")


def validate(config: Any) -> None:
    """Cross-field checks that types alone cannot express."""
    if isinstance(config, Config):
        data, model, train, optim = config.data, config.model, config.train, config.optim
        for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                    "max_position_embeddings", "num_hidden_groups", "inner_group_num"):
            if getattr(model, key) < 1:  # checked first: the divisibility checks below divide by them
                raise ConfigError(f"model.{key} must be at least 1, got {getattr(model, key)}.")
        if model.hidden_size % model.num_attention_heads:
            raise ConfigError(
                f"model.hidden_size ({model.hidden_size}) must be divisible by model.num_attention_heads "
                f"({model.num_attention_heads}).")
        if data.max_seq_length > model.max_position_embeddings:
            raise ConfigError(
                f"data.max_seq_length ({data.max_seq_length}) exceeds model.max_position_embeddings "
                f"({model.max_position_embeddings}).")
        if model.type == "albert" and model.num_hidden_layers % model.num_hidden_groups:
            raise ConfigError("model.num_hidden_layers must be divisible by model.num_hidden_groups.")
        if not 0 < data.mlm_probability < 1:
            raise ConfigError(f"data.mlm_probability must be in (0, 1), got {data.mlm_probability}.")
        if data.mask_prob + data.random_prob > 1:
            raise ConfigError("data.mask_prob + data.random_prob must not exceed 1.")
        if data.max_seq_length < 8:
            raise ConfigError("data.max_seq_length must be at least 8.")
        if train.batch_size < 1 or train.gradient_accumulation_steps < 1:
            raise ConfigError("train.batch_size and train.gradient_accumulation_steps must be positive.")
        if train.batch_size % train.gradient_accumulation_steps:
            raise ConfigError(
                f"train.batch_size ({train.batch_size}) must be divisible by train.gradient_accumulation_steps "
                f"({train.gradient_accumulation_steps}).")
        if len(optim.betas) != 2:
            raise ConfigError("optim.betas must be a list of two numbers, e.g. [0.9, 0.999].")
        if optim.warmup_fraction is not None and not 0 <= optim.warmup_fraction < 1:
            raise ConfigError("optim.warmup_fraction must be in [0, 1).")
    if isinstance(config, Recipe):
        if not 0 <= config.prepare.validation_fraction < 1:
            raise ConfigError("prepare.validation_fraction must be in [0, 1).")
        if config.prepare.num_shards < 1 or config.prepare.workers < 1:
            raise ConfigError("prepare.num_shards and prepare.workers must be at least 1.")


# ----------------------------------------------------------------------------------------------
# Showing and documenting
# ----------------------------------------------------------------------------------------------


def to_dict(config: Any) -> dict:
    """The config tree as plain data (for YAML dumps and checkpoints)."""
    return dataclasses.asdict(config)


def dump_yaml(config: Any) -> str:
    """The resolved config as YAML that loads back to the same tree."""
    return yaml.safe_dump(to_dict(config), sort_keys=False, allow_unicode=True)


def iter_docs(cls: type, prefix: str = "") -> typing.Iterator[tuple[str, str, Any, str]]:
    """(dotted key, type, default, help) for every documented key under `cls`."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        dotted = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(tp):
            yield from iter_docs(tp, dotted + ".")
            continue
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        yield dotted, _type_name(tp), default, f.metadata.get("help", "")


def config_reference_markdown() -> str:
    """The reference of every config and recipe key, generated from the dataclasses."""
    lines = ["# Configuration reference", "",
             "Generated from `bertrain/config.py` by `bertrain config reference`; do not edit by hand.",
             "Any key can be overridden on the command line: `--set section.key=value`.", ""]
    for title, cls in (("Training config (`bertrain pretrain --config`)", Config),
                       ("Data recipe (`bertrain prepare --recipe`)", Recipe),
                       ("Each entry of `prepare.sources`", SourceConfig)):
        lines += [f"## {title}", ""]
        section = None
        for dotted, tp, default, help_text in iter_docs(cls):
            head = dotted.split(".")[0] if "." in dotted else ""
            if head != section:
                section = head
                sub = typing.get_type_hints(cls).get(head) if head else None
                if sub is not None:
                    lines += [f"### `{head}`", "", (sub.__doc__ or "").strip(), ""]
                lines += ["| key | type | default | meaning |", "|---|---|---|---|"]
            shown = "null" if default is None else yaml.safe_dump(default, default_flow_style=True).strip()
            shown = shown.removesuffix("\n...").strip()
            lines.append(f"| `{dotted}` | `{tp.replace(' | ', ' or ')}` | `{shown}` | {help_text.replace('|', '/')} |")
        lines.append("")
    return "\n".join(lines)


def explain_lines(config: Any) -> list[tuple[str, Any, str]]:
    """(dotted key, resolved value, help) for `config show --explain`."""
    values = {}

    def walk(obj: Any, prefix: str) -> None:
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if dataclasses.is_dataclass(value):
                walk(value, f"{prefix}{f.name}.")
            else:
                values[f"{prefix}{f.name}"] = value

    walk(config, "")
    docs = {dotted: help_text for dotted, _, _, help_text in iter_docs(type(config))}
    return [(key, value, docs.get(key, "")) for key, value in values.items()]


def env_flag(name: str) -> bool:
    """True when an environment variable is set to a truthy value."""
    return os.environ.get(name, "").lower() in ("1", "true", "yes", "on")
