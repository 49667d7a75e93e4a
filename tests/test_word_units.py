"""Word units beyond spaces (issue 22): segmenter words in Chinese and Japanese documents, stored by prepare and
used by whole-word and n-gram masking; WordPiece on long unspaced runs; figures per character."""

from __future__ import annotations

import importlib.util
import json
import sys

import numpy as np
import pytest

from bertrain.config import DataConfig, PrepareConfig, Recipe, SourceConfig, TokenizerConfig
from bertrain.data.format import fingerprint, open_prepared
from bertrain.data.loader import MicroBatchDataset, epoch_plan, masking_settings
from bertrain.data.prepare import prepare_corpus
from bertrain.data.prepare.report import token_rate_row
from bertrain.data.tokenizer import train_tokenizer
from bertrain.data.word_units import WordSegmenter, document_language, segmented_word_starts
from bertrain.errors import DataError
from bertrain.tokenizer_file import load_tokenizer
from tests.helpers import make_prepared_dir

needs_zh = pytest.mark.skipif(not (importlib.util.find_spec("rjieba") and importlib.util.find_spec("opencc")),
                              reason="rjieba/opencc not installed (pip install 'bertrain[zh]')")
needs_ja = pytest.mark.skipif(not (importlib.util.find_spec("fugashi") and importlib.util.find_spec("unidic_lite")),
                              reason="fugashi/unidic-lite not installed (pip install 'bertrain[ja]')")

# Hand-segmented sentences: the words a reader of the language marks (PKU / UniDic short-unit conventions).
CHINESE = {"我来到北京清华大学。": ["我", "来到", "北京", "清华大学", "。"],
           "小明硕士毕业于中国科学院计算所。": ["小明", "硕士", "毕业", "于", "中国科学院", "计算所", "。"],
           "我來到北京清華大學。": ["我", "來到", "北京", "清華大學", "。"]}    # traditional spelling
JAPANESE = {"吾輩は猫である。": ["吾輩", "は", "猫", "で", "ある", "。"],
            "ビールを飲みました。": ["ビール", "を", "飲み", "まし", "た", "。"],
            "東京へ行きます。": ["東京", "へ", "行き", "ます", "。"],
            "私は学生です。": ["私", "は", "学生", "です", "。"]}


def test_documents_are_segmented_by_script():
    assert document_language("The weather is fine today. We walk.", "auto") is None
    assert document_language("我来到北京清华大学。今天很好。", "auto") == "zh"
    assert document_language("吾輩は猫である。名前はまだ無い。", "auto") == "ja"
    assert document_language("東京大学", "auto") == "zh"             # kanji only: no kana, read as Chinese
    # An English text naming a Chinese place stays spaced text; `none` and a forced language win.
    assert document_language("We flew to Beijing (北京) on Monday and stayed a week there.", "auto") is None
    assert document_language("我来到北京清华大学。", "none") is None
    assert document_language("Plain English.", "ja") == "ja"


def reference_word_starts(offsets, spans, length) -> list[bool]:
    """The rule of segmented_word_starts for one sentence, token by token (an independent reference)."""
    in_word, begins = [False] * (length + 1), [False] * (length + 1)
    for start, end in spans:
        for char in range(start, end):
            in_word[char] = True
        begins[start] = True
    flags, seen = [], 0
    for start, end in offsets:
        new = range(max(start, seen), end)
        first = next((char for char in new if in_word[char]), None)
        flags.append(False if not new else None if first is None else begins[first])
        seen = max(seen, end)
    starts = []
    for index, flag in enumerate(flags):
        after_space = index > 0 and flags[index - 1] is None
        if flag is None:
            flag = next((later for later in flags[index + 1:] if later is not None), True)
        starts.append(index == 0 or (bool(flag) and not after_space))
    return starts


def test_token_word_starts_follow_the_segmenter_words_by_character_offsets():
    # " 我用 Python编程" as a Unigram tokenizer cuts it: ▁我 | 用 | ▁ | P | y | thon | 编 | 程
    sentence = " 我用 Python编程"
    offsets = [(0, 2), (2, 3), (3, 4), (4, 5), (5, 6), (6, 10), (10, 11), (11, 12)]
    words = [(1, 2), (2, 3), (4, 10), (10, 12)]                    # 我 | 用 | Python | 编程
    expected = [True, True, True, False, False, False, True, False]
    # The bare "▁" belongs to the word after it; "y", "thon" continue Python; 程 continues 编程.
    assert reference_word_starts(offsets, words, len(sentence)) == expected
    # A token across a word end joins the words it touches: the next token continues them; a prepended "▁"
    # mapped to the first character (as Metaspace does) makes the token for that character a continuation.
    across = ([(0, 3), (3, 4), (4, 5)], [(0, 2), (2, 4), (4, 5)], 5)
    prepended = ([(0, 1), (0, 1), (1, 2)], [(0, 1), (1, 2)], 2)
    assert reference_word_starts(*across) == [True, False, True]
    assert reference_word_starts(*prepended) == [True, False, True]
    cases = [(offsets, words, len(sentence)), across, prepended]
    batch = segmented_word_starts(*map(list, zip(*cases)))
    assert batch.tolist() == expected + [True, False, True] + [True, False, True]


