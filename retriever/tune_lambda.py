"""`odqa tune-lambda`: the rerank weight of the document score (passage z + lambda x document z,
`odqa.retriever.rerank`), grid-searched on validation Top-k and stored with the document index, where
the pre-filter (`DocRetriever.tuned_lambda`) reads it. The candidates are fixed by one search at
lambda = 0, so each lambda only re-sorts them.
"""
from __future__ import annotations

import numpy as np

from odqa.common.io import InputError
from odqa.common.metrics.has_answer import has_answer
from odqa.retriever.rerank import Candidates, rerank_order


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
