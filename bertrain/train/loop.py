"""The Accelerate training loop: MLM + NSP/SOP, exact resume, preemption, multi-process.

Exactness comes from three rules:
- the data is a pure function of (seed, epoch, micro-batch index), started in O(1) at the saved
  position, and never touches the global torch RNG (which only dropout uses);
- every rank's python/numpy/torch RNG is saved and restored with the model, optimizer and schedule;
- losses are normalized by the GLOBAL count of predicted tokens (and instances) of the optimizer
  step, so 2 ranks x B, 1 rank x 2B and k accumulation steps of B/k give the same gradients.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import random
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from rich.console import Console
from rich.table import Table

from bertrain.config import Config, build_dataclass, dump_yaml, read_yaml, to_dict
from bertrain.errors import BertrainError, ConfigError, DataError, Interrupted, UsageError
from bertrain.train import checkpoint as ckpt
from bertrain.train.monitor import Monitor, NullMonitor, truncate_metrics
from bertrain.train.signals import install_handlers, received_signal_name, stop_requested

TRAIN_STATE = "train_state.json"
DATA_INFO = "data.json"

# Keys that may change between a checkpoint and its resumption without --force.
FREE_KEYS = ("train.output_dir", "train.save_every", "train.eval_every", "train.log_every", "train.keep_last",
             "train.max_bad_steps", "train.requeue_exit_code", "train.compile", "train.stop_at_step",
             "logging.", "data.path", "data.num_workers", "data.eval_batches", "model.gradient_checkpointing",
             "model.init_from", "tokenizer.")
# Keys that change the model's shape (or the optimizer's state layout): never overridable.
SHAPE_KEYS = ("optim.name", "model.type", "model.vocab_size", "model.hidden_size", "model.num_hidden_layers",
              "model.num_attention_heads", "model.intermediate_size", "model.max_position_embeddings",
              "model.type_vocab_size", "model.embedding_size", "model.num_hidden_groups", "model.inner_group_num")


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


# ----------------------------------------------------------------------------------------------
# Small helpers
# ----------------------------------------------------------------------------------------------


def _flatten(tree: dict, prefix: str = "") -> dict[str, Any]:
    flat = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def free_disk_bytes(path: Path) -> int:
    """Free bytes on the filesystem that holds `path` (or its nearest existing parent)."""
    path = Path(path).resolve()
    while not path.exists():
        path = path.parent
    return shutil.disk_usage(path).free


def _human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1024 or unit == "TB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} TB"


def _human_seconds(seconds: float) -> str:
    seconds = int(seconds)
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


@contextlib.contextmanager
def _isolated_torch_rng() -> Iterator[None]:
    """Run data code without consuming the global torch RNG (DataLoader iterators draw a base seed
    from it), so dropout's random stream depends only on the steps taken."""
    import torch

    state = torch.get_rng_state()
    try:
        yield
    finally:
        torch.set_rng_state(state)


def _rng_state() -> dict:
    import numpy as np
    import torch

    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict) -> None:
    import numpy as np
    import torch

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _test_hook(name: str) -> int | None:
    """BERTRAIN_TEST_* hooks used by the resume tests (a step number, or None):
    SIGNAL_AT_STEP=N (rank 0 sends itself SIGTERM during step N), CRASH_AFTER_SAVE=N (kill -9 right
    after the checkpoint of step N), CRASH_DURING_SAVE=N (kill -9 halfway through writing it);
    STEP_DELAY=seconds slows every step (SLURM test)."""
    value = os.environ.get(f"BERTRAIN_TEST_{name}")
    return int(value) if value else None


# ----------------------------------------------------------------------------------------------
# Checks before training
# ----------------------------------------------------------------------------------------------


def resolve_run_config(config: Config, data_dir: str | None, run_dir: str | None):
    """Apply --data / --run-dir, open the prepared data and fill model.vocab_size from its manifest."""
    from bertrain.data.format import open_prepared

    if data_dir:
        config.data.path = str(data_dir)
    if run_dir:
        config.train.output_dir = str(run_dir)
    prepared = open_prepared(config.data.path)
    vocab = prepared.vocab_size
    if config.model.vocab_size is None:
        config.model.vocab_size = vocab
    elif config.model.vocab_size < vocab:
        raise ConfigError(
            f"Config key 'model.vocab_size' ({config.model.vocab_size}) is smaller than the tokenizer's vocabulary "
            f"({vocab}, from {prepared.path}/manifest.json): token ids would fall outside the embedding. "
            f"Remove model.vocab_size (it is taken from the manifest) or set it to at least {vocab}.")
    if config.data.masking in ("whole_word", "ngram") and prepared.tokenizer_kind not in ("wordpiece", "unigram"):
        raise ConfigError(
            f"Config key 'data.masking' is {config.data.masking!r}, which needs word boundaries, but the tokenizer "
            f"kind in {prepared.path}/manifest.json is {prepared.tokenizer_kind!r} (known: wordpiece, unigram). "
            f"Use data.masking=token or prepare the data with a wordpiece/unigram tokenizer.")
    if config.train.max_steps is None and config.train.max_tokens is None:
        raise ConfigError("Set a budget: train.max_steps or train.max_tokens.")
    for key in ("save_every", "log_every"):
        if getattr(config.train, key) < 1:
            raise ConfigError(f"Config key 'train.{key}' must be at least 1.")
    return prepared


