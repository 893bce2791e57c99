"""`odqa train-phrase`: train the phrase and question encoders (DensePhrases, with the training of
"Bridging the Training-Inference Gap for Dense Phrase Retrieval").

Loss, per question b with start vectors (the end side is the same):
  single-passage   -log sum_{gold starts i} softmax_i(q_b . h_start[b, i]) over the passage's tokens (Eq. 5-6),
                   every occurrence of the answer counted;
  in-batch         -log softmax_b(q_b . g_b') over the gold start vectors g of the batch (Eq. 8);
  pre-batch        the same softmax widened with the gold vectors of the last C batches, detached,
                   switched on after a warm-up;
  filter           binary cross-entropy of the filter head on gold starts and ends.
`--unified` replaces the first three with one softmax over in-passage, in-batch and pre-batch tokens.
"""
from __future__ import annotations

import logging
import math
import random
from collections import deque
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from torch.utils.data import DataLoader
from tqdm import tqdm
from transformers import get_linear_schedule_with_warmup

from common.io import InputError, atomic_path, read_json, read_jsonl, write_json
from common.metrics.answers import exact_match
from retriever.phrase_data import collate, encode_passages, encode_questions
from retriever.phrase_model import DensePhraseModel, PhraseModelConfig, load_tokenizer

log = logging.getLogger(__name__)
NEG = -1e4  # masked logit; finite so fp16/bf16 stay finite


@dataclass
class PhraseTrainArgs:
    train_file: str
    validation_file: str
    out_dir: str
    encoder: str                       # AutoModel name/path, or a phrase checkpoint to continue from
    head: str = "split"
    question_encoder: str = "dual"
    max_span_len: int = 20
    max_passage_tokens: int = 192
    max_question_tokens: int = 48
    epochs: int = 2
    batch_size: int = 16
    lr: float = 5e-5
    weight_decay: float = 0.01
    warmup_ratio: float = 0.1
    max_grad_norm: float = 1.0
    neg_coef: float = 1.0
    filter_coef: float = 0.1
    pre_batch: int = 2                 # C: batches kept in the FIFO
    pre_batch_warmup: int = 50         # steps before pre-batch negatives join
    unified: bool = False
    max_train_examples: int | None = None
    max_validation_examples: int | None = 500
    save_steps: int = 0                # also checkpoint every N steps (0: each epoch only)
    seed: int = 13
    resume: bool = False


def load_examples(path: str, limit: int | None = None) -> list[dict]:
    out = []
    for lineno, ex in read_jsonl(path):
        for key in ("question", "title", "text", "answers", "answer_char_spans"):
            if key not in ex:
                raise InputError(f"{path}:{lineno}: supervision example without {key!r}")
        out.append(ex)
        if limit and len(out) >= limit:
            break
    if not out:
        raise InputError(f"{path}: no examples")
    return out


