"""Fill-mask: `fill_mask` returns what transformers' pipeline returns; `fill_mask_words` ranks only tokens that
can stand for a whole word (the demo)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from tokenizers import Encoding, Tokenizer

from bertrain import rundir
from bertrain.errors import BertrainError, DataError, UsageError
from bertrain.model import PreTrainingModel
from bertrain.model.from_checkpoint import model_from_checkpoint
from bertrain.model.hf import import_hf
from bertrain.special_tokens import SPECIAL_TOKENS, WORD_MARKERS
from bertrain.tokenizer_file import load_tokenizer


def load_for_inference(model_dir: str | Path, skipped: list[tuple[Path, str]] | None = None
                       ) -> tuple[PreTrainingModel, Path]:
    """(model in eval mode, tokenizer dir) from an exported dir, a checkpoint dir or a RUN_DIR."""
    model_dir = Path(model_dir)
    if (model_dir / "config.json").is_file():
        model, _ = import_hf(model_dir)
        tokenizer = rundir.find_tokenizer_dir(model_dir)
    else:
        model, _, checkpoint = model_from_checkpoint(model_dir, skipped)
        tokenizer = rundir.find_tokenizer_dir(checkpoint)
    if tokenizer is None:
        raise DataError(f"No tokenizer.json found for {model_dir} (looked in the dir, its tokenizer/ and "
                        "RUN_DIR/tokenizer).")
    return model, tokenizer


def _tokenizer_setting(tokenizer_dir: Path, key: str, default: Any) -> Any:
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        path = tokenizer_dir / name
        if path.is_file():
            value = json.loads(path.read_text(encoding="utf-8")).get(key)
            if value is not None:
                return value["content"] if isinstance(value, dict) else value
    return default


def _mask_id(tokenizer: Tokenizer, tokenizer_dir: Path) -> tuple[str, int]:
    """The mask token the tokenizer's config names (default [MASK]) and its id."""
    mask_token = _tokenizer_setting(tokenizer_dir, "mask_token", "[MASK]")
    mask_id = tokenizer.token_to_id(mask_token)
    if mask_id is None:
        raise DataError(f"The tokenizer in {tokenizer_dir} has no mask token {mask_token!r}.")
    return mask_token, mask_id


@torch.no_grad()
def _mlm_logits(model, encoding: Encoding) -> torch.Tensor:
    """The model's MLM logits [tokens, vocabulary] for one encoded text."""
    if len(encoding.ids) > model.config.max_position_embeddings:
        raise UsageError(f"The text is {len(encoding.ids)} tokens long; the model takes at most "
                         f"{model.config.max_position_embeddings}.")
    model.eval()
    output = model(torch.tensor([encoding.ids]), torch.tensor([encoding.attention_mask]),
                   torch.tensor([encoding.type_ids]))
    return output.mlm_logits[0]


def _clean_up(text: str) -> str:
    # transformers' clean_up_tokenization, applied when the tokenizer config asks for it.
    for before, after in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
                          (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):
        text = text.replace(before, after)
    return text


def fill_mask(model, tokenizer_dir: str | Path, text: str, top_k: int = 5) -> list:
    """Top-k predictions for the mask token(s) in `text`, as transformers' fill-mask pipeline returns them."""
    tokenizer_dir = Path(tokenizer_dir)
    tokenizer = load_tokenizer(tokenizer_dir)
    mask_token, mask_id = _mask_id(tokenizer, tokenizer_dir)
    pad_token = _tokenizer_setting(tokenizer_dir, "pad_token", None)
    clean = bool(_tokenizer_setting(tokenizer_dir, "clean_up_tokenization_spaces", False))
    pad_id = tokenizer.token_to_id(pad_token) if pad_token else None
    encoding = tokenizer.encode(text)
    ids = torch.tensor(encoding.ids)
    masked = (ids == mask_id).nonzero().squeeze(-1)
    if masked.numel() == 0:
        raise UsageError(f"No {mask_token} in the text: write the word to predict as {mask_token}.")
    probs = _mlm_logits(model, encoding)[masked].float().softmax(dim=-1)  # [masks, V]
    values, predictions = probs.topk(min(top_k, probs.shape[-1]))
    single = masked.numel() == 1
    results = []
    for position, row_values, row_predictions in zip(masked.tolist(), values.tolist(), predictions.tolist()):
        row = []
        for score, token in zip(row_values, row_predictions):
            filled = ids.clone()
            filled[position] = token
            if pad_id is not None:
                filled = filled[filled != pad_id]
            sequence = tokenizer.decode(filled.tolist(), skip_special_tokens=single)
            token_str = tokenizer.decode([token], skip_special_tokens=False)
            if clean:
                sequence, token_str = _clean_up(sequence), _clean_up(token_str)
            row.append({"score": score, "token": token, "token_str": token_str, "sequence": sequence})
        results.append(row)
    return results[0] if single else results


def fill_mask_words(model_dir: Path, sentences: tuple[str, ...], top_k: int = 5) -> list[dict[str, Any]]:
    """Top-k whole-word predictions for the single mask of each sentence, from an exported directory (read
    back through bertrain's importer), a checkpoint dir or a RUN_DIR: [{sentence, predictions: [{token, score}]}]."""
    model, tokenizer_dir = load_for_inference(model_dir)
    tokenizer = load_tokenizer(tokenizer_dir)
    mask_token, mask_id = _mask_id(tokenizer, tokenizer_dir)
    vocabulary = [tokenizer.id_to_token(i) or "" for i in range(model.config.vocab_size)]
    specials = {token for kind in SPECIAL_TOKENS.values() for token in kind.values()}
    special_ids = {i for i, token in enumerate(vocabulary) if token in specials}
    is_word = torch.tensor(whole_word_tokens(vocabulary, special_ids))
    results = []
    for sentence in sentences:
        encoding = tokenizer.encode(sentence)
        positions = [i for i, token_id in enumerate(encoding.ids) if token_id == mask_id]
        if len(positions) != 1:
            raise BertrainError(f"Fill-mask: '{sentence}' has {len(positions)} mask tokens after tokenizing; "
                                f"the exported tokenizer does not keep {mask_token} whole.")
        # The mask stands for a word: rank only tokens that can be one (not "▁" alone, "##ing", "s").
        top = _mlm_logits(model, encoding)[positions[0]].softmax(-1).masked_fill(~is_word, 0.0).topk(top_k)
        words = [_clean_piece(vocabulary[int(i)]) for i in top.indices]
        results.append({"sentence": sentence, "predictions": [
            {"token": word, "score": round(float(p), 4)} for word, p in zip(words, top.values)]})
    return results


def whole_word_tokens(vocabulary: list[str], special_ids: set[int]) -> list[bool]:
    """Which tokens can stand for a whole word: not special, not a WordPiece "##" continuation, and at
    least two characters without the Unigram word marker (so not "▁" alone, "s", "." or '"')."""
    continuation, word_start = WORD_MARKERS["wordpiece"], WORD_MARKERS["unigram"]
    return [i not in special_ids and not token.startswith(continuation) and len(token.removeprefix(word_start)) > 1
            for i, token in enumerate(vocabulary)]


def _clean_piece(piece: str) -> str:
    return piece.removeprefix(WORD_MARKERS["unigram"]).removeprefix(WORD_MARKERS["wordpiece"]) or piece
