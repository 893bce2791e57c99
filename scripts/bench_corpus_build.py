"""Memory bound of `odqa corpus build`: it streams, so peak memory must not grow with the input.

Generates DPR-format TSV files of 50k and 200k synthetic passages (~100 words each, 10 passages per
title), builds each with `odqa corpus build` in a child process, and reports the child's peak RSS next
to a baseline in the same run that loads the whole input before writing it (what streaming avoids).
Fails if the streaming build's peak at 200k exceeds 1.25x its peak at 50k or --max-rss-mb.

    python scripts/bench_corpus_build.py [--sizes 50000 200000] [--max-rss-mb 400]
"""
from __future__ import annotations

import argparse
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD_PEAK = "import resource, sys; {body}; print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)"

STREAMING = "from odqa.system.cli import main; rc = main(['-q', 'corpus', 'build', '--input', {inp!r}, '--out', {out!r}])"
# The baseline holds every passage in a list before writing, as a non-streaming builder would.
IN_MEMORY = ("import csv, json; csv.field_size_limit(1 << 30); "
             "rows = list(csv.reader(open({inp!r}, newline=''), delimiter='\\t'))[1:]; "
             "ps = [dict(id=r[0], text=r[1], title=r[2], doc_id=r[0], section=[], char_start=0, char_end=len(r[1])) for r in rows]; "
             "f = open({out!r} + '.jsonl', 'w'); [f.write(json.dumps(p) + '\\n') for p in ps]")


def generate(path: Path, n: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    vocab = [f"w{i}" for i in range(5000)]
    with open(path, "w", encoding="utf-8") as f:
        f.write("id\ttext\ttitle\n")
        for i in range(n):
            words = rng.choices(vocab, k=100)
            text = " ".join(words[:50]) + ". " + " ".join(words[50:]) + "."
            f.write(f"{i + 1}\t{text}\tTitle {i // 10}\n")


def peak_rss_mb(body: str) -> tuple[float, float]:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", CHILD_PEAK.format(body=body)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"child failed:\n{proc.stderr[-2000:]}")
    return int(proc.stderr.strip().splitlines()[-1]) / 1024, time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[50_000, 200_000])
    parser.add_argument("--max-rss-mb", type=float, default=400.0)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.sizes:
            inp, out = Path(tmp) / f"psgs_{n}.tsv", Path(tmp) / f"corpus_{n}"
            generate(inp, n)
            mb_in = inp.stat().st_size / 2**20
            stream_mb, stream_s = peak_rss_mb(STREAMING.format(inp=str(inp), out=str(out)))
            base_mb, base_s = peak_rss_mb(IN_MEMORY.format(inp=str(inp), out=str(out)))
            rows.append((n, mb_in, stream_mb, base_mb, stream_s, base_s))
    print("| passages | input MB | streaming peak RSS MB | in-memory baseline MB | baseline / streaming | streaming s |")
    print("|---:|---:|---:|---:|---:|---:|")
    for n, mb_in, s_mb, b_mb, s_s, _ in rows:
        print(f"| {n:,} | {mb_in:.0f} | {s_mb:.0f} | {b_mb:.0f} | {b_mb / s_mb:.2f}x | {s_s:.1f} |")
    growth = rows[-1][2] / rows[0][2]
    print(f"streaming peak grows {growth:.2f}x from {rows[0][0]:,} to {rows[-1][0]:,} passages "
          f"(baseline: {rows[-1][3] / rows[0][3]:.2f}x)")
    ok = growth <= 1.25 and rows[-1][2] <= args.max_rss_mb
    print("memory bound: " + ("OK" if ok else "EXCEEDED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
