"""One answer's costs stage by stage against this machine's floor, and `odqa read` against FiD's own
inference loop, in one run, on the default pipeline (`odqa demo`'s).

    python scripts/bench_answer.py [--questions nq-test] [--n 200] [--k 10] [--threads 1] [--quick]

1. Stages. The first n questions are asked one at a time (`Pipeline.ask`, as `odqa ask` and the server
   ask them), and each stage's seconds come from the pipeline's own timings (`common/timings.py`). A
   stage's FLOPs are counted by `torch.utils.flop_counter` where torch computes it (the encoders, the
   reader) and from the index shapes where faiss or numpy do (the pre-filter's inner products over
   every document, the memory's over every memory question, the phrase search's lookup tables and code
   sums over the top documents' vectors). The floor is those FLOPs at this machine's GFLOP/s, measured
   here on a matrix product of the stage's own shape in its own dtype (for the phrase search, the
   inner products its codes stand for, in float32). ratio = measured / floor: 1.0 is the machine's limit.
2. FiD's loop. Its `test_reader.py`: one question a batch, the k passages padded to the longest
   allowed length, the encoder over the k of them, its outputs concatenated for the decoder, greedy
   `generate` to the same length, float32 (`FiDLoop`, its EncoderWrapper). Beside it `odqa read` (the
   library's `generate`) on the same checkpoint and passages: with the loop's free decoding, as it
   reads by default (bfloat16 where the CPU computes it natively, length groups, batches) and in
   float32; and with its default span decoding, float32 and bfloat16, whose EM the demo reports.
   The last line compares the default read at the loop's decoding.

The retrieval runs once, up front, with the default pipeline; the reads read its passages. `--quick`:
50 questions, a few minutes on the demo's home.
"""
from __future__ import annotations

import argparse
import dataclasses
import platform
import time

import numpy as np
import torch
from torch.utils.flop_counter import FlopCounterMode

import odqa
from odqa.common.metrics.answers import answer_em
from odqa.common.questions import load_questions
from odqa.reader.fid import FusedEncoderOutput
from odqa.reader.fid_data import FiDExample, answer_end_id, encoder_text
from odqa.reader.read import generate, load_reader
from odqa.reader.spans import strip_generated

STAGES = ("question encoders", "pre-filter", "phrase search", "memory", "aggregation",
          "reader input", "reader encoder", "reader decoder")


def gflops(m: int, k: int, n: int, dtype: torch.dtype, seconds: float = 0.3) -> float:
    """This machine's GFLOP/s on an (m x k) @ (k x n) product in `dtype`, best of repeated runs."""
    a, b = torch.randn(m, k).to(dtype), torch.randn(k, n).to(dtype)
    a @ b
    best, end = float("inf"), time.perf_counter() + seconds
    while time.perf_counter() < end:
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * m * k * n / best / 1e9


def decoder_layers(model) -> int:
    config = model.config
    return config.decoder.num_hidden_layers if config.model_type == "encoder-decoder" else config.num_decoder_layers


def counted(fn) -> tuple[float, object]:
    """(FLOPs torch counted in fn(), its result)."""
    with FlopCounterMode(display=False) as counter:
        out = fn()
    return counter.get_total_flops(), out


