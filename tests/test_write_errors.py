"""A failed write: write_atomic leaves no temporary file and names the file asked for; any command's OSError is
said as 'PATH: what the errno means (ECODE). What to do.' (exit 1), pretrain's RUN_DIR wording unchanged; a full
disk during export, config reference, report or tokenizer train names the path given and leaves no half output."""

from __future__ import annotations

import errno
import os
import pathlib
import shutil

import pytest
from safetensors import SafetensorError

from bertrain.config import Config, DataConfig, ModelConfig, dump_yaml
from bertrain.data import tokenizer as tokenizer_module
from bertrain.data.tokenizer import save_tokenizer
from bertrain.files import describe_os_error, describe_write_failure, write_atomic
from bertrain.model import build_model, hf, save_weights
from bertrain.train.checkpoint import begin_save, finish_save
from tests.helpers import train_tokenizer


def test_a_failed_write_leaves_no_temporary_file_and_the_old_content(tmp_path):
    target = tmp_path / "page.html"
    target.write_text("old")

    def half_written(tmp):
        tmp.write_text("half")
        raise ValueError("the writer broke")

    with pytest.raises(ValueError, match="the writer broke"):
        write_atomic(target, half_written)
    assert [p.name for p in tmp_path.iterdir()] == ["page.html"] and target.read_text() == "old"


def test_a_failed_rename_names_the_target_keeps_the_errno_and_removes_the_temporary_file(tmp_path):
    target = tmp_path / "page.html"
    target.mkdir()  # os.replace of a file onto a directory: EISDIR
    with pytest.raises(IsADirectoryError) as caught:
        write_atomic(target, lambda tmp: tmp.write_text("page"))
    assert caught.value.errno == errno.EISDIR and caught.value.filename == str(target)
    assert caught.value.filename2 is None and ".tmp" not in str(caught.value)
    assert [p.name for p in tmp_path.iterdir()] == ["page.html"]


def test_a_temporary_file_that_cannot_be_created_is_named_as_the_target(tmp_path):
    target = tmp_path / "missing" / "page.html"
    with pytest.raises(FileNotFoundError) as caught:
        write_atomic(target, lambda tmp: tmp.write_text("page"))
    assert caught.value.errno == errno.ENOENT and caught.value.filename == str(target)


def test_pretrain_s_run_dir_messages_are_unchanged(tmp_path):
    run_dir, file = tmp_path / "run", str(tmp_path / "run" / "metrics.jsonl")

    def said(code: int) -> str:
        return describe_write_failure(OSError(code, os.strerror(code), file), "training (step 4)", run_dir)

    during = f"{file}: {{}} while training (step 4). "
    assert said(errno.ENOSPC) == during.format("No space left on device (ENOSPC)") + (
        "Free space on that filesystem, or move the run to another --run-dir (copy RUN_DIR, or resume there with "
        "--resume PATH).")
    assert said(errno.EDQUOT) == during.format("Disk quota exceeded (EDQUOT)") + (
        "Your disk quota is used up: free some of it, or move the run to another --run-dir.")
    assert said(errno.EROFS) == during.format("Read-only file system (EROFS)") + (
        "The filesystem is read-only: remount it writable, or move the run to another --run-dir.")
    assert said(errno.EACCES) == during.format("Permission denied (EACCES)") + (
        "Make RUN_DIR writable for this user, or choose another --run-dir.")
    assert said(errno.EIO) == during.format("Input/output error (EIO)") + (
        "Check that filesystem (space, permissions, mount), or choose another --run-dir.")
    safetensors = RuntimeError(f'Error while serializing: IoError(Os {{ code: 28, kind: StorageFull, message: "No '
                               f'space left on device" }}) (os error 28) at path "{file}"')
    assert describe_write_failure(safetensors, "saving", run_dir).startswith(
        f"{file}: No space left on device (ENOSPC) while saving. Free space")


