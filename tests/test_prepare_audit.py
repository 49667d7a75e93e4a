"""What a user audit of `bertrain prepare` found silent or late, now said at once: a group_by field no record has,
SIGTERM (a preemption) mid-prepare, an empty validation split and the layout `text_layout: auto` chose, a vocabulary
too small, replacing finished prepared data, and a --set example the command accepts."""

import io
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
from rich.console import Console

from bertrain.config import PrepareConfig, Recipe, SourceConfig, TokenizerConfig
from bertrain.data.prepare import prepare_corpus
from bertrain.data.sources.pydoc import write_pydoc_corpus
from bertrain.errors import DataError
from tests.helpers import ROOT, check_identity, default_ctrl_c, pretrain_env, wait_for_file
from tests.test_ctrl_c import WAIT, assert_resumes_like_a_fresh_run, prepare_command

SENTENCES = "".join(f"Sentence number {i} is fine.\nAnother sentence {i} follows here.\n\n" for i in range(30))


def prepare(tmp_path, name, *sources, vocab_size=200, **prepare_keys):
    """prepare_corpus on these sources: (manifest, what it printed)."""
    console = Console(file=io.StringIO(), width=400, force_terminal=False)
    keys = {"num_shards": 1, "validation_fraction": 0.0, "workers": 1, **prepare_keys}
    recipe = Recipe(prepare=PrepareConfig(sources=list(sources), **keys),
                    tokenizer=TokenizerConfig(vocab_size=vocab_size))
    manifest = prepare_corpus(recipe, tmp_path / name, console=console)
    check_identity(manifest["counts"])
    return manifest, console.file.getvalue()


def write_verses(path, drop_chapter_of=()):
    """Two books of two chapters of three one-sentence verses; records at the indices given lack `chapter`."""
    records = [{"book": book, "chapter": chapter, "verse": verse, "text": f"Verse {verse} of {chapter} in {book}."}
               for book in ("Genesis", "Exodus") for chapter in (1, 2) for verse in (1, 2, 3)]
    for index in drop_chapter_of:
        del records[index]["chapter"]
    if path.suffix == ".json":
        path.write_text(json.dumps(records))
    else:
        path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return records


@pytest.mark.parametrize("group_by,missing,nearest", [(["book", "chaptr"], "chaptr", "chapter"),
                                                      (["bok"], "bok", "book")])
def test_a_group_by_field_no_record_has_is_a_bad_record_that_names_the_nearest_field(tmp_path, run_cli, group_by,
                                                                                      missing, nearest):
    path = tmp_path / "verses.jsonl"
    write_verses(path)
    with pytest.raises(DataError, match=rf"verses.jsonl:1: record has no '{missing}' field \(named in the source's "
                                        rf"group_by\)\. Did you mean '{nearest}'\?.*on_bad_record=skip"):
        prepare(tmp_path, "d", SourceConfig(path=str(path), group_by=group_by))
    code, _, err = run_cli("prepare", "--source", str(path), "--out", str(tmp_path / "cli"), "--vocab-size", "200",
                           "--set", f"prepare.sources.0.group_by={json.dumps(group_by)}")
    assert code == 1 and f"no '{missing}' field" in err and "Traceback" not in err


def test_records_lacking_a_group_by_field_are_skipped_and_counted(tmp_path):
    for name in ("verses.jsonl", "verses.json"):
        path = tmp_path / name
        write_verses(path, drop_chapter_of=(4,))  # the second chapter of Genesis loses its second verse
        with pytest.raises(DataError, match=r"(verses.jsonl:5: record|record 4) has no 'chapter' field"):
            prepare(tmp_path, f"error-{name}", SourceConfig(path=str(path), group_by=["book", "chapter"]))
        manifest, _ = prepare(tmp_path, f"skip-{name}", SourceConfig(path=str(path), group_by=["book", "chapter"]),
                              on_bad_record="skip")
        counts = manifest["counts"]
        assert counts["records_read"] == 12 and counts["documents_bad_record"] == 1
        assert counts["documents_written"] == 4  # the four chapters, none merged with its neighbour


def test_nested_group_by_field_suggests_the_full_path(tmp_path):
    path = tmp_path / "nested.jsonl"
    path.write_text(json.dumps({"book": "A", "meta": {"chapter": 1}, "text": "One verse here."}) + "\n")
    with pytest.raises(DataError, match=r"no 'meta.chaptr' field .*Did you mean 'meta.chapter'\?"):
        prepare(tmp_path, "d", SourceConfig(path=str(path), group_by=["book", "meta.chaptr"]))


