"""Query throughput of phrase retrieval next to the single-vector dense retriever, in one run.

Both encode the questions and search the same corpus (phrase: start/end MIPS + the windowed best
partner + Eq. 3 aggregation; dense: one mean-pooled vector, faiss Flat), batches of 64 questions,
k passages each. Prints questions/s for each and the ratio.

    python scripts/bench_retrieval.py --model RUN/best --index RUN/index [--questions nq-test] [--n 640]
"""
from __future__ import annotations

import argparse
import sys
import time

import torch

from common.paths import default_corpus, default_encoder
from common.questions import load_questions
from retriever.dense import DenseIndex
from retriever.searcher import Searcher


def throughput(search, questions: list[str], batch: int) -> float:
    search(questions[:batch])  # warm-up: first-call allocations, lazy loads
    start = time.perf_counter()
    for a in range(0, len(questions), batch):
        search(questions[a:a + batch])
    return len(questions) / (time.perf_counter() - start)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--index", required=True)
    p.add_argument("--corpus", default=str(default_corpus()))
    p.add_argument("--dense-encoder", default=str(default_encoder()))
    p.add_argument("--questions", default="nq-test")
    p.add_argument("--n", type=int, default=640)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--k", type=int, default=10)
    args = p.parse_args()
    questions = [q.question for q in load_questions(args.questions, limit=args.n)]
    phrase = Searcher(args.index, args.model, args.corpus)
    dense = DenseIndex.open(args.corpus, args.dense_encoder)
    qps_phrase = throughput(lambda qs: phrase.search(qs, args.k, unit="passage"), questions, args.batch)
    qps_dense = throughput(lambda qs: dense.search_passages(qs, args.k), questions, args.batch)
    m = phrase.index.manifest
    print(f"{len(questions)} questions of {args.questions}, batch {args.batch}, top-{args.k} passages, "
          f"{torch.get_num_threads()} threads; phrase index {m['factory']}, {m['vectors']} vectors")
    print("| retriever | questions/s |")
    print("|---|---:|")
    print(f"| phrase (passages by best phrase) | {qps_phrase:.1f} |")
    print(f"| single-vector dense (MiniLM mean-pooled, Flat) | {qps_dense:.1f} |")
    print(f"phrase / dense throughput: {qps_phrase / qps_dense:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
