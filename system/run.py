"""`odqa run`: the evaluation of the whole system on question sets, per k, into one directory.

    OUT/retrieval-SET.json        phrase retrieval (DPR format, top max(k), "prediction" = the extractive answer)
    OUT/fid-SET-kK.jsonl          the reader's input: each question with its top K passages
    OUT/pred-SET-kK.jsonl         FiD's generated answers
    OUT/bm25-SET.json, dense-SET.json   baseline retrievers for the Top-k curves
    OUT/questions.jsonl           per question (`odqa.common.results.RunQuestion`): extractive answer, EM and F1,
                                  per k generated answer, EM, F1, hit
    OUT/report.md, report.json    one row per SET x k (system/report.py)
    OUT/em_by_k.png, topk.png     EM by k for both answer kinds; Top-k curves of the three retrievers

Resumable: each file is written atomically beside a `.key.json` naming what it was made from
(models, indexes, questions, k, settings); a rerun reuses every file whose key still matches, and a
retrieval or a reading cut short resumes from its finished batches (OUT/.NAME.parts).

Under `torchrun` or `accelerate launch`, each rank retrieves and reads its share of every question
set (common/ranks.py), every rank holds the merged results, and rank 0 alone writes the files.
"""
from __future__ import annotations

import logging
from dataclasses import asdict, replace
from pathlib import Path

from odqa.common.artifact import cached_file, cached_key, path_fingerprint, plain
from odqa.common.corpus import PassageStore
from odqa.common.device import search_dtype
from odqa.common.io import InputError, read_json, read_jsonl, write_json, write_jsonl
from odqa.common.metrics.answers import answer_em, f1_score
from odqa.common.paths import default_corpus, default_encoder
from odqa.common.questions import load_questions, question_set_name
from odqa.common.ranks import current, parts_beside
from odqa.common.results import ReadAtK, RunQuestion
from odqa.common.retrieval_file import read_results, write_results
from odqa.common.settings import settings_of
from odqa.reader.read import ECHO_RETRIES, read
from odqa.retriever.retrieve import retrieve, retrieve_phrases
from odqa.retriever.search_config import ANSWER_FILTER_RULES
from odqa.system.args import Evaluation, RunArgs
from odqa.system.report import REPORT_FILES, write_report

log = logging.getLogger(__name__)


