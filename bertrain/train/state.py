"""Where a run is and what it may resume from: train state, RNG states, the checkpoint to resume, checkpoint
save/load.

Exact resume rests on two of the rules kept here: every rank's python/numpy/torch RNG is saved and
restored with the model, optimizer and schedule, and data code never draws from the global torch
RNG (`isolated_torch_rng`), which only dropout uses.

A checkpoint holds no pickle: weights in model.safetensors; optimizer, schedule, grad scaler and each
rank's RNG as NAME.json + NAME.safetensors (train/state_files.py); train_state.json, data.json and
config.yaml. Loading one written by someone else runs no code. Older checkpoints (optimizer.pt, ...)
load only behind --trust-checkpoint (train/legacy_checkpoint.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import itertools
import json
import os
import random
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch
from accelerate.utils import set_seed
from safetensors import SafetensorError

from bertrain import rundir
from bertrain.config import Config, dump_yaml
from bertrain.errors import BertrainError, DataError, UsageError
from bertrain.model import load_weights, save_weights
from bertrain.train.fault_hooks import hook_step, kill_now
from bertrain.train.legacy_checkpoint import check_legacy_files, load_legacy
from bertrain.train.monitor import human_bytes
from bertrain.train.state_files import has_state, load_state, save_state

TRAIN_STATE = "train_state.json"
DATA_INFO = "data.json"


@dataclass
class TrainState:
    """Where the run is: saved in every checkpoint as train_state.json."""

    step: int = 0               # optimizer steps taken
    epoch: int = 0              # epoch of the next micro-batch
    micro_batch: int = 0        # next global micro-batch index within `epoch`
    tokens_seen: int = 0        # non-padding training tokens, all ranks
    samples_seen: int = 0       # training instances, all ranks
    total_steps: int = 0        # length of the lr schedule
    world_size: int = 1
    micro_batch_size: int = 0
    bad_steps: int = 0          # non-finite steps in a row


# -- RNG ---------------------------------------------------------------------------------------


@contextlib.contextmanager
def isolated_torch_rng() -> Iterator[None]:
    """Run data code without consuming the global torch RNG (DataLoader iterators draw a base seed
    from it), so dropout's random stream depends only on the steps taken."""
    state = torch.get_rng_state()
    try:
        yield
    finally:
        torch.set_rng_state(state)


def rng_state() -> dict:
    """This process's python, numpy, torch (and CUDA) RNG states."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    """Restore what `rng_state` returned."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def rng_file_name(rank: int) -> str:
    """The state name of a rank's RNG in a checkpoint: rng-rank00000(.json/.safetensors)."""
    return f"rng-rank{rank:05d}"


def read_state(checkpoint: Path, name: str) -> Any | None:
    """State NAME of a checkpoint (NAME.json + NAME.safetensors; NAME.pt of the older format, which
    choose_checkpoint let through only with --trust-checkpoint), or None when it has none."""
    if has_state(checkpoint, name):
        return load_state(checkpoint, name)
    legacy = checkpoint / f"{name}.pt"
    return load_legacy(legacy) if legacy.is_file() else None


def restore_rng(resume_path: Path | None, rank: int, seed: int) -> None:
    """This rank's RNG from the checkpoint when it has one, else seeded with seed + rank."""
    saved = read_state(resume_path, rng_file_name(rank)) if resume_path is not None else None
    if saved is not None:
        set_rng_state(saved)
    else:
        set_seed(seed + rank)


def data_info(prepared) -> dict:
    """What a checkpoint records about its data (compared on resume)."""
    tokenizer = prepared.manifest["tokenizer"]
    return {"fingerprint": prepared.fingerprint, "tokenizer_sha256": tokenizer.get("sha256"),
            "tokenizer_kind": tokenizer.get("kind"), "vocab_size": int(tokenizer["vocab_size"]),
            "path": str(prepared.path)}


# -- choosing the checkpoint ----------------------------------------------------------------------

LOCK_FILE = ".lock"  # RUN_DIR's lock, held by the run training into it (see setup.lock_run_dir)
# What `--resume restart` moves aside (into RUN_DIR/old-<time>/, itself usable as a RUN_DIR).
RUN_HISTORY = (rundir.CHECKPOINTS, "metrics.jsonl", "wandb_id.txt", rundir.CONFIG)
RESTART_ADVICE = ("Nothing was loaded, changed or deleted. To continue from an older checkpoint, pass it with --resume "
                  "PATH (a backup or another copy of the run). To start over in this RUN_DIR, pass --resume restart: "
                  "it moves the old checkpoints and metrics to RUN_DIR/old-<time>/ (never deleting them) and trains "
                  "from step 0.")


