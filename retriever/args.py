"""The settings of the retriever: its models' configs (`PhraseModelConfig`, `DocEncoderConfig`,
`CrossEncoderConfig`, `BM25Params`) and its commands' (training: `PhraseTrainArgs`, `QueryTrainArgs`,
`DocTrainArgs`, ...; the index: `DumpArgs`, `BuildIndexArgs`, ...; the search's own are
`retriever/search_config.py`'s), as dataclasses whose fields carry their command-line help
(tevatron-style): each command makes one flag per field. A trainer holds its model's config whole
(`PhraseTrainArgs.model_config`). This module imports nothing heavy, so that building the CLI's parser
(and `odqa --help`) loads no torch.

Fields are made by `odqa.common.settings` (help in their metadata); the optimiser settings are
`OptimArgs`, inherited.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from odqa.common.io import InputError
from odqa.common.settings import (
    CORPUS_HELP,
    FILE_OUT,
    OUT,
    QUESTIONS_HELP,
    Batched,
    Fit,
    Limited,
    OptimArgs,
    Passages,
    Seeded,
    Settings,
    TrainExamples,
    ValidationExamples,
    arg,
    listed,
    override,
    path,
    required,
    section,
)
from odqa.retriever.search_config import PhraseSearchConfig, PrefilterConfig, RerankerConfig

DEFAULT_KEEP = 0.2   # the share of tokens `odqa build-index` and the demo index, by the phrase filter
BM25_GRID = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5)  # `odqa tune-lambda`'s rerank weights of the passage's BM25 score



# --- the models' configs, saved with each checkpoint --------------------------------------------
@dataclass(kw_only=True)
class QuestionTokens(Settings):
    max_question_tokens: int = arg(48, "question tokens the encoder reads", range="positive")


@dataclass(kw_only=True)
class PhraseTokens(QuestionTokens):
    """How the phrase model cuts its inputs, which its span teacher cuts alike."""
    max_span_len: int = arg(20, "L: longest phrase in tokens", range="positive")
    max_passage_tokens: int = arg(192, "passage tokens the encoder reads", range="positive")


PHRASE_HEADS = ("split", "linear", "full")


@dataclass(kw_only=True)
class PhraseModelConfig(PhraseTokens):
    """A phrase model's shape (its checkpoint's phrase_config.json)."""
    encoder: str | None = path(None, "AutoModel name or path the encoders start from (BERT family), or a phrase "
                                     "checkpoint to continue", required=True)
    head: str = arg("split", "start/end vectors: 'split' halves of the hidden state, two 'linear' heads, or one "
                             "'full' vector for both (DensePhrases' released models)")
    question_encoder: str = arg("dual", "'dual' LMs or one 'shared' LM with two heads")
    title_path: bool = arg(False, "prefix passages with 'title, section, subsection' (DHR), not the title alone")
    title_phrases: bool = arg(False, "the title's tokens are phrase candidates too, so a title can be the answer (a "
                                     "phrase never spans both; turns it on for a continued checkpoint as well)")

    def __post_init__(self):
        super().__post_init__()
        if self.head not in PHRASE_HEADS:
            raise InputError(f"--head must be one of {', '.join(PHRASE_HEADS)}, not {self.head!r}")
        if self.question_encoder not in ("dual", "shared"):
            raise InputError(f"--question-encoder must be 'dual' or 'shared', not {self.question_encoder!r}")


@dataclass(kw_only=True)
class DocEncoderConfig(QuestionTokens):
    """A document encoder's shape (its checkpoint's doc_encoder_config.json)."""
    encoder: str | None = path(None, "AutoModel name or path both LMs start from, or a document-encoder checkpoint "
                                     "to continue (round 2)", required=True)
    max_doc_tokens: int = arg(192, "document-summary tokens the encoder reads", range="positive")
    scale: float = arg(20.0, "softmax temperature on cosines (sentence-transformers' default)", range="positive")


@dataclass(kw_only=True)
class CrossEncoderInput(Settings):
    max_tokens: int = arg(128, "question and passage tokens together", range="positive")


@dataclass(kw_only=True)
class CrossEncoderConfig(CrossEncoderInput):
    """A passage reranker's shape (its checkpoint's cross_encoder.json)."""
    encoder: str | None = path(None, "AutoModel name or path the cross-encoder starts from (default: the data pack's "
                                     "MiniLM)", required=True)
    weight: float | None = arg(None, "its score's weight beside the search's in the final ranking (None: not tuned "
                                     "yet, 1)", tuned=True)


# k1 and b of published BM25 figures: pyserini's on DPR's Wikipedia (its DPR-reproduction tables)
BM25_PRESETS = {"pyserini": {"k1": 0.9, "b": 0.4}}


@dataclass(kw_only=True)
class BM25Params(Settings):
    """BM25's scoring and its index's tokens (a BM25 index is cached by these)."""
    k1: float = arg(1.5, "BM25 k1")
    b: float = arg(0.75, "BM25 b")
    bm25_preset: str = arg("none", "pyserini: k1 0.9 and b 0.4, as pyserini's published BM25 figures on DPR's "
                                   "Wikipedia use (compare with the literature under it)", choices=["none", *BM25_PRESETS])
    method: str = arg("lucene", "bm25s' scoring variant", flag="--bm25-method")
    stopwords: str = arg("en", "bm25s' stopword list")
    stemmer: str = arg("english", "PyStemmer's stemmer")

    def __post_init__(self):
        super().__post_init__()
        if self.bm25_preset in BM25_PRESETS:
            want, default = BM25_PRESETS[self.bm25_preset], {"k1": 1.5, "b": 0.75}
            given = {name: getattr(self, name) for name in want if getattr(self, name) != default[name]}
            if any(value != want[name] for name, value in given.items()):
                raise InputError(f"--bm25-preset {self.bm25_preset} sets " + " and ".join(f"--{n} {v:g}" for n, v in want.items())
                                 + ": give the preset or your own --k1 and --b, not both")
            self.k1, self.b = want["k1"], want["b"]

    def describe(self) -> str:
        return f"BM25 k1 {self.k1:g}, b {self.b:g}" + (f": {self.bm25_preset}'s" if self.bm25_preset in BM25_PRESETS else "")


# --- the commands -----------------------------------------------------------------------------------
SUPERVISION = "supervision examples from `odqa supervise`"


@dataclass(kw_only=True)
class PhraseTrainArgs(OptimArgs, TrainExamples, ValidationExamples):
    train_file: str | None = path(None, SUPERVISION, required=True)
    validation_file: str | None = path(None, "supervision examples to validate on", required=True)
    out_dir: str | None = path(None, "where checkpoint/, last/ and best/ go", required=True, **OUT)
    model_config: PhraseModelConfig = section(PhraseModelConfig)
    neg_coef: float = arg(1.0, "weight of the in-batch and pre-batch negatives' loss")
    filter_coef: float = arg(0.1, "weight of the filter head's loss")
    pre_batch: int = arg(2, "C: preceding batches whose gold vectors are negatives")
    pre_batch_warmup: int = arg(50, "steps before pre-batch negatives join")
    unified: bool = arg(False, "one softmax over in-passage, in-batch and pre-batch tokens")
    in_doc_negatives: str = arg("none", "none, doc or section: other passages of the question's document/section "
                                        "as negatives")
    in_doc_count: int = arg(1, "In-Doc negative passages per question")
    corpus: str | None = path(None, "the corpus of the supervision passages (for the options above and below)")
    hard_negatives: str | None = path(None, "round 2: the phrase index built with the round-1 checkpoint given as "
                                            "--encoder; each question's top passages there that hold no answer "
                                            "become negatives")
    hard_negative_count: int = arg(1, "hard negative passages per question (round 2)")
    teacher: str | None = path(None, "a span teacher (`odqa train-teacher` OUT/best) whose start/end distributions "
                                     "over each gold passage the phrase model learns to match (DensePhrases' "
                                     "distillation)")
    distill_coef: float = arg(1.0, "with --teacher: weight of the KL term, per side")


@dataclass(kw_only=True)
class TeacherTrainArgs(OptimArgs, TrainExamples, ValidationExamples):
    # From the MiniLM one pass reached gold-passage EM 25 and a second 29 (docs/notes/retrieval.md).
    epochs: int = arg(2, "passes over the training examples")
    lr: float = arg(5e-5, "peak learning rate (AdamW, linear warm-up and decay)", range="positive")
    train_file: str | None = path(None, SUPERVISION, required=True)
    validation_file: str | None = path(None, "supervision examples to validate on", required=True)
    out_dir: str | None = path(None, "where checkpoint/, last/ and best/ go", required=True, **OUT)
    encoder: str | None = path(None, "AutoModel name or path (the phrase model's encoder family)", required=True)
    model_config: PhraseTokens = section(PhraseTokens, "the phrase model's, so the teacher reads passages as it cuts them")


@dataclass(kw_only=True)
class QueryTrainArgs(OptimArgs, TrainExamples):
    # the query side's own defaults for the loop settings: no warm-up, a low rate
    epochs: int = arg(2, "passes over the questions (candidates retrieved anew each time)")
    batch_size: int = arg(16, "questions per step (per process)")
    lr: float = arg(3e-5, "peak learning rate (AdamW, linear decay)", range="positive")
    warmup_ratio: float = arg(0.0, "share of the steps spent warming the rate up")
    max_train_examples: int | None = override(TrainExamples, "max_train_examples", None,
                                              help="use only the first N questions", aliases=["--max-questions"])
    model: str | None = path(None, "phrase model checkpoint the index was built with", required=True)
    index: str | None = path(None, "phrase index directory", required=True)
    corpus: str | None = path(None, "the corpus the index was built from", required=True)
    out_dir: str | None = path(None, "where checkpoint/ and last/ (the query-tuned model) go", required=True, **OUT)
    questions: str = path("nq-dev", f"training question set: {QUESTIONS_HELP}")
    label: str = arg("phrase", "phrase, passage or document: what makes a retrieved phrase a positive")
    top_k: int = arg(100, "phrases retrieved per question")
    passage_weight: float = arg(0.0, "weight of a second term whose positives are the phrases of passages that hold an "
                                     "answer (the 'Too' paper's passage loss), added to --label's term; 0: off",
                                range="non_negative")
    phrase: PhraseSearchConfig = section(PhraseSearchConfig, max_answer_tokens=None)   # phrases up to the index's L
    prefilter: PrefilterConfig = section(PrefilterConfig)
    doc_index: str | None = path(None, "a document index (`odqa build-doc-index`): retrieve each question's phrases "
                                       "behind this pre-filter, as the pipeline searches")
    doc_model: str | None = path(None, "the document encoder of --doc-index")


@dataclass(kw_only=True)
class NegativeCount:
    negatives_per_question: int = arg(1, "hard negatives per question", range="positive")


@dataclass(kw_only=True)
class DocTrainArgs(OptimArgs, TrainExamples, ValidationExamples, NegativeCount):
    # the document encoder's own defaults for the optimiser settings
    epochs: int = arg(1, "passes over the training examples")
    batch_size: int = arg(32, "questions per step (per process)")
    lr: float = arg(2e-5, "peak learning rate (AdamW, linear warm-up and decay)", range="positive")
    train_file: str | None = path(None, SUPERVISION, required=True)
    validation_file: str | None = path(None, "supervision examples to validate on", required=True)
    corpus: str | None = path(None, "`odqa corpus build` output", required=True)
    out_dir: str | None = path(None, "where checkpoint/, last/ and best/ go", required=True, **OUT)
    model_config: DocEncoderConfig = section(DocEncoderConfig)
    negatives: str = arg("abstract", "abstract (BM25 over abstracts), model (mined with --encoder: round 2) or none")
    negatives_per_question: int = override(NegativeCount, "negatives_per_question", 1,
                                           help="hard negative documents per question")
    validation_docs: int = arg(0, "0: validate over every document; N: the positives and N random others")


@dataclass(kw_only=True)
class RerankerTrainArgs(OptimArgs, TrainExamples, ValidationExamples, NegativeCount, RerankerConfig, CrossEncoderInput):
    # the reranker's own defaults for the optimiser settings
    epochs: int = arg(1, "passes over the training questions")
    batch_size: int = arg(8, "questions per micro-batch (each with one positive and --negatives-per-question "
                             "passages)")
    lr: float = arg(1e-4, "peak learning rate of the pretrained encoder (AdamW, linear warm-up and decay)",
                    range="positive")
    head_lr: float = arg(1e-3, "peak learning rate of the new scoring head", range="positive")
    train_file: str | None = path(None, "retrieval file of the training questions (`odqa retrieve ... --questions "
                                        "SUPERVISION/train.jsonl --k 20`), whose has_answer marks the positives",
                                  required=True)
    validation_file: str | None = path(None, "retrieval file of the validation questions, reranked to validate",
                                       required=True)
    out_dir: str | None = path(None, "where checkpoint/, last/ and best/ go", required=True, **OUT)
    encoder: str | None = path(None, "AutoModel name or path the cross-encoder starts from (default: the data pack's "
                                     "MiniLM)", required=True)
    rerank_depth: int = override(RerankerConfig, "rerank_depth", 20, help="passages of each question read: the "
                                 "search's top N, the ones the pipeline reranks", aliases=["--depth"])
    negatives_per_question: int = override(NegativeCount, "negatives_per_question", 3,
                                           help="passages without an answer beside each positive",
                                           aliases=["--negatives"])
    record: bool = arg(True, "make OUT/best the default pipeline's reranker, which `retrieve --retriever phrase`, "
                             "`ask`, `serve` and `run` then use unless --no-reranker")


@dataclass(kw_only=True)
class RetrieveArgs(Settings, Passages, Limited, Batched):
    """`odqa retrieve`'s own settings, beside a phrase search's parts and settings."""
    retriever: str = arg("bm25", "bm25; dense: one vector per passage (--model, default the MiniLM, mean-pooled; "
                                 "or DPR's pair with --passage-model); phrase: passages ranked by their best phrase",
                         choices=["bm25", "dense", "phrase"])
    passage_model: str | None = path(None, "with --retriever dense: DPR's context encoder (a DPRContextEncoder "
                                           "checkpoint or hub name), --model then its question encoder: [CLS] vectors "
                                           "scored by inner product, as DPR scores them")
    questions: str = required(f"question set: {QUESTIONS_HELP}")
    k: int = override(Passages, "k", 100)
    out: Path = required("output file", **FILE_OUT)
    format: str = arg("dpr", "dpr: DPR's JSON, with passages and answers, which the reader and eval-retrieval "
                             "read; trec: a TREC run file (QID Q0 DOCID RANK SCORE TAG), for trec_eval and "
                             "pyserini's tools", choices=["dpr", "trec"])
    batch_size: int = override(Batched, "batch_size", 256, help="questions per search call")
    bm25: BM25Params = section(BM25Params, "with --retriever bm25")


@dataclass(kw_only=True)
class DumpArgs(Settings, Batched):
    """`odqa dump-phrases`."""
    model: Path = required("phrase model checkpoint (train-phrase OUT/best)")
    out: Path = required("dump directory (shards go inside)", writes="dir")
    shard: str | None = arg(None, "k/n: this process's slice of the corpus, for processes a scheduler starts one by "
                                  "one (Slurm arrays); under torchrun or accelerate launch each rank takes its own "
                                  "slice (default: 1/1, or the rank's)")
    threshold: float | None = arg(None, "filter logit a token needs (default: keep all)")
    batch_size: int = override(Batched, "batch_size", 32, help="passages per forward pass")
    chunk_passages: int = arg(1024, "passages per chunk file", range="positive")
    corpus: Path | None = path(None, CORPUS_HELP)


@dataclass(kw_only=True)
class IndexFactory:
    factory: str | None = arg("Flat", "faiss index_factory string")


@dataclass(kw_only=True)
class BuildIndexArgs(Settings, IndexFactory, Seeded):
    """`odqa build-index`."""
    dump: Path | None = path(None, "dump directory from `odqa dump-phrases`", required=True)
    out: Path | None = path(None, "index directory", required=True, writes="dir")
    factory: str | None = override(IndexFactory, "factory", None, help="faiss index_factory string: Flat, IVF4096,SQ4, "
                                   "IVF256,PQ16 ... (default: OPQ + IVF-PQ sized to the index, e.g. OPQ16,IVF256,PQ16 "
                                   "for 200k 192-d vectors)")
    keep: float = arg(DEFAULT_KEEP, "share of the dump's tokens to index, those the phrase filter (`odqa "
                                    "train-filter`) scores highest; 1: every token, no filter", range="positive")
    filter: Path | None = path(None, "phrase filter for --keep (default: DUMP/filter, from `odqa train-filter`)")
    model_filter: bool = arg(False, "for --keep, rank tokens by the phrase model's own filter head, whose logits "
                                    "the dump holds (DensePhrases' filter), not by a fitted filter")
    train_size: int = arg(200_000, "vectors sampled to train IVF/PQ", range="positive")
    seed: int = override(Seeded, "seed", 0, help="seed of that sample")
    corpus: Path | None = path(None, CORPUS_HELP)


@dataclass(kw_only=True)
class FilterArgs(Settings, Fit):
    """`odqa train-filter`: an MLP over each dumped token's vectors, fitted by its own small loop."""
    dump: Path | None = path(None, "dump directory from `odqa dump-phrases`", required=True)
    train_file: Path | None = path(None, "supervision examples (default: the default supervision's train.jsonl)")
    validation_file: Path | None = path(None, "supervision examples for the calibration table (default: the default "
                                              "supervision's validation.jsonl)")
    hidden: int = arg(256, "MLP hidden size", range="positive")
    epochs: int = override(Fit, "epochs", 8, help="passes over the training tokens")
    batch_size: int = override(Fit, "batch_size", 4096, help="training tokens per step")
    lr: float = override(Fit, "lr", 1e-3, help="learning rate (Adam)")
    report_to: str = override(Fit, "report_to", "none", help="also log the loss every --log-steps and the calibration "
                              "table's answer recall to: tensorboard, wandb or mlflow (accelerate's trackers; local "
                              "files under OUT/runs), all (those installed), or none")
    out: Path | None = path(None, "filter directory (default: DUMP/filter)", writes="dir")
    corpus: Path | None = path(None, CORPUS_HELP)


