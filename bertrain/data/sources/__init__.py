"""Corpus sources. A raw document is `(kind, payload, origin)`: kind "sentences" (a list of lines) or "text"
(paragraphs separated by blank lines). Every unused document, line or file is counted in `counts`."""
