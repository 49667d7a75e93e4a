"""NSP / SOP pairs leak no label through surface features: the shortcut audit and its probe."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from rich.console import Console

from bertrain.config import DataConfig
from bertrain.data.format import open_prepared, write_manifest, write_shard
from bertrain.data.inspect_pairs import print_audit
from bertrain.data.pair_audit import (PROBES, WARNING_MARGIN, ProbeResult, audit_pairs, fit_documents, run_probes,
                                      surface_features)
from tests.helpers import make_prepared_dir

# 20,000 instances, 10,000 of them held out: an accuracy near 50% has a standard error of 0.5 points,
# so the 2-point margin is 4 standard errors (one-sided chance of a false alarm per probe: 3e-5).
INSTANCES = 20_000


def recut(data_dir, layout: str, seed: int = 0, copies: int = 3, max_sentence_tokens: int = 100):
    """Rewrite the train shards of a prepared DATA_DIR as `copies` independent shuffles of their
    sentences (those of at most `max_sentence_tokens`: no code dumps), cut into documents of 50-200
    sentences (layout "long") or 1-6 sentences ("short"). Shuffled sentences are independent, so any
    label signal the probe finds is the pair builder's, not the text's; the copies give enough
    documents that a chance property of one corpus stays well under the 2-point margin."""
    rng = np.random.default_rng(seed)
    manifest = json.loads((data_dir / "manifest.json").read_text())
    records = manifest["splits"]["train"]["shards"]
    shards = open_prepared(data_dir).split("train").shards
    for record, shard in zip(records, shards):
        offsets = np.asarray(shard.sentence_offsets)
        tokens = np.asarray(shard.tokens)
        starts = np.unpackbits(np.asarray(shard.word_starts), count=len(tokens)).astype(bool)
        kept = np.flatnonzero(np.diff(offsets) <= max_sentence_tokens)
        order = np.concatenate([rng.permutation(kept) for _ in range(copies)])
        pieces = [tokens[offsets[i]:offsets[i + 1]] for i in order]
        piece_starts = [starts[offsets[i]:offsets[i + 1]] for i in order]
        sizes = rng.integers(1, 7, size=len(order)) if layout == "short" else rng.integers(50, 201, size=len(order))
        cuts = np.cumsum(sizes)
        documents = np.concatenate([[0], cuts[cuts < len(order)], [len(order)]])
        new_offsets = np.concatenate([[0], np.cumsum([len(piece) for piece in pieces])])
        record.update(write_shard(data_dir / "train", record["name"], np.concatenate(pieces), new_offsets, documents,
                                  np.concatenate(piece_starts)))
    del shards
    train = manifest["splits"]["train"]
    for key in ("documents", "sentences", "tokens"):
        train[key] = sum(r[key] for r in records)
    write_manifest(data_dir, {k: v for k, v in manifest.items() if k not in ("fingerprint", "format_version")})
    return data_dir


def corpus(root, kind: str, layout: str):
    """A prepared corpus of shuffled pydoc sentences in long or 1-6-sentence documents (see `recut`). Twelve
    copies: at max_seq_length 32 most of these sentences are longer than an instance and train MLM only, so
    the pairs of one copy are few and would come back epoch after epoch."""
    data_dir = make_prepared_dir(root / f"{kind}-{layout}", kind=kind, num_documents=38, seed=1,
                                 validation_documents=8)
    return open_prepared(recut(data_dir, layout, copies=12))


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    """The four corpora, tokenized once per module."""
    root = tmp_path_factory.mktemp("audit")
    return {(kind, layout): corpus(root, kind, layout) for kind in ("wordpiece", "unigram")
            for layout in ("long", "short")}


@pytest.mark.parametrize("layout", ["long", "short"])
@pytest.mark.parametrize("max_seq_length", [32, 128])
@pytest.mark.parametrize("kind", ["wordpiece", "unigram"])
@pytest.mark.parametrize("objective", ["sop", "nsp"])
def test_no_surface_feature_predicts_the_sentence_label(corpora, objective, kind, max_seq_length, layout):
    config = DataConfig(objective=objective, max_seq_length=max_seq_length, masking="token")
    results = audit_pairs(corpora[kind, layout], config, seed=0, micro_batch_size=256, instances=INSTANCES)
    table = "\n".join(f"{r.probe:16s} {r.accuracy:.3f} vs majority {r.majority:.3f} (n={r.held_out_instances})"
                      for r in results)
    assert [r.probe for r in results] == list(PROBES)
    assert results[0].held_out_instances >= 0.4 * INSTANCES
    assert results[0].majority <= 0.55, table
    # One-sided: a lookup scoring below the majority rate is fitting noise, not reading a shortcut.
    assert all(r.accuracy <= r.majority + WARNING_MARGIN for r in results), table


def test_nsp_on_text_in_its_own_order_shows_no_shortcut(tmp_path):
    # Adjacent sentences end alike ("for example:" then code), so a positive's A and B agree on ending with
    # . ! ? more often than A and a random B; the joint probe read +2.8 points here before a negative's B was
    # made to end as the positive's did (sentence order kept: the text's own signal, not the builder's).
    prepared = open_prepared(make_prepared_dir(tmp_path / "data", kind="unigram", num_documents=200, seed=0))
    config = DataConfig(objective="nsp", max_seq_length=128, masking="token")
    results = audit_pairs(prepared, config, seed=0, micro_batch_size=256, instances=INSTANCES)
    assert all(r.accuracy <= r.majority + WARNING_MARGIN for r in results), [(r.probe, r.margin) for r in results]


def test_surface_features_of_a_hand_built_batch():
    # Vocabulary: 0-4 special, 5 "the", 6 "##s", 7 ".", 8 "?", 9 "cat".
    continuation = np.array([False] * 6 + [True, False, False, False])
    final = np.array([False] * 7 + [True, True, False])
    rows = [[2, 6, 9, 3, 5, 9, 7, 3, 0, 0],       # A = ##s cat, B = the cat .  (padded)
            [2, 5, 9, 7, 3, 6, 3, 0, 0, 0],       # A = the cat ., B = ##s
            [2, 9, 3, 9, 8, 3, 0, 0, 0, 0]]       # A = cat, B = cat ?
    ids = np.array(rows)
    attention = np.array([[1] * 8 + [0] * 2, [1] * 7 + [0] * 3, [1] * 6 + [0] * 4])
    features = surface_features(ids, attention, sep_id=3, max_seq_length=8, continuation=continuation,
                                sentence_final=final)
    assert features["length_sign"].tolist() == [-1, 1, -1]
    assert features["full_length"].tolist() == [1, 0, 0]
    assert features["sep_position"].tolist() == [3, 4, 2]
    assert features["sep_parity"].tolist() == [1, 0, 0]
    assert features["a_continues"].tolist() == [1, 0, 0]
    assert features["b_continues"].tolist() == [0, 1, 0]
    assert features["a_ends_sentence"].tolist() == [0, 1, 0]
    assert features["b_ends_sentence"].tolist() == [1, 0, 1]


def test_the_probe_finds_a_planted_shortcut_and_only_there():
    rng = np.random.default_rng(0)
    count = 20_000
    labels = rng.integers(0, 2, count)
    features = {name: rng.integers(0, 2, count) for name in PROBES if name != "joint"}
    features["sep_position"] = rng.integers(1, 30, count)
    # sep_parity agrees with the label 70% of the time; a_continues adds 10 points within it.
    features["sep_parity"] = np.where(rng.random(count) < 0.7, labels, 1 - labels)
    documents = rng.integers(0, 500, count)
    results = {r.probe: r for r in run_probes(features, labels, fit_documents(documents))}
    assert abs(results["sep_parity"].accuracy - 0.7) < 0.02 and results["sep_parity"].shortcut
    assert results["joint"].accuracy > 0.68 and results["joint"].shortcut
    for name in ("length_sign", "full_length", "a_continues", "b_ends_sentence", "sep_position"):
        assert not results[name].shortcut, results[name]
    assert 0.4 < fit_documents(documents).mean() < 0.6


def test_audit_through_the_cli(corpora, run_cli, tmp_path):
    config_file = tmp_path / "c.yaml"
    config_file.write_text("data:\n  objective: sop\n  max_seq_length: 32\n  masking: token\n"
                           "train:\n  batch_size: 64\n")
    data_dir = str(corpora["wordpiece", "short"].path)
    code, out, err = run_cli("inspect", data_dir, "--pairs", "--config", str(config_file), "--audit",
                             "--audit-instances", "4000")
    assert code == 0, err
    assert "SOP shortcut audit" in out and "held-out" in out and "first [SEP] position" in out
    assert "No surface feature predicts the SOP label" in out and "SHORTCUT" not in out
    code, out, err = run_cli("inspect", data_dir, "--audit")
    assert code == 2 and "--pairs" in err


def test_the_audit_warns_when_a_probe_beats_the_majority():
    results = [ProbeResult(name, 0.5, 0.505, 10_000, 10_000) for name in PROBES]
    results[PROBES.index("sep_position")] = ProbeResult("sep_position", 0.678, 0.505, 10_000, 10_000)
    out = io.StringIO()
    assert print_audit(results, "sop", Console(file=out, width=200))
    text = out.getvalue()
    assert "WARNING" in text and "first [SEP] position (+17.3)" in text and text.count("SHORTCUT") == 1
    out = io.StringIO()
    assert not print_audit(results[:1], "nsp", Console(file=out, width=200))
    assert "WARNING" not in out.getvalue()


def test_a_tiny_corpus_raises_the_shortcut_margin_to_four_standard_errors_of_its_distinct_segments():
    # 400 distinct first segments read for many epochs: a 4-point margin is within chance (SE 2.5 points).
    tiny = [ProbeResult(name, 0.5, 0.5, 10_000, 10_000, 400) for name in PROBES]
    tiny[PROBES.index("sep_parity")] = ProbeResult("sep_parity", 0.54, 0.5, 10_000, 10_000, 400)
    assert tiny[0].independent == 400 and abs(tiny[0].threshold - 4 * 0.025) < 1e-9
    out = io.StringIO()
    assert not print_audit(tiny, "sop", Console(file=out, width=300))
    assert "Only 400 distinct first segments" in out.getvalue() and "10.0 points" in out.getvalue()
    big = ProbeResult("sep_parity", 0.54, 0.5, 10_000, 10_000, 10_000)
    assert big.threshold == WARNING_MARGIN and big.shortcut
