"""The settings of the retriever's commands, as dataclasses whose fields carry their command-line help
(tevatron-style): each command makes one flag per field (search: `SearchConfig`; training:
`PhraseTrainArgs`, `QueryTrainArgs`, `DocTrainArgs`, ...; the index: `DumpArgs`, `BuildIndexArgs`, ...). This
module imports nothing heavy, so that building the CLI's parser (and `odqa --help`) loads no torch.

Fields are made by `odqa.common.settings` (help in their metadata); the optimiser settings are
`OptimArgs`, embedded.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from odqa.common.settings import (
    CORPUS_HELP,
    FILE_OUT,
    OUT,
    QUESTIONS_HELP,
    OptimArgs,
    Settings,
    arg,
    check_ranges,
    listed,
    required,
)
from odqa.common.tracking import REPORT_TO

DEFAULT_KEEP = 0.2   # the share of tokens `odqa build-index` and the demo index, by the phrase filter
# The pipeline's longest answer phrase, in word pieces. The index keeps L = 20 (DensePhrases'), but
# NQ-open keeps answers of at most 5 words, and a question-tuned model's wrong top phrase is most often
# too long: on the validation questions this cap raises the top phrase's EM by about a point and keeps
# 99% of the training answers (docs/notes/retrieval.md, "The answer-length cap").
MAX_ANSWER_TOKENS = 6
# The extractive answer's aggregation (retriever/answer_aggregation.py): the top ANSWER_DEPTH passages
# vote for their phrases at temperature ANSWER_TEMPERATURE, in the ranking's score units. Picked on the
# validation questions of two full chains (docs/notes/retrieval.md, "The extractive answer by aggregation").
ANSWER_DEPTH = 25
ANSWER_TEMPERATURE = 1.0
# The answer memory's kNN prior (retriever/answer_memory.py): a question's MEMORY_NEIGHBOURS nearest
# training questions at cosine >= MEMORY_THRESHOLD each add MEMORY_WEIGHT x cosine to their answers'
# votes. Picked on the validation questions of the full chain (docs/notes/retrieval.md, "The answer memory").
MEMORY_THRESHOLD = 0.9
MEMORY_WEIGHT = 2.0
MEMORY_NEIGHBOURS = 3
# The version of the answer filter's rules (`retriever.searcher.can_answer`), kept in the keys of the
# files `odqa run` caches, so that files made under older rules are made again. 2: no question word at
# a phrase's edges (2026-11-28); 1: whole words and brackets, not an echo.
ANSWER_FILTER_RULES = 2
BM25_GRID = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5)  # `odqa tune-lambda`'s rerank weights of the passage's BM25 score


@dataclass(kw_only=True)
class SearchConfig:
    """How the pipeline searches its phrase index: the one home of each search setting, its default and
    its help. `Searcher` holds one; the flags of `retrieve`, `ask`, `serve` and `run` are made from it,
    and `Pipeline.ask` / `odqa.load` take its fields as overrides."""
    nprobe: int = arg(64, "IVF lists probed per search", range="positive")
    top_docs: int = arg(100, "K: documents kept by the pre-filter", range="positive")
    lam: float | None = arg(None, "rerank weight of the document score (default: the value tune-lambda stored with "
                                  "the document index, else 0)")
    bm25_weight: float | None = arg(None, "rerank weight of the passage's BM25 score (default: the value tune-lambda "
                                          "stored with the document index, else 0)")
    rerank_depth: int = arg(20, "passages the reranker reads: the top max(k, N)", range="positive")
    max_answer_tokens: int | None = arg(MAX_ANSWER_TOKENS, "longest phrase returned, in word pieces, at most the "
                                                           "index's L (None, in Python: L)", range="positive")
    answer_filter: bool = arg(True, "each passage's phrase is its best span that can answer: whole words, no word "
                                    "of the question at its edges")
    answer_depth: int = arg(ANSWER_DEPTH, "the extractive answer is the phrase string the top N passages vote for "
                                          "most, each weighted by exp((score - best score) / --answer-temperature); "
                                          "1: the first passage's phrase", range="positive")
    answer_temperature: float = arg(ANSWER_TEMPERATURE, "temperature of that vote, in the ranking's score units",
                                    range="positive")
    memory_threshold: float = arg(MEMORY_THRESHOLD, "cosine a memory question needs to lend its answers")
    memory_weight: float = arg(MEMORY_WEIGHT, "votes a memory question lends, times its cosine", range="non_negative")
    memory_neighbours: int = arg(MEMORY_NEIGHBOURS, "nearest memory questions consulted", range="positive")

    @classmethod
    def of(cls, settings) -> "SearchConfig":
        """The search settings of an object that holds them among others (`RunArgs`, parsed flags)."""
        return cls(**{f.name: getattr(settings, f.name) for f in dataclasses.fields(cls)})

    def __post_init__(self):
        check_ranges(self)


@dataclass(kw_only=True)
class PhraseTrainArgs(OptimArgs):
    train_file: str = required("supervision examples from `odqa supervise`")
    validation_file: str = required("supervision examples to validate on")
    out_dir: str = required("where checkpoint/, last/ and best/ go", **OUT)
    encoder: str = required("AutoModel name or path, or a phrase checkpoint to continue")
    head: str = arg("split", "start/end vectors: 'split' halves of the hidden state or two 'linear' heads")
    question_encoder: str = arg("dual", "'dual' LMs or one 'shared' LM with two heads")
    max_span_len: int = arg(20, "L: longest phrase in tokens")
    max_passage_tokens: int = arg(192, "passage tokens the encoder reads")
    max_question_tokens: int = arg(48, "question tokens the encoder reads")
    neg_coef: float = arg(1.0, "weight of the in-batch and pre-batch negatives' loss")
    filter_coef: float = arg(0.1, "weight of the filter head's loss")
    pre_batch: int = arg(2, "C: preceding batches whose gold vectors are negatives")
    pre_batch_warmup: int = arg(50, "steps before pre-batch negatives join")
    unified: bool = arg(False, "one softmax over in-passage, in-batch and pre-batch tokens")
    title_path: bool = arg(False, "prefix passages with 'title, section, subsection' (DHR)")
    title_phrases: bool = arg(False, "the title's tokens are phrase candidates too, so a title can be the answer "
                                     "(turns it on for a continued checkpoint as well)")
    in_doc_negatives: str = arg("none", "none, doc or section: other passages of the question's document/section "
                                        "as negatives")
    in_doc_count: int = arg(1, "In-Doc negative passages per question")
    corpus: str | None = arg(None, "the corpus of the supervision passages (for the options above and below)")
    hard_negatives: str | None = arg(None, "round 2: the phrase index built with the round-1 checkpoint given as "
                                           "--encoder; each question's top passages there that hold no answer "
                                           "become negatives")
    hard_negative_count: int = arg(1, "hard negative passages per question (round 2)")
    teacher: str | None = arg(None, "a span teacher (`odqa train-teacher` OUT/best) whose start/end distributions "
                                    "over each gold passage the phrase model learns to match (DensePhrases' "
                                    "distillation)")
    distill_coef: float = arg(1.0, "with --teacher: weight of the KL term, per side")
    max_train_examples: int | None = arg(None, "use only the first N training examples")
    max_validation_examples: int | None = arg(500, "validate on the first N examples")


@dataclass(kw_only=True)
class TeacherTrainArgs(OptimArgs):
    # From the MiniLM one pass reached gold-passage EM 25 and a second 29 (docs/notes/retrieval.md).
    epochs: int = arg(2, "passes over the training examples")
    lr: float = arg(5e-5, "peak learning rate (AdamW, linear warm-up and decay)", range="positive")
    train_file: str = required("supervision examples from `odqa supervise`")
    validation_file: str = required("supervision examples to validate on")
    out_dir: str = required("where checkpoint/, last/ and best/ go", **OUT)
    encoder: str = required("AutoModel name or path (the phrase model's encoder family)")
    max_span_len: int = arg(20, "longest span in tokens, as the phrase model's L")
    max_passage_tokens: int = arg(192, "passage tokens read, as the phrase model's")
    max_question_tokens: int = arg(48, "question tokens read, as the phrase model's")
    max_train_examples: int | None = arg(None, "use only the first N training examples")
    max_validation_examples: int | None = arg(500, "validate on the first N examples")


@dataclass(kw_only=True)
class QueryTrainArgs(OptimArgs):
    # the query side's own defaults for the loop settings: no warm-up, a low rate
    epochs: int = arg(2, "passes over the questions (candidates retrieved anew each time)")
    batch_size: int = arg(16, "questions per step (per process)")
    lr: float = arg(3e-5, "peak learning rate (AdamW, linear decay)", range="positive")
    warmup_ratio: float = arg(0.0, "share of the steps spent warming the rate up")
    model: str = required("phrase model checkpoint the index was built with")
    index: str = required("phrase index directory")
    corpus: str = required("the corpus the index was built from")
    out_dir: str = required("where checkpoint/ and last/ (the query-tuned model) go", **OUT)
    questions: str = arg("nq-dev", f"training question set: {QUESTIONS_HELP}")
    label: str = arg("phrase", "phrase, passage or document: what makes a retrieved phrase a positive")
    top_k: int = arg(100, "phrases retrieved per question")
    passage_weight: float = arg(0.0, "weight of a second term whose positives are the phrases of passages that hold an "
                                     "answer (the 'Too' paper's passage loss), added to --label's term; 0: off",
                                     range="non_negative")
    max_answer_tokens: int | None = arg(None, "longest phrase retrieved, in tokens (default: the index's L)")
    doc_index: str | None = arg(None, "a document index (`odqa build-doc-index`): retrieve each question's phrases "
                                      "behind this pre-filter, as the pipeline searches")
    doc_model: str | None = arg(None, "the document encoder of --doc-index")
    top_docs: int = arg(100, "with --doc-index: documents kept by the pre-filter")
    max_questions: int | None = arg(None, "use only the first N questions")



@dataclass(kw_only=True)
class DocTrainArgs(OptimArgs):
    # the document encoder's own defaults for the optimiser settings
    epochs: int = arg(1, "passes over the training examples")
    batch_size: int = arg(32, "questions per step (per process)")
    lr: float = arg(2e-5, "peak learning rate (AdamW, linear warm-up and decay)", range="positive")
    train_file: str = required("supervision examples from `odqa supervise`")
    validation_file: str = required("supervision examples to validate on")
    corpus: str = required("`odqa corpus build` output")
    out_dir: str = required("where checkpoint/, last/ and best/ go", **OUT)
    encoder: str = required("AutoModel name or path, or a document-encoder checkpoint to continue (round 2)")
    negatives: str = arg("abstract", "abstract (BM25 over abstracts), model (mined with --encoder: round 2) or none")
    negatives_per_question: int = arg(1, "hard negative documents per question", range="positive")
    max_doc_tokens: int = arg(192, "document-summary tokens the encoder reads")
    max_question_tokens: int = arg(48, "question tokens the encoder reads")
    max_train_examples: int | None = arg(None, "use only the first N training examples")
    max_validation_examples: int | None = arg(500, "validate on the first N examples")
    validation_docs: int = arg(0, "0: validate over every document; N: the positives and N random others")


@dataclass(kw_only=True)
class RerankerTrainArgs(OptimArgs):
    # the reranker's own defaults for the optimiser settings
    epochs: int = arg(1, "passes over the training questions")
    batch_size: int = arg(8, "questions per micro-batch (each with one positive and --negatives passages)")
    lr: float = arg(1e-4, "peak learning rate of the pretrained encoder (AdamW, linear warm-up and decay)",
                    range="positive")
    head_lr: float = arg(1e-3, "peak learning rate of the new scoring head", range="positive")
    train_file: str = required("retrieval file of the training questions (`odqa retrieve ... --questions "
                               "SUPERVISION/train.jsonl --k 20`), whose has_answer marks the positives")
    validation_file: str = required("retrieval file of the validation questions, reranked to validate")
    out_dir: str = required("where checkpoint/, last/ and best/ go", **OUT)
    encoder: str = required("AutoModel name or path the cross-encoder starts from (default: the data pack's MiniLM)")
    depth: int = arg(20, "passages of each question read: the search's top N, the ones the pipeline reranks")
    negatives: int = arg(3, "passages without an answer beside each positive", range="positive")
    max_tokens: int = arg(128, "question and passage tokens together")
    max_train_examples: int | None = arg(None, "use only the first N training questions")
    max_validation_examples: int | None = arg(500, "validate on the first N questions")
    record: bool = arg(True, "make OUT/best the default pipeline's reranker, which `retrieve --retriever phrase`, "
                             "`ask`, `serve` and `run` then use unless --no-reranker")


@dataclass(kw_only=True)
class RetrieveArgs(Settings):
    """`odqa retrieve`'s own settings, beside a phrase search's parts and settings."""
    retriever: str = arg("bm25", "bm25; dense: one vector per passage (--model, default the MiniLM, mean-pooled; "
                                 "or DPR's pair with --passage-model); phrase: passages ranked by their best phrase",
                         choices=["bm25", "dense", "phrase"])
    passage_model: str | None = arg(None, "with --retriever dense: DPR's context encoder (a DPRContextEncoder "
                                          "checkpoint or hub name), --model then its question encoder: [CLS] vectors "
                                          "scored by inner product, as DPR scores them")
    questions: str = required(f"question set: {QUESTIONS_HELP}")
    k: int = arg(100, "passages per question", range="positive")
    out: Path = required("output file", **FILE_OUT)
    format: str = arg("dpr", "dpr: DPR's JSON, with passages and answers, which the reader and eval-retrieval "
                             "read; trec: a TREC run file (QID Q0 DOCID RANK SCORE TAG), for trec_eval and "
                             "pyserini's tools", choices=["dpr", "trec"])
    limit: int | None = arg(None, "only the first N questions", range="positive")
    batch_size: int = arg(256, "questions per search call", range="positive")
    k1: float = arg(1.5, "BM25 k1")
    b: float = arg(0.75, "BM25 b")


@dataclass(kw_only=True)
class DumpArgs(Settings):
    """`odqa dump-phrases`."""
    model: Path = required("phrase model checkpoint (train-phrase OUT/best)")
    out: Path = required("dump directory (shards go inside)", writes="dir")
    shard: str | None = arg(None, "k/n: this process's slice of the corpus, for processes a scheduler starts one by "
                                  "one (Slurm arrays); under torchrun or accelerate launch each rank takes its own "
                                  "slice (default: 1/1, or the rank's)")
    threshold: float | None = arg(None, "filter logit a token needs (default: keep all)")
    batch_size: int = arg(32, "passages per forward pass", range="positive")
    chunk_passages: int = arg(1024, "passages per chunk file", range="positive")
    corpus: Path | None = arg(None, CORPUS_HELP)


@dataclass(kw_only=True)
class BuildIndexArgs(Settings):
    """`odqa build-index`."""
    dump: Path = required("dump directory from `odqa dump-phrases`")
    out: Path = required("index directory", writes="dir")
    factory: str | None = arg(None, "faiss index_factory string: Flat, IVF4096,SQ4, IVF256,PQ16 ... (default: IVF-PQ "
                                    "sized to the index, e.g. IVF256,PQ16 for 200k 192-d vectors)")
    keep: float = arg(DEFAULT_KEEP, "share of the dump's tokens to index, those the phrase filter (`odqa "
                                    "train-filter`) scores highest; 1: every token, no filter", range="positive")
    filter: Path | None = arg(None, "phrase filter for --keep (default: DUMP/filter, from `odqa train-filter`)")
    model_filter: bool = arg(False, "for --keep, rank tokens by the phrase model's own filter head, whose logits "
                                    "the dump holds (DensePhrases' filter), not by a fitted filter")
    train_size: int = arg(200_000, "vectors sampled to train IVF/PQ", range="positive")
    corpus: Path | None = arg(None, CORPUS_HELP)


@dataclass(kw_only=True)
class FilterArgs(Settings):
    """`odqa train-filter`."""
    dump: Path = required("dump directory from `odqa dump-phrases`")
    train_file: Path | None = arg(None, "supervision examples (default: the default supervision's train.jsonl)")
    validation_file: Path | None = arg(None, "supervision examples for the calibration table (default: the default "
                                             "supervision's validation.jsonl)")
    hidden: int = arg(256, "MLP hidden size", range="positive")
    epochs: int = arg(8, "passes over the training tokens", range="positive")
    report_to: str = arg("none", "also log the loss every 10 steps and the calibration table's answer recall to: "
                                 "tensorboard, wandb or mlflow (accelerate's trackers; local files under OUT/runs), "
                                 "all (those installed), or none", choices=list(REPORT_TO))
    out: Path | None = arg(None, "filter directory (default: DUMP/filter)", writes="dir")
    corpus: Path | None = arg(None, CORPUS_HELP)


@dataclass(kw_only=True)
class DocIndexArgs(Settings):
    """`odqa build-doc-index`."""
    model: Path = required("document encoder checkpoint (train-doc OUT/best)")
    out: Path = required("index directory", writes="dir")
    factory: str = arg("Flat", "faiss index_factory string")
    corpus: Path | None = arg(None, CORPUS_HELP)


@dataclass(kw_only=True)
class TuneLambdaArgs(Settings):
    """`odqa tune-lambda`'s own settings, beside a phrase search's parts and settings."""
    questions: Path | None = arg(None, "validation questions with answers (default: the supervision validation split)")
    limit: int = arg(500, "first N questions", range="positive")
    metric_k: int = arg(20, "k of the Top-k to maximise", range="positive")
    bm25_grid: list[float] = listed(list(BM25_GRID), "BM25 weights tried; 0 alone tunes lambda alone")


@dataclass(kw_only=True)
class MemoryArgs(Settings):
    """`odqa build-memory`."""
    model: Path | None = arg(None, "phrase model checkpoint whose question encoders search (default: the default "
                                   "pipeline's)")
    questions: list[str] = listed(["nq-dev", "tqa-dev"], f"question sets with answers (never a set you evaluate on), "
                                                         f"each {QUESTIONS_HELP}")
    out: Path | None = arg(None, "output directory (default $ODQA_HOME/memory)", writes="dir")


@dataclass(kw_only=True)
class VerifyArgs(Settings):
    """`odqa verify`."""
    path: Path = required("an index directory (holding manifest.json), or a checkpoint odqa wrote (holding "
                          "checksums.json): every file's bytes against the sha256 recorded there", positional=True)
