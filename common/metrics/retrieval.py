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
                      mrr_k: int = 20, p_k: int = 20) -> dict[str, float]:
    out = {f"Top-{k}": top_k_accuracy(hits, k) for k in ks}
    out[f"MRR@{mrr_k}"] = mrr_at_k(hits, mrr_k)
    out[f"P@{p_k}"] = precision_at_k(hits, p_k)
    out["questions"] = len(hits)
    return out
