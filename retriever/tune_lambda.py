"""`odqa tune-lambda`: the rerank weights of the document score and of the passage's BM25 score
(passage z + lambda x document z + mu x BM25 z, `odqa.retriever.rerank`), grid-searched together on
validation Top-k and stored with the document index, where the pre-filter
(`DocRetriever.tuned_lambda`, `tuned_bm25_weight`) reads them. The candidates are fixed by one search
at lambda = mu = 0, so each pair only re-sorts them.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from odqa.common.io import InputError
from odqa.common.metrics.has_answer import has_answer
from odqa.retriever.args import TuneLambdaArgs
from odqa.retriever.rerank import Candidates, rerank_order, standardise

LAMBDA_GRID = tuple(np.round(np.arange(0, 2.0001, 0.1), 4).tolist())


def top_k_at(candidates: list[Candidates], lam: float, k: int, mu: float = 0.0) -> float:
    if not candidates:
        return 0.0
    return 100.0 * float(np.mean([bool(c.hits[rerank_order(c, lam, mu)[:k]].any()) for c in candidates]))


def tune_lambda(candidates: list[Candidates], grid=LAMBDA_GRID, k: int = 20, bm25_grid=(0.0,)) -> dict:
    """The (lambda, BM25 weight) pair of the two grids with the best validation Top-k; on ties the
    smallest BM25 weight (no BM25 scoring at 0), then the smallest lambda."""
    pairs = [(float(mu), float(lam)) for mu in bm25_grid for lam in grid]
    scores = [top_k_at(candidates, lam, k, mu) for mu, lam in pairs]
    best = int(np.argmax(scores))  # the first of equal scores: pairs run by BM25 weight, then lambda
    return {"lambda": pairs[best][1], "bm25_weight": pairs[best][0], "metric": f"Top-{k}", "best": scores[best],
            "grid": [{"lambda": lam, "bm25_weight": mu, f"Top-{k}": s} for (mu, lam), s in zip(pairs, scores)],
            "questions": len(candidates)}


def candidates_from_results(results: list, questions, bm25=None) -> list[Candidates]:
    """Tuning candidates from `Searcher.search(..., unit="passage")` results of a pre-filtered search
    with no rerank (passages in passage-score order, each with its passage_score and doc_z); with a
    `BM25Index`, each passage's BM25 score standardised over the question's candidates, as the
    searcher's rerank does."""
    out = []
    for r, q in zip(results, questions):
        hits = r.hits
        bm25_z = None if bm25 is None else standardise(bm25.scores_of(q.question, [h.row for h in hits]))
        out.append(Candidates(np.array([h.parts["passage_score"] for h in hits]), np.array([h.parts["doc_z"] for h in hits]),
                              np.array([has_answer(h.unit.text, q.answers, q.regex) for h in hits], dtype=bool),
                              bm25_z))
    return out


def tune_searcher_lambda(searcher, questions, args: TuneLambdaArgs, info: dict | None = None,
                         batch_size: int = 64) -> dict:
    """`odqa tune-lambda`: one pre-filtered search of the first `args.limit` (deduplicated) validation
    questions with no rerank, the grids scored on its candidates by Top-`args.metric_k`, the best pair
    stored with the document index (the searcher's own weights are set to it too). A BM25 grid of 0
    alone tunes lambda alone."""
    from tqdm import tqdm

    from odqa.retriever.prefilter import POOL, Prefilter
    from odqa.retriever.searcher import Searcher, without_rerank
    if searcher.prefilter is None:
        raise InputError("tune-lambda needs a searcher with a document pre-filter: lambda weighs the document score")
    unique = {}  # supervision files hold a line per positive passage: each question once, first kept
    for q in questions:
        unique.setdefault(q.question, q)
    questions = list(unique.values())[:args.limit]
    plain, results = Searcher(searcher.artifacts, without_rerank(searcher.config), searcher.batch_size), []
    for a in tqdm(range(0, len(questions), batch_size), desc="tune-lambda search", disable=None):
        results += plain.search([q.question for q in questions[a:a + batch_size]], k=POOL, unit="passage")
    bm25 = searcher.artifacts.bm25() if any(args.bm25_grid) else None
    result = tune_lambda(candidates_from_results(results, questions, bm25), k=args.metric_k, bm25_grid=args.bm25_grid)
    result.update(top_docs=searcher.config.prefilter.top_docs, phrase_index=str(searcher.artifacts.index.dir),
                  **(info or {}))
    searcher.artifacts.prefilter.save_lambda(result)
    searcher.config = dataclasses.replace(searcher.config, prefilter=dataclasses.replace(
        searcher.config.prefilter, lam=result["lambda"], bm25_weight=result["bm25_weight"]))
    searcher.prefilter = Prefilter(searcher.artifacts, searcher.config.prefilter)
    return result
