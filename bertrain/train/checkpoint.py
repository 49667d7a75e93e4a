"""A run's checkpoints: TrainState, save (collective, atomic: COMPLETE written last, then rename), load,
`--resume` choice, restart-aside, the lock and the disk check. No pickle unless --trust-checkpoint."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import os
import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from accelerate.utils import broadcast_object_list, set_seed
from safetensors import SafetensorError

from bertrain import rundir
from bertrain.config import Config, dump_yaml
from bertrain.console import human_bytes
from bertrain.data.format import PreparedData
from bertrain.errors import BertrainError, ConfigError, DataError, UsageError
from bertrain.files import (LockHeld, describe_write_failure, exclusive_lock, file_sha256, free_disk_bytes,
                            fsync_path, tree_bytes, write_atomic)
from bertrain.model import load_weights, save_weights
from bertrain.train import fault_hooks
from bertrain.train.legacy_checkpoint import check_legacy_files, load_legacy
from bertrain.train.state_files import has_state, load_state, save_state


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


def data_info(prepared: PreparedData) -> dict:
    """What a checkpoint records about its data (compared on resume)."""
    tokenizer = prepared.manifest["tokenizer"]
    return {"fingerprint": prepared.fingerprint, "tokenizer_sha256": tokenizer.get("sha256"),
            "tokenizer_kind": tokenizer.get("kind"), "vocab_size": int(tokenizer["vocab_size"]),
            "path": str(prepared.path)}


def write_error(error: Exception, doing: str, run_dir: Path) -> DataError:
    """A failed file operation: the file, what the errno means, what to do, the newest intact checkpoint."""
    complete = [p for p in rundir.iter_checkpoints(run_dir) if (p / rundir.MARKER).is_file()]
    kept = (f"The newest checkpoint ({complete[0]}) is intact; run the same command to resume from it once this "
            f"is fixed." if complete else "No checkpoint had been completed yet.")
    return DataError(f"{describe_write_failure(error, doing, run_dir)} {kept}")


# -- save ----------------------------------------------------------------------------------------


def begin_save(run_dir: str | Path, step: int) -> Path:
    """Create an empty temporary directory for the checkpoint of `step` (rank 0 only)."""
    rundir.checkpoints_dir(run_dir).mkdir(parents=True, exist_ok=True)
    for stale in rundir.incomplete_saves(run_dir):  # left by a crash during an earlier save
        shutil.rmtree(stale, ignore_errors=True)
    tmp = temporary_dir(run_dir, step)
    tmp.mkdir()
    return tmp


def temporary_dir(run_dir: str | Path, step: int) -> Path:
    """The temporary directory `begin_save` made (other ranks write their files into it)."""
    return rundir.checkpoints_dir(run_dir) / f"{rundir.TMP_PREFIX}{step:08d}"


def finish_save(tmp: Path, keep_last: int | None = None) -> Path:
    """Checksum every file, write COMPLETE last, fsync, rename to step-XXXXXXXX, then rotate."""
    files = rundir.payload_files(tmp)
    checksums = {name: file_sha256(tmp / name) for name in files}
    for name in files:
        fsync_path(tmp / name)
    _write_synced(tmp / rundir.CHECKSUMS, json.dumps(checksums, indent=1, sort_keys=True))
    _write_synced(tmp / rundir.MARKER, file_sha256(tmp / rundir.CHECKSUMS) + "\n")
    fsync_path(tmp)
    final = tmp.parent / tmp.name.replace(rundir.TMP_PREFIX, rundir.PREFIX, 1)
    if final.exists():  # an older save of the same step (e.g. a run resumed before it): replace it
        remove_checkpoint(final)
    os.replace(tmp, final)
    fsync_path(final.parent)
    if keep_last:  # rotate: the newest `keep_last` complete checkpoints stay
        complete = [p for p in rundir.iter_checkpoints(final.parent.parent) if (p / rundir.MARKER).is_file()]
        for old in complete[keep_last:]:
            remove_checkpoint(old)
    return final


def _write_synced(path: Path, text: str) -> None:
    write_atomic(path, lambda tmp: tmp.write_text(text, encoding="utf-8"), fsync=True)


def remove_checkpoint(path: Path) -> None:
    """Rename to .del-step-XXXXXXXX, then delete: a kill mid-way leaves only that name, which the next run removes."""
    doomed = path.with_name(rundir.DEL_PREFIX + path.name)
    if doomed.exists():  # an earlier removal of the same step was interrupted
        shutil.rmtree(doomed, ignore_errors=True)
    try:
        os.replace(path, doomed)  # same directory: atomic, so no step-* is ever seen half-deleted
    except FileNotFoundError:
        return
    except OSError:  # e.g. an undeletable older .del- dir in the way: in place, the marker first (never looks valid)
        (path / rundir.MARKER).unlink(missing_ok=True)
        shutil.rmtree(path, ignore_errors=True)
        return
    fsync_path(path.parent)
    shutil.rmtree(doomed, ignore_errors=True)


def remove_leftovers(run_dir: Path, newest: Path | None, console) -> None:
    """Delete what interrupted removals left (rundir.removal_leftovers) and say so in one line (rank 0, locked)."""
    try:
        leftovers = [(path, tree_bytes(path)) for path in rundir.removal_leftovers(run_dir, newest)]
    except OSError:  # tidying up never stops a run (rank 0 raising alone would leave the other ranks waiting)
        return
    for path, _ in leftovers:
        shutil.rmtree(path, ignore_errors=True)
    removed = [f"{path.name} ({human_bytes(size)})" for path, size in leftovers if not path.exists()]
    kept = [str(path) for path, _ in leftovers if path.exists()]
    if removed:
        console.print(f"Removed what interrupted checkpoint removals left in {rundir.checkpoints_dir(run_dir)}: "
                      f"{', '.join(removed)}", highlight=False)
    if kept:
        console.print(f"[yellow]Could not remove[/] {', '.join(kept)}: delete by hand to free the space",
                      highlight=False)


def rng_state() -> dict:
    """This process's python, numpy, torch (and CUDA) RNG states."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def save_checkpoint(accelerator, run_dir: Path, config: Config, prepared: PreparedData, model, optimizer, scheduler,
                    state: TrainState) -> Path:
    """Collective atomic save: rank 0 writes the shared files, every rank its RNG state. A failed write
    (disk full, read-only) is a DataError naming the file; the previous checkpoint stays as it was."""
    try:
        if accelerator.is_main_process:
            begin_save(run_dir, state.step)
        accelerator.wait_for_everyone()
        tmp = temporary_dir(run_dir, state.step)
        if accelerator.is_main_process:
            save_weights(accelerator.unwrap_model(model), tmp / rundir.WEIGHTS)
            save_state(tmp, rundir.OPTIMIZER, optimizer.state_dict())
            fault_hooks.fire("CRASH_DURING_SAVE", state.step)
            save_state(tmp, rundir.SCHEDULER, scheduler.state_dict())
            if accelerator.scaler is not None:
                save_state(tmp, rundir.SCALER, accelerator.scaler.state_dict())
            (tmp / rundir.TRAIN_STATE).write_text(json.dumps(dataclasses.asdict(state), indent=1))
            (tmp / rundir.CONFIG).write_text(dump_yaml(config))
            (tmp / rundir.DATA_INFO).write_text(json.dumps(data_info(prepared), indent=1))
        save_state(tmp, rundir.rng_state_name(accelerator.process_index), rng_state())
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            finish_save(tmp, config.train.keep_last)
    except (OSError, SafetensorError) as error:
        raise write_error(error, f"saving the checkpoint of step {state.step}", run_dir) from None
    accelerator.wait_for_everyone()
    return rundir.checkpoints_dir(run_dir) / rundir.checkpoint_name(state.step)


