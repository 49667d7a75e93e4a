"""`bertrain prepare`: raw corpora -> tokenizer + memory-mapped DATA_DIR in stages, each skipped when made from
the same inputs and settings. A job array runs stages 1-2 once under a lock; the last job writes the manifest."""

from __future__ import annotations

import shutil
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from rich.console import Console

from bertrain.config import PrepareConfig, Recipe, TokenizerConfig
from bertrain.config.validate import validate
from bertrain.data.format import SPLITS, open_prepared
from bertrain.data.prepare.documents import build_documents, resolve_inputs
from bertrain.data.prepare.manifest import build_manifest, replaced_data
from bertrain.data.prepare.normalization import measure_normalization
from bertrain.data.prepare.pool import Terminated, Workers, sigterm_raises
from bertrain.data.prepare.report import report
from bertrain.data.prepare.shards import build_shards, pending_shards
from bertrain.data.prepare.tokenizer_stage import build_tokenizer
from bertrain.data.prepare.workdir import (STAGE_VERSION, WORK, WORD_UNITS_VERSION, check_out_dir, clear,
                                           documents_settings, locked, read_json, settings_hash, shard_name,
                                           tokenizer_settings, write_json)
from bertrain.data.tokenizer import require_vocab_size, tokenizer_facts
from bertrain.errors import EXIT_CTRL_C, EXIT_REQUEUE, DataError, Interrupted, UsageError
from bertrain.files import file_sha256
from bertrain.special_tokens import SPECIAL_IDS
from bertrain.tokenizer_file import load_tokenizer, tokenizer_file

__all__ = ["prepare_corpus"]


@dataclass
class _Plan:
    """What one prepare run works from: its settings, inputs, and the keys its outputs are checked against."""

    out: Path
    config: PrepareConfig
    tokenizer_config: TokenizerConfig
    inputs: list[tuple[Any, list]]
    sources: list[dict]
    documents_key: str            # stage 1's key: sources and prepare settings
    tokenizer_key: str            # stage 2's key: stage 1's and the tokenizer's
    key: str                      # stages 3-4's key: stage 2's and the word units'
    settings: dict[str, Any]
    only: Optional[list[tuple[str, str]]]   # the shards a job-array task tokenizes (None: all)
    counts: Counter
    skipped: list


def _tokenizer_source(tokenizer_config: TokenizerConfig) -> dict[str, Any]:
    """What the tokenizer is made from: an existing file (by content) or the training settings."""
    if not tokenizer_config.path:
        return tokenizer_settings(tokenizer_config)
    path = tokenizer_file(tokenizer_config.path)
    if not path.is_file():
        raise DataError(f"--tokenizer {tokenizer_config.path}: no tokenizer.json there.")
    return {"path": str(tokenizer_config.path), "sha256": file_sha256(path)}


def _plan(out: Path, config: PrepareConfig, tokenizer_config: TokenizerConfig,
          shard_index: Optional[int]) -> _Plan:
    """Resolve the sources and compute the stage keys."""
    counts: Counter = Counter()
    skipped: list = []
    inputs = resolve_inputs(config, counts, skipped)
    documents_key = settings_hash({"version": STAGE_VERSION, "settings": documents_settings(config),
                                   "inputs": [[item.path, item.format, item.size, item.mtime_ns]
                                              for _, items in inputs for item in items]})
    tokenizer_source = _tokenizer_source(tokenizer_config)
    only = None
    if shard_index is not None:
        only = [("train", shard_name(shard_index))] + ([("validation", shard_name(0))] if shard_index == 0 else [])
    tokenizer_key = settings_hash({"documents": documents_key, "tokenizer": tokenizer_source})
    word_units = {"word_segmenter": config.word_segmenter, "version": WORD_UNITS_VERSION}
    return _Plan(out=out, config=config, tokenizer_config=tokenizer_config, inputs=inputs,
                 sources=[item.record() for _, items in inputs for item in items], documents_key=documents_key,
                 tokenizer_key=tokenizer_key, key=settings_hash({"tokenizer": tokenizer_key, "word_units": word_units}),
                 settings={"prepare": documents_settings(config), "tokenizer": tokenizer_source,
                           "word_units": word_units},
                 only=only, counts=counts, skipped=skipped)


def _up_to_date(plan: _Plan, console: Any) -> Optional[dict[str, Any]]:
    """The manifest when DATA_DIR is complete for these inputs; a damaged one is removed."""
    manifest = read_json(plan.out / "manifest.json")
    if manifest is None or manifest.get("settings", {}).get("input_key") != plan.key:
        return None
    try:
        prepared = open_prepared(plan.out)
        for split in SPLITS:
            prepared.split(split)
        console.print(f"{plan.out} is up to date (fingerprint {prepared.fingerprint[:12]}); nothing to do.")
        return prepared.manifest
    except DataError:
        console.print(f"{plan.out}: the prepared data is incomplete or damaged; rebuilding what is missing.")
        clear(plan.out, "manifest.json")
        return None


