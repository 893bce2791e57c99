"""EM split by test-train overlap (Lewis et al., EACL 2021): how much of a reader's EM is on test
questions that paraphrase a training question, on those whose answer is only a training answer, and
on the rest (common/metrics/overlap.py says how each part is found).

    python scripts/overlap_em.py --train nq-dev --predictions PRED-k10.jsonl --retrieval RETRIEVAL.json

PRED is what `odqa read` writes (id, question, answers, prediction, em); several may be given, one
column each. RETRIEVAL is what `odqa retrieve` writes: its "prediction" is the extractive answer, and
its passages give Top-k. The test questions are those of the first file given; every other file must
hold them all. Prints a Markdown table and one JSON line.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from odqa.common.io import InputError, read_jsonl
from odqa.common.metrics.answers import answer_em
from odqa.common.metrics.overlap import PARTS, overlap_parts
from odqa.common.questions import load_questions
from odqa.common.retrieval_file import read_results
from odqa.common.settings import range_error


def _by_id(rows: list[dict], path: str) -> dict[str, dict]:
    for i, row in enumerate(rows):
        if "id" not in row or "question" not in row or "answers" not in row:
            raise InputError(f"{path}: entry {i} needs \"id\", \"question\" and \"answers\"")
        if row.get("regex"):
            raise InputError(f"{path}: {row['id']} has regex answers, which no training answer can overlap")
    return {str(row["id"]): row for row in rows}


def split_em(test: dict[str, dict], columns: dict[str, dict[str, bool]], train: list[tuple[str, list[str]]],
             threshold: float, topk: dict[str, bool] | None = None) -> list[dict]:
    """One row per part (and one for all): its questions and each column's right answers."""
    ids = list(test)
    parts = overlap_parts([(test[i]["question"], test[i]["answers"]) for i in ids], train, threshold)
    rows = []
    for part in (*PARTS, "all"):
        members = [i for i, p in zip(ids, parts) if part in ("all", p["part"])]
        row = {"part": part, "questions": len(members)}
        if topk is not None:
            row["top-k"] = sum(topk[i] for i in members)
        row.update({name: sum(right[i] for i in members) for name, right in columns.items()})
        rows.append(row)
    return rows


def ranged(conv, rule: str):
    """An argparse type: `conv`, then odqa's range rule (common.settings.range_error)."""
    def parse(text: str):
        try:
            value = conv(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        said = range_error(rule, value, conv is int)
        if said:
            raise argparse.ArgumentTypeError(said)
        return value
    parse.__name__ = conv.__name__
    return parse


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--train", nargs="+", required=True,
                   help="training question sets: names (nq-dev), JSONL or DPR .qa.csv paths; several are joined")
    p.add_argument("--predictions", nargs="*", default=[], help="`odqa read` output files, one column each")
    p.add_argument("--retrieval", default=None,
                   help="`odqa retrieve` output: the extractive answer's column, and Top-k")
    p.add_argument("--k", type=ranged(int, "positive"), default=10, help="Top-k of --retrieval's passages (default 10)")
    p.add_argument("--threshold", type=ranged(float, "share"), default=0.7,
                   help="TF-IDF cosine from which a test question paraphrases its nearest training one (default 0.7)")
    args = p.parse_args()
    if not args.predictions and not args.retrieval:
        p.error("give --predictions, --retrieval or both")
    try:
        for path in args.predictions:
            if args.predictions.count(path) > 1:
                raise InputError(f"{path}: given twice")
        train = [(q.question, q.answers) for name in args.train for q in load_questions(name)]
        columns, test, topk = {}, None, None
        if args.retrieval:
            entries = _by_id(read_results(args.retrieval), args.retrieval)
            test = entries
            columns["extractive"] = {i: answer_em(e.get("prediction", ""), e["answers"]) for i, e in entries.items()}
            short = [i for i, e in entries.items() if len(e["ctxs"]) < args.k]
            if short and all(len(e["ctxs"]) < args.k for e in entries.values()):
                raise InputError(f"{args.retrieval}: at most {max(len(e['ctxs']) for e in entries.values())} passages a "
                                 f"question, so it has no Top-{args.k}: give a smaller --k")
            topk = {i: any(c.get("has_answer") for c in e["ctxs"][:args.k]) for i, e in entries.items()}
        for path in args.predictions:
            preds = _by_id([obj for _, obj in read_jsonl(path)], path)
            test = test or preds
            name = Path(path).stem
            if name in columns:     # two runs' pred-nq-test-k10.jsonl: name each by its folder too
                name = f"{Path(path).parent.name}/{name}"
            columns[name] = {i: bool(pr.get("em")) for i, pr in preds.items()}
        for name, right in columns.items():   # every file holds the same questions
            missing = [i for i in test if i not in right]
            if missing:
                raise InputError(f"{name}: no answer for {len(missing)} of the test questions ({missing[0]}, ...)")
            extra = [i for i in right if i not in test]
            if extra:
                raise InputError(f"{name}: {len(extra)} questions the first file does not hold ({extra[0]}, ...): "
                                 f"give files of one question set")
        rows = split_em(test, columns, train, args.threshold, topk)
    except InputError as e:
        print(f"overlap_em: {e}", file=sys.stderr)
        return 2
    heads = ["questions", *([f"Top-{args.k}"] if topk is not None else []), *columns]
    keys = ["questions", *(["top-k"] if topk is not None else []), *columns]
    print("| part | " + " | ".join(heads) + " |")
    print("|---|" + "---:|" * len(heads))
    for row in rows:
        print(f"| {row['part']} | " + " | ".join(str(row[k]) for k in keys) + " |")
    print(json.dumps({"threshold": args.threshold, "k": args.k, "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
