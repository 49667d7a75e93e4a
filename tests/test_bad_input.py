"""Bad input never crashes and is never dropped silently: a named error, or a counted skip.

Every test that prepares data checks the identity documents read = written + each skip reason.
"""

import gzip
import json

import pytest

from bertrain.config import PrepareConfig, Recipe, SourceConfig, TokenizerConfig
from bertrain.data.prepare import prepare_corpus
from bertrain.errors import DataError, UsageError
from tests.helpers import check_identity

GOOD = "".join(f"Sentence number {i} is fine.\nAnother sentence {i} follows here.\n\n" for i in range(30))


def run(tmp_path, *paths, **prepare_keys):
    sources = [SourceConfig(path=str(p)) for p in paths]
    keys = {"num_shards": 1, "validation_fraction": 0.0, "workers": 1, **prepare_keys}
    recipe = Recipe(prepare=PrepareConfig(sources=sources, **keys), tokenizer=TokenizerConfig(vocab_size=200))
    manifest = prepare_corpus(recipe, tmp_path / "data")
    check_identity(manifest["counts"])
    return manifest


def test_missing_path_and_empty_glob_are_named(tmp_path, run_cli):
    with pytest.raises(DataError, match="nowhere/corpus.txt' does not exist"):
        run(tmp_path, tmp_path / "nowhere" / "corpus.txt")
    with pytest.raises(DataError, match=r"glob '.*\*\.jsonl' matched no files"):
        run(tmp_path, tmp_path / "*.jsonl")
    code, _, err = run_cli("prepare", "--source", str(tmp_path / "missing.txt"), "--out", str(tmp_path / "d"))
    assert code == 1 and "missing.txt" in err and "Traceback" not in err
    code, _, err = run_cli("prepare", "--out", str(tmp_path / "d"))
    assert code == 2 and "--source" in err
    code, _, err = run_cli("prepare", "--source", "x", "--out", str(tmp_path / "d"), "--set", "prepare.workerz=2")
    assert code == 2 and "workers" in err


def invalid_utf8_file(tmp_path):
    path = tmp_path / "bad.txt"
    head = GOOD.encode() + "Line one is good.\nCafé au lait.\n".encode()
    path.write_bytes(head + b"Broken \xff byte here.\nLast line.\n")
    return path, GOOD.count("\n") + 3, len(head) + len(b"Broken ")


def test_invalid_utf8_error_names_file_line_and_byte(tmp_path):
    path, line, offset = invalid_utf8_file(tmp_path)
    with pytest.raises(DataError, match=f"bad.txt: invalid UTF-8 at line {line}, byte offset {offset} "):
        run(tmp_path, path)


def test_invalid_utf8_in_compressed_jsonl_is_named(tmp_path):
    path = tmp_path / "bad.jsonl.gz"
    with gzip.open(path, "wb") as handle:
        handle.write(b'{"text": "fine."}\n{"text": "bad \xc3\x28"}\n')
    with pytest.raises(DataError, match="bad.jsonl.gz: invalid UTF-8 at line 2, byte offset 32 "):
        run(tmp_path, path)


@pytest.mark.parametrize("mode", ["replace", "skip"])
def test_invalid_utf8_replace_or_skip_is_counted(tmp_path, mode):
    path, _, _ = invalid_utf8_file(tmp_path)
    counts = run(tmp_path, path, on_decode_error=mode)["counts"]
    assert counts[f"lines_decode_{'replaced' if mode == 'replace' else 'skipped'}"] == 1
    # 30 two-sentence documents, then one of "Line one", "Café", ("Broken" when replaced), "Last line"
    assert counts["documents_written"] == 31
    assert counts["sentences_written"] == 60 + (4 if mode == "replace" else 3)


