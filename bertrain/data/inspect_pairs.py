"""`bertrain inspect DATA_DIR --pairs`: decoded sample instances, realized batch statistics and the
shortcut audit of the sentence labels (`--audit`, see bertrain.data.pair_audit)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from pathlib import Path

import numpy as np
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from bertrain.config import Config, DataConfig, fit_micro_batch_size, load_config, micro_batch_size_for
from bertrain.data.format import open_prepared
from bertrain.data.loader import epoch_plan, train_dataset
from bertrain.data.masking import IGNORE_INDEX
from bertrain.data.pair_audit import (AUDIT_FILE, DEFAULT_INSTANCES, PROBE_NAMES, WARNING_MARGIN, ProbeResult,
                                      audit_pairs)
from bertrain.errors import DataError
from bertrain.tokenizer_file import token_strings

SAMPLES = 3
MIN_COVERAGE = 0.95   # warn when the epoch's full batches hold less of the training tokens
# Statistics cover at least this many tokens (or the whole epoch): ~3,000 masked positions, so the 80/10/10
# shares carry ~1 point of sampling noise and the masked fraction ~0.3 point.
MIN_STATISTICS_TOKENS = 20_000
RATE_WARNING_POINTS = 1.0   # warn when the realized masking rate is this far from data.mlm_probability


def _split_config(config: str | Path | Config | None) -> tuple[DataConfig, int, int]:
    """(data section, seed, micro-batch size of one process) of a config, a config file or shipped name, or None
    (the defaults)."""
    config = config if isinstance(config, Config) else load_config(config)
    return config.data, config.train.seed, micro_batch_size_for(config, world_size=1)


def _label_name(objective: str, label: int) -> str:
    if label == IGNORE_INDEX:
        return "no sentence label, MLM only: a piece of a sentence longer than an instance, or a one-sentence document"
    if objective == "nsp":
        return "positive: B follows A" if label == 0 else "negative: B from another document"
    return "positive: A before B" if label == 0 else "negative: A and B swapped"


def _decoded(tokens: list[str], ids, original, labels, attention):
    """A rich Text of one instance: [MASK]ed, randomized and kept-but-predicted tokens marked."""
    text = Text()
    for position in range(int(attention.sum())):
        token = tokens[int(ids[position])] if int(ids[position]) < len(tokens) else f"<{int(ids[position])}>"
        if labels[position] == IGNORE_INDEX:
            text.append(token, style="bold" if token in ("[CLS]", "[SEP]") else "")
        elif ids[position] != original[position]:
            was = tokens[int(original[position])]
            text.append(f"{token}({was})", style="bold red" if token == "[MASK]" else "bold yellow")
        else:
            text.append(token, style="bold green underline")
        text.append(" ")
    return text


def show_pairs(data_dir, config, num_batches: int, console) -> dict[str, float]:
    """Print decoded instances of the first batch and statistics over at least `num_batches` batches and
    MIN_STATISTICS_TOKENS tokens (or the whole epoch); return the statistics.

    Of `config` (see _split_config) the data section, train.seed and micro-batch size are used.
    """
    data_config, seed, micro_batch_size = _split_config(config)
    data_config = dataclasses.replace(data_config, path=str(data_dir), num_workers=0)
    prepared = open_prepared(data_dir)
    started = time.perf_counter()
    plan = epoch_plan(prepared, data_config, seed=seed, epoch=0)
    plan_seconds = time.perf_counter() - started
    if len(plan) == 0:
        raise DataError(f"{data_dir}: the train split gives no instances at max_seq_length "
                        f"{data_config.max_seq_length}.")
    micro_batch_size = fit_micro_batch_size(len(plan), micro_batch_size)
    dataset = train_dataset(prepared, data_config, seed=seed, epoch=0, micro_batch_size=micro_batch_size, rank=0,
                            world_size=1)
    split_tokens = max(prepared.manifest["splits"]["train"]["tokens"], 1)
    trained = plan.order[:len(dataset) * micro_batch_size]     # the epoch's full micro-batches
    tokens = token_strings(prepared.tokenizer_dir, prepared.vocab_size)
    counts = dict(instances=0, labelled=0, positives=0, eligible=0, chosen=0, masked=0, randomized=0, tokens=0, cells=0)
    lengths = []
    mask_id = prepared.special_tokens["mask"]
    pairs = data_config.objective != "none"
    for micro_batch in range(len(dataset)):
        if micro_batch >= num_batches and counts["tokens"] >= MIN_STATISTICS_TOKENS:
            break
        assembled = dataset.assemble(dataset.positions(micro_batch))
        batch = dataset.collator(assembled)
        ids, labels = batch["input_ids"].numpy(), batch["labels"].numpy()
        chosen = labels != IGNORE_INDEX
        if micro_batch == 0:
            console.rule(f"Sample instances ({data_config.objective}, {data_config.masking} masking)")
            for row in range(min(SAMPLES, len(ids))):
                label = f" — {_label_name(data_config.objective, int(batch['sentence_label'][row]))}" if pairs else ""
                console.print(f"instance {row}{label}", style="cyan")
                console.print(_decoded(tokens, ids[row], assembled.input_ids[row], labels[row],
                                       assembled.attention_mask[row]))
            console.print("legend: [MASK](original) red, random(original) yellow, predicted unchanged green",
                          style="dim", highlight=False, markup=False)
        counts["instances"] += len(ids)
        counts["positives"] += int((batch["sentence_label"] == 0).sum()) if pairs else 0
        counts["labelled"] += int((batch["sentence_label"] != IGNORE_INDEX).sum()) if pairs else 0
        counts["eligible"] += int((~assembled.special).sum())
        counts["chosen"] += int(chosen.sum())
        counts["masked"] += int((chosen & (ids == mask_id)).sum())
        counts["randomized"] += int((chosen & (ids != mask_id) & (ids != assembled.input_ids)).sum())
        counts["tokens"] += int(assembled.attention_mask.sum())
        counts["cells"] += ids.size
        lengths.append(assembled.attention_mask.sum(axis=1))
    length = np.concatenate(lengths)
    chosen = max(counts["chosen"], 1)
    stats = {
        "instances_per_epoch": float(len(plan)),
        "plan_seconds": plan_seconds,
        "batches": float(len(lengths)),
        "tokens": float(counts["tokens"]),
        "masked_positions": float(counts["chosen"]),
        "instances": float(counts["instances"]),
        "positive_fraction": counts["positives"] / max(counts["labelled"], 1) if pairs else float("nan"),
        "masked_fraction_of_eligible": counts["chosen"] / max(counts["eligible"], 1),
        "mask_share": counts["masked"] / chosen,
        "random_share": counts["randomized"] / chosen,
        "unchanged_share": (counts["chosen"] - counts["masked"] - counts["randomized"]) / chosen,
        "tokens_per_instance": float(length.mean()),
        "tokens_per_instance_min": float(length.min()),
        "tokens_per_instance_max": float(length.max()),
        "padding_fraction": 1 - counts["tokens"] / max(counts["cells"], 1),
        "coverage": plan.covered_tokens() / split_tokens,
        "coverage_in_batches": plan.covered_tokens(trained) / split_tokens,
    }
    whole = len(lengths) == len(dataset)
    _print_statistics(stats, counts, data_config, micro_batch_size, whole, console)
    return stats


def _print_statistics(stats: dict[str, float], counts: dict[str, int], data_config, micro_batch_size: int,
                      whole: bool, console) -> None:
    """The realized statistics next to the configured values, with the sample they come from."""
    table = Table(title=f"Realized statistics over {counts['instances']:,} instances ({counts['tokens']:,} tokens, "
                        f"{counts['chosen']:,} masked positions; {int(stats['batches'])} batch(es) of "
                        f"{micro_batch_size}{'; the whole epoch' if whole else ''})")
    table.add_column("statistic")
    table.add_column("value", justify="right")
    table.add_column("configured", justify="right")
    table.add_row("instances per epoch (plan built in)",
                  f"{int(stats['instances_per_epoch']):,} ({stats['plan_seconds']:.2f} s)", "")
    if data_config.objective != "none":
        table.add_row(f"{data_config.objective.upper()} positive fraction (share with a sentence label)",
                      f"{stats['positive_fraction']:.3f} ({counts['labelled'] / counts['instances']:.0%})", "0.500")
    table.add_row("masked fraction of eligible tokens", f"{stats['masked_fraction_of_eligible']:.3f}",
                  f"{data_config.mlm_probability:.3f}")
    keep = 1 - data_config.mask_prob - data_config.random_prob
    table.add_row(escape("[MASK] / random / unchanged"), "{:.2f} / {:.2f} / {:.2f}".format(
        stats["mask_share"], stats["random_share"], stats["unchanged_share"]),
        f"{data_config.mask_prob:.2f} / {data_config.random_prob:.2f} / {keep:.2f}")
    table.add_row("tokens per instance (mean, min, max)", "{:.1f}, {:.0f}, {:.0f}".format(
        stats["tokens_per_instance"], stats["tokens_per_instance_min"], stats["tokens_per_instance_max"]),
        f"max {data_config.max_seq_length}")
    table.add_row("padding fraction", f"{stats['padding_fraction']:.3f}", "")
    table.add_row("training tokens in the epoch's instances", "{:.1%} ({:.1%} in full batches)".format(
        stats["coverage"], stats["coverage_in_batches"]), f">= {MIN_COVERAGE:.0%}")
    console.print(table)
    if stats["coverage_in_batches"] < MIN_COVERAGE:
        why = ("the last incomplete batch is dropped. A smaller batch (or more data) keeps more"
               if stats["coverage"] >= MIN_COVERAGE else
               "two sentences that together exceed data.max_seq_length are truncated and the last incomplete batch "
               "is dropped. A longer max_seq_length or a smaller batch keeps more")
        console.print(f"[yellow]Warning:[/] this epoch trains on only {stats['coverage_in_batches']:.1%} of the "
                      f"training tokens ({stats['coverage']:.1%} are in its instances): {why}.")
    warning = masking_rate_warning(stats, data_config)
    if warning:
        console.print(f"[yellow]Warning:[/] {escape(warning)}", soft_wrap=True, highlight=False)


def masking_rate_warning(stats: dict[str, float], data_config) -> str | None:
    """A warning when the realized masking rate is more than RATE_WARNING_POINTS from the configured one."""
    realized, configured = stats["masked_fraction_of_eligible"], data_config.mlm_probability
    if abs(realized - configured) * 100 <= RATE_WARNING_POINTS:
        return None
    eligible = stats["tokens_per_instance"] - 3
    cap = data_config.max_predictions_per_seq
    why = (f" data.max_predictions_per_seq {cap} is below {configured:.0%} of the ~{eligible:.0f} tokens of an "
           f"instance: raise it to at least {int(configured * (data_config.max_seq_length - 2)) + 1}."
           if cap is not None and cap < configured * eligible else
           " Instances are very short (each predicts at least one token).")
    return (f"the realized masking rate is {realized:.1%} of eligible tokens, {abs(realized - configured) * 100:.1f} "
            f"points from data.mlm_probability {configured:.1%}.{why}")


def print_audit(results: list[ProbeResult], objective: str, console) -> bool:
    """Print the probe table and, when a probe beats the majority rate by more than its threshold (WARNING_MARGIN;
    more on a tiny corpus), a warning naming it. Returns whether any did."""
    first = results[0]
    table = Table(title=f"{objective.upper()} shortcut audit: lookup probes fit on {first.fit_instances:,} "
                        f"instances, scored on {first.held_out_instances:,} held-out instances of other "
                        f"documents (standard error {100 * first.standard_error:.1f} points over "
                        f"{first.independent:,} distinct first segments)")
    for column, justify in (("surface feature", "left"), ("held-out accuracy", "right"),
                            ("majority rate", "right"), ("margin", "right"), ("", "left")):
        table.add_column(column, justify=justify)
    for result in results:
        table.add_row(PROBE_NAMES[result.probe], f"{result.accuracy:.3f}",
                      f"{result.majority:.3f}", f"{100 * result.margin:+.1f} pts",
                      "[bold red]SHORTCUT[/]" if result.shortcut else "ok")
    console.print(table)
    leaks = [r for r in results if r.shortcut]
    if first.threshold > WARNING_MARGIN:
        console.print(f"Only {first.independent:,} distinct first segments were held out (a small corpus read for "
                      f"many epochs repeats them): margins under {100 * first.threshold:.1f} points (4 standard "
                      f"errors) cannot be told from its documents' own differences. More text gives a finer audit.")
    if leaks:
        named = ", ".join(f"{PROBE_NAMES[r.probe]} ({100 * r.margin:+.1f})" for r in leaks)
        console.print(f"[bold red]WARNING:[/] surface features predict the {objective.upper()} label more than "
                      f"{100 * first.threshold:.0f} points above the majority rate: {escape(named)}. The sentence "
                      f"head can learn this shortcut instead of discourse, and its accuracy overstates what it "
                      f"learned. Pairs built by this version of bertrain show none on shuffled text; on real text "
                      f"a small margin can also be the text's own (e.g. a colon followed by a code block).")
    else:
        console.print(f"No surface feature predicts the {objective.upper()} label: no probe beats the majority "
                      f"rate by more than {100 * first.threshold:.0f} points.")
    return bool(leaks)


def show_audit(data_dir, config, console, instances: int = DEFAULT_INSTANCES) -> list[ProbeResult]:
    """Run the shortcut audit on the training batches of `config` (see show_pairs) and print it."""
    data_config, seed, micro_batch_size = _split_config(config)
    if data_config.objective == "none":
        console.print("data.objective is none: no sentence label, nothing to audit.")
        return []
    data_config = dataclasses.replace(data_config, path=str(data_dir), num_workers=0)
    results = audit_pairs(open_prepared(data_dir), data_config, seed=seed, micro_batch_size=micro_batch_size,
                          instances=instances)
    print_audit(results, data_config.objective, console)
    table = [{"feature": PROBE_NAMES.get(r.probe, r.probe), "accuracy": r.accuracy, "majority": r.majority,
              "shortcut": r.shortcut} for r in results]
    with contextlib.suppress(OSError):  # a read-only DATA_DIR: the table was printed, the report goes without it
        (Path(data_dir) / AUDIT_FILE.format(objective=data_config.objective)).write_text(json.dumps(
            {"max_seq_length": data_config.max_seq_length, "held_out": results[0].held_out_instances, "probes": table}))
    return results
