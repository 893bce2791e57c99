"""`odqa dump-phrases`: start and end vectors of every passage token that may bound a phrase.

Passages are encoded in batches sorted by length; a token is kept when it is a text token and its
filter logit (max of "can start", "can end") passes `threshold` (None keeps every text token). Vectors
are stored as float16 in chunk files with their metadata (passage row, token index, character start/end
in the passage). `--shard k/n` takes the k-th of n contiguous slices of the corpus, so n processes or
GPUs split a large corpus; each chunk is written atomically and skipped when already there, so an
interrupted shard resumes where it stopped.
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from common.corpus import PassageStore, corpus_info
from common.io import InputError, atomic_path, write_json
from common.metrics.answers import exact_match
from retriever.phrase_data import encode_passages, encode_questions, gold_token_spans, passage_title
from retriever.phrase_model import DensePhraseModel, load_tokenizer, phrase_encoder_hash

log = logging.getLogger(__name__)


def parse_shard(shard: str) -> tuple[int, int]:
    try:
        k, n = (int(x) for x in shard.split("/"))
    except ValueError:
        raise InputError(f"--shard must look like 3/8, not {shard!r}") from None
    if not 1 <= k <= n:
        raise InputError(f"--shard {shard}: need 1 <= k <= n")
    return k, n


def shard_rows(total: int, k: int, n: int) -> range:
    return range((k - 1) * total // n, k * total // n)


def shard_dir(dump_dir: Path, k: int, n: int) -> Path:
    return dump_dir / f"shard-{k:03d}-of-{n:03d}"


@torch.no_grad()
def dump_phrases(model_dir: str | os.PathLike, corpus_dir: str | os.PathLike, dump_dir: str | os.PathLike,
                 shard: str = "1/1", batch_size: int = 32, chunk_passages: int = 1024,
                 threshold: float | None = None, device: str | None = None) -> dict:
    k, n = parse_shard(shard)
    dump_dir = Path(dump_dir)
    store = PassageStore(corpus_dir)
    info = corpus_info(corpus_dir)
    enc_hash = phrase_encoder_hash(model_dir)
    out = shard_dir(dump_dir, k, n)
    out.mkdir(parents=True, exist_ok=True)
    settings = {"encoder_hash": enc_hash, "fingerprint": info["fingerprint"], "threshold": threshold,
                "chunk_passages": chunk_passages, "shard": [k, n]}
    settings_path = out / "settings.json"
    if settings_path.exists() and json.loads(settings_path.read_text()) != settings:
        raise InputError(f"{out} holds a dump made with other settings, encoder or corpus: remove it or use another --out")
    write_json(settings_path, settings)

    rows = shard_rows(len(store), k, n)
    # Sorting by length makes batches of similar lengths (little padding); the order is deterministic,
    # so chunk i always holds the same passages and a resumed run skips the finished chunks.
    lengths = np.array([len(store[r]["text"]) for r in rows])
    order = np.asarray(rows)[np.argsort(lengths, kind="stable")] if len(rows) else np.zeros(0, np.int64)
    chunks = [order[i:i + chunk_passages] for i in range(0, len(order), chunk_passages)]
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    model = DensePhraseModel.from_pretrained(model_dir).to(device).eval()
    tokenizer = load_tokenizer(model_dir)
    cfg = model.config
    done = sum((out / f"chunk-{i:05d}.npz").exists() for i in range(len(chunks)))
    if done:
        log.info("%s: %d of %d chunks already dumped; resuming", out, done, len(chunks))
    bar = tqdm(total=len(order), initial=sum(len(c) for i, c in enumerate(chunks) if (out / f"chunk-{i:05d}.npz").exists()),
               desc=f"dump-phrases {k}/{n}", unit=" passages", disable=None)
    for i, chunk in enumerate(chunks):
        path = out / f"chunk-{i:05d}.npz"
        if path.exists():
            continue
        parts = {key: [] for key in ("start", "end", "passage_row", "token", "char_start", "char_end", "filter")}
        for b in range(0, len(chunk), batch_size):
            batch_rows = chunk[b:b + batch_size]
            passages = [store[int(r)] for r in batch_rows]
            enc = encode_passages(tokenizer, [passage_title(p, cfg.title_path) for p in passages], [p["text"] for p in passages],
                                  cfg.max_passage_tokens)
            start, end, filt = model.encode_passages(**{kk: v.to(device) for kk, v in enc.batch.items()})
            keep = enc.candidate.to(device)
            if threshold is not None:
                keep &= filt.max(-1).values >= threshold
            bi, ti = keep.nonzero(as_tuple=True)   # row-major: a passage's tokens stay together, in order
            parts["start"].append(start[bi, ti].half().cpu().numpy())
            parts["end"].append(end[bi, ti].half().cpu().numpy())
            parts["filter"].append(filt[bi, ti].max(-1).values.half().cpu().numpy())
            bi, ti = bi.cpu(), ti.cpu()
            parts["passage_row"].append(np.asarray(batch_rows)[bi.numpy()].astype(np.int64))
            parts["token"].append(ti.numpy().astype(np.int32))
            parts["char_start"].append(enc.offsets[bi, ti, 0].numpy().astype(np.int32))
            parts["char_end"].append(enc.offsets[bi, ti, 1].numpy().astype(np.int32))
            bar.update(len(batch_rows))
        arrays = {key: np.concatenate(v) if v else np.zeros(0) for key, v in parts.items()}
        # Group by passage row (batches were sorted by length, not row) keeping token order.
        order_in_chunk = np.lexsort((arrays["token"], arrays["passage_row"]))
        arrays = {key: v[order_in_chunk] for key, v in arrays.items()}
        with atomic_path(path) as tmp, open(tmp, "wb") as f:
            np.savez(f, **arrays)
    bar.close()
    store.close()
    total_vectors = sum(int(np.load(out / f"chunk-{i:05d}.npz")["token"].shape[0]) for i in range(len(chunks)))
    summary = {**settings, "passages": len(order), "chunks": len(chunks), "vectors": total_vectors,
               "vectors_per_passage": total_vectors / max(len(order), 1), "dim": model.dim,
               "max_span_len": cfg.max_span_len}
    write_json(out / "done.json", summary)
    log.info("%s: %d vectors for %d passages (%.1f per passage)", out, total_vectors, len(order),
             summary["vectors_per_passage"])
    return summary


@torch.no_grad()
def filter_report(model_dir: str | os.PathLike, examples: list[dict], thresholds: list[float | None],
                  batch_size: int = 32) -> list[dict]:
    """What a dump at each threshold keeps of supervision passages (`{question, title, text, answers,
    answer_char_spans}`): the share of text tokens, the recall of answer phrases (both boundary tokens
    kept), and the EM of the best phrase of the gold passage among the kept tokens."""
    from retriever.phrase_train import best_spans  # not at the top: it brings accelerate into every dump

    model = DensePhraseModel.from_pretrained(model_dir).eval()
    tokenizer, cfg = load_tokenizer(model_dir), model.config
    counts = {t: {"kept": 0, "recall": 0, "em": 0} for t in thresholds}
    tokens = answerable = 0
    for a in tqdm(range(0, len(examples), batch_size), desc="filter report", disable=None):
        chunk = examples[a:a + batch_size]
        enc = encode_passages(tokenizer, [passage_title(e, cfg.title_path) for e in chunk], [e["text"] for e in chunk],
                              cfg.max_passage_tokens)
        qs, qe = model.encode_questions(**encode_questions(tokenizer, [e["question"] for e in chunk],
                                                           cfg.max_question_tokens))
        hs, he, filt = model.encode_passages(**enc.batch)
        start, end = torch.einsum("bd,btd->bt", qs, hs), torch.einsum("bd,btd->bt", qe, he)
        gold = [gold_token_spans(enc.offsets[b], enc.candidate[b], e["answer_char_spans"], cfg.max_span_len)
                for b, e in enumerate(chunk)]
        tokens += int(enc.candidate.sum())
        answerable += sum(bool(g) for g in gold)
        for t in thresholds:
            keep = enc.candidate if t is None else enc.candidate & (filt.max(-1).values >= t)
            c = counts[t]
            c["kept"] += int(keep.sum())
            c["recall"] += sum(any(keep[b, i] and keep[b, j] for i, j in g) for b, g in enumerate(gold))
            for b, (i, j, score) in enumerate(best_spans(start, end, keep, cfg.max_span_len)):
                if score > float("-inf"):
                    off = enc.offsets[b]
                    c["em"] += exact_match(chunk[b]["text"][int(off[i, 0]):int(off[j, 1])], chunk[b]["answers"])
    return [{"threshold": t, "share_kept": counts[t]["kept"] / max(tokens, 1),
             "answer_recall": counts[t]["recall"] / max(answerable, 1), "em": counts[t]["em"] / max(len(examples), 1),
             "examples": len(examples), "answerable": answerable} for t in thresholds]
