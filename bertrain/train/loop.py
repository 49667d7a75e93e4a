"""The training run: setup, the loop of optimizer steps, logging, evaluation, checkpoints and stopping.
Exactness comes from stream.py, checkpoint.py (saved RNG) and step.py (globally normalized losses)."""

from __future__ import annotations

import contextlib
import os
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from accelerate.utils import set_seed
from rich.console import Console

from bertrain import rundir
from bertrain.config import Config, check_precision_for_device, micro_batch_size_for
from bertrain.console import human_seconds, make_console
from bertrain.data.loader import EmptyEpochError
from bertrain.errors import EXIT_CTRL_C, Interrupted
from bertrain.model import build_model
from bertrain.model.hf import initialize_from
from bertrain.train import checkpoint, fault_hooks
from bertrain.train.checkpoint import TrainState
from bertrain.train.dry_run import ResumeRequest, repetition_warning, report_dry_run
from bertrain.train.evaluate import evaluate
from bertrain.train.monitor import Monitor, NullMonitor
from bertrain.train.optim import apply_settings, build_optimizer, build_scheduler, stretch_schedule
from bertrain.train.parent_watch import watch_parent
from bertrain.train.precision import local_device_type
from bertrain.train.report import write_run_report
from bertrain.train.resume_rules import resumed_state
from bertrain.train.setup import (build_accelerator, compile_if_chosen, resolve_run_config, schedule_length,
                                  write_run_files)
from bertrain.train.signals import ctrl_c_saves, install_handlers, received_signal_name, stop_at_once
from bertrain.train.step import (LossScale, NonFiniteWatch, StepResult, end_training, gradient_groups,
                                 optimizer_step, too_many_bad_steps, train_step)
from bertrain.train.stream import TrainStream
from bertrain.train.threads import ThreadTuner, plan_threads, start_tuner


@dataclass
class Parts:
    """What the loop trains with."""

    model: Any
    optimizer: Any
    scheduler: Any
    stream: TrainStream
    state: TrainState
    monitor: Monitor | NullMonitor
    micro_batch_size: int
    gradient_groups: list  # the trainable parameters by device and dtype, listed once (train_step)
    tuner: ThreadTuner | None = None  # train.threads on a one-process CPU run


@dataclass
class Session:
    """This process's bookkeeping of the loop: throughput window, last records, how it ended."""

    start_step: int
    start_time: float = field(default_factory=time.time)
    watch: NonFiniteWatch = field(default_factory=NonFiniteWatch)  # skipped steps, read at log and save time
    loss_scale: LossScale | None = None  # fp16's grad scaler
    skipped_last: bool = False  # fp16: the scaler skipped the last step
    window_time: float = field(default_factory=time.time)
    window_tokens: int = 0
    window_samples: int = 0
    last_record: dict = field(default_factory=dict)
    last_eval: dict = field(default_factory=dict)
    last_checkpoint: Path | None = None
    exit_code: int = 0
    stop_reason: str = "finished"


