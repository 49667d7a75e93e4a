"""Sentence splitting on Universal Dependencies test text: F1 and speed of bertrain's splitter against libraries.

Data: benchmarks/data/ud/LANG.txt (gold sentences, one a line, blank lines between documents; see the README
there). Each document's sentences are joined as raw text, with a space (with nothing for zh and ja), split, and
scored.
F1 is over the boundaries inside each document: a boundary is the number of non-space characters before a
sentence start, so a splitter's whitespace handling does not matter; precision and recall are summed over
all documents of a language. Speed is characters of raw text per second of this process's CPU time (one core;
CPU time, not wall-clock, so other jobs on a shared machine change it less), the best of --repeats.
`bertrain` is what prepare runs (`sentence_splitter: auto`: pythainlp for Thai when installed), `rules` its rules
alone. Libraries not installed are skipped (pip install sentencex pysbd blingfire pythainlp python-crfsuite).

    python benchmarks/sentence_split.py
    python benchmarks/sentence_split.py --langs zh,ja --splitters bertrain,sentencex
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Callable, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

DATA = Path(__file__).resolve().parent / "data" / "ud"
LANGS = ("ar", "de", "en", "hi", "ja", "ru", "th", "zh")
UNSPACED = ("ja", "zh")
PYSBD_LANGS = ("ar", "de", "en", "hi", "ja", "ru", "zh")


def load(lang: str) -> list[list[str]]:
    """The gold documents of a language: lists of sentences."""
    blocks = (DATA / f"{lang}.txt").read_text(encoding="utf-8").split("\n\n")
    return [block.strip("\n").split("\n") for block in blocks if block.strip()]


def boundaries(sentences: list[str]) -> set[int]:
    """Sentence starts inside a document, as counts of non-space characters before them."""
    out, position = set(), 0
    for sentence in sentences[:-1]:
        position += sum(not char.isspace() for char in sentence)
        out.add(position)
    return out


def splitter(name: str, lang: str) -> Optional[Callable[[str], list[str]]]:
    """A function text -> sentences, or None when the library is missing or does not cover the language."""
    try:
        if name == "bertrain":
            from bertrain.data.sentences import split_sentences
            return split_sentences
        if name == "rules":
            from bertrain.data.sentences import split_by_rules
            return split_by_rules
        if name == "sentencex":
            from sentencex import segment
            return lambda text: list(segment(lang, text))
        if name == "pysbd" and lang in PYSBD_LANGS:
            import pysbd
            segmenter = pysbd.Segmenter(language=lang, clean=False)
            return segmenter.segment
        if name == "blingfire":
            import blingfire
            return lambda text: blingfire.text_to_sentences(text).split("\n")
        if name == "pythainlp" and lang == "th":
            from pythainlp.tokenize import sent_tokenize
            return sent_tokenize
    except ImportError:
        return None
    return None


def measure(split: Callable[[str], list[str]], documents: list[list[str]], joiner: str,
            repeats: int) -> tuple[float, float]:
    """(F1, characters per second) of a splitter on a language's documents."""
    texts = [joiner.join(doc) for doc in documents]
    true_positives = predicted = gold = 0
    for doc, text in zip(documents, texts):
        expected, found = boundaries(doc), boundaries([s for s in split(text) if s.strip()])
        true_positives += len(expected & found)
        predicted += len(found)
        gold += len(expected)
    precision = true_positives / predicted if predicted else 0.0
    recall = true_positives / gold if gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    chars = sum(map(len, texts))
    best = float("inf")
    for _ in range(repeats):
        start = time.process_time()
        for text in texts:
            split(text)
        best = min(best, time.process_time() - start)
    return f1, chars / best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--langs", default=",".join(LANGS))
    parser.add_argument("--splitters", default="bertrain,sentencex,pysbd,blingfire,pythainlp")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    names = args.splitters.split(",")
    print(f"{'lang':<5}" + "".join(f"{name:>24}" for name in names))
    print(f"{'':<5}" + "".join(f"{'F1   M chars/s':>24}" for _ in names))
    for lang in args.langs.split(","):
        documents = load(lang)
        cells = []
        for name in names:
            split = splitter(name, lang)
            if split is None:
                cells.append(f"{'-':>24}")
                continue
            f1, speed = measure(split, documents, "" if lang in UNSPACED else " ", args.repeats)
            cells.append(f"{f1:>18.3f} {speed / 1e6:>5.2f}")
        print(f"{lang:<5}" + "".join(cells), flush=True)


if __name__ == "__main__":
    main()
