"""Bytes per passage against Top-k for phrase index variants of one dump: the share of tokens the
phrase filter keeps, and the faiss index factory (Flat, SQ, PQ).

    python scripts/bench_index.py --dump RUN/phrase-dump --model RUN/phrase/best [--questions nq-test]
        [--variants 1:Flat 0.2:Flat 0.2:IVF256,SQ8 0.2:IVF256,PQ16 ...] [--out /tmp/bench-index]

Each variant is built with `build_index` (every byte of its directory counted), searched over every
question of the set with `retrieve_phrases` (k = 20, no pre-filter), and scored on the answerable
subset; the Flat index that keeps every token is the reference the others are compared with.
"""
from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from odqa.common.paths import default_corpus
from odqa.common.questions import load_questions
from odqa.common.retrieval_eval import answerable_flags, evaluate_results
from odqa.retriever.args import BuildIndexArgs
from odqa.retriever.index_build import build_index
from odqa.retriever.retrieve import retrieve_phrases
from odqa.retriever.searcher import Searcher

DEFAULT_VARIANTS = ["1:Flat", "0.2:Flat", "0.2:IVF256,SQ8", "0.2:IVF256,SQ4", "0.2:IVF256,PQ16", "0.25:IVF256,PQ16",
                    "0.25:IVF256,PQ12", "0.3:IVF256,PQ8"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dump", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--corpus", default=str(default_corpus()))
    p.add_argument("--questions", default="nq-test")
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--variants", nargs="+", default=DEFAULT_VARIANTS, help="KEEP:FACTORY pairs")
    p.add_argument("--out", dest="out_dir", default="/tmp/bench-index", help="where the variants are built (removed after)")
    args = p.parse_args()
    questions = load_questions(args.questions, limit=args.limit)
    rows, answerable = [], None
    for variant in args.variants:
        keep, factory = variant.split(":", 1)
        out = Path(args.out_dir) / variant.replace(":", "_").replace(",", "_")
        shutil.rmtree(out, ignore_errors=True)
        m = build_index(BuildIndexArgs(dump=args.dump, out=out, corpus=args.corpus, factory=factory, keep=float(keep)))
        entries = retrieve_phrases(Searcher.open(out, args.model, args.corpus), questions, 20)
        answerable = answerable or answerable_flags(entries, args.corpus)
        metrics = evaluate_results(entries, answerable, (5, 20))["answerable"]
        rows.append((float(keep), factory, m["vectors_per_passage"], m["bytes_per_passage"], metrics))
        print(f"{variant}: {m['bytes_per_passage']:,.0f} bytes per passage, Top-5 {metrics['Top-5']:.1f}", file=sys.stderr,
              flush=True)
        shutil.rmtree(out)
    print(f"{sum(answerable)} answerable questions of {len(questions)} in {args.questions}; top 20 passages, no pre-filter")
    print("| tokens kept | index | vectors / passage | bytes / passage | Top-5 | Top-20 |")
    print("|---:|---|---:|---:|---:|---:|")
    for keep, factory, vpp, bpp, m in rows:
        print(f"| {100 * keep:.0f}% | {factory} | {vpp:.1f} | {bpp:,.0f} | {m['Top-5']:.1f} | {m['Top-20']:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
