"""The metrics of fine-tuned tasks, in a few lines of numpy each (scikit-learn is not a dependency for five
formulas; tests check them against scipy and closed forms), and the summary of a task's scores over seeds."""

from __future__ import annotations

import numpy as np


def accuracy(predictions: np.ndarray, labels: np.ndarray) -> float:
    return float(np.mean(predictions == labels))


def f1(predictions: np.ndarray, labels: np.ndarray, positive: int = 1) -> float:
    """F1 of the positive class: 2 TP / (2 TP + FP + FN); 0 when there is no positive at all."""
    tp = np.sum((predictions == positive) & (labels == positive))
    wrong = np.sum((predictions == positive) != (labels == positive))
    return float(2 * tp / (2 * tp + wrong)) if tp + wrong else 0.0


def matthews(predictions: np.ndarray, labels: np.ndarray) -> float:
    """Matthews correlation, multi-class (Gorodkin's R_K, which is the binary MCC for two classes); 0 when undefined."""
    classes = np.union1d(predictions, labels)
    confusion = np.zeros((len(classes), len(classes)))
    np.add.at(confusion, (np.searchsorted(classes, labels), np.searchsorted(classes, predictions)), 1)
    n, correct = confusion.sum(), np.trace(confusion)
    true_counts, predicted_counts = confusion.sum(1), confusion.sum(0)
    numerator = correct * n - true_counts @ predicted_counts
    denominator = np.sqrt((n * n - predicted_counts @ predicted_counts) * (n * n - true_counts @ true_counts))
    return float(numerator / denominator) if denominator else 0.0


def pearson(predictions: np.ndarray, labels: np.ndarray) -> float:
    x, y = predictions - predictions.mean(), labels - labels.mean()
    denominator = np.sqrt((x * x).sum() * (y * y).sum())
    return float((x * y).sum() / denominator) if denominator else 0.0


def _ranks(values: np.ndarray) -> np.ndarray:
    """Ranks from 1, ties given their mean rank (as scipy.stats.rankdata)."""
    order = np.argsort(values, kind="stable")
    sorted_values = values[order]
    starts = np.flatnonzero(np.r_[True, sorted_values[1:] != sorted_values[:-1]])
    ends = np.r_[starts[1:], len(values)]
    mean_rank = (starts + ends + 1) / 2.0  # mean of the ranks starts+1 .. ends
    ranks = np.empty(len(values))
    ranks[order] = np.repeat(mean_rank, ends - starts)
    return ranks


def spearman(predictions: np.ndarray, labels: np.ndarray) -> float:
    return pearson(_ranks(predictions), _ranks(labels))


METRICS = {"accuracy": accuracy, "f1": f1, "matthews": matthews, "pearson": pearson, "spearman": spearman}


def score(metric: str, outputs: np.ndarray, labels: np.ndarray) -> float:
    """`metric` of a model's outputs ([N, labels] logits; [N] or [N, 1] for regression) against the labels."""
    regression = outputs.ndim == 1 or outputs.shape[-1] == 1
    predictions = outputs.reshape(-1).astype(np.float64) if regression else outputs.argmax(-1)
    return METRICS[metric](predictions, labels.astype(np.float64) if regression else labels)


def summarize(values: list[float]) -> dict[str, float | None]:
    """Median, mean, sample std (None for one value: undefined), min and max of a task's scores over seeds."""
    array = np.asarray(values, dtype=np.float64)
    return {"median": float(np.median(array)), "mean": float(array.mean()),
            "std": float(array.std(ddof=1)) if len(array) > 1 else None,
            "min": float(array.min()), "max": float(array.max())}