def _run_documents(plan: _Plan, pool: Workers, console: Any, timings: dict[str, float]) -> dict[str, Any]:
    """Stage 1, and its record in work/documents.json."""
    built = build_documents(plan.out, plan.inputs, plan.config, pool, plan.counts, plan.skipped, console)
    record = {"key": plan.documents_key, "counts": dict(plan.counts), "skipped_files": plan.skipped, **built}
    write_json(plan.out / WORK / "documents.json", record)
    timings["documents"] = built["seconds"]
    return record


def _documents_record(plan: _Plan, pool: Workers, console: Any, timings: dict[str, float]) -> dict[str, Any]:
    """Stage 1's record: kept when its key matches, else everything is cleared and stage 1 runs."""
    documents = read_json(plan.out / WORK / "documents.json")
    if documents is not None and documents.get("key") == plan.documents_key:
        return documents
    if documents is not None or (plan.out / "manifest.json").exists():
        console.print("Sources or settings changed since the last run: rebuilding everything.")
    clear(plan.out, "manifest.json", "tokenizer", "train", "validation", f"{WORK}/tokenizer.json",
          f"{WORK}/shards", f"{WORK}/documents.json")
    return _run_documents(plan, pool, console, timings)


def _with_documents_text(plan: _Plan, documents: dict[str, Any], tokenizer_done: bool, pool: Workers,
                         console: Any, timings: dict[str, float]) -> dict[str, Any]:
    """Stage 1's record, run again when work remains but its intermediate text was removed."""
    pending = pending_shards(plan.out, documents, plan.key, plan.only)
    if (not tokenizer_done or pending) and not (plan.out / WORK / "documents").is_dir():
        # The last run finished and removed its intermediate text; reading again gives the
        # same documents (everything is deterministic), so finished outputs stay valid.
        console.print("Reading the sources again (the intermediate documents were removed).")
        return _run_documents(plan, pool, console, timings)
    if "documents" not in timings:
        console.print("Documents: already done (same sources and settings).")
    return documents


def _run_tokenizer(plan: _Plan, documents: dict[str, Any], console: Any, timings: dict[str, float]) -> dict:
    """Stage 2 (clearing what depended on the old tokenizer), and its record in work/tokenizer.json."""
    clear(plan.out, "manifest.json", "train", "validation", f"{WORK}/shards")
    tick = time.perf_counter()
    stats = build_tokenizer(plan.out, documents, plan.tokenizer_config, console)
    timings["tokenizer"] = time.perf_counter() - tick
    # Measured now, while the documents' text exists: a manifest gathered again later (after the text was removed)
    # gets the same stats, and so the same fingerprint.
    stats["normalization"] = measure_normalization(plan.out, load_tokenizer(plan.out / "tokenizer"))
    record = {"key": plan.tokenizer_key, "stats": stats}
    write_json(plan.out / WORK / "tokenizer.json", record)
    return record


