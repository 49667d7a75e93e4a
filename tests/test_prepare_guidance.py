"""prepare guides a new user: records grouped into documents (`group_by`), a warning when documents
are too short for pairs or for max_seq_length, a "Next:" command that fits the tokenizer, and the
shipped pydoc recipe running as shipped in an empty directory."""

import io
import json
import shlex
from collections import Counter

import numpy as np
import pytest
from rich.console import Console

from bertrain.config import PrepareConfig, Recipe, SourceConfig, TokenizerConfig, load_recipe
from bertrain.data.format import open_prepared
from bertrain.data.prepare import prepare_corpus
from bertrain.data.sources.normalize import normalize_document
from bertrain.data.sources.pydoc import pydoc_documents, write_pydoc_corpus
from bertrain.tokenizer_file import load_tokenizer
from bertrain.errors import ConfigError
from tests.helpers import check_identity, stored_documents

BOOKS = ("Genesis", "Exodus")


def verses(pydoc_text, chapters=6, per_chapter=12):
    """Bible-like records: one sentence each, with book/chapter/verse fields, in reading order."""
    sentences = [s.strip() + "." for s in " ".join(pydoc_text.split()).split(". ") if len(s.split()) > 6]
    records = []
    for book in BOOKS:
        for chapter in range(1, chapters + 1):
            for verse in range(1, per_chapter + 1):
                text = sentences[len(records) % len(sentences)]
                records.append({"book": book, "meta": {"chapter": chapter}, "verse": verse, "text": text})
    return records


def run(tmp_path, name, source, kind="wordpiece", **prepare_keys):
    console = Console(file=io.StringIO(), width=100, force_terminal=False)
    recipe = Recipe(prepare=PrepareConfig(sources=[source], num_shards=1, validation_fraction=0.0, workers=1,
                                          **prepare_keys), tokenizer=TokenizerConfig(kind=kind, vocab_size=400))
    manifest = prepare_corpus(recipe, tmp_path / name, console=console)
    check_identity(manifest["counts"])
    return manifest, console.file.getvalue()


def test_group_by_joins_consecutive_records_into_documents(tmp_path, pydoc_text):
    records = verses(pydoc_text)
    path = tmp_path / "bible.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    plain, _ = run(tmp_path, "plain", SourceConfig(path=str(path)))
    assert plain["counts"]["documents_read"] == len(records)  # without group_by a record is a document
    grouped, grouped_out = run(tmp_path, "grouped", SourceConfig(path=str(path), group_by=["book", "meta.chapter"]))
    counts = grouped["counts"]
    assert counts["records_read"] == len(records)
    assert counts["documents_read"] == counts["documents_written"] == len(BOOKS) * 6
    # Independent reference: each chapter's verses, in order, one paragraph each, normalized and
    # encoded directly; the stored documents must be exactly these.
    chapters = {}
    for record in records:
        chapters.setdefault((record["book"], record["meta"]["chapter"]), []).append(record["text"])
    tokenizer = load_tokenizer(tmp_path / "grouped" / "tokenizer")
    expected = [normalize_document("text", "\n\n".join(texts), 1, 10**6, Counter()) for texts in chapters.values()]
    reference = [tuple(tuple(e.ids) for e in tokenizer.encode_batch(doc, add_special_tokens=False)) for doc in expected]
    assert sorted(stored_documents(tmp_path / "grouped")) == sorted(reference)
    assert grouped["settings"]["prepare"]["sources"][0]["group_by"] == ["book", "meta.chapter"]
    assert "group_by" not in plain["settings"]["prepare"]["sources"][0]  # ungrouped settings as before the key
    assert "Warning" not in grouped_out and "records read (grouped by group_by)" in grouped_out


def test_group_is_cut_at_max_document_chars(tmp_path):
    lines = [json.dumps({"book": "A", "text": f"Verse number {i} of a very long book."}) for i in range(10)]
    (tmp_path / "long.jsonl").write_text("\n".join(lines) + "\n")
    manifest, _ = run(tmp_path, "d", SourceConfig(path=str(tmp_path / "long.jsonl"), group_by="book"),
                      max_document_chars=100)
    counts = manifest["counts"]
    assert counts["documents_read"] == 4 and counts["documents_cut_long"] == 3  # 3 records (>= 100 chars) a piece
    assert sorted(len(doc) for doc in stored_documents(tmp_path / "d")) == [1, 3, 3, 3]


