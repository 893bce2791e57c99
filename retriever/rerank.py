"""DHR's final ranking: passage_score + lambda * document_score.

The two scores come from different encoders (phrase start+end sums vs document cosines), so each is
standardised per question first: z(x) = (x - mean) / std over that question's candidates (the
retrieved passages; the top documents), a lone candidate or equal scores giving z = 0.
`tune_lambda` grid-searches lambda on validation Top-k with the candidates fixed, so the search is
run once and each lambda only re-sorts.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from odqa.common.io import InputError
from odqa.common.metrics.has_answer import has_answer


def standardise(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    if len(x) < 2:
        return np.zeros_like(x)
    std = x.std()
    return (x - x.mean()) / std if std > 0 else np.zeros_like(x)


@dataclass
class Candidates:
    """One question's retrieved passages: their scores, their documents' standardised scores, and
    (for tuning) whether each holds an answer."""
    passage_scores: np.ndarray
    doc_z: np.ndarray
    hits: np.ndarray | None = None


def doc_z_of(doc_rows: np.ndarray, doc_scores: np.ndarray, passage_docs: np.ndarray) -> np.ndarray:
    """Each passage's document score, standardised over the question's top documents."""
    z = dict(zip(np.asarray(doc_rows).tolist(), standardise(doc_scores).tolist()))
    return np.array([z[d] for d in np.asarray(passage_docs).tolist()], dtype=np.float64)


def combined(c: Candidates, lam: float) -> np.ndarray:
    return standardise(c.passage_scores) + lam * c.doc_z


def rerank_order(c: Candidates, lam: float) -> np.ndarray:
    """Candidate positions, best first (stable: ties keep the passage order)."""
    return np.argsort(-combined(c, lam), kind="stable")


def top_k_at(candidates: list[Candidates], lam: float, k: int) -> float:
    if not candidates:
        return 0.0
    return 100.0 * float(np.mean([bool(c.hits[rerank_order(c, lam)[:k]].any()) for c in candidates]))


def tune_lambda(candidates: list[Candidates], grid: np.ndarray | None = None, k: int = 20) -> dict:
    """The lambda in the grid (default 0, 0.1, ..., 2) with the best validation Top-k; the smallest on ties."""
    grid = np.round(np.arange(0, 2.0001, 0.1), 4) if grid is None else np.asarray(grid)
    scores = [top_k_at(candidates, float(lam), k) for lam in grid]
    best = int(np.argmax(scores))
    return {"lambda": float(grid[best]), "metric": f"Top-{k}", "best": scores[best],
            "grid": [{"lambda": float(lam), f"Top-{k}": s} for lam, s in zip(grid, scores)],
            "questions": len(candidates)}


def candidates_from_results(results: list[dict], questions) -> list[Candidates]:
    """Tuning candidates from `Searcher.search(..., unit="passage")` results of a pre-filtered search
    with lambda = 0 (passages in passage-score order, each with its passage_score and doc_z)."""
    out = []
    for r, q in zip(results, questions):
        ps = r["passages"]
        out.append(Candidates(np.array([p["passage_score"] for p in ps]), np.array([p["doc_z"] for p in ps]),
                              np.array([has_answer(p["text"], q.answers, q.regex) for p in ps], dtype=bool)))
    return out


def tune_searcher_lambda(searcher, questions, metric_k: int = 20, limit: int | None = None, info: dict | None = None,
                         batch_size: int = 64) -> dict:
    """`odqa tune-lambda`: one pre-filtered search of the (deduplicated) validation questions at
    lambda = 0, the grid scored on its candidates, the best lambda stored with the document index
    (the searcher's own lambda is set to it too)."""
    from tqdm import tqdm
    if searcher.prefilter is None:
        raise InputError("tune-lambda needs a searcher with a document pre-filter: lambda weighs the document score")
    unique = {}  # supervision files hold a line per positive passage: each question once, first kept
    for q in questions:
        unique.setdefault(q.question, q)
    questions = list(unique.values())[:limit]
    searcher.lam, results = 0.0, []
    for a in tqdm(range(0, len(questions), batch_size), desc="tune-lambda search", disable=None):
        results += searcher.search([q.question for q in questions[a:a + batch_size]], k=searcher.rerank_pool,
                                   unit="passage")
    result = tune_lambda(candidates_from_results(results, questions), k=metric_k)
    result.update(top_docs=searcher.top_docs, phrase_index=str(searcher.index.dir), **(info or {}))
    searcher.prefilter.save_lambda(result)
    searcher.lam = result["lambda"]
    return result
