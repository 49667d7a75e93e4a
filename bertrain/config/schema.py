"""The config schema: one dataclass per section, every key documented in its field's `help` (docs/config.md is
generated from these; a test keeps it in sync)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Optional, Union


def opt(default: Any, help: str, aliases: tuple[str, ...] = (), **kwargs: Any) -> Any:
    """A dataclass field with documentation (lists and dicts get a factory); `aliases` are names users
    also try for this key (other toolkits' spellings), suggested when they write one of them."""
    metadata = {"help": help, "aliases": aliases}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=metadata, **kwargs)
    return field(default=default, metadata=metadata, **kwargs)


# ---- Sections of a training config ----

# `model.unpad: auto` packs a micro-batch when its padding share reaches AUTO_MIN_PADDING_SHARE or padding share x
# hidden_size reaches AUTO_MIN_PADDED_WIDTH: packing saves ~24·H² FLOPs a padded token but costs gathers and one SDPA
# call per bucket per layer, a fixed cost a small H does not repay (measured with benchmarks/unpad.py: README).
AUTO_MIN_PADDING_SHARE = 0.30
AUTO_MIN_PADDED_WIDTH = 40.0


@dataclass
class DataConfig:
    """Which prepared corpus to train on and how batches are built from it."""

    path: str = opt("", "Prepared DATA_DIR written by `bertrain prepare` (also `--data`).")
    objective: Literal["nsp", "sop", "none"] = opt(
        "sop", "Sentence-level task: `nsp` (BERT), `sop` (ALBERT) or `none` (MLM only, one segment).")
    max_seq_length: int = opt(128, "Tokens per instance including [CLS] and [SEP]s.",
                              aliases=("seq_len", "seq_length", "max_length", "sequence_length"))
    short_seq_prob: float = opt(0.1, "Probability of a random shorter target length (Google's short_seq_prob).")
    masking: Literal["token", "whole_word", "ngram"] = opt(
        "token", "Masking unit: single tokens, whole words, or n-grams of up to `ngram_max` words (ALBERT). "
                 "[MASK] / random / kept is drawn once per unit (Google: per token).")
    mlm_probability: float = opt(0.15, "Fraction of eligible (non-special, non-padding) tokens chosen for prediction.",
                                  aliases=("masked_lm_prob", "mask_probability", "masking_probability"))
    mask_prob: float = opt(0.8, "Of the chosen tokens, fraction replaced by [MASK].")
    random_prob: float = opt(0.1, "Of the chosen tokens, fraction replaced by a random non-special token.")
    ngram_max: int = opt(3, "Longest n-gram (in words) for `masking: ngram`; n is drawn with probability ∝ 1/n.")
    max_predictions_per_seq: Optional[int] = opt(None, "Cap on predicted tokens per sequence (null: no cap).")
    pad_to_multiple_of: int = opt(8, "Dynamic padding rounds the batch length up to a multiple of this.")
    num_workers: Union[int, Literal["auto"]] = opt(
        "auto", "DataLoader worker processes per training process (batches are identical for any value). `auto` "
        "(default): 0, batches made in the training process, on every device. On an H200 (2026-11-27, bert_large "
        "seq 128) 4 workers made the loop slower, though its data wait fell from 5.7% to 0.7%: 0.83 of the bare step "
        "against 0.86 eager, 0.73 against 0.85 compiled (benchmarks/gpu_suite.sh, parts 2 and 5); since the "
        "training thread pins their batches itself, 0.87 against 0.83 eager (2026-11-28; compiled not yet measured, "
        "README *GPU*); since, a worker writes its batches into 6 shared buffers it keeps, and the training "
        "process takes one in 0.65-0.71x the time (128 rows, a 2-core CPU; README *GPU*). A number starts "
        "that many workers, which serve every epoch and prefetch 4 micro-batches each, and send them through "
        "/dev/shm: with under 1 GiB free there the run's first line warns (Docker's default is 64 MiB: run "
        "containers with --shm-size=8g or --ipc=host). On CUDA batches are page-locked and copied with non_blocking "
        "whatever the value. Evaluation uses workers only when this is a number.")
    eval_batches: int = opt(20, "Validation batches per evaluation (fixed masks, same every time).")


