"""`odqa read`: batched FiD generation over a retrieval file, predictions as JSONL, EM printed.

`load_reader` checks that checkpoint and tokenizer fit each other before any generation, so a reader
trained with another vocabulary fails with a message instead of producing garbage.
"""
from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import torch
from tqdm import tqdm
from transformers import AutoConfig, AutoTokenizer

from common.io import InputError
from common.metrics.answers import answer_em
from reader.fid import FiDT5
from reader.fid_data import FiDCollator, FiDExample, load_fid_file, write_predictions

log = logging.getLogger(__name__)


def load_reader(name_or_path: str | os.PathLike, device: str | torch.device = "cpu",
                tokenizer_path: str | os.PathLike | None = None):
    """(FiDT5, tokenizer) from any T5 checkpoint: a directory or a hub name such as t5-base."""
    name = str(name_or_path)
    if (Path(name).exists() or os.sep in name) and not (Path(name) / "config.json").is_file():
        raise InputError(f"reader checkpoint not found: {name} has no config.json")
    try:
        config = AutoConfig.from_pretrained(name)
    except OSError as e:
        raise InputError(f"cannot load reader checkpoint {name!r}: {e}") from e
    if config.model_type != "t5":
        raise InputError(f"{name}: a {config.model_type!r} checkpoint, the reader needs a T5 one")
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_path or name))
    if len(tokenizer) > config.vocab_size:
        raise InputError(f"{name}: the tokenizer has {len(tokenizer)} tokens but the model's vocabulary only "
                         f"{config.vocab_size}: checkpoint and tokenizer do not belong together")
    try:
        model = FiDT5.from_pretrained(name)
    except (RuntimeError, ValueError) as e:   # a weight of the wrong shape
        raise InputError(f"{name}: weights do not fit its config: {e}") from e
    emb = model.get_input_embeddings().weight.shape
    if emb[0] != config.vocab_size or emb[1] != config.d_model:
        raise InputError(f"{name}: embedding {tuple(emb)} does not fit the config "
                         f"({config.vocab_size} x {config.d_model})")
    return model.to(device).eval(), tokenizer


@torch.no_grad()
def generate_answers(model, tokenizer, examples: list[FiDExample], n_passages: int, batch_size: int = 8,
                     text_maxlength: int = 200, max_new_tokens: int = 32, num_beams: int = 1,
                     device: str | torch.device = "cpu", progress: bool = True) -> list[str]:
    collator = FiDCollator(tokenizer, n_passages, text_maxlength)
    was_training = model.training
    model.eval()
    out = []
    for i in tqdm(range(0, len(examples), batch_size), desc=f"read k={n_passages}", unit=" batch",
                  disable=not progress or None, mininterval=2):
        batch = collator.encode_passages(examples[i:i + batch_size])
        ids = model.generate(input_ids=batch["input_ids"].to(device), attention_mask=batch["attention_mask"].to(device),
                             max_new_tokens=max_new_tokens, num_beams=num_beams, do_sample=False)
        out += tokenizer.batch_decode(ids, skip_special_tokens=True)
    model.train(was_training)
    return [p.strip() for p in out]


def read(model_path: str | os.PathLike, fid_file: str | os.PathLike, out: str | os.PathLike, n_passages: int = 10,
         batch_size: int = 8, text_maxlength: int = 200, max_new_tokens: int = 32, num_beams: int = 1,
         limit: int | None = None, device: str | None = None) -> dict:
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    model, tokenizer = load_reader(model_path, device)
    return read_with(model, tokenizer, fid_file, out, n_passages, batch_size, text_maxlength, max_new_tokens,
                     num_beams, limit, device)


def read_with(model, tokenizer, fid_file: str | os.PathLike, out: str | os.PathLike, n_passages: int = 10,
              batch_size: int = 8, text_maxlength: int = 200, max_new_tokens: int = 32, num_beams: int = 1,
              limit: int | None = None, device: str | torch.device = "cpu") -> dict:
    """`read` with a reader already loaded (`load_reader`), for callers that read many files."""
    examples = load_fid_file(fid_file, limit=limit)
    start = time.perf_counter()
    predictions = generate_answers(model, tokenizer, examples, n_passages, batch_size, text_maxlength,
                                   max_new_tokens, num_beams, device)
    seconds = time.perf_counter() - start
    correct = [answer_em(p, ex.answers, ex.regex) for p, ex in zip(predictions, examples)]
    write_predictions(out, examples, predictions, correct)
    em = 100.0 * sum(correct) / len(correct)
    log.info("EM %.2f on %d questions, k=%d, %.1f questions/s", em, len(correct), n_passages, len(correct) / seconds)
    return {"questions": len(correct), "em": em, "k": n_passages, "seconds": seconds}
