"""Checks on what `bertrain prepare` wrote, shared by test_prepare and test_prepare_guidance."""

from __future__ import annotations

import numpy as np

from bertrain.data.format import open_prepared
from bertrain.data.prepare import DOCUMENT_SKIPS


def stored_documents(data_dir):
    """Every document of both splits as a tuple of sentences' token-id tuples."""
    prepared = open_prepared(data_dir)
    out = []
    for split in ("train", "validation"):
        for shard in prepared.split(split).shards:
            s, d = np.asarray(shard.sentence_offsets), np.asarray(shard.document_offsets)
            for j in range(len(d) - 1):
                out.append(tuple(tuple(shard.tokens[s[i]:s[i + 1]].tolist()) for i in range(d[j], d[j + 1])))
    return out


def check_identity(counts):
    """Every document read was written or counted under one of the skip reasons."""
    assert counts["documents_read"] == counts["documents_written"] + sum(counts.get(r, 0) for r in DOCUMENT_SKIPS)
