"""`inspect --pairs` (issue 16.7): statistics over enough tokens to mean something, with the sample size printed."""

from __future__ import annotations

import io

from bertrain.config import load_config
from bertrain.console import make_console
from bertrain.data.format import open_prepared
from bertrain.data.inspect_pairs import MIN_STATISTICS_TOKENS, show_pairs
from bertrain.data.loader import epoch_plan
from tests.helpers import make_prepared_dir


def test_statistics_cover_at_least_min_tokens_and_say_how_many(tmp_path):
    data = make_prepared_dir(tmp_path / "data", kind="unigram", num_documents=120)
    out = io.StringIO()
    stats = show_pairs(data, load_config("tiny_albert", ["train.batch_size=16"]), 1, make_console(file=out))
    text = " ".join(out.getvalue().split())
    assert stats["tokens"] >= MIN_STATISTICS_TOKENS and stats["batches"] > 1  # not one batch of 16
    assert stats["instances"] == 16 * stats["batches"]
    assert (f"Realized statistics over {int(stats['instances']):,} instances ({int(stats['tokens']):,} tokens, "
            f"{int(stats['masked_positions']):,} masked positions; {int(stats['batches'])} batch(es) of 16") in text
    # ~3,000 masked positions: the realized shares sit near the configured 15% and 80/10/10.
    assert stats["masked_positions"] > 2000
    assert abs(stats["masked_fraction_of_eligible"] - 0.15) < 0.03
    assert abs(stats["mask_share"] - 0.8) < 0.05 and abs(stats["random_share"] - 0.1) < 0.04
    assert stats["coverage"] >= 0.99 and f"{stats['coverage']:.1%} ({stats['coverage_in_batches']:.1%} in full" in text
    assert "Warning" not in text


def test_a_realized_masking_rate_off_by_more_than_a_point_is_warned_about(tmp_path):
    data = make_prepared_dir(tmp_path / "data", kind="wordpiece", num_documents=120)
    out = io.StringIO()
    config = load_config("tiny_bert", ["train.batch_size=16", "data.max_predictions_per_seq=4"])
    stats = show_pairs(data, config, 1, make_console(file=out))
    text = " ".join(out.getvalue().split())
    assert stats["masked_fraction_of_eligible"] < 0.12            # 4 predictions in ~60 tokens
    assert "realized masking rate" in text and "data.max_predictions_per_seq 4 is below" in text


def test_a_small_corpus_is_used_whole(tmp_path):
    data = make_prepared_dir(tmp_path / "data", kind="wordpiece", num_documents=40, max_paragraphs=200)
    out = io.StringIO()
    stats = show_pairs(data, load_config("tiny_bert", ["train.batch_size=8"]), 1, make_console(file=out))
    assert stats["tokens"] < MIN_STATISTICS_TOKENS and stats["batches"] * 8 <= stats["instances_per_epoch"] < \
        (stats["batches"] + 1) * 8
    assert "the whole epoch" in out.getvalue()


def test_an_epoch_that_leaves_tokens_out_warns(tmp_path):
    data = make_prepared_dir(tmp_path / "data", kind="wordpiece", num_documents=40, max_paragraphs=200)
    config = load_config("tiny_bert")
    instances = len(epoch_plan(open_prepared(data), config.data, seed=config.train.seed, epoch=0))
    out = io.StringIO()   # one batch of a little over half the epoch: the rest is the dropped last batch
    stats = show_pairs(data, load_config("tiny_bert", [f"train.batch_size={instances // 2 + 1}"]), 1,
                       make_console(file=out, width=200))
    assert stats["coverage"] >= 0.99 and stats["coverage_in_batches"] < 0.8
    warning = f"Warning: this epoch trains on only {stats['coverage_in_batches']:.1%} of the training tokens"
    assert warning in out.getvalue() and "the last incomplete batch is dropped. A smaller batch" in out.getvalue()


def test_the_audit_runs_on_a_corpus_smaller_than_one_micro_batch(tmp_path, run_cli):
    # 6 short documents give 17 training instances, fewer than tiny_bert's micro-batch of 32: the audit used to stop.
    data = make_prepared_dir(tmp_path / "data", kind="wordpiece", num_documents=6, validation_documents=0,
                             max_paragraphs=18)
    code, out, err = run_cli("inspect", str(data), "--pairs", "--audit", "--config", "tiny_bert",
                             "--audit-instances", "100")
    assert code == 0, err
    assert "1 batch(es) of 17; the whole epoch" in " ".join(out.split())
    assert "NSP shortcut audit" in out and "scored on" in out


def test_an_unlabelled_instance_is_not_called_a_one_sentence_document_only():
    from bertrain.data.inspect_pairs import _label_name
    from bertrain.data.masking import IGNORE_INDEX

    # Most unlabelled instances are pieces of a sentence longer than an instance (audit 4: on the demo's data 67% of
    # instances, while 1 of 75 documents had one sentence), which the label called one-sentence documents.
    for objective in ("nsp", "sop"):
        label = _label_name(objective, IGNORE_INDEX)
        assert "piece of a sentence longer than an instance" in label and "one-sentence document" in label
