"""`odqa train-filter`: which dumped tokens may bound an answer phrase, learned on the dump itself.

A phrase index is as large as the tokens it keeps. DensePhrases keeps only the tokens a filter passes.
The phrase model's own filter head is trained jointly with a small weight, on one gold passage per
step; at this repository's budgets it barely separates (the demo's keeps 49% of tokens and 58% of
answer phrases at logit 0). This filter is fitted afterwards, on the frozen vectors the dump holds:
an MLP over a token's [start; end] vectors, trained with class-weighted binary cross-entropy to say
whether the token starts or ends an answer occurrence in a supervision passage. It needs no encoder
pass and fits in about a minute on a CPU.

    DUMP/filter/filter.pt      the MLP's weights
    DUMP/filter/filter.json    its shape, what it was fitted on, and the calibration table: for each
                               share of the dump's tokens kept, the score threshold and the share of
                               validation answer phrases whose start and end tokens both survive
    DUMP/filter/scores.npy     every dumped token's score, in chunk order, which build-index reads
                               instead of scoring the dump again (float32, 4 bytes a token)

`odqa build-index --keep S` keeps the share S of the dump's tokens with the highest scores.
"""
from __future__ import annotations

import copy
import logging
import os
from pathlib import Path

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from odqa.common.corpus import PassageStore
from odqa.common.io import InputError, atomic_path, loading, read_json, write_json
from odqa.common.metrics.has_answer import answer_spans
from odqa.common.paths import default_corpus
from odqa.common.settings import needs
from odqa.common.tracking import Trackers
from odqa.retriever.args import FilterArgs
from odqa.retriever.phrase_data import passage_title
from odqa.retriever.phrase_dump import dump_chunks, read_chunk, read_dump
from odqa.retriever.supervise import load_examples

log = logging.getLogger(__name__)
SHARES = (0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 1.0)


class PhraseFilter(nn.Module):
    def __init__(self, dim: int, hidden: int = 256):
        super().__init__()
        self.dim, self.hidden = dim, hidden
        self.mlp = nn.Sequential(nn.Linear(2 * dim, hidden), nn.GELU(), nn.Linear(hidden, 2))

    def forward(self, start: torch.Tensor, end: torch.Tensor) -> torch.Tensor:
        """(N, 2) logits: can start, can end, in the weights' dtype (the dump's vectors may be float16)."""
        return self.mlp(torch.cat([start, end], -1).to(self.mlp[0].weight.dtype))

    @torch.no_grad()
    def score(self, start: np.ndarray, end: np.ndarray, batch: int = 200_000) -> np.ndarray:
        """max(can start, can end) for each token: what `--keep` ranks. In float64, rounded to float32 at
        the end: a float32 product's rounding depends on how many rows the BLAS kernel is handed, and an
        index must keep the same tokens however its dump was chunked."""
        exact = copy.deepcopy(self).double()
        out = [exact(torch.from_numpy(start[a:a + batch]), torch.from_numpy(end[a:a + batch])).max(-1).values.float().numpy()
               for a in range(0, len(start), batch)]
        return np.concatenate(out) if out else np.zeros(0, np.float32)


def filter_dir(dump_dir: str | os.PathLike) -> Path:
    return Path(dump_dir) / "filter"


def load_filter(path: str | os.PathLike) -> tuple[PhraseFilter, dict]:
    path = Path(path)
    if not (path / "filter.json").exists():
        raise InputError(f"{path}: no phrase filter (run `odqa train-filter --dump DUMP` first)")
    info = read_json(path / "filter.json")
    model = PhraseFilter(info["dim"], info["hidden"])
    try:
        model.load_state_dict(torch.load(path / "filter.pt", map_location="cpu"))
    except (RuntimeError, OSError, KeyError) as e:
        raise InputError(f"{path}/filter.pt: not a phrase filter of dim {info['dim']} ({e})") from None
    return model.eval(), info


def passage_places(corpus_dir, ids: set[str]) -> tuple[dict[str, int], dict[str, list]]:
    """The row and section path of each of the passages `ids` the corpus has."""
    store = PassageStore(corpus_dir)
    row_of = store.rows_of(ids)
    section_of = {pid: store[row].get("section", []) for pid, row in row_of.items()}
    store.close()
    return row_of, section_of


