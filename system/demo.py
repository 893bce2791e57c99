"""`odqa demo`: the main job on the default data, reusing whatever an earlier run already built.

At this step: fetch the data pack, build passages and documents, run BM25 on NQ-test and print the
retrieval table.
"""
from __future__ import annotations

import logging
from pathlib import Path

from common import datapack
from common.corpus import PassageStore, build_corpus
from common.io import read_json
from common.paths import default_corpus, default_documents, odqa_home
from common.questions import load_questions
from common.retrieval_eval import answerable_flags, evaluate_results, format_table
from common.retrieval_file import write_results
from retriever.bm25 import BM25Index
from retriever.retrieve import retrieve

log = logging.getLogger(__name__)


def ensure_corpus(inputs: list[Path], out_dir: Path, max_words: int = 100) -> dict:
    """The built corpus in out_dir, rebuilt only if it was built from other inputs or settings."""
    info_path = out_dir / "corpus.json"
    if info_path.exists():
        info = read_json(info_path)
        if info.get("inputs") == [str(p.resolve()) for p in inputs] and info.get("max_words") == max_words:
            log.info("corpus already built at %s (%d passages); reusing it", out_dir, info["passages"])
            return info
    return build_corpus(inputs, out_dir, max_words=max_words)


def run_demo(out_dir: Path | None = None, questions: str = "nq-test", k: int = 100) -> str:
    out_dir = out_dir or odqa_home() / "runs" / "demo"
    datapack.fetch()
    corpus = default_corpus()
    ensure_corpus([default_documents()], corpus)
    index = BM25Index.open(corpus)
    store = PassageStore(corpus)
    entries = retrieve(index, store, load_questions(questions), k)
    store.close()
    run_file = out_dir / f"bm25-{questions}.json"
    write_results(run_file, entries)
    log.info("wrote %s", run_file)
    table = format_table({f"bm25 {questions}": evaluate_results(entries, answerable_flags(entries, corpus))})
    return table
