"""`odqa reader init`: a from-scratch T5 when no pretrained one can be downloaded.

A SentencePiece unigram tokenizer is trained on the corpus text with T5's layout (pad 0, eos 1, unk 2,
then the pieces, then 100 sentinels <extra_id_99> ... <extra_id_0> at the top of the vocabulary), and a
T5 config is built from a preset. The output directory is an ordinary HF checkpoint: model weights,
config and a tokenizer that `AutoTokenizer.from_pretrained` loads, so everything downstream treats it
like t5-base.
"""
from __future__ import annotations

import logging
import os
import string
from collections.abc import Iterable, Iterator
from pathlib import Path

import sentencepiece as spm
import torch
from transformers import AutoTokenizer, T5Config, T5Tokenizer

from odqa.common.io import InputError, atomic_path, write_json
from odqa.common.weights import seal
from odqa.reader.args import SHAPES, ReaderInitArgs
from odqa.reader.fid import FiDT5

log = logging.getLogger(__name__)

# Shapes of T5 v1.0 (ReLU feed-forward, tied embeddings) at three sizes; "small"/"base" are t5-small/t5-base.
SENTINELS = 100
# FiD's input template, so its words are pieces of their own.
_ALWAYS_SEEN = ["question: title: context:"]
# Every ASCII symbol is kept as a piece, so questions never hit <unk> on a character that is rare in the
# passages: character_coverage alone drops the "?" of Wikipedia text, which nearly every TriviaQA question ends with.
_REQUIRED_CHARS = string.punctuation + string.ascii_letters + string.digits


def passage_text(passage: dict) -> str:
    """The text of a corpus passage as the reader's language model sees it in training."""
    return f"{passage['title']}. {passage['text']}"


def train_tokenizer(texts: Iterable[str], out_dir: str | os.PathLike, vocab_size: int,
                    max_sentences: int = 2_000_000) -> T5Tokenizer:
    """Train the unigram model on `texts` and save a T5 tokenizer (tokenizer.json) into `out_dir`.
    `vocab_size` counts the sentinels and is an upper bound: a small corpus may yield fewer pieces."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    pieces = vocab_size - SENTINELS

    def sentences() -> Iterator[str]:
        yield from _ALWAYS_SEEN
        for n, text in enumerate(texts):
            if n >= max_sentences:
                break
            if text.strip():
                yield text

    spm_dir = out_dir / "sentencepiece"
    spm_dir.mkdir(exist_ok=True)
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=sentences(), model_prefix=str(spm_dir / "spiece"), vocab_size=pieces,
            model_type="unigram", pad_id=0, eos_id=1, unk_id=2, bos_id=-1, pad_piece="<pad>", eos_piece="</s>",
            unk_piece="<unk>", character_coverage=0.9995, input_sentence_size=max_sentences,
            shuffle_input_sentence=True, hard_vocab_limit=False, required_chars=_REQUIRED_CHARS, minloglevel=2)
    except RuntimeError as e:
        raise InputError(f"SentencePiece could not train a {pieces}-piece vocabulary on this corpus ({e}); "
                         f"try another --vocab-size") from e
    # T5Tokenizer reads spiece.model only through from_pretrained (its vocab_file argument is ignored).
    tokenizer = T5Tokenizer.from_pretrained(str(spm_dir), extra_ids=SENTINELS)
    tokenizer.save_pretrained(str(out_dir))
    return AutoTokenizer.from_pretrained(str(out_dir))


def t5_config(preset: str, vocab_size: int) -> T5Config:
    if preset not in SHAPES:
        raise InputError(f"unknown shape {preset!r}: one of {', '.join(SHAPES)}")
    p = SHAPES[preset]
    return T5Config(vocab_size=vocab_size, d_model=p["d_model"], d_ff=p["d_ff"], num_layers=p["num_layers"],
                    num_decoder_layers=p["num_layers"], num_heads=p["num_heads"], d_kv=p["d_kv"],
                    feed_forward_proj="relu", tie_word_embeddings=True, dropout_rate=0.1,
                    pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)


def init_reader(texts: Iterable[str], out_dir: str | os.PathLike, settings: ReaderInitArgs = ReaderInitArgs()) -> dict:
    """Tokenizer + randomly initialised T5 of `settings.shape`, its weights drawn from `settings.seed`,
    written atomically to `out_dir`."""
    preset = settings.shape
    if preset not in SHAPES:
        raise InputError(f"unknown preset {preset!r}: one of {', '.join(SHAPES)}")
    vocab_size = settings.vocab_size or SHAPES[preset]["vocab"]
    with atomic_path(out_dir) as tmp:
        tokenizer = train_tokenizer(texts, tmp, vocab_size)
        config = t5_config(preset, len(tokenizer))
        torch.manual_seed(settings.seed)
        model = FiDT5(config)
        model.save_pretrained(str(tmp))
        info = {"preset": preset, "vocab_size": len(tokenizer), "parameters": model.num_parameters(),
                **SHAPES[preset]}
        write_json(tmp / "reader_init.json", info)
        seal(tmp)
    log.info("%s T5, %d parameters, %d-token vocabulary -> %s", preset, info["parameters"], len(tokenizer), out_dir)
    return info