def _stages_1_2(plan: _Plan, pool: Workers, console: Any,
                timings: dict[str, float]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Stages 1 and 2 under the DATA_DIR lock (once for all tasks of a job array): their records."""
    with locked(plan.out):
        (plan.out / WORK).mkdir(parents=True, exist_ok=True)
        documents = _documents_record(plan, pool, console, timings)
        tokenizer_record = read_json(plan.out / WORK / "tokenizer.json")
        tokenizer_done = tokenizer_record is not None and tokenizer_record.get("key") == plan.tokenizer_key
        documents = _with_documents_text(plan, documents, tokenizer_done, pool, console, timings)
        plan.counts, plan.skipped = Counter(documents["counts"]), documents["skipped_files"]
        if tokenizer_done:
            console.print("Tokenizer: already done.")
        else:
            tokenizer_record = _run_tokenizer(plan, documents, console, timings)
    return documents, tokenizer_record


def _facts(out: Path, tokenizer_record: dict[str, Any], console: Any) -> dict[str, Any]:
    """The manifest's tokenizer record; unusual special-token ids are recorded, with a warning."""
    stats = tokenizer_record["stats"]
    facts = tokenizer_facts(load_tokenizer(out / "tokenizer"), stats["kind"], stats["sha256"])
    if facts["special_tokens"] != SPECIAL_IDS:
        console.print(f"[yellow]Warning:[/] this tokenizer's special-token ids are {facts['special_tokens']}, "
                      f"not bertrain's usual 0-4; the manifest records them.")
    return facts


def _finish(plan: _Plan, documents: dict[str, Any], stats: dict[str, Any], facts: dict[str, Any],
            shard_index: Optional[int], console: Any) -> tuple[Optional[dict[str, Any]], list[str]]:
    """Stage 4 once no shard is pending: (the manifest, []), or (None, the pending shards)."""
    out = plan.out
    pending = [f"{split}/{shard['name']}" for split, shard in pending_shards(out, documents, plan.key)]
    if pending:
        if not (out / WORK / "documents").is_dir():
            raise DataError(f"{out}: shards {', '.join(pending[:4])} are missing and the intermediate "
                            f"documents were removed; run prepare again without --shard-index to rebuild.")
        by_split = ", ".join(f"{sum(name.startswith(split + '/') for name in pending)} {split}" for split in SPLITS
                             if any(name.startswith(split + "/") for name in pending))
        console.print(f"Shard {shard_index} done; {len(pending)} shard(s) still to do ({by_split}). The manifest "
                      f"is written by the last job, or by `bertrain prepare` without --shard-index.")
        return None, pending
    existing = read_json(out / "manifest.json")
    if existing is None or existing.get("settings", {}).get("input_key") != plan.key:
        if "normalization" not in stats:  # a tokenizer record of an older bertrain
            stats = {**stats, "normalization": measure_normalization(out, load_tokenizer(out / "tokenizer"))}
        manifest = build_manifest(out, documents, stats, facts, plan.key, plan.settings, plan.sources,
                                  plan.counts, plan.skipped)
    else:
        manifest = open_prepared(out).manifest
    shutil.rmtree(out / WORK / "documents", ignore_errors=True)
    return manifest, []


def _interrupted(plan: _Plan, documents: Optional[dict[str, Any]]) -> str:
    """The one line a Ctrl-C or SIGTERM ends prepare with: how far it got, and that the same command resumes."""
    if documents is None:
        return "prepare interrupted before tokenizing the shards; run the same command again to resume."
    shards = pending_shards(plan.out, documents, plan.key, plan.only)
    total = len(plan.only) if plan.only is not None else sum(len(documents["shards"][split]) for split in SPLITS)
    return f"prepare interrupted; {total - len(shards)} of {total} shards done; run the same command again to resume."


def prepare_corpus(recipe: Recipe, out_dir: str | Path, *, shard_index: Optional[int] = None,
                   console: Any = None) -> dict[str, Any]:
    """Prepare DATA_DIR from a recipe; the manifest, or `complete: False` while job-array siblings run. A SIGTERM
    (a preemption) stops it like a Ctrl-C, but exits EXIT_REQUEUE: the same command resumes."""
    with sigterm_raises():
        try:
            return _prepare(recipe, out_dir, shard_index, console or Console(stderr=True, quiet=True))
        except Terminated:  # before the stages began (or after they ended): nothing to report but the resume
            raise Interrupted("prepare interrupted; run the same command again to resume.", EXIT_REQUEUE) from None


def _prepare(recipe: Recipe, out_dir: str | Path, shard_index: Optional[int], console: Any) -> dict[str, Any]:
    """prepare_corpus's work: checks first, then the stages that are not done yet."""
    started = time.perf_counter()
    validate(recipe)  # a recipe built in code gets the checks a loaded one got
    config, tokenizer_config = recipe.prepare, recipe.tokenizer
    if not tokenizer_config.path:
        require_vocab_size(tokenizer_config)  # before reading the corpus, which may take hours
    if shard_index is not None and not 0 <= shard_index < config.num_shards:
        raise UsageError(f"--shard-index {shard_index} is outside 0..{config.num_shards - 1} "
                         f"(--num-shards {config.num_shards}).")
    out = Path(out_dir)
    check_out_dir(out)
    plan = _plan(out, config, tokenizer_config, shard_index)
    manifest = _up_to_date(plan, console)
    if manifest is not None:
        return manifest
    replaced = replaced_data(out, plan.settings, plan.sources, console)
    pool = Workers(config.workers)
    timings: dict[str, float] = {}
    documents = None
    try:
        documents, tokenizer_record = _stages_1_2(plan, pool, console, timings)
        facts = _facts(out, tokenizer_record, console)
        tick = time.perf_counter()
        build_shards(out, documents, facts, config.word_segmenter, plan.key, plan.only, pool, console)
        timings["tokenize"] = time.perf_counter() - tick
    except KeyboardInterrupt as stop:
        pool.close(interrupted=True)
        code = EXIT_REQUEUE if isinstance(stop, Terminated) else EXIT_CTRL_C
        raise Interrupted(_interrupted(plan, documents), code) from None
    finally:
        pool.close()
    with locked(out):
        manifest, pending = _finish(plan, documents, tokenizer_record["stats"], facts, shard_index, console)
    if manifest is None:
        return {"complete": False, "pending_shards": pending}
    report(manifest, out, console, time.perf_counter() - started, timings, documents.get("text_layouts", []))
    if replaced and replaced != manifest["fingerprint"]:
        console.print(f"Replaced the prepared data of {out}: fingerprint {replaced[:12]} → "
                      f"{manifest['fingerprint'][:12]}.", highlight=False, markup=False, soft_wrap=True)
    return manifest
