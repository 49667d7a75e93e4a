"""Train and load WordPiece (BERT) and Unigram (ALBERT) tokenizers: same special-token ids, "[CLS] A [SEP] B
[SEP]" post-processing, saved with the wrapper files transformers.AutoTokenizer needs."""

from __future__ import annotations

import json
import time
import unicodedata
from pathlib import Path
from typing import Any, Iterable, Optional

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from bertrain.config import TokenizerConfig
from bertrain.files import file_sha256, naming, undone_on_failure, write_dir_atomic
from bertrain.errors import ConfigError, DataError
from bertrain.special_tokens import SPECIAL_IDS, SPECIAL_TOKENS, WORD_MARKERS
from bertrain.tokenizer_file import normalizer_settings, special_tokens_as_text

# How Unigram text is cut before the model sees it: words, single digits, punctuation runs.
UNIGRAM_SPLIT = r" ?[^\s\p{P}\p{S}\p{N}]+| ?\p{N}| ?[\p{P}\p{S}]+|\s+"
UNIGRAM_SLACK = 1.5
# The Unigram trainer seeds its pieces only with substrings of at least two distinct word types, so a frequent word
# that is part of no other word ("from", "shalt" in the King James Bible) never became a piece: "▁ from", "▁shal t"
# (sentencepiece's trainer does the same). Each word seen SEED_WORD_MIN_COUNT times or more is also given to the
# trainer once as "word" + SEED_MARK, a second type that makes "▁word" a seed; pieces with the mark are dropped.
SEED_WORD_MIN_COUNT = 10
SEED_MARK = "\ufdd0"  # a Unicode noncharacter: in no text, a letter to the pre-tokenizers
# EM rounds between two prunings (the trainer's default, 2, left whole words seeded with small scores no time to win
# over "▁" + word: benchmarks/unigram_vs_sentencepiece.py).
UNIGRAM_EM_ROUNDS = 3
CONTINUATION = WORD_MARKERS["wordpiece"]   # "##": WordPiece marks pieces that continue a word
SPACE = WORD_MARKERS["unigram"]            # "▁": Unigram marks pieces that start a word (a space before)
MODEL_INPUT_NAMES = ["input_ids", "token_type_ids", "attention_mask"]
# WordPiece turns a word longer than this into one [UNK]; runs without spaces (Thai, Lao, Khmer, Burmese write
# whole phrases unspaced) are cut into pieces of this many characters first, which WordPiece then splits.
MAX_WORDPIECE_CHARS = 100
MIN_VOCAB_SIZE = 16  # the special tokens and a few pieces; a useful vocabulary is hundreds or more


def _strip_accents(config: TokenizerConfig) -> bool:
    """Only when asked: lowercasing alone keeps every mark (BERT's null-follows-lowercase deleted them)."""
    return bool(config.strip_accents)


def _without_control_characters() -> Any:
    """Every control, format, private-use and unassigned character deleted (\\p{C}, as BERT's normalizer does), so
    that what prepare's cleaning removes from the corpus (soft hyphen, zero width space, BOM, C0/C1) is removed from
    text at fine-tuning and inference too; so are RLM marks and the tag characters of subdivision flags. ZWNJ/ZWJ
    stay (Persian and Indic spelling, emoji), as do tab and newline (whitespace), and SEED_MARK (a noncharacter, so
    in no text) which Unigram training needs."""
    return normalizers.Replace(Regex(r"[\p{C}\x{FFFD}&&[^\t\n\r\x{200C}\x{200D}\x{FDD0}]]"), "")


def _wordpiece_normalizer(config: TokenizerConfig) -> Any:
    """BERT's normalizer, whose cleaning also deleted ZWNJ/ZWJ: here the other control and format characters are
    removed first, whitespace made spaces, as its cleaning did, and text composed (NFC: a decomposed "é" is "é")."""
    return normalizers.Sequence([
        _without_control_characters(),
        normalizers.Replace(Regex(r"\s"), " "),
        normalizers.NFC(),
        normalizers.BertNormalizer(clean_text=False, handle_chinese_chars=True, strip_accents=_strip_accents(config),
                                   lowercase=config.lowercase)])


