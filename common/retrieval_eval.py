"""`odqa eval-retrieval`: Top-k, MRR@k and P@k of a retrieval file, on all questions and on the
answerable subset (questions with an answer-bearing passage anywhere in the corpus).

Answerable flags cost a pass over the corpus (about 100 s for CuratedTREC's regexes), so they are
cached in CORPUS/answerable/, keyed by the corpus fingerprint and the questions' answers.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Sequence

from odqa.common.answer_index import AnswerIndex
from odqa.common.artifact import fingerprint
from odqa.common.corpus import corpus_info
from odqa.common.io import read_json, write_json
from odqa.common.metrics.answers import answer_em
from odqa.common.metrics.retrieval import DEFAULT_TOPK, retrieval_metrics

log = logging.getLogger(__name__)


def answerable_flags(entries: Sequence[dict], corpus_dir: str | os.PathLike) -> list[bool]:
    corpus_dir = Path(corpus_dir)
    key = fingerprint([corpus_info(corpus_dir)["fingerprint"]] + [[e["answers"], bool(e.get("regex"))] for e in entries])
    cache = corpus_dir / "answerable" / f"{key}.json"
    if cache.exists():
        return read_json(cache)
    index = AnswerIndex.open(corpus_dir)
    flags = [bool(index.find(e["answers"], bool(e.get("regex")))) for e in entries]
    write_json(cache, flags, indent=None)
    log.info("%d of %d questions have an answer-bearing passage in %s", sum(flags), len(flags), corpus_dir)
    return flags


def evaluate_results(entries: Sequence[dict], answerable: Sequence[bool] | None = None,
                     ks: Sequence[int] = DEFAULT_TOPK) -> dict[str, dict]:
    """Retrieval metrics; and EM of the extractive answer where the file has one ("prediction"), with
    "EM (Top-1 hit)", its EM over the questions whose first passage holds an answer: for phrase
    retrieval, whose answer is the first passage's phrase, how well the phrase is read where the
    passage is right."""
    hits = [[bool(c["has_answer"]) for c in e["ctxs"]] for e in entries]
    with_prediction = all("prediction" in e for e in entries)
    em = [answer_em(e["prediction"], e["answers"], bool(e.get("regex"))) for e in entries] if with_prediction else None
    subsets = {"all": [True] * len(entries)}
    if answerable is not None:
        subsets["answerable"] = list(answerable)
    out = {}
    for name, keep in subsets.items():
        out[name] = retrieval_metrics([h for h, k in zip(hits, keep) if k], ks)
        if em is not None:
            kept = [x for x, k in zip(em, keep) if k]
            out[name]["EM"] = 100.0 * sum(kept) / max(len(kept), 1)
            read = [x for x, h, k in zip(em, hits, keep) if k and h[:1] == [True]]
            if read:    # else left out (the table shows "-"): no first passage held an answer to read
                out[name]["EM (Top-1 hit)"] = 100.0 * sum(read) / len(read)
    return out


def format_table(rows: dict[str, dict[str, dict]]) -> str:
    """A Markdown table: one row per (run, subset), one column per metric."""
    header = []
    for subsets in rows.values():
        for metrics in subsets.values():
            header += [k for k in metrics if k != "questions" and k not in header]
    lines = ["| run | subset | questions | " + " | ".join(header) + " |", "|---|---|---:|" + "---:|" * len(header)]
    for name, subsets in rows.items():
        for subset, metrics in subsets.items():
            lines.append(f"| {name} | {subset} | {metrics['questions']} | "
                         + " | ".join(f"{metrics[k]:.1f}" if k in metrics else "-" for k in header) + " |")
    return "\n".join(lines)