@dataclass
class TokenizerConfig:
    """How `bertrain prepare` / `bertrain tokenizer train` trains the tokenizer."""

    kind: Literal["wordpiece", "unigram"] = opt(
        "wordpiece", "`wordpiece` (BERT, `##` continuations) or `unigram` (ALBERT/SentencePiece, `▁` word starts).")
    vocab_size: int = opt(30522, "Target vocabulary size including special tokens.")
    lowercase: bool = opt(True, "Lowercase text before tokenizing (WordPiece: BERT uncased). Lowercasing only: "
                                "accents, vowel signs and other marks stay (see `strip_accents`).")
    strip_accents: Optional[bool] = opt(
        False, "Strip accents: decompose (NFKD) and drop every combining mark, as BERT-uncased English does (the "
        "wikipedia_en, wikipedia_en_unigram, gutenberg_en and pydoc recipes set it). It also deletes Hindi vowel "
        "signs, Thai vowels and tone marks, Japanese dakuten (が->か), Arabic hamza, German umlauts and Russian "
        "й->и: leave it false for other languages. null: false.")
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
    hidden_dropout_prob: float = opt(0.1, "Dropout on embeddings and sublayer outputs, in [0, 1).")
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
    float32_residual: bool = opt(
        False, "Under bf16/fp16 mixed precision, keep LayerNorm outputs (the residual stream between sublayers) in "
        "float32, as CUDA's autocast does for transformers. false: in the half type, as Megatron-LM (LayerNorm "
        "statistics still in float32): a bert-large layer's forward + backward moves 24% fewer bytes outside its "
        "matrix multiplies and attention (benchmarks/residual_bytes.py) and keeps 13% fewer activation bytes for "
        "backward. No effect without mixed precision.")
    unpad: Literal["auto", "true", "false"] = opt(
        "auto", "Compute on real tokens only in training and evaluation (a micro-batch's sequences packed, "
        "attention kept inside each sequence; same losses as padded within float rounding). `auto`: where that "
        f"was measured at least as fast on a CPU: a micro-batch with >= {AUTO_MIN_PADDING_SHARE:.0%} padding, or "
        f"padding share x hidden_size >= {AUTO_MIN_PADDED_WIDTH:g} (hidden 768 from "
        f"{AUTO_MIN_PADDED_WIDTH / 768:.1%} padding); `true`: always, `false`: never. "
        "Inference and export always run padded.")
    init_from: Optional[str] = opt(
        None, "Start from existing weights: a local transformers BERT/ALBERT directory (continued pretraining) "
        "or a bertrain checkpoint dir / RUN_DIR (e.g. BERT phase 2 from phase 1). Shapes must match this section, "
        "and its tokenizer this run's DATA_DIR's (checked: exit 2 otherwise); optimizer and lr schedule start fresh.")