def build_untrained(config: TokenizerConfig, alphabet: Iterable[str] = (),
                    trainer_size: Optional[int] = None) -> tuple[Any, Any]:
    """(Tokenizer, trainer) for `config.kind`; `alphabet` fixes WordPiece's "##x" ids up front."""
    specials, unk = list(SPECIAL_TOKENS[config.kind].values()), SPECIAL_TOKENS[config.kind]["unk"]
    if config.kind == "wordpiece":
        tokenizer = Tokenizer(models.WordPiece(unk_token=unk, max_input_chars_per_word=MAX_WORDPIECE_CHARS))
        tokenizer.normalizer = _wordpiece_normalizer(config)
        # The trainer numbers continuation characters ("##e") in hash-map order, which changes the
        # tie-breaking of merges from run to run. Listing them (sorted) as extra special tokens fixes
        # their ids; `canonical` makes them ordinary vocabulary again after training.
        tokenizer.pre_tokenizer = wordpiece_pre_tokenizer()
        normalized = set()
        for char in alphabet:
            normalized.update(tokenizer.normalizer.normalize_str(char))
        continuing = [char for char in sorted(normalized)  # punctuation is never inside a word
                      if len(tokenizer.pre_tokenizer.pre_tokenize_str("a" + char)) == 1]
        specials += [f"{CONTINUATION}{char}" for char in continuing]
        tokenizer.decoder = decoders.WordPiece(prefix=CONTINUATION)
        trainer = trainers.WordPieceTrainer(
            vocab_size=trainer_size or config.vocab_size, min_frequency=config.min_frequency,
            special_tokens=specials, continuing_subword_prefix=CONTINUATION, show_progress=False)
        return tokenizer, trainer
    tokenizer = Tokenizer(models.Unigram())
    steps = [_without_control_characters(), normalizers.Replace("``", '"'), normalizers.Replace("''", '"'),
             normalizers.NFKC()]
    if config.lowercase:
        steps.append(normalizers.Lowercase())
    if _strip_accents(config):
        steps += [normalizers.NFKD(), normalizers.StripAccents(), normalizers.NFC()]
    steps.append(normalizers.Replace(Regex(r"\s+"), " "))  # tabs and newlines too: "▁" marks spaces only
    tokenizer.normalizer = normalizers.Sequence(steps)
    # Trained on whitespace-separated words, encoded with punctuation split off (see unigram_pre_tokenizer):
    # the Rust trainer seeds its pieces with substrings found in at least two distinct word types,
    # so with punctuation split off first, frequent words that are no other word's substring
    # ("▁this", "▁and", "▁are") never became pieces. Words carrying punctuation ("▁this,", "▁this.")
    # supply the second type; the pieces that mix words and punctuation are dropped after training
    # (`keep_usable_pieces`), which is why the trainer is asked for more (UNIGRAM_SLACK, then more if short).
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPACE, prepend_scheme="always", split=True)
    tokenizer.decoder = decoders.Metaspace(replacement=SPACE, prepend_scheme="first")
    trainer = trainers.UnigramTrainer(
        vocab_size=trainer_size or int(config.vocab_size * UNIGRAM_SLACK), special_tokens=specials,
        unk_token=unk, max_piece_length=16, n_sub_iterations=UNIGRAM_EM_ROUNDS, show_progress=False)
    return tokenizer, trainer


def wordpiece_pre_tokenizer() -> Any:
    """BERT's split at spaces and punctuation, then runs longer than MAX_WORDPIECE_CHARS cut into pieces of that
    length (a shorter rest is its own piece), so no unspaced run becomes one [UNK]."""
    return pre_tokenizers.Sequence([
        pre_tokenizers.BertPreTokenizer(),
        pre_tokenizers.Split(Regex(f".{{{MAX_WORDPIECE_CHARS}}}"), behavior="isolated")])


def unigram_pre_tokenizer() -> Any:
    """Words, single digits and punctuation runs, each keeping the space before it, which Metaspace
    marks as "▁" (as SentencePiece's '▁"' or '▁('), so there is no bare "▁" before every punctuation mark."""
    return pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(UNIGRAM_SPLIT), behavior="isolated"),
        pre_tokenizers.Metaspace(replacement=SPACE, prepend_scheme="first", split=False)])


def keep_usable_pieces(pieces: list[list], size: int) -> list[list]:
    """All single characters, then the best-scoring pieces the encoding pre-tokenizer can produce
    (no "▁" inside, letters and punctuation not mixed, one digit at most), `size` pieces in all."""
    split = pre_tokenizers.Split(Regex(UNIGRAM_SPLIT), behavior="isolated")
    pieces = [item for item in pieces if SEED_MARK not in item[0]]
    chars = [item for item in pieces if len(item[0]) == 1]
    usable = [item for item in pieces
              if len(item[0]) > 1 and len(split.pre_tokenize_str(item[0].replace(SPACE, " "))) == 1]
    usable.sort(key=lambda item: (-item[1], item[0]))
    return chars + usable[:max(0, size - len(chars))]