def choose_checkpoint(resume: str, run_dir: Path, trust: bool = False
                      ) -> tuple[Path | None, list[tuple[Path, str]], list[str]]:
    """The checkpoint `--resume` (auto, never, restart or a path) names, the invalid ones skipped on the way
    and notes for the user. Refuses a RUN_DIR whose checkpoints are all invalid, and an older-format
    (pickle) checkpoint unless `trust`."""
    skipped: list[tuple[Path, str]] = []
    if resume == "never":
        if run_dir.exists() and any(p.name != LOCK_FILE for p in run_dir.iterdir()):
            raise UsageError(f"--resume never: RUN_DIR '{run_dir}' is not empty. Use --resume auto to "
                             f"continue that run, or pick another --run-dir.")
        return None, skipped, []
    if resume == "restart":
        aside = move_run_aside(run_dir)
        return None, skipped, [f"--resume restart: moved the previous checkpoints and metrics to {aside}; "
                               f"training from step 0."] if aside else []
    if resume == "auto":  # RUN_DIR's own checkpoints: none yet is a fresh start, none valid an error
        try:
            found = rundir.find_latest_checkpoint(run_dir, skipped, require_valid=True)
        except rundir.NoValidCheckpoint as error:
            raise rundir.NoValidCheckpoint(error.run_dir, error.rejected, RESTART_ADVICE) from None
    else:  # a checkpoint dir or another RUN_DIR, resolved as export and fill-mask resolve it
        try:
            found = rundir.resolve_checkpoint(resume, skipped)
        except rundir.NoValidCheckpoint:
            raise
        except BertrainError as error:
            raise type(error)(f"--resume {resume}: {error}") from None
    if found is not None:
        check_legacy_files(found, trust)
    return found, skipped, []


def move_run_aside(run_dir: Path) -> Path | None:
    """Move RUN_DIR's checkpoints, metrics and wandb id into RUN_DIR/old-<time>/ for a fresh start; the
    new directory, or None when there was nothing to move. Deletes nothing."""
    present = [run_dir / name for name in RUN_HISTORY if (run_dir / name).exists()]
    if not any(p.name in (rundir.CHECKPOINTS, "metrics.jsonl") for p in present):
        return None
    stamp = time.strftime("%Y%m%d-%H%M%S")
    aside = run_dir / f"old-{stamp}"
    for number in itertools.count(2):
        if not aside.exists():
            break
        aside = run_dir / f"old-{stamp}-{number}"
    aside.mkdir()
    for path in present:
        os.replace(path, aside / path.name)  # a rename: same filesystem, nothing copied or lost
    return aside


# -- disk --------------------------------------------------------------------------------------


def free_disk_bytes(path: Path) -> int:
    """Free bytes on the filesystem that holds `path` (or its nearest existing parent)."""
    path = Path(path).resolve()
    while not path.exists():
        path = path.parent
    return shutil.disk_usage(path).free


def estimated_checkpoint_bytes(num_parameters: int) -> int:
    """fp32 weights + two fp32 moments (AdamW and LAMB alike) + small files."""
    return num_parameters * 4 * 3 + (1 << 20)


def check_disk(run_dir: Path, checkpoint_bytes: int) -> None:
    """Refuse to start when RUN_DIR's filesystem cannot hold two checkpoints (the save before rotation)."""
    need = 2 * checkpoint_bytes + (64 << 20)  # the new checkpoint is complete before the old one goes
    free = free_disk_bytes(run_dir)
    if free < need:
        raise DataError(
            f"RUN_DIR '{run_dir}' is on a filesystem with {human_bytes(free)} free, but saving needs "
            f"about {human_bytes(need)} (two checkpoints of {human_bytes(checkpoint_bytes)} during rotation). "
            f"Free some space or choose another --run-dir.")


_WRITE_ADVICE = {
    errno.ENOSPC: "Free space on that filesystem, or move the run to another --run-dir (copy RUN_DIR, or resume "
                  "there with --resume PATH).",
    errno.EDQUOT: "Your disk quota is used up: free some of it, or move the run to another --run-dir.",
    errno.EROFS: "The filesystem is read-only: remount it writable, or move the run to another --run-dir.",
    errno.EACCES: "Make RUN_DIR writable for this user, or choose another --run-dir.",
    errno.EPERM: "Make RUN_DIR writable for this user, or choose another --run-dir.",
}