@dataclass(kw_only=True)
class DocIndexArgs(Settings, IndexFactory):
    """`odqa build-doc-index`."""
    model: Path = required("document encoder checkpoint (train-doc OUT/best)")
    out: Path = required("index directory", writes="dir")
    corpus: Path | None = path(None, CORPUS_HELP)


@dataclass(kw_only=True)
class TuneLambdaArgs(Settings, Limited):
    """`odqa tune-lambda`'s own settings, beside a phrase search's parts and settings."""
    questions: Path | None = path(None, "validation questions with answers (default: the supervision validation split)")
    limit: int | None = override(Limited, "limit", 500, help="first N questions")
    metric_k: int = arg(20, "k of the Top-k to maximise", range="positive")
    bm25_grid: list[float] = listed(list(BM25_GRID), "BM25 weights tried; 0 alone tunes lambda alone")


@dataclass(kw_only=True)
class MemoryArgs(Settings):
    """`odqa build-memory`."""
    model: Path | None = path(None, "phrase model checkpoint whose question encoders search (default: the default "
                                    "pipeline's)")
    questions: list[str] = listed(["nq-dev", "tqa-dev"], f"question sets with answers (never a set you evaluate on), "
                                                         f"each {QUESTIONS_HELP}", input=True)
    out: Path | None = path(None, "output directory (default $ODQA_HOME/memory)", writes="dir")


@dataclass(kw_only=True)
class VerifyArgs(Settings):
    """`odqa verify`."""
    path: Path = required("an index directory (holding manifest.json), or a checkpoint odqa wrote (holding "
                          "checksums.json): every file's bytes against the sha256 recorded there", positional=True)
