"""How the pipeline searches: `SearchConfig`, a section for each component of the search
(retriever/searcher.py), whose fields carry their command-line help; the flags of `retrieve`, `ask`,
`serve` and `run` are made from it, and `Pipeline.ask` / `odqa.load` take its settings by name. Nothing
heavy is imported here.
"""
from __future__ import annotations

from dataclasses import dataclass

from odqa.common.settings import Settings, arg, section

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


@dataclass(kw_only=True)
class PhraseSearchConfig(Settings):
    """Phrase search over the index (retriever/phrase_search.py)."""
    nprobe: int = arg(64, "IVF lists probed per search", range="positive")
    max_answer_tokens: int | None = arg(MAX_ANSWER_TOKENS, "longest phrase returned, in word pieces, at most the "
                                                           "index's L (None, in Python: L)", range="positive")


@dataclass(kw_only=True)
class PrefilterConfig(Settings):
    """The document pre-filter (DHR, retriever/prefilter.py): its documents and its rerank's weights."""
    top_docs: int = arg(100, "K: documents kept by the pre-filter", range="positive")
    lam: float | None = arg(None, "rerank weight of the document score (default: the value tune-lambda stored with "
                                  "the document index, else 0)")
    bm25_weight: float | None = arg(None, "rerank weight of the passage's BM25 score (default: the value tune-lambda "
                                          "stored with the document index, else 0)")


@dataclass(kw_only=True)
class RerankerConfig(Settings):
    """The cross-encoder passage reranker (retriever/cross_encoder.py)."""
    rerank_depth: int = arg(20, "passages the reranker reads: the top max(k, N)", range="positive")


@dataclass(kw_only=True)
class AnswerConfig(Settings):
    """The extractive answer (retriever/answer_aggregation.py): which phrases may answer, and their vote."""
    answer_filter: bool = arg(True, "each passage's phrase is its best span that can answer: whole words, no word "
                                    "of the question at its edges")
    answer_depth: int = arg(ANSWER_DEPTH, "the extractive answer is the phrase string the top N passages vote for "
                                          "most, each weighted by exp((score - best score) / --answer-temperature); "
                                          "1: the first passage's phrase", range="positive")
    answer_temperature: float = arg(ANSWER_TEMPERATURE, "temperature of that vote, in the ranking's score units",
                                    range="positive")


@dataclass(kw_only=True)
class MemoryConfig(Settings):
    """The answer memory's votes (retriever/answer_memory.py)."""
    memory_threshold: float = arg(MEMORY_THRESHOLD, "cosine a memory question needs to lend its answers")
    memory_weight: float = arg(MEMORY_WEIGHT, "votes a memory question lends, times its cosine", range="non_negative")
    memory_neighbours: int = arg(MEMORY_NEIGHBOURS, "nearest memory questions consulted", range="positive")


@dataclass(kw_only=True)
class SearchConfig(Settings):
    """How the pipeline searches: a section for each component. `Searcher` holds one; the flags of
    `retrieve`, `ask`, `serve` and `run` are made from it, and `Pipeline.ask` / `odqa.load` take its
    settings by name as overrides (`odqa.common.settings.updated`)."""
    phrase: PhraseSearchConfig = section(PhraseSearchConfig)
    prefilter: PrefilterConfig = section(PrefilterConfig)
    reranker: RerankerConfig = section(RerankerConfig)
    answer: AnswerConfig = section(AnswerConfig)
    memory: MemoryConfig = section(MemoryConfig)
