"""The settings of the reader: how it reads (`ReaderSettings`, which `read`, `ask`, `serve` and `run`
share and the trainer validates with) and its jobs', as dataclasses whose fields carry their
command-line help: one flag per field in `odqa read`, `pretrain-reader`, `train-reader`, `reader init`
and `reader cloze`. Nothing heavy is imported here, so that building the CLI's parser (and `odqa
--help`) loads no torch. Fields are made by `odqa.common.settings`; the optimiser settings are its
`OptimArgs`, inherited."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from odqa.common.io import InputError
from odqa.common.settings import (
    CORPUS_HELP,
    FILE_OUT,
    OUT,
    Batched,
    HeldOut,
    Limited,
    OptimArgs,
    Passages,
    Seeded,
    Settings,
    ValidationExamples,
    arg,
    listed,
    override,
    path,
    required,
    section,
)

DECODING = ("spans", "free")     # answers are passage spans | any tokens
# Reading may also choose among the retriever's phrases and the spans answer (reader/fusion.py);
# training's validation reads files without phrases, so it keeps to DECODING.
READ_DECODING = DECODING + ("phrases",)
# `odqa reader init --shape`: from-scratch T5 shapes.
SHAPES = {
    "tiny": dict(vocab=16_000, d_model=256, d_ff=1024, num_layers=4, num_heads=4, d_kv=64),
    "small": dict(vocab=32_000, d_model=512, d_ff=2048, num_layers=6, num_heads=8, d_kv=64),
    "base": dict(vocab=32_000, d_model=768, d_ff=3072, num_layers=12, num_heads=12, d_kv=64),
}


@dataclass(kw_only=True)
class ReaderSettings(Settings, Batched):
    """How the FiD reader reads: the one home of each reading setting, its default and its help. `read`,
    `ask`, `serve` and `run` make their flags from it, `train-reader` validates with it; `Pipeline.ask`
    and `odqa.load` take its settings by name."""
    batch_size: int = override(Batched, "batch_size", 8, help="questions per generate() call")
    text_maxlength: int = arg(200, "reader tokens per question+passage", range="positive")
    max_new_tokens: int = arg(32, "generated tokens at most", range="positive", aliases=["--answer-maxlength"])
    num_beams: int = arg(1, "beam size; 1 is greedy", range="positive", aliases=["--beams"])
    decoding: str = arg("spans", "spans: the answer is a span of an input passage; free: any tokens; phrases: the "
                                 "spans answer or a passage's best phrase, whichever the reader and the phrase scores "
                                 "prefer (reader/fusion.py)", choices=READ_DECODING)

    def __post_init__(self):
        super().__post_init__()
        if self.decoding not in READ_DECODING:
            raise InputError(f"--decoding must be one of {', '.join(READ_DECODING)}, not {self.decoding!r}")


@dataclass(kw_only=True)
class LoopArgs(OptimArgs):
    """The reader trainers' loop settings: the shared loop's (`odqa.common.trainer`) with the reader's
    defaults (DeepSpeed, evaluation and checkpoints by steps), its output directory and two of its own."""
    epochs: int = arg(1, "passes over the training data")
    batch_size: int = arg(4, "micro-batch per process")
    lr: float = arg(1e-4, "peak learning rate (0: the pretrained weights held, only --new-lr's train)",
                    range="non_negative")
    warmup_steps: int | None = arg(100, "steps of linear warm-up")
    eval_steps: int = arg(500, "evaluate (and keep the best) every N steps and at the end")
    save_steps: int = arg(500, "checkpoint every N steps, after each epoch and at the end")
    seed: int = arg(0, "seed of data order and initialisation")
    backend: str = arg("deepspeed", "deepspeed (ZeRO; under deepspeed, torchrun or accelerate launch) or accelerate")
    out_dir: str | None = path(None, "checkpoint/, best/ and last/ (plain HF checkpoints) go here", required=True, **OUT)
    new_lr: float | None = arg(None, "peak rate of the weights a warm start made anew (cross-attention, LM head); "
                                     "default --lr", range="positive")
    gradient_checkpointing: bool = arg(False, "recompute the encoder blocks in backward (memory for time)")
    freeze_embeddings: bool = arg(False, "hold the embeddings fixed (the word embeddings are the decoder's input and "
                                         "output ones too): on a CPU a warm reader's FiD step runs 1.2x faster")
    freeze_layers: int = arg(0, "hold the encoder's bottom N blocks fixed as well; with --freeze-embeddings the "
                                "backward pass stops N blocks up")

    def __post_init__(self):
        super().__post_init__()
        # eval_steps 0 would evaluate once an epoch, which for a reader run by --max-steps may be never
        # before the end; warmup_steps 0 fails inside DeepSpeed's scheduler.
        for name in ("warmup_steps", "eval_steps", "save_steps"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise InputError(f"--{name.replace('_', '-')} must be at least 1, not {getattr(self, name)}")
        if self.freeze_layers < 0:
            raise InputError(f"--freeze-layers must be at least 0, not {self.freeze_layers}")
        if self.lr == 0 and not self.new_lr:
            raise InputError("--lr 0 with no --new-lr trains nothing: give an --lr above 0, or --new-lr for the "
                             "weights a warm start made anew")


@dataclass(kw_only=True)
class ReaderArgs(Settings, HeldOut, ValidationExamples, Passages):
    """`odqa train-reader`'s own settings, beside the loop's (`LoopArgs`): its data, its losses, and the
    reading its validation does (`reading`)."""
    model: str | None = path(None, "reader checkpoint: `odqa reader init` output (--from or --preset), t5-base, or a "
                                   "reader to continue", required=True)
    train_file: list[str] = listed([], "retrieval files from `odqa retrieve` (JSON or JSONL with ctxs)", input=True)
    validation_file: str | None = path(None, "default: the training files' questions held out by the supervise hash "
                                             "split")
    validation_percent: float = override(HeldOut, "validation_percent", 10.0, help="share of the training files' "
                                         "questions held out when no --validation-file is given")
    k: int = override(Passages, "k", 10, help="passages per question", aliases=["--n-passages"])
    reading: ReaderSettings = section(ReaderSettings, "how validation reads (spans or free decoding)",
                                      rename={"batch_size": "eval_batch_size"}, batch_size=16)
    random_answer: bool = arg(False, "target: a random answer per epoch instead of the first")
    keep_unanswerable: bool = arg(False, "also train on questions whose k passages hold no answer")
    max_validation_examples: int | None = override(ValidationExamples, "max_validation_examples", 500,
                                                   help="validation questions scored at each evaluation",
                                                   aliases=["--max-validation"])
    span_loss: bool = arg(False, "each answer step's softmax over the tokens span decoding may choose there "
                                 "(targets that are passage spans); the rest over the whole vocabulary")
    passage_loss_coef: float | None = arg(None, "weight of a passage prior's loss (-log p(an answer-bearing passage)) "
                                                "beside the answer's; default: the reader's config, else 1")

    def __post_init__(self):
        super().__post_init__()
        if self.reading.decoding not in DECODING:   # training's validation reads files without phrases
            raise InputError(f"--decoding for validation must be one of {', '.join(DECODING)}, not "
                             f"{self.reading.decoding!r}")


@dataclass(kw_only=True)
class PretrainArgs(Settings):
    model: str | None = path(None, "T5 checkpoint (`odqa reader init` output, or any T5 to continue)", required=True)
    corpus: str | None = path(None, "`odqa corpus build` output", required=True)
    input_length: int = arg(128, "tokens per passage before corruption")
    noise_density: float = arg(0.15, "share of the tokens masked")
    mean_span_length: float = arg(3.0, "mean length of a masked span")
    validation_passages: int = arg(256, "passages held out to validate on")
    eval_batch_size: int = arg(32, "passages per validation batch")


@dataclass(kw_only=True)
class ClozeArgs(Settings, Passages, Seeded):
    corpus: str | None = path(None, "`odqa corpus build` output", required=True)
    out: str = required("FiD JSONL to write", **FILE_OUT)
    k: int = override(Passages, "k", 10, help="passages a question: the source passage and k-1 random passages of "
                      "other documents", aliases=["--passages"])
    per_passage: int = arg(1, "questions drawn from each passage at most")
    min_words: int = arg(6, "question words left around the answer")
    max_sentence_words: int = arg(40, "longer sentences are skipped", aliases=["--max-words"])
    max_answer_words: int = arg(5, "answer words at most")


@dataclass(kw_only=True)
class ReaderInitArgs(Settings, Seeded):
    """`odqa reader init`."""
    from_encoder: str | None = path(None, "BERT checkpoint to warm-start from, e.g. "
                                          "$ODQA_HOME/data/encoders/all-MiniLM-L6-v2", flag="--from",
                                    metavar="ENCODER_DIR")
    decoder_layers: int = arg(2, "with --from: decoder depth", range="positive")
    dropout: float = arg(0.0, "with --from: dropout of encoder and decoder (0: short CPU schedules underfit)",
                         range="non_negative")
    pointer: bool = arg(True, "with --from: the output also points at the passages' tokens through their encoder "
                              "states (a copy distribution; no new weights; default on)")
    passage_prior: bool | None = arg(None, "with --from and --pointer: weigh each passage's tokens by a learned "
                                           "relevance of the passage to the question (one linear layer on its [CLS] "
                                           "state, trained on the retrieval file's has_answer too; default: on with "
                                           "the pointer)")
    shape: str = arg("tiny", "without --from: tiny (4+4 layers, d=256), small (t5-small's shape), base (t5-base's)",
                     choices=list(SHAPES), aliases=["--preset"])
    out: Path | None = path(None, "checkpoint directory (default: $ODQA_HOME/readers/bert2bert-init with --from, "
                                  "else t5-SHAPE-init)", writes="dir")
    vocab_size: int | None = arg(None, "vocabulary incl. sentinels (default: the shape's)", range="positive")
    seed: int = override(Seeded, "seed", 0, help="seed of the new weights")
    corpus: Path | None = path(None, CORPUS_HELP)


@dataclass(kw_only=True)
class ReadArgs(Settings, Passages, Limited):
    """`odqa read`'s own settings, beside `ReaderSettings`."""
    model: str | None = path(None, "reader checkpoint (train-reader OUT/best, FiD's published readers) or T5 name "
                                   "(default: the default pipeline's reader, `odqa demo`'s)")
    tokenizer: str | None = path(None, "the reader's tokenizer, for a checkpoint without one (FiD's published "
                                       "readers; default: the checkpoint's own, else the T5 of its width: t5-base, "
                                       "t5-large)")
    input: Path = required("retrieval file (DPR/FiD JSON or JSONL)")
    out: Path = required("predictions JSONL", **FILE_OUT)
