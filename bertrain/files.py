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
from typing import Callable, Iterator, TypeVar

T = TypeVar("T")


def fsync_path(path: Path) -> None:
    """fsync a file or a directory (so a rename or a new entry survives a power loss)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, write: Callable[[Path], object], *, fsync: bool = False) -> None:
    """Write `path` through a renamed sibling temporary file (never half a file); `fsync` survives power loss.
    On failure the temporary file is removed, and a failed write (an OSError about the temporary file or about no
    file, or a Rust library's "os error N") is raised as an OSError naming `path`."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        write(tmp)
        if fsync:
            fsync_path(tmp)
        os.replace(tmp, path)
    except BaseException as error:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        said = as_os_error(error, path, tmp) if isinstance(error, Exception) else None
        if said is not None:
            raise said from error
        raise


def as_os_error(error: Exception, path: Path, tmp: Path | None = None) -> OSError | None:
    """`error`, raised while writing `path` (through `tmp`), as an OSError that names `path`; None when it is no
    failed write or names another file (a source being read). write() and close() name no file, and safetensors
    and tokenizers (Rust) say the errno only in words, "... No space left on device (os error 28)"."""
    if isinstance(error, OSError):
        if not error.errno or (error.filename is not None and str(error.filename) != str(tmp)):
            return None
        code, strerror = error.errno, error.strerror
    else:
        found = re.search(r"os error (\d+)", str(error))
        if not found:
            return None
        code, strerror = int(found.group(1)), None
    # OSError() picks the subclass of the errno (FileNotFoundError, PermissionError...).
    return OSError(code, strerror or os.strerror(code), str(path))


@contextlib.contextmanager
def naming(path: Path) -> Iterator[None]:
    """Raise a failed write in the block as an OSError naming `path` (see as_os_error)."""
    try:
        yield
    except Exception as error:
        said = as_os_error(error, path)
        if said is None:
            raise
        raise said from error


def write_dir_atomic(out: Path, write: Callable[[Path], T]) -> T:
    """Fill directory `out` by `write(tmp)` into a temporary directory that only a complete write puts in place,
    so a failure (a full disk) leaves `out` as it was, without temporary files: a new `out` is the temporary
    directory renamed. Into an existing `out` (an earlier export, or a directory holding other files, which stay)
    the files are moved one by one from a temporary directory inside it: beside it could be another filesystem
    (`out` a mount point or a symlink) or a directory this user cannot write. An OSError about a temporary file
    names its place in `out`; the temporary directory of a killed earlier write is replaced."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(out))
    out.parent.mkdir(parents=True, exist_ok=True)
    existing = out.is_dir()
    tmp = (out if existing else out.parent) / f".{out.name or 'out'}.tmp"
    try:
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        result = write(tmp)
        if existing:
            for item in sorted(tmp.iterdir()):
                os.replace(item, out / item.name)
            tmp.rmdir()
        else:
            os.rename(tmp, out)
        return result
    except BaseException as error:
        shutil.rmtree(tmp, ignore_errors=True)
        said = _in_place(error, tmp, out) if isinstance(error, Exception) else None
        if said is not None:
            raise said from error
        raise


def _in_place(error: Exception, tmp: Path, out: Path) -> OSError | None:
    """An OSError about a file in `tmp` as one about its place in `out`; one that names no file, as about `out`.
    shutil.copyfile's ENOSPC names the source first and the file it was writing second."""
    if not isinstance(error, OSError) or not error.errno:
        return None
    if error.filename is None:
        return OSError(error.errno, error.strerror, str(out))
    for name in (error.filename, error.filename2):
        if name is not None and (Path(name) == tmp or tmp in Path(name).parents):
            return OSError(error.errno, error.strerror, str(out / Path(name).relative_to(tmp)))
    return None


@contextlib.contextmanager
def undone_on_failure(directory: Path, names: tuple[str, ...]) -> Iterator[None]:
    """Create `directory` (and its parents) for the block; if it fails, remove those of the files `names` that it
    added, and `directory` if made here and left empty: a failed write leaves no half set of files."""
    made = not directory.exists()
    directory.mkdir(parents=True, exist_ok=True)
    new = [directory / name for name in names if not (directory / name).exists()]
    try:
        yield
    except BaseException:
        for path in new:
            with contextlib.suppress(OSError):
                path.unlink(missing_ok=True)
        if made:
            with contextlib.suppress(OSError):
                directory.rmdir()
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


def tree_bytes(path: Path) -> int:
    """The bytes of the files under `path` (symlinks not followed: their targets are counted where they lie)."""
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


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