def test_group_by_a_single_field_in_parquet_and_bad_records(tmp_path, pydoc_text):
    import pyarrow as pa
    import pyarrow.parquet as pq

    records = verses(pydoc_text, chapters=2, per_chapter=5)
    table = pa.table({"book": [r["book"] for r in records], "text": [r["text"] for r in records]})
    pq.write_table(table, tmp_path / "bible.parquet", row_group_size=3)  # groups span record batches
    manifest, _ = run(tmp_path, "parquet", SourceConfig(path=str(tmp_path / "bible.parquet"), group_by="book"))
    assert manifest["counts"]["documents_written"] == len(BOOKS)
    assert sorted(d["documents"] for d in manifest["splits"]["train"]["shards"]) == [len(BOOKS)]
    lines = [json.dumps({"book": "A", "text": "First verse of A."}), json.dumps({"book": "A", "body": 1}),
             json.dumps({"book": "A", "text": "Second verse of A."}), json.dumps({"book": "B", "text": "Only B."})]
    (tmp_path / "mixed.jsonl").write_text("\n".join(lines) + "\n")
    manifest, _ = run(tmp_path, "skip", SourceConfig(path=str(tmp_path / "mixed.jsonl"), group_by=["book"]),
                      on_bad_record="skip")
    counts = manifest["counts"]
    assert counts["records_read"] == 4 and counts["documents_bad_record"] == 1
    assert counts["documents_read"] == 3 and counts["documents_written"] == 2
    assert sorted(len(doc) for doc in stored_documents(tmp_path / "skip")) == [1, 2]


def test_group_by_on_a_text_file_is_a_config_error(tmp_path, run_cli):
    (tmp_path / "a.txt").write_text("One sentence.\nAnother one.\n")
    with pytest.raises(ConfigError, match="group_by applies to records"):
        run(tmp_path, "d", SourceConfig(path=str(tmp_path / "a.txt"), group_by=["book"]))
    source = json.dumps([{"path": str(tmp_path / "a.txt"), "group_by": ["book"]}])
    code, _, err = run_cli("prepare", "--out", str(tmp_path / "cli"), "--set", f"prepare.sources={source}")
    assert code == 2 and "group_by" in err and "Traceback" not in err


def test_short_documents_warn_with_figures_and_the_fix(tmp_path, pydoc_text):
    records = verses(pydoc_text)
    path = tmp_path / "bible.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    manifest, out = run(tmp_path, "plain", SourceConfig(path=str(path)))
    prepared = open_prepared(tmp_path / "plain")
    shard = prepared.split("train").shards[0]
    sentences = np.diff(shard.document_offsets)
    tokens = np.diff(np.asarray(shard.sentence_offsets)[np.asarray(shard.document_offsets)])
    one = (sentences == 1).mean()
    short = (tokens < 125).mean()
    assert one > 0.5 and short > 0.5
    warnings = [line for line in out.splitlines() if line.startswith("Warning:")]
    assert len(warnings) == 2
    documents = manifest["splits"]["train"]["documents"]
    assert f"{one:.0%} of the {documents:,} training documents have one sentence" in warnings[0]
    assert f"{short:.0%} of the {documents:,} training documents have fewer than 125 tokens" in warnings[1]
    assert "instance of 128 tokens" in warnings[1]
    assert all("group_by: [book, chapter]" in w for w in warnings)
    assert "documents of 1 sentence (train)" in out and f"{one:.1%}" in out


def test_long_documents_do_not_warn(tmp_path):
    write_pydoc_corpus(tmp_path / "pydoc")
    _, out = run(tmp_path, "d", SourceConfig(path=str(tmp_path / "pydoc")))
    assert "Warning" not in out and "documents of 1 sentence (train)" in out
    assert "sentences > 125 tokens (train)" in out and "of the tokens)" in out


def test_unsplit_text_warns_that_its_long_sentences_train_mlm_only(tmp_path, pydoc_text):
    words = pydoc_text.replace(".", " ").split()
    (tmp_path / "runs.txt").write_text("\n\n".join(" ".join(words[i:i + 300]) for i in range(0, 3000, 300)))
    _, out = run(tmp_path, "d", SourceConfig(path=str(tmp_path / "runs.txt"), text_layout="paragraphs"))
    assert "sentences > 125 tokens (train)" in out and "(100.0% of the tokens)" in out
    text = " ".join(out.split())
    assert "100% of the training tokens are in sentences longer than 125 tokens" in text and "MLM only" in text


@pytest.mark.parametrize("kind,config", [("unigram", "tiny_albert"), ("wordpiece", "tiny_bert")])
def test_next_command_fits_the_tokenizer_and_is_copyable(tmp_path, run_cli, kind, config):
    out_dir = tmp_path / "my data"
    code, out, err = run_cli("prepare", "--recipe", "pydoc", "--out", str(out_dir), "--tokenizer-kind", kind,
                             "--vocab-size", "400")
    assert code == 0, err
    command = [line for line in out.splitlines() if "bertrain pretrain" in line]
    assert len(command) == 1  # one line, not wrapped
    args = shlex.split(command[0])
    assert args[:4] == ["bertrain", "pretrain", "--config", config]
    assert args[args.index("--data") + 1] == str(out_dir)
    assert args[args.index("--run-dir") + 1] == f"runs/my data-{config}"
    assert open_prepared(out_dir).tokenizer_kind == kind


