"""The settings of the system's and the data's commands (`odqa run`, `ask`, `serve`, `demo`, `data fetch`,
`corpus build`, `supervise`, `eval-retrieval`) and a pipeline's parts, as dataclasses whose fields carry
their command-line help. Nothing heavy is imported here, so that building the CLI's parser (and
`odqa --help`) loads no torch."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from odqa.common.settings import (
    CORPUS_HELP,
    FILE_OUT,
    OUT,
    QUESTIONS_HELP,
    HeldOut,
    Limited,
    Passages,
    Settings,
    arg,
    listed,
    override,
    path,
    required,
    section,
)
from odqa.reader.args import ReaderSettings
from odqa.retriever.search_config import SearchConfig


@dataclass(kw_only=True)
class SearchParts(Settings):
    """Which phrase search: the paths of its parts. One not given is the default pipeline's: the index
    and the model; with the default index, its pre-filter, reranker and corpus; with the default model,
    its answer memory (`odqa.system.pipeline.resolve_parts`)."""
    index: str | None = path(None, "phrase index directory (default: the default pipeline's, from `odqa demo`)")
    model: str | None = path(None, "phrase model checkpoint (default: the default pipeline's)")
    doc_index: str | None = path(None, "document index (`odqa build-doc-index`): search phrases only inside each "
                                       "question's top documents (default: the default pipeline's, with its index)")
    doc_model: str | None = path(None, "the document encoder the document index was built with")
    no_prefilter: bool = arg(False, "search every phrase, without the default pipeline's document pre-filter")
    reranker: str | None = path(None, "passage reranker (`odqa train-reranker` OUT/best): reorders the top "
                                      "max(k, --rerank-depth) passages (default: the default pipeline's, where it has "
                                      "one)")
    no_reranker: bool = arg(False, "without the default pipeline's passage reranker")
    memory: str | None = path(None, "answer memory (`odqa build-memory`): the nearest training questions lend their "
                                    "answers to the extractive answer's vote where a top passage holds them as a "
                                    "phrase (default: the default pipeline's, when its model searches)")
    no_memory: bool = arg(False, "without the default pipeline's answer memory")
    corpus: str | None = path(None, "`odqa corpus build` output (default: the default pipeline's, else the default "
                                    "corpus)")


@dataclass(kw_only=True)
class PipelineParts(SearchParts):
    """A search's parts and the FiD reader that reads what it finds."""
    reader: str | None = path(None, "FiD reader checkpoint (train-reader OUT/best; default: the default pipeline's)")


@dataclass(kw_only=True)
class Evaluation(Settings, Passages, Limited):
    """What `odqa run` evaluates: which question sets, at which k, against which other retrievers."""
    questions: list[str] = listed(["nq-test", "tqa-test"], f"question sets, each {QUESTIONS_HELP}", input=True)
    k: list[int] = override(Passages, "k", [5, 10, 25, 50], help="passages read by FiD")
    limit: int | None = override(Limited, "limit", None, help="first N questions of each set")
    baselines: list[str] = listed(["bm25", "dense"], "other retrievers on the Top-k plot: bm25, dense, or none")
    dense_encoder: str | None = path(None, "encoder of the dense baseline (default: the data pack's MiniLM); with "
                                           "--dense-passage-encoder, DPR's question encoder")
    dense_passage_encoder: str | None = path(None, "DPR's context encoder for the dense baseline, which is then DPR "
                                                   "([CLS] vectors, inner product)")
    with_memory: bool = arg(False, "also the extractive answer with the default pipeline's answer memory, in a "
                                   "column of its own (--memory PATH names one); the extractive EM column is always "
                                   "the phrase model's own answer, as the papers report it")


@dataclass(kw_only=True)
class RunArgs(Settings):
    """`odqa run`: where it writes, the pipeline's parts, its search and reading settings and what it
    evaluates, each a section. In Python the settings are as given; the command takes those it is not
    given from the pipeline record (`odqa.system.pipeline.resolve_parts`)."""
    out_dir: str | None = path(None, "where the files and the report go", required=True, **OUT)
    parts: PipelineParts = section(PipelineParts)
    search: SearchConfig = section(SearchConfig)
    reading: ReaderSettings = section(ReaderSettings)
    evaluation: Evaluation = section(Evaluation)


@dataclass(kw_only=True)
class AskArgs(Settings, Passages):
    """`odqa ask`'s own settings, beside a pipeline's parts and settings."""
    question: str = required("the question", positional=True, range="text")
    k: int = override(Passages, "k", 10, help="passages retrieved and read")


