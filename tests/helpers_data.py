"""Build a small, real prepared DATA_DIR for tests (independent of `bertrain prepare`).

Prose from CPython's `pydoc_data.topics`, split into paragraphs → documents and sentences, tokenized
with a tiny tokenizer trained here with the `tokenizers` library (WordPiece `##` or Unigram `▁`,
special tokens at ids 0-4 as the shared contract says), written with bertrain.data.format.

    from tests.helpers_data import make_prepared_dir
    data_dir = make_prepared_dir(tmp_path / "data", kind="unigram", num_documents=120, seed=0)
"""

from __future__ import annotations

import hashlib
import json
import re
from functools import lru_cache
from pathlib import Path

import numpy as np

from bertrain.data.format import token_dtype_for, write_manifest, write_shard

SPECIAL_STRINGS = {
    "wordpiece": {"pad": "[PAD]", "unk": "[UNK]", "cls": "[CLS]", "sep": "[SEP]", "mask": "[MASK]"},
    "unigram": {"pad": "<pad>", "unk": "<unk>", "cls": "[CLS]", "sep": "[SEP]", "mask": "[MASK]"},
}
WORD_MARKERS = {"wordpiece": "##", "unigram": "▁"}
_SENTENCE_END = re.compile(r"(?<=[.!?:])\s+")


@lru_cache(maxsize=1)
def pydoc_paragraphs() -> tuple[str, ...]:
    """Non-empty paragraphs of Python's reference topics, in a fixed order."""
    from pydoc_data.topics import topics

    paragraphs = []
    for key in sorted(topics):
        for block in re.split(r"\n\s*\n", topics[key]):
            text = " ".join(block.split())
            if text:
                paragraphs.append(text)
    return tuple(paragraphs)


def split_sentences(paragraph: str) -> list[str]:
    """Sentences of a paragraph (a simple punctuation rule is enough for tests)."""
    return [s for s in _SENTENCE_END.split(paragraph) if s.strip()]


def train_tokenizer(kind: str = "wordpiece", vocab_size: int = 1200):
    """A tiny tokenizers.Tokenizer trained on the pydoc prose, cached per process (Unigram training is
    not deterministic across runs, so decode a DATA_DIR with its own tokenizer/tokenizer.json)."""
    return _train_tokenizer(kind, vocab_size)


@lru_cache(maxsize=4)
def _train_tokenizer(kind: str, vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    specials = list(SPECIAL_STRINGS[kind].values())
    text = list(pydoc_paragraphs())
    if kind == "wordpiece":
        tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
        tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tokenizer.decoder = decoders.WordPiece()
        trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=specials, min_frequency=2)
    elif kind == "unigram":
        tokenizer = Tokenizer(models.Unigram())
        tokenizer.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
        # Splitting punctuation and digits before Metaspace avoids a Unigram trainer crash on prose.
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation(),
            pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.Metaspace()])
        tokenizer.decoder = decoders.Metaspace()
        trainer = trainers.UnigramTrainer(vocab_size=vocab_size, special_tokens=specials, unk_token="<unk>")
    else:
        raise ValueError(f"unknown tokenizer kind {kind!r}")
    tokenizer.train_from_iterator(text, trainer=trainer)
    for index, token in enumerate(specials):
        assert tokenizer.token_to_id(token) == index, (kind, token, tokenizer.token_to_id(token))
    return tokenizer


def make_prepared_dir(path: str | Path, kind: str = "wordpiece", num_documents: int = 200, seed: int = 0,
                      num_shards: int = 2, validation_documents: int = 8, vocab_size: int = 1200,
                      max_paragraphs: int | None = None) -> Path:
    """Write a prepared DATA_DIR (train split in `num_shards` shards, one validation shard) and return it.

    Documents are runs of consecutive pydoc paragraphs (num_documents of them in total; `seed`
    shuffles which go to which shard and which are held out for validation).
    """
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(kind, vocab_size)
    paragraphs = pydoc_paragraphs()[:max_paragraphs]
    groups = np.array_split(np.arange(len(paragraphs)), num_documents)
    documents = [[s for p in group for s in split_sentences(paragraphs[p])] for group in groups]
    documents = [d for d in documents if d]
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(documents))
    validation = [documents[i] for i in order[:validation_documents]]
    train = [documents[i] for i in order[validation_documents:]]

    tokenizer_dir = path / "tokenizer"
    tokenizer_dir.mkdir(exist_ok=True)
    tokenizer.save(str(tokenizer_dir / "tokenizer.json"))
    strings = SPECIAL_STRINGS[kind]
    (tokenizer_dir / "special_tokens_map.json").write_text(json.dumps(
        {f"{name}_token": value for name, value in strings.items()}, indent=2))
    (tokenizer_dir / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 512,
         **{f"{name}_token": value for name, value in strings.items()}}, indent=2))
    dtype = token_dtype_for(tokenizer.get_vocab_size())

    splits = {}
    for split_name, docs, shard_count in (("train", train, num_shards), ("validation", validation, 1)):
        records = []
        for shard_number, shard_docs in enumerate(np.array_split(np.arange(len(docs)), shard_count)):
            sentences = [s for d in shard_docs for s in docs[d]]
            encoded = tokenizer.encode_batch(sentences, add_special_tokens=False) if sentences else []
            lengths = np.array([len(e.ids) for e in encoded], dtype=np.int64)
            tokens = np.array([t for e in encoded for t in e.ids], dtype=dtype)
            sentence_offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
            per_doc = np.array([len(docs[d]) for d in shard_docs], dtype=np.int64)
            document_offsets = np.concatenate([[0], np.cumsum(per_doc)]).astype(np.int64)
            records.append(write_shard(path / split_name, f"shard-{shard_number:05d}", tokens,
                                       sentence_offsets, document_offsets))
        splits[split_name] = {"shards": records, **{k: sum(r[k] for r in records)
                                                    for k in ("documents", "sentences", "tokens")}}
    tokenizer_bytes = (tokenizer_dir / "tokenizer.json").read_bytes()
    write_manifest(path, {
        "tokenizer": {"kind": kind, "word_marker": WORD_MARKERS[kind], "vocab_size": tokenizer.get_vocab_size(),
                      "sha256": hashlib.sha256(tokenizer_bytes).hexdigest(),
                      "special_tokens": {name: i for i, name in enumerate(strings)},
                      "special_token_strings": strings},
        "token_dtype": str(np.dtype(dtype)),
        "splits": splits,
        "sources": [{"path": "pydoc_data.topics", "generated_by": "tests/helpers_data.py"}],
        "counts": {"documents": len(documents)},
        "settings": {"num_documents": num_documents, "seed": seed, "num_shards": num_shards},
    })
    return path
