"""Which passages hold a regex answer (CuratedTREC): `AnswerIndex.find` beside the scan it replaced,
the whole corpus's NFD text joined in one string and searched once a pattern, in one run.

Corpora: the data pack's passages, and the same documents repeated `--copies` times (ids made
distinct), so the figures' growth with N can be fitted. Both ways must find the same passages for
every pattern; the script fails otherwise.

    python scripts/bench_regex_answers.py [--questions curated-test] [--copies 1 4]

Prints, per corpus size, ms a pattern for each way, their ratio, how many patterns went by their
candidates or by the block scan, and the candidates' share of the corpus; then the growth exponents
and what they give at DPR's 21M passages.
"""
from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
import unicodedata
from pathlib import Path

import numpy as np

from odqa.common.answer_index import AnswerIndex, CorpusTexts, requirement
from odqa.common.corpus import build_corpus
from odqa.common.metrics.answers import compile_answer_regex
from odqa.common.paths import default_documents
from odqa.common.questions import load_questions

DPR_PASSAGES = 21_015_324


def copied_corpus(documents: Path, copies: int, out: Path) -> Path:
    src = out / "documents.jsonl"
    with open(documents, encoding="utf-8") as f, open(src, "w", encoding="utf-8") as w:
        lines = [json.loads(line) for line in f if line.strip()]
        for c in range(copies):
            for doc in lines:
                w.write(json.dumps({**doc, "id": f"{doc['id']}#{c}"}, ensure_ascii=False) + "\n")
    build_corpus([src], out / "corpus")
    return out / "corpus"


def joined_scan(texts: CorpusTexts, patterns: list[str]) -> tuple[list[list[int]], float]:
    """The way before: every passage's NFD text in one string, each pattern searched over all of it."""
    nfd = [unicodedata.normalize("NFD", t) for t in texts]
    t = time.perf_counter()
    found = []
    for pattern in patterns:
        try:
            exact = compile_answer_regex(pattern)
        except ValueError:
            found.append([])
            continue
        found.append(sorted(AnswerIndex._matching_in(exact, nfd)))
    return found, time.perf_counter() - t


def indexed(corpus: Path, patterns: list[str]) -> tuple[list[list[int]], float, dict]:
    index = AnswerIndex.open(corpus)
    index._vocabulary   # read once a process, as a command's first regex answer does; timed apart below
    scans = 0
    scan = index._scan

    def counted(exact):
        nonlocal scans
        scans += 1
        return scan(exact)
    index._scan = counted
    t = time.perf_counter()
    found = [sorted(index._rows_matching(p)) for p in patterns]
    took = time.perf_counter() - t
    index.__dict__.pop("_holding", None)   # the vocabulary's scans timed afresh
    t = time.perf_counter()
    needs = [n for n in map(requirement, patterns) if n is not None]
    words = [index._candidates(n)[0] for n in needs]
    vocabulary_s = time.perf_counter() - t
    shares = [len(index._postings(w)) / len(index) for w in words]
    return found, took, {"scanned": scans, "median_share": float(np.median(shares)) if shares else 0.0,
                         "vocabulary_ms": 1000 * vocabulary_s / len(patterns), "vocabulary_chars": len(index._vocabulary)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--questions", default="curated-test", help="a regex question set (default curated-test)")
    ap.add_argument("--copies", type=int, nargs="+", default=[1, 4], help="corpus sizes, as copies of the data pack's")
    args = ap.parse_args()
    patterns = [p for q in load_questions(args.questions) for p in q.answers]
    documents = default_documents()
    rows = []
    for copies in args.copies:
        with tempfile.TemporaryDirectory() as tmp:
            corpus = copied_corpus(documents, copies, Path(tmp))
            texts = CorpusTexts(corpus)
            old, old_s = joined_scan(texts, patterns)
            new, new_s, how = indexed(corpus, patterns)
            if old != new:
                bad = next(p for p, a, b in zip(patterns, old, new) if a != b)
                raise SystemExit(f"{copies} copies: the two ways disagree on {bad!r}")
            rows.append({"passages": len(texts), "old_ms": 1000 * old_s / len(patterns),
                         "new_ms": 1000 * new_s / len(patterns), **how})
    print(f"{len(patterns)} patterns of {args.questions}; the same passages found both ways at every size\n")
    print("| passages | joined scan ms a pattern | AnswerIndex ms a pattern | joined / index | patterns scanned "
          "| median candidates share | of which vocabulary ms (its characters) |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['passages']:,} | {r['old_ms']:.2f} | {r['new_ms']:.2f} | {r['old_ms'] / r['new_ms']:.1f}x "
              f"| {r['scanned']} | {r['median_share']:.4f} | {r['vocabulary_ms']:.2f} ({r['vocabulary_chars']:,}) |")
    if len(rows) > 1:
        a, b = rows[0], rows[-1]
        span = math.log(b["passages"] / a["passages"])
        for key, name in (("old_ms", "joined scan"), ("new_ms", "AnswerIndex")):
            k = math.log(b[key] / a[key]) / span
            at = b[key] * (DPR_PASSAGES / b["passages"]) ** k * len(patterns) / 1000 / 3600
            print(f"{name}: time a pattern grows as N^{k:.2f}; all {len(patterns)} patterns at 21M passages: "
                  f"{at:.1f} h")
        # copies repeat the vocabulary, so its scan does not grow here; at 21M it is DPR's vocabulary
        per_char = b["vocabulary_ms"] / b["vocabulary_chars"]
        print(f"vocabulary scan: {1e6 * per_char:.2f} ms a pattern a million characters of vocabulary "
              f"({len(patterns)} patterns over a 200M-character vocabulary: {per_char * 2e8 * len(patterns) / 3.6e6:.1f} h)")


if __name__ == "__main__":
    main()
