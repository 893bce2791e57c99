"""Retrieval metrics over ranked has_answer flags: Top-k accuracy, MRR@k, P@k.

`hits[q]` is the list of has_answer flags of question q's ranked passages. Top-k is the share of
questions with an answer-bearing passage in the first k (DPR's metric); MRR@k the mean reciprocal
rank of the first one (0 when none in the first k); P@k the mean share of answer-bearing passages
among the first k. All in percent.
"""
from __future__ import annotations

from typing import Sequence

DEFAULT_TOPK = (1, 5, 20, 100)


def top_k_accuracy(hits: Sequence[Sequence[bool]], k: int) -> float:
    if not hits:
        return 0.0
    return 100.0 * sum(any(h[:k]) for h in hits) / len(hits)


def mrr_at_k(hits: Sequence[Sequence[bool]], k: int) -> float:
    if not hits:
        return 0.0
    total = 0.0
    for h in hits:
        for rank, hit in enumerate(h[:k], 1):
            if hit:
                total += 1.0 / rank
                break
    return 100.0 * total / len(hits)


def precision_at_k(hits: Sequence[Sequence[bool]], k: int) -> float:
    if not hits:
        return 0.0
    return 100.0 * sum(sum(bool(x) for x in h[:k]) / k for h in hits) / len(hits)


def retrieval_metrics(hits: Sequence[Sequence[bool]], ks: Sequence[int] = DEFAULT_TOPK,
                      mrr_k: int = 20, p_k: int = 20, depth: int | None = None) -> dict[str, float]:
    """Top-k for each k, MRR@mrr_k, P@p_k and the count of questions. `depth`: how many passages a question
    the ranking holds; a metric whose k is deeper has no figure (None), since the ranks past the depth
    are unknown: a 10-deep file's "Top-20" would be its Top-10."""
    def known(k: int, metric):
        return metric(hits, k) if depth is None or k <= depth else None
    out = {f"Top-{k}": known(k, top_k_accuracy) for k in ks}
    out[f"MRR@{mrr_k}"] = known(mrr_k, mrr_at_k)
    out[f"P@{p_k}"] = known(p_k, precision_at_k)
    out["questions"] = len(hits)
    return out
