"""Validation: MLM loss, accuracy and perplexity, sentence loss and accuracy, with fixed masks, on all ranks."""

from __future__ import annotations

import math
from typing import Callable, Optional

import torch

from bertrain.config import fit_micro_batch_size
from bertrain.console import first_time
from bertrain.data.loader import build_validation_loader
from bertrain.train.step import all_reduce_sum
from bertrain.train.stream import isolated_torch_rng


def validation_loader(prepared, data_config, *, seed: int, micro_batch_size: int, rank: int, world_size: int):
    """Up to data.eval_batches validation micro-batches; for a tiny split, one smaller micro-batch of all."""
    def build(size: int):
        return build_validation_loader(prepared, data_config, seed=seed, micro_batch_size=size, rank=rank,
                                       world_size=world_size, max_batches=data_config.eval_batches)

    loader = build(micro_batch_size)
    if len(loader) == 0 and loader.dataset is not None and len(loader.dataset.plan) >= world_size:
        loader = build(fit_micro_batch_size(len(loader.dataset.plan), micro_batch_size, world_size))
    return loader


def evaluate(model, accelerator, prepared, data_config, *, seed: int, micro_batch_size: int,
             progress: Optional[Callable[[int, int], None]] = None,
             warn: Optional[Callable[[str], None]] = None) -> dict:
    """Validation metrics over data.eval_batches micro-batches per rank; {} when nothing is predicted (then
    `warn` is called once per data directory). `progress(done, total)` follows the micro-batches."""
    inner = accelerator.unwrap_model(model)
    inner.eval()
    sums = torch.zeros(6, dtype=torch.float64)  # MLM CE, correct, predicted; sentence correct, labelled, CE
    with isolated_torch_rng():
        loader = validation_loader(prepared, data_config, seed=seed, micro_batch_size=micro_batch_size,
                                   rank=accelerator.process_index, world_size=accelerator.num_processes)
        if progress is not None:
            progress(0, len(loader))
        with torch.no_grad(), accelerator.autocast():
            for done, batch in enumerate(loader, 1):
                batch = {k: v.to(accelerator.device) for k, v in batch.items()}
                out = inner(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                            token_type_ids=batch["token_type_ids"], labels=batch["labels"],
                            sentence_label=batch.get("sentence_label"))
                sums[0] += out.mlm_loss_sum.double().cpu()
                sums[1] += out.mlm_correct.cpu()
                sums[2] += out.mlm_predictions.numel()
                if out.sentence_correct is not None:
                    sums[3] += out.sentence_correct.cpu()
                    sums[4] += out.sentence_count.cpu()  # labelled instances only
                    sums[5] += out.sentence_loss_sum.double().cpu()
                if progress is not None:
                    progress(done, len(loader))
    inner.train()
    ce, correct, predicted, sentence_correct, instances, sentence_ce = all_reduce_sum(accelerator, sums.tolist())
    if predicted == 0:
        _warn_nothing_to_evaluate(prepared, len(loader), warn)
        return {}
    record = {"mlm_loss": ce / predicted, "mlm_accuracy": correct / predicted,
              "mlm_perplexity": math.exp(min(ce / predicted, 50.0))}
    if instances:
        record.update(sentence_loss=sentence_ce / instances, sentence_accuracy=sentence_correct / instances)
    return record


def _warn_nothing_to_evaluate(prepared, batches: int, warn: Optional[Callable[[str], None]]) -> None:
    if warn is None or not first_time(f"nothing to evaluate in {prepared.path}"):
        return
    why = (f"{batches} validation micro-batch(es) had no masked token" if batches else
           "the data has no validation instances (no validation split, or fewer instances than processes)")
    warn(f"evaluation skipped: {why} in {prepared.path}; no eval records are written. Prepare the data with a "
         f"larger prepare.validation_fraction to evaluate.")
