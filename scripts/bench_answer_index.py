"""Memory of `AnswerIndex` (which passages hold an answer) on a built corpus, beside the structures it
kept until 2026-11-28, in one run: a `TokenizedText` (token strings, spans and a position dictionary)
a passage, a token -> passages dictionary of lists, and every passage's NFD text twice (a list and
their join) for regex answers.

Each is built in a fresh process over the same passages, and its peak resident memory less what the
process held before is reported; both then answer the same questions (NQ-test's, and CuratedTREC's
regexes), and the script checks that they find the same passages.

    python scripts/bench_answer_index.py [--corpus DIR] [--questions nq-test curated-test:100]

The default corpus is the data pack's (`odqa data` or `odqa demo` builds it). Fails if the old
structures' peak is not 3x the index's, or the two disagree.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys

CHILD = """
import json, resource, sys, time, unicodedata
from collections import defaultdict
import numpy as np
def rss_mb():
    return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmRSS")) / 1024
from odqa.common.answer_index import AnswerIndex, CorpusTexts
from odqa.common.metrics.has_answer import TokenizedText, answer_words
from odqa.common.questions import load_questions
mode, corpus, sets = sys.argv[1], sys.argv[2], sys.argv[3:]
questions = [q for name in sets for q in load_questions(name)]
base = rss_mb()
t = time.perf_counter()
if mode == "old":
    tokens, nfd, postings = [], [], defaultdict(list)
    for row, text in enumerate(CorpusTexts(corpus)):
        tokens.append(TokenizedText(text))
        nfd.append(unicodedata.normalize("NFD", text))
        for w in tokens[-1].positions:
            postings[w].append(row)
    postings = {w: np.asarray(rows, dtype=np.int64) for w, rows in postings.items()}
    joined = "\\n".join(nfd)
    built = time.perf_counter() - t
    def find(q):
        rows = set()
        if q.regex:
            from odqa.common.metrics.has_answer import has_answer
            return sorted(r for r, text in enumerate(nfd) if has_answer(text, q.answers, True))
        for answer in q.answers:
            ans = answer_words(answer)
            if not ans or any(w not in postings for w in ans):
                continue
            cand = None
            for w in set(ans):
                cand = postings[w] if cand is None else np.intersect1d(cand, postings[w], assume_unique=True)
            rows.update(r for r in cand.tolist() if tokens[r].find(ans))
        return sorted(rows)
else:
    index = AnswerIndex(CorpusTexts(corpus))
    built = time.perf_counter() - t
    find = lambda q: index.find(q.answers, q.regex)
found = [find(q) for q in questions]
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - base
print(json.dumps({"peak_mb": peak, "build_s": built, "found": found}))
"""


def measure(mode: str, corpus: str, sets: list[str]) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, mode, corpus, *sets], capture_output=True, text=True)
    if out.returncode:
        sys.exit(f"{mode} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.splitlines()[-1])


def main() -> None:
    from odqa.common.corpus import corpus_info
    from odqa.common.paths import default_corpus
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", default=None, help="a built corpus (default: the data pack's)")
    ap.add_argument("--questions", nargs="+", default=["nq-test", "curated-test:100"])
    args = ap.parse_args()
    corpus = str(args.corpus or default_corpus())
    n = corpus_info(corpus)["passages"]
    old, new = measure("old", corpus, args.questions), measure("new", corpus, args.questions)
    print(f"{n:,} passages; {len(new['found']):,} questions ({', '.join(args.questions)})\n")
    print("| structure | peak MB | bytes a passage | build s |")
    print("|---|---:|---:|---:|")
    for name, r in (("token lists and dictionaries, texts kept (old)", old), ("AnswerIndex", new)):
        print(f"| {name} | {r['peak_mb']:,.0f} | {r['peak_mb'] * 2**20 / n:,.0f} | {r['build_s']:.1f} |")
    print(f"\nold / AnswerIndex: {old['peak_mb'] / new['peak_mb']:.2f}x; the same passages for every question: "
          f"{old['found'] == new['found']}")
    if old["found"] != new["found"]:
        sys.exit("the two structures find different passages")
    if old["peak_mb"] < 3 * new["peak_mb"]:
        sys.exit("the old structures' peak is not 3x the index's")


if __name__ == "__main__":
    main()