def add_post_processor(tokenizer: Any, cls_token: str, sep_token: str) -> None:
    """BERT's template: [CLS] A [SEP] (B [SEP]) with token types 0 for A, 1 for B."""
    cls_id, sep_id = tokenizer.token_to_id(cls_token), tokenizer.token_to_id(sep_token)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{cls_token}:0 $A:0 {sep_token}:0", pair=f"{cls_token}:0 $A:0 {sep_token}:0 $B:1 {sep_token}:1",
        special_tokens=[(cls_token, cls_id), (sep_token, sep_id)])


def _spool(texts: Iterable[str], max_bytes: int, path: Path) -> tuple[int, set[str]]:
    """Write the texts to a file, up to the one that reaches max_bytes characters; return (chars, alphabet)."""
    chars = 0
    alphabet: set[str] = set()
    with open(path, "w", encoding="utf-8") as handle:
        for text in texts:
            handle.write(text if text.endswith("\n") else text + "\n")
            chars += len(text)
            alphabet.update(text)
            if not unicodedata.is_normalized("NFC", text):  # what the normalizer composes ("e" + U+0301 is "é")
                alphabet.update(unicodedata.normalize("NFC", text))  # is alphabet too: its "##é" id is fixed
            if chars >= max_bytes:
                break
    return chars, alphabet


def canonical(tokenizer: Any, kind: str, vocab_size: int) -> Any:
    """The trained tokenizer made deterministic: the Rust trainers iterate hash maps with random seeds, so
    WordPiece's "##x" placeholders become vocabulary again and Unigram's scores are rounded, tied offsets
    reassigned in sorted order and pieces sorted (only the `vocab_size` usable pieces are kept)."""
    data = json.loads(tokenizer.to_str())
    specials = set(SPECIAL_TOKENS[kind].values())
    data["added_tokens"] = [token for token in data["added_tokens"] if token["content"] in specials]
    for token in data["added_tokens"]:
        token["lstrip"] = _absorbs_space_before(kind, token["content"])
    if kind == "unigram":
        vocab = data["model"]["vocab"]
        head = [[piece, 0.0] for piece, _ in vocab[:len(specials)]]
        rest = [[piece, round(score, 6)] for piece, score in vocab[len(specials):]]
        rest = keep_usable_pieces(rest, vocab_size - len(specials))
        _canonical_penalty_chars(rest)
        rest.sort(key=lambda item: (-item[1], item[0]))
        data["model"]["vocab"] = head + rest
        data["model"]["unk_id"] = SPECIAL_IDS["unk"]
    return Tokenizer.from_str(json.dumps(data))


def _absorbs_space_before(kind: str, token: str) -> bool:
    """Unigram's [MASK] takes the space before it (as ALBERT's tokenizer does): "the [MASK] is" must
    encode as ▁the [MASK] ▁is, like a masked training word, not ▁the ▁ [MASK] ▁is."""
    return kind == "unigram" and token == SPECIAL_TOKENS["unigram"]["mask"]


def _canonical_penalty_chars(pieces: list[list]) -> None:
    """Unigram: required characters missing from the trained model get scores near min_score,
    spaced by 1e-4 in hash-set order; give that run of scores to the characters in sorted order."""
    chars = sorted((item for item in pieces if len(item[0]) == 1), key=lambda item: item[1])
    run = chars[:1]
    for item in chars[1:]:
        if item[1] - run[-1][1] > 1e-4 + 2e-6:
            break
        run.append(item)
    if len(run) > 1:
        scores = [item[1] for item in run]
        for item, score in zip(sorted(run, key=lambda item: item[0]), scores):
            item[1] = score


def _check_specials(tokenizer: Any, kind: str) -> dict[str, int]:
    ids = {name: tokenizer.token_to_id(token) for name, token in SPECIAL_TOKENS[kind].items()}
    if ids != SPECIAL_IDS:
        raise DataError(f"Trained {kind} tokenizer has special-token ids {ids}, expected {SPECIAL_IDS} (a bug).")
    return ids


