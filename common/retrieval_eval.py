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
from odqa.common.metrics.answers import NQ_OPEN, answer_em
from odqa.common.metrics.has_answer import has_answer
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


def recompute_flags(entries: Sequence[dict]) -> int:
    """Set each ctx's "has_answer" from its text and the entry's answers, as DPR's and FiD's evaluation
    scripts compute it (`common.metrics.has_answer`, DPR's tokenisation and regex rules); returns how
    many ctxs held a flag that disagreed."""
    disagree = 0
    for e in entries:
        for ctx in e["ctxs"]:
            flag = has_answer(ctx.get("text") or "", e["answers"], bool(e.get("regex")))
            disagree += "has_answer" in ctx and bool(ctx["has_answer"]) != flag
            ctx["has_answer"] = flag
    return disagree


def evaluate_results(entries: Sequence[dict], answerable: Sequence[bool] | None = None,
                     ks: Sequence[int] = DEFAULT_TOPK) -> dict[str, dict]:
    """Retrieval metrics, each only as deep as the file is (its shallowest question's ctxs); and EM of the
    extractive answers where the file has them: "extractive EM" of the phrase answer (its
    "prediction_without_memory" where an answer memory helped, else its "prediction"), "extractive +
    memory EM" of the memory-assisted "prediction", and each one's "(Top-1 hit)": its EM over the
    questions whose first passage holds an answer (how well the phrase is read where the passage is
    right). Where the entries carry "answers_raw" (NQ: NQ-open's own answers, which FiD's data scores;
    "answers" are DPR's, PTB-tokenised: "May 18 , 2018"), each EM has an "(NQ-open answers)" twin."""
    hits = [[bool(c["has_answer"]) for c in e["ctxs"]] for e in entries]
    depth = min(len(h) for h in hits)   # the file's depth: past it no question's ranks are known
    answers = {"": [e["answers"] for e in entries]}
    if all(isinstance(e.get("answers_raw"), list) for e in entries):
        answers[NQ_OPEN] = [e["answers_raw"] for e in entries]
    predictions = {}
    if all("prediction" in e for e in entries):
        helped = any("prediction_without_memory" in e for e in entries)
        predictions["extractive EM"] = [e.get("prediction_without_memory", e["prediction"]) for e in entries]
        if helped:
            predictions["extractive + memory EM"] = [e["prediction"] for e in entries]
    em = {f"{name}{suffix}": [answer_em(p, golds, bool(e.get("regex"))) for p, golds, e in zip(said, gold, entries)]
          for name, said in predictions.items() for suffix, gold in answers.items()}
    subsets = {"all": [True] * len(entries)}
    if answerable is not None:
        subsets["answerable"] = list(answerable)
    out = {}
    for name, keep in subsets.items():
        out[name] = retrieval_metrics([h for h, k in zip(hits, keep) if k], ks, depth=depth)
        out[name]["depth"] = depth
        for column, scores in em.items():
            kept = [x for x, k in zip(scores, keep) if k]
            out[name][column] = 100.0 * sum(kept) / max(len(kept), 1)
            read = [x for x, h, k in zip(scores, hits, keep) if k and h[:1] == [True]]
            if read:    # else left out (the table shows "-"): no first passage held an answer to read
                out[name][column.replace(" EM", " EM (Top-1 hit)", 1)] = 100.0 * sum(read) / len(read)
    return out


def format_table(rows: dict[str, dict[str, dict]]) -> str:
    """A Markdown table: one row per (run, subset), one column per metric."""
    header = []
    for subsets in rows.values():
        for metrics in subsets.values():
            header += [k for k in metrics if k not in ("questions", "depth") and k not in header]
    lines = ["| run | subset | questions | " + " | ".join(header) + " |", "|---|---|---:|" + "---:|" * len(header)]
    for name, subsets in rows.items():
        for subset, metrics in subsets.items():
            lines.append(f"| {name} | {subset} | {metrics['questions']} | "
                         + " | ".join(f"{metrics[k]:.1f}" if metrics.get(k) is not None else "-" for k in header) + " |")
    return "\n".join(lines)
