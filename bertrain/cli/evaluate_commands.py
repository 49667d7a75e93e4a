"""`bertrain evaluate`: fine-tune a model on GLUE or your own tasks over seeds; medians and spread."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from bertrain.cli.app import app, console, err_console, set_option


@app.command("evaluate")
def evaluate(
    model: Path = typer.Argument(..., metavar="MODEL", help="A RUN_DIR (its newest valid checkpoint), a checkpoint "
                                 "dir, or a transformers BERT/ALBERT dir (an export, or a downloaded model with its "
                                 "tokenizer.json)."),
    out: Path = typer.Option(..., "--out", "-o", metavar="DIR", help="Where results.json and results.md go; the "
                             "same command again continues an interrupted evaluation there."),
    tasks: str = typer.Option("glue", "--tasks", "-t", metavar="glue|NAMES|FILE.yaml",
                              help="`glue` (cola, sst2, mrpc, stsb, qqp, mnli, qnli, rte; wnli only by name), a comma "
                                   "list of GLUE names, or task YAML files (keys: docs/config.md)."),
    glue_dir: Optional[Path] = typer.Option(None, "--glue-dir", metavar="DIR",
                                            help="GLUE in its own layout (CoLA/train.tsv, dev.tsv, ..., "
                                                 "MNLI/dev_matched.tsv); without it GLUE comes from the hub."),
    seeds: Optional[int] = typer.Option(None, "--seeds", min=1, help="Seeds per task (default: 5; 3 on MNLI and "
                                        "QQP; same as --set finetune.seeds=N)."),
    baseline: Optional[Path] = typer.Option(None, "--baseline", metavar="MODEL2|random",
                                            help="A second model through the same recipe and seeds, shown side by "
                                                 "side with the difference and whether it exceeds the seed spread; "
                                                 "`random`: MODEL's architecture with random weights (what "
                                                 "pretraining added)."),
    overrides: Optional[list[str]] = set_option("finetune.lr=3e-5"),
) -> None:
    """Fine-tune MODEL on each task with several seeds, and report per task the median, mean ± std, min and max.

    Recipe (docs/config.md, `finetune` keys): lr 2e-5, batch 32, 3 epochs (5 on MRPC), warmup 10%, max length 128; change it with --set finetune.KEY=VALUE.

    Each finished (task, seed) is written to DIR/results.json at once: run the same command to continue after an interruption (SIGTERM exits 75, Ctrl-C 130). Under `bertrain launch` each process takes its share of the runs.

    Example: bertrain evaluate runs/bert -t rte,mrpc --glue-dir glue -o ev/bert

    Example: bertrain evaluate out/mine -t task.yaml --baseline bert/ -o ev/vs

    Example: bertrain evaluate runs/tiny -t sst2 --seeds 3 -o ev/quick
    """
    from bertrain.data.tasks import resolve_tasks
    from bertrain.errors import EXIT_CTRL_C, Interrupted, UsageError
    from bertrain.train.downstream import evaluate as run_evaluate
    from bertrain.train.finetune import stopped_message

    for path, what in ((model, "MODEL"), (baseline, "--baseline"), (glue_dir, "--glue-dir")):
        if path is not None and not path.exists() and not (what == "--baseline" and str(path) == "random"):
            raise UsageError(f"{what} {path} does not exist.")

    def warn(message: str) -> None:
        err_console.print(f"[yellow]Warning:[/] {message}", highlight=False)

    try:
        run_evaluate(model, resolve_tasks(tasks, glue_dir), out, console, overrides or [], seeds, baseline, warn=warn)
    except KeyboardInterrupt:  # typer would turn it into a silent exit 130
        raise Interrupted(stopped_message("Ctrl-C"), EXIT_CTRL_C) from None
