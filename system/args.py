"""The settings of `odqa run`, as a dataclass whose fields carry their command-line help. Nothing heavy
is imported here, so that building the CLI's parser (and `odqa --help`) loads no torch."""
from __future__ import annotations

from dataclasses import dataclass

from odqa.common.settings import OUT, arg, listed, required
from odqa.reader.args import ReaderSettings
from odqa.retriever.args import SearchConfig


@dataclass
class RunArgs(SearchConfig, ReaderSettings):
    """`odqa run`'s own settings, and every search and reading setting (`SearchConfig`, `ReaderSettings`,
    embedded)."""
    out_dir: str = required("where the files and the report go", **OUT)
    index: str | None = arg(None, "phrase index directory (default: the default pipeline's)")
    model: str | None = arg(None, "phrase model checkpoint (default: the default pipeline's)")
    reader: str | None = arg(None, "FiD reader checkpoint (default: the default pipeline's)")
    questions: list[str] = listed(["nq-test", "tqa-test"],
                                  "question sets (names, JSONL or DPR .qa.csv paths; NAME:N is the first N)")
    k: list[int] = listed([5, 10, 25, 50], "passages read by FiD")
    limit: int | None = arg(None, "first N questions of each set")
    doc_index: str | None = arg(None, "document index (pre-filter; default: the default pipeline's)")
    doc_model: str | None = arg(None, "document encoder of --doc-index")
    reranker: str | None = arg(None, "passage reranker (`odqa train-reranker` OUT/best; default: the default "
                                     "pipeline's, where it has one)")
    no_reranker: bool = arg(False, "without the default pipeline's passage reranker")
    corpus: str | None = arg(None, "`odqa corpus build` output (default: the default corpus)")
    baselines: list[str] = listed(["bm25", "dense"], "other retrievers on the Top-k plot: bm25, dense, or none")
    dense_encoder: str | None = arg(None, "encoder of the dense baseline (default: the data pack's MiniLM)")
    memory: str | None = arg(None, "answer memory (`odqa build-memory`; default: the default pipeline's, with its "
                                   "model): nearby training questions lend their answers to the vote")
    no_memory: bool = arg(False, "without the default pipeline's answer memory")