def run(args: RunArgs) -> list[dict]:
    from odqa.system.pipeline import assemble
    ev = args.evaluation
    parts = args.parts
    if not ev.with_memory and parts.memory is None:   # the memory is a column asked for, not a default
        parts = replace(parts, no_memory=True)
    pipeline = assemble(parts, args.search, args.reading)   # the parts not given: the default pipeline's
    parts, search, reading = pipeline.parts, pipeline.search_config, pipeline.settings
    args = replace(args, parts=parts)
    if ev.with_memory and parts.memory is None:
        raise InputError("--with-memory: there is no answer memory to consult (the default pipeline has none, or "
                         "--index / --model name a search of your own): pass --memory PATH, or `odqa build-memory`")
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if not ev.k or min(ev.k) < 1:
        raise InputError(f"--k needs positive values, not {ev.k}")
    if set(ev.baselines) - set(BASELINES):
        raise InputError(f"--baselines: each of {', '.join(BASELINES)}, not {ev.baselines}")
    names = [question_set_name(name) for name in ev.questions]
    if len(set(names)) < len(names):
        raise InputError(f"--questions names a set twice ({' '.join(ev.questions)}): its files would overwrite each other")
    if parts.memory:
        from odqa.retriever.answer_memory import memory_sets
        held = sorted({question_set_name(s) for s in memory_sets(parts.memory)} & set(names))
        if held:
            raise InputError(f"the answer memory {parts.memory} holds {', '.join(held)}, which this run evaluates: its "
                             f"questions would find themselves; pass --no-memory, or build a memory without them")
    corpus = parts.corpus or str(default_corpus())
    max_k = max(ev.k)
    # What a retrieval is made from: the parts by their files, its search settings, and the version of
    # the answer filter's rules; of these the reader's passages do not depend on the memory, nor (unless
    # it reads the passages' phrases) on the extractive answer's settings.
    base_key = {"parts": {name: path_fingerprint(getattr(parts, name)) for name in SEARCH_PARTS},
                "memory": path_fingerprint(parts.memory), "corpus": corpus, "limit": ev.limit,
                "search": settings_of(search), "answer_filter_rules": ANSWER_FILTER_RULES}
    ranks = current()
    if ranks.main:
        # A report is only ever beside the arguments that made it: one of a run with other arguments (another
        # --limit, other sets) goes before this run starts, so a run cut short leaves no report of the other.
        previous = out / "run_args.json"
        if previous.exists() and read_json(previous) != plain(asdict(args)):
            for name in (*REPORT_FILES, "questions.jsonl"):
                (out / name).unlink(missing_ok=True)
        write_json(previous, asdict(args))
    reader_fp = path_fingerprint(parts.reader)
    dtype = str(search_dtype(pipeline.device))
    records, curves = [], {}
    for name in ev.questions:
        ds = question_set_name(name)
        questions = load_questions(name, limit=ev.limit)
        retrieval = out / f"retrieval-{ds}.json"
        r_key = {**base_key, "questions": name}

        def make_retrieval():
            entries = retrieve_phrases(pipeline.searcher, questions, max_k, parts=parts_beside(retrieval), key=r_key)
            if ranks.main:
                write_results(retrieval, entries)
        r_key = cached_file(retrieval, r_key, make_retrieval, depth=max_k)
        # The reader reads the passages, not the extractive answer: another vote re-reads nothing. Nor do
        # the filter's rules, unless the reader decodes the phrases.
        passages_key = {k: v for k, v in r_key.items() if k != "memory"}
        passages_key["search"] = {k: v for k, v in r_key["search"].items() if k not in ("memory", "answer")}
        if reading.decoding == "phrases":   # the phrases it reads are those the filter lets each passage show
            passages_key["search"]["answer_filter"] = search.answer.answer_filter
        else:
            passages_key.pop("answer_filter_rules")
        entries = read_results(retrieval)
        curves[ds] = {"phrase": [[c["has_answer"] for c in e["ctxs"]] for e in entries]}
        if set(ev.baselines) - {"none"}:
            curves[ds].update(_baselines(ev, corpus, name, ds, questions, max_k, out))
        per_k, fid_files, pred_files, p_keys = {}, {}, {}, {}
        for k in sorted(ev.k):
            fid_files[k], pred_files[k] = out / f"fid-{ds}-k{k}.jsonl", out / f"pred-{ds}-k{k}.jsonl"
            f_key = {"retrieval": r_key, "k": k}

            def make_fid(k=k):
                if ranks.main:
                    write_jsonl(fid_files[k], ({**e, "ctxs": e["ctxs"][:k]} for e in entries))
            cached_file(fid_files[k], f_key, make_fid)
            # echo_retries: predictions of the decoding before echoes were decoded again are read anew;
            # dtype: those read in another precision too (the batch size changes no answer)
            p_keys[k] = {"retrieval": passages_key, "k": k, "reader": reader_fp,
                         "reading": {k2: v for k2, v in asdict(reading).items() if k2 != "batch_size"},
                         "echo_retries": ECHO_RETRIES, "dtype": dtype}
        # Every k still to read is read in one pass over the largest one's file: the encoder runs once.
        stale = [k for k in sorted(ev.k) if cached_key(pred_files[k], p_keys[k]) is None]
        read_now = set()

        def make_predictions():
            if not read_now:
                read(*pipeline.reader, fid_files[stale[-1]], {k: pred_files[k] for k in stale}, reading,
                     pipeline.device, parts=parts_beside(pred_files[stale[-1]]), key=[p_keys[k] for k in stale])
                read_now.update(stale)
        for k in sorted(ev.k):
            cached_file(pred_files[k], p_keys[k], make_predictions)
            per_k[k] = [obj for _, obj in read_jsonl(pred_files[k])]
            if len(per_k[k]) != len(entries):
                raise InputError(f"{pred_files[k]} has {len(per_k[k])} predictions for {len(entries)} questions: delete it")
        for i, (q, e) in enumerate(zip(questions, entries)):
            regex = bool(e.get("regex"))
            f1 = (lambda answer: None) if regex else (lambda answer, golds=e["answers"]: f1_score(answer, golds))
            raw = q.extra.get("answers_raw") if isinstance(q.extra.get("answers_raw"), list) else None
            em_raw = (lambda answer: None) if raw is None else (lambda answer, golds=raw: answer_em(answer, golds))
            # the extractive answer is the phrase model's own; the memory's, where it voted, a column of its own
            own = e.get("prediction_without_memory", e.get("prediction", ""))
            helped = e.get("prediction", "") if "prediction_without_memory" in e else None
            records.append(RunQuestion(
                ds, e["id"], e["question"], tuple(e["answers"]), own, answer_em(own, e["answers"], regex),
                {k: ReadAtK(per_k[k][i]["prediction"], bool(per_k[k][i]["em"]), any(c["has_answer"] for c in e["ctxs"][:k]),
                            f1(per_k[k][i]["prediction"]), em_raw(per_k[k][i]["prediction"]))
                 for k in sorted(ev.k)}, f1(own), helped,
                None if helped is None else answer_em(helped, e["answers"], regex),
                None if raw is None else tuple(raw), em_raw(own)))
    if not ranks.main:
        return []
    lines = [r.to_dict() for r in records]
    write_jsonl(out / "questions.jsonl", lines)
    return write_report(lines, out, curves, max_k)


SEARCH_PARTS = ("index", "model", "doc_index", "doc_model", "reranker")   # the parts the passages come from
BASELINES = ("bm25", "dense", "none")


def _baselines(args: Evaluation, corpus: str, name: str, ds: str, questions, max_k: int, out: Path) -> dict:
    from odqa.retriever.bm25 import BM25Index
    from odqa.retriever.dense import DenseIndex
    runs = {}
    encoder = args.dense_encoder or str(default_encoder())
    passages = args.dense_passage_encoder
    if passages and not args.dense_encoder:
        raise InputError("--dense-passage-encoder is DPR's context encoder: --dense-encoder names its question encoder")
    dense = "DPR" if passages else "dense (single vector)"
    for kind, label, open_index in (("bm25", "BM25", lambda: BM25Index.open(corpus)),
                                    ("dense", dense, lambda: DenseIndex.open(corpus, encoder, passages))):
        if kind not in args.baselines:
            continue
        path = out / f"{kind}-{ds}.json"
        key = {"corpus": corpus, "questions": name, "limit": args.limit, "encoder": encoder if kind == "dense" else None,
               **({"passage_encoder": passages} if kind == "dense" and passages else {})}

        def make():
            store = PassageStore(corpus)
            entries = retrieve(open_index(), store, questions, max_k, parts=parts_beside(path), key=[key, max_k])
            if current().main:
                write_results(path, entries)
            store.close()
        cached_file(path, key, make, depth=max_k)
        runs[label] = [[c["has_answer"] for c in e["ctxs"]] for e in read_results(path)]
    return runs
