"""FiD reader cost by k: training step time and peak memory (with and without encoder gradient
checkpointing), and inference questions/s of FiD next to plain T5 reading the k passages concatenated
into one input (the quadratic baseline FiD exists to beat), in one run.

Random weights of a preset's shape and random token ids: the cost does not depend on what the model
knows. Each measurement runs in a fresh subprocess so its peak RSS is its own. The training step is
forward + backward + AdamW on one question (B=1) in fp32.

    python scripts/bench_reader.py [--preset small] [--ks 5 10 25 50 100] [--text-maxlength 128]
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

import torch


def build_model(preset: str):
    from reader.fid import FiDT5
    from reader.t5_init import PRESETS, t5_config
    torch.manual_seed(0)
    return FiDT5(t5_config(preset, PRESETS[preset]["vocab"]))


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure_train(preset: str, k: int, length: int, checkpointing: bool, steps: int) -> dict:
    model = build_model(preset).train()
    model.config.use_cache = False
    if checkpointing:
        model.encoder_gradient_checkpointing()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(3, model.config.vocab_size - 100, (1, k, length))
    labels = torch.randint(3, model.config.vocab_size - 100, (1, 8))
    base = rss_mb()

    def step():
        model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=labels).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()   # warm-up; also allocates AdamW's state
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return {"seconds_per_step": (time.perf_counter() - start) / steps, "peak_mb": rss_mb(), "base_mb": base}


@torch.no_grad()
def measure_infer(preset: str, k: int, length: int, concat: bool, questions: int, batch: int) -> dict:
    model = build_model(preset).eval()
    ids = torch.randint(3, model.config.vocab_size - 100, (batch, k, length))
    if concat:          # one input of k * L tokens: full self-attention over all of them
        ids = ids.reshape(batch, k * length)
    kw = dict(max_new_tokens=8, min_new_tokens=8, do_sample=False)   # same decoding work for both
    model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **kw)
    start = time.perf_counter()
    for _ in range(questions // batch):
        model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **kw)
    return {"questions_per_s": (questions // batch) * batch / (time.perf_counter() - start), "peak_mb": rss_mb()}


def child(argv: list[str]) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", json.dumps(argv)], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        return {"error": out.stderr.strip().splitlines()[-1] if out.stderr.strip() else f"exit {out.returncode}"}
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="small")
    p.add_argument("--ks", type=int, nargs="+", default=[5, 10, 25, 50, 100])
    p.add_argument("--text-maxlength", type=int, default=128, help="tokens per question+passage")
    p.add_argument("--steps", type=int, default=2, help="timed training steps per setting")
    p.add_argument("--questions", type=int, default=8, help="questions timed per inference setting")
    p.add_argument("--batch", type=int, default=4, help="questions per generate() call")
    p.add_argument("--max-concat-k", type=int, default=50, help="largest k for the concatenated baseline")
    p.add_argument("--json", default=None, help="also write the figures here")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        kind, *rest = json.loads(args.child)
        fn = measure_train if kind == "train" else measure_infer
        print(json.dumps(fn(*rest)))
        return 0

    L = args.text_maxlength
    print(f"preset {args.preset}, {L} tokens per passage, {torch.get_num_threads()} threads, "
          f"{'CUDA' if torch.cuda.is_available() else 'CPU'}, fp32", flush=True)
    rows = []
    for k in args.ks:
        plain = child(["train", args.preset, k, L, False, args.steps])
        ckpt = child(["train", args.preset, k, L, True, args.steps])
        fid = child(["infer", args.preset, k, L, False, args.questions, args.batch])
        cat = child(["infer", args.preset, k, L, True, args.questions, args.batch]) if k <= args.max_concat_k \
            else {"error": "skipped"}
        rows.append({"k": k, "train": plain, "train_checkpointing": ckpt, "fid": fid, "concat": cat})
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)

    def fmt(d, key, spec):
        return format(d[key], spec) if key in d else d.get("error", "-")[:30]

    print("| k | step s | step s, ckpt | peak MB | peak MB, ckpt | FiD q/s | concat T5 q/s | FiD / concat |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        ratio = (f"{r['fid']['questions_per_s'] / r['concat']['questions_per_s']:.2f}x"
                 if "questions_per_s" in r["concat"] and "questions_per_s" in r["fid"] else "-")
        print(f"| {r['k']} | {fmt(r['train'], 'seconds_per_step', '.2f')} | "
              f"{fmt(r['train_checkpointing'], 'seconds_per_step', '.2f')} | {fmt(r['train'], 'peak_mb', '.0f')} | "
              f"{fmt(r['train_checkpointing'], 'peak_mb', '.0f')} | {fmt(r['fid'], 'questions_per_s', '.2f')} | "
              f"{fmt(r['concat'], 'questions_per_s', '.2f')} | {ratio} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"preset": args.preset, "text_maxlength": L, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
