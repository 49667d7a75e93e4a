"""`bertrain prepare`, `bertrain tokenizer train` and `bertrain inspect`."""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
from pathlib import Path
from typing import Optional

import typer

from bertrain.cli.app import app, console, set_option

tokenizer_app = typer.Typer(
    help="Train tokenizers.\n\nExample: bertrain tokenizer train --source corpus/ --kind unigram --out tok/",
    no_args_is_help=True)
app.add_typer(tokenizer_app, name="tokenizer")

RecipeOption = typer.Option(None, "--recipe", "-r", help="Data recipe YAML, or a shipped recipe name (pydoc).")
SourceOption = typer.Option(
    None, "--source", metavar="PATH",
    help="Input file, directory or glob (repeatable); replaces the recipe's source paths and keeps their settings: "
         "each --source takes those (text_layout, text_field, group_by, ...) of the recipe's first source of the same "
         "format (.txt text, .jsonl jsonl, ...; a directory: the first source of local files). Change one with "
         "--set prepare.sources.0.KEY=VALUE (0 is the first --source).")
KindOption = typer.Option(None, "--tokenizer-kind", "--kind", help="wordpiece (BERT) or unigram (ALBERT).")
VocabOption = typer.Option(None, "--vocab-size", help="Tokenizer vocabulary size (tokenizer.vocab_size).")
# Keys these commands accept (only the prepare and tokenizer sections); the shared example names optim.
PrepareSetOption = set_option("prepare.min_sentence_chars=10")
TokenizerSetOption = set_option("tokenizer.lowercase=false")


def _overrides(recipe: Optional[str], sets: Optional[list[str]], sources: Optional[list[str]],
               **keys: object) -> list[str]:
    """Turn flags into `section.key=value` overrides (flags win over the recipe, --set wins over flags)."""
    overrides = []
    names_inputs = re.compile(r"\s*prepare\.sources(\s*=|\.\d+\.path\s*=|\[\d+\]\.path\s*=)")
    replaced = [text for text in sets or [] if names_inputs.match(text)]
    if sources and replaced:  # the --set won silently: the --source files were never read
        raise typer.BadParameter(f"--source and --set {replaced[0]} both name the input files: give them one way.")
    if sources:
        overrides.append("prepare.sources=" + json.dumps(_sources_with_recipe_settings(recipe, sources)))
    for dotted, value in keys.items():
        if value is not None:
            overrides.append(f"{dotted.replace('__', '.')}={json.dumps(value)}")
    return overrides + list(sets or [])


def _sources_with_recipe_settings(recipe: Optional[str], paths: list[str]) -> list[dict]:
    """--source paths as source mappings with the settings of the recipe source each follows, said on the console
    where a setting differs from its default."""
    from bertrain.config import SourceConfig, load_recipe
    from bertrain.data.sources.lookup import sources_for_paths

    defaults = dataclasses.asdict(SourceConfig())
    entries = sources_for_paths(paths, load_recipe(recipe).prepare.sources if recipe else [])
    for index, (entry, followed) in enumerate(entries):
        kept = {k: v for k, v in entry.items() if k not in ("path", "format") and v != defaults[k]}
        if followed is not None and kept:
            settings = ", ".join(f"{k}: {json.dumps(v)}" for k, v in kept.items())
            console.print(f"--source {entry['path']} (prepare.sources.{index}) keeps the settings of the recipe's "
                          f"source {followed}: {settings}", highlight=False, markup=False, soft_wrap=True)
    return [entry for entry, _ in entries]


@app.command("prepare")
def prepare(
    out: Path = typer.Option(..., "--out", "-o", help="DATA_DIR to write (resumes when it exists)."),
    recipe: Optional[str] = RecipeOption,
    source: Optional[list[str]] = SourceOption,
    tokenizer_kind: Optional[str] = KindOption,
    vocab_size: Optional[int] = VocabOption,
    tokenizer: Optional[str] = typer.Option(None, "--tokenizer", help="Use this existing tokenizer "
                                            "(directory or tokenizer.json) instead of training one."),
    num_shards: Optional[int] = typer.Option(None, "--num-shards", help="Output shards (prepare.num_shards)."),
    shard_index: Optional[int] = typer.Option(None, "--shard-index", help="Job-array task: tokenize only "
                                              "shard i of --num-shards (the last task writes the manifest)."),
    workers: Optional[int] = typer.Option(None, "--workers", "-w", help="Parallel worker processes."),
    validation_fraction: Optional[float] = typer.Option(None, "--validation-fraction",
                                                        help="Fraction of documents for validation."),
    overrides: Optional[list[str]] = PrepareSetOption,
) -> None:
    """Read raw corpora, train a tokenizer and write a tokenized, memory-mapped DATA_DIR.

    Re-running a finished DATA_DIR does nothing; an interrupted one (Ctrl-C, SIGTERM) resumes.

    Changed settings rebuild what they affect; prepare says so first, as runs on the old data may not resume on it.

    Each --source keeps the settings of the recipe's source of its format; set one: --set prepare.sources.0.KEY=VALUE.

    Example: bertrain prepare --recipe pydoc --out data/pydoc --vocab-size 8000
    """
    from bertrain.config import load_recipe
    from bertrain.data.prepare import prepare_corpus
    from bertrain.special_tokens import MODEL_OF_KIND

    loaded = load_recipe(recipe, _overrides(
        recipe, overrides, source, tokenizer__kind=tokenizer_kind, tokenizer__vocab_size=vocab_size,
        tokenizer__path=tokenizer, prepare__num_shards=num_shards, prepare__workers=workers,
        prepare__validation_fraction=validation_fraction))
    result = prepare_corpus(loaded, out, shard_index=shard_index, console=console)
    if result.get("complete", True):
        kind = result["tokenizer"]["kind"]
        config = f"tiny_{MODEL_OF_KIND[kind]}"
        console.print(f"Done: {out} (fingerprint {result['fingerprint'][:12]}). Next, pretrain a small "
                      f"{MODEL_OF_KIND[kind].upper()} on it (config {config}, which fits its {kind} tokenizer):",
                      highlight=False, markup=False, soft_wrap=True)
        console.print(next_command(out, config), soft_wrap=True, markup=False, highlight=False)


