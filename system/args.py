"""The settings of the system's and the data's commands (`odqa run`, `ask`, `serve`, `demo`, `data fetch`,
`corpus build`, `supervise`, `eval-retrieval`) and a pipeline's parts, as dataclasses whose fields carry
their command-line help. Nothing heavy is imported here, so that building the CLI's parser (and
`odqa --help`) loads no torch."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from odqa.common.settings import CORPUS_HELP, OUT, QUESTIONS_HELP, Settings, arg, listed, required
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
    questions: list[str] = listed(["nq-test", "tqa-test"], f"question sets, each {QUESTIONS_HELP}")
    k: list[int] = listed([5, 10, 25, 50], "passages read by FiD")
    limit: int | None = arg(None, "first N questions of each set")
    baselines: list[str] = listed(["bm25", "dense"], "other retrievers on the Top-k plot: bm25, dense, or none")
    dense_encoder: str | None = arg(None, "encoder of the dense baseline (default: the data pack's MiniLM); with "
                                          "--dense-passage-encoder, DPR's question encoder")
    dense_passage_encoder: str | None = arg(None, "DPR's context encoder for the dense baseline, which is then DPR "
                                                  "([CLS] vectors, inner product)")
    with_memory: bool = arg(False, "also the extractive answer with the default pipeline's answer memory, in a "
                                   "column of its own (--memory PATH names one); the extractive EM column is always "
                                   "the phrase model's own answer, as the papers report it")

    def __post_init__(self):   # both bases' checks: the MRO would run SearchConfig's alone
        SearchConfig.__post_init__(self)
        ReaderSettings.__post_init__(self)


@dataclass(kw_only=True)
class AskArgs(Settings):
    """`odqa ask`'s own settings, beside a pipeline's parts and settings."""
    question: str = required("the question", positional=True, range="text")
    k: int = arg(10, "passages retrieved and read", range="positive")


@dataclass(kw_only=True)
class ServeConfig(Settings):
    """`odqa serve`'s own settings: the server's address, batching, limits and processes."""
    host: str = arg("127.0.0.1", "address to bind (127.0.0.1: this machine only)")
    port: int = arg(8000, "port", range="port")
    max_batch: int | None = arg(None, "requests answered together at most (default: 1 on a CPU, where a batch saves "
                                      "nothing; 16 on a GPU)", range="positive")
    max_wait_ms: float = arg(10.0, "wait for more requests after the first", range="non_negative")
    max_queue: int = arg(64, "requests that may wait; more are answered 429 with Retry-After", range="positive")
    max_queue_s: float | None = arg(None, "refuse (429) a request with more than this many seconds of work ahead of "
                                          "it, as measured (0: only when idle; negative: no such limit; default: 0 "
                                          "on a CPU, 1 on a GPU)")
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
    """`odqa demo`: which recipe, on which corpus, into which directory; the recipe's own settings are
    `odqa.system.recipe_config.RecipeConfig`'s, set by a preset file."""
    preset: str = arg("demo", "demo (under 30 min on 2 CPU cores), full (the README's schedules, whole test sets), or "
                              "a TOML or JSON file of the recipe's settings (system/presets/*.toml are the two)")
    documents: str | None = arg(None, "run the recipe on a corpus of your own: any `odqa corpus build` input (DPR's "
                                      "TSV, passages or documents JSONL, compressed or not), built into --corpus "
                                      "(default OUT/corpus)", metavar="FILE")
    corpus: str | None = arg(None, "where the corpus is built (default: the default corpus, or OUT/corpus with "
                                   "--documents)", metavar="DIR")
    out: Path | None = arg(None, "where the stages write (default: $ODQA_HOME/runs/demo, or demo-PRESET)", writes="dir")
    plan: bool = arg(False, "print the stages, which are done, and the time estimate; run nothing")
    encoder: str | None = arg(None, "BERT-family checkpoint the retriever encoders start from (default: the data "
                                    "pack's MiniLM)")
    reader_model: str | None = arg(None, "a reader checkpoint to train from, e.g. t5-base or one `odqa reader init` "
                                         "wrote (default: a bert2bert reader warm-started from the encoder, `odqa "
                                         "reader init`)")
    reranker: bool | None = arg(None, "also train a cross-encoder passage reranker (a stage before `run`; about half "
                                      "an hour more on 2 cores) and read through it (default: off in both presets)")
    seed: int | None = arg(None, "added to every seed of the chain, to measure how far another draw moves the "
                                 "results; use with --out, or it replaces the preset's default run (default 0: the "
                                 "guides' runs)")


@dataclass(kw_only=True)
class FetchArgs(Settings):
    """`odqa data fetch`."""
    force: bool = arg(False, "extract again even if already fetched")


@dataclass(kw_only=True)
class CorpusBuildArgs(Settings):
    """`odqa corpus build`."""
    input: list[str] | None = arg(None, "input files: JSONL passages or documents, DPR's TSV, JSON, CSV, TSV or Parquet "
                                        "passages, plain or compressed, or a hub dataset hf:NAME[:CONFIG][@SPLIT] "
                                        "(default: the data pack's documents)")
    format: str = arg("auto", "input format (auto: from the file)",
                      choices=["auto", "dpr-tsv", "passages", "documents", "table"])
    out: Path | None = arg(None, "output directory (default: $ODQA_HOME/corpus/default)", writes="dir")
    max_words: int = arg(100, "passage length bound in words", range="positive")


@dataclass(kw_only=True)
class SuperviseArgs(Settings):
    """`odqa supervise`."""
    questions: list[str] = listed(["nq-dev", "tqa-dev"], f"question sets, each {QUESTIONS_HELP}")
    corpus: Path | None = arg(None, CORPUS_HELP)
    out: Path | None = arg(None, "output directory (default: CORPUS/supervision)", writes="dir")
    positives: int = arg(1, "examples per question: the best-ranked positives", range="positive")
    validation_percent: float = arg(10.0, "share of questions for validation", range="percent")


@dataclass(kw_only=True)
class EvalRetrievalArgs(Settings):
    """`odqa eval-retrieval`."""
    runs: list[Path] = required("DPR-format retrieval files", positional=True)
    topk: list[int] = listed([1, 5, 20, 100], "k values", range="positive")
    no_answerable: bool = arg(False, "skip the answerable subset (no corpus pass)")
    json: Path | None = arg(None, "also write the metrics to this JSON file")
    corpus: Path | None = arg(None, CORPUS_HELP)