class FiDLoop:
    """FiD's inference (facebookresearch/FiD, test_reader.py and model.py) over a reader checkpoint: its
    EncoderWrapper runs the encoder over the bsz * k passages, each padded to `text_maxlength`, and
    concatenates the outputs for the decoder; `generate` decodes greedily, one question a batch, in
    float32. The wrapper's output also carries the token ids, which this reader's pointer reads."""

    def __init__(self, model, tokenizer, k: int, text_maxlength: int, max_new_tokens: int):
        self.model, self.tokenizer, self.k = model, tokenizer, k
        self.text_maxlength, self.max_new_tokens = text_maxlength, max_new_tokens

    def encode(self, input_ids, attention_mask):
        bsz, total = input_ids.shape
        length = total // self.k
        out = self.model.encoder(input_ids=input_ids.view(bsz * self.k, length),
                                 attention_mask=attention_mask.view(bsz * self.k, length))
        return FusedEncoderOutput(out.last_hidden_state.view(bsz, self.k * length, -1), input_ids=input_ids,
                                  passage_length=length)

    @torch.no_grad()
    def answer(self, ex: FiDExample) -> str:
        texts = [encoder_text(ex.question, t, p) for t, p in ex.passages[:self.k]]
        enc = self.tokenizer(texts, max_length=self.text_maxlength, truncation=True, padding="max_length",
                             return_tensors="pt")   # FiD's collator: pad_to_max_length
        ids, mask = enc["input_ids"].view(1, -1), enc["attention_mask"].view(1, -1)
        end, pad = answer_end_id(self.tokenizer), self.tokenizer.pad_token_id
        out = self.model.generate(encoder_outputs=self.encode(ids, mask), attention_mask=mask,
                                  max_new_tokens=self.max_new_tokens, num_beams=1, do_sample=False,
                                  eos_token_id=end, pad_token_id=pad)
        start = self.model.generation_config.decoder_start_token_id
        return self.tokenizer.decode(strip_generated(out[0].tolist(), end, pad, start), skip_special_tokens=True).strip()