def _errno_and_file(error: Exception) -> tuple[int | None, str | None]:
    if isinstance(error, OSError):
        return error.errno, error.filename
    text = str(error)  # safetensors: "... I/O error: No space left on device (os error 28) at path \"...\""
    code, path = re.search(r"os error (\d+)", text), re.search(r'at path "([^"]+)"', text)
    return (int(code.group(1)) if code else None), (path.group(1) if path else None)


def write_error(error: Exception, doing: str, run_dir: Path) -> DataError:
    """A one-paragraph error for a failed file operation during a run: the file, what the errno means,
    what to do, and the newest checkpoint that is still intact."""
    code, file = _errno_and_file(error)
    meaning = f"{os.strerror(code)} ({errno.errorcode.get(code, code)})" if code else str(error)
    advice = _WRITE_ADVICE.get(code, "Check that filesystem (space, permissions, mount), or choose another --run-dir.")
    complete = [p for p in rundir.iter_checkpoints(run_dir) if (p / rundir.MARKER).is_file()]
    kept = (f"The newest checkpoint ({complete[0]}) is intact; run the same command to resume from it once this "
            f"is fixed." if complete else "No checkpoint had been completed yet.")
    return DataError(f"{file or run_dir}: {meaning} while {doing}. {advice} {kept}")


# -- checkpoint save / load --------------------------------------------------------------------


def save_checkpoint(accelerator, run_dir: Path, config: Config, prepared, model, optimizer, scheduler,
                    state: TrainState) -> Path:
    """Collective atomic save: rank 0 writes the shared files, every rank its RNG state. A failed write
    (disk full, read-only) is a DataError naming the file; the previous checkpoint stays as it was."""
    rank = accelerator.process_index
    try:
        if accelerator.is_main_process:
            rundir.begin_save(run_dir, state.step)
        accelerator.wait_for_everyone()
        tmp = rundir.temporary_dir(run_dir, state.step)
        if accelerator.is_main_process:
            _write_shared_files(tmp, accelerator, config, prepared, model, optimizer, scheduler, state)
        save_state(tmp, rng_file_name(rank), rng_state())
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            rundir.finish_save(tmp, config.train.keep_last)
    except (OSError, SafetensorError) as error:
        raise write_error(error, f"saving the checkpoint of step {state.step}", run_dir) from None
    accelerator.wait_for_everyone()
    return rundir.checkpoints_dir(run_dir) / rundir.checkpoint_name(state.step)


def _write_shared_files(tmp: Path, accelerator, config: Config, prepared, model, optimizer, scheduler,
                        state: TrainState) -> None:
    save_weights(accelerator.unwrap_model(model), tmp / rundir.WEIGHTS)
    save_state(tmp, "optimizer", optimizer.state_dict())
    if hook_step("CRASH_DURING_SAVE") == state.step:  # test hook: kill -9 halfway through a save
        kill_now()
    save_state(tmp, "scheduler", scheduler.state_dict())
    if accelerator.scaler is not None:
        save_state(tmp, "scaler", accelerator.scaler.state_dict())
    (tmp / TRAIN_STATE).write_text(json.dumps(dataclasses.asdict(state), indent=1))
    (tmp / rundir.CONFIG).write_text(dump_yaml(config))
    (tmp / DATA_INFO).write_text(json.dumps(data_info(prepared), indent=1))


def _required_state(checkpoint: Path, name: str) -> Any:
    saved = read_state(checkpoint, name)
    if saved is None:
        raise DataError(f"Checkpoint {checkpoint} has no {name} state ({name}.json + {name}.safetensors). "
                        f"Resume from another checkpoint (--resume PATH).")
    return saved


def load_checkpoint(path: Path, model, optimizer, scheduler) -> None:
    """Model, optimizer and schedule state from a checkpoint (grad scaler and RNG come later)."""
    load_weights(model, path / rundir.WEIGHTS)
    optimizer.load_state_dict(_required_state(path, "optimizer"))
    scheduler.load_state_dict(_required_state(path, "scheduler"))


def load_scaler(path: Path, accelerator) -> None:
    """The fp16 grad scaler's state, when the run has a scaler and the checkpoint one."""
    saved = read_state(path, "scaler") if accelerator.scaler is not None else None
    if saved is not None:
        accelerator.scaler.load_state_dict(saved)