def test_the_vectorized_word_starts_agree_with_the_reference_on_random_sentences():
    rng = np.random.default_rng(0)
    cases = []
    for _ in range(300):
        length = int(rng.integers(1, 30))
        cuts = np.sort(rng.choice(np.arange(1, length), size=min(length - 1, int(rng.integers(0, 10))), replace=False))
        bounds = [0, *cuts.tolist(), length]
        spans = [(a, b) for a, b in zip(bounds[:-1], bounds[1:]) if rng.random() < 0.8]   # the rest: spaces
        offsets, position = [], 0
        while position < length:                        # tokens: empty, overlapping, across word ends
            start = max(0, position - int(rng.random() < 0.1))
            end = min(length, start + int(rng.integers(0, 4)))
            offsets.append((start, end))
            position = max(position, end) if end > start else position + (rng.random() < 0.5)
        cases.append((offsets, spans, length))
    batch = segmented_word_starts(*map(list, zip(*cases)))
    assert batch.tolist() == [flag for case in cases for flag in reference_word_starts(*case)]


@needs_zh
def test_chinese_words_simplified_and_traditional():
    segmenter = WordSegmenter()
    for sentence, words in CHINESE.items():
        assert [sentence[a:b] for a, b in segmenter.spans("zh", sentence)] == words


@needs_ja
def test_japanese_words():
    segmenter = WordSegmenter()
    for sentence, words in JAPANESE.items():
        assert [sentence[a:b] for a, b in segmenter.spans("ja", sentence)] == words


def test_a_missing_segmenter_names_the_extra_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "rjieba", None)               # import rjieba now raises ImportError
    with pytest.raises(DataError, match=r"pip install 'bertrain\[zh\]'.*word_segmenter: none"):
        WordSegmenter().spans("zh", "我来到北京清华大学。")
    monkeypatch.setitem(sys.modules, "fugashi", None)
    with pytest.raises(DataError, match=r"pip install 'bertrain\[ja\]'"):
        WordSegmenter().spans("ja", "吾輩は猫である。")


def test_prepare_of_a_chinese_corpus_without_its_segmenter_stops_naming_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "rjieba", None)
    with pytest.raises(DataError, match=r"Chinese documents.*pip install 'bertrain\[zh\]'"):
        prepare_sentences(tmp_path, [list(CHINESE)], "wordpiece")
    manifest, _ = prepare_sentences(tmp_path, [list(CHINESE)], "wordpiece", segmenter="none")   # or opt out
    assert "documents_segmented_zh" not in manifest["counts"]


def prepare_sentences(root, documents: list[list[str]], kind: str, segmenter: str = "auto"):
    """prepare on documents written one sentence per line (a blank line between documents)."""
    corpus = root / "corpus.txt"
    corpus.write_text("\n\n".join("\n".join(document) for document in documents) + "\n", encoding="utf-8")
    recipe = Recipe(prepare=PrepareConfig(sources=[SourceConfig(path=str(corpus), text_layout="sentence_per_line")],
                                          num_shards=1, validation_fraction=0.0, workers=1,
                                          word_segmenter=segmenter),
                    tokenizer=TokenizerConfig(kind=kind, vocab_size=300, lowercase=False))
    return prepare_corpus(recipe, root / "data"), root / "data"


def ends(pieces: list[str]) -> set[int]:
    """Character offsets where the pieces of a text end."""
    return set(np.cumsum([len(piece) for piece in pieces]).tolist())


def stored_words(data_dir, pieces: bool = False) -> list:
    """Each stored sentence cut at its stored word starts, each word as its decoded tokens joined (with
    `pieces`: (words, tokens) of each sentence)."""
    prepared = open_prepared(data_dir)
    tokenizer = load_tokenizer(prepared.tokenizer_dir)
    shard = prepared.split("train").shards[0]
    starts = np.unpackbits(np.asarray(shard.word_starts), count=len(shard.tokens)).astype(bool)
    out = []
    for first, stop in zip(shard.sentence_offsets[:-1], shard.sentence_offsets[1:]):
        words: list[str] = []
        tokens = [tokenizer.id_to_token(int(shard.tokens[p])).removeprefix("##").removeprefix("▁")
                  for p in range(first, stop)]
        for position, piece in zip(range(first, stop), tokens):
            if starts[position] or not words:
                words.append(piece)
            else:
                words[-1] += piece
        out.append((words, tokens) if pieces else words)
    return out


