"""`odqa train-query`: query-side fine-tuning (DensePhrases Eq. 11).

The phrase index stays fixed; only the question encoders learn. Each epoch, the current model
retrieves the top `top_k` phrases of every training question, and the loss is
    -log  sum_{positive phrases} exp(s) / sum_{all top phrases} exp(s),   s = q_start.start + q_end.end
with the phrase vectors taken from the index: the stored float16 vectors for Flat, vectors
reconstructed from the codes for a compressed (SQ/PQ) index, so training sees what search sees.
A phrase is positive (`label`): "phrase" if its text matches an answer; "passage" if its passage
contains an answer; "document" if its document has a passage that does ("Too" paper, Eq. 5).
"""
from __future__ import annotations

import logging
import random
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from odqa.common.io import InputError, write_json
from odqa.common.metrics.answers import answer_em
from odqa.common.metrics.has_answer import has_answer
from odqa.common.questions import load_questions
from odqa.retriever.args import QueryTrainArgs
from odqa.retriever.phrase_data import encode_questions
from odqa.retriever.searcher import UNITS as LABELS
from odqa.retriever.searcher import Searcher

log = logging.getLogger(__name__)


def positives(searcher: Searcher, phrases, question, label: str, doc_cache: dict) -> np.ndarray:
    out = []
    for p in phrases:
        passage = searcher.store[p.row]
        if label == "phrase":
            ok = answer_em(passage["text"][p.char_start:p.char_end], question.answers, question.regex)
        elif label == "passage":
            ok = has_answer(passage["text"], question.answers, question.regex)
        else:
            doc = passage["doc_id"]
            if doc not in doc_cache:
                doc_cache[doc] = [searcher.store[r]["text"] for r in searcher.rows_of_doc(doc)]
            ok = any(has_answer(t, question.answers, question.regex) for t in doc_cache[doc])
        out.append(bool(ok))
    return np.array(out)


def train_query(args: QueryTrainArgs) -> dict:
    if args.label not in LABELS:
        raise InputError(f"--label must be one of {LABELS}")
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    searcher = Searcher(args.index, args.model, args.corpus)
    model = searcher.model.train()
    params = [p for n, p in model.named_parameters() if n.startswith("q_")]
    for n, p in model.named_parameters():
        p.requires_grad_(n.startswith("q_"))
    optimizer = torch.optim.AdamW(params, lr=args.lr)
    questions = load_questions(args.questions, limit=args.max_questions)
    history = []
    for epoch in range(args.epochs):
        # Candidates from the current model: what it would retrieve now.
        model.eval()
        q_start, q_end = searcher.encode([q.question for q in questions])
        candidates = []
        doc_cache: dict = {}
        retrieved = []
        for a in tqdm(range(0, len(questions), 64), desc=f"train-query candidates {epoch + 1}", disable=None):
            retrieved += searcher.search_phrases(q_start[a:a + 64], q_end[a:a + 64], args.top_k)  # batched MIPS
        for q, phrases in zip(questions, retrieved):
            phrases = phrases[:args.top_k]
            pos = positives(searcher, phrases, q, args.label, doc_cache)
            if pos.any():
                s_ids = np.array([p.start_vec for p in phrases])
                e_ids = np.array([p.end_vec for p in phrases])
                candidates.append((q.question, searcher.index.vectors("start", s_ids),
                                   searcher.index.vectors("end", e_ids), pos))
        log.info("epoch %d: %d of %d questions have a positive among the top %d phrases",
                 epoch + 1, len(candidates), len(questions), args.top_k)
        if not candidates:
            raise InputError("no training question has a positive phrase among its top phrases")
        model.train()
        random.shuffle(candidates)
        losses = []
        for a in tqdm(range(0, len(candidates), args.batch_size), desc=f"train-query epoch {epoch + 1}", disable=None):
            batch = candidates[a:a + args.batch_size]
            enc = encode_questions(searcher.tokenizer, [c[0] for c in batch], model.config.max_question_tokens)
            qs, qe = model.encode_questions(**{k: v.to(searcher.device) for k, v in enc.items()})
            loss = 0.0
            for b, (_, s_vec, e_vec, pos) in enumerate(batch):
                scores = qs[b] @ torch.from_numpy(s_vec).T + qe[b] @ torch.from_numpy(e_vec).T
                mask = torch.from_numpy(pos)
                loss = loss + torch.logsumexp(scores, 0) - torch.logsumexp(scores[mask], 0)
            loss = loss / len(batch)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
        history.append({"epoch": epoch + 1, "questions": len(candidates), "loss": float(np.mean(losses))})
        log.info("epoch %d: loss %.4f", epoch + 1, history[-1]["loss"])
    model.eval()
    model.save_pretrained(args.out_dir, searcher.tokenizer)
    write_json(Path(args.out_dir) / "train_query.json", {"args": vars(args), "history": history})
    return {"history": history}