def _write_seed_words(config: TokenizerConfig, spool: Path) -> Path:
    """Unigram: the spool's words seen SEED_WORD_MIN_COUNT times or more as they are written (the most frequent,
    counted in Rust by a word-level trainer: raw, as normalizing costs more than counting), normalized, one per line
    with SEED_MARK after it, in a file beside the spool."""
    counter = Tokenizer(models.WordLevel(unk_token=SPECIAL_TOKENS["unigram"]["unk"]))
    counter.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    counter.train([str(spool)], trainers.WordLevelTrainer(
        vocab_size=2 * config.vocab_size, min_frequency=SEED_WORD_MIN_COUNT, show_progress=False))
    normalizer = build_untrained(config)[0].normalizer
    words = {normalizer.normalize_str(word) for word in counter.get_vocab() if word.isalpha()}
    path = spool.with_name(spool.name + ".seeds")
    path.write_text("".join(word + SEED_MARK + "\n" for word in sorted(words) if word.isalpha()), encoding="utf-8")
    return path


def _train_on_spool(config: TokenizerConfig, alphabet: set[str], spool: Path, chars: int) -> Any:
    """Train and canonicalize; Unigram is trained once more, with more pieces, if too few were usable."""
    trainer_size = int(config.vocab_size * UNIGRAM_SLACK) if config.kind == "unigram" else config.vocab_size
    files = [str(spool)] + ([str(_write_seed_words(config, spool))] if config.kind == "unigram" else [])
    for _ in range(2):
        tokenizer, trainer = build_untrained(config, alphabet, trainer_size)
        try:
            tokenizer.train(files, trainer=trainer)
        except Exception as error:  # the Rust trainers raise plain exceptions on degenerate corpora
            raise DataError(
                f"Training the {config.kind} tokenizer (vocab_size {config.vocab_size}) failed on "
                f"{chars:,} characters of text: {error}. The corpus may be too small for this "
                f"vocabulary: lower tokenizer.vocab_size (e.g. --vocab-size 1000) or add text.") from None
        trained = tokenizer.get_vocab_size()
        if config.kind == "unigram":
            tokenizer.pre_tokenizer = unigram_pre_tokenizer()
        tokenizer = canonical(tokenizer, config.kind, config.vocab_size)
        kept = tokenizer.get_vocab_size()
        if config.kind != "unigram" or kept >= 0.99 * config.vocab_size or trained < trainer_size:
            break  # enough pieces, or the corpus has no more
        trainer_size = int(trainer_size * config.vocab_size / kept * 1.1)
    return tokenizer


def require_vocab_size(config: TokenizerConfig) -> None:
    """A ConfigError for a vocabulary too small to train: checked before any text is read."""
    if config.vocab_size < MIN_VOCAB_SIZE:
        raise ConfigError(f"tokenizer.vocab_size {config.vocab_size} is too small (at least {MIN_VOCAB_SIZE}); "
                          f"use a few hundred or more, e.g. --vocab-size 8000.")


def train_tokenizer(texts: Iterable[str], tokenizer_config: TokenizerConfig, out_dir: str | Path,
                    validation_texts: Optional[Iterable[str]] = None) -> dict[str, Any]:
    """Train a tokenizer on at most `max_bytes` characters of texts, save it to out_dir; return stats."""
    require_vocab_size(tokenizer_config)
    out = Path(out_dir)
    with undone_on_failure(out, ()):  # a failure (a full disk) leaves no OUT this call made
        return _train_and_save(texts, tokenizer_config, out, validation_texts)


def _train_and_save(texts: Iterable[str], config: TokenizerConfig, out: Path,
                    validation_texts: Optional[Iterable[str]]) -> dict[str, Any]:
    spool = out / "training-text.tmp"
    start = time.perf_counter()
    try:
        with naming(out):  # a write() on a full disk names no file; the user gave OUT, not the spool
            # Spooling to a file lets the (parallel) file trainer run and gives the alphabet up front.
            chars, alphabet = _spool(texts, config.max_bytes, spool)
        if chars == 0:
            raise DataError("No text to train the tokenizer on: every document was empty or skipped.")
        tokenizer = _train_on_spool(config, alphabet, spool, chars)
    finally:
        spool.unlink(missing_ok=True)
        spool.with_name(spool.name + ".seeds").unlink(missing_ok=True)
    seconds = time.perf_counter() - start
    _check_specials(tokenizer, config.kind)
    specials = SPECIAL_TOKENS[config.kind]
    add_post_processor(tokenizer, specials["cls"], specials["sep"])
    save_tokenizer(tokenizer, out, config.kind)
    stats = {
        "kind": config.kind,
        "vocab_size": tokenizer.get_vocab_size(),
        "vocab_size_requested": config.vocab_size,
        "training_chars": chars,
        "training_seconds": round(seconds, 2),
        "sha256": file_sha256(out / "tokenizer.json"),
    }
    if validation_texts is not None:
        stats.update(measure(tokenizer, validation_texts))
    return stats


