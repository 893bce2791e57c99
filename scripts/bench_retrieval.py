"""Questions/s of phrase retrieval next to the dense and BM25 retrievers, in one run, each timed as a
whole `odqa retrieve` command (start, load, encode, search, write the DPR file), as a user runs it.

    python scripts/bench_retrieval.py [--questions nq-test] [--n 1000] [--k 100] [--index I --model M]

Phrase retrieval searches the default pipeline's index (`odqa demo`) unless --index/--model name
others, over every phrase (also without the answer filter, to show its cost) and behind the default
pipeline's document pre-filter (also without the rerank's BM25 term, and without the answer memory, to
show their costs).
The commands run one after another, so they share the machine's load; --repeat N runs N rounds of them all
and takes each one's best. Each first runs once on one question, untimed: the dense retriever encodes the
corpus on its first use (84 s of a 2-core CPU, which made dense look 8x slower than phrase retrieval on a
new machine), and the timings compare searches, not that one-off build.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def timed(cmd: list[str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"{' '.join(cmd)} failed:\n{done.stderr[-2000:]}")
    return time.perf_counter() - start


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--questions", default="nq-test")
    p.add_argument("--n", type=int, default=1000, help="first N questions (default 1000)")
    p.add_argument("--k", type=int, default=100, help="passages per question (default 100)")
    p.add_argument("--index", default=None, help="phrase index (default: the default pipeline's)")
    p.add_argument("--model", default=None, help="phrase model (default: the default pipeline's)")
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--only", nargs="+", default=None, metavar="NAME",
                   help="run only these (dense, bm25, phrase: the default pipeline's; every, unfiltered, no-bm25, "
                        "no-memory)")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = [sys.executable, "-m", "odqa.system.cli", "-q", "retrieve", "--questions", args.questions,
                "--limit", str(args.n), "--k", str(args.k)]
        # the phrase retriever itself: a passage reranker the default pipeline may have is left out
        phrase = base + ["--retriever", "phrase", "--no-reranker"] + (["--index", args.index] if args.index else []) \
            + (["--model", args.model] if args.model else [])
        runs = {
            "dense (MiniLM mean-pooled, Flat)": ("dense", base + ["--retriever", "dense"]),
            "BM25": ("bm25", base + ["--retriever", "bm25"]),
            "phrase, every phrase": ("every", phrase + ["--no-prefilter"]),
            "phrase, every phrase, without the answer filter": ("unfiltered", phrase + ["--no-prefilter",
                                                                                       "--no-answer-filter"]),
            "phrase, behind the document pre-filter": ("phrase", phrase),
            "phrase, behind the document pre-filter, without the BM25 term": ("no-bm25", phrase + ["--bm25-weight", "0"]),
            "phrase, behind the document pre-filter, without the answer memory": ("no-memory", phrase + ["--no-memory"]),
        }
        runs = {name: cmd for name, (short, cmd) in runs.items() if args.only is None or short in args.only}
        top = {}
        for cmd in runs.values():   # what a retriever builds on its first use is built before the timing
            timed(cmd + ["--limit", "1", "--out", str(Path(tmp) / "warm.json")])   # the last --limit counts
        seconds = {name: float("inf") for name in runs}
        for r in range(args.repeat):   # rounds of every command, so a load that comes and goes hits all alike
            for name, cmd in runs.items():
                out = Path(tmp) / "run.json"
                took = timed(cmd + ["--out", str(out)])
                seconds[name] = min(seconds[name], took)
                entries = json.loads(out.read_text())
                top[name] = 100 * sum(any(c["has_answer"] for c in e["ctxs"][:args.k]) for e in entries) / len(entries)
                print(f"round {r + 1}, {name}: {took:.1f} s", file=sys.stderr, flush=True)
        manifest = None
        if args.index or not args.model:
            from odqa.common.defaults import default_pipeline
            index = Path(args.index) if args.index else default_pipeline().get("phrase_index")
            manifest = json.loads((index / "manifest.json").read_text()) if index else None
    dense = seconds.get("dense (MiniLM mean-pooled, Flat)")
    print(f"{args.n} questions of {args.questions}, top-{args.k} passages each, whole `odqa retrieve` commands")
    if manifest:
        print(f"phrase index: {manifest['factory']}, keep {manifest.get('keep', 1.0)}, {manifest['vectors']:,} vectors, "
              f"{manifest.get('bytes_per_passage', 0):,.0f} bytes per passage")
    print(f"| retriever | seconds | questions/s | / dense | Top-{args.k} |")
    print("|---|---:|---:|---:|---:|")
    for name, s in seconds.items():
        ratio = f"{dense / s:.2f}x" if dense else "-"
        print(f"| {name} | {s:.1f} | {args.n / s:.1f} | {ratio} | {top[name]:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