@needs_zh
@needs_ja
@pytest.mark.parametrize("kind", ["wordpiece", "unigram"])
def test_prepare_stores_segmenter_words_of_chinese_and_japanese_documents(tmp_path, kind):
    english = ["The cat sat on the mat.", "Whole words are masked together."]
    documents = [list(CHINESE), list(JAPANESE), english]
    manifest, data_dir = prepare_sentences(tmp_path, documents, kind)
    assert manifest["format_version"] == 2
    assert manifest["counts"]["documents_segmented_zh"] == 1 and manifest["counts"]["documents_segmented_ja"] == 1
    words = {"".join(units): (units, tokens) for units, tokens in stored_words(data_dir, pieces=True)}
    for sentence, expected in {**CHINESE, **JAPANESE}.items():
        units, tokens = words[sentence]
        if kind == "wordpiece":          # one token per character: the units are the words
            assert units == expected
        else:  # a Unigram piece may cross a word boundary: units end exactly at the word ends between tokens
            assert ends(units) == ends(expected) & ends(tokens), (units, tokens)
    # English keeps the tokenizer's words (spaces; WordPiece also splits punctuation off).
    cat = words["Thecatsatonthemat."][0]
    assert cat[:5] == ["The", "cat", "sat", "on", "the"] and "".join(cat[5:]) == "mat."
    # Tokens per word counts segmenter words: ~1-2 tokens a word, not the dozens of a whole unspaced sentence.
    assert manifest["tokenizer"]["stats"]["tokens_per_word"] < 3


@needs_zh
def test_whole_word_masking_on_chinese_takes_whole_segmenter_words(tmp_path):
    text = "".join(CHINESE)
    documents = [[text[i:] + text[:i] for i in range(j, j + 6)] for j in range(0, 30, 6)]   # 5 distinct documents
    _, data_dir = prepare_sentences(tmp_path, documents, "wordpiece")
    prepared = open_prepared(data_dir)
    shard = prepared.split("train").shards[0]
    stored = np.unpackbits(np.asarray(shard.word_starts), count=len(shard.tokens)).astype(bool)
    config = DataConfig(objective="none", max_seq_length=64, masking="whole_word")
    plan = epoch_plan(prepared, config, seed=0, epoch=0)
    dataset = MicroBatchDataset(prepared, config, plan, masking_settings(prepared, config), split="train", seed=0,
                                epoch=0, micro_batch_size=len(plan), rank=0, world_size=1)
    assembled = dataset.assemble(dataset.positions(0))
    labels = dataset.collator(assembled)["labels"].numpy()
    # The batch's word starts are the stored ones (instances are sentences here), and a chosen word is whole.
    assert assembled.word_start is not None and stored.sum() < 0.7 * len(stored)   # words, not characters
    units = np.cumsum(assembled.word_start | assembled.special, axis=1)
    chosen = labels != -100
    for row in range(len(labels)):
        for unit in np.unique(units[row][chosen[row]]):
            assert chosen[row][(units[row] == unit) & ~assembled.special[row]].all()


def test_wordpiece_makes_no_unk_from_a_long_unspaced_run(tmp_path):
    from tokenizers import pre_tokenizers

    # Thai writes phrases without spaces: a run of 3 x 48 = 144 characters is longer than WordPiece's 100.
    phrase = "ภาษาไทยเป็นภาษาที่เขียนติดกันโดยไม่เว้นวรรคระหว่างคำ"
    texts = [phrase * 3 + " " + phrase, "สวัสดีครับ " + phrase * 4, phrase]
    train_tokenizer(texts, TokenizerConfig(kind="wordpiece", vocab_size=200, lowercase=False), tmp_path / "tok")
    tokenizer = load_tokenizer(tmp_path / "tok")
    unk = tokenizer.token_to_id("[UNK]")
    run = phrase * 5
    encoding = tokenizer.encode(run, add_special_tokens=False)
    assert unk not in encoding.ids and tokenizer.decode(encoding.ids).replace(" ", "") == run
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()     # BERT's: the whole run is one [UNK]
    assert tokenizer.encode(run, add_special_tokens=False).ids == [unk]


