"""The settings of `odqa run`, as a dataclass whose fields carry their command-line help. Nothing heavy
is imported here, so that building the CLI's parser (and `odqa --help`) loads no torch."""
from __future__ import annotations

from dataclasses import dataclass

from odqa.common.settings import OUT, arg, listed, required
from odqa.reader.args import ReaderSettings
from odqa.retriever.args import SearchConfig


@dataclass(kw_only=True)
class SearchParts:
    """Which phrase search: the paths of its parts. One not given is the default pipeline's: the index
    and the model; with the default index, its pre-filter, reranker and corpus; with the default model,
    its answer memory (`odqa.system.pipeline.resolve_parts`)."""
    index: str | None = arg(None, "phrase index directory (default: the default pipeline's, from `odqa demo`)")
    model: str | None = arg(None, "phrase model checkpoint (default: the default pipeline's)")
    doc_index: str | None = arg(None, "document index (`odqa build-doc-index`): search phrases only inside each "
                                      "question's top documents (default: the default pipeline's, with its index)")
    doc_model: str | None = arg(None, "the document encoder the document index was built with")
    no_prefilter: bool = arg(False, "search every phrase, without the default pipeline's document pre-filter")
    reranker: str | None = arg(None, "passage reranker (`odqa train-reranker` OUT/best): reorders the top "
                                     "max(k, --rerank-depth) passages (default: the default pipeline's, where it has one)")
    no_reranker: bool = arg(False, "without the default pipeline's passage reranker")
    memory: str | None = arg(None, "answer memory (`odqa build-memory`): the nearest training questions lend their "
                                   "answers to the extractive answer's vote where a top passage holds them as a "
                                   "phrase (default: the default pipeline's, when its model searches)")
    no_memory: bool = arg(False, "without the default pipeline's answer memory")
    corpus: str | None = arg(None, "`odqa corpus build` output (default: the default pipeline's, else the default "
                                   "corpus)")


@dataclass(kw_only=True)
class PipelineParts(SearchParts):
    """A search's parts and the FiD reader that reads what it finds."""
    reader: str | None = arg(None, "FiD reader checkpoint (train-reader OUT/best; default: the default pipeline's)")


@dataclass
class RunArgs(PipelineParts, SearchConfig, ReaderSettings):
    """`odqa run`'s own settings, the pipeline's parts (`PipelineParts`) and every search and reading
    setting (`SearchConfig`, `ReaderSettings`), embedded. In Python the settings are as given; the
    command takes those it is not given from the pipeline record (`odqa.system.pipeline.resolve_parts`)."""
    out_dir: str = required("where the files and the report go", **OUT)
    questions: list[str] = listed(["nq-test", "tqa-test"],
                                  "question sets (names, JSONL or DPR .qa.csv paths; NAME:N is the first N)")
    k: list[int] = listed([5, 10, 25, 50], "passages read by FiD")
    limit: int | None = arg(None, "first N questions of each set")
    baselines: list[str] = listed(["bm25", "dense"], "other retrievers on the Top-k plot: bm25, dense, or none")
    dense_encoder: str | None = arg(None, "encoder of the dense baseline (default: the data pack's MiniLM)")

    def __post_init__(self):   # both bases' checks: the MRO would run SearchConfig's alone
        SearchConfig.__post_init__(self)
        ReaderSettings.__post_init__(self)
