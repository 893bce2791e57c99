"""Where a reader's answers come from: over the questions with an answer in their top k, how many it
gets right, and for each wrong answer whether its string occurs only in passages that do not hold
the answer, only in answer-bearing ones, or in both; then how often the extractive answer (the
retrieval file's "prediction") and the generated one are right together and apart.

    python scripts/reader_errors.py --retrieval RETRIEVAL.json --predictions PRED-k10.jsonl --k 10

RETRIEVAL.json is what `odqa retrieve` writes; PRED is `odqa read` or `scripts/read_answerable.py`
output for those questions (any subset of them) at k. Prints a Markdown table and one JSON line.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import Counter

from odqa.common.io import InputError, read_jsonl
from odqa.common.metrics.answers import answer_em
from odqa.common.retrieval_file import read_results


def source(prediction: str, ctxs: list[dict]) -> str:
    """Which kind of the k passages spells `prediction`: 'negative', 'positive', 'both' or 'none'."""
    def spelt(c: dict) -> bool:
        return prediction in c["text"] or prediction in c.get("title", "")
    pos = any(spelt(c) for c in ctxs if c["has_answer"])
    neg = any(spelt(c) for c in ctxs if not c["has_answer"])
    return "both" if pos and neg else "positive" if pos else "negative" if neg else "none"


def breakdown(entries: list[dict], predictions: dict[str, dict], k: int) -> dict:
    rows = Counter()
    extractive, generated = set(), set()
    for e in entries:
        if answer_em(e.get("prediction", ""), e["answers"], bool(e.get("regex"))):
            extractive.add(e["id"])
        p = predictions.get(e["id"])
        if p is not None and p["em"]:
            generated.add(e["id"])
        ctxs = e["ctxs"][:k]
        if not any(c["has_answer"] for c in ctxs):
            continue
        rows["answerable"] += 1
        if p is None:
            raise InputError(f"no prediction for {e['id']}, whose top {k} hold an answer")
        rows["right" if p["em"] else f"wrong from {source(p['prediction'], ctxs)}"] += 1
    return {"questions": len(entries), "k": k, **{key: rows[key] for key in
            ("answerable", "right", "wrong from negative", "wrong from positive", "wrong from both", "wrong from none")},
            "extractive_right": len(extractive), "generated_right": len(generated),
            "both_right": len(extractive & generated), "either_right": len(extractive | generated)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--retrieval", required=True, help="`odqa retrieve` output (JSON list, with has_answer)")
    p.add_argument("--predictions", required=True, help="predictions JSONL at --k (id, prediction, em)")
    p.add_argument("--k", type=int, default=10)
    args = p.parse_args()
    try:
        entries = read_results(args.retrieval)
        predictions = {obj["id"]: obj for _, obj in read_jsonl(args.predictions)}
        row = breakdown(entries, predictions, args.k)
    except (KeyError, InputError) as e:
        print(f"reader_errors: {e}", file=sys.stderr)
        return 2
    print("| answer in top k | right | wrong, from passages without the answer only | from answer-bearing ones only "
          "| from both kinds | from neither |")
    print("|---:|---:|---:|---:|---:|---:|")
    print(f"| {row['answerable']} | {row['right']} | {row['wrong from negative']} | {row['wrong from positive']} "
          f"| {row['wrong from both']} | {row['wrong from none']} |")
    print(json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
