"""Reading sources: formats, layouts, compression, line pieces, normalization, the demo corpus."""

import gzip
import json
from collections import Counter

import pytest

from bertrain.config import PrepareConfig, SourceConfig
from bertrain.data.prepare.documents import raw_batches
from bertrain.data.sources import decode, hub
from bertrain.data.sources.decode import iter_lines
from bertrain.data.sources.lookup import resolve_source
from bertrain.data.sources.normalize import normalize_document
from bertrain.data.sources.pydoc import prose_paragraphs, pydoc_documents, write_pydoc_corpus
from bertrain.data.sources.read import read_documents
from bertrain.data.sources.text import guess_text_layout
from bertrain.errors import DataError


def read_all(path, **source_keys):
    counts, skipped = Counter(), []
    source = SourceConfig(path=str(path), **source_keys)
    config = PrepareConfig(sources=[source])
    documents = []
    for item in resolve_source(source, counts, skipped):
        documents.extend(read_documents(item, source, config, counts, skipped))
    return documents, counts, skipped


def test_sentence_per_line_layout(tmp_path):
    path = tmp_path / "bert.txt"
    path.write_text("First sentence here.\nSecond one!\n\nOther document.\nIt ends?\n\n\n")
    documents, counts, _ = read_all(path)
    assert [(kind, payload) for kind, payload, _ in documents] == [
        ("sentences", ["First sentence here.", "Second one!"]), ("sentences", ["Other document.", "It ends?"])]
    assert documents[1][2] == f"{path}:4"
    assert counts["documents_read"] == 2 and counts["files_read"] == 1


def test_paragraph_layout_is_one_document(tmp_path, pydoc_text):
    path = tmp_path / "prose.txt.gz"
    with gzip.open(path, "wt", encoding="utf-8") as handle:
        handle.write(pydoc_text[:20000])
    documents, counts, _ = read_all(path)
    assert len(documents) == 1 and documents[0][0] == "text"
    assert documents[0][1].rstrip("\n") == pydoc_text[:20000].rstrip("\n")
    sentences = normalize_document("text", documents[0][1], 1, 10**6, Counter())
    assert len(sentences) > 50 and all("\n" not in s for s in sentences)


def test_guess_layout():
    assert guess_text_layout(["One sentence.", "Another one.", "", "Third?"]) == "sentence_per_line"
    assert guess_text_layout(["The if statement is used for conditional", "execution. It selects",
                                     "exactly one suite."]) == "paragraphs"
    assert guess_text_layout(["One. Two. Three.", "Four. Five. Six."]) == "paragraphs"
    # A bracket alone ends no sentence: wrapped prose between lines of code was read as one sentence per line.
    code_and_prose = ["str.capitalize()", "", "str.casefold()", "", "Return a copy of the string with its first",
                      "character capitalized and the rest lowercased.", "", "str.center(width[, fillchar])"]
    assert guess_text_layout(code_and_prose) == "paragraphs"
    assert guess_text_layout(['He said "Stop."', "(It was late.)", "", "Then she left."]) == "sentence_per_line"


def test_the_pydoc_corpus_from_files_reads_as_the_built_in_source(tmp_path):
    # The pydoc recipe says `--source pydoc_corpus` gives the same documents; `auto` took 4 topics of code lines
    # ("str.capitalize()") for one sentence per line and made 144 documents of 79.
    from bertrain.config import PrepareConfig, Recipe, SourceConfig, TokenizerConfig
    from bertrain.data.prepare import prepare_corpus
    from bertrain.data.sources.pydoc import write_pydoc_corpus
    from tests.helpers import stored_documents

    write_pydoc_corpus(tmp_path / "pydoc_corpus")
    made = {}
    for name, source in (("built_in", SourceConfig(path="pydoc_data.topics", format="pydoc")),
                         ("files", SourceConfig(path=str(tmp_path / "pydoc_corpus")))):
        recipe = Recipe(prepare=PrepareConfig(sources=[source], num_shards=1, validation_fraction=0.0, workers=1),
                        tokenizer=TokenizerConfig(vocab_size=400))
        made[name] = prepare_corpus(recipe, tmp_path / name)
    assert made["files"]["counts"]["documents_read"] == made["built_in"]["counts"]["documents_read"]
    assert sorted(stored_documents(tmp_path / "files")) == sorted(stored_documents(tmp_path / "built_in"))


def test_long_lines_cut_in_pieces_across_blocks(tmp_path, monkeypatch):
    monkeypatch.setattr(decode, "BLOCK_BYTES", 64)
    line = "é" * 150 + "x" * 7  # 2-byte characters: the cuts must not split one
    path = tmp_path / "long.txt"
    path.write_text(f"short\n{line}\nend\n", encoding="utf-8")
    counts = Counter()
    with open(path, "rb") as handle:
        pieces = list(iter_lines(handle, str(path), 40, "error", counts))
    assert [n for n, _ in pieces if n == 2] and "".join(t for n, t in pieces if n == 2) == line
    assert all(len(text) <= 64 for _, text in pieces)
    assert pieces[0] == (1, "short") and pieces[-1] == (3, "end")
    assert counts["lines_split_long"] == 1


