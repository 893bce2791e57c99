"""DPR's retrieval-results format, read by the metrics here and by the FiD reader:

    [{"id", "question", "answers", "regex", "ctxs": [{"id", "title", "text", "score", "has_answer"}, ...]}, ...]

ctxs are ranked best first. `id` and `regex` are additions to DPR's keys; files without them load too.
`write_trec` writes the same ranking as a TREC run file, which trec_eval and pyserini's tools read:
one `QID Q0 DOCID RANK SCORE TAG` line a passage, white space in an id percent-encoded.
"""
from __future__ import annotations

import os
from typing import Sequence

from odqa.common.io import InputError, plain_suffix, read_json, read_jsonl, write_json_array
from odqa.common.metrics.has_answer import TokenizedText, has_answer
from odqa.common.questions import Question


def make_entry(q: Question, passages: Sequence[dict], scores: Sequence[float],
               tokens: Sequence[TokenizedText] | None = None) -> dict:
    """`tokens[i]`, if given, is TokenizedText(passages[i]["text"]), reused across questions."""
    tokens = tokens or [None] * len(passages)
    return {
        "id": q.id, "question": q.question, "answers": q.answers, "regex": q.regex,
        # NQ-open's own answers beside DPR's tokenised ones, for EM as FiD scores it
        **({"answers_raw": q.extra["answers_raw"]} if isinstance(q.extra.get("answers_raw"), list) else {}),
        "ctxs": [{"id": p["id"], "title": p["title"], "text": p["text"], "score": float(s),
                  "has_answer": has_answer(p["text"], q.answers, q.regex, tokens=t)}
                 for p, s, t in zip(passages, scores, tokens)],
    }


def write_results(path: str | os.PathLike, entries: list[dict]) -> None:
    write_json_array(path, entries)


def trec_id(text: str) -> str:
    """An id as a TREC run's field: white space (a title's, in odqa's passage ids) and "%" percent-encoded,
    as `urllib.parse.unquote` reads back ("William Shakespeare#1" -> "William%20Shakespeare#1")."""
    from urllib.parse import quote
    return "".join(quote(c) if c.isspace() or c == "%" else c for c in str(text))


def write_trec(path: str | os.PathLike, entries: list[dict], tag: str) -> None:
    """`entries` as a TREC run: a line a ctx, rank from 1, the question's and the passage's ids as
    `trec_id` writes them. Written whole under a temporary name, then renamed."""
    from odqa.common.io import atomic_path
    lines = [f"{trec_id(e['id'])} Q0 {trec_id(ctx['id'])} {rank} {ctx['score']:.6f} {tag}\n"
             for e in entries for rank, ctx in enumerate(e["ctxs"], 1)]
    with atomic_path(path) as tmp:
        tmp.write_text("".join(lines), encoding="utf-8")


def read_results(path: str | os.PathLike, flags: bool = True) -> list[dict]:
    """The entries of a DPR-format file, checked; `flags=False`: ctxs may lack "has_answer" (FiD's files),
    for the caller to compute (`retrieval_eval.recompute_flags`). A .jsonl file holds an entry a line (odqa's
    FiD files)."""
    data = [row for _, row in read_jsonl(path)] if plain_suffix(path) == ".jsonl" else read_json(path)
    if not isinstance(data, list):
        raise InputError(f"{path}: expected a JSON list of questions with ctxs")
    if not data:    # every metric over it would be a 0.0 that measures nothing
        raise InputError(f"{path}: holds no questions")
    for i, entry in enumerate(data):
        if not isinstance(entry, dict) or "question" not in entry or not isinstance(entry.get("ctxs"), list):
            raise InputError(f"{path}: entry {i} needs \"question\" and a \"ctxs\" list")
        for j, ctx in enumerate(entry["ctxs"]):
            if not isinstance(ctx, dict) or (flags and "has_answer" not in ctx):
                raise InputError(f"{path}: entry {i}, ctx {j} has no \"has_answer\"" + (
                    " (give --recompute-has-answer to compute the flags from the ctxs' texts)" if flags else ""))
            if not flags and not isinstance(ctx.get("text"), str):
                raise InputError(f"{path}: entry {i}, ctx {j} has no \"text\" to find an answer in")
        answers = entry.get("answers")
        if not isinstance(answers, list) or not all(isinstance(a, str) for a in answers):
            raise InputError(f"{path}: entry {i}: \"answers\" must be a list of strings")
        if not isinstance(entry.get("prediction", ""), str):
            raise InputError(f"{path}: entry {i}: \"prediction\" must be a string")
    return data


def gold_entry(row: dict) -> dict:
    """A distant-supervision row (`odqa supervise`: question, answers, passage_id, title, text,
    answer_char_spans) as a FiD entry whose one ctx is that answer-bearing passage, with the answer as
    the passage writes it as the target: a reader's k = 1 practice on the evidence alone."""
    spans = row.get("answer_char_spans") or []
    target = row["text"][spans[0][0]:spans[0][1]] if spans else None
    return {"id": row.get("id", ""), "question": row["question"], "answers": row["answers"],
            "regex": row.get("regex", False), **({"target": target} if target else {}),
            "ctxs": [{"id": row.get("passage_id", ""), "title": row.get("title", ""), "text": row["text"],
                      "score": 1.0, "has_answer": True}]}
