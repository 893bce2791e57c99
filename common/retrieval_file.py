"""DPR's retrieval-results format, read by the metrics here and by the FiD reader:

    [{"id", "question", "answers", "regex", "ctxs": [{"id", "title", "text", "score", "has_answer"}, ...]}, ...]

ctxs are ranked best first. `id` and `regex` are additions to DPR's keys; files without them load too.
"""
from __future__ import annotations

import os
from typing import Sequence

from common.io import InputError, read_json, write_json
from common.metrics.has_answer import TokenizedText, has_answer
from common.questions import Question


def make_entry(q: Question, passages: Sequence[dict], scores: Sequence[float],
               tokens: Sequence[TokenizedText] | None = None) -> dict:
    """`tokens[i]`, if given, is TokenizedText(passages[i]["text"]), reused across questions."""
    tokens = tokens or [None] * len(passages)
    return {
        "id": q.id, "question": q.question, "answers": q.answers, "regex": q.regex,
        "ctxs": [{"id": p["id"], "title": p["title"], "text": p["text"], "score": float(s),
                  "has_answer": has_answer(p["text"], q.answers, q.regex, tokens=t)}
                 for p, s, t in zip(passages, scores, tokens)],
    }


def write_results(path: str | os.PathLike, entries: list[dict]) -> None:
    write_json(path, entries, indent=None)


def read_results(path: str | os.PathLike) -> list[dict]:
    data = read_json(path)
    if not isinstance(data, list):
        raise InputError(f"{path}: expected a JSON list of questions with ctxs")
    for i, entry in enumerate(data):
        if not isinstance(entry, dict) or "question" not in entry or not isinstance(entry.get("ctxs"), list):
            raise InputError(f"{path}: entry {i} needs \"question\" and a \"ctxs\" list")
        for j, ctx in enumerate(entry["ctxs"]):
            if not isinstance(ctx, dict) or "has_answer" not in ctx:
                raise InputError(f"{path}: entry {i}, ctx {j} has no \"has_answer\"")
    return data