@dataclass(kw_only=True)
class ServeConfig(Settings):
    """`odqa serve`'s own settings: the server's address, batching, limits and processes."""
    host: str = arg("127.0.0.1", "address to bind (127.0.0.1: this machine only)")
    port: int = arg(8000, "port", range="port")
    max_batch: int | None = arg(None, "requests answered together at most (default: 8 on a CPU, 16 on a GPU; 1 "
                                      "answers one question at a time, at the lowest latency)", range="positive")
    max_wait_ms: float = arg(10.0, "wait for more requests after the first", range="non_negative")
    max_queue: int = arg(64, "requests that may wait; more are answered 429 with Retry-After", range="positive")
    max_queue_s: float | None = arg(None, "refuse (429) a request with more than this many seconds of work ahead of "
                                          "it, as measured (0: only when idle; negative: no such limit; default: 1)")
    timeout_s: float = arg(30.0, "a request not answered in this time gets 503", range="positive")
    request_timeout_s: float = arg(10.0, "a client must send each request whole (headers and body) within this "
                                         "many seconds of connecting or of its previous answer, or its connection "
                                         "is closed", range="positive")
    threads: int | None = arg(None, "CPU threads for the models (default: torch's choice, every core); fewer leave "
                                    "cores to other processes on the machine", range="positive")
    graceful_s: float = arg(60.0, "on shutdown, how long requests in flight may take to finish", range="non_negative")
    workers: int = arg(1, "server processes sharing the port, each with its own models and the limits above, the "
                          "memory-mapped indexes shared; /metrics sums them all", range="positive")


@dataclass(kw_only=True)
class DemoArgs(Settings):
    """`odqa demo`: which recipe, into which directory; the recipe's own settings are
    `odqa.system.recipe_config.RecipeConfig`'s, set by a preset file, and those of them marked for it
    (its corpus, its encoders, its seed) are flags of `odqa demo` too."""
    preset: str = arg("demo", "demo (under 30 min on 2 CPU cores), full (the README's schedules, whole test sets), or "
                              "a TOML or JSON file of the recipe's settings (system/presets/*.toml are the two)")
    out: Path | None = path(None, "where the stages write (default: $ODQA_HOME/runs/demo, or demo-PRESET)",
                            writes="dir")
    plan: bool = arg(False, "print the stages, which are done, and the time estimate; run nothing")


@dataclass(kw_only=True)
class FetchArgs(Settings):
    """`odqa data fetch`."""
    force: bool = arg(False, "extract again even if already fetched")


@dataclass(kw_only=True)
class CorpusBuildArgs(Settings):
    """`odqa corpus build`."""
    input: list[str] | None = path(None, "input files: JSONL passages or documents, DPR's TSV, JSON, CSV, TSV or Parquet "
                                        "passages, plain or compressed, or a hub dataset hf:NAME[:CONFIG][@SPLIT] "
                                        "(default: the data pack's documents)")
    input_format: str = arg("auto", "input format (auto: from the file)",
                            choices=["auto", "dpr-tsv", "passages", "documents", "table"], aliases=["--format"])
    out: Path | None = path(None, "output directory (default: $ODQA_HOME/corpus/default)", writes="dir")
    max_words: int = arg(100, "passage length bound in words", range="positive")


@dataclass(kw_only=True)
class SuperviseArgs(Settings, HeldOut):
    """`odqa supervise`."""
    questions: list[str] = listed(["nq-dev", "tqa-dev"], f"question sets, each {QUESTIONS_HELP}", input=True)
    corpus: Path | None = path(None, CORPUS_HELP)
    out: Path | None = path(None, "output directory (default: CORPUS/supervision)", writes="dir")
    positives: int = arg(1, "examples per question: the best-ranked positives", range="positive")


@dataclass(kw_only=True)
class EvalRetrievalArgs(Settings):
    """`odqa eval-retrieval`."""
    runs: list[Path] = required("DPR-format retrieval files", positional=True)
    topk: list[int] = listed([1, 5, 20, 100], "k values", range="positive")
    no_answerable: bool = arg(False, "skip the answerable subset (no corpus pass)")
    recompute_has_answer: bool = arg(False, "compute each ctx's has_answer from its text, as DPR's and FiD's "
                                            "evaluation do, rather than take the file's flags (and say how many "
                                            "disagree); a file without flags, as FiD's are, is always computed")
    json: Path | None = arg(None, "also write the metrics to this JSON file", **FILE_OUT)
    corpus: Path | None = path(None, CORPUS_HELP)
