"""`odqa read`: batched FiD generation over a retrieval file, predictions as JSONL, EM printed.

`load_reader` tells the reader's kind (T5, or a warm-started encoder-decoder) from its config and
checks that checkpoint and tokenizer fit each other before any generation, so a reader trained with
another vocabulary fails with a message instead of producing garbage.

Decoding is `spans` (default: the answer is a span of an input passage, reader/spans.py), `free`, or
`phrases` (the `spans` answer or one of the passages' best phrases, as the reader scores them beside
the phrase scores: reader/fusion.py); an answer that spells a passage span is returned in the
passage's own characters.
"""
from __future__ import annotations

import logging
import os
import time
from collections import Counter
from pathlib import Path

import torch
from tqdm import tqdm
from transformers import AutoConfig, StoppingCriteria, StoppingCriteriaList

from odqa.common.device import search_dtype
from odqa.common.io import InputError
from odqa.common.metrics.answers import answer_em, is_echo
from odqa.common.ranks import current, split_map
from odqa.common.timings import check_deadline, past_deadline, stage
from odqa.common.weights import check_sealed, weight_file, weight_keys
from odqa.reader import fusion
from odqa.reader.args import ReaderSettings
from odqa.reader.checkpoints import load_tokenizer, load_weights
from odqa.reader.fid import FusedEncoderOutput, decoder_start_id, reader_class
from odqa.reader.fid_data import FiDCollator, FiDExample, answer_end_id, load_fid_file, write_predictions
from odqa.reader.spans import PassageSpans, strip_generated

log = logging.getLogger(__name__)

ECHO_RETRIES = 2   # an echo of the question is decoded again at most this many times (docs/notes/reader.md)


def _vocab_and_width(config) -> tuple[int, int]:
    if config.model_type == "encoder-decoder":
        return config.decoder.vocab_size, config.decoder.hidden_size
    return config.vocab_size, config.d_model


def check_reader(name: str):
    """(config, model class) of a reader checkpoint, or the named error its loading would end in, found
    without loading the weights: no config or not a reader's, files that differ from their checksums,
    a weight file whose header does not cover it (truncated). `odqa serve` checks before it starts."""
    if (Path(name).exists() or os.sep in name) and not (Path(name) / "config.json").is_file():
        raise InputError(f"reader checkpoint not found: {name} has no config.json")
    try:
        config = AutoConfig.from_pretrained(name)
    except (OSError, ValueError) as e:
        raise InputError(f"cannot load reader checkpoint {name!r}: {e}") from e
    cls = reader_class(config.model_type)
    if cls is None:
        raise InputError(f"{name}: a {config.model_type!r} checkpoint; the reader needs a T5 or an encoder-decoder "
                         f"(`odqa reader init --from`) one")
    if Path(name).is_dir():
        check_sealed(name, "reader")   # one odqa wrote; a hub or FiD checkpoint loads as it is
        weights = weight_file(name)
        if weights is not None and weights.suffix == ".safetensors":
            weight_keys(weights)   # safetensors checks that its header's offsets cover the file
    return config, cls


def load_reader(name_or_path: str | os.PathLike, device: str | torch.device = "cpu",
                tokenizer_path: str | os.PathLike | None = None, *, reading: bool = True):
    """(FiD model, tokenizer) from a T5 checkpoint (a directory or a hub name such as t5-base; FiD's own
    published readers too, reader/checkpoints.py) or a warm-started encoder-decoder (`odqa reader init
    --from`), told apart by the config. The tokenizer is `tokenizer_path`'s, else the checkpoint's, else
    the T5 of its width's (FiD ships none). `reading`: its decoder's attention chosen for reading on
    `device`; a trainer, which moves the model on, takes it as transformers loads it."""
    name = str(name_or_path)
    config, cls = check_reader(name)
    tokenizer = load_tokenizer(name, config, tokenizer_path)
    vocab, width = _vocab_and_width(config)
    if len(tokenizer) > vocab:
        raise InputError(f"{name}: the tokenizer has {len(tokenizer)} tokens but the model's vocabulary only "
                         f"{vocab}: checkpoint and tokenizer do not belong together")
    model = load_weights(cls, name, config)   # every weight, in FiD's published layout too, or a named error
    emb = model.get_input_embeddings().weight.shape
    if emb[0] != vocab or emb[1] != width:
        raise InputError(f"{name}: embedding {tuple(emb)} does not fit the config ({vocab} x {width})")
    if reading and torch.device(device).type == "cpu":
        # One decoding step is one query against k x L keys: SDPA's CPU kernels take twice the plain
        # matrix products' time there (T5 and the warm reader alike), while over whole passages, in
        # the encoder, they are the faster (docs/notes/speed.md).
        model.get_decoder().set_attn_implementation("eager")
    return model.to(device).eval(), tokenizer