def span_nll(scores: torch.Tensor, gold: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """-log (softmax mass on the gold positions), per row."""
    scores = scores.masked_fill(~allowed, NEG)
    return torch.logsumexp(scores, -1) - torch.logsumexp(scores.masked_fill(~gold, NEG), -1)


def first_gold(vectors: torch.Tensor, gold: torch.Tensor) -> torch.Tensor:
    """Each row's vector at its first gold position: (B, T, d), (B, T) -> (B, d)."""
    idx = gold.float().argmax(-1)
    return vectors[torch.arange(len(idx)), idx]


class PhraseLoss:
    def __init__(self, args: PhraseTrainArgs):
        self.args = args
        self.bank = {"start": deque(maxlen=args.pre_batch), "end": deque(maxlen=args.pre_batch)}

    def __call__(self, model: DensePhraseModel, batch: dict, step: int) -> tuple[torch.Tensor, dict]:
        a = self.args
        q_start, q_end = model.encode_questions(**batch["questions"])
        h_start, h_end, filt = model.encode_passages(**batch["passages"])
        cand = batch["candidate"]
        use_pre = a.pre_batch > 0 and step >= a.pre_batch_warmup
        parts, losses = {}, []
        for side, q, h, gold in (("start", q_start, h_start, batch["gold_start"]), ("end", q_end, h_end, batch["gold_end"])):
            in_passage = torch.einsum("bd,btd->bt", q, h)
            g = first_gold(h, gold)                                  # (B, d)
            negs = [g] + (list(self.bank[side]) if use_pre else [])
            neg_scores = q @ torch.cat(negs).T                       # (B, B + C*B')
            if a.unified:
                # One softmax over the passage's tokens and every other question's gold vector.
                own = torch.zeros_like(neg_scores, dtype=torch.bool)
                own[torch.arange(len(q)), torch.arange(len(q))] = True  # already among the passage tokens
                scores = torch.cat([in_passage, neg_scores], 1)
                allowed = torch.cat([cand, ~own], 1)
                gold_all = torch.cat([gold, torch.zeros_like(own)], 1)
                nll = span_nll(scores, gold_all, allowed).mean()
                parts[f"{side}_unified"] = nll.item()
                losses.append(nll)
            else:
                single = span_nll(in_passage, gold, cand).mean()
                in_batch = F.cross_entropy(neg_scores, torch.arange(len(q), device=q.device))
                parts[f"{side}_single"], parts[f"{side}_neg"] = single.item(), in_batch.item()
                losses.append(single + a.neg_coef * in_batch)
            self.bank[side].append(g.detach())
        logits = filt[cand]
        bce = (F.binary_cross_entropy_with_logits(logits[:, 0], batch["gold_start"][cand].float())
               + F.binary_cross_entropy_with_logits(logits[:, 1], batch["gold_end"][cand].float()))
        parts["filter"] = bce.item()
        loss = sum(losses) / 2 + a.filter_coef * bce
        parts["loss"] = loss.item()
        return loss, parts


def best_spans(start: torch.Tensor, end: torch.Tensor, candidate: torch.Tensor, max_len: int):
    """Best (i, j, score) per row with candidate i <= j < i + max_len: (B, T) scores -> list."""
    T = start.shape[1]
    pair = start.unsqueeze(2) + end.unsqueeze(1)                     # (B, T, T)
    i, j = torch.arange(T).unsqueeze(1), torch.arange(T).unsqueeze(0)
    ok = (j >= i) & (j - i < max_len)
    ok = ok.unsqueeze(0) & candidate.unsqueeze(2) & candidate.unsqueeze(1)
    flat = pair.masked_fill(~ok, float("-inf")).flatten(1)
    score, idx = flat.max(1)
    return [(int(k) // T, int(k) % T, float(s)) for k, s in zip(idx, score)]


@torch.no_grad()
def validation_em(model: DensePhraseModel, tokenizer, examples: list[dict], cfg: PhraseModelConfig,
                  batch_size: int = 32) -> float:
    """EM of the best phrase in each example's gold passage."""
    model.eval()
    hits = 0
    for k in range(0, len(examples), batch_size):
        chunk = examples[k:k + batch_size]
        qs, qe = model.encode_questions(**encode_questions(tokenizer, [e["question"] for e in chunk], cfg.max_question_tokens))
        enc = encode_passages(tokenizer, [e["title"] for e in chunk], [e["text"] for e in chunk], cfg.max_passage_tokens)
        hs, he, _ = model.encode_passages(**enc.batch)
        spans = best_spans(torch.einsum("bd,btd->bt", qs, hs), torch.einsum("bd,btd->bt", qe, he),
                           enc.candidate, cfg.max_span_len)
        for e, (i, j, _), off in zip(chunk, spans, enc.offsets):
            hits += exact_match(e["text"][int(off[i, 0]):int(off[j, 1])], e["answers"])
    model.train()
    return 100.0 * hits / max(len(examples), 1)


def _loader(examples, tokenizer, cfg, args, epoch):
    g = torch.Generator().manual_seed(args.seed + epoch)  # the same order after a resume
    return DataLoader(examples, batch_size=args.batch_size, shuffle=True, generator=g, drop_last=True,
                      collate_fn=lambda b: collate(tokenizer, b, cfg.max_passage_tokens, cfg.max_question_tokens,
                                                   cfg.max_span_len))


def train(args: PhraseTrainArgs) -> dict:
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    out = Path(args.out_dir)
    accelerator = Accelerator()
    continuing = (Path(args.encoder) / "phrase_config.json").exists()
    if continuing:
        model = DensePhraseModel.from_pretrained(args.encoder)
    else:
        model = DensePhraseModel(PhraseModelConfig(args.encoder, args.head, args.question_encoder, args.max_span_len,
                                                   args.max_passage_tokens, args.max_question_tokens))
    cfg = model.config
    tokenizer = load_tokenizer(args.encoder)
    train_ex = load_examples(args.train_file, args.max_train_examples)
    val_ex = load_examples(args.validation_file, args.max_validation_examples)
    steps_per_epoch = len(train_ex) // args.batch_size
    if steps_per_epoch == 0:
        raise InputError(f"{args.train_file}: {len(train_ex)} examples, fewer than one batch of {args.batch_size}")
    total = steps_per_epoch * args.epochs
    decay = [p for n, p in model.named_parameters() if p.ndim > 1]
    no_decay = [p for n, p in model.named_parameters() if p.ndim <= 1]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=args.lr)
    scheduler = get_linear_schedule_with_warmup(optimizer, int(args.warmup_ratio * total), total)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    loss_fn = PhraseLoss(args)
    state = {"epoch": 0, "step_in_epoch": 0, "global_step": 0, "best_em": -1.0, "history": []}
    ckpt = out / "checkpoint"
    if args.resume and ckpt.exists():
        accelerator.load_state(str(ckpt))
        state = read_json(ckpt / "trainer_state.json")
        log.info("resumed from %s at epoch %d, step %d", ckpt, state["epoch"], state["step_in_epoch"])
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "train_args.json", asdict(args))

    def save_checkpoint():
        with atomic_path(ckpt) as tmp:
            accelerator.save_state(str(tmp))
            write_json(tmp / "trainer_state.json", state)

    model.train()
    unwrapped = accelerator.unwrap_model(model)
    while state["epoch"] < args.epochs:
        loader = accelerator.skip_first_batches(_loader(train_ex, tokenizer, cfg, args, state["epoch"]),
                                                state["step_in_epoch"])
        bar = tqdm(loader, desc=f"train-phrase epoch {state['epoch'] + 1}/{args.epochs}", initial=state["step_in_epoch"],
                   total=steps_per_epoch, disable=not accelerator.is_main_process)
        for batch in bar:
            if batch is not None:
                loss, parts = loss_fn(unwrapped, batch, state["global_step"])
                accelerator.backward(loss)
                accelerator.clip_grad_norm_(model.parameters(), args.max_grad_norm)
                optimizer.step()
                optimizer.zero_grad()
                bar.set_postfix(loss=f"{parts['loss']:.3f}")
                state["history"].append({"step": state["global_step"], **parts})
            scheduler.step()
            state["global_step"] += 1
            state["step_in_epoch"] += 1
            if args.save_steps and state["global_step"] % args.save_steps == 0:
                save_checkpoint()
        em = validation_em(unwrapped, tokenizer, val_ex, cfg)
        state["epoch"] += 1
        state["step_in_epoch"] = 0
        log.info("epoch %d: validation EM on the gold passage %.2f", state["epoch"], em)
        state.setdefault("validation_em", []).append(em)
        if accelerator.is_main_process:
            unwrapped.save_pretrained(out / "last", tokenizer)
            if em > state["best_em"]:
                state["best_em"] = em
                unwrapped.save_pretrained(out / "best", tokenizer)
        save_checkpoint()
    return {"best_em": state["best_em"], "validation_em": state.get("validation_em", []),
            "steps": state["global_step"], "final_loss": state["history"][-1]["loss"] if state["history"] else math.nan}
