"""The ids a model is pretrained on are the ids transformers gives the same raw text later (audit 5): control and
format characters that prepare's cleaning deletes, a decomposed accent, and a literal `[MASK]` or `<pad>` in the
corpus, which is text (as Google's create_pretraining_data read it), not a special token."""

import json

import numpy as np
import pytest

from bertrain.config import PrepareConfig, Recipe, SourceConfig, TokenizerConfig
from bertrain.data.format import open_prepared
from bertrain.data.prepare import prepare_corpus
from bertrain.data.sources.pydoc import pydoc_paragraphs
from tests.helpers import stored_documents

transformers = pytest.importorskip("transformers")

# One sentence a line, one document: each stored sentence is compared with the line it came from.
PROBES = ["A soft\xadhyphen and a zero\u200bwidth space sit inside these words",
          "The byte order mark\ufeff and a bell\x07 and a null\x00 character vanish here",
          "A decomposed cafe\u0301 and a composed café are the same word",
          "The model reads [MASK] and [SEP] and [PAD] and [CLS] as plain text",
          "Unigram vocabularies write <pad> and <unk> and [UNK] the same way",
          "Devanagari keeps its joiner in \u0915\u094d\u200d\u0937 and so does Persian \u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645"]


@pytest.fixture(scope="module", params=["wordpiece", "unigram"])
def prepared(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(request.param)
    lines = [" ".join(paragraph.split()) for paragraph in pydoc_paragraphs()[:300]]
    prose = "\n\n".join("\n".join(lines[i:i + 3]) for i in range(0, len(lines) - 2, 3))  # 3 sentences a document
    (root / "corpus.txt").write_text(prose + "\n\n" + "\n".join(PROBES) + "\n", encoding="utf-8")
    recipe = Recipe(prepare=PrepareConfig(sources=[SourceConfig(path=str(root / "corpus.txt"), text_layout="sentence_per_line")],
                                          num_shards=1, validation_fraction=0.0, workers=1),
                    tokenizer=TokenizerConfig(kind=request.param, vocab_size=800))
    prepare_corpus(recipe, root / "data")
    return root / "data"


def _probe_document(data_dir):
    documents = [doc for doc in stored_documents(data_dir) if len(doc) == len(PROBES)]
    assert len(documents) == 1
    return documents[0]


def test_stored_ids_are_transformers_ids_of_the_raw_text(prepared):
    hf = transformers.AutoTokenizer.from_pretrained(str(prepared / "tokenizer"))
    for raw, stored in zip(PROBES, _probe_document(prepared)):
        reference = hf(raw, add_special_tokens=False, split_special_tokens=True)["input_ids"]
        assert list(stored) == reference, raw
        assert hf.decode(reference).replace(" ", "")[:4].lower() == raw.replace(" ", "")[:4].lower()


def test_special_tokens_in_the_text_are_never_special_ids(prepared):
    specials = open_prepared(prepared).special_tokens
    tokens = np.concatenate([shard.tokens for shard in open_prepared(prepared).split("train").shards])
    for name in ("pad", "cls", "sep", "mask"):  # [UNK] may stand for an unknown character: counted apart
        assert not np.any(tokens == specials[name]), name
    document = _probe_document(prepared)
    assert specials["unk"] not in document[3] and specials["unk"] not in document[4]


def test_a_decomposed_accent_is_the_composed_word(prepared):
    hf = transformers.AutoTokenizer.from_pretrained(str(prepared / "tokenizer"))
    assert hf("cafe\u0301")["input_ids"] == hf("café")["input_ids"]


def test_the_exported_wrapper_names_the_accent_setting_the_data_was_tokenized_with(prepared):
    wrapper = json.loads((prepared / "tokenizer" / "tokenizer_config.json").read_text())
    manifest = json.loads((prepared / "manifest.json").read_text())
    if manifest["tokenizer"]["kind"] == "wordpiece":
        assert wrapper["strip_accents"] is False and wrapper["do_lower_case"] is True
    else:
        assert wrapper["keep_accents"] is True and wrapper["do_lower_case"] is True


def test_an_export_of_older_data_gets_the_accent_setting_and_the_named_classes_keep_accents(prepared, tmp_path):
    from bertrain.model.hf import write_tokenizer_files

    old = tmp_path / "old"  # a DATA_DIR tokenizer written before the wrapper kept the accent setting
    old.mkdir()
    for name in ("tokenizer.json", "special_tokens_map.json", "tokenizer_config.json"):
        (old / name).write_bytes((prepared / "tokenizer" / name).read_bytes())
    wrapper = json.loads((old / "tokenizer_config.json").read_text())
    for key in ("strip_accents", "keep_accents"):
        wrapper.pop(key, None)
    (old / "tokenizer_config.json").write_text(json.dumps(wrapper))
    export = tmp_path / "export"
    export.mkdir()
    write_tokenizer_files(old, export, max_positions=128)
    auto = transformers.AutoTokenizer.from_pretrained(str(export))
    unigram = "keep_accents" in json.loads((export / "tokenizer_config.json").read_text())
    named = (transformers.AlbertTokenizer if unigram else transformers.BertTokenizer).from_pretrained(str(export))
    for text in ("Café Ünïcödé naïve", "Привет, Ёжик", "नमस्ते दुनिया"):  # marks a lowercasing class deleted
        assert named(text)["input_ids"] == auto(text)["input_ids"], text


def test_a_wordpiece_export_has_googles_vocab_txt_which_gives_the_same_ids(prepared, tmp_path):
    from bertrain.model.hf import write_tokenizer_files
    from bertrain.tokenizer_file import load_tokenizer

    export = tmp_path / "export"
    export.mkdir()
    written = write_tokenizer_files(prepared / "tokenizer", export, max_positions=128)
    tokenizer = load_tokenizer(prepared / "tokenizer")
    if json.loads(tokenizer.to_str())["model"]["type"] != "WordPiece":
        assert "vocab.txt" not in written and not (export / "vocab.txt").exists()
        return
    lines = (export / "vocab.txt").read_text(encoding="utf-8").splitlines()
    assert "vocab.txt" in written and lines == [tokenizer.id_to_token(i) for i in range(tokenizer.get_vocab_size())]
    vocab_only = tmp_path / "vocab_only"  # what a tool that reads vocab.txt alone builds: transformers' BertTokenizer
    vocab_only.mkdir()
    (vocab_only / "vocab.txt").write_bytes((export / "vocab.txt").read_bytes())
    named = transformers.BertTokenizer.from_pretrained(str(vocab_only), do_lower_case=True, strip_accents=False)
    auto = transformers.AutoTokenizer.from_pretrained(str(export))
    for text in pydoc_paragraphs()[:50]:
        assert named(text)["input_ids"] == auto(text)["input_ids"]


def test_inspect_shows_unknown_tokens_where_they_stand(prepared, run_cli, tmp_path):
    corpus = tmp_path / "new.txt"  # characters the tokenizer never saw: [UNK] / <unk> in the shards
    corpus.write_text("".join(f"Document {i} has a snowman \u2603 here.\nAnd then \u6f22\u5b57 there.\n\n"
                              for i in range(20)), encoding="utf-8")
    recipe = Recipe(prepare=PrepareConfig(sources=[SourceConfig(path=str(corpus), text_layout="sentence_per_line")],
                                          num_shards=1, validation_fraction=0.0, workers=1),
                    tokenizer=TokenizerConfig(path=str(prepared / "tokenizer")))
    prepare_corpus(recipe, tmp_path / "data")
    specials = open_prepared(tmp_path / "data").special_tokens
    assert all(specials["unk"] in sentence for doc in stored_documents(tmp_path / "data") for sentence in doc)
    code, out, err = run_cli("inspect", str(tmp_path / "data"), "--documents", "2")
    shown = out.count("[UNK]") + out.count("<unk>")
    assert code == 0 and shown >= 4, out + err  # decoded with special tokens skipped, they were silent gaps