def test_binary_and_empty_files_are_skipped_counted_and_named(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "good.txt").write_text(GOOD)
    (tmp_path / "src" / "image.txt").write_bytes(b"GIF89a\x00\x01\x02" + bytes(range(256)) * 4)
    (tmp_path / "src" / "empty.txt").write_bytes(b"")
    (tmp_path / "src" / "blank.txt").write_text("\n  \n\t\n")
    (tmp_path / "src" / "records.jsonl").write_text('{"text": ""}\n{"text": "  \\n "}\n{"text": "Kept, too."}\n')
    manifest = run(tmp_path, tmp_path / "src")
    counts = manifest["counts"]
    assert counts["files_skipped_binary"] == 1 and counts["files_empty"] == 1
    assert {"path": str(tmp_path / "src" / "image.txt"), "reason": "binary"} in manifest["skipped_files"]
    assert counts["documents_empty"] == 3  # blank.txt and two empty records
    assert counts["documents_read"] == 30 + 1 + 3 and counts["documents_written"] == 31


def test_long_lines_are_split_and_counted(tmp_path):
    path = tmp_path / "long.txt"
    long_line = "word " * 40  # 200 characters, no sentence end
    path.write_text(GOOD + long_line + "\n")
    counts = run(tmp_path, path, max_line_chars=64)["counts"]
    assert counts["lines_split_long"] == 1
    assert counts["sentences_written"] == 60 + 4  # 200 characters -> 4 pieces of <= 64
    records = tmp_path / "long.jsonl"
    records.write_text(json.dumps({"text": "x" * 150}) + "\n" + json.dumps({"text": "Short one."}) + "\n")
    counts = run(tmp_path, records, max_line_chars=64)["counts"]
    assert counts["sentences_split_long"] == 1 and counts["sentences_written"] == 3 + 1


def test_bad_records_error_or_skip(tmp_path):
    path = tmp_path / "records.jsonl"
    path.write_text('{"text": "Good record here."}\n{"body": "no text field"}\n{"text": 42}\n{not json\n'
                    '{"text": "Another good one."}\n')
    with pytest.raises(DataError, match=r"records.jsonl:2: record has no 'text' field.*on_bad_record=skip"):
        run(tmp_path, path)
    path.write_text('{"text": "Good record here."}\n{"text": 42}\n')
    with pytest.raises(DataError, match=r"records.jsonl:2: record has a non-string \(int\) 'text' field"):
        run(tmp_path, path)
    path.write_text('{"text": "Good record here."}\n{"body": "no text field"}\n{"text": 42}\n{not json\n'
                    '{"text": "Another good one."}\n')
    counts = run(tmp_path, path, on_bad_record="skip")["counts"]
    assert counts["documents_bad_record"] == 3 and counts["documents_read"] == 5 and counts["documents_written"] == 2


def test_parquet_without_the_text_column(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"content": ["a", "b"]}), tmp_path / "t.parquet")
    with pytest.raises(DataError, match=r"t.parquet: no column 'text' \(columns: content\)"):
        run(tmp_path, tmp_path / "t.parquet")


def test_nothing_left_and_foreign_out_dir(tmp_path):
    (tmp_path / "blank.jsonl").write_text('{"text": " "}\n')
    with pytest.raises(DataError, match=r"No training documents left after reading 1 document\(s\) from 1 file"
                                        r"(.|\n)*blank.jsonl: 1 document\(s\) read, none kept\nWhy: 1 document"):
        run(tmp_path, tmp_path / "blank.jsonl")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "thesis.tex").write_text("precious")
    recipe = Recipe(prepare=PrepareConfig(sources=[SourceConfig(path=str(tmp_path / "blank.jsonl"))]))
    with pytest.raises(UsageError, match="not a bertrain DATA_DIR"):
        prepare_corpus(recipe, tmp_path / "mine")