@pytest.mark.parametrize("code, advice", [
    (errno.ENOSPC, "Free space on that filesystem, or choose another output path."),
    (errno.EROFS, "The filesystem is read-only: remount it writable, or choose another output path."),
    (errno.EACCES, "Give this user access to it (its permissions and its directory's), or choose another path."),
    (errno.EPERM, "Give this user access to it (its permissions and its directory's), or choose another path."),
    (errno.EEXIST, "choose another path, or move what is in the way."),
    (errno.ENOTDIR, "choose another path, or move that file."),
    (errno.EISDIR, "choose another path, or move that directory."),
    (errno.ENOENT, "That path or its parent directory does not exist: check it, or choose another path."),
])
def test_any_command_s_error_names_the_path_the_code_and_what_to_do(code, advice):
    text = describe_os_error(OSError(code, os.strerror(code), "out/data"))
    assert text.startswith(f"out/data: {os.strerror(code)} ({errno.errorcode[code]}). ") and text.endswith(advice)
    assert "--run-dir" not in text and "RUN_DIR" not in text


def test_an_error_without_a_path_is_said_without_one():
    assert describe_os_error(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))) == (
        "No space left on device (ENOSPC). Free space on that filesystem, or choose another output path.")


def assert_said(code: int, out: str, err: str, *parts: str) -> None:
    text = out + err
    assert code == 1, text
    for part in parts:
        assert part in text, (part, text)
    assert "--debug" in text and "Errno" not in text and "Traceback" not in text and ".tmp" not in text, text


def test_an_output_path_under_a_file_names_it_and_exits_1(run_cli, tmp_path):
    (tmp_path / "afile").write_text("text, not a directory")
    out = tmp_path / "afile" / "data"
    assert_said(*run_cli("prepare", "--recipe", "pydoc", "--out", str(out)),
                f"{out}: Not a directory (ENOTDIR). A part of that path is a file")


def a_run_dir(path):
    path.mkdir()
    (path / "metrics.jsonl").write_text('{"kind": "train", "step": 1, "loss": 9.0}\n')
    return path


def test_a_file_where_a_directory_is_expected_names_it_and_exits_1(run_cli, tmp_path):
    run_dir = a_run_dir(tmp_path / "run")
    (tmp_path / "afile").write_text("text, not a directory")
    assert_said(*run_cli("report", str(run_dir), "--out", str(tmp_path / "afile" / "r.html")),
                f"{tmp_path / 'afile'}: File exists (EEXIST)", "choose another path, or move what is in the way")


def test_a_read_only_filesystem_names_the_file_asked_for_and_leaves_no_temporary_file(run_cli, tmp_path,
                                                                                       monkeypatch):
    run_dir, out = a_run_dir(tmp_path / "run"), tmp_path / "pages" / "r.html"

    def read_only(source, target):  # chmod cannot make a directory read-only for root: the mount's errno instead
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), os.fspath(source), os.fspath(target))

    monkeypatch.setattr(os, "replace", read_only)
    assert_said(*run_cli("report", str(run_dir), "--out", str(out)),
                f"{out}: Read-only file system (EROFS). The filesystem is read-only: remount it writable, or "
                f"choose another output path.")
    assert list(out.parent.iterdir()) == []


# -- a full disk in export, config reference, report and tokenizer train: the path given, nothing left behind ------


def no_space() -> OSError:
    """What write() raises on a full disk: the errno, and no file name."""
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def no_space_said(path) -> str:
    return f"{path}: No space left on device (ENOSPC). Free space on that filesystem, or choose another output path."


def contents(directory) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A RUN_DIR with one complete checkpoint of a tiny BERT, and its tokenizer."""
    run = tmp_path_factory.mktemp("export") / "run"
    tokenizer = train_tokenizer("wordpiece", vocab_size=300)
    save_tokenizer(tokenizer, run / "tokenizer", "wordpiece")
    model = build_model(ModelConfig(type="bert", vocab_size=tokenizer.get_vocab_size(), hidden_size=32,
                                    num_hidden_layers=1, num_attention_heads=4, intermediate_size=64,
                                    max_position_embeddings=64))
    directory = begin_save(run, 3)
    save_weights(model, directory / "model.safetensors")
    (directory / "config.yaml").write_text(dump_yaml(Config(data=DataConfig(max_seq_length=64), model=model.config)))
    finish_save(directory)
    return run


def fill_disk_at(monkeypatch, name: str) -> None:
    """The export's write of file `name` fails as on a full disk, after writing part of it."""
    if name == "model.safetensors":
        def save_file(tensors, filename, metadata=None):
            with open(filename, "wb") as handle:
                handle.write(b"half a file")
            # What safetensors raises: the errno only in words, and no path.
            raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

        monkeypatch.setattr(hf, "save_file", save_file)
        return
    copyfile = shutil.copyfile

    def copy_until_full(source, target, **kwargs):
        if os.path.basename(target) != name:
            return copyfile(source, target, **kwargs)
        with open(target, "wb") as handle:
            handle.write(b"half")
        error = no_space()
        error.filename, error.filename2 = os.fspath(source), os.fspath(target)  # as shutil's sendfile copy names them
        raise error

    monkeypatch.setattr(shutil, "copyfile", copy_until_full)