def stage_table(qa, questions: list[str], k: int) -> None:
    searcher, (model, tokenizer) = qa.searcher, qa.reader
    a = searcher.artifacts
    qa.ask(questions[:3], k)                                  # warm: first calls allocate and pick kernels
    seconds = {name: 0.0 for name in STAGES}
    flops = {name: 0.0 for name in STAGES}
    shapes = {"question": [], "reader": [], "scored": [], "padded": []}
    flops["cross-attention keys and values"] = 0.0
    d_model = a.model.q_start_lm.config.hidden_size
    total = 0.0
    for q in questions:
        start = time.perf_counter()
        answer = qa.ask(q, k)
        total += time.perf_counter() - start
        for name, ms in answer.timings["stages_ms"].items():
            seconds[name] = seconds.get(name, 0.0) + ms / 1000
        # the same work again, counted: the question encoders, then the reader's encoder and decoder
        flops["question encoders"] += counted(lambda: searcher.encode([q]))[0]
        if a.prefilter is not None:
            from odqa.retriever.doc_encoder import encode_questions
            flops["question encoders"] += counted(lambda: encode_questions(a.prefilter.model, a.prefilter.tokenizer,
                                                                         [q]))[0]
        shapes["question"].append(len(a.tokenizer(q)["input_ids"]))
        ex = FiDExample(id="0", question=q, answers=[], passages=[(p.title, p.text) for p in answer.passages])
        read_flops, _ = counted(lambda: generate(model, tokenizer, [ex], [k], dataclasses.replace(qa.settings,
                                                                                                  batch_size=1)))
        from odqa.reader.fid_data import FiDCollator
        batch = FiDCollator(tokenizer, k, qa.settings.text_maxlength).encode_passages([ex])
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            enc_flops, _ = counted(lambda: model.get_encoder()(input_ids=batch["input_ids"],
                                                               attention_mask=batch["attention_mask"]))
        flops["reader encoder"] += enc_flops
        # the decoder's first step projects every encoder state to cross-attention keys and values (a
        # large product, cached after); each step then reads its weights and the vocabulary once
        kv = 2 * 2.0 * decoder_layers(model) * batch["input_ids"].numel() * d_model ** 2
        flops["cross-attention keys and values"] += kv
        flops["reader decoder"] += read_flops - enc_flops - kv
        shapes["reader"].append(int(batch["attention_mask"].sum()))
        shapes["padded"].append(batch["input_ids"].numel())
        if a.prefilter is not None:
            rows = a.prefilter.search([q], qa.search_config.prefilter.top_docs)[0][0]
            rows = rows[rows >= 0]
            shapes["scored"].append(int((a.doc_vec_end[rows] - a.doc_vec_start[rows]).sum()))
    n = len(questions)
    dim = a.index.manifest["dim"]
    if a.prefilter is not None:
        docs, doc_dim = a.prefilter.index.ntotal, a.prefilter.index.d
        flops["pre-filter"] = 2.0 * docs * doc_dim * n
        scored = float(np.mean(shapes["scored"]))
        flops["phrase search"] = 2 * 2.0 * scored * dim * n     # both sides' inner products, which the codes stand for
    if a.memory is not None:
        flops["memory"] = 2.0 * len(a.memory) * a.memory.manifest["dim"] * n
    qlen, rlen = int(np.mean(shapes["question"])), int(np.mean(shapes["reader"]))
    bf16, f32 = torch.bfloat16, torch.float32
    dtype = a.model.q_start_lm.dtype
    vocab = model.get_output_embeddings().weight.shape[0]
    rates = {"question encoders": gflops(qlen, d_model, 4 * d_model, dtype),
             "pre-filter": gflops(1, a.prefilter.index.d, a.prefilter.index.ntotal, f32) if a.prefilter else None,
             "phrase search": gflops(int(scored), dim, 1, f32) if a.prefilter else None,
             "memory": gflops(1, a.memory.manifest["dim"], len(a.memory), f32) if a.memory else None,
             "reader encoder": gflops(rlen, d_model, 4 * d_model, bf16),
             "reader decoder": gflops(1, d_model, vocab, bf16),
             "cross-attention keys and values": gflops(int(np.mean(shapes["padded"])), d_model, d_model, bf16)}
    print(f"one answer at a time, k = {k}, {n} questions ({platform.processor() or platform.machine()}, "
          f"{torch.get_num_threads()} thread(s)); question {qlen} tokens, reader {rlen} tokens of "
          f"{k} x {qa.settings.text_maxlength}")
    print("| stage | ms/answer | GFLOP/answer | GFLOP/s here (shape) | floor ms | ratio |")
    print("|---|---:|---:|---:|---:|---:|")
    shapes_of = {"question encoders": f"{qlen}x{d_model}x{4 * d_model} {str(dtype)[6:]}",
                 "pre-filter": "1xdxdocs f32", "phrase search": "vectorsxdx1 f32", "memory": "1xdxquestions f32",
                 "reader encoder": f"{rlen}x{d_model}x{4 * d_model} bf16",
                 "reader decoder": f"1x{d_model}x{vocab} bf16; keys and values {int(np.mean(shapes['padded']))}x{d_model}"
                                   f"x{d_model}: {rates['cross-attention keys and values']:.0f}"}
    kv = flops.pop("cross-attention keys and values")
    floors = {name: 1000 * flops[name] / n / (rates[name] * 1e9) for name in STAGES if rates.get(name) and flops[name]}
    floors["reader decoder"] += 1000 * kv / n / (rates["cross-attention keys and values"] * 1e9)
    flops["reader decoder"] += kv
    for name in STAGES:
        ms = 1000 * seconds.get(name, 0.0) / n
        if name in floors:
            print(f"| {name} | {ms:.1f} | {flops[name] / n / 1e9:.3f} | {rates[name]:.0f} ({shapes_of[name]}) | "
                  f"{floors[name]:.2f} | {ms / floors[name]:.1f}x |")
        else:
            print(f"| {name} | {ms:.1f} | - | - | - | - |")
    other = 1000 * (total - sum(seconds.values())) / n
    print(f"| other (outside the stages) | {other:.1f} | | | | |")
    whole = 1000 * total / n
    print(f"| **whole answer** | {whole:.1f} | | | {sum(floors.values()):.2f} | {whole / sum(floors.values()):.1f}x |")
    reader = sum(1000 * seconds[s] / n for s in ("reader input", "reader encoder", "reader decoder"))
    reader_floor = floors["reader encoder"] + floors["reader decoder"]
    print(f"reader at k={k}: {reader:.0f} ms against a floor of {reader_floor:.0f} ms: {reader / reader_floor:.2f}x")

