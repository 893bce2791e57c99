"""DHR's report on the default corpus, one run, one table: document Top-k of the document retriever;
phrase-based passage retrieval without the pre-filter, with it (no rerank), and with it and the
rerank (the tuned lambda and BM25 weight): Top-1/5/20/100 and MRR@20; and search ms per question (batch 64) with and
without the pre-filter, timed in the same run.

    python scripts/report_dhr.py --index RUN/index-flat --model RUN/best --doc-index DHR/doc-index \\
        --doc-model DHR/doc-r2/best [--questions nq-test tqa-test] [--limit 1000] [--out DHR/report.json]
"""
from __future__ import annotations

import argparse
import sys
import time

from odqa.common.answer_index import AnswerIndex
from odqa.common.io import write_json
from odqa.common.metrics.retrieval import retrieval_metrics
from odqa.common.paths import default_corpus
from odqa.common.questions import load_questions
from odqa.common.settings import updated
from odqa.retriever.doc_index import DocRetriever
from odqa.retriever.retrieve import retrieve_phrases
from odqa.retriever.search_config import SearchConfig
from odqa.retriever.searcher import Searcher

KS = (1, 5, 20, 100)


def ms_per_question(searcher: Searcher, questions: list[str], batch: int, k: int) -> float:
    searcher.search(questions[:batch], k)  # warm-up
    start = time.perf_counter()
    for a in range(0, len(questions), batch):
        searcher.search(questions[a:a + batch], k)
    return 1000 * (time.perf_counter() - start) / len(questions)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--index", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--doc-index", required=True)
    p.add_argument("--doc-model", required=True)
    p.add_argument("--corpus", default=str(default_corpus()))
    p.add_argument("--questions", nargs="+", default=["nq-test", "tqa-test"])
    p.add_argument("--limit", type=int, default=1000, help="first N questions of each set (0: all)")
    p.add_argument("--top-docs", type=int, default=100)
    p.add_argument("--timing-questions", type=int, default=256)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    corpus = args.corpus
    docs = DocRetriever(args.doc_index, args.doc_model, corpus)
    lam, mu = docs.tuned_lambda or 0.0, docs.tuned_bm25_weight or 0.0
    searchers = {
        "phrase, no pre-filter": Searcher.open(args.index, args.model, corpus),
        f"phrase, pre-filter K={args.top_docs}":
            Searcher.open(args.index, args.model, corpus, docs, config=updated(
                SearchConfig(), top_docs=args.top_docs, lam=0.0, bm25_weight=0.0)),
        f"phrase, pre-filter K={args.top_docs} + rerank (lambda {lam:.1f}, BM25 weight {mu:g})":
            Searcher.open(args.index, args.model, corpus, docs, config=updated(
                SearchConfig(), top_docs=args.top_docs, lam=lam, bm25_weight=mu))}
    names = list(searchers)
    answers = AnswerIndex.open(corpus)
    report = {"top_docs": args.top_docs, "lambda": lam, "bm25_weight": mu, "datasets": {}}
    for name in args.questions:
        questions = load_questions(name, limit=args.limit or None)
        rows = {}
        ranked, _ = docs.search([q.question for q in questions], 100)
        hits = []
        for q, r in zip(questions, ranked):
            good = set(docs.table.doc_of_passage[answers.find(q.answers, q.regex)].tolist())
            hits.append([int(d) in good for d in r])
        rows["document retriever (documents)"] = retrieval_metrics(hits, KS)
        for label, searcher in searchers.items():
            entries = retrieve_phrases(searcher, questions, 100)
            rows[label] = retrieval_metrics([[c["has_answer"] for c in e["ctxs"]] for e in entries], KS)
        timing_qs = [q.question for q in questions[:args.timing_questions]]
        timing = {label: ms_per_question(s, timing_qs, 64, 100) for label, s in list(searchers.items())[:2]}
        report["datasets"][name] = {"questions": len(questions), "rows": rows, "ms_per_question": timing,
                                    "speedup": timing[names[0]] / timing[names[1]]}
    write_json(args.out, report)
    sizes = ", ".join(f"{n} {d['questions']}" for n, d in report["datasets"].items())
    print(f"default corpus, K = {args.top_docs} documents, lambda = {lam:.1f}, BM25 weight {mu:g} "
          f"(tuned on validation); questions: {sizes}")
    print("| set | run | Top-1 | Top-5 | Top-20 | Top-100 | MRR@20 |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for name, d in report["datasets"].items():
        for label, m in d["rows"].items():
            print(f"| {name} | {label} | " + " | ".join(f"{m[k]:.1f}" for k in
                                                        ("Top-1", "Top-5", "Top-20", "Top-100", "MRR@20")) + " |")
    print("\n| set | ms/question without pre-filter | with pre-filter | speed-up |")
    print("|---|---:|---:|---:|")
    for name, d in report["datasets"].items():
        t = list(d["ms_per_question"].values())
        print(f"| {name} | {t[0]:.1f} | {t[1]:.1f} | {d['speedup']:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
