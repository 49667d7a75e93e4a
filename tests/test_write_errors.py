"""A failed write: write_atomic leaves no temporary file and names the file asked for; any command's OSError is
said as 'PATH: what the errno means (ECODE). What to do.' (exit 1), pretrain's RUN_DIR wording unchanged."""

from __future__ import annotations

import errno
import os

import pytest
from bertrain.files import describe_os_error, describe_write_failure, write_atomic


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
