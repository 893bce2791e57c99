"""DHR's final ranking: passage_score + lambda * document_score, and optionally + mu * BM25 score.

The scores come from different models (phrase start+end sums, document cosines, BM25's term
weights), so each is standardised per question first: z(x) = (x - mean) / std over that question's
candidates (the retrieved passages; the top documents), a lone candidate or equal scores giving
z = 0. The BM25 term is DenSPI's sparse half (Seo et al. 2019) put back as a rerank feature: a dense
phrase model trained on a few thousand questions misses lexical matches ("the 2012 summer
olympics") that term weights catch. Lambda and mu are tuned on validation by
`odqa.retriever.tune_lambda`.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def standardise(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    if len(x) < 2:
        return np.zeros_like(x)
    std = x.std()
    return (x - x.mean()) / std if std > 0 else np.zeros_like(x)


@dataclass
class Candidates:
    """One question's retrieved passages: their scores, their documents' standardised scores, (for
    tuning) whether each holds an answer, and their standardised BM25 scores (when mu is used)."""
    passage_scores: np.ndarray
    doc_z: np.ndarray
    hits: np.ndarray | None = None
    bm25_z: np.ndarray | None = None


def doc_z_of(doc_rows: np.ndarray, doc_scores: np.ndarray, passage_docs: np.ndarray) -> np.ndarray:
    """Each passage's document score, standardised over the question's top documents."""
    z = dict(zip(np.asarray(doc_rows).tolist(), standardise(doc_scores).tolist()))
    return np.array([z[d] for d in np.asarray(passage_docs).tolist()], dtype=np.float64)


def combined(c: Candidates, lam: float, mu: float = 0.0) -> np.ndarray:
    score = standardise(c.passage_scores) + lam * c.doc_z
    if mu:
        if c.bm25_z is None:
            raise ValueError("a BM25 weight needs the candidates' BM25 scores (bm25_z)")
        score = score + mu * c.bm25_z
    return score


def rerank_order(c: Candidates, lam: float, mu: float = 0.0) -> np.ndarray:
    """Candidate positions, best first (stable: ties keep the passage order)."""
    return np.argsort(-combined(c, lam, mu), kind="stable")