@dataclass
class OptimConfig:
    """Optimizer and learning-rate schedule."""

    name: Literal["adamw", "lamb"] = opt("adamw", "`adamw`, or `lamb` for large-batch recipes (ALBERT): a trust ratio "
                                                   "per weight, the fused query/key/value as their three, none for "
                                                   "biases and LayerNorms (as Google's and NVIDIA's LAMB).",
                                         aliases=("type", "optimizer_name"))
    lr: float = opt(1e-4, "Peak learning rate (must be positive).", aliases=("learning_rate",))
    weight_decay: float = opt(
        0.01, "Decoupled weight decay on weight matrices and embeddings (never biases or LayerNorm).")
    betas: list[float] = opt([0.9, 0.999], "Adam betas.")
    eps: float = opt(1e-6, "Adam epsilon.")
    max_grad_norm: Optional[float] = opt(1.0, "Clip the global gradient norm to this (null: no clipping).")
    schedule: Literal["linear", "cosine", "constant"] = opt(
        "linear", "After warmup: linear decay to 0, cosine decay to 0, or constant.")
    warmup_steps: int = opt(10000, "Linear warmup length in optimizer steps: step s runs at lr x (s-1)/warmup_steps "
                                   "(step 1 at 0, the peak at step warmup_steps+1, as transformers' schedules); "
                                   "warned about when longer than the run.", aliases=("num_warmup_steps", "warmup"))
    warmup_fraction: Optional[float] = opt(
        None, "Warmup as a fraction of total steps; overrides warmup_steps when set.")


@dataclass
class TrainConfig:
    """The training run: budget, batch, precision, checkpoints, evaluation."""

    output_dir: str = opt(
        "runs/bertrain", "RUN_DIR: checkpoints, metrics.jsonl and the resolved config (also `--run-dir`).")
    seed: int = opt(42, "Seed of initialization, pair plans, masking and data order.")
    batch_size: int = opt(256, "Global batch in sequences per optimizer step (all processes, all accumulation steps).",
                           aliases=("train_batch_size", "global_batch_size"))
    gradient_accumulation_steps: int = opt(1, "Micro-batches per optimizer step on each process.")
    max_steps: Optional[int] = opt(100000, "Budget in optimizer steps (a step is one optimizer update).",
                                    aliases=("num_train_steps", "total_steps", "steps", "train_steps"))
    max_tokens: Optional[int] = opt(None, "Budget in (non-padding) training tokens; overrides max_steps when set.")
    mixed_precision: Literal["auto", "no", "fp16", "bf16"] = opt(
        "auto", "Autocast precision. `auto` picks per device when the run starts: bf16 on CUDA GPUs that support it "
        "(Ampere and newer), fp16 with a loss scaler on older GPUs, bf16 on CPUs with native bf16 (AVX512-BF16 or "
        "AMX), else fp32 (`no`): on a CPU without native bf16 a bf16 matmul is many times slower than fp32. "
        "`fp16` needs a CUDA GPU (refused on a CPU); `bf16` on a CPU without native bf16 warns. Under fp16 a step "
        "whose gradients overflow at the current loss scale is skipped and not counted (the scale halves; read every "
        "step, logged as `loss_scale`), and a scale below 1e-4 stops the run as diverged (fairseq's rule).")
    tf32: bool = opt(True, "Allow TF32 tensor cores for matmuls and convolutions that run in fp32 on CUDA (Ampere "
                           "and newer): several times faster, with a 10-bit mantissa per product. Ignored on CPUs.")
    save_every: int = opt(1000, "Checkpoint every N optimizer steps (also at the end and on a signal).")
    keep_last: int = opt(3, "Checkpoints kept; older ones are removed only after a new one is complete.")
    eval_every: int = opt(1000, "Evaluate on the validation split every N steps and after the last (0: never).")
    log_every: int = opt(10, "Log metrics every N steps.")
    max_bad_steps: int = opt(10, "Stop after this many non-finite losses in a row (such steps are skipped; "
                                 "without fp16 they still count as steps).")
    requeue_exit_code: int = opt(75, "Exit code after a SIGTERM/SIGUSR1-triggered checkpoint, for job scripts to "
                                 "requeue (after Ctrl-C: 130).")
    deterministic: bool = opt(False, "torch.use_deterministic_algorithms (exact resume tests use it).")
    compile: Union[bool, Literal["auto"]] = opt(
        "auto", "torch.compile each encoder layer; the first step takes 10-20 s longer. `auto` (default): compiled "
        "on a CUDA GPU (compute capability 7.0+, Triton installed) when the run's schedule has at least 5,000 steps "
        "and train.deterministic (which GPU exact-resume checks set) is off; on an H200 the compiled loop ran "
        "1.03-1.23x the eager one's tokens/s (bert_base, albert_base with LAMB and bert_large at seq 128, bert_base "
        "at 512), bert_large's 1.27-1.30x on 2026-11-28 (README, GPU). Off on CPUs (on 2 idle CPU cores tiny_bert's "
        "step took 1.13x as long compiled). If compiling fails under `auto`, torch runs that code eager and warns; "
        "`true` stops the run instead.")
    threads: Union[int, Literal["auto"]] = opt(
        "auto", "Intra-op CPU threads of a CPU run (torch.set_num_threads). `auto` (default): on a CPU, one "
        "forward + backward of a micro-batch is timed at torch's default count (the cores) and at fewer threads "
        "when the run starts, every 2 minutes and soon after the throughput drops, and the run uses the fastest, "
        "keeping the default unless another is over 15% faster: where another process keeps a core busy, "
        "the threads of every operation wait for the one whose core is taken (on 2 cores, 3-5x slower than 1 "
        "thread); on an idle machine nothing changes. `auto` leaves torch's count alone on a GPU, when "
        "OMP_NUM_THREADS is set (`bertrain launch` and torchrun set it per process), with train.deterministic "
        "(the count changes float rounding; set a number to get the same bits in every session) and with "
        "train.compile true (torch.compile compiles for the count it runs at: each other count compiled again). "
        "A number sets that count everywhere.")
    stop_at_step: Optional[int] = opt(
        None, "Save and stop (exit 0) after this step without changing the schedule: splits a run into jobs; "
        "resume with the same config.")


