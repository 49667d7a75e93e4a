"""`bertrain demo`: the whole pipeline on CPython's documentation, offline, in minutes on a CPU."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from bertrain.cli.app import app, console


@app.command("demo")
def demo(
    model: str = typer.Option("albert", "--model", "-m",
                              help="`albert` (Unigram tokenizer, MLM + SOP) or `bert` (WordPiece, MLM + NSP)."),
    out: Path = typer.Option(Path("bertrain-demo"), "--out", "-o",
                             help="Directory for the corpus, prepared data, run and exported model (running the same "
                                  "demo again resumes an interrupted one; another demo's output there is replaced)."),
    steps: Optional[int] = typer.Option(None, "--steps", help="Optimizer steps (default: the demo config's)."),
    quick: bool = typer.Option(False, "--quick", help="A few dozen steps: checks the pipeline, not the learning."),
) -> None:
    """Prepare CPython's documentation, train a tokenizer, pretrain a tiny model, export it, fill masks.

    No network is used. On 2 idle CPU cores the default ALBERT demo (2400 steps) takes about 3 to 5 minutes.

    It ends with times, losses, accuracy against a most-frequent-token baseline and fill-mask predictions.

    Example: bertrain demo --model bert --out bertrain-demo-bert
    """
    from bertrain.demo import run_demo

    run_demo(model=model.lower(), out=out, steps=steps, quick=quick, console=console)
