"""Peak memory of `build_index` against the size of the dump, beside reading the dump whole (what the
build did until 2026-11-27), on synthetic dumps of growing corpora, in one run.

A corpus of N short passages is built, and a dump of it is written in `dump-phrases`' format: T tokens a
passage, random float16 start/end vectors, a random phrase filter. Each measurement is a fresh process
(peak resident memory less what its imports hold): `whole` reads the dump into memory and scores every
token with the filter, as the build used to before indexing; `build` runs `build_index` (the 20% the
filter keeps, an IVF-PQ index), which reads the dump a chunk at a time.

    python scripts/bench_build_memory.py [--passages 20000 80000] [--tokens 40] [--dim 96] [--out /tmp/bench-build]

Fails if the build's peak at the largest corpus exceeds 1.5x its peak at the smallest. Below about
25,000 passages (at 40 tokens) the kept vectors are fewer than the 200,000 the quantisers train on,
and the sample still grows with the corpus: compare sizes past that, as the defaults do.
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

CHILD = """
import resource, sys
import numpy as np
from odqa.retriever.phrase_dump import read_dump
from odqa.retriever.phrase_filter import load_filter
from odqa.retriever.args import BuildIndexArgs
from odqa.retriever.index_build import build_index
def rss_kb():
    return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmRSS"))
base = rss_kb()
mode, dump, corpus, out = sys.argv[1:5]
if mode == "whole":
    arrays, _ = read_dump(dump, corpus)
    scores = load_filter(dump + "/filter")[0].score(arrays["start"], arrays["end"])
    float(np.quantile(scores, 0.8))
else:
    build_index(BuildIndexArgs(dump=dump, out=out, corpus=corpus, factory="IVF256,PQ8", keep=0.2))
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024)
"""


def synthetic_dump(root: Path, n: int, tokens: int, dim: int, chunk_passages: int = 1024) -> tuple[Path, Path, int]:
    import torch

    from odqa.common.corpus import build_corpus, corpus_info
    from odqa.retriever.phrase_filter import PhraseFilter
    words = np.array("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split())
    rng = np.random.default_rng(0)
    source = root / "passages.jsonl"
    with open(source, "w") as f:
        for i in range(n):
            f.write(json.dumps({"id": f"p{i}", "title": f"Doc {i}", "text": " ".join(rng.choice(words, 30))}) + "\n")
    corpus = root / "corpus"
    build_corpus([source], corpus)
    info = corpus_info(corpus)
    shard = root / "dump" / "shard-001-of-001"
    shard.mkdir(parents=True)
    summary = {"encoder_hash": "synthetic", "fingerprint": info["fingerprint"], "threshold": None,
               "chunk_passages": chunk_passages, "shard": [1, 1]}
    (shard / "settings.json").write_text(json.dumps(summary))
    rows_all = np.arange(info["passages"])
    for c, a in enumerate(range(0, len(rows_all), chunk_passages)):
        rows = np.repeat(rows_all[a:a + chunk_passages], tokens)
        m = len(rows)
        np.savez(shard / f"chunk-{c:05d}.npz", start=rng.standard_normal((m, dim), dtype=np.float32).astype(np.float16),
                 end=rng.standard_normal((m, dim), dtype=np.float32).astype(np.float16), passage_row=rows.astype(np.int64),
                 token=np.tile(np.arange(1, tokens + 1, dtype=np.int32), len(rows) // tokens),
                 char_start=np.zeros(m, np.int32), char_end=np.ones(m, np.int32),
                 filter=np.zeros(m, np.float16), in_title=np.zeros(m, bool))
    summary.update(passages=info["passages"], chunks=c + 1, vectors=info["passages"] * tokens, vectors_per_passage=tokens,
                   dim=dim, max_span_len=20, title_path=False)
    (shard / "done.json").write_text(json.dumps(summary))
    filt = root / "dump" / "filter"
    filt.mkdir()
    torch.manual_seed(0)
    torch.save(PhraseFilter(dim, 64).state_dict(), filt / "filter.pt")
    (filt / "filter.json").write_text(json.dumps({"dim": dim, "hidden": 64, "encoder_hash": "synthetic"}))
    dump_bytes = sum(p.stat().st_size for p in shard.glob("chunk-*.npz"))
    return root / "dump", corpus, dump_bytes


def peak_mb(mode: str, dump: Path, corpus: Path, out: Path) -> float:
    done = subprocess.run([sys.executable, "-c", CHILD, mode, str(dump), str(corpus), str(out)],
                          capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(done.stderr)
    return float(done.stdout.split()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--passages", type=int, nargs="+", default=[20_000, 80_000])
    p.add_argument("--tokens", type=int, default=40, help="dumped tokens a passage")
    p.add_argument("--dim", type=int, default=96)
    p.add_argument("--out", type=Path, default=Path("/tmp/bench-build"), help="scratch directory (removed after)")
    args = p.parse_args()
    print(f"{args.tokens} dumped tokens a passage, {args.dim} dims, float16; build: 20% kept, IVF256,PQ8; "
          "peak resident memory above the imports")
    print("| passages | dump MB | reading the dump whole, MB | build_index, MB | whole / build |")
    print("|---:|---:|---:|---:|---:|")
    builds = []
    for n in args.passages:
        root = args.out / str(n)
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        try:
            dump, corpus, dump_bytes = synthetic_dump(root, n, args.tokens, args.dim)
            whole = peak_mb("whole", dump, corpus, root / "index")
            build = peak_mb("build", dump, corpus, root / "index")
        finally:
            shutil.rmtree(root, ignore_errors=True)
        print(f"| {n:,} | {dump_bytes / 2**20:,.0f} | {whole:,.0f} | {build:,.0f} | {whole / build:.2f}x |", flush=True)
        builds.append(build)
    growth = builds[-1] / builds[0]
    print(f"build_index's peak grows {growth:.2f}x from {args.passages[0]:,} to {args.passages[-1]:,} passages")
    return 0 if growth <= 1.5 else 1


if __name__ == "__main__":
    sys.exit(main())