def assert_gone(pid):
    """The process ends within a few seconds (a worker left running would hold the job's resources)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    raise AssertionError(f"worker {pid} still runs after prepare exited")


def start_paused_prepare(tmp_path):
    """(corpus, process, worker pid): a prepare of CPython's docs into tmp_path/data, one worker paused in a shard."""
    corpus, marker = tmp_path / "pydoc", tmp_path / "paused"
    write_pydoc_corpus(corpus)
    process = subprocess.Popen(prepare_command(corpus, tmp_path / "data"), cwd=ROOT, text=True,
                               env=pretrain_env(PAUSE_MARKER=str(marker)), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, start_new_session=True, preexec_fn=default_ctrl_c)
    return corpus, process, int(wait_for_file(marker, process, WAIT))


def assert_requeue_exit(process):
    out, err = process.communicate(timeout=WAIT)
    assert process.returncode == 75, f"{out}\n{err}"
    assert "Traceback" not in err + out, err
    lines = [line for line in err.splitlines() if "run the same command again to resume" in line]
    assert len(lines) == 1, err
    done = re.fullmatch(r"prepare interrupted; (\d) of 5 shards done; run the same command again to resume\.",
                        lines[0].strip())
    assert done and int(done[1]) < 5, lines


def test_sigterm_during_prepare_exits_75_stops_the_workers_and_resumes(tmp_path):
    corpus, process, worker = start_paused_prepare(tmp_path)
    process.send_signal(signal.SIGTERM)  # `kill PID`: the workers get nothing, prepare must stop them
    assert_requeue_exit(process)
    assert_gone(worker)
    assert not (tmp_path / "data" / "manifest.json").exists()

    assert_resumes_like_a_fresh_run(tmp_path, corpus)


def test_sigterm_to_the_whole_process_group_exits_75(tmp_path):
    corpus, process, worker = start_paused_prepare(tmp_path)
    os.killpg(process.pid, signal.SIGTERM)  # a scheduler's preemption reaches prepare and its workers at once
    assert_requeue_exit(process)
    assert_gone(worker)


