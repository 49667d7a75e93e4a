"""`bertrain inspect-model`, `bertrain export` and `bertrain fill-mask`."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from bertrain.cli.app import app, console, err_console, set_option


@app.command("inspect-model")
def inspect_model(
    config: str = typer.Argument(..., metavar="NAME|FILE",
                                 help="Config YAML or a shipped name (bert_base, albert_large)."),
    overrides: Optional[list[str]] = set_option("model.num_hidden_layers=6"),
    vocab_size: Optional[int] = typer.Option(
        None, "--vocab-size", min=1, help="Vocabulary size (default: model.vocab_size, else 30522 for BERT, 30000 for "
                                   "ALBERT)."),
) -> None:
    """Print the parameters of each module of the model a config describes, and the total.

    Example: bertrain inspect-model bert_base --vocab-size 30522
    """
    from bertrain.config import load_config
    from bertrain.model.summary import DEFAULT_VOCAB, parameter_summary

    summary = parameter_summary(load_config(config, overrides or []).model, vocab_size)
    c = summary.model_config
    table = Table(title=f"{config}: {c.type}, H={c.hidden_size}, L={c.num_hidden_layers}, "
                        f"heads={c.num_attention_heads}, vocab={c.vocab_size}")
    table.add_column("module", style="cyan", no_wrap=True)
    table.add_column("parameters", justify="right", style="green")
    table.add_column("note")
    for name, count, note in summary.rows:
        table.add_row(name, f"{count:,}", note)
    table.add_section()
    table.add_row("total", f"{summary.total:,}", f"{summary.total / 1e6:.1f}M")
    published = f"{summary.published[0]}: {summary.published[1]}" if summary.published else None
    if published and c.vocab_size != DEFAULT_VOCAB[c.type]:  # the paper's count is for its own vocabulary
        published += f" with {DEFAULT_VOCAB[c.type]:,} vocabulary tokens, not {c.vocab_size:,}"
    if published:
        table.add_row("published", "", published)
    console.print(table)
    console.print(f"Total parameters: {summary.total:,}" + (f" (published {published})" if published else ""),
                  highlight=False)


@app.command("export")
def export(
    checkpoint: Path = typer.Argument(..., metavar="CHECKPOINT", help="A checkpoint dir (RUN_DIR/checkpoints/"
                                      "step-…) or a RUN_DIR (newest checkpoint)."),
    out_dir: Path = typer.Argument(..., metavar="OUT_DIR", help="Output directory for the transformers model."),
    tokenizer: Optional[Path] = typer.Option(
        None, "--tokenizer", help="Tokenizer dir to copy (default: the checkpoint's, else RUN_DIR/tokenizer)."),
    verify: bool = typer.Option(
        False, "--verify", help="Load the export with transformers, compare its logits with ours on a padded batch, "
                                "print the max difference and exit 1 if it exceeds 1e-4 (needs transformers)."),
) -> None:
    """Write a Hugging Face directory: config.json, model.safetensors and the tokenizer files.

    Load it with transformers' AutoModelForPreTraining / AutoModelForMaskedLM / AutoTokenizer.

    Example: bertrain export runs/bert_base_phase1 exported/bert_base --verify
    """
    from bertrain.errors import BertrainError
    from bertrain.model.hf import export_hf

    result = export_hf(checkpoint, out_dir, tokenizer_dir=tokenizer)
    warn_skipped(result["skipped"])
    table = Table(title=f"Exported to {result['out_dir']}")
    table.add_column("item", style="cyan")
    table.add_column("value", overflow="fold")  # the checkpoint's RUN_DIR: a long path shown whole, folded
    if result["checkpoint"] is not None:
        table.add_row("checkpoint", result["checkpoint"].name)
        table.add_row("from", str(result["checkpoint"].parent.parent))
    table.add_row("architecture", result["architecture"])
    table.add_row("parameters", f"{result['parameters']:,}")
    table.add_row("tokenizer", ", ".join(result["tokenizer_files"]) or "none")
    console.print(table)
    if not result["tokenizer_files"]:
        err_console.print("[yellow]Warning:[/] no tokenizer found (checkpoint/tokenizer, RUN_DIR/tokenizer); "
                          "pass --tokenizer DATA_DIR/tokenizer so AutoTokenizer and pipelines can load the export.")
    if verify:
        from bertrain.model.hf_verify import verify_export

        check = verify_export(result["model"], result["out_dir"])
        console.print(f"Verify: {check.summary()}", highlight=False)
        if not check.passed:
            raise BertrainError(f"export --verify FAILED: transformers' load of {result['out_dir']} does not "
                                "reproduce the model's logits. Please report this with the command you ran.")


def warn_skipped(skipped) -> None:
    """Say which newer checkpoints of a RUN_DIR were passed over, and why (never a silent fallback)."""
    for path, why in skipped:
        err_console.print(f"[yellow]Skipping invalid checkpoint[/] {path}: {why}", highlight=False)


@app.command("fill-mask")
def fill_mask_command(
    model_dir: Path = typer.Argument(..., metavar="MODEL_DIR",
                                     help="An exported transformers dir, a checkpoint dir or a RUN_DIR."),
    text: str = typer.Argument(..., metavar="TEXT", help='Text with the mask token, e.g. "the [MASK] sat on the mat".'),
    top_k: int = typer.Option(5, "--top-k", min=1, help="Predictions to show per mask."),
) -> None:
    """Predict the masked word(s) in TEXT, like transformers' fill-mask pipeline.

    Example: bertrain fill-mask exported/bert "paris is the [MASK] of france."
    """
    from bertrain.model.fill_mask import fill_mask, load_for_inference

    skipped: list = []
    model, tokenizer_dir = load_for_inference(model_dir, skipped)
    warn_skipped(skipped)
    results = fill_mask(model, tokenizer_dir, text, top_k=top_k)
    groups = results if results and isinstance(results[0], list) else [results]
    for index, group in enumerate(groups):
        table = Table(title=f"mask {index + 1}" if len(groups) > 1 else None)
        table.add_column("token", style="cyan")
        table.add_column("score", justify="right", style="green")
        table.add_column("sequence")
        for row in group:
            table.add_row(row["token_str"], f"{row['score']:.4f}", row["sequence"])
        console.print(table)
