"""Shortcut audit of NSP / SOP pairs: can surface features alone predict the sentence label?

The sentence head should need the text to tell a positive from a negative. The audit reads real training
batches of the configured objective (before MLM masking, which never looks at the label), extracts features
that need no understanding of the text (PROBE_NAMES), fits a table lookup on the instances of half of the
documents and scores it on the other half; a probe beating the held-out majority rate by more than
`WARNING_MARGIN` is a shortcut. Whole documents are held out because a small corpus read for many epochs
repeats its sentences, and a fine-grained feature (the [SEP] position) would otherwise memorize documents.
Instances without a sentence label (-100) are left out. The standard error counts distinct held-out first
segments, not instances (epochs repeat them); where they are too few for WARNING_MARGIN to be 4 standard errors,
the margin that makes a shortcut grows to 4 standard errors, and the audit says so.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from bertrain.config import fit_micro_batch_size
from bertrain.data.format import PreparedData
from bertrain.data.loader import epoch_plan, masking_settings, train_dataset
from bertrain.data.masking import IGNORE_INDEX, sentence_final_table, splitmix64
from bertrain.errors import DataError

# The features of [CLS] A [SEP] B [SEP] (a continuation piece: WordPiece "##", Unigram without "▁").
PROBE_NAMES = {
    "length_sign": "sign of len A - len B",
    "full_length": "instance fills max_seq_length",
    "sep_parity": "parity of the first [SEP] position",
    "a_continues": "A starts on a continuation piece",
    "b_continues": "B starts on a continuation piece",
    "a_ends_sentence": "A ends on . ! ? 。 । ؟ ...",
    "b_ends_sentence": "B ends on . ! ? 。 । ؟ ...",
    "sep_position": "first [SEP] position",
    "joint": "all seven features above, jointly",
}
PROBES = tuple(PROBE_NAMES)
JOINT_FEATURES = PROBES[:7]
AUDIT_FILE = "pair_audit-{objective}.json"  # DATA_DIR's last audit per objective, for `bertrain report`
WARNING_MARGIN = 0.02
# 10,000 held-out instances: the standard error of an accuracy near 50% is 0.5 points, so the
# 2-point warning margin is 4 standard errors (a chance false alarm has probability ~3e-5).
DEFAULT_INSTANCES = 20_000
SHORTCUT_STANDARD_ERRORS = 4
MAX_EPOCHS = 200


@dataclass
class ProbeResult:
    """Held-out accuracy of one lookup probe next to the held-out majority-label rate."""

    probe: str
    accuracy: float
    majority: float
    fit_instances: int
    held_out_instances: int
    held_out_segments: int = 0   # distinct first segments (A starts) held out; 0: not known

    @property
    def margin(self) -> float:
        return self.accuracy - self.majority

    @property
    def independent(self) -> int:
        """Held-out instances counted once per distinct A: a small corpus read for many epochs repeats them."""
        return min(self.held_out_instances, self.held_out_segments or self.held_out_instances)

    @property
    def standard_error(self) -> float:
        """Standard error of the held-out accuracy (binomial, at the majority rate, over distinct A segments)."""
        return float(np.sqrt(self.majority * (1 - self.majority) / max(self.independent, 1)))

    @property
    def threshold(self) -> float:
        """The margin that makes a shortcut: WARNING_MARGIN, or 4 standard errors where fewer distinct segments
        were held out than that margin needs (a tiny corpus: its documents' own differences look like one)."""
        return max(WARNING_MARGIN, SHORTCUT_STANDARD_ERRORS * self.standard_error)

    @property
    def shortcut(self) -> bool:
        return self.margin > self.threshold


def piece_tables(prepared: PreparedData, data_config) -> tuple[np.ndarray, np.ndarray]:
    """([vocab] bool continuation piece, [vocab] bool ends in a terminal mark) from the prepared tokenizer."""
    word_start = masking_settings(prepared, dataclasses.replace(data_config, masking="whole_word")).word_start
    final = sentence_final_table(prepared.tokenizer_dir, prepared.vocab_size)
    return ~word_start, final[:len(word_start)]


def surface_features(input_ids: np.ndarray, attention_mask: np.ndarray, *, sep_id: int, max_seq_length: int,
                     continuation: np.ndarray, sentence_final: np.ndarray) -> dict[str, np.ndarray]:
    """[B] integer features of [CLS] A [SEP] B [SEP] rows (original, unmasked ids)."""
    length = attention_mask.sum(axis=1).astype(np.int64)
    sep = np.argmax(input_ids == sep_id, axis=1)                      # first [SEP]
    rows = np.arange(len(input_ids))
    a_length, b_length = sep - 1, length - sep - 2
    return {
        "length_sign": np.sign(a_length - b_length).astype(np.int64),
        "full_length": (length >= max_seq_length).astype(np.int64),
        "sep_parity": sep % 2,
        "a_continues": continuation[input_ids[rows, 1]].astype(np.int64),
        "b_continues": continuation[input_ids[rows, np.minimum(sep + 1, input_ids.shape[1] - 1)]].astype(np.int64),
        "a_ends_sentence": sentence_final[input_ids[rows, np.maximum(sep - 1, 0)]].astype(np.int64),
        "b_ends_sentence": sentence_final[input_ids[rows, np.maximum(length - 2, 0)]].astype(np.int64),
        "sep_position": sep.astype(np.int64),
    }


def collect_features(prepared: PreparedData, data_config, *, seed: int, micro_batch_size: int,
                     instances: int = DEFAULT_INSTANCES) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """(features, sentence labels, documents of A) of at least `instances` labelled instances of the
    training batches, epoch after epoch (0, 1, ...), as the training loop of one process reads them."""
    if data_config.objective not in ("nsp", "sop"):
        raise DataError(f"The pair audit needs data.objective nsp or sop, not {data_config.objective!r}.")
    data_config = dataclasses.replace(data_config, num_workers=0)
    continuation, final = piece_tables(prepared, data_config)
    sep_id = prepared.special_tokens["sep"]
    parts: list[dict[str, np.ndarray]] = []
    labels: list[np.ndarray] = []
    documents: list[np.ndarray] = []
    collected = 0
    for epoch in range(MAX_EPOCHS):
        if collected >= instances:
            break
        dataset = _epoch_batches(prepared, data_config, seed, epoch, micro_batch_size)
        for micro_batch in range(len(dataset)):
            positions = dataset.positions(micro_batch)
            batch = dataset.assemble(positions)      # the training micro-batch before masking
            keep = batch.sentence_label != IGNORE_INDEX
            parts.append(surface_features(batch.input_ids[keep], batch.attention_mask[keep], sep_id=sep_id,
                                          max_seq_length=data_config.max_seq_length, continuation=continuation,
                                          sentence_final=final))
            labels.append(batch.sentence_label[keep])
            documents.append(dataset.plan.document[dataset.plan.order[positions]][keep])
            parts[-1]["a_start"] = dataset.plan.a_start[dataset.plan.order[positions]][keep]
            collected += int(keep.sum())
            if collected >= instances:
                break
    if not parts:
        raise DataError(f"{prepared.path}: the train split gives no sentence pairs to audit.")
    features = {name: np.concatenate([part[name] for part in parts]) for name in parts[0]}
    return features, np.concatenate(labels).astype(np.int64), np.concatenate(documents)


def _epoch_batches(prepared: PreparedData, data_config, seed: int, epoch: int, micro_batch_size: int):
    """The epoch's training micro-batches of one process (one smaller micro-batch on a small corpus)."""
    instances = len(epoch_plan(prepared, data_config, seed=seed, epoch=epoch))
    return train_dataset(prepared, data_config, seed=seed, epoch=epoch, rank=0, world_size=1,
                         micro_batch_size=fit_micro_batch_size(instances, micro_batch_size))


def fit_documents(documents: np.ndarray) -> np.ndarray:
    """[N] bool: the instance's document is in the fit half (a fixed hash of the document number)."""
    return (splitmix64(documents.astype(np.uint64)) & np.uint64(1)) == 0


def _lookup_accuracy(codes: np.ndarray, labels: np.ndarray, fit: np.ndarray) -> float:
    """Held-out accuracy of a table lookup code -> majority label of the fit rows with that code
    (the overall fit majority for codes unseen or tied in the fit rows)."""
    _, code = np.unique(codes, return_inverse=True)
    code = code.reshape(-1)
    cells = int(code.max()) + 1 if len(code) else 0
    positives = np.bincount(code[fit], weights=labels[fit], minlength=cells)
    counts = np.bincount(code[fit], minlength=cells)
    fallback = int(labels[fit].mean() > 0.5)
    share = np.divide(positives, counts, out=np.full(cells, 0.5), where=counts > 0)
    prediction = np.where(share > 0.5, 1, np.where(share < 0.5, 0, fallback))
    held_out = ~fit
    return float((prediction[code[held_out]] == labels[held_out]).mean())


def run_probes(features: dict[str, np.ndarray], labels: np.ndarray, fit: np.ndarray) -> list[ProbeResult]:
    """Fit every probe on the `fit` instances and score it on the others."""
    if fit.all() or not fit.any():
        raise DataError(f"The pair audit needs instances from at least two documents, one to fit the probe "
                        f"and one to test it; got {len(labels)} instance(s) from one side only.")
    held_labels = labels[~fit]
    majority = float(max(held_labels.mean(), 1 - held_labels.mean()))
    joint = np.stack([features[name] for name in JOINT_FEATURES], axis=1)
    joint_code = np.unique(joint, axis=0, return_inverse=True)[1].reshape(-1)
    segments = len(np.unique(features["a_start"][~fit])) if "a_start" in features else 0
    results = []
    for probe in PROBES:
        codes = joint_code if probe == "joint" else features[probe]
        results.append(ProbeResult(probe, _lookup_accuracy(codes, labels, fit), majority, int(fit.sum()),
                                   int((~fit).sum()), segments))
    return results


def audit_pairs(prepared: PreparedData, data_config, *, seed: int, micro_batch_size: int,
                instances: int = DEFAULT_INSTANCES) -> list[ProbeResult]:
    """The probe table of a prepared DATA_DIR under a data config (see the module docstring)."""
    features, labels, documents = collect_features(prepared, data_config, seed=seed,
                                                   micro_batch_size=micro_batch_size, instances=instances)
    return run_probes(features, labels, fit_documents(documents))
