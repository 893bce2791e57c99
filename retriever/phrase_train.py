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
`--in-doc-negatives doc|section` (DHR): the tokens of other passages of the question's document (or of
its section) join the single-passage softmax as negatives, `--in-doc-count` passages a question.
`--teacher DIR` adds KL(teacher || phrase model) over the gold passage's tokens, start and end, weighted
by `--distill-coef`: the teacher (`odqa train-teacher`) reads question and passage together.
`--title-path` prefixes passages with "title, section, subsection" rather than the title.
`--title-phrases` makes the title's tokens phrase candidates too, with the answer's occurrences in the
title as gold spans beside those in the text.
`--hard-negatives INDEX` (round 2): continuing from a round-1 checkpoint, each training question's top
passages under that model (INDEX is the phrase index built with it) that hold no answer join its
softmax the same way, `--hard-negative-count` a question; the mined passages are kept in
OUT_DIR/hard_negatives.json, so a resumed run does not search again.
"""
from __future__ import annotations

import hashlib
import logging
import math
import os
import random
from collections import deque
from dataclasses import asdict, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from odqa.common.corpus import DocumentTable, PassageStore
from odqa.common.io import InputError, read_json, write_json
from odqa.common.metrics.answers import exact_match
from odqa.common.metrics.has_answer import has_answer
from odqa.common.model_card import Card
from odqa.common.settings import OptimArgs, needs
from odqa.common.trainer import MicroBatches, Task, check_resumed_settings, make_engine, permuted_batches, seeded
from odqa.common.trainer import train as train_loop
from odqa.retriever.args import PhraseTrainArgs
from odqa.retriever.lm import load_tokenizer
from odqa.retriever.phrase_data import (
    collate,
    encode_passages,
    encode_questions,
    gold_spans,
    passage_title,
    same_segment,
)
from odqa.retriever.phrase_model import (
    DensePhraseModel,
    PhraseModelConfig,
    is_phrase_checkpoint,
    kept_tokens,
    phrase_encoder_hash,
)
from odqa.retriever.supervise import load_examples
from odqa.retriever.teacher import SpanTeacher, same_vocabulary

log = logging.getLogger(__name__)
NEG = -1e4  # masked logit; finite so fp16/bf16 stay finite
IN_DOC = ("none", "doc", "section")
MINE_DEPTH = 20  # passages searched per question for round-2 hard negatives


def load_splits(args) -> tuple[list[dict], list[dict]]:
    """The training and validation examples `args` name; fewer training examples than a batch is refused."""
    train_ex = load_examples(args.train_file, args.max_train_examples)
    val_ex = load_examples(args.validation_file, args.max_validation_examples)
    if len(train_ex) < args.batch_size:
        raise InputError(f"{args.train_file}: {len(train_ex)} examples, fewer than one batch of {args.batch_size}")
    return train_ex, val_ex


def em_summary(state: dict) -> dict:
    """A gold-passage-EM trainer's result from the loop's state."""
    return {"best_em": state["best"]["value"], "validation_em": [e["em"] for e in state["evals"]],
            "steps": state["global_step"],
            "final_loss": state["history"][-1]["loss"] if state["history"] else math.nan}


def span_nll(scores: torch.Tensor, gold: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """-log (softmax mass on the gold positions), per row."""
    scores = scores.masked_fill(~allowed, NEG)
    return torch.logsumexp(scores, -1) - torch.logsumexp(scores.masked_fill(~gold, NEG), -1)


def first_gold(vectors: torch.Tensor, gold: torch.Tensor) -> torch.Tensor:
    """Each row's vector at its first gold position: (B, T, d), (B, T) -> (B, d)."""
    idx = gold.float().argmax(-1)
    return vectors[torch.arange(len(idx)), idx]