def test_sigterm_before_the_stages_exits_75_not_143():
    # Before prepare's stages install their handler (imports, reading the recipe) the default action was a silent
    # 143, which a job script does not requeue. The CLI's own early handler is installed, then the signal sent.
    code = ("import os, signal, sys, time\n"
            "sys.argv = ['bertrain', 'prepare', '--recipe', 'pydoc']\n"
            "from bertrain import cli\n"
            "cli._install_early_signal_handlers()\n"
            "os.kill(os.getpid(), signal.SIGTERM)\n"
            "time.sleep(30)\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=WAIT)
    assert result.returncode == 75, result
    assert result.stderr.strip() == "prepare stopped by SIGTERM; run the same command again to resume."


def test_empty_validation_split_warns_and_the_guessed_layout_is_said_per_source(tmp_path):
    paragraphs = tmp_path / "paragraphs"
    paragraphs.mkdir()
    for name in ("a", "b"):  # multi-sentence lines between blank lines: `auto` reads each file as one document
        (paragraphs / f"{name}.txt").write_text("".join(f"First {name}{i} here. Then a second one {i}.\n\n"
                                                        for i in range(20)))
    (tmp_path / "lines.txt").write_text(SENTENCES)
    sources = [SourceConfig(path=str(paragraphs)), SourceConfig(path=str(tmp_path / "lines.txt"))]
    manifest, out = prepare(tmp_path, "d", *sources, validation_fraction=0.001)
    assert manifest["splits"]["validation"]["documents"] == 0
    assert re.search(r"Warning: the validation split has 0 documents: prepare\.validation_fraction 0\.001 of 32 "
                     r"document\(s\).*evaluation will be skipped\. Raise --validation-fraction", out), out
    assert f"text_layout auto read source 0 ({paragraphs}): 2 file(s) as paragraphs (" in out
    assert "--set prepare.sources.0.text_layout=sentence_per_line" in out
    assert f"text_layout auto read source 1 ({tmp_path / 'lines.txt'}): 1 file(s) as sentence_per_line." in out
    _, out = prepare(tmp_path, "none-asked", *sources, validation_fraction=0.0)
    assert "validation split" not in out  # no validation was asked for
    _, out = prepare(tmp_path, "set", SourceConfig(path=str(paragraphs), text_layout="paragraphs"))
    assert "text_layout auto" not in out  # a layout the user set is not a guess


@pytest.mark.parametrize("size", ["0", "-5", "10"])
def test_a_vocabulary_too_small_is_refused_before_reading(tmp_path, run_cli, size):
    # The source does not exist: reading it first would fail with exit 1 and "does not exist".
    missing = str(tmp_path / "missing.jsonl")
    code, _, err = run_cli("prepare", "--source", missing, "--out", str(tmp_path / "d"), "--vocab-size", size)
    assert code == 2 and f"tokenizer.vocab_size {size} is too small (at least 16)" in err, err
    assert not (tmp_path / "d").exists()
    code, _, err = run_cli("tokenizer", "train", "--source", missing, "--out", str(tmp_path / "t"),
                           "--vocab-size", size)
    assert code == 2 and f"tokenizer.vocab_size {size} is too small" in err, err


def test_replacing_finished_data_says_the_old_fingerprint_and_what_changed(tmp_path):
    (tmp_path / "lines.txt").write_text(SENTENCES)
    source = SourceConfig(path=str(tmp_path / "lines.txt"))
    first, out = prepare(tmp_path, "d", source, vocab_size=200)
    assert "Note: replacing" not in out  # a new DATA_DIR replaces nothing
    old = first["fingerprint"][:12]
    second, out = prepare(tmp_path, "d", source, vocab_size=150)
    notes = [line for line in out.splitlines() if line.startswith("Note: replacing")]
    assert len(notes) == 1 and f"(fingerprint {old})" in notes[0], out
    assert "tokenizer.vocab_size 200 → 150" in notes[0] and "will refuse to resume" in notes[0]
    assert f"fingerprint {old} → {second['fingerprint'][:12]}" in out
    _, out = prepare(tmp_path, "d", source, vocab_size=150)
    assert "Note: replacing" not in out and "up to date" in out


@pytest.mark.parametrize("command", [["prepare"], ["tokenizer", "train"]])
def test_the_help_example_of_set_is_a_key_the_command_accepts(tmp_path, run_cli, command):
    code, help_text, _ = run_cli(*command, "--help")
    example = re.search(r"Override a config key: --set[\s│]+(\S+=\S+)", help_text)  # across the box's border
    assert code == 0 and example and "optim." not in example[1], help_text
    (tmp_path / "lines.txt").write_text(SENTENCES)
    code, _, err = run_cli(*command, "--source", str(tmp_path / "lines.txt"), "--out", str(tmp_path / "out"),
                           "--vocab-size", "200", "--set", example[1])
    assert code == 0, err


# ---- kill -9 of prepare: its workers, and a second writer of a shard ----


def test_a_shard_a_second_writer_finished_is_returned_as_written(tmp_path):
    """Two writers of one shard (a killed run's worker and the rerun's) take turns; the second finds it done and
    reads nothing (its documents file may already be gone) instead of truncating the first one's files."""
    from bertrain.data.prepare import shards

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(f"Document {i} has a sentence. And another one {i}." for i in range(60)))
    prepare(tmp_path, "data", SourceConfig(path=str(corpus)))
    record_path = tmp_path / "data" / "work" / "shards" / "train-shard-00000.json"
    written = json.loads(record_path.read_text())
    tokens = (tmp_path / "data" / "train" / "shard-00000.tokens.npy").read_bytes()
    again = shards.tokenize_shard(str(tmp_path / "gone.txt"), str(tmp_path / "data" / "train"), "shard-00000",
                                  str(tmp_path / "data" / "tokenizer"), {}, "none", str(record_path), written["key"])
    assert again == {k: v for k, v in written.items() if k != "key"}
    assert (tmp_path / "data" / "train" / "shard-00000.tokens.npy").read_bytes() == tokens