def test_normalize_cleans_control_characters():
    counts = Counter()
    text = "Hello\x00 wor\u200bld\x07.  Next\u00a0line.\r\n\r\nNew para-\ngraph ok.\n\n\n  \n"
    assert normalize_document("text", text, 1, 10**6, counts) == [
        "Hello world.", "Next line.", "New para- graph ok."]
    assert normalize_document("sentences", ["a", "  ", "bc  d"], 2, 10**6, counts) == ["bc d"]
    assert counts["sentences_short_dropped"] == 1


def test_formats_and_compression(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    import zstandard

    records = [{"text": f"Record number {i}. It has two sentences.", "id": i} for i in range(3)]
    lines = "".join(json.dumps(r) + "\n" for r in records).encode()
    (tmp_path / "a.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(lines))
    (tmp_path / "b.json").write_text(json.dumps(records))
    pq.write_table(pa.table({"text": [r["text"] for r in records], "id": [1, 2, 3]}), tmp_path / "c.parquet")
    (tmp_path / "notes.csv").write_text("x,y\n")
    documents, counts, skipped = read_all(tmp_path)
    assert [payload for _, payload, _ in documents] == [r["text"] for r in records] * 3
    assert counts["files_skipped_unknown_format"] == 1 and skipped[0]["path"].endswith("notes.csv")


def test_nested_text_field_and_max_documents(tmp_path):
    path = tmp_path / "n.jsonl"
    path.write_text("".join(json.dumps({"meta": {"body": f"Doc {i}."}}) + "\n" for i in range(5)))
    counts, skipped = Counter(), []
    source = SourceConfig(path=str(path), text_field="meta.body", max_documents=2)
    batches = list(raw_batches([(source, resolve_source(source, counts, skipped))],
                                PrepareConfig(), counts, skipped, lambda n: None))
    assert [d[1] for batch in batches for d in batch] == ["Doc 0.", "Doc 1."]


def test_hub_format_reads_local_files_through_load_dataset(tmp_path):
    path = tmp_path / "local.jsonl"
    path.write_text("".join(json.dumps({"text": f"Hub document {i}."}) + "\n" for i in range(4)))
    documents, counts, _ = read_all("json", format="hub", data_files=[str(path)])
    assert [d[1] for d in documents] == [f"Hub document {i}." for i in range(4)]


def test_hub_dataset_offline_fails_fast_with_a_clear_message(monkeypatch):
    import time

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start = time.perf_counter()
    with pytest.raises(DataError, match="no-such-user/no-such-dataset.*HF_HUB_OFFLINE"):
        read_all("no-such-user/no-such-dataset", format="hub")
    assert time.perf_counter() - start < 30


def test_write_pydoc_corpus(tmp_path):
    from pydoc_data.topics import topics

    out = tmp_path / "plain"
    summary = write_pydoc_corpus(out)
    files = sorted(out.glob("*.txt"))
    assert 70 < len(files) <= len(topics)
    text = "".join(f.read_text() for f in files)
    assert "*****" not in text and "if_stmt ::=" not in text  # headings and grammar left out
    assert "It selects exactly one of the suites by evaluating the expressions one" in text.replace('"', "")
    assert sum(len(prose_paragraphs(topics[key])) for key in topics) == text.count("\n\n") + len(files)
    assert summary == {"documents": len(files), "bytes": sum(f.stat().st_size for f in files),
                       "words": len(text.split())}
    sized = tmp_path / "sized"
    write_pydoc_corpus(sized, size_mb=0.3, seed=1)
    records = [json.loads(line) for f in sorted(sized.glob("*.jsonl")) for line in f.open()]
    total = sum(f.stat().st_size for f in sized.glob("*.jsonl"))
    assert 300_000 <= total < 400_000
    assert len({r["text"] for r in records}) == len(records) > 10


def test_hub_unreachable_without_offline_flag_fails_at_once(monkeypatch):
    import time

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setattr(hub, "hub_reachable", lambda timeout=5.0: False)
    start = time.perf_counter()
    with pytest.raises(DataError, match="'wikimedia/wikipedia': the Hugging Face hub is not reachable"):
        read_all("wikimedia/wikipedia", format="hub", name="20231101.en")
    assert time.perf_counter() - start < 5


def test_pydoc_documents_cut_at_max_chars_keep_every_paragraph():
    from pydoc_data.topics import topics

    documents = pydoc_documents(prose_only=False, max_chars=3000)
    assert [name[-4:] for name, _ in documents] == [f"{i:04d}" for i in range(len(documents))]
    by_topic: dict[str, list[str]] = {}
    for name, text in documents:
        by_topic.setdefault(name[:-5], []).append(text)
    assert set(by_topic) == {key for key in topics if topics[key].strip()}
    for key, texts in by_topic.items():
        assert "".join("".join(texts).split()) == "".join(topics[key].split())  # nothing lost, code included
        assert all(len(text) >= 3000 for text in texts[:-1])