def measure(tokenizer: Any, texts: Iterable[str], max_chars: int = 10_000_000) -> dict[str, Any]:
    """Unknown-token rate, tokens per whitespace-separated word and per character (for text without spaces)."""
    unk = tokenizer.token_to_id(SPECIAL_TOKENS["wordpiece"]["unk"])
    if unk is None:
        unk = tokenizer.token_to_id(SPECIAL_TOKENS["unigram"]["unk"])
    tokens = unknown = words = chars = 0
    batch: list[str] = []

    def flush() -> None:
        nonlocal tokens, unknown
        with special_tokens_as_text(tokenizer):  # as prepare's shards encode the corpus
            encodings = tokenizer.encode_batch_fast(batch, add_special_tokens=False)
        for encoding in encodings:
            tokens += len(encoding.ids)
            unknown += encoding.ids.count(unk)

    for text in texts:
        batch.append(text)
        words += len(text.split())
        chars += len(text)
        if len(batch) == 4096:
            flush()
            batch = []
        if chars >= max_chars:
            break
    if batch:
        flush()
    return {"unk_rate": unknown / tokens if tokens else 0.0, "tokens_per_word": tokens / words if words else 0.0,
            "tokens_per_char": tokens / chars if chars else 0.0, "measured_words": words}


def save_tokenizer(tokenizer: Any, out_dir: str | Path, kind: str, model_max_length: int = 512) -> Path:
    """Write tokenizer.json, tokenizer_config.json and special_tokens_map.json (atomically, json last)."""
    out = Path(out_dir)
    specials = special_token_strings(tokenizer, kind)
    tokens_map = {f"{name}_token": token for name, token in specials.items()}
    added = {}
    for name, token in specials.items():
        token_id = tokenizer.token_to_id(token)
        added[str(token_id)] = {"content": token, "lstrip": _absorbs_space_before(kind, token), "normalized": False,
                                "rstrip": False, "single_word": False, "special": True}
    wrapper = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_input_names": MODEL_INPUT_NAMES,
        "model_max_length": model_max_length,
        "padding_side": "right",
        "truncation_side": "right",
        "clean_up_tokenization_spaces": False,
        **normalizer_settings(tokenizer),
        "added_tokens_decoder": added,
        **tokens_map,
    }

    def write(directory: Path) -> None:  # all three aside first: a full disk leaves no half set, new or old
        for name, save in (("special_tokens_map.json", lambda path: path.write_text(json.dumps(tokens_map, indent=2))),
                           ("tokenizer_config.json", lambda path: path.write_text(json.dumps(wrapper, indent=2))),
                           ("tokenizer.json", lambda path: tokenizer.save(str(path)))):
            with naming(directory / name):  # write() names no file, tokenizers says the errno in words only
                save(directory / name)

    write_dir_atomic(out, write)
    return out


def special_token_strings(tokenizer: Any, kind: str) -> dict[str, str]:
    """The special-token strings of a tokenizer of this kind that exist in its vocabulary."""
    out = {}
    for name in SPECIAL_IDS:
        for candidate in (SPECIAL_TOKENS[kind][name], SPECIAL_TOKENS["wordpiece"][name],
                          SPECIAL_TOKENS["unigram"][name]):
            if tokenizer.token_to_id(candidate) is not None:
                out[name] = candidate
                break
    return out


def tokenizer_kind(tokenizer: Any) -> str:
    """'wordpiece' or 'unigram' from the tokenizer's model; other models are refused."""
    model = json.loads(tokenizer.to_str())["model"]["type"]
    kinds = {"WordPiece": "wordpiece", "Unigram": "unigram"}
    if model not in kinds:
        raise DataError(f"The tokenizer's model is {model}; bertrain supports WordPiece and Unigram "
                        f"(whole-word masking needs their '##' / '▁' word marks).")
    return kinds[model]


def tokenizer_facts(tokenizer: Any, kind: str, sha256: str) -> dict[str, Any]:
    """The manifest's `tokenizer` record."""
    strings = special_token_strings(tokenizer, kind)
    missing = [name for name in SPECIAL_IDS if name not in strings]
    if missing:
        raise DataError(f"The tokenizer has no {', '.join(missing)} token (looked for "
                        f"{', '.join(SPECIAL_TOKENS[kind][m] for m in missing)}).")
    return {
        "kind": kind,
        "word_marker": WORD_MARKERS[kind],
        "vocab_size": tokenizer.get_vocab_size(),
        "sha256": sha256,
        "special_tokens": {name: tokenizer.token_to_id(token) for name, token in strings.items()},
        "special_token_strings": strings,
    }