class Trainer:
    """One pretraining run; `run()` returns the process exit code."""

    def __init__(self, config: Config, *, resume: str = "auto", force: bool = False, console: Console | None = None,
                 data_dir: str | None = None, run_dir: str | None = None, trust_checkpoint: bool = False) -> None:
        self.resume, self.force, self.trust_checkpoint = resume, force, trust_checkpoint
        self.forced: list[str] = []           # differences from the checkpoint that --force let through
        self.longer_budget: str | None = None  # a raised train.max_steps / max_tokens (free)
        self.console = console or make_console()
        # Before the data is opened: fp16 on a CPU is a config error (exit 2) whatever the data.
        check_precision_for_device(config.train.mixed_precision, local_device_type())
        self.config, self.prepared = resolve_run_config(config, data_dir, run_dir)
        self.run_dir = Path(self.config.train.output_dir)

    # -- setup -------------------------------------------------------------------------------

    def run(self, dry_run: bool = False) -> int:
        """Set up (resume or start), then train until the budget, a signal or train.stop_at_step."""
        install_handlers()
        watch_parent()  # under torchrun / accelerate launch: a SIGTERM (save, exit 75) if the launcher dies
        threads = torch.get_num_threads()
        try:
            with contextlib.ExitStack() as self._held:  # RUN_DIR's lock, taken by checkpoint.agree_on_checkpoint
                return self._run(dry_run)
        finally:
            torch.set_num_threads(threads)  # train.threads is this run's (in-process callers keep theirs)

    def _run(self, dry_run: bool) -> int:
        config, train = self.config, self.config.train
        self.accelerator = accelerator = build_accelerator(train)
        rank, world, is_main = accelerator.process_index, accelerator.num_processes, accelerator.is_main_process
        micro_batch_size = micro_batch_size_for(config, world)
        self.thread_plan = plan_threads(train.threads, device_type=accelerator.device.type, world_size=world,
                                        deterministic=train.deterministic, compiled=train.compile is True)
        if train.deterministic:
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
            torch.use_deterministic_algorithms(True)

        resume_path = None if dry_run else checkpoint.agree_on_checkpoint(
            accelerator, self.run_dir, self.resume, self.trust_checkpoint, self._held, self.console)
        monitor = Monitor(self.run_dir, config, self.console) if is_main and not dry_run else NullMonitor()
        state = self._start_state(resume_path, micro_batch_size)
        model, num_parameters = self._build_model(resume_path)
        checkpoint_bytes = checkpoint.estimated_checkpoint_bytes(num_parameters)
        stream = TrainStream(self.prepared, config.data, seed=train.seed, micro_batch_size=micro_batch_size,
                             rank=rank, world_size=world, epoch=state.epoch, micro_batch=state.micro_batch,
                             device_type=accelerator.device.type)
        try:
            epoch_length = stream.epoch_length(0)
        except EmptyEpochError as error:  # a dry run shows its plan first, then this
            if not dry_run:
                raise
            return report_dry_run(model, accelerator, self.console, config, self.prepared,
                                  micro_batch_size=micro_batch_size, num_parameters=num_parameters,
                                  checkpoint_bytes=checkpoint_bytes, epoch_length=0,
                                  total_steps=train.max_steps if train.max_tokens is None else None, problem=error)
        total_steps = schedule_length(config, self.prepared, epoch_length, micro_batch_size, world)
        if resume_path is None:
            state.total_steps = total_steps
        if dry_run:
            return report_dry_run(model, accelerator, self.console, config, self.prepared,
                                  micro_batch_size=micro_batch_size, num_parameters=num_parameters,
                                  checkpoint_bytes=checkpoint_bytes, epoch_length=epoch_length, total_steps=total_steps,
                                  resume=ResumeRequest(self.run_dir, self.resume, self.force, self.trust_checkpoint))
        repeats = repetition_warning(config, epoch_length, state.total_steps)
        if repeats and is_main:
            self.console.print(f"[yellow]Warning:[/] {repeats}", highlight=False)
        checkpoint.check_disk(self.run_dir, checkpoint_bytes)  # on every rank, so all of them stop together
        model, optimizer, scheduler = self._prepare_training(model, resume_path, state, total_steps)
        if accelerator.is_main_process:
            write_run_files(self.run_dir, config, self.prepared, state, resume_path, self.console)
        accelerator.wait_for_everyone()
        checkpoint.restore_rng(resume_path, rank, train.seed)
        parts = Parts(model, optimizer, scheduler, stream, state, monitor, micro_batch_size, gradient_groups(model))
        return self._loop(parts, num_parameters)

    def _start_state(self, resume_path: Path | None, micro_batch_size: int) -> TrainState:
        """A fresh TrainState, or the checkpoint's after checking what changed since it."""
        world = self.accelerator.num_processes
        if resume_path is None:
            return TrainState(world_size=world, micro_batch_size=micro_batch_size)
        resumption = resumed_state(resume_path, self.config, checkpoint.data_info(self.prepared), world,
                                   micro_batch_size, self.force)
        self.forced, self.longer_budget = resumption.forced, resumption.longer_budget
        if self.forced and self.accelerator.is_main_process:
            self.console.print("[yellow]--force:[/] resuming despite: " + "; ".join(self.forced), highlight=False)
        if self.longer_budget and self.accelerator.is_main_process:
            self.console.print(f"Longer budget ({self.longer_budget}): the lr schedule's decay is recomputed to end "
                               "with it.", highlight=False)
        return resumption.state

    def _build_model(self, resume_path: Path | None):
        """The model, initialized alike on every rank (and from model.init_from on a fresh run)."""
        set_seed(self.config.train.seed)
        model = build_model(self.config.model)
        if self.config.model.init_from and resume_path is None:
            loaded = initialize_from(model, self.config.model.init_from, self.prepared.tokenizer_dir)
            if self.accelerator.is_main_process:
                self.console.print(f"Initialized from {loaded}; the optimizer and lr schedule start fresh (step 0): "
                                   "init_from loads weights only.", highlight=False)
        return model, model.num_parameters()

    def _prepare_training(self, model, resume_path: Path | None, state: TrainState, total_steps: int):
        """Optimizer and schedule (loaded from the checkpoint; after --force, set to this config), compiled
        and wrapped by Accelerate. The scheduler stays ours: it steps once per applied optimizer step."""
        config, accelerator = self.config, self.accelerator
        optimizer = build_optimizer(model, config.optim, accelerator.device)
        scheduler = build_scheduler(optimizer, config.optim, state.total_steps)
        if resume_path is not None:
            checkpoint.load_checkpoint(resume_path, model, optimizer, scheduler)
            new_length = total_steps if total_steps != state.total_steps else None
            if self.forced:
                scheduler = apply_settings(optimizer, scheduler, config.optim, state.step, new_length)
            elif self.longer_budget and new_length:
                scheduler = stretch_schedule(optimizer, scheduler, state.step, new_length)
            if self.forced or self.longer_budget:
                state.total_steps = total_steps
        compile_if_chosen(model, config.train, self.accelerator, state.total_steps, self.console)
        model, optimizer = accelerator.prepare(model, optimizer)
        if resume_path is not None:
            checkpoint.load_scaler(resume_path, accelerator)
        return model, optimizer, scheduler

    # -- the loop ----------------------------------------------------------------------------

    def _done(self, state: TrainState, session: Session) -> bool:
        train = self.config.train  # a token budget ends on an applied step: fp16's skipped steps read tokens too
        if train.max_tokens is not None:
            return state.tokens_seen >= train.max_tokens and not session.skipped_last
        return state.step >= train.max_steps

    def _save(self, parts: Parts) -> Path:
        saved = checkpoint.save_checkpoint(self.accelerator, self.run_dir, self.config, self.prepared, parts.model,
                                          parts.optimizer, parts.scheduler, parts.state)
        parts.monitor.event("checkpoint", parts.state.step)
        return saved

    def _report(self, parts: Parts) -> None:
        if self.config.logging.report and self.accelerator.is_main_process:
            write_run_report(self.run_dir, parts.monitor.warn)

    def _loop(self, parts: Parts, num_parameters: int) -> int:
        train, accelerator, state = self.config.train, self.accelerator, parts.state
        parts.model.train()
        session = Session(state.step, loss_scale=LossScale(accelerator.scaler) if accelerator.scaler else None)
        if self.thread_plan is not None:
            parts.tuner = start_tuner(self.thread_plan, parts.model, accelerator, self.config, self.prepared,
                                      parts.micro_batch_size, parts.monitor.message)
            parts.monitor.expect(parts.tuner.estimate)
        parts.monitor.start(state.step, state.total_steps)
        parts.monitor.event("start", state.step, total_steps=state.total_steps, parameters=num_parameters,
                            processes=accelerator.num_processes, device=str(accelerator.device))
        parts.monitor.message(  # the main process's (a NullMonitor elsewhere)
            f"Training {num_parameters:,} parameters on {accelerator.num_processes} process(es) ({accelerator.device}; "
            f"{parts.stream.workers.describe()}), {parts.micro_batch_size} sequences per micro-batch x "
            f"{train.gradient_accumulation_steps} accumulation, global batch {train.batch_size}.")
        try:
            with ctrl_c_saves():
                while not self._done(state, session) and not self._one_step(parts, session):
                    pass
        except OSError as error:  # disk full or read-only (metrics): name the file and what to do
            session.stop_reason = f"failed: {type(error).__name__}"
            raise checkpoint.write_error(error, f"training (step {state.step})", self.run_dir) from None
        except BaseException as error:
            session.stop_reason = f"failed: {type(error).__name__}"
            raise
        finally:
            parts.stream.close()  # loader workers stopped now, not at interpreter exit
            parts.monitor.close(self._summary(state, session))
            self._report(parts)
        end_training(accelerator)
        if session.exit_code:
            raise Interrupted(self._stop_message(state, session), session.exit_code)
        if accelerator.is_main_process and session.last_checkpoint:
            command = shlex.join(["bertrain", "export", str(self.run_dir), f"exported/{self.run_dir.name}", "--verify"])
            self.console.print(f"Next: {command}  (a transformers model directory)", highlight=False, soft_wrap=True)
        return 0

    def _stop_message(self, state: TrainState, session: Session) -> str:
        """What a signal-stopped run says last: the step, the checkpoint, and how to resume."""
        last = session.last_checkpoint
        if session.exit_code != EXIT_CTRL_C:
            return (f"Stopped by a signal after step {state.step}; checkpoint {last or 'none from this session'}. "
                    f"Exit code {session.exit_code}: requeue the job (or run the same command) to resume.")
        saved = f"checkpoint saved ({last})" if last and rundir.step_of(last) == state.step else (
            f"the last step was not finite, so step {state.step} was not saved; newest checkpoint "
            f"{last or 'none from this session'}")
        return f"Stopped by Ctrl-C after step {state.step}; {saved}; the same command resumes. Exit code {EXIT_CTRL_C}."

    def _one_step(self, parts: Parts, session: Session) -> bool:
        """One optimizer step (or a skipped one) and what follows it; True when the run must stop here."""
        state, accelerator = parts.state, self.accelerator
        if parts.tuner is not None and parts.tuner.due():  # train.threads: auto, measured again
            began = time.time()
            line = parts.tuner.probe()
            if line:
                parts.monitor.message(line)
            parts.monitor.expect(parts.tuner.estimate)
            session.window_time += time.time() - began  # not training time
        batches = [parts.stream.next() for _ in range(self.config.train.gradient_accumulation_steps)]
        lr = parts.scheduler.get_last_lr()[0]
        fault_hooks.fire("SIGNAL_AT_STEP", state.step + 1)
        fault_hooks.fire("PAUSE_AT_STEP", state.step + 1)
        metrics = train_step(parts.model, accelerator, batches, self.config.optim.max_grad_norm, parts.gradient_groups)
        state.epoch, state.micro_batch = parts.stream.epoch, parts.stream.micro_batch
        state.tokens_seen += metrics.tokens  # host ints: the step reads nothing from the device
        state.samples_seen += metrics.samples
        session.window_tokens += metrics.tokens
        session.window_samples += metrics.samples
        applied = self._apply_update(parts, session, metrics)
        parts.monitor.advance(state.step)
        fault_hooks.fire("STEP_DELAY", state.step)
        return self._after_step(parts, session, metrics, lr, applied)

    def _apply_update(self, parts: Parts, session: Session, metrics: StepResult) -> bool:
        """Step the optimizer and schedule. A non-finite step's update is skipped on the device, unread, and still
        counts as a step; under fp16 the scaler skips it (or an overflow) uncounted, read every step (LossScale)."""
        state, scale = parts.state, session.loss_scale
        applied = optimizer_step(parts.optimizer, metrics, scale)
        session.skipped_last = not applied
        session.watch.add(metrics.finite)
        if scale is not None:
            self._check_finite(parts, session)
            scale.check(state.step)
        if applied:
            parts.scheduler.step()
            state.step += 1
        return applied

    def _check_finite(self, parts: Parts, session: Session) -> None:
        """Read how many steps were non-finite (one device read): warn; stop after train.max_bad_steps in a row."""
        state = parts.state
        since, state.bad_steps = session.watch.read()
        if since:
            parts.monitor.event("nonfinite", state.step, skipped=since)
            parts.monitor.warn(f"step {state.step}: non-finite loss or gradient in {since} step(s) since the last "
                               f"check; update skipped, step skipped ({state.bad_steps} in a row).")
        if state.bad_steps >= self.config.train.max_bad_steps:
            raise too_many_bad_steps(state.step, state.bad_steps, session.last_checkpoint)

    def _after_step(self, parts: Parts, session: Session, metrics: StepResult, lr: float, applied: bool) -> bool:
        """Log, evaluate and save as due; True when a signal or train.stop_at_step ends the run here."""
        train, state = self.config.train, parts.state
        done = self._done(state, session)
        stop_here = train.stop_at_step is not None and state.step >= train.stop_at_step
        log_due = applied and (state.step % train.log_every == 0 or done or metrics.stop)
        save_due = (applied and state.step % train.save_every == 0) or done or metrics.stop or stop_here
        if (log_due or save_due) and session.loss_scale is None:  # one device read serves both (fp16: read already)
            self._check_finite(parts, session)  # never save right after a non-finite step
        if log_due:
            self._log(parts, session, metrics.read(self.accelerator), lr)
        evaluate_now = applied and train.eval_every and (state.step % train.eval_every == 0 or done)  # and the end
        if evaluate_now:
            result = evaluate(parts.model, self.accelerator, self.prepared, self.config.data, seed=train.seed,
                              micro_batch_size=parts.micro_batch_size, progress=parts.monitor.eval_progress,
                              warn=parts.monitor.warn)
            if result:
                session.last_eval = dict(result, kind="eval", step=state.step)
                parts.monitor.log(session.last_eval)
            session.window_time = time.time()  # keep eval time out of the throughput
        if state.bad_steps == 0 and save_due:
            last = session.last_checkpoint
            if last is None or rundir.step_of(last) != state.step:
                session.last_checkpoint = self._save(parts)
            fault_hooks.fire("CRASH_AFTER_SAVE", state.step)
            session.window_time = time.time()
        if evaluate_now:
            self._report(parts)  # after the save, so that its mark is on the page
            session.window_time = time.time()  # writing the page is not training time
        if metrics.stop:  # Ctrl-C (on any rank, and no preemption signal on any): 130, the same on every rank
            session.exit_code = train.requeue_exit_code if metrics.requeue else EXIT_CTRL_C
            session.stop_reason = "stopped by Ctrl-C" if not metrics.requeue else \
                f"stopped by {received_signal_name() or 'a signal on another rank'}"
            return True
        if stop_here:
            session.stop_reason = f"stopped at train.stop_at_step={train.stop_at_step}"
            return True
        return False

    def _log(self, parts: Parts, session: Session, metrics: dict, lr: float) -> None:
        state = parts.state
        elapsed = max(time.time() - session.window_time, 1e-9)
        session.last_record = {
            "kind": "train", "step": state.step, "epoch": state.epoch, "loss": metrics["loss"],
            "mlm_loss": metrics["mlm_loss"], "sentence_loss": metrics["sentence_loss"],
            "mlm_accuracy": metrics["mlm_accuracy"], "sentence_accuracy": metrics["sentence_accuracy"], "lr": lr,
            "grad_norm": metrics["grad_norm"], "tokens_per_s": session.window_tokens / elapsed,
            "samples_per_s": session.window_samples / elapsed, "tokens_seen": state.tokens_seen,
            "samples_seen": state.samples_seen}
        if session.loss_scale is not None:  # fp16
            session.last_record["loss_scale"] = session.loss_scale.value
        parts.monitor.log(session.last_record)
        if parts.tuner is not None:
            parts.tuner.observe(session.last_record["tokens_per_s"])
        session.window_time, session.window_tokens, session.window_samples = time.time(), 0, 0

    def _summary(self, state: TrainState, session: Session) -> dict:
        """The table printed (and sent to wandb) when the loop ends, however it ends."""
        elapsed = time.time() - session.start_time
        summary = {"result": session.stop_reason, "step": state.step, "epoch": state.epoch,
                   "tokens seen": state.tokens_seen, "samples seen": state.samples_seen}
        for key in ("loss", "mlm_loss", "sentence_loss", "mlm_accuracy", "sentence_accuracy"):
            if session.last_record.get(key) is not None:
                summary[f"train {key}"] = session.last_record[key]
        for key in ("mlm_loss", "mlm_accuracy", "sentence_accuracy"):
            if session.last_eval.get(key) is not None:
                summary[f"eval {key}"] = session.last_eval[key]
        summary.update({"time": human_seconds(elapsed),
                        "steps/s": (state.step - session.start_step) / max(elapsed, 1e-9),
                        "checkpoint": str(session.last_checkpoint) if session.last_checkpoint else "none"})
        return summary


def pretrain(config: Config, *, data_dir: str | None = None, run_dir: str | None = None, resume: str = "auto",
             force: bool = False, dry_run: bool = False, console: Console | None = None,
             trust_checkpoint: bool = False) -> int:
    """Run (or dry-run) pretraining; 0, or `Interrupted` after a signal-triggered checkpoint."""
    trainer = Trainer(config, resume=resume, force=force, console=console, data_dir=data_dir, run_dir=run_dir,
                      trust_checkpoint=trust_checkpoint)
    if dry_run:
        with stop_at_once("pretrain --dry-run"):  # it writes nothing: a signal ends it at once (exit 128 + N)
            return trainer.run(dry_run=True)
    return trainer.run()
