"""Seconds of a one-line `odqa ask`, the whole command as a user runs it (start, import, load, search,
read, print, exit), beside the floor its libraries set: a Python that imports what it imports (torch,
faiss, transformers' BERT, T5 and encoder-decoder models) and exits.

    python scripts/bench_ask.py [--rounds 4] [--k 5]

Both run on the default pipeline (`odqa demo`), in rounds that alternate them, so a load that comes and
goes hits both alike; the disk caches are warm after the untimed first command.
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import sys

from bench_retrieval import timed  # one whole command, as a user runs it (this folder is on sys.path)

QUESTIONS = ["who directed jaws", "panda is a national animal of which country", "who wrote hamlet"]
FLOOR = ("import torch, faiss; "
         "from transformers import AutoTokenizer, BertModel, EncoderDecoderModel, T5ForConditionalGeneration")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--k", type=int, default=5)
    args = p.parse_args()
    odqa = shutil.which("odqa")
    if odqa is None:
        sys.exit("no `odqa` on PATH: pip install -e .")
    ask = {q: [odqa, "ask", q, "--k", str(args.k)] for q in QUESTIONS}
    floor = [sys.executable, "-c", FLOOR]
    timed(ask[QUESTIONS[0]])   # untimed: the first reads the files from disk and remembers their hashes
    seconds = {"odqa ask": [], "imports alone": []}
    for _ in range(args.rounds):
        for cmd in ask.values():
            seconds["odqa ask"].append(timed(cmd))
            seconds["imports alone"].append(timed(floor))
    base = statistics.median(seconds["imports alone"])
    print(f"{args.rounds} rounds of {len(QUESTIONS)} questions, k = {args.k}, whole commands")
    print("| command | median s | max s | / imports alone |")
    print("|---|---:|---:|---:|")
    for name, s in seconds.items():
        print(f"| {name} | {statistics.median(s):.2f} | {max(s):.2f} | {statistics.median(s) / base:.2f}x |")
    worst = max(seconds["odqa ask"])
    print(f"odqa ask: {statistics.median(seconds['odqa ask']):.2f} s median, {worst:.2f} s at most "
          f"({'within' if worst <= 5 else 'over'} 5 s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
