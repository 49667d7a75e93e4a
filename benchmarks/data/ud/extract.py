"""How the files here were made from Universal Dependencies .conllu test sets (run once; kept for the record).

Each LANG.txt holds the treebank's gold sentences (its `# text =` lines), one a line, a blank line between
documents. Documents are the `# newdoc id` groups; where a treebank has none, or one per sentence, the sent_id's
first 6 characters (PUD: n01001 is one news article); Japanese GSD's ids carry no document, so its sentences
are grouped 10 at a time in file order.
    python3 benchmarks/data/ud/extract.py /path/to/conllu_dir
"""

import sys
from pathlib import Path

FILES = {"ar": "ar_pud", "de": "de_pud", "en": "en_pud", "hi": "hi_pud", "ja": "ja_gsd", "ru": "ru_pud",
         "th": "th_pud", "zh": "zh_pud"}
JA_SENTENCES_PER_DOCUMENT = 10


def documents(path: Path, lang: str) -> list[list[str]]:
    """The gold sentences of a .conllu file, grouped into documents."""
    rows = []  # (newdoc id or None, sent_id, text)
    newdoc = sent_id = None
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("# newdoc id ="):
            newdoc = line.split("=", 1)[1].strip()
        elif line.startswith("# sent_id ="):
            sent_id = line.split("=", 1)[1].strip()
        elif line.startswith("# text ="):
            rows.append((newdoc, sent_id, line.split("=", 1)[1].strip()))
    if lang == "ja":
        keys = [i // JA_SENTENCES_PER_DOCUMENT for i in range(len(rows))]
    elif len({row[0] for row in rows}) in (1, len(rows)):  # no newdoc, or one per sentence
        keys = [row[1][:6] for row in rows]
    else:
        keys, current = [], None
        for row in rows:
            current = row[0] or current
            keys.append(current)
    out: list[list[str]] = []
    last = object()
    for key, (_, _, text) in zip(keys, rows):
        if key != last:
            out.append([])
            last = key
        out[-1].append(text)
    return out


if __name__ == "__main__":
    source = Path(sys.argv[1])
    for lang, stem in FILES.items():
        docs = documents(source / f"{stem}-ud-test.conllu", lang)
        text = "\n\n".join("\n".join(doc) for doc in docs) + "\n"
        (Path(__file__).parent / f"{lang}.txt").write_text(text, encoding="utf-8")
        print(lang, len(docs), "documents", sum(map(len, docs)), "sentences")