def test_pydoc_recipe_runs_as_shipped_in_an_empty_directory(tmp_path, run_cli, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli("prepare", "--recipe", "pydoc", "--out", "D")
    assert code == 0, err
    manifest = json.loads((tmp_path / "D" / "manifest.json").read_text())
    assert manifest["sources"] == [{"path": "pydoc_data.topics", "format": "pydoc", "compression": None,
                                    "bytes": sum(len(text) for _, text in pydoc_documents())}]
    assert manifest["counts"]["documents_read"] == len(pydoc_documents())
    assert manifest["tokenizer"]["kind"] == load_recipe("pydoc").tokenizer.kind
    # Independent reference: the same topics written as files and prepared from there store the same tokens.
    write_pydoc_corpus(tmp_path / "files")
    files = json.dumps([{"path": str(tmp_path / "files"), "text_layout": "paragraphs"}])
    code, _, err = run_cli("prepare", "--recipe", "pydoc", "--set", f"prepare.sources={files}", "--out", "F",
                           "--tokenizer", str(tmp_path / "D" / "tokenizer"))
    assert code == 0, err
    assert sorted(stored_documents(tmp_path / "D")) == sorted(stored_documents(tmp_path / "F"))


# Issue 26.6: --source keeps the settings of the recipe's source of the same format


def test_a_source_takes_the_settings_of_the_recipe_source_of_its_format(tmp_path):
    from bertrain.data.sources.lookup import sources_for_paths

    (tmp_path / "corpus").mkdir()
    recipe = [SourceConfig(path="web/*.jsonl.zst", text_field="content", group_by=["url"], max_documents=5),
              SourceConfig(path="books/", format="text", text_layout="sentence_per_line"),
              SourceConfig(path="wikimedia/wikipedia", format="hub", name="20231101.en")]
    entries = dict((entry["path"], (entry, followed)) for entry, followed in sources_for_paths(
        ["a.txt.gz", "b.jsonl", str(tmp_path / "corpus"), "c.parquet"], recipe))
    text, followed = entries["a.txt.gz"]
    assert followed == "books/" and text["text_layout"] == "sentence_per_line" and "format" not in text
    records, followed = entries["b.jsonl"]
    assert followed == "web/*.jsonl.zst"
    assert (records["text_field"], records["group_by"], records["max_documents"]) == ("content", ["url"], 5)
    directory, followed = entries[str(tmp_path / "corpus")]  # says no format: the first source of local files
    assert followed == "web/*.jsonl.zst" and directory["group_by"] == ["url"] and "format" not in directory
    assert entries["c.parquet"] == ({"path": "c.parquet"}, None)  # no parquet source: the defaults
    hub_only = sources_for_paths(["x.jsonl", str(tmp_path / "corpus")], [recipe[2]])
    assert [entry for entry, _ in hub_only] == [{"path": "x.jsonl"}, {"path": str(tmp_path / "corpus")}]


def test_cli_source_keeps_group_by_and_set_changes_it_by_index(tmp_path, run_cli, pydoc_text):
    records = verses(pydoc_text)
    path = tmp_path / "bible.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("prepare:\n  sources:\n    - {path: elsewhere/*.jsonl, group_by: [book, meta.chapter]}\n"
                      "  num_shards: 1\n  workers: 1\n  validation_fraction: 0\n"
                      "tokenizer:\n  kind: wordpiece\n  vocab_size: 400\n")
    code, out, err = run_cli("prepare", "--recipe", str(recipe), "--source", str(path), "--out", str(tmp_path / "a"))
    assert code == 0, err
    assert f"--source {path} (prepare.sources.0) keeps the settings of the recipe's source elsewhere/*.jsonl: " \
           f'group_by: ["book", "meta.chapter"]' in " ".join(out.split())
    assert open_prepared(tmp_path / "a").manifest["counts"]["documents_read"] == len(BOOKS) * 6  # one per chapter
    code, out, err = run_cli("prepare", "--recipe", str(recipe), "--source", str(path), "--out", str(tmp_path / "b"),
                             "--set", "prepare.sources.0.group_by=book")
    assert code == 0, err
    assert open_prepared(tmp_path / "b").manifest["counts"]["documents_read"] == len(BOOKS)  # one per book
    code, _, err = run_cli("prepare", "--recipe", str(recipe), "--source", str(path), "--out", str(tmp_path / "c"),
                           "--set", "prepare.sources.1.group_by=book")
    assert code == 2 and "'prepare.sources' has 1 entry (indexes 0 to 0), so index 1 is out of range" in err