@pytest.mark.parametrize("name", ["model.safetensors", "tokenizer.json"])
def test_a_full_disk_during_export_names_the_file_and_leaves_no_directory(run_cli, run_dir, tmp_path, monkeypatch,
                                                                            name):
    out = tmp_path / "exports" / "hf"
    fill_disk_at(monkeypatch, name)
    assert_said(*run_cli("export", str(run_dir), str(out)), no_space_said(out / name))
    # No half export (config.json alone, which transformers fails to load), and no temporary directory.
    assert not out.exists() and list(out.parent.iterdir()) == []


def test_a_failed_export_over_an_earlier_one_leaves_it_as_it_was(run_cli, run_dir, tmp_path, monkeypatch):
    out = tmp_path / "hf"
    code, _, err = run_cli("export", str(run_dir), str(out))
    assert code == 0, err
    (out / "README.md").write_text("the user's own file")
    before = contents(out)
    assert {"config.json", "model.safetensors", "tokenizer.json", "vocab.txt", "README.md"} <= set(before)
    with monkeypatch.context() as patched:
        fill_disk_at(patched, "model.safetensors")
        assert_said(*run_cli("export", str(run_dir), str(out)), no_space_said(out / "model.safetensors"))
    assert contents(out) == before and [p.name for p in tmp_path.iterdir()] == ["hf"]
    (out / "model.safetensors").write_bytes(b"an older export")
    code, _, err = run_cli("export", str(run_dir), str(out))  # as before: the files replaced, others kept
    assert code == 0, err
    assert contents(out) == before
    (out / "added_tokens.json").write_text("{}")  # an earlier export's tokenizer file that this one does not write
    assert run_cli("export", str(run_dir), str(out))[0] == 0
    assert contents(out) == before  # no other tokenizer's files beside this one's


def test_export_into_a_file_names_it_and_writes_nothing(run_cli, run_dir, tmp_path):
    (tmp_path / "hf").write_text("a file")
    assert_said(*run_cli("export", str(run_dir), str(tmp_path / "hf")), f"{tmp_path / 'hf'}: File exists (EEXIST)")
    assert [p.name for p in tmp_path.iterdir()] == ["hf"] and (tmp_path / "hf").read_text() == "a file"


def write_text_until_full(monkeypatch) -> None:
    """Path.write_text on a full disk: part of the text written, then write()'s OSError, which names no file."""
    def write_text(self, data, *args, **kwargs):
        with open(self, "w") as handle:
            handle.write(data[:10])
        raise no_space()

    monkeypatch.setattr(pathlib.Path, "write_text", write_text)


def test_a_full_disk_during_config_reference_names_the_file_and_keeps_the_old_one(run_cli, tmp_path, monkeypatch):
    out = tmp_path / "reference.md"
    write_text_until_full(monkeypatch)
    assert_said(*run_cli("config", "reference", "--out", str(out)), no_space_said(out))
    assert list(tmp_path.iterdir()) == []  # no empty or half file
    out.write_bytes(b"the reference of an earlier version")
    assert_said(*run_cli("config", "reference", "--out", str(out)), no_space_said(out))
    assert contents(tmp_path) == {"reference.md": b"the reference of an earlier version"}


def test_a_full_disk_during_report_names_the_page(run_cli, tmp_path, monkeypatch):
    run, out = a_run_dir(tmp_path / "run"), tmp_path / "r.html"
    write_text_until_full(monkeypatch)
    assert_said(*run_cli("report", str(run), "--out", str(out)), no_space_said(out))
    assert [p.name for p in tmp_path.iterdir()] == ["run"]