def answer_labels(arrays: dict, examples: list[dict], corpus_dir, title_path: bool = False, places=None
                  ) -> tuple[np.ndarray, np.ndarray, list]:
    """Vector ids of the examples' passages, (N, 2) start/end labels, and for each example the list of
    its answer occurrences as (start id, end id) pairs that the dump can represent. `title_path`: the
    phrase model read "title, section, ..." as the title segment, so title answers are found there.
    `places`: `passage_places` of (at least) the examples' passages, when the caller has it."""
    row_of, section_of = places or passage_places(corpus_dir, {ex.get("passage_id") for ex in examples})
    rows = arrays["passage_row"]
    ids, labels, spans = [], [], []
    for ex in examples:
        row = row_of.get(ex.get("passage_id"))
        if row is None:
            raise InputError(f"supervision passage {ex.get('passage_id')!r} is not in the corpus {corpus_dir}")
        vid = np.arange(np.searchsorted(rows, row), np.searchsorted(rows, row, side="right"))
        cs, ce, in_title = arrays["char_start"][vid], arrays["char_end"][vid], arrays["in_title"][vid]
        lab = np.zeros((len(vid), 2), np.float32)
        own = []
        # Offsets index the text, or the title segment for a title token (a dump with title phrases).
        segment = passage_title({**ex, "section": section_of[ex["passage_id"]]}, title_path)
        title_spans = answer_spans(segment, ex["answers"], bool(ex.get("regex"))) if in_title.any() else []
        for title, occurrences in ((False, ex["answer_char_spans"]), (True, title_spans)):
            for a, b in occurrences:
                s = np.flatnonzero((cs == a) & (in_title == title))
                e = np.flatnonzero((ce == b) & (in_title == title))
                lab[s, 0], lab[e, 1] = 1, 1
                if len(s) and len(e):
                    own.append((int(vid[s[0]]), int(vid[e[0]])))
        ids.append(vid)
        labels.append(lab)
        spans.append(own)
    return np.concatenate(ids), np.concatenate(labels), spans


def answer_recall(keep: np.ndarray, spans: list) -> float:
    """Share of examples (with a representable answer) that keep both tokens of some answer occurrence."""
    answerable = [own for own in spans if own]
    return sum(any(keep[s] and keep[e] for s, e in own) for own in answerable) / max(len(answerable), 1)


def train_filter(args: FilterArgs) -> dict:
    """`odqa train-filter`: fit the filter on the supervision passages' tokens, score the whole dump with
    it, and write OUT (default DUMP/filter): the weights, every token's score and the calibration table.
    `report_to`: the loss every `log_steps` and each share's answer recall to accelerate's trackers
    (OUT/runs)."""
    needs(args, "dump", "train_file", "validation_file")
    dump_dir, corpus_dir = args.dump, args.corpus or default_corpus()
    out = Path(args.out) if args.out else filter_dir(dump_dir)
    train_examples, val_examples = load_examples(str(args.train_file)), load_examples(str(args.validation_file))
    # Only the supervision passages' tokens are read whole: a large corpus's dump does not fit in memory.
    places = passage_places(corpus_dir, {ex.get("passage_id") for ex in train_examples + val_examples})
    arrays, summary = read_dump(dump_dir, corpus_dir, rows=np.array(sorted(
        {places[0][ex["passage_id"]] for ex in train_examples + val_examples if ex.get("passage_id") in places[0]})))
    title_path = summary.get("title_path", False)   # dumps made before it was recorded: the title alone
    train_ids, train_y, _ = answer_labels(arrays, train_examples, corpus_dir, title_path, places)
    _, _, val_spans = answer_labels(arrays, val_examples, corpus_dir, title_path, places)
    if not train_y.any():
        raise InputError(f"{args.train_file}: no answer occurrence falls on the dump's token boundaries")
    config = {name: getattr(args, name) for name in ("dump", "train_file", "hidden", "epochs", "batch_size", "lr", "seed")}
    with atomic_path(out) as tmp:   # the trackers' files too: the directory appears whole, or not at all
        tmp.mkdir()
        with Trackers(args.report_to, tmp, "train-filter", config, rank=0) as trackers:
            model, steps = fit(arrays, train_ids, train_y, args, trackers)
            chunks = dump_chunks(dump_dir, corpus_dir)[0]
            every = np.concatenate(chunk_scores(model, chunks))   # shares of the whole dump
            kept_scores = every.copy()   # for build-index, which would otherwise read the whole dump again
            scores = model.score(arrays["start"], arrays["end"])
            table = []
            for share in SHARES:
                threshold = float(np.quantile(every, 1 - share, overwrite_input=True)) if share < 1 else float("-inf")
                table.append({"keep": share, "threshold": threshold,
                              "answer_recall": answer_recall(scores >= threshold, val_spans)})
            trackers.log({f"eval/answer_recall_keep_{row['keep']:g}": row["answer_recall"] for row in table}, steps)
        info = {"dim": model.dim, "hidden": args.hidden, "encoder_hash": summary["encoder_hash"],
                "fingerprint": summary["fingerprint"], "train_tokens": len(train_ids),
                "validation_answerable": sum(bool(s) for s in val_spans), "epochs": args.epochs, "calibration": table,
                "scores_of": chunk_stamps(chunks), "train_file": str(args.train_file),
                "validation_file": str(args.validation_file)}
        torch.save(model.state_dict(), tmp / "filter.pt")
        np.save(tmp / "scores.npy", kept_scores)
        write_json(tmp / "filter.json", info)
    return info