def micro_batch_size_for(config: Config, world_size: int) -> int:
    """Sequences per process per micro-batch: batch_size / (world_size * gradient_accumulation_steps)."""
    batch, accumulation = config.train.batch_size, config.train.gradient_accumulation_steps
    if batch % (world_size * accumulation):
        raise ConfigError(
            f"Config key 'train.batch_size' ({batch}) must be divisible by processes x "
            f"train.gradient_accumulation_steps ({world_size} x {accumulation} = {world_size * accumulation}). "
            f"Change the batch size, the accumulation steps or the number of processes.")
    return batch // (world_size * accumulation)


def data_info(prepared) -> dict:
    """What a checkpoint records about its data (compared on resume)."""
    tokenizer = prepared.manifest["tokenizer"]
    return {"fingerprint": prepared.fingerprint, "tokenizer_sha256": tokenizer.get("sha256"),
            "tokenizer_kind": tokenizer.get("kind"), "vocab_size": int(tokenizer["vocab_size"]),
            "path": str(prepared.path)}


def resume_differences(saved: Config, saved_state: TrainState, saved_data: dict, config: Config,
                       world_size: int, data: dict) -> tuple[list[str], list[str]]:
    """(never allowed, allowed with --force) differences between a checkpoint and this run."""
    never, forceable = [], []
    old, new = _flatten(to_dict(saved)), _flatten(to_dict(config))
    for key in sorted(set(old) | set(new)):
        if old.get(key) == new.get(key) or any(key.startswith(free) for free in FREE_KEYS):
            continue
        line = f"{key}: {old.get(key)!r} → {new.get(key)!r}"
        (never if key in SHAPE_KEYS else forceable).append(line)
    for key in ("tokenizer_sha256", "vocab_size", "tokenizer_kind"):
        if saved_data.get(key) != data.get(key):
            never.append(f"tokenizer {key}: {saved_data.get(key)!r} → {data.get(key)!r}")
    if saved_data.get("fingerprint") != data.get("fingerprint"):
        forceable.append(f"data fingerprint: {saved_data.get('fingerprint', '')[:12]} → {data['fingerprint'][:12]} "
                         f"(different prepared data)")
    if saved_state.world_size != world_size:
        forceable.append(f"processes (world size): {saved_state.world_size} → {world_size}")
    return never, forceable


# ----------------------------------------------------------------------------------------------
# Data stream across epochs
# ----------------------------------------------------------------------------------------------


class TrainStream:
    """This rank's micro-batches from a saved (epoch, micro_batch) position on, across epochs."""

    def __init__(self, prepared, data_config, *, seed: int, micro_batch_size: int, rank: int, world_size: int,
                 epoch: int, micro_batch: int) -> None:
        self.prepared, self.data_config, self.seed = prepared, data_config, seed
        self.micro_batch_size, self.rank, self.world_size = micro_batch_size, rank, world_size
        self.epoch, self.micro_batch = epoch, micro_batch
        self._iterator: Iterator | None = None
        self._epoch_lengths: dict[int, int] = {}

    def epoch_length(self, epoch: int) -> int:
        """Global micro-batches in `epoch` (the same on every rank)."""
        if epoch not in self._epoch_lengths:
            from bertrain.data.loader import num_micro_batches

            with _isolated_torch_rng():
                length = num_micro_batches(self.prepared, self.data_config, seed=self.seed, epoch=epoch,
                                           micro_batch_size=self.micro_batch_size, world_size=self.world_size)
            if length == 0:  # never cached: every call for such an epoch refuses it
                raise DataError(
                    f"{self.prepared.path}: the training split yields no complete micro-batch of "
                    f"{self.micro_batch_size} x {self.world_size} instances. Use a smaller train.batch_size "
                    f"or more data.")
            self._epoch_lengths[epoch] = length
        return self._epoch_lengths[epoch]

    def next(self) -> dict:
        """The next micro-batch; (epoch, micro_batch) then points after it."""
        from bertrain.data.loader import build_train_loader

        with _isolated_torch_rng():
            if self.micro_batch >= self.epoch_length(self.epoch):
                self.epoch, self.micro_batch, self._iterator = self.epoch + 1, 0, None
                self.epoch_length(self.epoch)  # refuses an epoch with no complete micro-batch
            if self._iterator is None:
                self._iterator = iter(build_train_loader(
                    self.prepared, self.data_config, seed=self.seed, epoch=self.epoch,
                    micro_batch_size=self.micro_batch_size, rank=self.rank, world_size=self.world_size,
                    start_micro_batch=self.micro_batch))
            batch = next(self._iterator)
        self.micro_batch += 1
        return batch