WORKERS_THEN_KILL_9 = """
import os, signal, sys
from multiprocessing import active_children
from bertrain.data.prepare.pool import Workers
workers = Workers(2)
workers.start()
workers.executor.submit(sum, [1]).result()  # both started
print(" ".join(str(p.pid) for p in active_children()), flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_prepare_workers_end_when_prepare_is_killed_9(tmp_path):
    """kill -9 of prepare left its workers running (writing shards beside a rerun's, then sleeping forever)."""
    printed = tmp_path / "pids.txt"
    with open(printed, "w") as out:  # a file, not a pipe: a surviving worker would hold a pipe open
        code = subprocess.run([sys.executable, "-c", WORKERS_THEN_KILL_9], stdout=out, stderr=subprocess.STDOUT,
                              env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=WAIT).returncode
    assert code == -signal.SIGKILL, printed.read_text()
    pids = [int(pid) for pid in printed.read_text().split()]
    assert len(pids) == 2, printed.read_text()

    def alive(pid: int) -> bool:
        try:
            state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
        except OSError:
            return False
        return state != "Z"  # a zombie has ended; only its entry waits for a parent to read it

    deadline = time.monotonic() + WAIT
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(alive(pid) for pid in pids), [pid for pid in pids if alive(pid)]


def test_a_log_says_when_tokenizer_training_starts_and_ends(tmp_path):
    """Off a terminal the spinner shows nothing: a SLURM log was silent for the whole (single-threaded) stage."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(f"Document {i} has a sentence. And another one {i}." for i in range(60)))
    _, said = prepare(tmp_path, "data", SourceConfig(path=str(corpus)))
    lines = said.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Training the wordpiece tokenizer (vocab 200)"))
    assert lines[start + 1].startswith("Tokenizer trained in ")


def test_a_source_read_in_two_layouts_says_so_without_contradiction(tmp_path):
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    (mixed / "prose.txt").write_text("".join(f"First {i} here. Then a second one {i}.\n\n" for i in range(20)))
    (mixed / "lines.txt").write_text(SENTENCES)
    _, out = prepare(tmp_path, "d", SourceConfig(path=str(mixed)))
    line = next(line for line in out.splitlines() if line.startswith("text_layout auto read"))
    # It said "(their lines are not one sentence each…)" after both counts, of the sentence_per_line file too.
    assert "1 file(s) as paragraphs and 1 file(s) as sentence_per_line (paragraphs: each file is one document" in line
    assert "not one sentence each" not in line
    assert line.endswith("--set prepare.sources.0.text_layout=paragraphs or "
                         "--set prepare.sources.0.text_layout=sentence_per_line."), line


def test_a_job_array_task_says_how_many_shards_of_each_split_are_left(tmp_path):
    corpus = tmp_path / "pydoc"
    write_pydoc_corpus(corpus)
    console = Console(file=io.StringIO(), width=400, force_terminal=False)
    recipe = Recipe(prepare=PrepareConfig(sources=[SourceConfig(path=str(corpus))], num_shards=3,
                                          validation_fraction=0.1, workers=1),
                    tokenizer=TokenizerConfig(vocab_size=300))
    prepare_corpus(recipe, tmp_path / "data", shard_index=2, console=console)
    # Task 0 also writes the validation shard: the count names the splits (it said "3 shard(s)" alone).
    assert "Shard 2 done; 3 shard(s) still to do (2 train, 1 validation)." in console.file.getvalue()
    result = prepare_corpus(recipe, tmp_path / "data", shard_index=0, console=console)
    assert result["pending_shards"] == ["train/shard-00001"]
    assert "Shard 0 done; 1 shard(s) still to do (1 train)." in console.file.getvalue()


def test_source_and_a_set_of_the_source_path_together_are_refused(run_cli, tmp_path):
    (tmp_path / "a.txt").write_text(SENTENCES)
    (tmp_path / "b.txt").write_text(SENTENCES)
    code, out, err = run_cli("prepare", "--source", str(tmp_path / "a.txt"), "--set",
                             f"prepare.sources.0.path={tmp_path / 'b.txt'}", "--out", str(tmp_path / "data"))
    # The --set won silently: a.txt was never read, exit 0.
    assert code == 2 and "give them one way" in " ".join(err.split()) and not (tmp_path / "data").exists()
    code, out, err = run_cli("prepare", "--source", str(tmp_path / "a.txt"), "--set",
                             "prepare.sources.0.max_documents=5", "--set", "prepare.num_shards=1", "--vocab-size",
                             "200", "--out", str(tmp_path / "data"))
    assert code == 0, err  # a setting of the --source entry is no second input
