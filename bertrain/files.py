"""Crash-safe file primitives shared by every layer: atomic replace, fsync, sha256, an exclusive lock; free disk
space, and what a failed write's errno means and what to do about it."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import re
import shutil
import socket
import time
from pathlib import Path
from typing import Callable, Iterator


def fsync_path(path: Path) -> None:
    """fsync a file or a directory (so a rename or a new entry survives a power loss)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, write: Callable[[Path], object], *, fsync: bool = False) -> None:
    """Write `path` through a renamed sibling temporary file (never half a file); `fsync` survives power loss.
    On failure the temporary file is removed, and an OSError about it names `path` instead."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        write(tmp)
        if fsync:
            fsync_path(tmp)
        os.replace(tmp, path)
    except BaseException as error:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        if isinstance(error, OSError) and error.errno and str(error.filename) == str(tmp):
            # The user never asked for the temporary file; OSError() picks the subclass of the errno.
            raise OSError(error.errno, error.strerror, str(path)) from error
        raise


def honour_umask(path: Path) -> None:
    """Give `path` the mode a plain open() gives a new file (safetensors creates its files 0600)."""
    umask = os.umask(0o077)  # reading the umask means setting it: the restrictive value meanwhile
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)


def file_sha256(path: str | Path) -> str:
    """sha256 hex digest of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


class LockHeld(Exception):
    """Another live process holds the lock; the message names it (pid, host, since when)."""


@contextlib.contextmanager
def exclusive_lock(path: Path, *, wait: bool) -> Iterator[None]:
    """Hold an exclusive flock on `path` (created if missing); the kernel drops it when its process dies, so it
    is never stale. With `wait=False` a held lock raises LockHeld naming its holder."""
    handle = open(path, "a+")
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            handle.seek(0)
            raise LockHeld(handle.read().strip() or "another process") from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        handle.flush()
        yield
    finally:
        handle.close()  # closing releases the flock


def free_disk_bytes(path: Path) -> int:
    """Free bytes on the filesystem that holds `path` (or its nearest existing parent)."""
    path = Path(path).resolve()
    while not path.exists():
        path = path.parent
    return shutil.disk_usage(path).free


# What to do about a failed write, by errno: the words in braces come from where it was written (RUN_DIR_WORDS
# for pretrain's RUN_DIR, ANY_PATH_WORDS for a path given to any command).
WRITE_ADVICE = {
    errno.ENOSPC: "Free space on that filesystem, or {move_fully}.",
    errno.EDQUOT: "Your disk quota is used up: free some of it, or {move}.",
    errno.EROFS: "The filesystem is read-only: remount it writable, or {move}.",
    errno.EACCES: "{give_access}, or {choose}.",
    errno.EPERM: "{give_access}, or {choose}.",
    errno.EEXIST: "A file is where a directory is expected, or a directory where a file is: {choose}, or move "
                  "what is in the way.",
    errno.ENOTDIR: "A part of that path is a file, where a directory is expected: {choose}, or move that file.",
    errno.EISDIR: "A directory is where a file is expected: {choose}, or move that directory.",
    errno.ENOENT: "That path or its parent directory does not exist: check it, or {choose}.",
}
OTHER_WRITE_FAILURE = "Check that filesystem (space, permissions, mount), or {choose}."
RUN_DIR_WORDS = {"move_fully": "move the run to another --run-dir (copy RUN_DIR, or resume there with --resume PATH)",
                 "move": "move the run to another --run-dir", "choose": "choose another --run-dir",
                 "give_access": "Make RUN_DIR writable for this user"}
ANY_PATH_WORDS = {"move_fully": "choose another output path", "move": "choose another output path",
                  "choose": "choose another path",
                  "give_access": "Give this user access to it (its permissions and its directory's)"}


def describe_write_failure(error: Exception, doing: str | None, default_path: Path | None,
                           words: dict[str, str] = RUN_DIR_WORDS) -> str:
    """'FILE: what the errno means while DOING. What to do.' (said in `words`) for an OSError, or safetensors' error
    text ("... No space left on device (os error 28) at path ..."), which carries the errno only in words."""
    if isinstance(error, OSError):
        code, file, strerror = error.errno, error.filename, error.strerror
    else:
        found_code, found_path = re.search(r"os error (\d+)", str(error)), re.search(r'at path "([^"]+)"', str(error))
        code = int(found_code.group(1)) if found_code else None
        file, strerror = found_path.group(1) if found_path else None, None
    file = file or default_path
    meaning = f"{strerror or os.strerror(code)} ({errno.errorcode.get(code, code)})" if code else str(error)
    advice = WRITE_ADVICE.get(code, OTHER_WRITE_FAILURE if file else "").format(**words)
    where, during = f"{file}: " if file else "", f" while {doing}" if doing else ""
    return f"{where}{meaning}{during}. {advice}".strip()


def describe_os_error(error: OSError) -> str:
    """'PATH: what the errno means (ECODE). What to do.' in words that fit any command's paths."""
    return describe_write_failure(error, None, None, ANY_PATH_WORDS)
