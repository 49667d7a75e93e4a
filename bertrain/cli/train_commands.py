"""`bertrain pretrain`: the training loop behind a thin command."""

from __future__ import annotations

from typing import Optional

import typer

from bertrain.cli.app import ConfigOption, SetOption, app, console


@app.command("pretrain")
def pretrain(
    config: Optional[str] = ConfigOption,
    overrides: Optional[list[str]] = SetOption,
    data: Optional[str] = typer.Option(None, "--data", help="Prepared DATA_DIR (overrides data.path)."),
    run_dir: Optional[str] = typer.Option(None, "--run-dir", help="RUN_DIR for checkpoints and metrics "
                                          "(overrides train.output_dir)."),
    resume: str = typer.Option("auto", "--resume", help="auto: continue from RUN_DIR's newest valid checkpoint; "
                               "never: refuse a non-empty RUN_DIR; or a checkpoint directory."),
    force: bool = typer.Option(False, "--force", help="Resume although data, batch layout or optimizer settings "
                               "changed (never model shape or tokenizer)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print parameters, steps, disk and an estimated time "
                                 "from a few measured steps; train nothing."),
) -> None:
    """Pretrain BERT/ALBERT with MLM + NSP/SOP (Accelerate: plain, `accelerate launch` or `torchrun`).

    Saves atomic checkpoints to RUN_DIR/checkpoints, resumes exactly, and on SIGTERM/SIGUSR1 saves and
    exits 75 for the job scheduler to requeue.

    Example: bertrain pretrain --config tiny_bert --data data/demo_bert --run-dir runs/tiny --set train.max_steps=200
    """
    from bertrain.config import load_config
    from bertrain.train.loop import pretrain as run_pretrain

    resolved = load_config(config, overrides or [])
    run_pretrain(resolved, data_dir=data, run_dir=run_dir, resume=resume, force=force, dry_run=dry_run,
                 console=console)
