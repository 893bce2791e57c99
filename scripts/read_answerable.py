"""Generated EM at several k over a whole question set, reading only the questions whose top-k passages
hold an answer: a span-constrained reader cannot answer the others (their passages hold no answer), so
the EM over every question is the same at a fraction of the reading time.

    python scripts/read_answerable.py --model READER --retrieval RETRIEVAL.json --ks 5 10 25 --out-dir DIR

RETRIEVAL.json is what `odqa retrieve` writes (with has_answer and the extractive answer as "prediction").
Prints one JSON line: Top-k, the extractive answer's EM, generated EM at each k and its share of Top-k.
The reader reads in `search_dtype` (bfloat16 where the CPU computes it natively; ODQA_SEARCH_DTYPE=float32
reads in float32).
For the whole-set measurement, `odqa run` reads every question. `--oracle all` (or `first`) reads, at one
k, only the answer-bearing passages of each question's top k (or the first of them): how well the
reader reads when the passages are chosen perfectly.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from odqa.common.retrieval_eval import evaluate_results
from odqa.reader.args import ReaderSettings
from odqa.reader.read import load_reader, read

ORACLES = ("all", "first")


def oracle_passages(ctxs: list[dict], oracle: str) -> list[dict]:
    """The answer-bearing passages of `ctxs` in their order (`all`), or the first of them (`first`)."""
    bearing = [c for c in ctxs if c["has_answer"]]
    return bearing[:1] if oracle == "first" else bearing


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--retrieval", required=True, help="`odqa retrieve` output (JSON list)")
    p.add_argument("--ks", type=int, nargs="+", default=[5, 10, 25])
    p.add_argument("--out-dir", required=True, help="the subset and the predictions at each k go here")
    p.add_argument("--text-maxlength", type=int, default=160)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--keep-echoes", action="store_true", help="do not decode again answers that repeat the question")
    p.add_argument("--oracle", choices=ORACLES, default=None,
                   help="a ceiling for choosing passages (one k): read only the answer-bearing passages of each "
                        "question's top k (all), or only the first of them (first)")
    args = p.parse_args()
    ks, out = sorted(set(args.ks)), Path(args.out_dir)
    if args.oracle and len(ks) > 1:
        p.error("--oracle reads at one k: give --ks one value")
    torch.set_num_threads(args.threads)
    full = json.loads(Path(args.retrieval).read_text(encoding="utf-8"))
    out.mkdir(parents=True, exist_ok=True)
    subset = [e for e in full if any(c["has_answer"] for c in e["ctxs"][:ks[-1]])]
    if args.oracle:
        subset = [{**e, "ctxs": oracle_passages(e["ctxs"][:ks[0]], args.oracle)} for e in subset]
    name = Path(args.retrieval).stem + (f"-oracle-{args.oracle}" if args.oracle else "")
    (out / f"{name}-answerable.json").write_text(json.dumps(subset, ensure_ascii=False), encoding="utf-8")
    model, tokenizer = load_reader(args.model)
    read_ = read(model, tokenizer, out / f"{name}-answerable.json", {k: out / f"{name}-pred-k{k}.jsonl" for k in ks},
                 ReaderSettings(text_maxlength=args.text_maxlength), refuse_echoes=not args.keep_echoes)
    n, metrics = len(full), evaluate_results(full, ks=ks)["all"]     # Top-k and the extractive answer's EM
    row = {"questions": n, "read": len(subset), "seconds": round(read_[ks[0]]["seconds"]),
           "extractive_em": round(metrics["EM"], 2)}
    for k in ks:
        correct = read_[k]["em"] * read_[k]["scored"] / 100
        row.update({f"top{k}": round(metrics[f"Top-{k}"], 2), f"em{k}": round(100 * correct / n, 2),
                    f"em{k}/top{k}": round(100 * correct / max(metrics[f"Top-{k}"] * n / 100, 1), 1)})
    print(json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
