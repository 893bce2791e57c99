"""How long each stage of `odqa demo` takes: a reference cost per unit of work, measured on a 2-core
CPU (REFERENCE), times the work a config asks for over its corpus, times this machine's speed against
the reference machine's (`machine_speed`, then `refined` by the stages as they finish).

    Estimates(cfg, sizes, test_size, reader_bf16, reader_frozen).reader()   # reference seconds
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

from odqa.common.corpus import PassageStore

# Seconds on the reference machine (2 CPU cores, AVX2), from `odqa demo` runs there; ENCODE_S is what
# `machine_speed` measures, so the ratio of the two scales every other figure to this machine.
REFERENCE = dict(
    encode_s=0.034,           # one passage through the MiniLM at <= 128 tokens, batch 32 (`machine_speed`)
    data_s=60, supervise_q_s=0.0015, index_s=240, filter_s=50, reader_init_s=40, deepspeed_start_s=30, doc_start_s=40,
    run_start_s=30,           # loading the searcher, the reader and the baselines
    # index_s: OPQ16,IVF256,PQ16 over 202k vectors a side took 5.8 CPU-minutes (1 thread, shared machine)
    phrase_step_s=4.8,        # batch 16 at 192 passage tokens
    phrase_encode_s=0.035,    # a passage through the phrase encoder (dump, validation)
    query_q_s=0.1,            # a question an epoch of query-side tuning: its search and its share of the steps
    doc_step_doc_s=0.2,       # per document of a training batch
    doc_encode_s=0.031,       # a document summary at 128 tokens
    search_q_s=0.015,         # a pre-filtered phrase search, k = 5-100 (1,000 NQ-test questions: 14 s at
                              # k = 100, 11 s at k = 25, 1 thread; the reader's 7,489 at k = 5 in 128 s)
    pretrain_step_s=3.0,      # batch 32 x 128 tokens, tiny preset
    fid_token_s=0.0004,       # per (passage x token) of a training batch, tiny preset
    read_token_s=0.00004,     # per (passage x token) read, greedy decoding, tiny preset
    warm_fid_token_s=0.0010,  # the same for the bert2bert reader (MiniLM encoder, 2 decoder layers), span loss
    warm_read_token_s=0.00028,  # the full preset's run stage read 57-60 questions a minute at k = 5, 10, 25
                                # (160 tokens) on a float32 2-core CPU at 0.93x the reference's time (2026-11-30)
    rerank_pair_s=0.12,       # a question-passage pair of a reranker training step (forward and backward,
                              # <= 128 tokens; 400 steps of 8 x 4 pairs took 23 minutes on a float32-only
                              # 2-core machine); scoring one is about encode_s
    rerank_groups=0.45,       # share of the training questions with both kinds of passage in their top 20
    memory_q_s=0.0099,        # a question through both question encoders, batch 64: 17,594 in 2.7 min in float32
                              # at 0.93x the reference, twice (2026-11-30); 33 s where the CPU computes bfloat16
)


PRIOR_S = 300
BF16_TRAIN_SPEEDUP = 1.4      # a FiD step under bfloat16 autocast on a CPU that computes it natively (docs/notes/reader.md)
# The warm reader's FiD step on a float32 CPU (docs/notes/reader.md, "The reader's step on a float32 CPU"): ZeRO-0
# against the reference's ZeRO-2 in one process, and the share of the step that holding the embeddings,
# then each of the MiniLM's encoder blocks above them, fixed saves.
ZERO0_TRAIN_SPEEDUP = 1.28
FROZEN_EMBEDDINGS_SAVE, FROZEN_BLOCK_SAVE = 0.19, 0.085


def refined(calibrated: float, spent: float, estimated: float) -> float:
    """This machine's speed once stages estimated at `estimated` reference seconds took `spent`: the
    calibration counts as PRIOR_S of observed stages, so one short stage cannot swing it."""
    return (calibrated * PRIOR_S + spent) / (PRIOR_S + estimated)


class Estimates:
    """Reference seconds of each demo stage for a `RecipeConfig`, over `sizes` (passages, documents,
    training examples) and the test sets' sizes (`test_size`), with the reader trained in bfloat16
    (`reader_bf16`) and holding fixed what `reader_frozen` says."""

    def __init__(self, cfg, sizes: tuple[int, int, int], test_size: Callable[[str], int], reader_bf16: bool,
                 reader_frozen: dict):
        self.c, self.ref = cfg, REFERENCE
        self.n_pass, self.n_docs, self.n_train = sizes
        self.test_size, self.reader_bf16, self.reader_frozen = test_size, reader_bf16, reader_frozen

    # the work, which the stages' descriptions name too
    @property
    def phrase_epochs(self) -> int:
        return self.c.phrase.epochs + len(self.c.phrase_round_lrs)

    @property
    def phrase_steps(self) -> int:
        return self.phrase_epochs * (min(self.c.phrase.max_train_examples or self.n_train, self.n_train) // self.c.phrase.batch_size)

    @property
    def doc_steps(self) -> int:
        return self.c.doc_rounds * (min(self.c.doc.max_train_examples or self.n_train, self.n_train) // self.c.doc.batch_size)

    @property
    def query_questions(self) -> int:
        return min(self.c.query.max_train_examples or self.n_train, self.n_train)

    @property
    def rerank_questions(self) -> int:
        return min(self.c.reranker.max_train_examples or self.n_train, self.n_train)

    @property
    def dev_questions(self) -> float:
        return 17_600 * len(self.c.supervise.questions) / 2   # NQ-dev and TQA-dev hold 17,594 between them

    # each stage's reference seconds
    def data(self) -> float:
        return self.ref["data_s"]

    def supervise(self) -> float:
        return self.ref["supervise_q_s"] * self.dev_questions

    def phrase(self) -> float:
        c, ref = self.c, self.ref
        return (self.phrase_steps * ref["phrase_step_s"] * c.phrase.batch_size / 16 * c.phrase.model_config.max_passage_tokens / 192
                + c.phrase.max_validation_examples * ref["phrase_encode_s"] * self.phrase_epochs)

    def index(self) -> float:
        c, ref = self.c, self.ref
        return (self.n_pass * ref["phrase_encode_s"] * min(1.0, c.phrase.model_config.max_passage_tokens / 160) + ref["index_s"]
                + (ref["filter_s"] if c.index.keep < 1 else 0))

    def query(self) -> float:
        return self.c.query_rounds * self.c.query.epochs * self.query_questions * self.ref["query_q_s"]

    def doc(self) -> float:
        c, ref = self.c, self.ref
        doc_s = ref["doc_encode_s"] * c.doc.model_config.max_doc_tokens / 128      # one document summary encoded
        return (ref["doc_start_s"] + self.doc_steps * c.doc.batch_size * ref["doc_step_doc_s"]
                * (2 if c.doc.negatives != "none" else 1) * c.doc.model_config.max_doc_tokens / 128
                + c.doc_rounds * (c.doc.validation_docs or self.n_docs) * doc_s + self.n_docs * doc_s
                + c.tune_lambda.limit * ref["search_q_s"])

    def refit(self) -> float:
        return self.query() * (1 + self.c.supervise.validation_percent / (100 - self.c.supervise.validation_percent))

    def reader_token_s(self) -> tuple[float, float]:
        """Reference seconds per (passage x token) to train on and to read, for the reader the demo makes."""
        if self.c.reader_model is None and self.c.reader_kind == "warm":
            return self.ref["warm_fid_token_s"], self.ref["warm_read_token_s"]
        return self.ref["fid_token_s"], self.ref["read_token_s"]

    def questions_searched(self) -> int:
        """The training and validation questions whose passages the reader stage searches for."""
        c, train = self.c, self.n_train
        return min(c.reader_questions or train, train) + round(train * c.supervise.validation_percent / (100 - c.supervise.validation_percent))

    def reader(self) -> float:
        c, ref = self.c, self.ref
        train_s, read_s = self.reader_token_s()
        train_s /= BF16_TRAIN_SPEEDUP if self.reader_bf16 else 1.0
        train_s /= ZERO0_TRAIN_SPEEDUP if c.reader_loop.zero_stage == 0 else 1.0
        if self.reader_frozen["freeze_embeddings"]:
            train_s *= 1 - FROZEN_EMBEDDINGS_SAVE - FROZEN_BLOCK_SAVE * self.reader_frozen["freeze_layers"]
        pretrain = c.pretrain_steps * ref["pretrain_step_s"] if c.reader_kind == "t5" and not c.reader_model else 0
        return ((0 if c.reader_model else ref["reader_init_s"]) + ref["deepspeed_start_s"] * (2 if c.gold_steps else 1)
                + pretrain + c.reader.reading.text_maxlength * train_s * (c.gold_steps * c.gold_batch
                                                           + c.reader_loop.max_steps * c.reader_loop.batch_size * c.reader.k)
                + c.reader.max_validation_examples * c.reader.reading.text_maxlength * read_s * (c.gold_evals + c.reader.k) * 2
                + (self.questions_searched() * ref["search_q_s"] if c.reader_passages == "phrase" else 0))

    def reranker(self) -> float:
        c, ref = self.c, self.ref
        return ((self.rerank_questions + c.reranker.max_validation_examples) * ref["search_q_s"]
                + self.rerank_questions * ref["rerank_groups"] * 4 * ref["rerank_pair_s"]
                + c.reranker.max_validation_examples * c.reranker.rerank_depth * ref["encode_s"])

    def memory(self) -> float:
        return self.dev_questions * self.ref["memory_q_s"]

    def run(self) -> float:
        c, ref = self.c, self.ref
        run_q = sum(self.test_size(name) for name in c.run.questions)
        # `odqa run` reads every k in one pass: the passages are encoded once, at the largest k
        return (ref["run_start_s"] + run_q * (ref["search_q_s"] + max(c.run.k) * c.reading.text_maxlength * self.reader_token_s()[1])
                + (self.n_pass * ref["encode_s"] if "dense" in c.run.baselines else 0))


def machine_speed(encoder: str, corpus: Path, n: int = 64) -> float:
    """Seconds to encode a passage here over REFERENCE["encode_s"] (batch 32, <= 128 tokens), in float32
    as on the reference machine: the stages train and dump in float32, and a CPU that computes bfloat16
    natively would encode 2-4x faster in it than it trains, making every estimate short."""
    import torch

    from odqa.retriever.dense import MeanPoolEncoder
    store = PassageStore(corpus)
    texts = [f"{p['title']} {p['text']}" for _, p in zip(range(n), store)]
    store.close()
    enc = MeanPoolEncoder(encoder, max_tokens=128, dtype=torch.float32)
    enc.encode(texts[:16], batch_size=16)    # warm-up
    t0 = time.perf_counter()
    enc.encode(texts, batch_size=32)
    return (time.perf_counter() - t0) / max(len(texts), 1) / REFERENCE["encode_s"]