# -- load ----------------------------------------------------------------------------------------


def read_state(checkpoint: Path, name: str) -> Any | None:
    """State NAME of a checkpoint (NAME.json + .safetensors, or a trusted older NAME.pt), or None."""
    if has_state(checkpoint, name):
        return load_state(checkpoint, name)
    legacy = checkpoint / f"{name}{rundir.LEGACY_STATE_SUFFIX}"
    return load_legacy(legacy) if legacy.is_file() else None


def _required_state(checkpoint: Path, name: str) -> Any:
    saved = read_state(checkpoint, name)
    if saved is None:
        raise DataError(f"Checkpoint {checkpoint} has no {name} state ({name}.json + {name}.safetensors). "
                        f"Resume from another checkpoint (--resume PATH).")
    return saved


def load_checkpoint(path: Path, model, optimizer, scheduler) -> None:
    """Model, optimizer and schedule state from a checkpoint (grad scaler and RNG come later)."""
    load_weights(model, path / rundir.WEIGHTS)
    optimizer.load_state_dict(_required_state(path, rundir.OPTIMIZER))
    scheduler.load_state_dict(_required_state(path, rundir.SCHEDULER))


def load_scaler(path: Path, accelerator) -> None:
    """The fp16 grad scaler's state, when the run has a scaler and the checkpoint one."""
    saved = read_state(path, rundir.SCALER) if accelerator.scaler is not None else None
    if saved is not None:
        accelerator.scaler.load_state_dict(saved)


