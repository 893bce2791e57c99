"""`odqa train-reader`: FiD training on retrieval files, through the shared training loop
(odqa.common.trainer; DeepSpeed by default).

Without a separate validation file the training files' questions are split by the same question hash
as `odqa supervise`, so the reader is validated on dev questions it never trains on. Validation is
greedy decoding scored by EM (common.metrics).
"""
from __future__ import annotations

import logging
from dataclasses import asdict

import torch

from odqa.common import trainer
from odqa.common.io import InputError, write_json
from odqa.common.metrics.answers import answer_em
from odqa.common.model_card import Card
from odqa.common.questions import split_of
from odqa.common.settings import needs
from odqa.reader.args import LoopArgs, ReaderArgs
from odqa.reader.fid_data import FiDCollator, FiDExample, load_fid_file
from odqa.reader.read import generate, load_reader
from odqa.reader.task import reader_task

log = logging.getLogger(__name__)


def split_examples(args: ReaderArgs) -> tuple[list[FiDExample], list[FiDExample]]:
    if not args.train_file:
        raise InputError("--train-file: give at least one retrieval file")
    examples = [ex for path in args.train_file for ex in load_fid_file(path)]
    if args.validation_file:
        train, validation = examples, load_fid_file(args.validation_file)
    else:
        parts = {"train": [], "validation": []}
        for ex in examples:
            parts[split_of(ex.question, args.validation_percent)].append(ex)
        train, validation = parts["train"], parts["validation"]
    if not args.keep_unanswerable:
        if any(ex.has_answer is None for ex in train):
            raise InputError("training files lack ctxs' \"has_answer\": pass --keep-unanswerable or write them "
                             "with `odqa retrieve`")
        train = [ex for ex in train if any(ex.has_answer[: args.k])]
    train = [ex for ex in train if ex.answers or ex.target]
    if not train:
        raise InputError("no training questions left (none has an answer in its top-k passages)")
    return train, validation[: args.max_validation_examples]


def make_evaluate(validation: list[FiDExample], tokenizer, args: ReaderArgs, device):
    def evaluate(model, rank: int, world: int) -> dict:
        mine = validation[rank::world]
        predictions = generate(model, tokenizer, mine, [args.k], args.reading, device)[args.k] if mine else []
        counts = torch.tensor([sum(answer_em(p, ex.answers, ex.regex) for p, ex in zip(predictions, mine)),
                               len(mine)], dtype=torch.float64)
        if world > 1:
            torch.distributed.all_reduce(counts)
        return {"em": 100.0 * counts[0].item() / max(counts[1].item(), 1)}
    return evaluate


def train_reader(args: ReaderArgs, loop: LoopArgs) -> dict:
    needs(args, "model")
    needs(loop, "out_dir")
    if args.passage_loss_coef is not None and args.passage_loss_coef < 0:
        raise InputError(f"--passage-loss-coef must be >= 0, not {args.passage_loss_coef}")
    if loop.resume:   # before anything is written over
        trainer.check_resumed_settings(f"{loop.out_dir}/reader_args.json", asdict(args))
    engine = trainer.make_engine(loop)
    rank, world, device = engine.rank, engine.world, engine.device
    train_ex, validation = split_examples(args)
    if not validation:
        raise InputError("no validation questions: pass --validation-file or a larger --validation-percent")
    model, tokenizer = load_reader(args.model, "cpu", reading=False)
    if args.passage_loss_coef is not None:
        model.config.passage_loss_coef = args.passage_loss_coef     # saved with the checkpoints
    collator = FiDCollator(tokenizer, args.k, args.reading.text_maxlength, args.reading.max_new_tokens, args.span_loss)
    log.info("FiD on %d training / %d validation questions, k=%d, %d processes", len(train_ex), len(validation),
             args.k, world)
    if rank == 0:
        write_json(f"{loop.out_dir}/reader_args.json", {**asdict(args), "train_questions": len(train_ex),
                                                         "validation_questions": len(validation)})
    task = reader_task(model, tokenizer, train_ex, lambda exs, rng: collator(exs, rng if args.random_answer else None),
                       make_evaluate(validation, tokenizer, args, device), "em", loop,
                       Card("FiD reader", "train-reader", args.model, list(args.train_file), args.validation_file))
    state = trainer.train(task, loop, engine, loop.out_dir, "train-reader")
    return {"train_questions": len(train_ex), "validation_questions": len(validation), **state}
