"""The special tokens, word markers and shipped model of both tokenizer kinds (here only). Both kinds put the
special tokens at the same ids, so code agrees on them without reading a tokenizer."""

SPECIAL_TOKENS = {
    "wordpiece": {"pad": "[PAD]", "unk": "[UNK]", "cls": "[CLS]", "sep": "[SEP]", "mask": "[MASK]"},
    "unigram": {"pad": "<pad>", "unk": "<unk>", "cls": "[CLS]", "sep": "[SEP]", "mask": "[MASK]"},
}
SPECIAL_IDS = {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "mask": 4}
SPECIAL_TOKEN_NAMES = tuple(SPECIAL_IDS)
# What marks a word boundary in each kind's pieces: WordPiece marks continuations, Unigram word starts.
WORD_MARKERS = {"wordpiece": "##", "unigram": "▁"}
# The model type each kind is shipped with: the shipped configs tiny_<model> and demo_<model> mask whole words or
# n-grams by that kind's word marker.
MODEL_OF_KIND = {"wordpiece": "bert", "unigram": "albert"}