def next_command(out: Path, config: str) -> str:
    """The pretrain command for a prepared DATA_DIR, whole and copyable (paths quoted for the shell)."""
    run_dir = Path("runs") / f"{Path(out).resolve().name or 'data'}-{config}"
    return (f"  bertrain pretrain --config {config} --data {shlex.quote(str(out))} "
            f"--run-dir {shlex.quote(str(run_dir))}")


@tokenizer_app.command("train")
def tokenizer_train(
    out: Path = typer.Option(..., "--out", "-o", help="Directory for tokenizer.json and the wrapper files."),
    recipe: Optional[str] = RecipeOption,
    source: Optional[list[str]] = SourceOption,
    kind: Optional[str] = typer.Option(None, "--kind", "--tokenizer-kind", help="wordpiece or unigram."),
    vocab_size: Optional[int] = VocabOption,
    overrides: Optional[list[str]] = TokenizerSetOption,
) -> None:
    """Train a tokenizer on the recipe's sources (documents cleaned and split as `prepare` does).

    Held-out validation documents (prepare.validation_fraction) give the unknown-token rate, tokens per word and per character.

    Example: bertrain tokenizer train --source corpus/ --kind unigram --out tok/
    """
    from rich.table import Table

    from bertrain.config import load_recipe
    from bertrain.data.tokenizer_recipe import train_tokenizer_from_recipe

    loaded = load_recipe(recipe, _overrides(recipe, overrides, source, tokenizer__kind=kind,
                                            tokenizer__vocab_size=vocab_size))
    stats = train_tokenizer_from_recipe(loaded, out, console=console)
    table = Table(title=f"Tokenizer {out}", show_header=False)
    unmeasured = not stats.get("measured_words")  # no held-out text: the rates below are not zeros but unknown
    for key, value in stats.items():
        shown = f"{value:.4f}" if isinstance(value, float) else str(value)
        measured_on_held_out = key in ("unk_rate", "tokens_per_word", "tokens_per_char")
        table.add_row(key, "n/a (no held-out documents)" if unmeasured and measured_on_held_out else shown)
    console.print(table)


@app.command("inspect")
def inspect(
    data_dir: Path = typer.Argument(..., metavar="DATA_DIR", help="A prepared DATA_DIR."),
    pairs: bool = typer.Option(False, "--pairs", help="Show training pairs and masked batches instead."),
    config: Optional[str] = typer.Option(None, "--config", "-c", metavar="NAME|FILE",
                                         help="Training config for --pairs."),
    batches: int = typer.Option(1, "--batches", min=1, help="Batches to show with --pairs."),
    documents: int = typer.Option(3, "--documents", min=0, help="Documents to decode in the summary."),
    audit: bool = typer.Option(False, "--audit", help="With --pairs: test whether surface features (lengths, "
                               "[SEP] position, word pieces, punctuation) predict the NSP/SOP label, with "
                               "lookup probes fit on training batches and scored on held-out documents."),
    audit_instances: int = typer.Option(20_000, "--audit-instances", min=100,
                                        help="Labelled instances the audit reads (half fit, half held out)."),
    verify: bool = typer.Option(False, "--verify", help="Check every shard's files against the sha256 the "
                                "manifest keeps (after a copy, or a disk you doubt); exit 1 naming any that differ."),
) -> None:
    """Summarize a prepared DATA_DIR: manifest, length histograms, a few decoded documents.

    Example: bertrain inspect data/pydoc --pairs --config tiny_bert --audit

    Example: bertrain inspect data/pydoc --verify
    """
    if audit and not pairs:
        raise typer.BadParameter("--audit needs --pairs (it audits the training pairs of --config).")
    if verify:
        if pairs:
            raise typer.BadParameter("--verify checks the shards only: run it without --pairs.")
        from bertrain.data.verify import verify_prepared

        verify_prepared(data_dir, console)
        return
    if pairs:
        from bertrain.data.inspect_pairs import show_audit, show_pairs

        show_pairs(data_dir, config, batches, console)
        if audit:
            show_audit(data_dir, config, console, instances=audit_instances)
        return
    from bertrain.data.inspect import show_data_summary

    show_data_summary(data_dir, console, num_documents=documents)
