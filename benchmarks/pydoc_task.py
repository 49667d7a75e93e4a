"""Write a small local task for `bertrain evaluate` from CPython's reference manual (the demo's corpus): is a
sentence from a topic about statements and control flow, or about data types and objects? Validation sentences
come from topics that training never shows, so the score measures what the encoder knows, not the topic names.
The README's "Is my model any good?" table uses it.

    python benchmarks/pydoc_task.py --out pydoc_task
    bertrain evaluate bertrain-demo/model --tasks pydoc_task/task.yaml --baseline random --out eval/demo
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml
from pydoc_data.topics import topics

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bertrain.data.sentences import split_sentences  # noqa: E402
from bertrain.data.sources.pydoc import prose_paragraphs  # noqa: E402

STATEMENTS = ("assert", "assignment", "augassign", "break", "continue", "del", "for", "global", "if", "import",
              "nonlocal", "pass", "raise", "return", "try", "while", "with", "yield", "class", "function",
              "compound", "async", "else")
DATA = ("dict", "lists", "strings", "string-methods", "integers", "floating", "numbers", "numeric-types",
        "typesmapping", "typesseq", "typesseq-mutable", "sequence-types", "booleans", "imaginary", "truth",
        "bltin-null-object", "bltin-ellipsis-object", "typesfunctions", "typesmethods", "typesmodules", "slicings",
        "formatstrings", "bitwise")
HELD_OUT = {"while", "try", "import", "return", "raise", "dict", "floating", "typesseq-mutable", "formatstrings",
            "booleans"}
RECIPE = {"lr": 1e-4, "epochs": 5, "batch_size": 16}  # a tiny model wants a larger lr than BERT-base's 2e-5


def sentences_of(topic: str) -> list[str]:
    return [" ".join(s.split()) for paragraph in prose_paragraphs(topics[topic]) for s in split_sentences(paragraph)
            if len(s.split()) >= 4]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    splits: dict[str, list[dict]] = {"train": [], "dev": []}
    for label, group in ((0, STATEMENTS), (1, DATA)):
        for topic in group:
            split = "dev" if topic in HELD_OUT else "train"
            splits[split] += [{"sentence": s, "label": label, "topic": topic} for s in sentences_of(topic)]
    for split, records in splits.items():
        (args.out / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (args.out / "task.yaml").write_text(yaml.safe_dump({
        "name": "pydoc_kind", "train": "train.jsonl", "validation": "dev.jsonl", "text": "sentence",
        "label": "label", "kind": "classification", "metric": "accuracy", "finetune": RECIPE}, sort_keys=False))
    print(f"Wrote {args.out}/task.yaml: {len(splits['train'])} training and {len(splits['dev'])} validation "
          "sentences.")


if __name__ == "__main__":
    main()
