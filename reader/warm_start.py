"""`odqa reader init --from ENCODER_DIR`: an encoder-decoder warm-started from one pretrained BERT
(bert2bert, Rothe, Narayan & Severyn, TACL 2020), for machines where no pretrained T5 can be had.

- encoder: the pretrained BERT as it is;
- decoder: a BERT with causal self-attention and cross-attention, `decoder_layers` deep, each layer a
  copy of one of the encoder's (evenly spaced from the bottom, as DistilBERT picks its layers); each
  layer's cross-attention starts as a copy of its own self-attention, so attending to the passages
  begins from a pretrained attention rather than from noise;
- word embeddings: one matrix for encoder input, decoder input and decoder output (declared tied in
  `FiDEncoderDecoder`); the LM head's transform is new;
- the tokenizer is the encoder's: [CLS] starts the answer, [SEP] ends it, [PAD] pads;
- `pointer` (default): the output also points at the passages' tokens (`FiDEncoderDecoder.pointing`;
  no new weights, a flag in the config). It reads far better on this machine's budgets (docs/notes/reader.md).
- `passage_prior` (default with the pointer): the pointer weighs each passage by a learned relevance
  (`FiDEncoderDecoder.has_passage_prior`; one linear layer, zero at the start).

The output is an HF checkpoint plus `reader_init.json`. The tied embedding is saved once, so load it
with `FiDEncoderDecoder.from_pretrained` (or reader.read.load_reader): a plain
`EncoderDecoderModel.from_pretrained` would leave the decoder's copy untied and random.
"""
from __future__ import annotations

import copy
import logging
import os
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModel, AutoTokenizer, BertLMHeadModel, EncoderDecoderConfig

from odqa.common.io import InputError, atomic_path, write_json
from odqa.common.weights import UNUSED_EXTRA, UNUSED_MISSING, from_pretrained_whole, seal
from odqa.reader.args import ReaderInitArgs
from odqa.reader.fid import FiDEncoderDecoder

log = logging.getLogger(__name__)


def decoder_layer_sources(encoder_layers: int, decoder_layers: int) -> list[int]:
    """Which encoder layer each decoder layer copies: evenly spaced from the bottom."""
    if not 1 <= decoder_layers <= encoder_layers:
        raise InputError(f"--decoder-layers must be in 1..{encoder_layers} (the encoder's depth), not {decoder_layers}")
    return [i * encoder_layers // decoder_layers for i in range(decoder_layers)]


def warm_start(encoder_dir: str | os.PathLike, settings: ReaderInitArgs = ReaderInitArgs()):
    """(FiDEncoderDecoder, tokenizer, the encoder layer each decoder layer copies) built from the BERT
    checkpoint at `encoder_dir` by `settings` (its decoder depth, dropout, pointer, passage prior and
    seed; its T5 fields are not read). Dropout is off by default: a CPU schedule trains for few steps,
    where underfitting, not overfitting, is the risk."""
    name, pointer = str(encoder_dir), settings.pointer
    passage_prior = pointer if settings.passage_prior is None else settings.passage_prior
    if passage_prior and not pointer:
        raise InputError("--passage-prior weighs the pointer's passages: it needs --pointer")
    try:
        enc_config = AutoConfig.from_pretrained(name)
    except (OSError, ValueError) as e:
        raise InputError(f"--from {name}: not a model checkpoint ({e})") from e
    if enc_config.model_type != "bert":
        raise InputError(f"--from {name}: a {enc_config.model_type!r} checkpoint; the warm start needs a BERT one")
    tokenizer = AutoTokenizer.from_pretrained(name)
    encoder = from_pretrained_whole(AutoModel, name, "the warm start's encoder weights", may_lack=UNUSED_MISSING,
                                    may_add=UNUSED_EXTRA, hidden_dropout_prob=settings.dropout,
                                    attention_probs_dropout_prob=settings.dropout)
    torch.manual_seed(settings.seed)
    dec_config = copy.deepcopy(encoder.config)
    dec_config.update(dict(is_decoder=True, add_cross_attention=True, num_hidden_layers=settings.decoder_layers,
                           tie_word_embeddings=True))
    sources = decoder_layer_sources(enc_config.num_hidden_layers, settings.decoder_layers)
    decoder = BertLMHeadModel(dec_config)
    decoder.bert.embeddings.load_state_dict(encoder.embeddings.state_dict())
    for layer, src in zip(decoder.bert.encoder.layer, sources):
        source = encoder.encoder.layer[src]
        missing, unexpected = layer.load_state_dict(source.state_dict(), strict=False)
        assert not unexpected and all(m.startswith("crossattention.") for m in missing), (missing, unexpected)
        layer.crossattention.load_state_dict(source.attention.state_dict())
    config = EncoderDecoderConfig.from_encoder_decoder_configs(encoder.config, dec_config)
    config.update(dict(decoder_start_token_id=tokenizer.cls_token_id, eos_token_id=tokenizer.sep_token_id,
                       pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=True, pointer=pointer,
                       passage_prior=passage_prior))
    model = FiDEncoderDecoder(config, encoder=encoder, decoder=decoder)
    model.tie_weights()
    model.generation_config.update(decoder_start_token_id=tokenizer.cls_token_id, eos_token_id=tokenizer.sep_token_id,
                                   pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.cls_token_id)
    return model, tokenizer, sources


def init_warm_reader(encoder_dir: str | os.PathLike, out_dir: str | os.PathLike,
                     settings: ReaderInitArgs = ReaderInitArgs()) -> dict:
    """The reader `warm_start` builds, written atomically to `out_dir`. The passage prior follows the
    pointer unless told."""
    model, tokenizer, sources = warm_start(encoder_dir, settings)
    with atomic_path(out_dir) as tmp:
        model.save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))
        info = {"kind": "bert2bert", "from": str(Path(encoder_dir)), "decoder_layers": settings.decoder_layers,
                "decoder_layer_sources": sources, "dropout": settings.dropout, "pointer": settings.pointer,
                "passage_prior": model.has_passage_prior, "parameters": model.num_parameters(),
                "new_parameters": sum(p.numel() for n, p in model.named_parameters() if n in model.new_parameters())}
        write_json(tmp / "reader_init.json", info)
        seal(tmp)
    log.info("bert2bert from %s: %d decoder layers (copies of %s), %d parameters -> %s", encoder_dir,
             settings.decoder_layers, sources, info["parameters"], out_dir)
    return info
