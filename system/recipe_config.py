"""A recipe: every setting of the chain `odqa demo` runs (corpus, phrase retriever, pre-filter, reader,
reranker, memory, evaluation) in one dataclass, and the shipped presets that set them.

    preset_config("full")                 # system/presets/full.toml over RecipeConfig's defaults
    preset_config("my.toml")              # a file of one's own: the settings it changes
    recipe_config("full", out, documents="psgs_w100.tsv.gz")   # a preset with overrides, on one's own corpus

system/recipe.py runs a recipe's stages; `odqa demo` (system/demo.py) runs them in order, each reused
while its settings are unchanged.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, replace
from pathlib import Path

from odqa.common.io import InputError
from odqa.common.settings import read_settings_file
from odqa.retriever.args import DEFAULT_KEEP


@dataclass
class RecipeConfig:
    # data
    documents: str | None = None            # corpus input (any `corpus build` format); None: the data pack's Wikipedia
    corpus: str | None = None               # where the corpus is built; None: the default corpus
    train_questions: list[str] = field(default_factory=lambda: ["nq-dev", "tqa-dev"])
    test_questions: list[str] = field(default_factory=lambda: ["nq-test", "tqa-test"])
    validation_percent: float = 10.0        # dev questions held out (by question hash) for validation
    validation_questions: int = 200         # of those, scored by the phrase and document trainers
    encoder: str | None = None              # BERT-family start of every retriever encoder; None: the pack's MiniLM
    seed: int = 0                           # added to every seed of the chain (each trainer's, the phrase filter's,
                                            # the index's sample, the reader's new weights): 0 is the guides' runs
    # phrase retriever
    phrase_examples: int | None = 768       # training questions (None: all)
    phrase_epochs: int = 1
    phrase_round_lrs: list[float] = field(default_factory=list)  # more rounds: one epoch each, a fresh schedule
                                            # at this peak rate from the round before's best, seeds 14, 15, ...
    phrase_batch: int = 16
    max_passage_tokens: int = 160
    title_phrases: bool = False             # the title's tokens are phrase candidates too (`train-phrase --title-phrases`)
    index_factory: str | None = None        # faiss index_factory string; None: OPQ + IVF-PQ sized to the index
    index_keep: float = DEFAULT_KEEP        # share of tokens indexed, by the phrase filter (1: all, no filter)
    query_epochs: int = 0                   # query-side fine-tuning against the index (0: none, no stage; the
                                            # demo's model gains nothing from 1 epoch of 1,000: docs/guides/demo.md)
    query_examples: int | None = None       # its training questions (None: all)
    query_rounds: int = 1                   # rounds of query_epochs, each a fresh schedule from the round
                                            # before's model, seeds 13, 14, ... (candidates mined anew)
    query_final_fit: bool = False           # after the doc stage: the query rounds again on train + validation,
                                            # which the searches then use (docs/notes/retrieval.md, "A final fit")
    # document pre-filter
    doc_examples: int | None = 512
    doc_batch: int = 32
    doc_rounds: int = 1                     # 2: a second round on negatives mined by the first
    doc_negatives: str = "none"             # round 1's hard negatives: none | abstract
    max_doc_tokens: int = 64
    doc_validation_docs: int = 1000         # validate among positives + N random documents (0: all)
    top_docs: int = 100
    lambda_questions: int = 200
    rerank_bm25: bool = True                # tune the rerank's BM25 weight beside lambda (it may still pick 0)
    # reader
    reader_model: str | None = None         # any reader checkpoint (t5-base); None: made by `reader_init`
    reader_init: str = "warm"               # warm: bert2bert from `encoder`; t5: a from-scratch T5 of reader_preset
    reader_decoder_layers: int = 2          # warm: decoder depth
    reader_pointer: bool = True             # warm: the output also points at the passages' tokens
    reader_passage_prior: bool = True       # warm, with the pointer: it weighs each passage by a learned relevance
    reader_preset: str = "tiny"             # t5: its shape
    pretrain_steps: int = 0                 # t5: span-corruption steps on the corpus first
    reader_gold_steps: int = 150            # steps on the gold passage alone (k = 1) before FiD at k
    reader_gold_batch: int = 8
    reader_gold_evals: int = 1              # validations of the gold-passage phase; its best goes on to FiD
    reader_steps: int = 150                 # FiD steps at reader_k
    reader_batch: int = 4
    reader_lr: float = 1e-4
    reader_new_lr: float | None = 5e-4      # the warm start's new weights (cross-attention, LM head); None: reader_lr
    reader_span_loss: bool = True           # each answer step's loss over what span decoding may choose there
    reader_k: int = 5                       # FiD trains at 5 and reads at run_k (docs/notes/reader.md: 10 trains no better)
    reader_passages: str = "bm25"           # FiD's passages: bm25, or phrase (the pipeline's own retrieval: the
                                            # phrase index behind the pre-filter, the reader's passages at run time)
    reader_questions: int | None = None     # training questions (None: all, those with an answer in their top k)
    reader_validation: int = 100            # validation questions with an answer in their top k
    reader_bf16: bool = True                # train under bfloat16 autocast where the CPU computes it natively
                                            # (AVX512-BF16, AMX): 1.4x the steps, the same losses (docs/notes/reader.md)
    reader_zero_stage: int | None = 0       # the demo trains in one process, where ZeRO-2 partitions nothing and
                                            # its gradient buckets cost a fifth of a CPU step; None: the JSON's
    reader_freeze_embeddings: bool = True   # the embeddings and the encoder's bottom 2 blocks held fixed: with
    reader_freeze_layers: int = 2           # ZeRO-0, 1.7x the stage's speed on a float32 CPU, EM within noise
                                            # (docs/notes/reader.md); not for a from-scratch T5
    text_maxlength: int = 128
    # passage reranker (an opt-in stage: about half an hour more on 2 cores; docs/notes/retrieval.md)
    reranker: bool = False                  # train a cross-encoder reranker; run and ask read through it
    reranker_questions: int | None = None   # its training questions (None: all)
    rerank_depth: int = 20                  # passages it is trained on and reorders: the search's top N
    reranker_validation: int = 300          # validation questions (MRR, then its weight beside the search's)
    reranker_batch: int = 8                 # questions a step, each with a positive and 3 negatives
    # answer memory (retriever/answer_memory.py; docs/notes/retrieval.md, "The answer memory")
    answer_memory: bool = True              # the training questions' answers lend votes to nearby questions'
    # evaluation
    run_limit: int | None = 100             # first N questions of each test set (None: all)
    run_k: list[int] = field(default_factory=lambda: [5, 10])
    baselines: list[str] = field(default_factory=lambda: ["bm25"])
    examples: int = 3


PRESET_DIR = Path(__file__).parent / "presets"   # the shipped recipes: demo.toml, full.toml


def preset_config(name_or_path: str | Path) -> RecipeConfig:
    """A recipe as a RecipeConfig: a preset shipped in system/presets by name (demo, full), or a TOML or JSON
    file of RecipeConfig's fields, each one it names changed from the default. TOML has no null: "all"
    stands for None in a count that None makes unlimited (phrase_examples, reader_questions, run_limit)."""
    path = Path(name_or_path)
    if not path.suffix:
        path = PRESET_DIR / f"{name_or_path}.toml"
        if not path.is_file():
            names = ", ".join(sorted(p.stem for p in PRESET_DIR.glob("*.toml")))
            raise InputError(f"unknown preset {str(name_or_path)!r}: one of {names}, or a .toml or .json file")
    values = read_settings_file(path, f"preset {path}")
    fields = {f.name: f for f in dataclasses.fields(RecipeConfig)}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise InputError(f"{path}: not recipe settings: {', '.join(unknown)}")
    values = {k: None if v == "all" and "int | None" in str(fields[k].type) else v for k, v in values.items()}
    try:
        return RecipeConfig(**values)
    except TypeError as e:
        raise InputError(f"{path}: {e}") from None


PRESETS = {p.stem: preset_config(p.stem) for p in sorted(PRESET_DIR.glob("*.toml"))}


def recipe_config(preset: str | Path, out: Path, **overrides) -> RecipeConfig:
    """The preset's settings with `overrides` (those not None) in their place; a corpus of one's own
    (`documents`) is built in the run's directory unless `corpus` says where, never over the default one."""
    cfg = replace(preset_config(preset), **{k: v for k, v in overrides.items() if v is not None})
    return replace(cfg, corpus=str(out / "corpus")) if cfg.documents and not cfg.corpus else cfg


def changed(cfg: RecipeConfig, *names: str) -> dict:
    """The settings among `names` that differ from RecipeConfig's defaults. Settings added after a stage
    key was first written join it this way, so that a run made before them is not rebuilt."""
    default = RecipeConfig()
    return {n: getattr(cfg, n) for n in names if getattr(cfg, n) != getattr(default, n)}