class SaveUntilFull:
    """A trained tokenizer whose save() meets a full disk halfway, as tokenizers (Rust) says it: a plain Exception
    with the errno in words only."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def __getattr__(self, name):
        return getattr(self.tokenizer, name)

    def save(self, path):
        pathlib.Path(path).write_bytes(b"{half")
        raise Exception("No space left on device (os error 28)")


def test_a_full_disk_while_saving_a_trained_tokenizer_names_the_file_and_leaves_none(run_cli, tmp_path, monkeypatch,
                                                                                    pydoc_text):
    real_train = tokenizer_module._train_on_spool
    monkeypatch.setattr(tokenizer_module, "_train_on_spool", lambda *args: SaveUntilFull(real_train(*args)))
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "text.txt").write_text(pydoc_text[:100_000])
    out = tmp_path / "tok"
    assert_said(*run_cli("tokenizer", "train", "--source", str(tmp_path / "corpus"), "--kind", "wordpiece",
                         "--vocab-size", "300", "--out", str(out)), no_space_said(out / "tokenizer.json"))
    # The wrapper files written before tokenizer.json are removed again, and OUT, which this command made.
    assert not out.exists()


def test_a_full_disk_while_spooling_the_training_text_names_the_file_and_leaves_no_out(run_cli, tmp_path,
                                                                                      monkeypatch, pydoc_text):
    def spool_until_full(texts, max_bytes, spool):
        spool.write_text("half of the text")
        raise no_space()  # write() names no file

    monkeypatch.setattr(tokenizer_module, "_spool", spool_until_full)
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "text.txt").write_text(pydoc_text[:10_000])
    out = tmp_path / "tok"
    assert_said(*run_cli("tokenizer", "train", "--source", str(tmp_path / "corpus"), "--kind", "wordpiece",
                         "--vocab-size", "300", "--out", str(out)), no_space_said(out))
    assert not out.exists()  # it said "No space left on device" without a path and left an empty OUT


def test_save_tokenizer_removes_only_what_it_added_and_the_directory_it_made(tmp_path, monkeypatch):
    tokenizer = train_tokenizer("wordpiece", vocab_size=300)
    write_text_until_full(monkeypatch)
    with pytest.raises(OSError) as caught:
        save_tokenizer(tokenizer, tmp_path / "new" / "tok", "wordpiece")
    assert caught.value.errno == errno.ENOSPC and caught.value.filename == str(tmp_path / "new" / "tok" /
                                                                              "special_tokens_map.json")
    assert [p.name for p in tmp_path.iterdir()] == ["new"] and list((tmp_path / "new").iterdir()) == []
    monkeypatch.undo()
    existing = tmp_path / "existing"
    existing.mkdir()
    (existing / "special_tokens_map.json").write_text("kept")
    (existing / "notes.txt").write_text("kept")

    with pytest.raises(OSError):
        save_tokenizer(SaveUntilFull(tokenizer), existing, "wordpiece")
    assert sorted(p.name for p in existing.iterdir()) == ["notes.txt", "special_tokens_map.json"]
    # Nothing of the failed save replaced what was there (its new special_tokens_map.json beside an old tokenizer).
    assert (existing / "notes.txt").read_text() == "kept" == (existing / "special_tokens_map.json").read_text()


def test_with_debug_the_message_follows_the_traceback_without_asking_for_it(run_cli, tmp_path, monkeypatch):
    out = tmp_path / "missing" / "folder" / "reference.md"
    monkeypatch.setattr(pathlib.Path, "mkdir", lambda *a, **k: None)  # the folder stays missing: ENOENT
    code, _, plain = run_cli("config", "reference", "--out", str(out))
    monkeypatch.setenv("BERTRAIN_DEBUG", "1")
    debug_code, _, debug = run_cli("config", "reference", "--out", str(out))
    assert code == debug_code == 1 and "Run again with --debug" in plain and "Traceback" not in plain
    # It said "Run again with --debug … for the traceback" under the traceback it had just printed.
    assert "Traceback" in debug and "Run again with --debug" not in debug and str(out.parent) in debug
