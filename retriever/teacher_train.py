"""`odqa train-teacher`: train the cross-encoder span reader that `train-phrase --teacher` distils from.

Same examples, tokens and loss as the phrase model's single-passage term (every occurrence of the
answer counted), but the question reads the passage through attention; validated by the EM of the
best span (at most L tokens) of each gold passage, the figure `train-phrase` reports for its own.
"""
from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import torch

from odqa.common.io import write_json
from odqa.common.model_card import Card
from odqa.common.settings import needs
from odqa.common.trainer import Task, check_resumed_settings, make_engine, seeded
from odqa.common.trainer import train as train_loop
from odqa.retriever.args import PhraseModelConfig, TeacherTrainArgs
from odqa.retriever.lm import load_tokenizer
from odqa.retriever.phrase_train import (
    em_hits,
    em_summary,
    gold_passage_inputs,
    load_splits,
    span_nll,
    training_batches,
)
from odqa.retriever.teacher import SpanTeacher


def teacher_loss(model, batch: dict, step: int) -> tuple[torch.Tensor, dict]:
    start, end = model(batch["questions"], batch["passages"])
    s = span_nll(start, batch["gold_start"], batch["candidate"]).mean()
    e = span_nll(end, batch["gold_end"], batch["candidate"]).mean()
    loss = (s + e) / 2
    return loss, {"loss": loss.item(), "start": s.item(), "end": e.item()}


@torch.no_grad()
def teacher_em(model: SpanTeacher, tokenizer, examples: list[dict], cfg: PhraseModelConfig,
               batch_size: int = 32) -> float:
    """EM of the teacher's best span in each example's gold passage."""
    model.eval()
    hits = 0
    for chunk, questions, enc in gold_passage_inputs(tokenizer, examples, cfg, batch_size):
        start, end = model(questions, enc.batch)
        hits += em_hits(chunk, enc, start.cpu(), end.cpu(), enc.candidate, cfg.max_span_len)
    model.train()
    return 100.0 * hits / max(len(examples), 1)


def train(args: TeacherTrainArgs) -> dict:
    needs(args, "train_file", "validation_file", "out_dir", "encoder")
    out = Path(args.out_dir)
    if args.resume:   # before anything is written over
        check_resumed_settings(out / "train_args.json", asdict(args))
    seeded(args.seed)
    model = SpanTeacher.from_encoder(args.encoder)
    tokenizer = load_tokenizer(args.encoder)
    # The phrase model's batching, so the teacher sees passages exactly as the phrase model cuts them.
    cfg = PhraseModelConfig(encoder=args.encoder, **asdict(args.model_config))
    train_ex, val_ex = load_splits(args)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "train_args.json", asdict(args))
    task = Task(model=model, n_batches=len(train_ex) // args.batch_size,
                batches=lambda epoch: training_batches(train_ex, tokenizer, cfg, args, epoch), loss=teacher_loss,
                save=lambda m, path: m.save_pretrained(path, tokenizer),
                evaluate=lambda m, rank, world: {"em": teacher_em(m, tokenizer, val_ex, cfg)}, metric="em",
                card=Card("cross-encoder span reader", "train-teacher", args.encoder, [args.train_file],
                          args.validation_file))
    return em_summary(train_loop(task, args, make_engine(args), out, "train-teacher"))