def test_a_format_1_data_dir_still_reads_with_the_tokenizers_words(tmp_path):
    data_dir = make_prepared_dir(tmp_path / "data", num_documents=40, max_paragraphs=300)
    config = DataConfig(objective="nsp", max_seq_length=64, masking="whole_word")

    def first_batch():
        prepared = open_prepared(data_dir)
        plan = epoch_plan(prepared, config, seed=3, epoch=0)
        dataset = MicroBatchDataset(prepared, config, plan, masking_settings(prepared, config), split="train",
                                    seed=3, epoch=0, micro_batch_size=16, rank=0, world_size=1)
        return dataset[0]["labels"].numpy()

    stored = first_batch()
    for path in data_dir.glob("*/*.word_starts.npy"):
        path.unlink()
    manifest = json.loads((data_dir / "manifest.json").read_text())
    manifest["format_version"] = 1
    manifest["fingerprint"] = fingerprint(manifest)
    (data_dir / "manifest.json").write_text(json.dumps(manifest))
    assert not open_prepared(data_dir).has_word_starts
    assert np.array_equal(first_batch(), stored)        # spaced text: stored words are the tokenizer's words


def test_unspaced_text_reports_tokens_per_character():
    spaced = {"measured_on": "validation", "tokens_per_word": 1.3, "tokens_per_char": 0.25, "chars_per_word": 5.2}
    assert token_rate_row(spaced, {}) == ("tokens per word (validation)", "1.300")
    thai = {"measured_on": "train", "tokens_per_word": 40.0, "tokens_per_char": 0.31, "chars_per_word": 130.0}
    label, value = token_rate_row(thai, {})
    assert label.startswith("tokens per character") and value == "0.310"
    label, _ = token_rate_row(spaced, {"documents_segmented_zh": 12})
    assert "words of 12 zh/ja documents by their segmenter" in label


# Two short documents per language, written for this test (the same two texts in each language).
MULTILINGUAL = {
    "en": ["The river runs through the old town. Children play near the bridge in summer. In winter the water "
           "freezes.", "Libraries lend books to everyone. Many also offer music and films. Some open late on "
           "Thursdays."],
    "de": ["Der Fluss fließt durch die Altstadt. Im Sommer spielen Kinder an der Brücke. Im Winter friert das "
           "Wasser.", "Bibliotheken leihen allen Menschen Bücher. Viele bieten auch Musik und Filme an. Manche "
           "öffnen donnerstags länger."],
    "ru": ["Река течёт через старый город. Летом дети играют у моста. Зимой вода замерзает.",
           "Библиотеки дают книги всем. Многие предлагают музыку и фильмы. Некоторые работают допоздна по "
           "четвергам."],
    "ar": ["يمر النهر عبر المدينة القديمة. يلعب الأطفال قرب الجسر في الصيف. في الشتاء يتجمد الماء.",
           "تعير المكتبات الكتب للجميع. كثير منها يقدم الموسيقى والأفلام. بعضها يفتح متأخرا يوم الخميس."],
    "hi": ["नदी पुराने शहर से होकर बहती है। गर्मियों में बच्चे पुल के पास खेलते हैं। सर्दियों में पानी जम जाता है।",
           "पुस्तकालय सभी को किताबें देते हैं। कई संगीत और फ़िल्में भी देते हैं। कुछ गुरुवार को देर तक खुले रहते हैं।"],
    "zh": ["河流穿过老城。夏天孩子们在桥边玩耍。冬天河水结冰。",
           "图书馆向所有人借书。很多图书馆也提供音乐和电影。有些图书馆星期四开到很晚。"],
    "ja": ["川は古い町を流れている。夏には子供たちが橋の近くで遊ぶ。冬には水が凍る。",
           "図書館は誰にでも本を貸す。音楽や映画を貸す図書館も多い。木曜日に遅くまで開く図書館もある。"],
}


@needs_zh
@needs_ja
def test_the_multilingual_recipe_prepares_one_folder_per_language(tmp_path, monkeypatch):
    from bertrain.config import load_recipe

    for language, documents in MULTILINGUAL.items():
        folder = tmp_path / "corpus" / language
        folder.mkdir(parents=True)
        for number, text in enumerate(documents):
            (folder / f"{number}.txt").write_text(text + "\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    recipe = load_recipe("multilingual_local", ["tokenizer.vocab_size=500", "prepare.workers=1",
                                                "prepare.num_shards=1", "prepare.validation_fraction=0"])
    manifest = prepare_corpus(recipe, tmp_path / "data")
    counts = manifest["counts"]
    assert counts["documents_written"] == 14
    assert counts["documents_segmented_zh"] == 2 and counts["documents_segmented_ja"] == 2   # found by script
    prepared = open_prepared(tmp_path / "data")
    tokenizer = load_tokenizer(prepared.tokenizer_dir)
    text = tokenizer.decode(np.asarray(prepared.split("train").shards[0].tokens).tolist())
    for kept in ("पुराने", "Brücke", "течёт", "القديمة", "Libraries"):       # case and marks kept
        assert kept in text
