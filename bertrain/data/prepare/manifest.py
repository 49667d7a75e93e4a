"""Stage 4, manifest: when every shard is done, gather the shard records into DATA_DIR/manifest.json. Also the notice
prepare starts with when it will replace a finished manifest made from other inputs (runs on it may not resume)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any, Optional

from bertrain.config import flatten
from bertrain.data.format import SPLITS, shard_sha256, token_dtype_for, write_manifest
from bertrain.data.prepare.documents import unaccounted_documents
from bertrain.data.prepare.shards import shard_record
from bertrain.data.prepare.workdir import read_json
from bertrain.errors import DataError

# Per-shard counts summed by split (e.g. "train_unknown_tokens") for the manifest's counts and stats.
SHARD_TOTALS = ("sentences_empty_after_tokenizing", "documents_empty_after_tokenizing", "unknown_tokens",
                "words", "chars", "documents_segmented_zh", "documents_segmented_ja")
MAX_CHANGES_NAMED = 4


def _gather_splits(out: Path, documents: dict[str, Any], key: str) -> tuple[dict[str, Any], Counter]:
    """(the manifest's splits, per-split totals of SHARD_TOTALS) from the shard records."""
    splits: dict[str, Any] = {}
    shard_totals: Counter = Counter()
    for split in SPLITS:
        records = []
        for shard in documents["shards"][split]:
            record = shard_record(out, split, shard["name"], key)
            if record is None:
                raise DataError(f"{out}: shard {split}/{shard['name']} is not complete; run prepare again.")
            for field in SHARD_TOTALS:
                shard_totals[f"{split}_{field}"] += record.get(field, 0)
            if record["documents"] or (split == "validation" and not records):
                # A shard tokenized by an older bertrain (a resumed prepare) has no checksum in its record yet.
                sha256 = record.get("sha256") or shard_sha256(out / split, record["name"])
                records.append({**{k: record[k] for k in ("name", "documents", "sentences", "tokens")},
                                "sha256": sha256})
        splits[split] = {"shards": records, "documents": sum(r["documents"] for r in records),
                         "sentences": sum(r["sentences"] for r in records),
                         "tokens": sum(r["tokens"] for r in records)}
    return splits, shard_totals


def _final_counts(counts: Counter, splits: dict[str, Any], shard_totals: Counter) -> Counter:
    """The documents stage's counts plus what tokenizing wrote and dropped; they must add up."""
    counts = Counter(counts)
    for field in ("documents_empty_after_tokenizing", "sentences_empty_after_tokenizing", "documents_segmented_zh",
                  "documents_segmented_ja"):
        counts[field] = shard_totals[f"train_{field}"] + shard_totals[f"validation_{field}"]
    counts["documents_train"] = splits["train"]["documents"]
    counts["documents_validation"] = splits["validation"]["documents"]
    counts["documents_written"] = counts["documents_train"] + counts["documents_validation"]
    counts["sentences_written"] = splits["train"]["sentences"] + splits["validation"]["sentences"]
    counts["tokens_written"] = splits["train"]["tokens"] + splits["validation"]["tokens"]
    if unaccounted_documents(counts):
        raise RuntimeError(f"document counts do not add up (a bug): read {counts['documents_read']}, written "
                           f"{counts['documents_written']}, {unaccounted_documents(counts)} neither written nor "
                           f"skipped")
    return counts


def _tokenizer_stats(tokenizer_stats: dict[str, Any], splits: dict[str, Any], shard_totals: Counter) -> dict:
    """The tokenizer's stats (no timings), unknown-token rate, tokens per word (segmenter words in Chinese and
    Japanese documents) and per character on validation."""
    measured = "validation" if splits["validation"]["tokens"] else "train"
    tokens = splits[measured]["tokens"]
    stats = dict(tokenizer_stats)
    stats.pop("training_seconds", None)
    stats.update({
        "measured_on": measured,
        "unk_rate": shard_totals[f"{measured}_unknown_tokens"] / tokens if tokens else 0.0,
        "tokens_per_word": tokens / shard_totals[f"{measured}_words"] if shard_totals[f"{measured}_words"] else 0.0,
        "tokens_per_char": tokens / shard_totals[f"{measured}_chars"] if shard_totals[f"{measured}_chars"] else 0.0,
        "chars_per_word": (shard_totals[f"{measured}_chars"] / shard_totals[f"{measured}_words"]
                           if shard_totals[f"{measured}_words"] else 0.0),
    })
    return stats


def build_manifest(out: Path, documents: dict[str, Any], tokenizer_stats: dict[str, Any], facts: dict[str, Any],
                   key: str, settings: dict[str, Any], sources: list[dict], counts: Counter,
                   skipped: list) -> dict[str, Any]:
    """Stage 4: gather shard records into manifest.json (no timings: same inputs, same fingerprint)."""
    splits, shard_totals = _gather_splits(out, documents, key)
    counts = _final_counts(counts, splits, shard_totals)
    manifest = {
        "tokenizer": {**facts, "stats": _tokenizer_stats(tokenizer_stats, splits, shard_totals)},
        "token_dtype": token_dtype_for(facts["vocab_size"]).name,
        "splits": splits,
        "sources": sources,
        "counts": dict(sorted((k, v) for k, v in counts.items() if v or k in ("documents_read",))),
        "skipped_files": skipped,
        "settings": {**settings, "input_key": key},
    }
    return write_manifest(out, manifest)


def setting_changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """`key: old → new` for each setting that differs (a key one side lacks shows as "unset")."""
    before, after = flatten(old, lists=True), flatten(new, lists=True)
    return [f"{key} {before.get(key, 'unset')} → {after.get(key, 'unset')}"
            for key in sorted(set(before) | set(after)) if before.get(key) != after.get(key)]


def source_changes(old: list[dict], new: list[dict]) -> list[str]:
    """What differs between the input files recorded in the manifest and those found now."""
    before, after = {s["path"]: s for s in old}, {s["path"]: s for s in new}
    changes = [f"new file {path}" for path in after if path not in before]
    changes += [f"file gone {path}" for path in before if path not in after]
    changes += [f"file changed {path}" for path in after if path in before and after[path] != before[path]]
    return changes


def replaced_data(out: Path, settings: dict[str, Any], sources: list[dict], console: Any) -> Optional[str]:
    """The fingerprint of finished data in `out` that this run will replace (said in one line), else None."""
    manifest = read_json(out / "manifest.json")
    if manifest is None or "fingerprint" not in manifest:
        return None
    recorded = {k: v for k, v in manifest.get("settings", {}).items() if k != "input_key"}
    changes = setting_changes(recorded, settings) + source_changes(manifest.get("sources", []), sources)
    if not changes:  # same settings and file sizes: a file was modified in place, or bertrain's stages changed
        changes = ["the source files were modified, or this bertrain version prepares differently"]
    named = "; ".join(changes[:MAX_CHANGES_NAMED]) + (f"; and {len(changes) - MAX_CHANGES_NAMED} more"
                                                     if len(changes) > MAX_CHANGES_NAMED else "")
    old = manifest["fingerprint"][:12]
    console.print(f"Note: replacing the prepared data in {out} (fingerprint {old}), made with other inputs: {named}. "
                  f"It gets a new fingerprint; runs trained on fingerprint {old} will refuse to resume on it (with "
                  f"--force they may, unless the tokenizer changed).", highlight=False, markup=False, soft_wrap=True)
    return manifest["fingerprint"]