def test_nothing_readable_names_every_file_its_problem_and_the_fix(tmp_path, run_cli):
    src = tmp_path / "src"
    src.mkdir()
    (src / "image.txt").write_bytes(b"GIF89a\x00\x01\x02" + bytes(range(256)))
    with pytest.raises(DataError) as binary_only:
        run(tmp_path, src / "image.txt")
    message = str(binary_only.value)
    assert f"{src / 'image.txt'}: binary" in message and "Fix: point --source" in message
    (src / "empty.txt").write_bytes(b"")
    (src / "blank.txt").write_text("\n  \n\t\n")
    (src / "blank.jsonl").write_text("\n \n")
    (src / "space.jsonl").write_text('{"text": "  "}\n')
    code, _, err = run_cli("prepare", "--source", str(src), "--out", str(tmp_path / "d"), "--vocab-size", "200")
    assert code == 1 and "Traceback" not in err
    lines = {line.strip().split(": ", 1)[0]: line.split(": ", 1)[1] for line in err.splitlines() if str(src) in line}
    assert lines == {str(src / "blank.jsonl"): "no records or text: only blank lines or whitespace",
                     str(src / "blank.txt"): "1 document(s) read, none kept",
                     str(src / "empty.txt"): "empty (0 bytes)",
                     str(src / "image.txt"): "binary (a NUL byte in its first 8000 bytes), skipped",
                     str(src / "space.jsonl"): "1 document(s) read, none kept"}
    assert "Why: 2 document(s) had no text after cleaning" in err and "Fix: point --source" in err


def test_everything_in_validation_says_so(tmp_path):
    (tmp_path / "one.txt").write_text("A single document. It goes where its hash says.\n")
    with pytest.raises(DataError, match=r"all 1 document\(s\) went to validation .*--validation-fraction 0"):
        run(tmp_path, tmp_path / "one.txt", validation_fraction=0.999)


@pytest.mark.parametrize("line,column,problem", [
    ('{"text": "never closed}', 10, "a string opened here is never closed"),
    ("{'text': 'single quotes'}", 2, "expected a key in double quotes"),
    ('{"text": "a"} {"text": "b"}', 15, "more than one JSON value"),
])
def test_malformed_json_line_names_file_line_column_and_problem(tmp_path, run_cli, line, column, problem):
    path = tmp_path / "records.jsonl"
    path.write_text('{"text": "Good record here."}\n' + line + "\n")
    with pytest.raises(DataError) as error:
        run(tmp_path, path)
    message = str(error.value)
    assert message.startswith(f"{path}: line 2, column {column}: not valid JSON: {problem}")
    assert "at at" not in message and "text_field" not in message and "on_bad_record=skip" in message
    code, _, err = run_cli("prepare", "--source", str(path), "--out", str(tmp_path / "d"))
    assert code == 1 and f"line 2, column {column}" in err and "Traceback" not in err


def test_malformed_json_array_names_line_and_column(tmp_path):
    path = tmp_path / "records.json"
    path.write_text('[{"text": "Good record here."},\n {"text": "cut off')
    with pytest.raises(DataError, match=r"records.json: line 2, column 11: not valid JSON: a string opened here "
                                        r"is never closed"):
        run(tmp_path, path)


@pytest.mark.parametrize("encoding,name", [("utf-16", "UTF-16"), ("utf-16-be", "UTF-16"), ("utf-32", "UTF-32")])
def test_utf16_and_utf32_text_is_skipped_with_the_command_that_converts_it(tmp_path, run_cli, encoding, name):
    (tmp_path / "src").mkdir()
    wide = tmp_path / "src" / "wide.txt"
    mark = "\ufeff" if encoding == "utf-16-be" else ""  # Python writes the byte-order mark itself for utf-16/32 only
    wide.write_text(mark + "Первое предложение. Второе!\n\n" * 50, encoding=encoding)
    with pytest.raises(DataError) as only_wide:
        run(tmp_path, wide)
    assert (f"{wide}: {name} text (byte-order mark), skipped; convert it to UTF-8, e.g. iconv -f {name} -t UTF-8 "
            f"{wide} > {tmp_path / 'src' / 'wide.utf8.txt'}") in str(only_wide.value)
    (tmp_path / "src" / "good.txt").write_text(GOOD)
    manifest = run(tmp_path, tmp_path / "src")
    reason = name.lower().replace("-", "")
    assert manifest["counts"][f"files_skipped_{reason}"] == 1 and "files_skipped_binary" not in manifest["counts"]
    assert {"path": str(wide), "reason": reason} in manifest["skipped_files"]
    assert manifest["counts"]["documents_written"] == 30
    code, out, err = run_cli("prepare", "--source", str(tmp_path / "src"), "--out", str(tmp_path / "cli"),
                             "--vocab-size", "200")
    assert code == 0 and f"Warning: {wide}: {name} text (byte-order mark), skipped; convert it" in out + err
