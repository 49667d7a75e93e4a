"""Corpus sources: locating files (lookup), decoding bytes into lines (decode), one reader per
format family (text, json_records, columnar, hub; `read.read_documents` picks one), normalization
into sentences (normalize), and the pydoc corpus (pydoc).

A raw document is a tuple `(kind, payload, origin)`: kind "sentences" (payload: list of lines,
BERT's one-sentence-per-line format) or "text" (payload: one string of paragraphs separated by
blank lines, split into sentences later). Everything streams, and every document, line or file
that is not used is counted in `counts` (a collections.Counter) so the closing table adds up.
"""
