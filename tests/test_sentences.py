"""The rule-based sentence splitter on the cases that break naive splitters."""

import pytest

from bertrain.data.sentences import split_sentences

CASES = [
    ("Dr. Smith arrived. He sat down.", ["Dr. Smith arrived.", "He sat down."]),
    ("Mr. and Mrs. Jones left at 5 p.m. on Monday.", ["Mr. and Mrs. Jones left at 5 p.m. on Monday."]),
    ("Use a tool, e.g. a hammer. Then stop.", ["Use a tool, e.g. a hammer.", "Then stop."]),
    ("Some fruit, i.e. apples, etc. are fine.", ["Some fruit, i.e. apples, etc. are fine."]),
    ("It costs 3.50 dollars. Pi is 3.14159.", ["It costs 3.50 dollars.", "Pi is 3.14159."]),
    ("J. R. R. Tolkien wrote it. John F. Kennedy read it.", ["J. R. R. Tolkien wrote it.", "John F. Kennedy read it."]),
    ('He said "Stop." Then he left.', ['He said "Stop."', "Then he left."]),
    ("(This is in brackets.) And this is not? Yes!", ["(This is in brackets.)", "And this is not?", "Yes!"]),
    ('"Why?" she asked. "Because."', ['"Why?" she asked.', '"Because."']),
    ("Wait... what? The end.", ["Wait... what?", "The end."]),
    ("See Fig. 3 and No. 5 for details. Good.", ["See Fig. 3 and No. 5 for details.", "Good."]),
    ("The answer is no. Then he left.", ["The answer is no.", "Then he left."]),
    ("Smith et al. (2019) found it. Good.", ["Smith et al. (2019) found it.", "Good."]),
    ("The U.S. economy grew. It was 1990. 2000 came next.", ["The U.S. economy grew.", "It was 1990.", "2000 came next."]),
    ("Version 3.11.7 is out.Really", ["Version 3.11.7 is out.Really"]),
    ("Проф. Иванов А. С. приехал. См. ул. Ленина.", ["Проф. Иванов А. С. приехал.", "См. ул. Ленина."]),
    ("  spaced   out\n text.  Next\tone. ", ["spaced out text.", "Next one."]),
    ("no terminal punctuation", ["no terminal punctuation"]),
    ("", []),
    ("   \n  ", []),
]


@pytest.mark.parametrize("text,expected", CASES)
def test_split_sentences(text, expected):
    assert split_sentences(text) == expected


def test_no_text_lost(pydoc_text):
    paragraph = " ".join(pydoc_text.split())[:200_000]
    sentences = split_sentences(paragraph)
    assert " ".join(sentences) == paragraph
    assert 500 < len(sentences) < 5000