def distill_kl(student: torch.Tensor, teacher: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """KL(softmax(teacher) || softmax(student)) over the `allowed` tokens, averaged over rows."""
    log_s = F.log_softmax(student.float().masked_fill(~allowed, NEG), -1)
    log_t = F.log_softmax(teacher.float().masked_fill(~allowed, NEG), -1)
    return F.kl_div(log_s, log_t, log_target=True, reduction="batchmean")


class PhraseLoss:
    def __init__(self, args: PhraseTrainArgs, teacher: SpanTeacher | None = None):
        self.args = args
        self.bank = {"start": deque(maxlen=args.pre_batch), "end": deque(maxlen=args.pre_batch)}
        self.teacher = teacher.eval() if teacher is not None else None   # on the engine's device already

    def __call__(self, model: DensePhraseModel, batch: dict, step: int) -> tuple[torch.Tensor, dict]:
        a = self.args
        enc = model(batch["questions"], batch["passages"], batch.get("negatives"))
        cand = batch["candidate"]
        use_pre = a.pre_batch > 0 and step >= a.pre_batch_warmup
        parts, losses = {}, []
        if self.teacher is not None:
            with torch.no_grad():
                taught = dict(zip(("start", "end"), self.teacher(batch["questions"], batch["passages"])))
        for side, gold in (("start", batch["gold_start"]), ("end", batch["gold_end"])):
            q, h = enc[f"q_{side}"], enc[f"h_{side}"]
            in_passage = torch.einsum("bd,btd->bt", q, h)
            if self.teacher is not None:
                kl = distill_kl(in_passage, taught[side], cand)
                parts[f"{side}_distill"] = kl.item()
                losses.append(a.distill_coef * kl)
            g = first_gold(h, gold)                                  # (B, d)
            cand_side, gold_side = cand, gold
            if "negatives" in batch:
                in_passage, cand_side, gold_side = self._with_negative_passages(
                    q, enc[f"neg_{side}"], batch, in_passage, cand, gold)
            negs = [g] + (list(self.bank[side]) if use_pre else [])
            neg_scores = q @ torch.cat(negs).T                       # (B, B + C*B')
            if a.unified:
                # One softmax over the passage's tokens and every other question's gold vector.
                own = torch.zeros_like(neg_scores, dtype=torch.bool)
                own[torch.arange(len(q)), torch.arange(len(q))] = True  # already among the passage tokens
                scores = torch.cat([in_passage, neg_scores], 1)
                allowed = torch.cat([cand_side, ~own], 1)
                gold_all = torch.cat([gold_side, torch.zeros_like(own)], 1)
                nll = span_nll(scores, gold_all, allowed).mean()
                parts[f"{side}_unified"] = nll.item()
                losses.append(nll)
            else:
                single = span_nll(in_passage, gold_side, cand_side).mean()
                in_batch = F.cross_entropy(neg_scores, torch.arange(len(q), device=q.device))
                parts[f"{side}_single"], parts[f"{side}_neg"] = single.item(), in_batch.item()
                losses.append(single + a.neg_coef * in_batch)
            self.bank[side].append(g.detach())
        logits = enc["filter"][cand]
        bce = (F.binary_cross_entropy_with_logits(logits[:, 0], batch["gold_start"][cand].float())
               + F.binary_cross_entropy_with_logits(logits[:, 1], batch["gold_end"][cand].float()))
        parts["filter"] = bce.item()
        loss = sum(losses) / 2 + a.filter_coef * bce
        parts["loss"] = loss.item()
        return loss, parts


    @staticmethod
    def _with_negative_passages(q, h_neg, batch, in_passage, cand, gold):
        """Append each question's In-Doc negative passages' tokens to its own passage's: (B, T + N*T)."""
        owner = batch["negative_owner"]
        n, t = h_neg.shape[:2]
        scores = torch.einsum("nd,ntd->nt", q[owner], h_neg)            # each negative scored by its owner
        wide = torch.full((len(q), n, t), NEG, dtype=scores.dtype, device=scores.device)
        wide[owner, torch.arange(n)] = scores
        allowed = torch.zeros((len(q), n, t), dtype=torch.bool, device=cand.device)
        allowed[owner, torch.arange(n)] = batch["negative_candidate"]
        return (torch.cat([in_passage, wide.flatten(1)], 1), torch.cat([cand, allowed.flatten(1)], 1),
                torch.cat([gold, torch.zeros_like(allowed.flatten(1))], 1))


def best_spans(start: torch.Tensor, end: torch.Tensor, candidate: torch.Tensor, max_len: int,
               in_title: torch.Tensor | None = None):
    """Best (i, j, score) per row with candidate i <= j < i + max_len, i and j in one segment (title or
    text): (B, T) scores -> list."""
    T = start.shape[1]
    pair = start.unsqueeze(2) + end.unsqueeze(1)                     # (B, T, T)
    i, j = torch.arange(T).unsqueeze(1), torch.arange(T).unsqueeze(0)
    ok = (j >= i) & (j - i < max_len)
    ok = ok.unsqueeze(0) & candidate.unsqueeze(2) & candidate.unsqueeze(1)
    if in_title is not None:
        ok &= same_segment(in_title)
    flat = pair.masked_fill(~ok, float("-inf")).flatten(1)
    score, idx = flat.max(1)
    return [(int(k) // T, int(k) % T, float(s)) for k, s in zip(idx, score)]


def gold_passage_inputs(tokenizer, examples: list[dict], cfg: PhraseModelConfig, batch_size: int):
    """Each batch of examples with its questions and gold passages tokenised: (examples, questions, passages)."""
    for k in range(0, len(examples), batch_size):
        chunk = examples[k:k + batch_size]
        questions = encode_questions(tokenizer, [e["question"] for e in chunk], cfg.max_question_tokens)
        enc = encode_passages(tokenizer, [passage_title(e, cfg.title_path) for e in chunk], [e["text"] for e in chunk],
                              cfg.max_passage_tokens, title_phrases=cfg.title_phrases)
        yield chunk, questions, enc


def _gold_passage_batches(model: DensePhraseModel, tokenizer, examples: list[dict], cfg: PhraseModelConfig,
                          batch_size: int):
    """Each batch of examples with its gold passages encoded: (examples, passages, start scores, end scores,
    filter logits), scores (B, T)."""
    for chunk, questions, enc in gold_passage_inputs(tokenizer, examples, cfg, batch_size):
        qs, qe = model.encode_questions(**questions)
        hs, he, filt = model.encode_passages(**enc.batch)
        yield chunk, enc, torch.einsum("bd,btd->bt", qs, hs), torch.einsum("bd,btd->bt", qe, he), filt


def em_hits(chunk: list[dict], enc, start: torch.Tensor, end: torch.Tensor, allowed: torch.Tensor, max_len: int,
            title_path: bool = False) -> int:
    """How many examples' best phrase among the `allowed` tokens matches an answer."""
    hits = 0
    spans = best_spans(start, end, allowed, max_len, enc.in_title)
    for e, (i, j, score), off, in_title in zip(chunk, spans, enc.offsets, enc.in_title):
        if score > float("-inf"):  # a passage with no allowed token has no phrase
            source = passage_title(e, title_path) if in_title[i] else e["text"]
            hits += exact_match(source[int(off[i, 0]):int(off[j, 1])], e["answers"])
    return hits


@torch.no_grad()
def validation_em(model: DensePhraseModel, tokenizer, examples: list[dict], cfg: PhraseModelConfig,
                  batch_size: int = 32) -> float:
    """EM of the best phrase in each example's gold passage."""
    model.eval()
    hits = sum(em_hits(chunk, enc, start, end, enc.candidate, cfg.max_span_len, cfg.title_path)
               for chunk, enc, start, end, _ in _gold_passage_batches(model, tokenizer, examples, cfg, batch_size))
    model.train()
    return 100.0 * hits / max(len(examples), 1)


@torch.no_grad()
def filter_report(model_dir: str | os.PathLike, examples: list[dict], thresholds: list[float | None],
                  batch_size: int = 32) -> list[dict]:
    """What a dump at each `--threshold` keeps of supervision passages: the share of text tokens, the
    recall of answer phrases (both boundary tokens kept), and the EM of the best phrase of the gold
    passage among the kept tokens (with None, `validation_em`)."""
    model = DensePhraseModel.from_pretrained(model_dir).eval()
    tokenizer, cfg = load_tokenizer(model_dir), model.config
    counts = {t: {"kept": 0, "recall": 0, "em": 0} for t in thresholds}
    tokens = answerable = 0
    batches = _gold_passage_batches(model, tokenizer, examples, cfg, batch_size)
    for chunk, enc, start, end, filt in tqdm(batches, total=-(-len(examples) // batch_size), desc="filter report",
                                             disable=None):
        gold = [gold_spans(enc, b, e, passage_title(e, cfg.title_path), cfg.max_span_len, cfg.title_phrases)
                for b, e in enumerate(chunk)]
        tokens += int(enc.candidate.sum())
        answerable += sum(bool(g) for g in gold)
        for t in thresholds:
            keep = kept_tokens(enc.candidate, filt, t)
            c = counts[t]
            c["kept"] += int(keep.sum())
            c["recall"] += sum(any(keep[b, i] and keep[b, j] for i, j in g) for b, g in enumerate(gold))
            c["em"] += em_hits(chunk, enc, start, end, keep, cfg.max_span_len, cfg.title_path)
    return [{"threshold": t, "share_kept": counts[t]["kept"] / max(tokens, 1),
             "answer_recall": counts[t]["recall"] / max(answerable, 1), "em": counts[t]["em"] / max(len(examples), 1),
             "examples": len(examples), "answerable": answerable} for t in thresholds]


def training_batches(examples, tokenizer, cfg: PhraseModelConfig, args: OptimArgs, epoch: int) -> MicroBatches:
    order = permuted_batches(len(examples), args.batch_size, args.seed + epoch)  # the same order after a resume
    return MicroBatches(examples, order, lambda exs, m: collate(tokenizer, exs, cfg.max_passage_tokens,
                                                                cfg.max_question_tokens, cfg.max_span_len,
                                                                cfg.title_path, cfg.title_phrases))


def with_passage_context(examples: list[dict], args: PhraseTrainArgs, corpus_dir: str) -> None:
    """Give each example its passage's section path (for --title-path) and, for --in-doc-negatives,
    up to --in-doc-count other passages of its document or section, drawn per (seed, question)."""
    store = PassageStore(corpus_dir)
    table = DocumentTable(corpus_dir)
    row_of = store.rows_of(ex.get("passage_id") for ex in examples)
    for ex in examples:
        row = row_of.get(ex.get("passage_id"))
        if row is None:
            raise InputError(f"supervision passage {ex.get('passage_id')!r} is not in the corpus {corpus_dir}")
        own = store[row]
        ex["section"] = own["section"]
        if args.in_doc_negatives != "none":
            others = [store[r] for r in table.passage_rows(int(table.doc_of_passage[row])) if r != row]
            if args.in_doc_negatives == "section":
                others = [p for p in others if p["section"] == own["section"]]
            rng = random.Random(f"{args.seed}:{ex['question']}")
            ex["negative_passages"] = rng.sample(others, min(args.in_doc_count, len(others)))
    store.close()


def mine_hard_negatives(examples: list[dict], args: PhraseTrainArgs) -> None:
    """Each question's first `hard_negative_count` passages among its top MINE_DEPTH under the round-1
    model that are not its supervision passage and hold no answer; appended to its negative passages."""
    from odqa.retriever.search_config import PhraseSearchConfig, SearchConfig
    from odqa.retriever.searcher import Searcher  # the index and faiss only for round 2

    questions = sorted({e["question"] for e in examples})
    encoder = args.model_config.encoder
    key = {"index": str(Path(args.hard_negatives).resolve()), "encoder_hash": phrase_encoder_hash(encoder),
           "depth": MINE_DEPTH, "questions": hashlib.sha256("\n".join(questions).encode()).hexdigest()}
    cache = Path(args.out_dir) / "hard_negatives.json"
    mined = read_json(cache) if cache.exists() else {}
    if mined.get("key") != key:
        searcher = Searcher.open(args.hard_negatives, encoder, args.corpus,   # spans up to L
                                 config=SearchConfig(phrase=PhraseSearchConfig(max_answer_tokens=None)))
        rows, _ = searcher.search_passages(questions, MINE_DEPTH)
        searcher.artifacts.store.close()
        mined = {"key": key, "rows": dict(zip(questions, rows.tolist()))}
        write_json(cache, mined, indent=None)
    store = PassageStore(args.corpus)
    for ex in examples:
        found = []
        for row in mined["rows"][ex["question"]]:
            if len(found) == args.hard_negative_count:
                break
            p = store[row] if row >= 0 else None
            if p and p["id"] != ex.get("passage_id") and not has_answer(p["text"], ex["answers"], bool(ex.get("regex"))):
                found.append(p)
        ex["negative_passages"] = ex.get("negative_passages", []) + found
    store.close()
    log.info("hard negatives: %d of %d training examples have %d from %s",
             sum(len(e["negative_passages"]) > 0 for e in examples), len(examples), args.hard_negative_count,
             args.hard_negatives)


def train(args: PhraseTrainArgs) -> dict:
    needs(args, "train_file", "validation_file", "out_dir")
    needs(args.model_config, "encoder")
    encoder = args.model_config.encoder
    if args.in_doc_negatives not in IN_DOC:
        raise InputError(f"in_doc_negatives must be one of {IN_DOC}, not {args.in_doc_negatives!r}")
    out = Path(args.out_dir)
    if args.resume:   # before anything is written over
        check_resumed_settings(out / "train_args.json", asdict(args))
    seeded(args.seed)
    continuing = is_phrase_checkpoint(encoder)
    if continuing:
        model = DensePhraseModel.from_pretrained(encoder)
        if args.model_config.title_phrases:   # turned on for a continued checkpoint too (never off: its default is False)
            model.config = replace(model.config, title_phrases=True)
    else:
        model = DensePhraseModel(args.model_config)
    cfg = model.config
    tokenizer = load_tokenizer(encoder)
    train_ex, val_ex = load_splits(args)
    if (cfg.title_path or args.in_doc_negatives != "none" or args.hard_negatives) and not args.corpus:
        raise InputError("--title-path, --in-doc-negatives and --hard-negatives read the corpus: give --corpus")
    if cfg.title_path or args.in_doc_negatives != "none":
        with_passage_context(train_ex, args, args.corpus)
        with_passage_context(val_ex, replace(args, in_doc_negatives="none"), args.corpus)
    if args.hard_negatives:
        if not continuing:
            raise InputError(f"--hard-negatives mines with a round-1 phrase model; {encoder} is not one")
        out.mkdir(parents=True, exist_ok=True)
        mine_hard_negatives(train_ex, args)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "train_args.json", asdict(args))
    engine = make_engine(args)
    teacher = None
    if args.teacher:
        teacher = SpanTeacher.from_pretrained(args.teacher).to(engine.device)
        same_vocabulary(args.teacher, tokenizer)
    task = Task(model=model, n_batches=len(train_ex) // args.batch_size,
                batches=lambda epoch: training_batches(train_ex, tokenizer, cfg, args, epoch),
                loss=PhraseLoss(args, teacher),
                save=lambda m, path: m.save_pretrained(path, tokenizer),
                evaluate=lambda m, rank, world: {"em": validation_em(m, tokenizer, val_ex, cfg)}, metric="em",
                card=Card("phrase model", "train-phrase", encoder, [args.train_file], args.validation_file))
    return em_summary(train_loop(task, args, engine, out, "train-phrase"))
