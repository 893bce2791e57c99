"""A recipe: every setting of the chain `odqa demo` runs, as one dataclass of sections. Each section is
a trainer's or a command's own settings object (`phrase` is a `PhraseTrainArgs`, `search` a
`SearchConfig`, ...); beside them are only the recipe's own fields: its data, its encoder, its seed,
which optional stages run, and the schedules that chain one trainer's runs (rounds, the reader's
gold-passage phase). Its defaults are the demo preset's; the files a stage reads and writes are the
recipe's to place (system/recipe.py), not settings.

    preset_config("full")                 # system/presets/full.toml over RecipeConfig's defaults
    preset_config("my.toml")              # a file of one's own: the settings it changes, in sections
    recipe_config("full", out, documents="psgs_w100.tsv.gz")   # a preset with overrides, on one's own corpus

A preset is TOML (or JSON) with a table a section: `[phrase] epochs = 2` sets `cfg.phrase.epochs`, by the
flat names the trainer's flags use (`[phrase] max_passage_tokens = 192` is its model config's). The
recipe's own fields come first, outside any table.

system/recipe.py runs a recipe's stages; `odqa demo` (system/demo.py) runs them in order, each reused
while its settings are unchanged.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, replace
from pathlib import Path

from odqa.common.io import InputError
from odqa.common.settings import Seeded, Settings, arg, from_flat, listed, override, path, read_settings_file, section
from odqa.reader.args import LoopArgs, ReaderArgs, ReaderInitArgs, ReaderSettings
from odqa.retriever.args import (
    BuildIndexArgs,
    DocTrainArgs,
    FilterArgs,
    PhraseTrainArgs,
    QueryTrainArgs,
    RerankerTrainArgs,
    TuneLambdaArgs,
)
from odqa.retriever.search_config import SearchConfig
from odqa.system.args import Evaluation, SuperviseArgs

READER_KINDS = ("warm", "t5")
READER_PASSAGES = ("bm25", "phrase")


@dataclass(kw_only=True)
class RecipeConfig(Settings, Seeded):
    """The demo preset's recipe: every default here is the demo's, under 30 minutes on 2 CPU cores."""
    # --- the recipe's own (those with `demo` are flags of `odqa demo` too) ---
    documents: str | None = path(None, "run the recipe on a corpus of your own: any `odqa corpus build` input (DPR's "
                                       "TSV, passages or documents JSONL, compressed or not), built into --corpus "
                                       "(default OUT/corpus)", demo=True, metavar="FILE")
    corpus: str | None = path(None, "where the corpus is built (default: the default corpus, or OUT/corpus with "
                                    "--documents)", demo=True, metavar="DIR")
    encoder: str | None = path(None, "BERT-family checkpoint the retriever encoders start from (default: the data "
                                     "pack's MiniLM)", demo=True)
    reader_model: str | None = path(None, "a reader checkpoint to train from, e.g. t5-base or one `odqa reader init` "
                                          "wrote (default: made by the reader's init, `reader_kind`)", demo=True)
    seed: int = override(Seeded, "seed", 0, help="added to every seed of the chain (each trainer's, the phrase "
                         "filter's, the index's sample, the reader's new weights), to measure how far another draw "
                         "moves the results; use with --out, or it replaces the preset's default run (0: the guides' "
                         "runs)", demo=True)
    with_reranker: bool = arg(False, "also train a cross-encoder passage reranker (a stage before `run`; about half an "
                                     "hour more on 2 cores) and read through it", demo=True, aliases=["--reranker"])
    answer_memory: bool = arg(True, "a stage before `run`: the training questions' answers lend votes to nearby "
                                    "questions' extractive answers (retriever/answer_memory.py)")
    phrase_round_lrs: list[float] = listed([], "more phrase rounds: one epoch each, a fresh schedule at this peak "
                                               "rate from the round before's best, seeds 14, 15, ...")
    query_rounds: int = arg(0, "rounds of query-side fine-tuning against the index, each `query.epochs` on a fresh "
                               "schedule from the round before's model, candidates mined anew (0: no query stage; the "
                               "demo's model gains nothing from it: docs/guides/demo.md)")
    query_final_fit: bool = arg(False, "after the doc stage: the query rounds again on train + validation, which the "
                                       "searches then use (docs/notes/retrieval.md, \"A final fit\")")
    doc_rounds: int = arg(1, "document encoder rounds: 2 trains a second on negatives mined by the first",
                          range="positive")
    reader_kind: str = arg("warm", "warm: a bert2bert warm-started from `encoder`; t5: a from-scratch T5 of "
                                   "`reader_init.shape` (without `reader_model`)", choices=list(READER_KINDS))
    reader_passages: str = arg("bm25", "FiD's passages: bm25, or phrase (the pipeline's own retrieval: the phrase "
                                       "index behind the pre-filter, the reader's passages at run time)",
                               choices=list(READER_PASSAGES))
    reader_questions: int | None = arg(None, "training questions retrieved for FiD (None, or \"all\" in TOML: all; "
                                             "those with an answer in their top k train)", range="positive")
    reader_bf16: bool = arg(True, "train under bfloat16 autocast where the CPU computes it natively (AVX512-BF16, "
                                  "AMX): 1.4x the steps, the same losses (docs/notes/reader.md)")
    pretrain_steps: int = arg(0, "t5: span-corruption steps on the corpus first", range="non_negative")
    gold_steps: int = arg(150, "reader steps on the gold passage alone (k = 1) before FiD at `reader.k` (0: none)",
                          range="non_negative")
    gold_batch: int = arg(8, "questions a step of that phase", range="positive")
    gold_evals: int = arg(1, "validations of that phase; its best goes on to FiD", range="positive")
    examples: int = arg(3, "example questions the demo asks its pipeline at the end", range="non_negative")
    # --- the sections: each stage's own settings object ---
    supervise: SuperviseArgs = section(SuperviseArgs, "distant supervision of the training questions")
    phrase: PhraseTrainArgs = section(PhraseTrainArgs, "the phrase encoder", epochs=1, max_train_examples=768,
                                      max_validation_examples=200, max_passage_tokens=160)
    filter: FilterArgs = section(FilterArgs, "the phrase filter that picks the tokens the index keeps")
    index: BuildIndexArgs = section(BuildIndexArgs, "the phrase index")
    query: QueryTrainArgs = section(QueryTrainArgs, "query-side fine-tuning, `query_rounds` of it")
    doc: DocTrainArgs = section(DocTrainArgs, "the document encoder", max_train_examples=512, max_validation_examples=200,
                                negatives="none", max_doc_tokens=64, validation_docs=1000)
    tune_lambda: TuneLambdaArgs = section(TuneLambdaArgs, "the rerank weights, tuned on validation", limit=200)
    reader_init: ReaderInitArgs = section(ReaderInitArgs, "the reader to train, without `reader_model`",
                                          passage_prior=True)
    reader: ReaderArgs = section(ReaderArgs, "the FiD reader's training (`k`: the passages it trains on)", k=5,
                                 max_validation_examples=100, span_loss=True, text_maxlength=128)
    # the embeddings and the encoder's bottom 2 blocks held fixed: with ZeRO-0, 1.7x the stage's speed on a
    # float32 CPU, EM within noise (docs/notes/reader.md); ZeRO-0: one process, where ZeRO-2 partitions
    # nothing and its gradient buckets cost a fifth of a CPU step
    reader_loop: LoopArgs = section(LoopArgs, "the reader's FiD phase (the gold-passage phase: `gold_steps`, "
                                              "`gold_batch`)", max_steps=150, new_lr=5e-4, zero_stage=0,
                                    freeze_embeddings=True, freeze_layers=2)
    # save_steps: a half-hour stage that is interrupted resumes within 100 steps
    reranker: RerankerTrainArgs = section(RerankerTrainArgs, "the passage reranker, with `with_reranker`",
                                          max_validation_examples=300, save_steps=100)
    search: SearchConfig = section(SearchConfig, "how the pipeline searches, in the run and after it")
    reading: ReaderSettings = section(ReaderSettings, "how the pipeline reads, in the run and after it",
                                      text_maxlength=128)
    run: Evaluation = section(Evaluation, "what the run stage evaluates", k=[5, 10], limit=100, baselines=["bm25"])

    def __post_init__(self):
        super().__post_init__()
        if self.reader_kind not in READER_KINDS:
            raise InputError(f"reader_kind must be one of {', '.join(READER_KINDS)}, not {self.reader_kind!r}")
        if self.reader_passages not in READER_PASSAGES:
            raise InputError(f"reader_passages must be one of {', '.join(READER_PASSAGES)}, not "
                             f"{self.reader_passages!r}")


PRESET_DIR = Path(__file__).parent / "presets"   # the shipped recipes: demo.toml, full.toml
# In a count that None makes unlimited, TOML's "all" (TOML has no null).
ALL = "all"


def preset_config(name_or_path: str | Path) -> RecipeConfig:
    """A recipe as a RecipeConfig: a preset shipped in system/presets by name (demo, full), or a TOML or
    JSON file, each setting it names changed from the default. A file of the flat names before sections
    (0.1: `phrase_examples = 768`) is read with a deprecation line (system/legacy.py)."""
    path_ = Path(name_or_path)
    if not path_.suffix:
        path_ = PRESET_DIR / f"{name_or_path}.toml"
        if not path_.is_file():
            names = ", ".join(sorted(p.stem for p in PRESET_DIR.glob("*.toml")))
            raise InputError(f"unknown preset {str(name_or_path)!r}: one of {names}, or a .toml or .json file")
    values = read_settings_file(path_, f"preset {path_}")
    from odqa.system.legacy import flat_preset
    values = flat_preset(values, path_)
    try:
        return from_flat(RecipeConfig, _nulls(RecipeConfig, values), str(path_))
    except TypeError as e:
        raise InputError(f"{path_}: {e}") from None


def _nulls(cls, values: dict) -> dict:
    """`values` with "all" as None where the setting's None means unlimited (an int | None count)."""
    kinds = {}

    def walk(c):
        for f in dataclasses.fields(c):
            if "section" in f.metadata:
                walk(f.metadata["section"])
            kinds.setdefault(f.name, str(f.type))
    walk(cls)
    out = {}
    for k, v in values.items():
        if isinstance(v, dict):
            out[k] = _nulls(cls, v)
        else:
            out[k] = None if v == ALL and "int | None" in kinds.get(k, "") else v
    return out


PRESETS = {p.stem: preset_config(p.stem) for p in sorted(PRESET_DIR.glob("*.toml"))}


def recipe_config(preset: str | Path, out: Path, **overrides) -> RecipeConfig:
    """The preset's settings with `overrides` (the recipe's own fields, those not None) in their place; a
    corpus of one's own (`documents`) is built in the run's directory unless `corpus` says where, never
    over the default one."""
    cfg = replace(preset_config(preset), **{k: v for k, v in overrides.items() if v is not None})
    return replace(cfg, corpus=str(out / "corpus")) if cfg.documents and not cfg.corpus else cfg


def demo_fields() -> list[dataclasses.Field]:
    """The recipe's fields that are flags of `odqa demo` too."""
    return [f for f in dataclasses.fields(RecipeConfig) if f.metadata.get("demo")]
