"""What the reader's trainers (`train-reader`, `pretrain-reader`) give the shared loop
(odqa.common.trainer): the seq2seq model's loss, micro-batches in the order of (seed, epoch) with a
random generator of (seed, epoch, micro-batch) for what the collator draws (a random answer, the masked
spans), parameter groups with the new weights' own rate, and checkpoints with their tokenizer."""
from __future__ import annotations

import random
from collections.abc import Callable, Sequence

from odqa.common.io import InputError
from odqa.common.model_card import Card
from odqa.common.trainer import MicroBatches, Task, shuffled_batches
from odqa.reader.args import LoopArgs


def parameter_groups(model, args: LoopArgs) -> list[dict]:
    """One group at `lr`, or, with `new_lr` and a model that names its new weights, two."""
    new = model.new_parameters() if args.new_lr is not None and hasattr(model, "new_parameters") else set()
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    groups = [{"params": [p for n, p in named if n not in new], "lr": args.lr},
              {"params": [p for n, p in named if n in new], "lr": args.new_lr}]
    return [g for g in groups if g["params"]]


def seq2seq_loss(model, batch: dict, step: int):
    loss = model(**batch).loss
    return loss, {"loss": loss.item()}


def reader_task(model, tokenizer, examples: Sequence, make_batch: Callable[[list, random.Random], dict],
                evaluate: Callable, metric: str, args: LoopArgs, card: Card | None = None) -> Task:
    if args.gradient_checkpointing:
        model.encoder_gradient_checkpointing()
    if args.freeze_embeddings or args.freeze_layers:
        try:
            model.freeze_encoder_bottom(args.freeze_embeddings, args.freeze_layers)
        except ValueError as e:
            raise InputError(f"--freeze-layers: {e}") from None
    model.config.use_cache = False

    def batches(epoch: int) -> MicroBatches:
        order = shuffled_batches(len(examples), args.batch_size, args.seed, epoch)
        return MicroBatches(examples, order, lambda exs, m: make_batch(exs, random.Random(f"{args.seed}-{epoch}-{m}")))

    def save(m, path):
        m.save_pretrained(str(path))
        tokenizer.save_pretrained(str(path))

    return Task(model=model, n_batches=len(examples) // args.batch_size, batches=batches, loss=seq2seq_loss,
                save=save, evaluate=evaluate, metric=metric, groups=parameter_groups(model, args), card=card)
