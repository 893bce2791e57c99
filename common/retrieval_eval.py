"""`odqa eval-retrieval`: Top-k, MRR@k and P@k of a retrieval file, on all questions and on the
answerable subset (questions with an answer-bearing passage anywhere in the corpus).

Answerable flags cost a pass over the corpus (about 100 s for CuratedTREC's regexes), so they are
cached in CORPUS/answerable/, keyed by the corpus fingerprint and the questions' answers.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Sequence

from common.answer_index import AnswerIndex
from common.corpus import PassageStore, corpus_info
from common.io import read_json, write_json
from common.metrics.retrieval import DEFAULT_TOPK, retrieval_metrics

log = logging.getLogger(__name__)


def answerable_flags(entries: Sequence[dict], corpus_dir: str | os.PathLike) -> list[bool]:
    corpus_dir = Path(corpus_dir)
    key = hashlib.sha256(json.dumps(
        [corpus_info(corpus_dir)["fingerprint"]] + [[e["answers"], bool(e.get("regex"))] for e in entries],
        ensure_ascii=False).encode()).hexdigest()[:16]
    cache = corpus_dir / "answerable" / f"{key}.json"
    if cache.exists():
        return read_json(cache)
    store = PassageStore(corpus_dir)
    index = AnswerIndex((p["text"] for p in store), total=len(store))
    store.close()
    flags = [bool(index.find(e["answers"], bool(e.get("regex")))) for e in entries]
    write_json(cache, flags, indent=None)
    log.info("%d of %d questions have an answer-bearing passage in %s", sum(flags), len(flags), corpus_dir)
    return flags


def evaluate_results(entries: Sequence[dict], answerable: Sequence[bool] | None = None,
                     ks: Sequence[int] = DEFAULT_TOPK) -> dict[str, dict]:
    hits = [[bool(c["has_answer"]) for c in e["ctxs"]] for e in entries]
    out = {"all": retrieval_metrics(hits, ks)}
    if answerable is not None:
        out["answerable"] = retrieval_metrics([h for h, a in zip(hits, answerable) if a], ks)
    return out


def format_table(rows: dict[str, dict[str, dict]]) -> str:
    """A Markdown table: one row per (run, subset), one column per metric."""
    lines, header = [], None
    for name, subsets in rows.items():
        for subset, metrics in subsets.items():
            if header is None:
                header = [k for k in metrics if k != "questions"]
                lines.append("| run | subset | questions | " + " | ".join(header) + " |")
                lines.append("|---|---|---:|" + "---:|" * len(header))
            lines.append(f"| {name} | {subset} | {metrics['questions']} | "
                         + " | ".join(f"{metrics[k]:.1f}" for k in header) + " |")
    return "\n".join(lines)