def in_reading_dtype(model, device: str | torch.device = "cpu"):
    """`model` with each linear layer's weight and bias held in the dtype `generate` reads in on `device`
    (`search_dtype`: bfloat16 where native), its embeddings and norms left in float32: the casts autocast
    makes of them, made once. Autocast keeps its casts for one `generate` call only, so a pipeline that
    reads a question a call cast the reader's linear weights for every answer, the lm head's at every
    decoding step (a third of an answer's time in the profile of docs/notes/speed.md). The products are the same ones, and so
    are the answers. An output layer tied to the input embeddings gets a copy of its own. Such a model
    reads in that dtype only (`generate` refuses another); it is for reading, not for saving or training."""
    dtype = search_dtype(torch.device(device).type)
    if dtype == torch.float32:
        return model
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            for name in ("weight", "bias"):
                p = getattr(module, name)
                if p is not None and p.dtype == torch.float32:
                    setattr(module, name, torch.nn.Parameter(p.detach().to(dtype), requires_grad=False))
    model.reading_dtype = dtype
    return model


@torch.no_grad()
def generate(model, tokenizer, examples: list[FiDExample], ks: list[int], settings: ReaderSettings,
             device: str | torch.device = "cpu", *, progress: bool = False, refuse_echoes: bool = True,
             dtype: torch.dtype | None = None) -> dict[int, list[str]]:
    """The reader's answers from the best k passages of each example, for each k in `ks`, read by
    `settings` (batches of `batch_size` questions, `text_maxlength` tokens a passage, `max_new_tokens`,
    `num_beams`, `decoding`). FiD encodes each passage on its own, so the encoder runs once, over the
    largest k, and each k decodes from the first k passages' outputs: reading at k = 5, 10 and 25 costs
    the encoder what k = 25 alone does. With `spans` decoding and `refuse_echoes`, an answer that only
    repeats the question is decoded again (`_redecode_echoes`). `dtype` (default `search_dtype`:
    bfloat16 where the hardware computes it natively): bfloat16 reads under autocast, the weights
    staying as they are; 1.7x faster on this CPU, 98-99% of the answers the same as float32's and EM
    within a question (docs/notes/reader.md)."""
    if settings.decoding == "phrases":
        fusion.check_phrases(examples)
    kind = torch.device(device).type
    dtype = search_dtype(kind) if dtype is None else dtype
    held = getattr(model, "reading_dtype", None)
    if held is not None and held != dtype:
        raise ValueError(f"this reader holds its linear layers in {held} (in_reading_dtype), so it reads in "
                         f"{held} only, not {dtype}: load it again to read in {dtype}")
    with torch.autocast(kind, dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
        return _generate(model, tokenizer, examples, ks, settings, device, progress, refuse_echoes)


def check_lengths(model, settings: ReaderSettings) -> None:
    """Refuse `settings` that ask a reader with learned position embeddings (a warm-started BERT, whose
    tables hold 512) for more positions than it has, naming the setting: otherwise a tensor-size error
    deep inside the model, after the encoder has run. T5's relative positions have no such bound."""
    config = model.config
    if config.model_type != "encoder-decoder":
        return
    # the decoder's first position is the start token; the encoder's input is "question: ... title: ... context: ..."
    limits = (("--max-new-tokens", settings.max_new_tokens + 1, config.decoder, "answer tokens"),
              ("--text-maxlength", settings.text_maxlength, config.encoder, "tokens a passage"))
    for flag, wanted, part, what in limits:
        most = getattr(part, "max_position_embeddings", None)
        if most is not None and wanted > most:
            raise InputError(f"{flag} {wanted - (flag == '--max-new-tokens')}: this reader reads at most "
                             f"{most - (flag == '--max-new-tokens')} {what} (its {most} position embeddings)")


def _generate(model, tokenizer, examples, ks, settings: ReaderSettings, device, progress, refuse_echoes
              ) -> dict[int, list[str]]:
    check_lengths(model, settings)
    ks, batch_size, decoding = sorted(set(ks)), settings.batch_size, settings.decoding
    text_maxlength, max_new_tokens, num_beams = settings.text_maxlength, settings.max_new_tokens, settings.num_beams
    collator = FiDCollator(tokenizer, ks[-1], text_maxlength)
    end, pad, start = answer_end_id(tokenizer), tokenizer.pad_token_id, decoder_start_id(model)
    was_training = model.training
    model.eval()
    out = {k: [] for k in ks}
    for i in tqdm(range(0, len(examples), batch_size), desc=f"read k={','.join(map(str, ks))}", unit=" batch",
                  disable=not progress or None, mininterval=2):
        with stage("reader input"):
            batch = collator.encode_passages(examples[i:i + batch_size], offsets=True)
        ids, mask = batch["input_ids"].to(device), batch["attention_mask"].to(device)
        with stage("reader encoder"):
            encoded = model.get_encoder()(input_ids=ids, attention_mask=mask, return_dict=True)
        b, _, length = ids.shape
        questions = [ex.question for ex in examples[i:i + batch_size]]
        with stage("reader decoder"):   # the span constraint, the echo check and the fusion count to it
            for k in ks:
                spans = PassageSpans(batch["input_ids"][:, :k], batch["offset_mapping"][:, :k],
                                     [f[:k] for f in batch["fields"]], end, pad)
                first = FusedEncoderOutput(last_hidden_state=encoded.last_hidden_state[:, :k * length],
                                           input_ids=encoded.input_ids[:, :k * length], passage_length=length)
                first_mask = mask[:, :k].reshape(b, k * length)
                decode = _Decoder(model, first, first_mask, None if decoding == "free" else spans,
                                  (end, pad, start), max_new_tokens, num_beams)
                answers = decode(list(range(b)))
                text = [_answer_text(spans, row, a, tokenizer) for row, a in enumerate(answers)]
                if decoding != "free" and refuse_echoes:
                    _redecode_echoes(decode, spans, questions, answers, text, tokenizer)
                if decoding == "phrases":
                    text = fusion.choose(model, tokenizer, first, first_mask, examples[i:i + batch_size], text, k)
                out[k] += text
    model.train(was_training)
    return {k: [p.strip() for p in answers] for k, answers in out.items()}


def _answer_text(spans: PassageSpans, row: int, answer: list[int], tokenizer) -> str:
    """The passage's own string for an answer that spells a span of it, else the tokenizer's."""
    surface = spans.surface(row, answer)
    return surface if surface is not None else tokenizer.decode(answer, skip_special_tokens=True)


class _UntilDeadline(StoppingCriteria):
    """Ends decoding at the next step once the caller's deadline (`common.timings.deadline`) has passed."""

    def __call__(self, input_ids: torch.Tensor, scores, **kwargs) -> torch.Tensor:
        return torch.full((input_ids.shape[0],), past_deadline(), dtype=torch.bool, device=input_ids.device)


class _Decoder:
    """Greedy (or beam) decoding of some rows of a batch from its encoder output, span-constrained
    where `spans` is given; each row's answer tokens, without start and end."""

    def __init__(self, model, encoded: FusedEncoderOutput, mask, spans: PassageSpans | None, ids, max_new_tokens,
                 num_beams):
        self.model, self.encoded, self.mask, self.spans = model, encoded, mask, spans
        self.end, self.pad, self.start = ids
        self.max_new_tokens, self.num_beams = max_new_tokens, num_beams

    def __call__(self, rows: list[int]) -> list[list[int]]:
        index = torch.tensor(rows, device=self.mask.device)
        encoded = FusedEncoderOutput(last_hidden_state=self.encoded.last_hidden_state[index],
                                     input_ids=self.encoded.input_ids[index],
                                     passage_length=self.encoded.passage_length)
        constrain = {}
        if self.spans is not None:
            constrain["prefix_allowed_tokens_fn"] = lambda i, prefix: self.spans.allowed(
                rows[i], strip_generated(prefix.tolist(), -1, None, self.start))
        generated = self.model.generate(encoder_outputs=encoded, attention_mask=self.mask[index],
                                        max_new_tokens=self.max_new_tokens, num_beams=self.num_beams, do_sample=False,
                                        eos_token_id=self.end, pad_token_id=self.pad,
                                        stopping_criteria=StoppingCriteriaList([_UntilDeadline()]), **constrain)
        check_deadline("the answer")   # decoding stopped early for it: the tokens so far are no answer
        return [strip_generated(seq, self.end, self.pad, self.start) for seq in generated.tolist()]


def _redecode_echoes(decode: _Decoder, spans: PassageSpans, questions: list[str], answers: list[list[int]],
                     text: list[str], tokenizer) -> None:
    """Answers that only repeat the question (`is_echo`: "Isaac" for "who was the first-born of Isaac?")
    are decoded again without their first token, up to ECHO_RETRIES times; the first answer that is no
    echo replaces the greedy one in `text`, else the greedy one stays."""
    current = list(answers)
    todo = [r for r, t in enumerate(text) if current[r] and is_echo(t, questions[r])]
    for _ in range(ECHO_RETRIES):
        if not todo:
            return
        for r in todo:
            spans.ban_first(r, current[r][0])
        for r, answer in zip(todo, decode(todo)):
            current[r] = answer
        still = []
        for r in todo:
            t = _answer_text(spans, r, current[r], tokenizer)
            if current[r] and is_echo(t, questions[r]):
                still.append(r)
            elif current[r]:
                text[r] = t
        todo = still


def check_readable(examples: list[FiDExample], fid_file) -> None:
    """Refuse a file to read with a question without passages (FiD would answer it from nothing) or an
    id twice (predictions are found by id), naming them."""
    empty = [ex.id for ex in examples if not ex.passages]
    if empty:
        raise InputError(f"{fid_file}: {len(empty)} question(s) with no ctxs ({', '.join(empty[:5])}): FiD answers from "
                         f"the passages a retriever found; retrieve them again, or leave those questions out")
    twice = sorted(i for i, n in Counter(ex.id for ex in examples).items() if n > 1)
    if twice:
        raise InputError(f"{fid_file}: question id(s) given twice ({', '.join(twice[:5])}): each prediction is "
                         f"found by its id")


def read(model, tokenizer, fid_file: str | os.PathLike, outs: dict[int, str | os.PathLike], settings: ReaderSettings,
         device: str | torch.device = "cpu", *, limit: int | None = None, refuse_echoes: bool = True,
         parts: str | os.PathLike | None = None, key=None) -> dict:
    """`odqa read`: predictions at several k (`outs`: k -> file) of a retrieval file's first `limit`
    questions, from one pass of the encoder; k -> summary. Under a launcher each rank reads its share
    of the batches, and rank 0 writes the files; given `parts` (where finished batches wait to be
    merged, common/ranks.py), a killed read resumes."""
    examples = load_fid_file(fid_file, limit=limit)
    check_readable(examples, fid_file)
    if settings.decoding == "phrases":
        fusion.check_phrases(examples, str(fid_file))    # named here, before any reading
    start = time.perf_counter()
    ks = sorted(outs)

    def read_batch(batch: list[FiDExample]) -> list[list[str]]:
        by_k = generate(model, tokenizer, batch, ks, settings, device, refuse_echoes=refuse_echoes)
        return [[by_k[k][i] for k in ks] for i in range(len(batch))]
    answers = split_map(read_batch, examples, settings.batch_size, parts, {"key": key, "ks": ks},
                        desc=f"read k={','.join(map(str, ks))}")
    seconds = time.perf_counter() - start
    summaries = {}
    for j, k in enumerate(ks):
        predictions = [a[j] for a in answers]
        correct = [answer_em(p, ex.answers, ex.regex) for p, ex in zip(predictions, examples)]
        if current().main:
            write_predictions(outs[k], examples, predictions, correct)
        # a question without answers has a prediction but no score: it is left out of EM, and counted
        scored = [c for c, ex in zip(correct, examples) if ex.answers]
        em = 100.0 * sum(scored) / len(scored) if scored else None
        if scored:
            log.info("EM %.2f on %d questions, k=%d", em, len(scored), k)
        summaries[k] = {"questions": len(examples), "scored": len(scored), "without_answers": len(examples) - len(scored),
                        "em": em, "k": k, "seconds": seconds}
    log.info("read %d questions at k=%s, %.1f questions/s", len(examples), ",".join(map(str, ks)),
             len(examples) / seconds)
    return summaries
