"""`odqa dump-phrases`: start and end vectors of every passage token that may bound a phrase.

Passages are encoded in batches sorted by length; a token is kept when it is a candidate (a text token,
or a title token for a model with title phrases) and its filter logit (max of "can start", "can end")
passes `threshold` (None keeps every candidate). Vectors
are stored as float16 in chunk files with their metadata (passage row, token index, character start/end
in the passage's text, or in its title for a model with title phrases, and whether the token is a
title's). Passages are sorted by length and cut into chunks of `chunk_passages`; `--shard k/n` takes chunks
k-1, k-1+n, k-1+2n, ... (every n-th: each shard gets long and short passages alike), so n processes or
GPUs split a large corpus (under torchrun or accelerate launch, rank r takes shard r + 1 of the
world's, on its own GPU), and every chunk holds the passages, in the batches, that one process would
encode in it: the vectors, and the index built from them, are the same however the dump is split.
Each chunk is written atomically and skipped when already there, so an interrupted shard resumes
where it stopped. On a GPU that computes bfloat16 natively the encoder
runs under bfloat16 autocast, as search does; the vectors are stored as float16 either way. On a CPU
it runs in float32: a CPU dump is the small corpus's, where the demo's dumps are kept as they were.
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from odqa.common.corpus import PassageStore, corpus_info
from odqa.common.device import pick_device, search_dtype
from odqa.common.io import InputError, atomic_path, read_json, write_json
from odqa.retriever.lm import load_tokenizer
from odqa.retriever.phrase_data import encode_passages, passage_title
from odqa.retriever.phrase_model import DensePhraseModel, kept_tokens, phrase_encoder_hash

log = logging.getLogger(__name__)


def parse_shard(shard: str) -> tuple[int, int]:
    try:
        k, n = (int(x) for x in shard.split("/"))
    except ValueError:
        raise InputError(f"--shard must look like 3/8, not {shard!r}") from None
    if not 1 <= k <= n:
        raise InputError(f"--shard {shard}: need 1 <= k <= n")
    return k, n


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
                "chunk_passages": chunk_passages, "shard": [k, n],
                # a shard of n > 1 was a contiguous slice of rows before: such a half-made shard is not resumed
                **({"shards": "every n-th chunk"} if n > 1 else {})}
    settings_path = out / "settings.json"
    if settings_path.exists() and json.loads(settings_path.read_text()) != settings:
        raise InputError(f"{out} holds a dump made with other settings, encoder or corpus: remove it or use another --out")

    # Sorting by length makes batches of similar lengths (little padding); the order is deterministic,
    # so chunk i always holds the same passages and a resumed run skips the finished chunks.
    lengths = np.array([len(p["text"]) for p in tqdm(store, total=len(store), desc="passage lengths", disable=None,
                                                     mininterval=2)], dtype=np.int64)
    everything = np.argsort(lengths, kind="stable")
    mine = range(k - 1, -(-len(everything) // chunk_passages), n)
    chunks = {i: everything[i * chunk_passages:(i + 1) * chunk_passages] for i in mine}
    order = np.concatenate(list(chunks.values())) if chunks else np.zeros(0, np.int64)
    device = pick_device(device)
    device_type = torch.device(device).type
    dtype = search_dtype(device) if device_type == "cuda" else torch.float32
    model = DensePhraseModel.from_pretrained(model_dir).to(device).eval()
    tokenizer = load_tokenizer(model_dir)
    cfg = model.config
    write_json(settings_path, settings)   # only once the model loads: a failed start leaves no claim on `out`
    done = sum((out / f"chunk-{i:05d}.npz").exists() for i in chunks)
    if done:
        log.info("%s: %d of %d chunks already dumped; resuming", out, done, len(chunks))
    bar = tqdm(total=len(order), initial=sum(len(c) for i, c in chunks.items() if (out / f"chunk-{i:05d}.npz").exists()),
               desc=f"dump-phrases {k}/{n}", unit=" passages", disable=None)
    for i, chunk in chunks.items():
        path = out / f"chunk-{i:05d}.npz"
        if path.exists():
            continue
        parts = {key: [] for key in DUMP_FIELDS if not (key == "end" and model.shared_sides)}
        for b in range(0, len(chunk), batch_size):
            batch_rows = chunk[b:b + batch_size]
            passages = [store[int(r)] for r in batch_rows]
            enc = encode_passages(tokenizer, [passage_title(p, cfg.title_path) for p in passages], [p["text"] for p in passages],
                                  cfg.max_passage_tokens, title_phrases=cfg.title_phrases)
            with torch.autocast(device_type, dtype=dtype, enabled=dtype != torch.float32):
                start, end, filt = model.encode_passages(**{kk: v.to(device) for kk, v in enc.batch.items()})
            start, end, filt = start.float(), end.float(), filt.float()
            keep = kept_tokens(enc.candidate.to(device), filt, threshold)
            bi, ti = keep.nonzero(as_tuple=True)   # row-major: a passage's tokens stay together, in order
            parts["start"].append(start[bi, ti].half().cpu().numpy())
            if not model.shared_sides:   # else end is start, stored once (as DensePhrases' dumps hold it)
                parts["end"].append(end[bi, ti].half().cpu().numpy())
            parts["filter"].append(filt[bi, ti].max(-1).values.half().cpu().numpy())
            bi, ti = bi.cpu(), ti.cpu()
            parts["passage_row"].append(np.asarray(batch_rows)[bi.numpy()].astype(np.int64))
            parts["token"].append(ti.numpy().astype(np.int32))
            parts["char_start"].append(enc.offsets[bi, ti, 0].numpy().astype(np.int32))
            parts["char_end"].append(enc.offsets[bi, ti, 1].numpy().astype(np.int32))
            parts["in_title"].append(enc.in_title[bi, ti].numpy())
            bar.update(len(batch_rows))
        arrays = {key: np.concatenate(v) if v else np.zeros(0) for key, v in parts.items()}
        # Group by passage row (batches were sorted by length, not row) keeping token order.
        order_in_chunk = np.lexsort((arrays["token"], arrays["passage_row"]))
        arrays = {key: v[order_in_chunk] for key, v in arrays.items()}
        with atomic_path(path) as tmp, open(tmp, "wb") as f:
            np.savez(f, **arrays)
    bar.close()
    store.close()
    total_vectors = sum(int(np.load(out / f"chunk-{i:05d}.npz")["token"].shape[0]) for i in chunks)
    summary = {**settings, "passages": len(order), "chunks": len(chunks), "vectors": total_vectors,
               "vectors_per_passage": total_vectors / max(len(order), 1), "dim": model.dim,
               "max_span_len": cfg.max_span_len, "title_path": cfg.title_path, "shared_sides": model.shared_sides}
    write_json(out / "done.json", summary)
    log.info("%s: %d vectors for %d passages (%.1f per passage)", out, total_vectors, len(order),
             summary["vectors_per_passage"])
    return summary



DUMP_FIELDS = ("start", "end", "passage_row", "token", "char_start", "char_end", "filter", "in_title")


def dump_shards(dump_dir: str | os.PathLike) -> tuple[list[Path], dict]:
    """The complete shards of a dump, and the summary they share; a missing, unfinished or mismatched
    shard is refused."""
    dump_dir = Path(dump_dir)
    shards = sorted(p for p in dump_dir.glob("shard-*-of-*") if p.is_dir())
    if not shards:
        raise InputError(f"{dump_dir}: no phrase dump shards (run `odqa dump-phrases` first)")
    summaries = []
    for s in shards:
        if not (s / "done.json").exists():
            raise InputError(f"{s} is not complete: run its `odqa dump-phrases --shard` again to finish it")
        summaries.append(read_json(s / "done.json"))
    n = {tuple(x["shard"])[1] for x in summaries}
    keys = {(x["encoder_hash"], x["fingerprint"], x["dim"], x["max_span_len"]) for x in summaries}
    if len(n) != 1 or len(shards) != n.pop() or len(keys) != 1:
        raise InputError(f"{dump_dir}: shards are missing or were made with different encoders or corpora")
    return shards, summaries[0]


def dump_chunks(dump_dir: str | os.PathLike, corpus_dir: str | os.PathLike) -> tuple[list[Path], dict]:
    """The chunk files of a complete dump of `corpus_dir`, each holding whole passages, grouped by passage
    row with tokens in order; and the dump's summary."""
    shards, summary = dump_shards(dump_dir)
    if summary["fingerprint"] != corpus_info(corpus_dir)["fingerprint"]:
        raise InputError(f"{dump_dir} was dumped from another version of {corpus_dir}")
    return [c for s in shards for c in sorted(s.glob("chunk-*.npz"))], summary


