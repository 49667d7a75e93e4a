"""bertrain's Unigram tokenizer (the ALBERT path of bertrain/data/tokenizer.py) against sentencepiece's own Unigram
trainer, trained on the same text with the same vocabulary size.

Not part of the test suite. Any plain-text file will do (one or more sentences per line); the figures in the README
and the commit that changed the trainer came from the King James Bible (Project Gutenberg, public domain, 4 MB):

    pip install sentencepiece          # or: pip install -e .[dev]
    python benchmarks/unigram_vs_sentencepiece.py kjv.txt --vocab-size 8000

Every `--held-out`-th non-empty line is held out; both tokenizers train on the others, lowercased (bertrain's
`tokenizer.lowercase: true`, as the ALBERT recipes; sentencepiece gets the lowercased text and its default NFKC
normalization, character_coverage 1.0 as bertrain keeps every character). Reported:

- tokens per word on the held-out lines (words: whitespace-separated, punctuation attached);
- the share of the 1,000 most frequent words of the training lines (runs of letters) that encode, alone, as one token;
- the pieces of the most frequent words that either tokenizer splits, and of `--words`;
- training time (the machine may be shared: compare the two, not across machines).
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def read_lines(path: Path) -> tuple[list[str], int]:
    """The file's non-empty lines (invalid UTF-8 replaced) and how many characters were replaced."""
    text = path.read_bytes().decode("utf-8", errors="replace")
    return [line.strip() for line in text.splitlines() if line.strip()], text.count("\ufffd")


def train_ours(lines: list[str], vocab_size: int, out: Path):
    from bertrain.config import TokenizerConfig
    from bertrain.data.tokenizer import train_tokenizer
    from bertrain.tokenizer_file import load_tokenizer

    train_tokenizer(iter(lines), TokenizerConfig(kind="unigram", vocab_size=vocab_size, lowercase=True), out)
    tokenizer = load_tokenizer(out)
    encode = lambda texts: [tokenizer.encode(text, add_special_tokens=False).tokens for text in texts]  # noqa: E731
    return encode, tokenizer.get_vocab_size()


def train_sentencepiece(lines: list[str], vocab_size: int, out: Path):
    import sentencepiece

    corpus = out / "train.txt"
    corpus.write_text("".join(line.lower() + "\n" for line in lines), encoding="utf-8")
    # hard_vocab_limit=False: a smaller vocabulary where the text supports fewer pieces, as bertrain does
    sentencepiece.SentencePieceTrainer.train(
        input=str(corpus), model_prefix=str(out / "sp"), vocab_size=vocab_size, model_type="unigram",
        character_coverage=1.0, hard_vocab_limit=False, minloglevel=2)
    processor = sentencepiece.SentencePieceProcessor(model_file=str(out / "sp.model"))
    encode = lambda texts: processor.encode([text.lower() for text in texts], out_type=str)  # noqa: E731
    return encode, processor.get_piece_size()


def figures(encode, held_out: list[str], top_words: list[str]) -> dict:
    words = sum(len(line.split()) for line in held_out)
    tokens = sum(len(pieces) for pieces in encode(held_out))
    single = sum(len(pieces) == 1 for pieces in encode(top_words))
    return {"tokens per word": tokens / words, "top words as one token": single / len(top_words)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("text", type=Path, help="a plain-text file (e.g. the King James Bible)")
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--held-out", type=int, default=10, help="hold out every N-th line (default 10)")
    parser.add_argument("--top", type=int, default=1000, help="the most frequent words checked (default 1000)")
    parser.add_argument("--words", default="from,shalt,if,unto,upon,which",
                        help="comma-separated words whose pieces are shown")
    args = parser.parse_args()

    lines, replaced = read_lines(args.text)
    train = [line for i, line in enumerate(lines) if i % args.held_out]
    held_out = [line for i, line in enumerate(lines) if not i % args.held_out]
    counts = Counter(word for line in train for word in re.findall(r"[^\W\d_]+", line.lower()))
    top_words = [word for word, _ in counts.most_common(args.top)]
    print(f"{args.text}: {len(train):,} training lines, {len(held_out):,} held out, {len(counts):,} distinct words"
          + (f", {replaced} invalid UTF-8 byte(s) replaced" if replaced else ""))

    results, encoders = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, trainer in (("bertrain", train_ours), ("sentencepiece", train_sentencepiece)):
            out = Path(tmp) / name
            out.mkdir()
            start = time.perf_counter()
            encoders[name], size = trainer(train, args.vocab_size, out)
            seconds = time.perf_counter() - start
            results[name] = {"vocabulary": size, **figures(encoders[name], held_out, top_words),
                             "training seconds": seconds}

    print(f"\nvocab_size {args.vocab_size}        bertrain  sentencepiece")
    for key in ("vocabulary", "tokens per word", "top words as one token", "training seconds"):
        ours, theirs = results["bertrain"][key], results["sentencepiece"][key]
        shown = {"vocabulary": lambda v: f"{v:,}", "top words as one token": lambda v: f"{v:.1%}"}.get(
            key, lambda v: f"{v:.3f}")
        print(f"{key.replace('top', f'top {len(top_words):,}'):<32}{shown(ours):>10}{shown(theirs):>15}")

    split = [w for w in top_words if any(len(encoders[n]([w])[0]) > 1 for n in encoders)][:12]
    shown_words = list(dict.fromkeys([w.strip().lower() for w in args.words.split(",") if w.strip()] + split))
    print(f"\npieces of {', '.join(args.words.split(','))} and of the most frequent words either one splits:")
    for word in shown_words:
        ours, theirs = (" ".join(encoders[n]([word])[0]) for n in ("bertrain", "sentencepiece"))
        print(f"  {word:<14} bertrain: {ours:<24} sentencepiece: {theirs}")


if __name__ == "__main__":
    main()
