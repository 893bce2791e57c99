"""What the phrase filter keeps at each threshold of `odqa dump-phrases --threshold`, on supervision
passages: the share of text tokens kept (so vectors per passage), the recall of answer phrases (both
boundary tokens kept) and the EM of the best phrase of the gold passage among the kept tokens.

    python scripts/filter_recall.py --model RUN/best [--examples SUPERVISION/validation.jsonl] [--limit 400]
"""
from __future__ import annotations

import argparse

from odqa.common.defaults import default_supervision
from odqa.retriever.phrase_train import filter_report
from odqa.retriever.supervise import load_examples


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="phrase model checkpoint")
    ap.add_argument("--examples", default=str(default_supervision() / "validation.jsonl"))
    ap.add_argument("--limit", type=int, default=400, help="first N examples (0: all)")
    ap.add_argument("--thresholds", type=float, nargs="+", default=[-1.2, -1.0, -0.8, -0.6, -0.4, 0.0])
    args = ap.parse_args()
    examples = load_examples(args.examples, args.limit or None)
    rows = filter_report(args.model, examples, [None, *args.thresholds])
    print(f"{len(examples)} examples of {args.examples} ({rows[0]['answerable']} whose answer survives "
          f"truncation)")
    print("| filter threshold | text tokens kept | answer phrases kept | EM on the gold passage |")
    print("|---:|---:|---:|---:|")
    for r in rows:
        t = "none" if r["threshold"] is None else f"{r['threshold']:.1f}"
        print(f"| {t} | {100 * r['share_kept']:.1f}% | {100 * r['answer_recall']:.1f}% | {100 * r['em']:.1f} |")


if __name__ == "__main__":
    main()
