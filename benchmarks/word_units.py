"""Word units and masking beyond English, measured on Universal Dependencies test text (gold words and sentences).

Not part of the test suite. For each language it writes the treebank's gold sentences one per line (a blank line
between its documents), runs `bertrain prepare` on them (WordPiece and Unigram) and reports:

1. the realized masking rate (share of eligible tokens chosen) of token, whole-word and n-gram masking with the
   shipped configs' settings (`bertrain inspect --pairs`'s statistic; target 15% +- 0.5 points);
2. Chinese and Japanese: the share of whole-word masking units that are only part of a gold word (a gold word the
   unit overlaps is not wholly inside it), with the segmenter and without (`prepare.word_segmenter: none`);
   every unit is chosen with the same probability, so this is the share of masked units;
3. Thai and every language: the share of characters WordPiece turns into [UNK], with bertrain's pre-tokenizer
   and with BERT's plain one (which makes a run over 100 characters one [UNK]).

    python benchmarks/word_units.py --ud /work/ud_pud            # all languages found there
    python benchmarks/word_units.py --ud /work/ud_pud --languages zh ja th

UD files: {lang}_pud-ud-test.conllu, or ja_gsd-ud-test.conllu for Japanese (CC BY-SA).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bertrain.config import Recipe, load_config  # noqa: E402
from bertrain.config.schema import PrepareConfig, SourceConfig, TokenizerConfig  # noqa: E402
from bertrain.data.format import open_prepared  # noqa: E402
from bertrain.data.loader import train_dataset  # noqa: E402
from bertrain.data.masking import word_tables  # noqa: E402
from bertrain.data.prepare import prepare_corpus  # noqa: E402
from bertrain.data.word_units import WordSegmenter, encode, word_starts_for  # noqa: E402
from bertrain.tokenizer_file import load_tokenizer  # noqa: E402

LANGUAGES = ("zh", "ja", "hi", "th", "ar", "ru", "de", "en")
# (label, shipped config, data.masking): the masking settings of the shipped configs, each unit kind.
MASKINGS = (("token, bert_base", "bert_base", "token"), ("whole_word, bert_base", "bert_base", "whole_word"),
            ("ngram, albert_base", "albert_base", "ngram"))


def read_conllu(path: Path) -> list[list[tuple[str, list[str]]]]:
    """Documents, each a list of (sentence text, gold word forms), from a CoNLL-U file."""
    documents: list[list[tuple[str, list[str]]]] = [[]]
    text, words = None, []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("# newdoc") and documents[-1]:
            documents.append([])
        elif line.startswith("# text ="):
            text, words = line.split("=", 1)[1].strip(), []
        elif line and line[0].isdigit():
            columns = line.split("\t")
            if "-" not in columns[0] and "." not in columns[0]:
                words.append(columns[1])
        elif not line and text is not None:
            documents[-1].append((text, words))
            text = None
    return [document for document in documents if document]


def gold_spans(text: str, words: list[str]) -> list[tuple[int, int]]:
    """Character spans of the gold words in the sentence (words the text spells differently are skipped)."""
    spans, position = [], 0
    for word in words:
        start = text.find(word, position)
        if start < 0:
            continue
        spans.append((start, start + len(word)))
        position = start + len(word)
    return spans


def prepare(documents, kind: str, out: Path, segmenter: str, vocab_size: int) -> Path:
    """A DATA_DIR of the gold sentences, one per line."""
    corpus = out.parent / f"{out.name}.txt"
    corpus.write_text("\n\n".join("\n".join(text for text, _ in document) for document in documents) + "\n",
                      encoding="utf-8")
    recipe = Recipe(prepare=PrepareConfig(sources=[SourceConfig(path=str(corpus), format="text",
                                                                text_layout="sentence_per_line")],
                                          validation_fraction=0.0, num_shards=1, workers=1,
                                          word_segmenter=segmenter),
                    tokenizer=TokenizerConfig(kind=kind, vocab_size=vocab_size, lowercase=False))
    prepare_corpus(recipe, out)
    return out


def realized_rate(data_dir: Path, config_name: str, masking: str, batches: int = 40) -> float:
    """Share of eligible tokens chosen for prediction over the first batches of epoch 0."""
    config = load_config(config_name)
    data_config = dataclasses.replace(config.data, path=str(data_dir), masking=masking, num_workers=0)
    prepared = open_prepared(data_dir)
    dataset = train_dataset(prepared, data_config, seed=0, epoch=0, micro_batch_size=16, rank=0, world_size=1)
    chosen = eligible = 0
    for micro_batch in range(min(batches, len(dataset))):
        batch = dataset[micro_batch]
        assembled = dataset.assemble(dataset.positions(micro_batch))
        chosen += int((batch["labels"].numpy() != -100).sum())
        eligible += int((~assembled.special).sum())
    return chosen / max(eligible, 1)


def partial_unit_share(data_dir: Path, documents, language: str | None) -> float:
    """Share of word units (by the stored rules for `language`, None: tokenizer marks) that are only part of a
    gold word."""
    prepared = open_prepared(data_dir)
    tokenizer = load_tokenizer(prepared.tokenizer_dir)
    facts = prepared.manifest["tokenizer"]
    tables = word_tables(str(prepared.tokenizer_dir / "tokenizer.json"), facts["kind"], facts["word_marker"],
                         prepared.vocab_size)
    segmenter = WordSegmenter()
    units = partial = 0
    for text, words in (pair for document in documents for pair in document):
        encoding = tokenizer.encode(text, add_special_tokens=False)
        ids = np.asarray(encoding.ids, dtype=np.int64)
        _, offsets = encode(tokenizer, [text], [language])
        starts, _ = word_starts_for([text], [language], ids, np.array([len(ids)]), offsets, tables, segmenter)
        gold = gold_spans(text, words)
        bounds = np.flatnonzero(starts).tolist() + [len(ids)]
        for first, stop in zip(bounds[:-1], bounds[1:]):
            begin = min(encoding.offsets[i][0] for i in range(first, stop))
            end = max(encoding.offsets[i][1] for i in range(first, stop))
            if not text[begin:end].strip():
                continue
            units += 1
            if any(start < end and begin < stop_ and not (begin <= start and stop_ <= end) for start, stop_ in gold):
                partial += 1
    return partial / max(units, 1)


def unk_char_share(data_dir: Path, texts: list[str], plain_bert: bool) -> float:
    """Share of characters inside [UNK] tokens (with BERT's plain pre-tokenizer if `plain_bert`)."""
    from tokenizers import pre_tokenizers

    tokenizer = load_tokenizer(open_prepared(data_dir).tokenizer_dir)
    if plain_bert:
        tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    unk = tokenizer.token_to_id("[UNK]")
    inside = total = 0
    for encoding, text in zip(tokenizer.encode_batch(texts, add_special_tokens=False), texts):
        total += len(text)
        inside += sum(end - start for token, (start, end) in zip(encoding.ids, encoding.offsets) if token == unk)
    return inside / max(total, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ud", type=Path, default=Path("/work/ud_pud"), help="folder of UD .conllu files")
    parser.add_argument("--languages", nargs="*", default=list(LANGUAGES))
    parser.add_argument("--vocab-size", type=int, default=8000)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for language in args.languages:
            path = args.ud / (f"{language}_gsd-ud-test.conllu" if language == "ja" else
                              f"{language}_pud-ud-test.conllu")
            if not path.is_file():
                print(f"{language}: {path} not found, skipped")
                continue
            documents = read_conllu(path)
            texts = [text for document in documents for text, _ in document]
            # UD's documents are a few sentences each; training instances are long: 50-sentence documents.
            pairs = [pair for document in documents for pair in document]
            long_documents = [pairs[i:i + 50] for i in range(0, len(pairs), 50)]
            row = {"language": language}
            for kind in ("wordpiece", "unigram"):
                data = prepare(long_documents, kind, Path(tmp) / f"{language}-{kind}", "auto", args.vocab_size)
                for label, config, masking in MASKINGS:
                    if (kind == "unigram") == (config == "albert_base"):
                        row[label] = realized_rate(data, config, masking)
                if kind == "wordpiece":
                    row["[UNK] chars"] = unk_char_share(data, texts, plain_bert=False)
                    row["[UNK] chars, BERT pre-tokenizer"] = unk_char_share(data, texts, plain_bert=True)
                if language in ("zh", "ja"):
                    plain = prepare(long_documents, kind, Path(tmp) / f"{language}-{kind}-plain", "none",
                                    args.vocab_size)
                    for label, config, masking in MASKINGS[1:]:
                        if (kind == "unigram") == (config == "albert_base"):
                            row[f"{label}, no segmenter"] = realized_rate(plain, config, masking)
                    row[f"partial units {kind}"] = partial_unit_share(data, documents, language)
                    row[f"partial units {kind}, no segmenter"] = partial_unit_share(data, documents, None)
            rows.append(row)
            print(row, flush=True)
    columns = sorted({key for row in rows for key in row} - {"language"}, key=lambda k: (k.split()[0], k))
    print("\n| language | " + " | ".join(columns) + " |")
    print("|---|" + "---|" * len(columns))
    for row in rows:
        print(f"| {row['language']} | " + " | ".join(f"{100 * row[c]:.1f}%" if c in row else "" for c in columns)
              + " |")


if __name__ == "__main__":
    main()
