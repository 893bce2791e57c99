"""BM25 at growing corpus sizes, each beside the way it was done until 2026-11-28, in one run:

- build: peak memory of `BM25Index.build` (the passages read 10,000 at a time, only int32 term ids kept)
  against reading every passage's text and bm25s's token strings into memory first (the old build);
- the rerank's BM25 term: one question's scores for its few hundred candidate passages, by
  `scores_of` (each term's postings searched for the rows) against `scores(question)[rows]` (every
  passage scored, then the rows taken).

The corpora are synthetic: passages of W words drawn from a Zipf distribution over a vocabulary of
made-up words, as long as DPR's 100-word passages; questions are 8 such words. Each build is a fresh
process (peak resident memory less what its imports hold).

    python scripts/bench_bm25.py [--passages 25000 100000 400000] [--words 100] [--out /tmp/bench-bm25]

Fails if, at the largest corpus, the old build's peak is not 1.25x the build's, or `scores_of` is
slower than scoring every passage. The build keeps bm25s's own matrix construction, about 35 bytes a
(passage, term) pair at its peak: that part grows with the corpus in both columns.
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

CHILD = """
import resource, sys
def rss_kb():
    return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmRSS"))
import bm25s
from odqa.common.corpus import PassageStore
from odqa.retriever.bm25 import BM25Index, BM25Params
base = rss_kb()
mode, corpus = sys.argv[1:3]
if mode == "old":
    store = PassageStore(corpus)
    texts = [f"{p['title']} {p['text']}" for p in store]
    index = BM25Index(bm25s.BM25(k1=1.5, b=0.75, method="lucene"), BM25Params(), "")
    index.model.index(index.tokenize(texts), show_progress=False)
else:
    BM25Index.build(corpus)
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024)
"""


def zipf_words(rng: np.random.Generator, vocabulary: np.ndarray, n: int) -> np.ndarray:
    ranks = rng.zipf(1.1, n) - 1
    return vocabulary[ranks[ranks < len(vocabulary)]]


def synthetic_corpus(root: Path, n: int, words: int, vocabulary: np.ndarray) -> Path:
    from odqa.common.corpus import build_corpus
    rng = np.random.default_rng(n)
    source = root / "passages.jsonl"
    with open(source, "w") as f:
        for i in range(n):
            f.write(json.dumps({"id": f"p{i}", "title": f"Doc {i}", "text": " ".join(zipf_words(rng, vocabulary, words))}) + "\n")
    corpus = root / "corpus"
    build_corpus([source], corpus)
    source.unlink()
    return corpus


def peak_mb(mode: str, corpus: Path) -> float:
    shutil.rmtree(corpus / "bm25", ignore_errors=True)
    out = subprocess.run([sys.executable, "-c", CHILD, mode, str(corpus)], capture_output=True, text=True)
    if out.returncode:
        sys.exit(f"{mode} build failed:\n{out.stderr[-2000:]}")
    return float(out.stdout.split()[-1])


def rerank_ms(corpus: Path, vocabulary: np.ndarray, questions: int, rows: int) -> tuple[float, float]:
    from odqa.retriever.bm25 import BM25Index
    index = BM25Index.load(corpus)
    rng = np.random.default_rng(1)
    asked = [" ".join(zipf_words(rng, vocabulary, 8)) for _ in range(questions)]
    picked = [rng.integers(0, index.num_passages, rows) for _ in asked]
    times, results = [], []
    for score in (lambda q, r: index.scores(q)[r], index.scores_of):
        t = time.perf_counter()
        results.append([score(q, r).tobytes() for q, r in zip(asked, picked)])
        times.append((time.perf_counter() - t) * 1000 / questions)
    if results[0] != results[1]:
        sys.exit("scores_of differs from the whole vector's scores")
    return times[0], times[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--passages", type=int, nargs="+", default=[25_000, 100_000, 400_000])
    ap.add_argument("--words", type=int, default=100, help="words a passage")
    ap.add_argument("--vocabulary", type=int, default=200_000, help="distinct made-up words")
    ap.add_argument("--questions", type=int, default=200)
    ap.add_argument("--rows", type=int, default=300, help="candidate passages a question's rerank scores")
    ap.add_argument("--out", default="/tmp/bench-bm25")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    vocabulary = np.array(sorted({"".join(rng.choice(letters, rng.integers(3, 11))) for _ in range(args.vocabulary)}))
    rng.shuffle(vocabulary)
    print("| passages | old build peak (MB) | build peak (MB) | old / build | every passage scored (ms/q) "
          "| scores_of (ms/q) | speed-up |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    last = None
    for n in args.passages:
        root = Path(args.out) / f"n{n}"
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        corpus = synthetic_corpus(root, n, args.words, vocabulary)
        old, new = peak_mb("old", corpus), peak_mb("new", corpus)
        whole, rows = rerank_ms(corpus, vocabulary, args.questions, args.rows)
        print(f"| {n:,} | {old:,.0f} | {new:,.0f} | {old / new:.2f}x | {whole:.2f} | {rows:.2f} | {whole / rows:.1f}x |",
              flush=True)
        last = (old, new, whole, rows)
        shutil.rmtree(root)
    old, new, whole, rows = last
    if old < 1.25 * new:
        sys.exit(f"the old build's peak {old:.0f} MB is not 1.25x the build's {new:.0f} MB")
    if rows > whole:
        sys.exit(f"scores_of ({rows:.2f} ms/q) is slower than scoring every passage ({whole:.2f} ms/q)")


if __name__ == "__main__":
    main()
