"""Which config keys may change between a checkpoint and the run that resumes it (train/resume_rules.py applies
them). Torch-free, so that the CLI's `--force` help is written from them."""

from __future__ import annotations

# Prefixes of keys that may change freely: they do not change what the run computes (train.compile, train.threads
# and model.unpad change only the order of floating-point sums: the same maths, equal up to float32 rounding).
FREE_KEYS = ("train.output_dir", "train.save_every", "train.eval_every", "train.log_every", "train.keep_last",
             "train.max_bad_steps", "train.requeue_exit_code", "train.compile", "train.threads", "train.stop_at_step",
             "logging.", "data.path", "data.num_workers", "data.eval_batches", "model.gradient_checkpointing",
             "model.unpad", "model.init_from", "model.initializer_range", "tokenizer.")
# The budget: a longer one is free (the schedule's decay is recomputed for it); any other change needs --force.
BUDGET_KEYS = ("train.max_steps", "train.max_tokens")
# Allowed with --force, and only these (besides the prepared data and the number of processes).
FORCE_KEYS = (
    # data: what the remaining steps are trained on
    "data.objective", "data.max_seq_length", "data.short_seq_prob", "data.masking", "data.mlm_probability",
    "data.mask_prob", "data.random_prob", "data.ngram_max", "data.max_predictions_per_seq", "data.pad_to_multiple_of",
    # batch layout (the data position is rescaled to the new global micro-batch)
    "train.batch_size", "train.gradient_accumulation_steps",
    # optimizer settings and schedule (a new schedule continues at the checkpoint's step)
    "optim.lr", "optim.weight_decay", "optim.betas", "optim.eps", "optim.max_grad_norm", "optim.schedule",
    "optim.warmup_steps", "optim.warmup_fraction",
    # numerics and randomness: the run stays valid but is no longer the run it would have been
    "train.mixed_precision", "train.tf32", "train.deterministic", "train.seed",
    "model.hidden_dropout_prob", "model.attention_probs_dropout_prob", "model.float32_residual")
# Never, not even with --force: the weights (or the optimizer state) would not fit.
NEVER_KEYS = ("optim.name", "model.type", "model.vocab_size", "model.hidden_size", "model.num_hidden_layers",
              "model.num_attention_heads", "model.intermediate_size", "model.max_position_embeddings",
              "model.type_vocab_size", "model.embedding_size", "model.num_hidden_groups", "model.inner_group_num",
              "model.hidden_act", "model.layer_norm_eps")


def _by_section(keys: tuple[str, ...]) -> str:
    """`data.a, data.b, optim.c` as `data: a, b; optim: c`."""
    sections: dict[str, list[str]] = {}
    for key in keys:
        section, _, name = key.partition(".")
        sections.setdefault(section, []).append(name)
    return "; ".join(f"{section}: {', '.join(names)}" for section, names in sections.items())


FORCE_HELP = (f"Resume although the prepared data, the number of processes, a shorter budget or any of these keys "
              f"changed ({_by_section(FORCE_KEYS)}); nothing else (not the model's shape, optim.name or the "
              f"tokenizer). A longer budget needs no --force.")