def fit(arrays: dict, train_ids: np.ndarray, train_y: np.ndarray, args: FilterArgs,
        trackers: Trackers) -> tuple[PhraseFilter, int]:
    """The filter fitted by `args` on the labelled tokens `train_ids` of `arrays` (the dump's rows read),
    and its number of steps."""
    start, end = arrays["start"], arrays["end"]
    torch.manual_seed(args.seed)
    model = PhraseFilter(start.shape[1], args.hidden)
    opt = torch.optim.Adam(model.parameters(), args.lr)
    y = torch.from_numpy(train_y)
    rate = y.mean(0).clamp_min(1e-6)
    pos_weight = ((1 - rate) / rate).sqrt()   # half-way to balanced: positives are ~1.5% of tokens
    g = torch.Generator().manual_seed(args.seed)
    steps = args.epochs * -(-len(train_ids) // args.batch_size)
    bar = tqdm(total=steps, desc="train-filter", disable=None)
    step = 0
    for _ in range(args.epochs):
        for b in torch.randperm(len(train_ids), generator=g).split(args.batch_size):
            ids = train_ids[b.numpy()]
            logits = model(torch.from_numpy(start[ids]), torch.from_numpy(end[ids]))
            loss = nn.functional.binary_cross_entropy_with_logits(logits, y[b], pos_weight=pos_weight)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            bar.update()
            bar.set_postfix(loss=f"{loss.item():.4f}")
            if step % args.log_steps == 0 or step == steps:
                trackers.log({"train/loss": loss.item()}, step)
    bar.close()
    model.eval()
    return model, steps


def chunk_stamps(chunks: list[Path]) -> list[list]:
    """Each dump chunk's shard, name and size: which dump a file of scores, in chunk order, belongs to."""
    return [[c.parent.name, c.name, c.stat().st_size] for c in chunks]


def saved_scores(path: str | os.PathLike, chunks: list[Path], sizes: list[int]) -> list[np.ndarray] | None:
    """Each chunk's scores as train-filter saved them (memory-mapped), when it scored these very chunks
    (`sizes`: each one's tokens), else None."""
    path = Path(path)
    if not (path / "scores.npy").is_file() or load_filter(path)[1].get("scores_of") != chunk_stamps(chunks):
        return None
    with loading(path / "scores.npy", "the filter's saved scores"):
        every = np.load(path / "scores.npy", mmap_mode="r", allow_pickle=False)
    if every.shape != (sum(sizes),):
        raise InputError(f"{path / 'scores.npy'} holds {len(every)} scores for a dump of {sum(sizes)} tokens: "
                         "run `odqa train-filter` again")
    return np.split(every, np.cumsum(sizes)[:-1])


def chunk_scores(model: PhraseFilter, chunks: list[Path]) -> list[np.ndarray]:
    """The filter's score of every token of a dump, a chunk at a time."""
    out = []
    for c in tqdm(chunks, desc="filter scores", disable=None):
        vectors = read_chunk(c, ("start", "end"))
        out.append(model.score(vectors["start"], vectors["end"]))
    return out


def fitted_filter(path: str | os.PathLike, encoder_hash: str) -> PhraseFilter:
    """The filter at `path`, refused unless it was fitted on the dump of this phrase encoder."""
    model, info = load_filter(path)
    if info["encoder_hash"] != encoder_hash:
        raise InputError(f"{path} was fitted on another phrase encoder's dump")
    return model
