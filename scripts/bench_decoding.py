"""Reading cost of `--decoding phrases` against `spans` (its baseline) in one run, as a ratio.

Both read the same phrase retrieval file with the same reader at `--k`; the settings take turns batch
by batch, so a busy machine slows them alike. `phrases` decodes the `spans` answer and then scores
each question's candidates (reader/fusion.py), so the ratio is what the choice adds to a read. It
also prints EM of both over the questions read.

    python scripts/bench_decoding.py [--model READER] [--fid-file FILE] [--k 10] [--limit 400]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

from odqa.common.defaults import default_pipeline
from odqa.common.metrics.answers import answer_em
from odqa.reader.args import ReaderSettings
from odqa.reader.fid_data import load_fid_file
from odqa.reader.read import generate, load_reader

DECODINGS = ("spans", "phrases")


def default_files() -> tuple[str | None, str | None]:
    """The default pipeline's reader and the NQ-test FiD file its run wrote at the largest k (RUN/run)."""
    reader = default_pipeline().get("reader")
    if reader is None:
        return None, None
    found = sorted((reader.parent.parent / "run").glob("fid-nq-test-k*.jsonl"),
                   key=lambda f: int(f.stem.rsplit("-k", 1)[1]))
    return str(reader), str(found[-1]) if found else None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    reader, fid_file = default_files()
    p.add_argument("--model", default=reader, help="a reader checkpoint (default: the default pipeline's)")
    p.add_argument("--fid-file", default=fid_file,
                   help="a phrase retrieval file (default: the NQ-test FiD file of that reader's `odqa run`)")
    p.add_argument("--k", type=int, default=10, help="passages read per question")
    p.add_argument("--limit", type=int, default=400, help="questions read by each decoding")
    p.add_argument("--batch", type=int, default=8, help="questions per batch")
    p.add_argument("--text-maxlength", type=int, default=160)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = p.parse_args()
    if not args.model or not args.fid_file or not Path(args.fid_file).exists():
        p.error("--model and --fid-file are needed (run `odqa demo` for the defaults)")
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tok = load_reader(args.model)
    examples = load_fid_file(args.fid_file, limit=args.limit)
    seconds = {d: 0.0 for d in DECODINGS}
    answers = {d: [] for d in DECODINGS}
    settings = ReaderSettings(batch_size=args.batch, text_maxlength=args.text_maxlength)
    generate(model, tok, examples[:args.batch], [args.k], settings)  # warm-up
    for i in range(0, len(examples), args.batch):
        batch = examples[i:i + args.batch]
        for d in (DECODINGS if (i // args.batch) % 2 == 0 else DECODINGS[::-1]):
            t0 = time.perf_counter()
            answers[d] += generate(model, tok, batch, [args.k], replace(settings, decoding=d))[args.k]
            seconds[d] += time.perf_counter() - t0
    rows = {d: {"questions_per_s": round(len(examples) / seconds[d], 2),
                "em": round(100 * sum(answer_em(a, ex.answers, ex.regex) for a, ex in zip(answers[d], examples))
                            / len(examples), 2)} for d in DECODINGS}
    print(json.dumps({"questions": len(examples), "k": args.k, **rows,
                      "phrases_over_spans_time": round(seconds["phrases"] / seconds["spans"], 2)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
