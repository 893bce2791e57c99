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

from odqa.common.timings import stage


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


def reranked(scores: np.ndarray, doc_z: np.ndarray, bm25_z: np.ndarray | None, lam: float, mu: float
             ) -> tuple[np.ndarray, np.ndarray, list[dict]]:
    """(the candidates' order, their scores in it, each one's parts) of one question's candidates
    under z(passage) + lam z(document) + mu z(BM25); with both weights 0 the search's own order and
    scores, the parts still given."""
    c = Candidates(scores, doc_z, bm25_z=bm25_z)
    order = np.arange(len(scores))
    if lam or mu:
        final = combined(c, lam, mu)
        order = np.argsort(-final, kind="stable")   # `rerank_order`
        scores = final[order]
    parts = [{"passage_score": float(ps), "doc_z": float(dz)} for ps, dz in zip(c.passage_scores[order], c.doc_z[order])]
    if bm25_z is not None:
        for part, bz in zip(parts, bm25_z[order]):
            part["bm25_z"] = float(bz)
    return order, scores, parts


def final_scores(search_scores, cross_scores, weight: float) -> np.ndarray:
    """The final ranking's scores of one question's passages: z(search score) + weight x z(reranker score),
    each standardised over those passages (the two come from different models)."""
    return standardise(search_scores) + weight * standardise(cross_scores)


@stage("cross-encoder")
def cross_reranked(reranker, question: str, hits: list, k: int) -> list:
    """`hits` (passages) reordered by z(search score) + w x z(cross-encoder score), w the reranker's
    weight, the first k kept: each one's score becomes that sum, its parts the search's and the
    cross-encoder's scores."""
    from dataclasses import replace
    if not hits:
        return hits
    cross = reranker.score(question, [{"id": h.unit.id, "title": h.unit.title, "text": h.unit.text} for h in hits])
    final = final_scores([h.score for h in hits], cross, reranker.weight)
    order = np.argsort(-final, kind="stable")[:k]
    return [replace(hits[i], unit=replace(hits[i].unit, score=float(final[i])),
                    parts={**hits[i].parts, "search_score": hits[i].score, "cross_score": float(cross[i])})
            for i in order]
