"""FiD reader cost by k: training step time and peak memory (with and without encoder gradient
checkpointing), and inference questions/s of FiD next to the same model reading the k passages
concatenated into one input (the quadratic baseline FiD exists to beat), in one run.

Two kinds: `t5`, a T5 of a preset's shape, and `warm`, the bert2bert reader of `odqa reader init --from`
(the MiniLM's shape: 6 layers, 384 wide, a 2-layer decoder). The concatenated BERT baseline gets
position embeddings for all k x L tokens (BERT has 512): what it would cost if it could read them.

Random weights and random token ids: the cost does not depend on what the model knows. Each
measurement runs in a fresh subprocess so its peak RSS is its own. The training step is forward +
backward + AdamW on `--train-batch` questions in fp32; `--bf16` adds the same step under CPU bfloat16
autocast (what `train-reader --precision bf16` does on CPU: float32 weights) and its speed-up.

    python scripts/bench_reader.py [--kind warm|t5] [--preset small] [--ks 5 10 25 50 100] [--text-maxlength 128]
                                   [--train-batch 4] [--bf16]
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

import torch

# all-MiniLM-L6-v2's shape, the encoder `odqa reader init --from` warm-starts from by default.
MINILM = dict(vocab_size=30522, hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536)


def build_model(preset: str, positions: int = 512):
    """`preset` is a T5 preset or "warm" (bert2bert of MiniLM's shape, `positions` long)."""
    torch.manual_seed(0)
    if preset == "warm":
        from transformers import BertConfig, EncoderDecoderConfig

        from odqa.reader.fid import FiDEncoderDecoder
        enc = BertConfig(**MINILM, max_position_embeddings=max(positions, 512))
        dec = BertConfig(**{**MINILM, "num_hidden_layers": 2}, max_position_embeddings=512, is_decoder=True,
                         add_cross_attention=True)
        config = EncoderDecoderConfig.from_encoder_decoder_configs(enc, dec)
        config.update(dict(decoder_start_token_id=101, eos_token_id=102, pad_token_id=0))
        return FiDEncoderDecoder(config)
    from odqa.reader.args import SHAPES
    from odqa.reader.fid import FiDT5
    from odqa.reader.t5_init import t5_config
    return FiDT5(t5_config(preset, SHAPES[preset]["vocab"]))


def vocab(model) -> int:
    return model.get_input_embeddings().weight.shape[0]


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure_train(preset: str, k: int, length: int, checkpointing: bool, steps: int, batch: int = 1,
                  bf16: bool = False) -> dict:
    model = build_model(preset).train()
    model.config.use_cache = False
    if checkpointing:
        model.encoder_gradient_checkpointing()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(3, vocab(model) - 100, (batch, k, length))
    labels = torch.randint(3, vocab(model) - 100, (batch, 8))
    base = rss_mb()

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()   # warm-up; also allocates AdamW's state
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return {"seconds_per_step": (time.perf_counter() - start) / steps, "peak_mb": rss_mb(), "base_mb": base}


@torch.no_grad()
def measure_infer(preset: str, k: int, length: int, concat: bool, questions: int, batch: int) -> dict:
    model = build_model(preset, k * length if concat else length).eval()
    ids = torch.randint(3, vocab(model) - 100, (batch, k, length))
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
    p.add_argument("--kind", choices=["warm", "t5"], default="warm", help="warm: bert2bert of MiniLM's shape; t5: --preset")
    p.add_argument("--preset", default="small", help="with --kind t5: tiny, small or base")
    p.add_argument("--ks", type=int, nargs="+", default=[5, 10, 25, 50, 100])
    p.add_argument("--text-maxlength", type=int, default=128, help="tokens per question+passage")
    p.add_argument("--steps", type=int, default=2, help="timed training steps per setting")
    p.add_argument("--train-batch", type=int, default=1, help="questions per timed training step")
    p.add_argument("--bf16", action="store_true", help="also time the training step under CPU bfloat16 autocast")
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
    if args.kind == "warm":
        args.preset = "warm"
    print(f"model {args.preset}, {L} tokens per passage, {torch.get_num_threads()} threads, "
          f"{'CUDA' if torch.cuda.is_available() else 'CPU'}, fp32, training steps of {args.train_batch} "
          f"question(s)", flush=True)
    rows = []
    for k in args.ks:
        plain = child(["train", args.preset, k, L, False, args.steps, args.train_batch])
        ckpt = child(["train", args.preset, k, L, True, args.steps, args.train_batch])
        bf16 = child(["train", args.preset, k, L, False, args.steps, args.train_batch, True]) if args.bf16 else None
        fid = child(["infer", args.preset, k, L, False, args.questions, args.batch])
        cat = child(["infer", args.preset, k, L, True, args.questions, args.batch]) if k <= args.max_concat_k \
            else {"error": "skipped"}
        rows.append({"k": k, "train": plain, "train_checkpointing": ckpt, "fid": fid, "concat": cat,
                     **({"train_bf16": bf16} if bf16 else {})})
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)

    def fmt(d, key, spec):
        return format(d[key], spec) if key in d else d.get("error", "-")[:30]

    print("| k | step s | step s, ckpt | peak MB | peak MB, ckpt | FiD q/s | concat q/s | FiD / concat |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        ratio = (f"{r['fid']['questions_per_s'] / r['concat']['questions_per_s']:.2f}x"
                 if "questions_per_s" in r["concat"] and "questions_per_s" in r["fid"] else "-")
        print(f"| {r['k']} | {fmt(r['train'], 'seconds_per_step', '.2f')} | "
              f"{fmt(r['train_checkpointing'], 'seconds_per_step', '.2f')} | {fmt(r['train'], 'peak_mb', '.0f')} | "
              f"{fmt(r['train_checkpointing'], 'peak_mb', '.0f')} | {fmt(r['fid'], 'questions_per_s', '.2f')} | "
              f"{fmt(r['concat'], 'questions_per_s', '.2f')} | {ratio} |")
    if args.bf16:
        print("\n| k | step s, fp32 | step s, bf16 autocast | fp32 / bf16 |")
        print("|---:|---:|---:|---:|")
        for r in rows:
            a, b = r["train"], r["train_bf16"]
            ratio = (f"{a['seconds_per_step'] / b['seconds_per_step']:.2f}x"
                     if "seconds_per_step" in a and "seconds_per_step" in b else "-")
            print(f"| {r['k']} | {fmt(a, 'seconds_per_step', '.2f')} | {fmt(b, 'seconds_per_step', '.2f')} | {ratio} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"preset": args.preset, "text_maxlength": L, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