def restore_rng(resume_path: Path | None, rank: int, seed: int) -> None:
    """This rank's RNG from the checkpoint when it has one, else seeded with seed + rank."""
    saved = read_state(resume_path, rundir.rng_state_name(rank)) if resume_path is not None else None
    if saved is None:
        set_seed(seed + rank)
        return
    random.setstate(saved["python"])
    np.random.set_state(saved["numpy"])
    torch.set_rng_state(saved["torch"])
    if "cuda" in saved and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(saved["cuda"])


# -- choose, move aside, lock ------------------------------------------------------------------------

RESTART_ADVICE = ("Nothing was loaded, changed or deleted. To continue from an older checkpoint, pass it with --resume "
                  "PATH (a backup or another copy of the run). To start over in this RUN_DIR, pass --resume restart: "
                  "it moves the old checkpoints and metrics to RUN_DIR/old-<time>/ (never deleting them) and trains "
                  "from step 0.")


def choose_checkpoint(resume: str, run_dir: Path, trust: bool, console) -> Path | None:
    """The checkpoint `--resume` (auto, never, restart or a path) names; prints the invalid ones skipped on the way
    and what `restart` moved. Refuses a RUN_DIR whose checkpoints are all invalid, and an older-format (pickle)
    checkpoint unless `trust`."""
    if resume == "never":
        if run_dir.exists() and any(p.name not in (rundir.LOCK, rundir.LAUNCHER_LOG) for p in run_dir.iterdir()):
            raise UsageError(f"--resume never: RUN_DIR '{run_dir}' is not empty. Use --resume auto to "
                             f"continue that run, or pick another --run-dir.")
        return None
    if resume == "restart":
        aside = move_run_aside(run_dir)
        if aside:
            console.print(f"--resume restart: moved the previous checkpoints and metrics to {aside}; training from "
                          f"step 0.", highlight=False)
        return None
    skipped: list[tuple[Path, str]] = []
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
    for path, why in skipped:
        console.print(f"[yellow]Skipping invalid checkpoint[/] {path}: {why}", highlight=False)
    return found


def move_run_aside(run_dir: Path) -> Path | None:
    """Move RUN_DIR's checkpoints, metrics and wandb id into old-<time>/ (returned, or None); deletes nothing."""
    present = [run_dir / name for name in rundir.RUN_HISTORY if (run_dir / name).exists()]
    if not any(p.name in (rundir.CHECKPOINTS, rundir.METRICS) for p in present):
        return None
    stamp = time.strftime("%Y%m%d-%H%M%S")
    aside = run_dir / f"{rundir.OLD_RUN_PREFIX}{stamp}"
    for number in itertools.count(2):
        if not aside.exists():
            break
        aside = run_dir / f"{rundir.OLD_RUN_PREFIX}{stamp}-{number}"
    aside.mkdir()
    for path in present:
        os.replace(path, aside / path.name)  # a rename: same filesystem, nothing copied or lost
    return aside