def read_chunk(path: Path, fields=DUMP_FIELDS) -> dict[str, np.ndarray]:
    """Some fields of one dump chunk (an npz reads only the arrays asked for). A model whose start and
    end vectors are one stores only start: its end is the same array."""
    with np.load(path) as z:
        def field(k):
            if k == "in_title" and k not in z.files:   # a dump made before title phrases: text tokens only
                return np.zeros(len(z["token"]), bool)
            return z["start" if k == "end" and k not in z.files else k]
        return {k: field(k) for k in fields}


def read_dump(dump_dir: str | os.PathLike, corpus_dir: str | os.PathLike, rows: np.ndarray | None = None
              ) -> tuple[dict[str, np.ndarray], dict]:
    """Every shard's chunks merged, passages in corpus order and tokens in order within a passage (so a
    passage's vectors are one contiguous range), and the dump's summary; only the passages `rows` when
    given. All in memory: for a small corpus's dump, or for some of its passages (`build_index` reads a
    dump a chunk at a time)."""
    chunks, summary = dump_chunks(dump_dir, corpus_dir)
    arrays = {k: [] for k in DUMP_FIELDS}
    for c in tqdm(chunks, desc="read dump", disable=None):
        chunk = read_chunk(c)
        if rows is not None:
            mine = np.isin(chunk["passage_row"], rows)
            chunk = {k: v[mine] for k, v in chunk.items()}
        for k, v in chunk.items():
            arrays[k].append(v)
    merged = {k: np.concatenate(v) for k, v in arrays.items()}
    order = np.lexsort((merged["token"], merged["passage_row"]))
    return {k: v[order] for k, v in merged.items()}, summary
