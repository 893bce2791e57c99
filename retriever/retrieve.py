"""Run any retriever over a question set and write DPR's retrieval-results file.

A retriever here is anything with `search_passages(questions, k) -> (rows, scores)`, rows indexing
the corpus's passages.jsonl.
"""
from __future__ import annotations

import logging
from functools import lru_cache
from typing import Protocol, Sequence

import numpy as np
from tqdm import tqdm

from common.corpus import PassageStore
from common.metrics.has_answer import TokenizedText
from common.questions import Question
from common.retrieval_file import make_entry

log = logging.getLogger(__name__)


class Retriever(Protocol):
    def search_passages(self, questions: list[str], k: int) -> tuple[np.ndarray, np.ndarray]: ...


def retrieve(retriever: Retriever, store: PassageStore, questions: Sequence[Question], k: int,
             batch_size: int = 256) -> list[dict]:
    # Popular passages come back for many questions: read and tokenise each once.
    @lru_cache(maxsize=200_000)
    def passage(row: int) -> tuple[dict, TokenizedText]:
        p = store[row]
        return p, TokenizedText(p["text"])

    entries = []
    for start in tqdm(range(0, len(questions), batch_size), desc="retrieve", unit=" batches", disable=None):
        batch = questions[start:start + batch_size]
        texts = [q.question for q in batch]
        # Phrase retrieval also answers: its top phrase is the extractive prediction.
        phrase_results = retriever.search(texts, k, unit="passage") if hasattr(retriever, "search") else None
        if phrase_results is not None:
            rows = [np.array([p["row"] for p in r["passages"]], dtype=np.int64) for r in phrase_results]
            scores = [np.array([p["score"] for p in r["passages"]], dtype=np.float32) for r in phrase_results]
        else:
            rows, scores = retriever.search_passages(texts, k)
        for n, (q, q_rows, q_scores) in enumerate(zip(batch, rows, scores)):
            keep = q_rows >= 0  # a retriever may find fewer than k passages
            q_rows, q_scores = q_rows[keep], q_scores[keep]
            hits = [passage(int(r)) for r in q_rows]
            entry = make_entry(q, [p for p, _ in hits], q_scores, [t for _, t in hits])
            if phrase_results is not None:
                r = phrase_results[n]
                entry["prediction"] = r["phrases"][0]["text"] if r["phrases"] else ""
                for ctx, p in zip(entry["ctxs"], r["passages"]):
                    ctx["phrase"] = {k: p["phrase"][k] for k in ("text", "char_start", "char_end", "score")}
            entries.append(entry)
    return entries