@dataclass
class LoggingConfig:
    """Where metrics go besides RUN_DIR/metrics.jsonl: wandb, and RUN_DIR/report.html."""

    wandb: Literal["off", "online", "offline", "disabled"] = opt(
        "off", "Weights & Biases mode; `online` falls back to offline when the network is unreachable.")
    wandb_project: str = opt("bertrain", "wandb project name.")
    wandb_run_name: Optional[str] = opt(None, "wandb run name (null: RUN_DIR's name).")
    wandb_init_timeout: float = opt(30.0, "Seconds to wait for wandb online before falling back to offline.")
    report: bool = opt(True, "Rewrite RUN_DIR/report.html (the page of `bertrain report`: curves, data, verdict) "
                             "after each evaluation and when the run ends; false: never.")


@dataclass
class Config:
    """A training config: one section per concern."""

    data: DataConfig = field(default_factory=DataConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)


# ---- A data recipe (`bertrain prepare --recipe`) ----


@dataclass
class SourceConfig:
    """One input: a path or glob of files, a `load_from_disk` directory, or a hub dataset name."""

    path: str = opt("", "File, directory, glob (`corpus/**/*.txt`) or, with `format: hub`, a dataset name.")
    format: Literal["auto", "text", "jsonl", "json", "parquet", "arrow", "hub", "pydoc"] = opt(
        "auto", "Input format; `auto` decides by extension (.gz/.zst are decompressed); "
        "`arrow` is a `datasets.save_to_disk` directory; `hub` uses datasets.load_dataset(streaming=True); "
        "`pydoc` (path `pydoc_data.topics`) is CPython's reference manual, built in: one document per topic.")
    text_field: str = opt("text", "Field holding the document text in JSON/Parquet/datasets records.")
    text_layout: Literal["auto", "sentence_per_line", "paragraphs"] = opt(
        "auto", "`.txt` layout: BERT's one sentence per line with blank lines between documents, or plain "
        "text whose blank lines separate paragraphs of one document per file; `auto` guesses per file.")
    name: Optional[str] = opt(None, "Hub dataset configuration name (e.g. `20231101.en`).")
    split: str = opt("train", "Hub/datasets split to read.")
    data_files: Optional[list[str]] = opt(None, "Hub format: explicit data files passed to load_dataset.")
    max_documents: Optional[int] = opt(None, "Read at most this many documents from this source.")
    group_by: Union[list[str], str, None] = opt(
        None, "JSON/Parquet/datasets/hub records: consecutive records with equal values of these fields "
        "(e.g. `[book, chapter]`; dotted paths reach nested fields) become one document, each record's "
        "text a paragraph. Without it every record is a document: one-sentence records make no "
        "sentence pairs and short instances.")


