"""`bertrain prepare` end to end: exact counts over mixed formats, resume, job arrays, reuse, CLI."""

import gzip
import json
import os
from collections import Counter

import numpy as np
import pytest

from bertrain.config import PrepareConfig, Recipe, SourceConfig, TokenizerConfig
from bertrain.data.format import open_prepared
from bertrain.data.prepare import prepare_corpus
from bertrain.data.prepare import shards as shards_module
from bertrain.data.sources.normalize import normalize_document
from bertrain.data.sources.pydoc import write_pydoc_corpus
from bertrain.tokenizer_file import load_tokenizer
from tests.helpers import check_identity, stored_documents

SPL = [["The cat sat on the mat.", "It was happy."], ["Dogs bark loudly.", "Birds sing songs."],
       ["Rain falls in spring.", "Flowers grow fast."]]
RECORDS = {name: [f"{name.title()} document number {i} talks about {name}. It has a second sentence, too."
                  for i in range(2)] for name in ("jsonl", "zst", "parquet", "arrow")}


def make_mixed_dir(root, pydoc_text):
    """Six formats; 13 documents read, 1 empty, 1 duplicate -> 11 written."""
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq
    import zstandard

    root.mkdir(parents=True, exist_ok=True)
    (root / "a.txt").write_text("\n\n".join("\n".join(doc) for doc in SPL) + "\n")
    prose = pydoc_text[:6000]
    with gzip.open(root / "b.txt.gz", "wt", encoding="utf-8") as handle:
        handle.write(prose)
    (root / "c.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in RECORDS["jsonl"] + ["  \n "]))
    zst = "".join(json.dumps({"text": t}) + "\n" for t in RECORDS["zst"][:1] + RECORDS["jsonl"][:1])
    (root / "d.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(zst.encode()))
    pq.write_table(pa.table({"text": RECORDS["parquet"]}), root / "e.parquet")
    datasets.Dataset.from_dict({"text": RECORDS["arrow"], "n": [1, 2]}).save_to_disk(str(root / "f_dataset"))
    texts = SPL + [normalize_document("text", prose, 1, 10**6, Counter())]
    for name in ("jsonl", "zst", "parquet", "arrow"):
        records = RECORDS[name][:1] if name == "zst" else RECORDS[name]
        texts += [normalize_document("text", t, 1, 10**6, Counter()) for t in records]
    return texts  # the 11 distinct documents, as sentences


def recipe(*paths, kind="wordpiece", vocab=300, shards=2, validation=0.0, tokenizer_path=None, **prepare_keys):
    prepare_keys.setdefault("workers", 1)
    return Recipe(prepare=PrepareConfig(sources=[SourceConfig(path=str(p)) for p in paths], num_shards=shards,
                                        validation_fraction=validation, **prepare_keys),
                  tokenizer=TokenizerConfig(kind=kind, vocab_size=vocab, path=tokenizer_path))


@pytest.mark.parametrize("kind", ["wordpiece", "unigram"])
def test_mixed_formats_exact_counts_and_tokens(tmp_path, pydoc_text, kind):
    expected = make_mixed_dir(tmp_path / "mixed", pydoc_text)
    manifest = prepare_corpus(recipe(tmp_path / "mixed", kind=kind), tmp_path / "data")
    counts = manifest["counts"]
    assert counts["files_read"] == 6
    assert counts["documents_read"] == 13
    assert counts["documents_empty"] == 1 and counts["documents_duplicate"] == 1
    assert counts["documents_written"] == 11 == manifest["splits"]["train"]["documents"]
    check_identity(counts)
    assert counts["sentences_written"] == sum(map(len, expected))
    assert [s["format"] for s in manifest["sources"]] == ["text", "text", "jsonl", "jsonl", "parquet", "arrow"]
    assert manifest["sources"][1]["compression"] == "gzip" and manifest["sources"][3]["compression"] == "zstd"
    prepared = open_prepared(tmp_path / "data")
    assert prepared.tokenizer_kind == kind and prepared.special_tokens == {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "mask": 4}
    assert manifest["tokenizer"]["word_marker"] == ("##" if kind == "wordpiece" else "▁")
    assert manifest["token_dtype"] == "uint16" and prepared.split("train").shards[0].tokens.dtype == np.uint16
    # Independent reference: encode the expected sentences directly; the stored ids must match exactly.
    tokenizer = load_tokenizer(tmp_path / "data" / "tokenizer")
    reference = [tuple(tuple(e.ids) for e in tokenizer.encode_batch(doc, add_special_tokens=False)) for doc in expected]
    assert sorted(stored_documents(tmp_path / "data")) == sorted(reference)
    assert sum(len(t) for doc in reference for t in doc) == manifest["splits"]["train"]["tokens"]
    assert not (tmp_path / "data" / "work" / "documents").exists()  # intermediate text removed


def test_a_datasets_dict_directory_gives_the_source_s_split_only(tmp_path):
    # `DatasetDict.save_to_disk` (what load_dataset returns, saved) holds several splits; the source names one.
    import datasets

    from bertrain.errors import DataError

    splits = {name: [f"{name.title()} split document {i} is here. It has a second sentence." for i in range(3)]
              for name in ("train", "test")}
    datasets.DatasetDict({name: datasets.Dataset.from_dict({"text": texts})
                          for name, texts in splits.items()}).save_to_disk(str(tmp_path / "dict"))
    for name, texts in splits.items():
        source = SourceConfig(path=str(tmp_path / "dict"), format="arrow", split=name)
        manifest = prepare_corpus(Recipe(prepare=PrepareConfig(sources=[source], num_shards=1, workers=1,
                                                               validation_fraction=0.0),
                                         tokenizer=TokenizerConfig(vocab_size=200)), tmp_path / f"data-{name}")
        tokenizer = load_tokenizer(tmp_path / f"data-{name}" / "tokenizer")
        expected = [tuple(tuple(e.ids) for e in tokenizer.encode_batch(normalize_document(
            "text", text, 1, 10**6, Counter()), add_special_tokens=False)) for text in texts]
        assert manifest["counts"]["documents_written"] == 3
        assert sorted(stored_documents(tmp_path / f"data-{name}")) == sorted(expected)
    source = SourceConfig(path=str(tmp_path / "dict"), format="arrow", split="validation")
    with pytest.raises(DataError, match="no split 'validation' \\(splits: train, test\\)"):
        prepare_corpus(Recipe(prepare=PrepareConfig(sources=[source], workers=1)), tmp_path / "data-missing")


def test_rerun_is_noop_and_changes_are_not_reused(tmp_path, pydoc_text):
    make_mixed_dir(tmp_path / "mixed", pydoc_text)
    first = prepare_corpus(recipe(tmp_path / "mixed"), tmp_path / "data")
    files = sorted(p for p in (tmp_path / "data").rglob("*") if p.is_file())
    stamps = {p: p.stat().st_mtime_ns for p in files}
    again = prepare_corpus(recipe(tmp_path / "mixed"), tmp_path / "data")
    assert again["fingerprint"] == first["fingerprint"]
    assert {p: p.stat().st_mtime_ns for p in files} == stamps
    bigger = prepare_corpus(recipe(tmp_path / "mixed", vocab=350), tmp_path / "data")
    assert bigger["tokenizer"]["sha256"] != first["tokenizer"]["sha256"]
    assert bigger["counts"]["documents_written"] == 11
    (tmp_path / "mixed" / "g.txt").write_text("A new document arrives. It is counted.\n")
    grown = prepare_corpus(recipe(tmp_path / "mixed", vocab=350), tmp_path / "data")
    assert grown["counts"]["documents_read"] == 14 and grown["counts"]["documents_written"] == 12
    os.remove(tmp_path / "data" / "train" / "shard-00001.tokens.npy")  # damaged: rebuilt, not trusted
    repaired = prepare_corpus(recipe(tmp_path / "mixed", vocab=350), tmp_path / "data")
    assert repaired["fingerprint"] == grown["fingerprint"]


def test_resume_after_interruption_keeps_finished_shards(tmp_path, pydoc_text, monkeypatch):
    corpus_dir = tmp_path / "pydoc"
    write_pydoc_corpus(corpus_dir)
    calls, fail_at = [], [3]
    real = shards_module.tokenize_shard

    def failing(*args):
        calls.append(args[2])
        if len(calls) == fail_at[0]:
            raise SystemExit("killed")  # like a job killed while tokenizing its third shard
        return real(*args)

    monkeypatch.setattr(shards_module, "tokenize_shard", failing)
    with pytest.raises(SystemExit):
        prepare_corpus(recipe(corpus_dir, shards=4, validation=0.1), tmp_path / "data")
    assert not (tmp_path / "data" / "manifest.json").exists()
    assert not list((tmp_path / "data").rglob("*.tmp"))  # no half shard left behind
    done = sorted((tmp_path / "data" / "train").glob("*.documents.npy"))
    assert len(done) == 2
    stamps = {p: p.stat().st_mtime_ns for p in done}
    calls.clear()
    fail_at[0] = None
    manifest = prepare_corpus(recipe(corpus_dir, shards=4, validation=0.1), tmp_path / "data")
    assert len(calls) == 3  # two train shards and the validation shard were left
    assert {p: p.stat().st_mtime_ns for p in done} == stamps
    monkeypatch.setattr(shards_module, "tokenize_shard", real)
    fresh = prepare_corpus(recipe(corpus_dir, shards=4, validation=0.1), tmp_path / "fresh")
    assert fresh["fingerprint"] == manifest["fingerprint"]


def test_job_array_matches_a_single_parallel_run(tmp_path, pydoc_text):
    corpus_dir = tmp_path / "pydoc"
    write_pydoc_corpus(corpus_dir)
    results = [prepare_corpus(recipe(corpus_dir, shards=3, validation=0.1), tmp_path / "array", shard_index=i)
               for i in range(3)]
    assert results[0] == {"complete": False, "pending_shards": ["train/shard-00001", "train/shard-00002"]}
    assert results[1]["complete"] is False and "fingerprint" in results[2]
    single = prepare_corpus(recipe(corpus_dir, shards=3, validation=0.1, workers=2), tmp_path / "single")
    assert single["fingerprint"] == results[2]["fingerprint"]
    assert open_prepared(tmp_path / "array").split("train").num_tokens == single["splits"]["train"]["tokens"]


def test_pydoc_corpus_few_mb_balanced_and_split_by_hash(tmp_path):
    corpus_dir = tmp_path / "pydoc"
    write_pydoc_corpus(corpus_dir, size_mb=2, seed=0)
    records = [json.loads(line)["text"] for f in sorted(corpus_dir.glob("*.jsonl")) for line in f.open()]
    manifest = prepare_corpus(recipe(corpus_dir, kind="unigram", vocab=500, shards=4, validation=0.05),
                              tmp_path / "data")
    counts = manifest["counts"]
    assert counts["documents_read"] == len(records)
    check_identity(counts)
    documents = json.loads((tmp_path / "data" / "work" / "documents.json").read_text())
    sizes = [s["chars"] for s in documents["shards"]["train"]]
    assert max(sizes) <= 1.05 * np.mean(sizes)
    validation = manifest["splits"]["validation"]["documents"]
    assert 0.02 < validation / counts["documents_written"] < 0.09
    stats = manifest["tokenizer"]["stats"]
    assert stats["measured_on"] == "validation" and stats["unk_rate"] < 0.01 and 1 < stats["tokens_per_word"] < 4
    # The same document lands on the same side in another corpus (other documents, other order).
    subset = records[::-3]
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "x.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in subset))
    other = prepare_corpus(recipe(tmp_path / "other", kind="unigram", vocab=500, shards=2, validation=0.05,
                                  tokenizer_path=str(tmp_path / "data" / "tokenizer")), tmp_path / "other_data")
    assert other["tokenizer"]["sha256"] == manifest["tokenizer"]["sha256"]

    def validation_docs(data_dir):
        prepared = open_prepared(data_dir)
        split = prepared.split("validation")
        return {tuple(shard.tokens[shard.sentence_offsets[d[0]]:shard.sentence_offsets[d[1]]].tolist())
                for shard in split.shards for d in zip(shard.document_offsets[:-1], shard.document_offsets[1:])}

    full, part = validation_docs(tmp_path / "data"), validation_docs(tmp_path / "other_data")
    assert part and part <= full


def test_cli_prepare_inspect_and_tokenizer_train(tmp_path, run_cli):
    corpus_dir = tmp_path / "pydoc"
    write_pydoc_corpus(corpus_dir)
    code, out, err = run_cli("prepare", "--recipe", "pydoc", "--source", str(corpus_dir), "--out",
                             str(tmp_path / "data"), "--vocab-size", "400", "--tokenizer-kind", "unigram",
                             "--num-shards", "2", "--set", "prepare.validation_fraction=0.1")
    assert code == 0, err
    assert "documents read" in out and "Done" in out
    manifest = open_prepared(tmp_path / "data").manifest
    assert manifest["tokenizer"]["kind"] == "unigram" and manifest["settings"]["prepare"]["validation_fraction"] == 0.1
    code, out, err = run_cli("inspect", str(tmp_path / "data"), "--documents", "2")
    assert code == 0, err
    assert "sentence length" in out and "document length" in out and "shard-00000 document 1" in out
    code, out, err = run_cli("tokenizer", "train", "--source", str(corpus_dir), "--kind", "wordpiece",
                             "--vocab-size", "300", "--out", str(tmp_path / "tok"))
    assert code == 0, err
    assert load_tokenizer(tmp_path / "tok").get_vocab_size() == 300 and "unk_rate" in out
    for command in (["prepare"], ["tokenizer", "train"], ["inspect"]):
        code, out, _ = run_cli(*command, "--help")
        assert code == 0 and "Example:" in out


def test_tokenizer_trains_on_a_seeded_sample_of_at_most_max_bytes(tmp_path):
    corpus_dir = tmp_path / "pydoc"
    write_pydoc_corpus(corpus_dir)
    shas = []
    for seed in (0, 0, 1):
        config = recipe(corpus_dir, shards=1)
        config.tokenizer.max_bytes, config.tokenizer.seed = 60_000, seed
        manifest = prepare_corpus(config, tmp_path / f"data{len(shas)}")
        stats = manifest["tokenizer"]["stats"]
        assert 20_000 < stats["training_chars"] <= 60_000
        shas.append(stats["sha256"])
    assert shas[0] == shas[1] != shas[2]


def test_tokenizer_train_without_held_out_documents_says_its_rates_are_unmeasured(run_cli, tmp_path, pydoc_text):
    """One file is one document, so nothing is held out: its rates were printed as zeros, as if measured."""
    (tmp_path / "one.txt").write_text(pydoc_text[:200_000].replace("\n\n", " "))
    code, out, err = run_cli("tokenizer", "train", "--source", str(tmp_path / "one.txt"), "--kind", "wordpiece",
                             "--vocab-size", "300", "--out", str(tmp_path / "tok"))
    assert code == 0, err
    rows = {line.split("│")[1].strip(): line.split("│")[2].strip() for line in out.splitlines() if line.count("│") == 3}
    assert rows["measured_words"] == "0"
    assert all(rows[key] == "n/a (no held-out documents)" for key in ("unk_rate", "tokens_per_word", "tokens_per_char"))
