"""Crash-safe file primitives shared by every layer: atomic replace, fsync, sha256, an exclusive lock.

They sit below `data`, `model` and `train` so that each can write files a kill cannot tear.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
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


def write_atomic(path: Path, write: Callable[[Path], None], *, fsync: bool = False) -> None:
    """Call `write(tmp)` on a sibling temporary file, then rename it to `path`: readers see the old file
    or the new one, never half of one. `fsync` also makes the new content survive a power loss."""
    tmp = path.with_name(f".{path.name}.tmp")
    write(tmp)
    if fsync:
        fsync_path(tmp)
    os.replace(tmp, path)


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
    """Hold an exclusive flock on `path` (created if missing) for the block.

    The kernel drops a flock when its process dies, kill -9 included, so a lock is never stale.
    With `wait=False` a held lock raises LockHeld naming its holder instead of waiting.
    """
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
