"""Each worker's exit code, written as rank-{RANK}.json into BERTRAIN_EXIT_STATUS_DIR for `bertrain launch`:
launchers turn every worker failure into exit 1, hiding the 2 and 75 that a job script acts on. Each worker also
writes started-{PID}.json as it starts: when the launcher dies (kill -9), `bertrain launch` knows which processes
are its own to wait for while they save."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, TypeVar

from bertrain.errors import EXIT_CTRL_C, EXIT_ERROR, EXIT_OK, EXIT_REQUEUE, EXIT_USAGE
from bertrain.files import write_atomic

STATUS_DIR_ENV = "BERTRAIN_EXIT_STATUS_DIR"
T = TypeVar("T")


@dataclass(frozen=True)
class WorkerExit:
    """What one worker recorded: its global rank, exit code, and how many workers its node started."""

    rank: int
    code: int
    local_world_size: int = 1


@dataclass(frozen=True)
class WorkerStart:
    """A worker as it started: its pid, and its start time (clock ticks since boot, from /proc; None without), which
    tells it from a later process that got the same pid."""

    pid: int
    started: Optional[int] = None


def _proc_stat(pid: int) -> Optional[list[str]]:
    """The fields of /proc/PID/stat after the command name (0: the state, 19: the start time); None without it."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2:].split()  # the command name may hold spaces and parentheses


def record_start() -> None:
    """Write this worker's pid to $BERTRAIN_EXIT_STATUS_DIR/started-{PID}.json; a no-op when unset."""
    directory = os.environ.get(STATUS_DIR_ENV)
    if not directory:
        return
    fields = _proc_stat(os.getpid())
    record = {"pid": os.getpid(), "started": int(fields[19]) if fields else None}
    # By pid: a process this worker starts has its own. Without it, `bertrain launch` only misses this worker if the
    # launcher dies.
    _write_record(Path(directory) / f"started-{os.getpid()}.json", record, "the start")


def _write_record(path: Path, record: dict, what: str) -> None:
    try:  # a worker's start or exit path must not fail on it: `bertrain launch` falls back without the file
        write_atomic(path, lambda tmp: tmp.write_text(json.dumps(record)))
    except OSError as error:
        print(f"bertrain: could not record {what} in {path}: {error}", file=sys.stderr)


def _read_records(directory: Path, pattern: str, make: Callable[[dict], T]) -> list[T]:
    """`make(record)` of each record file in `directory`; unreadable or malformed files are skipped."""
    found = []
    for path in sorted(Path(directory).glob(pattern)):
        try:
            found.append(make(json.loads(path.read_text())))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
    return found


def read_starts(directory: Path) -> list[WorkerStart]:
    """Every worker that recorded its start in `directory`; unreadable files are skipped."""
    return _read_records(directory, "started-*.json", lambda record: WorkerStart(
        int(record["pid"]), None if record.get("started") is None else int(record["started"])))


def is_running(worker: WorkerStart) -> bool:
    """Whether `worker` still runs: its pid is there, not a zombie (an orphan's new parent may never reap it), and
    started when the worker recorded (not a later process with the same pid)."""
    fields = _proc_stat(worker.pid)
    if fields is not None:
        return fields[0] != "Z" and (worker.started is None or int(fields[19]) == worker.started)
    if Path("/proc/self/stat").exists():  # /proc, without this pid
        return False
    try:
        os.kill(worker.pid, 0)
    except (ProcessLookupError, PermissionError):  # gone, or someone else's process now (the pid was reused)
        return False
    return True


def record_exit(code: int) -> None:
    """Write this worker's exit code to $BERTRAIN_EXIT_STATUS_DIR/rank-{RANK}.json; a no-op when unset."""
    directory = os.environ.get(STATUS_DIR_ENV)
    if not directory:
        return
    rank = os.environ.get("RANK", "0")
    record = {"rank": int(rank), "code": int(code), "pid": os.getpid(),
              "local_world_size": int(os.environ.get("LOCAL_WORLD_SIZE", "1"))}
    _write_record(Path(directory) / f"rank-{rank}.json", record, "the exit status")  # else: the launcher's code


def read_exits(directory: Path) -> list[WorkerExit]:
    """Every worker's record in `directory`, by rank; unreadable files are skipped (that worker counts as silent)."""
    found = _read_records(directory, "rank-*.json", lambda record: WorkerExit(
        int(record["rank"]), int(record["code"]), int(record.get("local_world_size", 1))))
    return sorted(found, key=lambda worker: worker.rank)


def _ranks(exits: list[WorkerExit], code: int) -> str:
    return ",".join(str(worker.rank) for worker in exits if worker.code == code)


def combine_exit_codes(exits: list[WorkerExit], launcher_code: int) -> tuple[int, str]:
    """One exit code for the job and why: a bad config (2) on any rank wins, then an error (1); workers that all
    stopped with one code give it; without any record, the launcher's own code stands."""
    if not exits:
        return launcher_code, f"no worker recorded an exit status; the launcher's exit code {launcher_code} stands"
    codes = {worker.code for worker in exits}
    expected = max(worker.local_world_size for worker in exits)
    silent = f"; {expected - len(exits)} of {expected} worker(s) ended without a status" if len(exits) < expected \
        else ""
    if EXIT_USAGE in codes:
        return EXIT_USAGE, f"rank(s) {_ranks(exits, EXIT_USAGE)} refused the config or command line (exit 2){silent}"
    if EXIT_ERROR in codes:
        return EXIT_ERROR, f"rank(s) {_ranks(exits, EXIT_ERROR)} failed (exit 1){silent}"
    stopped = codes - {EXIT_OK}
    if len(stopped) > 1:
        listed = ", ".join(f"rank {worker.rank}: {worker.code}" for worker in exits)
        return EXIT_ERROR, f"workers ended with different exit codes ({listed}){silent}"
    if stopped:
        code = stopped.pop()
        what = {EXIT_REQUEUE: "stopped by a signal after writing a checkpoint: requeue the job or run the same command "
                              "to resume",
                EXIT_CTRL_C: "stopped by Ctrl-C: run the same command to resume"}.get(code, "stopped")
        return code, f"rank(s) {_ranks(exits, code)} {what} (exit {code}){silent}"
    if silent and launcher_code != EXIT_OK:
        return EXIT_ERROR, f"the launcher failed (exit {launcher_code}){silent} (killed or crashed)"
    return EXIT_OK, f"all {len(exits)} worker(s) finished (exit 0)"
