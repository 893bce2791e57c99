"""FiD's encoder on real passages: one call over the B x k passages padded to the longest, against
`FusedEncoder`'s length groups (`encoder_bucket` tokens), in one run, as a ratio.

A quarter of a retrieved batch's tokens are padding (100-word passages of the Wikipedia leads, cut
at `--text-maxlength`). The settings take turns batch by batch, so a busy machine slows them alike.
The training step is forward + backward + AdamW on `--batch` questions at `--k` (the full preset's FiD
phase: 4 questions at k = 5, 160 tokens, the embeddings and 2 blocks held fixed); reading is
greedy span-constrained decoding of `--read-batch` questions at `--read-k` (all the file's passages), float32. It also prints
the largest loss difference from one call's: the groups change no result but the float rounding.

    python scripts/bench_length_buckets.py [--model READER] [--fid-file FILE] [--buckets 0 16 32 64]
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import torch

from odqa.common.defaults import default_pipeline
from odqa.common.trainer import shuffled_batches
from odqa.reader.args import ReaderSettings
from odqa.reader.fid_data import FiDCollator, load_fid_file
from odqa.reader.read import generate, load_reader


def default_reader_files() -> tuple[str | None, str | None]:
    """The default pipeline's reader (what `odqa demo` recorded last) and the FiD training file its
    run wrote beside it (RUN/reader/best, RUN/reader-data/*-train.json)."""
    reader = default_pipeline().get("reader")
    if reader is None:
        return None, None
    found = sorted((reader.parent.parent / "reader-data").glob("*-train.json"))
    return str(reader), str(found[0]) if found else None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    reader, fid_file = default_reader_files()
    p.add_argument("--model", default=reader, help="a reader checkpoint (default: the default pipeline's)")
    p.add_argument("--fid-file", default=fid_file,
                   help="a retrieval file with has_answer (default: the FiD training file of that reader's run)")
    p.add_argument("--buckets", type=int, nargs="+", default=[0, 16, 32, 64], help="0: one padded call")
    p.add_argument("--k", type=int, default=5)
    p.add_argument("--batch", type=int, default=4, help="questions per training step")
    p.add_argument("--steps", type=int, default=20, help="timed training steps per setting")
    p.add_argument("--freeze-layers", type=int, default=2, help="encoder blocks held fixed, with the embeddings")
    p.add_argument("--read-k", type=int, default=None,
                   help="passages read per question (default: all the file gives; fewer leave absent ones, "
                        "which the groups skip)")
    p.add_argument("--read-batch", type=int, default=16)
    p.add_argument("--read-batches", type=int, default=4, help="timed reading batches per setting")
    p.add_argument("--text-maxlength", type=int, default=160)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    if not args.model or not args.fid_file:
        p.error("no default reader or its FiD file (run `odqa demo`): pass --model and --fid-file")
    torch.set_num_threads(args.threads)
    examples = [e for e in load_fid_file(args.fid_file) if e.has_answer is None or any(e.has_answer[:args.k])]
    args.read_k = args.read_k or max(len(e.passages) for e in examples)
    model, tokenizer = load_reader(args.model, "cpu")
    model.freeze_encoder_bottom(True, args.freeze_layers)
    model.config.use_cache = False
    collator = FiDCollator(tokenizer, args.k, args.text_maxlength, span_loss=True)
    order = shuffled_batches(len(examples), args.batch, 0, 0)[: args.steps + 1]
    batches = [collator([examples[i] for i in o], random.Random(m)) for m, o in enumerate(order)]
    real = sum(b["attention_mask"].sum().item() for b in batches) / sum(b["attention_mask"].numel() for b in batches)
    opt = torch.optim.AdamW([q for q in model.parameters() if q.requires_grad], lr=0.0)   # lr 0: weights stay put
    train_s = {b: 0.0 for b in args.buckets}
    losses = {b: [] for b in args.buckets}
    model.train()
    for i, batch in enumerate(batches):
        for bucket in args.buckets if i % 2 else args.buckets[::-1]:
            model.encoder_bucket = bucket
            start = time.perf_counter()
            loss = model(**batch).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if i:                                               # the first batch warms up
                train_s[bucket] += time.perf_counter() - start
            losses[bucket].append(loss.item())
    read_s = {b: 0.0 for b in args.buckets}
    answers = {b: [] for b in args.buckets}
    for i in range(args.read_batches):
        chunk = examples[i * args.read_batch:(i + 1) * args.read_batch]
        for bucket in args.buckets if i % 2 else args.buckets[::-1]:
            model.encoder_bucket = bucket
            start = time.perf_counter()
            answers[bucket] += generate(model, tokenizer, chunk, [args.read_k],
                                        ReaderSettings(batch_size=args.read_batch, text_maxlength=args.text_maxlength),
                                        dtype=torch.float32)[args.read_k]
            read_s[bucket] += time.perf_counter() - start
    base = args.buckets[0]
    print(f"{Path(args.model)}, {Path(args.fid_file).name}: {100 * real:.1f}% of the training batches' tokens are "
          f"real; {torch.get_num_threads()} threads")
    print(f"| bucket | train step s (k = {args.k}, {args.batch} q) | speed-up | read q/s (k = {args.read_k}) | "
          f"speed-up | max loss diff | answers as bucket {base}'s |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    rows = []
    for b in args.buckets:
        step, qps = train_s[b] / args.steps, len(answers[b]) / read_s[b]
        diff = max(abs(x - y) for x, y in zip(losses[b], losses[base]))
        same = sum(x == y for x, y in zip(answers[b], answers[base]))
        rows.append({"bucket": b, "step_s": step, "read_qps": qps, "max_loss_diff": diff, "same_answers": same})
        print(f"| {b} | {step:.3f} | {train_s[base] / train_s[b]:.2f}x | {qps:.2f} | {read_s[base] / read_s[b]:.2f}x "
              f"| {diff:.1e} | {same} / {len(answers[b])} |")
    print(json.dumps({"real_token_share": real, "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