@dataclass
class PrepareConfig:
    """Reading, cleaning, deduplicating, splitting and sharding the corpus."""

    sources: list[SourceConfig] = opt([], "Inputs, each a `SourceConfig` mapping (keys below); "
                                          "`--set prepare.sources.N.KEY=VALUE` changes entry N (from 0).")
    validation_fraction: float = opt(0.005, "Fraction of documents (by hash) kept for validation.")
    num_shards: int = opt(8, "Output shards (balanced by size).")
    workers: int = opt(2, "Parallel worker processes for tokenizing shards.")
    dedup: bool = opt(True, "Remove exact-duplicate documents.")
    on_decode_error: Literal["error", "replace", "skip"] = opt(
        "error", "Invalid UTF-8: stop with file/line/byte, or replace / skip the line and count it.")
    on_bad_record: Literal["error", "skip"] = opt(
        "error", "JSON record without a string text field or a group_by field: stop naming file and line, or skip and "
        "count it.")
    max_line_chars: int = opt(
        1_000_000, "Longer lines are split into pieces of at most this many characters (counted).")
    min_sentence_chars: int = opt(1, "Sentences shorter than this are dropped (counted).")
    sentence_splitter: Literal["auto", "rules", "sentencex", "pythainlp"] = opt(
        "auto", "How text (not one-sentence-per-line files) is split into sentences. `auto`: chosen per paragraph "
        "by its script, so mixed-language corpora need no tags: the rules (terminal punctuation of any script: "
        "`. ! ? …` before a space, CJK `。！？`, Hindi `। ॥`, Arabic `؟ ۔`, ...; abbreviations, initials, German "
        "ordinals) for every script but Thai, which marks no sentence ends: pythainlp when installed "
        "(`pip install 'bertrain[thai]'`; prepare warns when Thai text is split without it). `rules`: the rules "
        "only; `sentencex`: the sentencex library (`pip install 'bertrain[sentencex]'`, ~300 languages); "
        "`pythainlp`: pythainlp for every paragraph.")
    sentence_language: Optional[str] = opt(
        None, "ISO 639-1 code (e.g. `de`, `th`) to split every paragraph as that language instead of detecting "
        "its script: `th` takes pythainlp under `auto`; `sentencex` is given it (null: the language of the "
        "paragraph's script, e.g. Cyrillic -> ru).")
    max_document_chars: int = opt(
        10_000_000, "Plain-text files (one document per file) longer than this are cut into several "
        "documents at paragraph boundaries (counted), which keeps memory bounded.")
    word_segmenter: Literal["auto", "none", "zh", "ja"] = opt(
        "auto", "Where the words of whole-word and n-gram masking come from in text without spaces. `auto`: each "
        "document whose letters are at least 30% Han or kana is cut into words by a segmenter, Japanese (fugashi + "
        "unidic-lite, `pip install 'bertrain[ja]'`) when 5% of those are kana, else Chinese (rjieba, `pip install "
        "'bertrain[zh]'`); other documents use the tokenizer's word marks (spaces, punctuation). `zh` / `ja`: that "
        "segmenter for every document. `none`: the tokenizer's marks everywhere (with WordPiece every Chinese "
        "character is a word, as in Google's BERT; with Unigram an unspaced run is one word).")


@dataclass
class Recipe:
    """A data recipe: what `bertrain prepare --recipe` reads."""

    prepare: PrepareConfig = field(default_factory=PrepareConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