def lock_run_dir(run_dir: Path, held: contextlib.ExitStack) -> None:
    """Hold RUN_DIR/.lock until `held` closes (rank 0, the whole run): a second run into the same RUN_DIR
    stops with a DataError naming the holder. The kernel drops the lock when its process dies, kill -9 too."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        held.enter_context(exclusive_lock(run_dir / rundir.LOCK, wait=False))
    except LockHeld as holder:
        raise DataError(
            f"RUN_DIR {run_dir} is in use: another run is training into it ({holder}). Two runs in one RUN_DIR "
            f"would overwrite each other's checkpoints and metrics. Wait for that run to end or stop it (SIGTERM: "
            f"it saves a checkpoint and exits 75), or choose another --run-dir. Nothing needs removing by hand: "
            f"the lock ({run_dir / rundir.LOCK}) goes when its process ends, kill -9 included.") from None
    except OSError as error:
        raise write_error(error, f"locking RUN_DIR {run_dir}", run_dir) from None


@dataclass
class Choice:
    """Rank 0's answer to every rank: the checkpoint to resume from, or the error that every rank raises."""

    path: str | None = None
    error: tuple[str, str] | None = None  # (error type name, message)


def agree_on_checkpoint(accelerator, run_dir: Path, resume: str, trust: bool, held: contextlib.ExitStack,
                        console) -> Path | None:
    """The checkpoint to resume from: rank 0 locks RUN_DIR (until `held` closes) and reads the disk, every rank
    gets its answer, or its error (a lone rank 0 raising would leave the others waiting)."""
    choice, error = Choice(), None
    if accelerator.is_main_process:
        try:
            lock_run_dir(run_dir, held)  # before choosing: a second run must not touch it
            found = choose_checkpoint(resume, run_dir, trust, console)
            remove_leftovers(run_dir, found, console)
            choice = Choice(str(found) if found else None)
        except BertrainError as caught:
            choice, error = Choice(error=(type(caught).__name__, str(caught))), caught
    if accelerator.num_processes > 1:
        shared = [choice]
        broadcast_object_list(shared)
        choice = shared[0]
    if error is not None:
        raise error
    if choice.error is not None:
        kind, message = choice.error
        raise {"UsageError": UsageError, "ConfigError": ConfigError}.get(kind, DataError)(message)
    return Path(choice.path) if choice.path else None


# -- disk ------------------------------------------------------------------------------------------


def estimated_checkpoint_bytes(num_parameters: int) -> int:
    """fp32 weights + two fp32 moments (AdamW and LAMB alike) + small files."""
    return num_parameters * 4 * 3 + (1 << 20)


SAVE_MARGIN_BYTES = 64 << 20  # metrics, logs and run files beside the checkpoints, with room to spare


def check_disk(run_dir: Path, checkpoint_bytes: int) -> None:
    """Refuse to start when RUN_DIR's filesystem cannot hold the next saves: a new checkpoint is complete before
    the oldest goes, so a fresh run needs two and a resumed one (its checkpoints already on disk) one."""
    kept = [p for p in rundir.iter_checkpoints(run_dir) if (p / rundir.MARKER).is_file()]
    count = 1 if kept else 2
    need = count * checkpoint_bytes + SAVE_MARGIN_BYTES
    free = free_disk_bytes(run_dir)
    if free < need:
        raise DataError(
            f"RUN_DIR '{run_dir}' is on a filesystem with {human_bytes(free)} free, but the next saves need about "
            f"{human_bytes(need)}: {count} checkpoint{'s' * (count > 1)} of {human_bytes(checkpoint_bytes)} (a new "
            f"one is complete before the oldest is removed) and {human_bytes(SAVE_MARGIN_BYTES)} for metrics and "
            f"logs. Free some space or choose another --run-dir.")
