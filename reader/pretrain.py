"""`odqa pretrain-reader`: T5's span-corruption objective on the corpus passages, so a reader built by
`odqa reader init` starts from a model of the language rather than from random weights.

Per passage (title + text, at most `input_length` tokens): 15% of the tokens, in spans of mean length
3, are dropped from the input, each span replaced by a sentinel <extra_id_i>; the target lists the
sentinels each followed by the tokens it hid (Raffel et al., 2020, section 3.1.4). The masks are drawn
anew for every batch; validation uses fixed masks and reports the loss on held-out passages.
"""
from __future__ import annotations

import itertools
import logging
import random
from dataclasses import asdict
from pathlib import Path

import torch

from odqa.common import trainer
from odqa.common.corpus import PassageStore
from odqa.common.io import InputError, write_json
from odqa.common.model_card import Card
from odqa.reader.args import LoopArgs, PretrainArgs
from odqa.reader.read import load_reader
from odqa.reader.t5_init import SENTINELS, passage_text
from odqa.reader.task import reader_task

log = logging.getLogger(__name__)


def _segment(total: int, parts: int, rng: random.Random) -> list[int]:
    """`total` items cut into `parts` non-empty runs at random."""
    cuts = sorted(rng.sample(range(1, total), parts - 1)) if parts > 1 else []
    bounds = [0, *cuts, total]
    return [b - a for a, b in itertools.pairwise(bounds)]


def span_corrupt(ids: list[int], sentinel_ids: list[int], eos_id: int, rng: random.Random,
                 noise_density: float = 0.15, mean_span_length: float = 3.0) -> tuple[list[int], list[int]]:
    """(input, target) for one token sequence (without eos)."""
    n = len(ids)
    n_noise = min(max(round(n * noise_density), 1), n - 1)
    n_spans = min(max(round(n_noise / mean_span_length), 1), n_noise, n - n_noise, len(sentinel_ids))
    noise, keep = _segment(n_noise, n_spans, rng), _segment(n - n_noise, n_spans, rng)
    source, target, pos = [], [], 0
    for i, (k, z) in enumerate(zip(keep, noise)):
        source += ids[pos:pos + k] + [sentinel_ids[i]]
        pos += k
        target += [sentinel_ids[i]] + ids[pos:pos + z]
        pos += z
    return source + [eos_id], target + [eos_id]


class SpanCorruptionCollator:
    def __init__(self, tokenizer, input_length: int, noise_density: float, mean_span_length: float):
        self.pad = tokenizer.pad_token_id
        self.eos = tokenizer.eos_token_id
        self.sentinels = tokenizer.convert_tokens_to_ids([f"<extra_id_{i}>" for i in range(SENTINELS)])
        if any(s is None or s == tokenizer.unk_token_id for s in self.sentinels):
            raise InputError("the reader's tokenizer has no <extra_id_i> sentinel tokens")
        self.input_length = input_length
        self.noise_density, self.mean_span_length = noise_density, mean_span_length

    def __call__(self, token_lists: list[list[int]], rng: random.Random) -> dict[str, torch.Tensor]:
        pairs = [span_corrupt(ids[: self.input_length], self.sentinels, self.eos, rng, self.noise_density,
                              self.mean_span_length) for ids in token_lists]
        src_len = max(len(s) for s, _ in pairs)
        tgt_len = max(len(t) for _, t in pairs)
        input_ids = torch.full((len(pairs), src_len), self.pad)
        labels = torch.full((len(pairs), tgt_len), -100)
        for i, (s, t) in enumerate(pairs):
            input_ids[i, :len(s)] = torch.tensor(s)
            labels[i, :len(t)] = torch.tensor(t)
        return {"input_ids": input_ids, "attention_mask": (input_ids != self.pad).long(), "labels": labels}


def tokenize_passages(corpus: str, tokenizer, input_length: int) -> list[list[int]]:
    store = PassageStore(Path(corpus))
    texts = [passage_text(p) for p in store]
    store.close()
    ids = tokenizer(texts, add_special_tokens=False, truncation=True, max_length=input_length)["input_ids"]
    return [x for x in ids if len(x) >= 8]   # too short to hide a span in


def make_evaluate(validation: list[list[int]], collator: SpanCorruptionCollator, batch_size: int, device):
    fixed = [collator(validation[i:i + batch_size], random.Random(i)) for i in range(0, len(validation), batch_size)]

    @torch.no_grad()
    def evaluate(model, rank: int, world: int) -> dict:
        totals = torch.zeros(2, dtype=torch.float64)
        for batch in fixed[rank::world]:
            batch = {k: v.to(device) for k, v in batch.items()}
            tokens = (batch["labels"] != -100).sum()
            totals += torch.tensor([model(**batch).loss.item() * tokens.item(), tokens.item()], dtype=torch.float64)
        if world > 1:
            torch.distributed.all_reduce(totals)
        loss = totals[0].item() / max(totals[1].item(), 1)
        return {"neg_loss": -loss, "loss": loss}
    return evaluate


def pretrain_reader(args: PretrainArgs, loop: LoopArgs) -> dict:
    if loop.resume:   # before anything is written over
        trainer.check_resumed_settings(Path(loop.out_dir) / "pretrain_args.json", asdict(args))
    engine = trainer.make_engine(loop)
    rank, world, device = engine.rank, engine.world, engine.device
    model, tokenizer = load_reader(args.model, "cpu", reading=False)
    passages = tokenize_passages(args.corpus, tokenizer, args.input_length)
    random.Random(0).shuffle(passages)
    validation, passages_train = passages[: args.validation_passages], passages[args.validation_passages:]
    if not passages_train:
        raise InputError(f"{args.corpus}: too few passages to pretrain on")
    collator = SpanCorruptionCollator(tokenizer, args.input_length, args.noise_density, args.mean_span_length)
    log.info("span corruption on %d passages (%d held out), %d processes", len(passages_train), len(validation), world)
    if rank == 0:
        write_json(Path(loop.out_dir) / "pretrain_args.json", asdict(args))
    task = reader_task(model, tokenizer, passages_train, collator,
                       make_evaluate(validation, collator, args.eval_batch_size, device), "neg_loss", loop,
                       Card("T5 reader, span-corruption pretrained", "pretrain-reader", args.model, [args.corpus],
                            task="text2text-generation"))
    return trainer.train(task, loop, engine, loop.out_dir, "pretrain-reader")