# ----------------------------------------------------------------------------------------------
# The trainer
# ----------------------------------------------------------------------------------------------


class Trainer:
    """One pretraining run; `run()` returns the process exit code."""

    def __init__(self, config: Config, *, resume: str = "auto", force: bool = False, console: Console | None = None,
                 data_dir: str | None = None, run_dir: str | None = None) -> None:
        self.config, self.resume, self.force = config, resume, force
        self.console = console or Console()
        self.prepared = resolve_run_config(config, data_dir, run_dir)
        self.run_dir = Path(config.train.output_dir)

    # -- setup -------------------------------------------------------------------------------

    def _accelerator(self):
        import torch
        from accelerate import Accelerator

        # Without an accelerator device, Accelerate only sees torchrun's/launch's ranks when told cpu=True.
        accelerated = torch.cuda.is_available() or (hasattr(torch, "xpu") and torch.xpu.is_available()) \
            or torch.backends.mps.is_available()
        try:
            return Accelerator(mixed_precision=self.config.train.mixed_precision, cpu=not accelerated)
        except (ValueError, RuntimeError) as error:
            raise ConfigError(f"Config key 'train.mixed_precision' ({self.config.train.mixed_precision!r}) "
                              f"is not usable here: {error}") from None

    def _choose_checkpoint(self) -> tuple[Path | None, list[tuple[Path, str]]]:
        """The checkpoint to resume from (rank 0 decides) and the invalid ones it skipped."""
        skipped: list[tuple[Path, str]] = []
        if self.resume == "never":
            if self.run_dir.exists() and any(self.run_dir.iterdir()):
                raise UsageError(f"--resume never: RUN_DIR '{self.run_dir}' is not empty. Use --resume auto to "
                                 f"continue that run, or pick another --run-dir.")
            return None, skipped
        if self.resume == "auto":
            return ckpt.find_latest_checkpoint(self.run_dir, skipped), skipped
        path = Path(self.resume)
        if ckpt.step_of(path) is None and (path / ckpt.CHECKPOINTS).is_dir():  # a RUN_DIR: its newest
            found = ckpt.find_latest_checkpoint(path, skipped)
            if found is None:
                raise DataError(f"--resume {path}: that run has no valid checkpoint.")
            return found, skipped
        problem = ckpt.verify_checkpoint(path)
        if problem is not None:
            raise DataError(f"--resume {path}: not a valid checkpoint ({problem}).")
        return path, skipped

    def _check_disk(self, checkpoint_bytes: int) -> None:
        need = 2 * checkpoint_bytes + (64 << 20)  # the new checkpoint is complete before the old one goes
        free = free_disk_bytes(self.run_dir)
        if free < need:
            raise DataError(
                f"RUN_DIR '{self.run_dir}' is on a filesystem with {_human_bytes(free)} free, but saving needs "
                f"about {_human_bytes(need)} (two checkpoints of {_human_bytes(checkpoint_bytes)} during rotation). "
                f"Free some space or choose another --run-dir.")

    def estimated_checkpoint_bytes(self, num_parameters: int) -> int:
        # fp32 weights + two fp32 moments (AdamW and LAMB alike) + small files
        return num_parameters * 4 * 3 + (1 << 20)

    def total_steps(self, stream_epoch_length: int, micro_batch_size: int, world_size: int) -> int:
        """Length of the lr schedule: max_steps, or max_tokens over the estimated tokens per step."""
        train = self.config.train
        if train.max_tokens is None:
            return int(train.max_steps)
        split = self.prepared.manifest["splits"]["train"]
        instances = max(stream_epoch_length * micro_batch_size * world_size, 1)
        tokens_per_epoch = int(split["tokens"]) + 3 * instances  # [CLS] [SEP] [SEP] per instance
        steps_per_epoch = max(stream_epoch_length / train.gradient_accumulation_steps, 1e-9)
        return max(1, math.ceil(train.max_tokens / (tokens_per_epoch / steps_per_epoch)))

    # -- one optimizer step ------------------------------------------------------------------

    def _all_reduce(self, values: list[float]):
        import torch

        tensor = torch.tensor(values, dtype=torch.float64, device=self.accelerator.device)
        if self.accelerator.num_processes > 1:
            import torch.distributed as dist

            dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor.tolist()

    def train_step(self, model, optimizer, batches: list[dict], signal_hook: bool = False) -> dict:
        """Forward/backward over this step's micro-batches with globally normalized losses; returns
        global metrics and the gradient norm. The optimizer is not stepped here."""
        import torch

        accelerator, world = self.accelerator, self.accelerator.num_processes
        device = accelerator.device
        has_sentence = "sentence_label" in batches[0]
        local_predicted = sum(int((b["labels"] != -100).sum()) for b in batches)
        local_instances = sum(int(b["input_ids"].shape[0]) for b in batches)
        local_tokens = sum(int(b["attention_mask"].sum()) for b in batches)
        predicted, instances, tokens = self._all_reduce([local_predicted, local_instances, local_tokens])
        sums = torch.zeros(4, dtype=torch.float64, device=device)  # mlm CE, mlm correct, sentence CE, correct
        for index, batch in enumerate(batches):
            batch = {k: v.to(device) for k, v in batch.items()}
            last = index == len(batches) - 1
            sync = contextlib.nullcontext() if last else accelerator.no_sync(model)
            with sync:
                out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                            token_type_ids=batch["token_type_ids"], labels=batch["labels"],
                            sentence_label=batch.get("sentence_label"))
                labels = batch["labels"]
                targets = labels[labels != -100]                                    # [N]
                # The model's mlm_loss is the mean over this micro-batch's N predicted tokens (its
                # logits are not differentiable: the head computes the gradient in place), so the
                # summed cross-entropy is mean * N. DDP averages gradients over ranks: scaling by
                # world / global count makes the update sum / (predicted tokens of the whole step).
                mlm_sum = out.mlm_loss.float() * targets.numel()
                loss = mlm_sum * (world / max(predicted, 1.0))
                correct = (out.mlm_logits.detach().argmax(-1) == targets).sum()    # before the next forward
                step_sums = [mlm_sum.detach(), correct]
                if has_sentence:
                    sentence_label = batch["sentence_label"].view(-1)               # [B]
                    sentence_sum = out.sentence_loss.float() * sentence_label.numel()
                    loss = loss + sentence_sum * (world / max(instances, 1.0))
                    sentence_correct = (out.sentence_logits.detach().argmax(-1) == sentence_label).sum()
                    step_sums += [sentence_sum.detach(), sentence_correct]
                else:  # objective none: keep pooler and sentence head in the graph (DDP needs every gradient)
                    loss = loss + 0.0 * out.sentence_logits.float().sum()
                    step_sums += [torch.zeros((), device=device), torch.zeros((), device=device)]
                sums += torch.stack([s.to(torch.float64) for s in step_sums])
                if signal_hook and last:
                    os.kill(os.getpid(), signal.SIGTERM)
                accelerator.backward(loss)
        max_norm = self.config.optim.max_grad_norm
        grad_norm = accelerator.clip_grad_norm_(model.parameters(), max_norm if max_norm is not None else float("inf"))
        stop = 1.0 if stop_requested() else 0.0
        mlm_sum, mlm_correct, sentence_sum, sentence_correct, stops = self._all_reduce(sums.tolist() + [stop])
        mlm_loss = mlm_sum / max(predicted, 1.0)
        sentence_loss = sentence_sum / max(instances, 1.0) if has_sentence else None
        return {
            "loss": mlm_loss + (sentence_loss or 0.0),
            "mlm_loss": mlm_loss,
            "sentence_loss": sentence_loss,
            "mlm_accuracy": mlm_correct / max(predicted, 1.0),
            "sentence_accuracy": sentence_correct / max(instances, 1.0) if has_sentence else None,
            "grad_norm": float(grad_norm),
            "tokens": int(tokens),
            "samples": int(instances),
            "stop": stops > 0,
        }

    # -- evaluation --------------------------------------------------------------------------

    def evaluate(self, model, micro_batch_size: int) -> dict:
        """Validation MLM loss/accuracy and sentence accuracy with fixed masks (all ranks)."""
        import torch
        import torch.nn.functional as F

        from bertrain.data.loader import build_validation_loader

        accelerator = self.accelerator
        inner = accelerator.unwrap_model(model)
        inner.eval()
        sums = torch.zeros(5, dtype=torch.float64)
        with _isolated_torch_rng():
            loader = build_validation_loader(
                self.prepared, self.config.data, seed=self.config.train.seed, micro_batch_size=micro_batch_size,
                rank=accelerator.process_index, world_size=accelerator.num_processes,
                max_batches=self.config.data.eval_batches)
            with torch.no_grad(), accelerator.autocast():
                for batch in loader:
                    batch = {k: v.to(accelerator.device) for k, v in batch.items()}
                    out = inner(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                token_type_ids=batch["token_type_ids"], labels=batch["labels"],
                                sentence_label=batch.get("sentence_label"))
                    targets = batch["labels"][batch["labels"] != -100]
                    logits = out.mlm_logits.float()
                    sums[0] += F.cross_entropy(logits, targets, reduction="sum").double().cpu()
                    sums[1] += (logits.argmax(-1) == targets).sum().cpu()
                    sums[2] += targets.numel()
                    if "sentence_label" in batch:
                        label = batch["sentence_label"].view(-1)
                        sums[3] += (out.sentence_logits.argmax(-1) == label).sum().cpu()
                        sums[4] += label.numel()
        inner.train()
        ce, correct, predicted, sentence_correct, instances = self._all_reduce(sums.tolist())
        if predicted == 0:
            return {}
        record = {"mlm_loss": ce / predicted, "mlm_accuracy": correct / predicted,
                  "mlm_perplexity": math.exp(min(ce / predicted, 50.0))}
        if instances:
            record["sentence_accuracy"] = sentence_correct / instances
        return record

    # -- checkpoints -------------------------------------------------------------------------

    def save(self, model, optimizer, scheduler, state: TrainState) -> Path:
        """Collective atomic save: rank 0 writes the shared files, every rank its RNG state."""
        import torch

        from bertrain.model import save_weights

        accelerator = self.accelerator
        rank = accelerator.process_index
        if accelerator.is_main_process:
            ckpt.begin_save(self.run_dir, state.step)
        accelerator.wait_for_everyone()
        tmp = ckpt.temporary_dir(self.run_dir, state.step)
        crash_step = _test_hook("CRASH_DURING_SAVE")
        if accelerator.is_main_process:
            save_weights(accelerator.unwrap_model(model), tmp / "model.safetensors")
            torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
            if crash_step == state.step:  # test hook: kill -9 halfway through a save
                os.kill(os.getpid(), signal.SIGKILL)
            torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
            if accelerator.scaler is not None:
                torch.save(accelerator.scaler.state_dict(), tmp / "scaler.pt")
            (tmp / TRAIN_STATE).write_text(json.dumps(dataclasses.asdict(state), indent=1))
            (tmp / "config.yaml").write_text(dump_yaml(self.config))
            (tmp / DATA_INFO).write_text(json.dumps(data_info(self.prepared), indent=1))
        torch.save(_rng_state(), tmp / f"rng-rank{rank:05d}.pt")
        accelerator.wait_for_everyone()
        final = ckpt.checkpoint_name(state.step)
        if accelerator.is_main_process:
            ckpt.finish_save(tmp, self.config.train.keep_last)
        accelerator.wait_for_everyone()
        return ckpt.checkpoints_dir(self.run_dir) / final

    def load(self, path: Path, model, optimizer, scheduler) -> None:
        """Model, optimizer, schedule and grad-scaler state from a checkpoint (RNG restored later)."""
        import torch

        from bertrain.model import load_weights

        load_weights(model, path / "model.safetensors")
        optimizer.load_state_dict(torch.load(path / "optimizer.pt", map_location="cpu", weights_only=False))
        scheduler.load_state_dict(torch.load(path / "scheduler.pt", map_location="cpu", weights_only=False))

    def _apply_forced_settings(self, optimizer, scheduler, state: TrainState, total_steps: int) -> None:
        """After --force: the optimizer and schedule follow this config, not the checkpoint's
        (load_state_dict restored the old lr, betas, weight decay and schedule length)."""
        optim = self.config.optim
        schedule = scheduler.lr_lambdas[0]
        if total_steps != state.total_steps:
            from bertrain.train.optim import warmup_steps_for

            schedule.total_steps, schedule.warmup_steps = total_steps, warmup_steps_for(optim, total_steps)
            state.total_steps = total_steps
        schedule.schedule = optim.schedule
        scheduler.base_lrs = [optim.lr for _ in optimizer.param_groups]
        for group, decay in zip(optimizer.param_groups, (optim.weight_decay, 0.0)):
            group["weight_decay"], group["eps"] = decay, optim.eps
            group["betas"] = (float(optim.betas[0]), float(optim.betas[1]))
            group["lr"] = optim.lr * schedule(state.step)
        scheduler._last_lr = [group["lr"] for group in optimizer.param_groups]

    # -- the run -----------------------------------------------------------------------------

    def run(self, dry_run: bool = False) -> int:
        install_handlers()
        import torch
        from accelerate.utils import broadcast_object_list, set_seed

        from bertrain.model import build_model, initialize_from
        from bertrain.train.optim import build_optimizer, build_scheduler

        config, train = self.config, self.config.train
        self.accelerator = accelerator = self._accelerator()
        rank, world = accelerator.process_index, accelerator.num_processes
        is_main = accelerator.is_main_process
        micro_batch_size = micro_batch_size_for(config, world)
        accumulation = train.gradient_accumulation_steps

        if train.deterministic:
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
            torch.use_deterministic_algorithms(True)

        # Which checkpoint (rank 0 reads the disk, everyone gets its answer).
        choice = [None, [], None]
        if is_main and not dry_run:
            try:
                found, skipped = self._choose_checkpoint()
                choice = [str(found) if found else None, [(str(p), why) for p, why in skipped], None]
            except BertrainError as error:  # every rank raises it (a lone rank 0 would leave the others waiting)
                choice = [None, [], (type(error).__name__, str(error))]
        if world > 1:
            broadcast_object_list(choice)
        if choice[2] is not None:
            kind, message = choice[2]
            raise {"UsageError": UsageError, "ConfigError": ConfigError}.get(kind, DataError)(message)
        resume_path = Path(choice[0]) if choice[0] else None
        monitor = Monitor(self.run_dir, config, self.console) if is_main and not dry_run else NullMonitor()
        for path, why in choice[1]:
            if is_main:
                self.console.print(f"[yellow]Skipping invalid checkpoint[/] {path}: {why}", highlight=False)

        state = TrainState(world_size=world, micro_batch_size=micro_batch_size)
        data = data_info(self.prepared)
        if resume_path is not None:
            saved_config = build_dataclass(Config, read_yaml(resume_path / "config.yaml"))
            saved_state = TrainState(**json.loads((resume_path / TRAIN_STATE).read_text()))
            saved_data = json.loads((resume_path / DATA_INFO).read_text())
            never, forceable = resume_differences(saved_config, saved_state, saved_data, config, world, data)
            if never or (forceable and not self.force):
                lines = "\n".join(f"  {line}" for line in never + forceable)
                what = ("These cannot be overridden (the weights would not fit)." if never else
                        "Pass --force to resume anyway, or use a new --run-dir.")
                raise ConfigError(f"Cannot resume from {resume_path}: the run changed since that checkpoint:\n"
                                  f"{lines}\n{what}")
            state = saved_state
            if forceable:
                old_global = saved_state.micro_batch_size * saved_state.world_size
                state.micro_batch = state.micro_batch * old_global // (micro_batch_size * world)
                state.world_size, state.micro_batch_size = world, micro_batch_size
                if is_main:
                    self.console.print("[yellow]--force:[/] resuming despite: " + "; ".join(forceable), highlight=False)

        # Model: same initialization on every rank.
        set_seed(train.seed)
        model = build_model(config.model)
        if config.model.init_from and resume_path is None:
            loaded = initialize_from(model, config.model.init_from)
            if is_main:
                self.console.print(f"Initialized from {loaded}", highlight=False)
        num_parameters = model.num_parameters()
        checkpoint_bytes = self.estimated_checkpoint_bytes(num_parameters)

        stream = TrainStream(self.prepared, config.data, seed=train.seed, micro_batch_size=micro_batch_size,
                             rank=rank, world_size=world, epoch=state.epoch, micro_batch=state.micro_batch)
        epoch_length = stream.epoch_length(0)
        total_steps = self.total_steps(epoch_length, micro_batch_size, world)
        if resume_path is None:
            state.total_steps = total_steps
        if dry_run:
            return self._dry_run(model, micro_batch_size, num_parameters, checkpoint_bytes, epoch_length, total_steps)
        self._check_disk(checkpoint_bytes)  # on every rank, so all of them stop together

        optimizer = build_optimizer(model, config.optim, accelerator.device)
        scheduler = build_scheduler(optimizer, config.optim, state.total_steps)
        if resume_path is not None:
            self.load(resume_path, model, optimizer, scheduler)
            if self.force:
                self._apply_forced_settings(optimizer, scheduler, state, total_steps)
        if train.compile:
            model = torch.compile(model)
        model, optimizer = accelerator.prepare(model, optimizer)  # the scheduler stays ours: one step per step
        if resume_path is not None and accelerator.scaler is not None and (resume_path / "scaler.pt").is_file():
            accelerator.scaler.load_state_dict(torch.load(resume_path / "scaler.pt", weights_only=False))

        # Files of the run (rank 0), then each rank's RNG: restored, or seeded per rank.
        if is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            (self.run_dir / "config.yaml").write_text(dump_yaml(config))
            tokenizer_copy = self.run_dir / "tokenizer"
            if self.prepared.tokenizer_dir.is_dir():
                shutil.rmtree(tokenizer_copy, ignore_errors=True)
                shutil.copytree(self.prepared.tokenizer_dir, tokenizer_copy)
            dropped = truncate_metrics(self.run_dir, state.step)
            if resume_path is not None:
                self.console.print(f"Resuming from {resume_path} (step {state.step}, epoch {state.epoch}, "
                                   f"micro-batch {state.micro_batch})"
                                   + (f"; dropped {dropped} metric records written after it" if dropped else ""),
                                   highlight=False)
        accelerator.wait_for_everyone()
        rng_file = resume_path / f"rng-rank{rank:05d}.pt" if resume_path is not None else None
        if rng_file is not None and rng_file.is_file():
            _set_rng_state(torch.load(rng_file, weights_only=False))
        else:
            set_seed(train.seed + rank)

        return self._loop(model, optimizer, scheduler, stream, state, monitor, micro_batch_size, accumulation,
                          num_parameters)

    def _done(self, state: TrainState) -> bool:
        train = self.config.train
        if train.max_tokens is not None:
            return state.tokens_seen >= train.max_tokens
        return state.step >= train.max_steps

    def _loop(self, model, optimizer, scheduler, stream: TrainStream, state: TrainState, monitor, micro_batch_size: int,
              accumulation: int, num_parameters: int) -> int:
        train = self.config.train
        accelerator = self.accelerator
        model.train()
        signal_step = _test_hook("SIGNAL_AT_STEP")
        step_delay = float(os.environ.get("BERTRAIN_TEST_STEP_DELAY", "0"))  # slow steps for the SLURM test
        crash_after = _test_hook("CRASH_AFTER_SAVE")
        start_step, start_time = state.step, time.time()
        window_time, window_tokens, window_samples = time.time(), 0, 0
        last_record: dict = {}
        last_eval: dict = {}
        last_checkpoint: Path | None = None
        exit_code, stop_reason = 0, "finished"
        monitor.start(state.step, state.total_steps)
        if accelerator.is_main_process:
            monitor.message(f"Training {num_parameters:,} parameters on {accelerator.num_processes} process(es), "
                            f"{micro_batch_size} sequences per micro-batch x {accumulation} accumulation, "
                            f"global batch {train.batch_size}, device {accelerator.device}.")
        try:
            while not self._done(state):
                batches = [stream.next() for _ in range(accumulation)]
                lr = scheduler.get_last_lr()[0]
                hook = signal_step is not None and signal_step == state.step + 1 and accelerator.is_main_process
                metrics = self.train_step(model, optimizer, batches, signal_hook=hook)
                state.epoch, state.micro_batch = stream.epoch, stream.micro_batch
                state.tokens_seen += metrics["tokens"]
                state.samples_seen += metrics["samples"]
                window_tokens += metrics["tokens"]
                window_samples += metrics["samples"]
                finite = math.isfinite(metrics["loss"])
                if finite and (math.isfinite(metrics["grad_norm"]) or accelerator.scaler is not None):
                    optimizer.step()
                    applied = not getattr(optimizer, "step_was_skipped", False)
                else:
                    applied = False
                optimizer.zero_grad(set_to_none=True)
                if not finite or not applied and accelerator.scaler is None:
                    state.bad_steps += 1
                    monitor.warn(f"step {state.step + 1}: non-finite loss or gradient "
                                 f"(loss {metrics['loss']}, grad norm {metrics['grad_norm']}); step skipped "
                                 f"({state.bad_steps} in a row).")
                    if state.bad_steps >= train.max_bad_steps:
                        raise DataError(
                            f"Training stopped at step {state.step + 1}: {state.bad_steps} non-finite steps in a row "
                            f"(train.max_bad_steps); skipped steps are never saved, so the newest checkpoint "
                            f"({last_checkpoint or 'none from this session'}) is finite. Lower optim.lr, keep "
                            f"optim.max_grad_norm set, or use bf16 instead of fp16.")
                    if not metrics["stop"]:
                        continue
                elif applied:
                    scheduler.step()
                    state.step += 1
                    state.bad_steps = 0
                monitor.advance(state.step)
                if step_delay:
                    time.sleep(step_delay)
                done = self._done(state)
                if applied and (state.step % train.log_every == 0 or done or metrics["stop"]):
                    elapsed = max(time.time() - window_time, 1e-9)
                    last_record = {"kind": "train", "step": state.step, "epoch": state.epoch,
                                   "loss": metrics["loss"], "mlm_loss": metrics["mlm_loss"],
                                   "sentence_loss": metrics["sentence_loss"], "mlm_accuracy": metrics["mlm_accuracy"],
                                   "sentence_accuracy": metrics["sentence_accuracy"], "lr": lr,
                                   "grad_norm": metrics["grad_norm"], "tokens_per_s": window_tokens / elapsed,
                                   "samples_per_s": window_samples / elapsed, "tokens_seen": state.tokens_seen,
                                   "samples_seen": state.samples_seen}
                    monitor.log(last_record)
                    window_time, window_tokens, window_samples = time.time(), 0, 0
                if applied and train.eval_every and state.step % train.eval_every == 0:
                    result = self.evaluate(model, micro_batch_size)
                    if result:
                        last_eval = dict(result, kind="eval", step=state.step)
                        monitor.log(last_eval)
                    window_time = time.time()  # keep eval time out of the throughput
                stop_here = train.stop_at_step is not None and state.step >= train.stop_at_step
                save_now = state.step % train.save_every == 0 or done or metrics["stop"] or stop_here
                if state.bad_steps == 0 and save_now:
                    if last_checkpoint is None or ckpt.step_of(last_checkpoint) != state.step:
                        last_checkpoint = self.save(model, optimizer, scheduler, state)
                    if crash_after == state.step and accelerator.is_main_process:  # test hook: kill -9
                        os.kill(os.getpid(), signal.SIGKILL)
                    window_time = time.time()
                if metrics["stop"]:
                    exit_code = train.requeue_exit_code
                    stop_reason = f"stopped by {received_signal_name() or 'a signal on another rank'}"
                    break
                if stop_here:
                    stop_reason = f"stopped at train.stop_at_step={train.stop_at_step}"
                    break
            saved_step = ckpt.step_of(last_checkpoint) if last_checkpoint else None
            if self._done(state) and state.step > start_step and saved_step != state.step and not state.bad_steps:
                last_checkpoint = self.save(model, optimizer, scheduler, state)  # budget reached on a skipped step
        except BaseException as error:
            stop_reason = f"failed: {type(error).__name__}"
            raise
        finally:
            elapsed = time.time() - start_time
            steps = state.step - start_step
            summary = {"result": stop_reason, "step": state.step, "epoch": state.epoch,
                       "tokens seen": state.tokens_seen, "samples seen": state.samples_seen}
            for key in ("loss", "mlm_loss", "sentence_loss", "mlm_accuracy", "sentence_accuracy"):
                if last_record.get(key) is not None:
                    summary[f"train {key}"] = last_record[key]
            for key in ("mlm_loss", "mlm_accuracy", "sentence_accuracy"):
                if last_eval.get(key) is not None:
                    summary[f"eval {key}"] = last_eval[key]
            summary.update({"time": _human_seconds(elapsed), "steps/s": steps / max(elapsed, 1e-9),
                            "checkpoint": str(last_checkpoint) if last_checkpoint else "none"})
            monitor.close(summary)
        accelerator.end_training()
        if exit_code:
            stopped = Interrupted(f"Stopped by a signal after step {state.step}; checkpoint {last_checkpoint}. "
                                  f"Exit code {exit_code}: requeue the job (or run the same command) to resume.")
            stopped.exit_code = exit_code
            raise stopped
        return exit_code

    # -- dry run -----------------------------------------------------------------------------

    def _dry_run(self, model, micro_batch_size: int, num_parameters: int, checkpoint_bytes: int, epoch_length: int,
                 total_steps: int) -> int:
        """Print the run's size and a time estimate from a few measured steps; write nothing."""
        from bertrain.train.optim import build_optimizer

        config, train, accelerator = self.config, self.config.train, self.accelerator
        split = self.prepared.manifest["splits"]["train"]
        steps_per_epoch = epoch_length / train.gradient_accumulation_steps
        optimizer = build_optimizer(model, config.optim, accelerator.device)
        model, optimizer = accelerator.prepare(model, optimizer)
        model.train()
        stream = TrainStream(self.prepared, config.data, seed=train.seed, micro_batch_size=micro_batch_size,
                             rank=accelerator.process_index, world_size=accelerator.num_processes, epoch=0,
                             micro_batch=0)
        times = []
        for _ in range(3):
            batches = [stream.next() for _ in range(train.gradient_accumulation_steps)]
            begin = time.perf_counter()
            self.train_step(model, optimizer, batches)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            times.append(time.perf_counter() - begin)
        step_time = sum(times[1:]) / len(times[1:])
        disk = checkpoint_bytes * (train.keep_last + 1)
        if accelerator.is_main_process:
            table = Table(title=f"pretrain --dry-run ({accelerator.num_processes} process(es))")
            table.add_column("", style="cyan")
            table.add_column("value", style="green", justify="right")
            rows = [("model", f"{config.model.type}, vocab {config.model.vocab_size}"),
                    ("parameters", f"{num_parameters:,}"),
                    ("tokens per epoch", f"{int(split['tokens']):,}"),
                    ("sequences per step", f"{train.batch_size:,}"),
                    ("micro-batch per process",
                     f"{micro_batch_size} x {train.gradient_accumulation_steps} accumulation"),
                    ("steps per epoch", f"{steps_per_epoch:,.1f}"),
                    ("total steps", f"{total_steps:,}"),
                    ("epochs", f"{total_steps / max(steps_per_epoch, 1e-9):,.2f}"),
                    ("checkpoint size", _human_bytes(checkpoint_bytes)),
                    ("disk needed", f"{_human_bytes(disk)} (keep_last {train.keep_last} + 1 while saving)"),
                    ("measured step time", f"{step_time:.3f} s"),
                    ("estimated time", _human_seconds(step_time * total_steps))]
            for key, value in rows:
                table.add_row(key, value)
            self.console.print(table)
        return 0


def pretrain(config: Config, *, data_dir: str | None = None, run_dir: str | None = None, resume: str = "auto",
             force: bool = False, dry_run: bool = False, console: Console | None = None) -> int:
    """Run (or dry-run) pretraining; returns 0, or raises `Interrupted` (exit_code = train.requeue_exit_code)
    after a signal-triggered checkpoint."""
    trainer = Trainer(config, resume=resume, force=force, console=console, data_dir=data_dir, run_dir=run_dir)
    return trainer.run(dry_run=dry_run)
