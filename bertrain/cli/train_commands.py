"""`bertrain pretrain`: the training loop behind a thin command."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from bertrain.cli.app import LIST_HINT, ConfigOption, SetOption, app, console
from bertrain.config.resume_keys import FORCE_HELP


@app.command("pretrain")
def pretrain(
    config: Optional[str] = ConfigOption,
    overrides: Optional[list[str]] = SetOption,
    data: Optional[str] = typer.Option(None, "--data", metavar="DATA_DIR",
                                       help="Prepared DATA_DIR (overrides data.path)."),
    run_dir: Optional[str] = typer.Option(None, "--run-dir", metavar="RUN_DIR",
                                          help="RUN_DIR for checkpoints and metrics (overrides train.output_dir)."),
    resume: str = typer.Option("auto", "--resume", metavar="MODE|PATH",
                               help="auto: continue from RUN_DIR's newest valid checkpoint (an error when it has "
                                    "checkpoints but none is valid); never: refuse a non-empty RUN_DIR; restart: "
                                    "move RUN_DIR's checkpoints, metrics and tokenizer to RUN_DIR/old-<time>/ "
                                    "(nothing is deleted) and start from step 0; or a checkpoint directory (or "
                                    "another RUN_DIR)."),
    force: bool = typer.Option(False, "--force", help=FORCE_HELP),
    trust_checkpoint: bool = typer.Option(
        False, "--trust-checkpoint", help="Resume from an older-format checkpoint (optimizer.pt, rng-rank*.pt: "
        "pickle files, which can run code when read) that you wrote or trust. They are read with "
        "torch.load(weights_only=True), tensors and plain values only; the next checkpoint is saved without pickle."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print parameters, tokens, steps, epochs and disk at once, "
                                 "then estimate the time from one micro-batch when that is quick; train and write "
                                 "nothing."),
    check_resume: bool = typer.Option(False, "--check-resume", help="Check that this config and data resume bit "
                                      "for bit: train 6 steps, then 3, stop, resume to 6 (fresh processes, a scratch "
                                      "directory), compare losses and weights; exit 0 when equal, 1 when not."),
) -> None:
    """Pretrain BERT/ALBERT with MLM + NSP/SOP (Accelerate: plain, `accelerate launch` or `torchrun`).

    Saves atomic checkpoints to RUN_DIR/checkpoints, resumes exactly, and on SIGTERM/SIGUSR1 saves and exits 75.

    Shipped configs: bertrain config list. A config's values and what each means: bertrain config show NAME --explain.

    Example: bertrain pretrain -c tiny_bert --data data/pydoc --run-dir runs/tiny

    Example: bertrain pretrain -c albert_base --data data/wiki --check-resume
    """
    from bertrain.config import load_config
    from bertrain.train.loop import pretrain as run_pretrain

    check_pretrain_arguments(config, resume)
    resolved = load_config(config, overrides or [])
    if check_resume:
        from bertrain.errors import UsageError
        from bertrain.train.check_resume import check_resume as run_check

        if dry_run or run_dir or resume != "auto":
            raise UsageError("--check-resume trains in a scratch directory of its own: leave out --dry-run, "
                             "--run-dir and --resume.")
        raise typer.Exit(run_check(config, list(overrides or []), data, console))
    run_pretrain(resolved, data_dir=data, run_dir=run_dir, resume=resume, force=force, dry_run=dry_run,
                 console=console, trust_checkpoint=trust_checkpoint)


def check_pretrain_arguments(config: Optional[str], resume: str) -> None:
    """Refuse (exit 2) a missing --config and a --resume path that does not exist, before torch loads."""
    from bertrain.errors import UsageError

    if config is None:
        raise UsageError(
            f"bertrain pretrain needs --config: a config YAML or a shipped config name, e.g. --config tiny_bert for "
            f"a tiny model on a CPU or --config bert_base for BERT-base ({LIST_HINT}; "
            f"`bertrain config show NAME` prints one with every value).")
    if resume not in ("auto", "never", "restart") and not Path(resume).exists():
        raise UsageError(
            f"--resume {resume}: no such checkpoint or RUN_DIR. Use --resume auto (continue from RUN_DIR's newest "
            f"checkpoint), --resume never, --resume restart (start over, moving the old checkpoints aside) or an "
            f"existing checkpoint directory (RUN_DIR/checkpoints/step-…).")


@app.command("report")
def report(
    run_dirs: list[Path] = typer.Argument(..., metavar="RUN_DIR", help="RUN_DIRs: several overlay on the same axes."),
    out: str = typer.Option("report.html", "--out", "-o", metavar="FILE|DIR",
                            help="The HTML file to write, or an existing directory (or a path ending in /) to "
                                 "write DIR/report.html in. Missing parent directories are created."),
) -> None:
    """Write one self-contained HTML page of RUN_DIRs: curves against steps or tokens, marks where checkpoints,
    stops and resumes happened, model, data, config diff and verdict. It opens offline in any browser.

    `pretrain` keeps RUN_DIR/report.html current after each evaluation (logging.report).

    Example: bertrain report runs/tiny --out tiny.html

    Example: bertrain report runs/lr1e-4 runs/lr3e-4 runs/albert --out sweep.html
    """
    from bertrain.errors import UsageError
    from bertrain.console import human_bytes
    from bertrain.train.report import report_file, why_not_a_run_dir, write_report

    bad = [f"{path} ({why})" for path in run_dirs if (why := why_not_a_run_dir(path))]
    if bad:
        raise UsageError(f"Not a RUN_DIR: {'; '.join(bad)}. A RUN_DIR is the --run-dir of `bertrain pretrain`, "
                         "which writes metrics.jsonl, config.yaml and checkpoints/ into it.")
    page = report_file(out)
    size = write_report(run_dirs, page)
    console.print(f"Wrote {page} ({human_bytes(size)}): open it in a browser.", highlight=False)