def read_table(qa, examples: list[FiDExample], k: int) -> None:
    model, tokenizer = qa.reader
    settings = qa.settings
    # its own copy, as transformers loads it: none of the reading choices `load_reader` makes
    loop = FiDLoop(load_reader(qa.parts.reader, reading=False)[0], tokenizer, k, settings.text_maxlength,
                   settings.max_new_tokens)
    free = dataclasses.replace(settings, decoding="free")

    def timed(fn) -> tuple[list[str], float]:
        fn(examples[:2])                                      # warm
        start = time.perf_counter()
        out = fn(examples)
        return out, len(examples) / (time.perf_counter() - start)

    float32 = load_reader(qa.parts.reader)[0]   # the pipeline's holds its linear layers in the default dtype

    def read(s, dtype=None):
        return lambda exs: generate(float32 if dtype == torch.float32 else model, tokenizer, exs, [k], s,
                                    dtype=dtype)[k]
    runs = {"FiD loop (float32, one question a batch, padded, free)": timed(lambda exs: [loop.answer(e) for e in exs]),
            "odqa read, free decoding, float32": timed(read(free, torch.float32)),
            "odqa read, free decoding (default dtype)": timed(read(free)),
            "odqa read, span decoding, float32": timed(read(settings, torch.float32)),
            "odqa read, span decoding (default: the demo's)": timed(read(settings))}
    baseline, base_qps = runs["FiD loop (float32, one question a batch, padded, free)"]
    print(f"\nreading {len(examples)} questions at k = {k} (batch {settings.batch_size}, text_maxlength "
          f"{settings.text_maxlength}, max_new_tokens {settings.max_new_tokens}); FiD loop = the baseline")
    print("| reader | questions/s | vs FiD loop | EM | predictions equal to the FiD loop's |")
    print("|---|---:|---:|---:|---:|")
    for name, (preds, qps) in runs.items():
        em = 100 * np.mean([answer_em(p, ex.answers) for p, ex in zip(preds, examples)])
        same = sum(p == b for p, b in zip(preds, baseline))
        print(f"| {name} | {qps:.2f} | {qps / base_qps:.2f}x | {em:.1f} | {same}/{len(examples)} |")
    for decoding in ("free", "span"):
        a = runs[f"odqa read, {decoding} decoding, float32"][0]
        b = runs[f"odqa read, {decoding} decoding (default dtype)" if decoding == "free"
                  else "odqa read, span decoding (default: the demo's)"][0]
        print(f"{decoding} decoding: the default dtype changes {sum(x != y for x, y in zip(a, b))} of "
              f"{len(examples)} predictions against float32")
    preds, qps = runs["odqa read, free decoding (default dtype)"]
    same = sum(p == b for p, b in zip(preds, baseline))
    print(f"read vs FiD loop: {qps / base_qps:.2f}x questions/s, predictions equal {same}/{len(examples)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--questions", default="nq-test")
    ap.add_argument("--n", type=int, default=200, help="questions (default 200)")
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1: one core, as served)")
    ap.add_argument("--quick", action="store_true", help="50 questions")
    ap.add_argument("--skip-stages", action="store_true", help="only the read comparison")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    n = 50 if args.quick else args.n
    qa = odqa.load()
    questions = load_questions(args.questions, limit=n)
    if not args.skip_stages:
        stage_table(qa, [q.question for q in questions], args.k)
    results = qa.searcher.search([q.question for q in questions], args.k)
    examples = [FiDExample(id=str(i), question=q.question, answers=list(q.answers),
                           passages=[(h.unit.title, h.unit.text) for h in r.hits])
                for i, (q, r) in enumerate(zip(questions, results))]
    read_table(qa, examples, args.k)


if __name__ == "__main__":
    main()
