"""What a question gets back, as typed values: the phrases, passages and documents of a search and the
answers of the pipeline, and a question as `odqa run` judged it. The server's responses (their schema
at /docs too), `odqa ask`'s printout and `odqa run`'s per-question file are made from these, and
`to_dict` / `from_dict` round-trip them through JSON.

    Answer(question, extractive: Phrase | None, generated: str, passages: tuple[Passage, ...],
           memory: tuple[Neighbour, ...], timings: dict)

Only the standard library here: `import odqa` stays light.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields


def _known(cls, d: dict) -> dict:
    """`d`'s keys that are `cls`'s fields: the searcher's dicts carry internals (a passage's row)."""
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in d.items() if k in names}


@dataclass(frozen=True)
class Phrase:
    """A span of a passage (or of its title, `in_title`), in the passage's own characters."""
    text: str
    score: float
    passage_id: str
    char_start: int
    char_end: int
    in_title: bool = False
    support: float | None = None   # the extractive answer's share of the top passages' votes

    @classmethod
    def from_dict(cls, d: dict | None) -> "Phrase | None":
        return None if d is None else cls(**_known(cls, d))

    def to_dict(self) -> dict:
        return asdict(self)


class _Unit:
    """A passage's or a document's dict form: its phrase nested as `Phrase`'s."""

    @classmethod
    def from_dict(cls, d: dict):
        return cls(**{**_known(cls, d), "phrase": Phrase.from_dict(d.get("phrase"))})

    def to_dict(self) -> dict:
        return asdict(self)   # the phrase, a dataclass too, becomes its dict


@dataclass(frozen=True)
class Passage(_Unit):
    id: str
    title: str
    text: str
    score: float
    phrase: Phrase | None = None   # its best phrase for the question


@dataclass(frozen=True)
class Document(_Unit):
    id: str
    score: float
    phrase: Phrase | None = None   # its best phrase for the question


@dataclass(frozen=True)
class Neighbour:
    """A training question of the answer memory that lent its answers to the extractive answer's vote."""
    question: str
    answers: tuple[str, ...]
    similarity: float

    @classmethod
    def from_dict(cls, d: dict) -> "Neighbour":
        return cls(d["question"], tuple(d["answers"]), d["similarity"])

    def to_dict(self) -> dict:
        return {"question": self.question, "answers": list(self.answers), "similarity": self.similarity}


@dataclass(frozen=True)
class Answer:
    """One question's two answers from one retrieval: the top phrase (`extractive`) and the reader's
    (`generated`) over the k `passages`."""
    question: str
    extractive: Phrase | None
    generated: str
    passages: tuple[Passage, ...] = ()
    memory: tuple[Neighbour, ...] = ()
    timings: dict = field(default_factory=dict, compare=False)

    @classmethod
    def from_dict(cls, d: dict) -> "Answer":
        return cls(question=d["question"], extractive=Phrase.from_dict(d.get("extractive")), generated=d["generated"],
                   passages=tuple(map(Passage.from_dict, d.get("passages", ()))),
                   memory=tuple(map(Neighbour.from_dict, d.get("memory", ()))), timings=dict(d.get("timings", {})))

    def to_dict(self) -> dict:
        return {"question": self.question, "extractive": None if self.extractive is None else self.extractive.to_dict(),
                "generated": self.generated, "passages": [p.to_dict() for p in self.passages],
                "memory": [m.to_dict() for m in self.memory], "timings": dict(self.timings)}


@dataclass(frozen=True)
class ReadAtK:
    """The reader's answer to a question from its top k passages, judged against the gold answers."""
    generated: str
    generated_em: bool
    hit: bool   # an answer-bearing passage among the top k
    generated_f1: float | None = None   # SQuAD's token F1; None for regex answers (CuratedTREC), as the papers
    generated_em_raw: bool | None = None   # EM against NQ-open's own answers, where the set has them (NQ)


@dataclass(frozen=True)
class RunQuestion:
    """One question of `odqa run` (a line of OUT/questions.jsonl): its gold answers (regular expressions
    for CuratedTREC), the extractive answer and, per k, the generated one, each judged by EM."""
    dataset: str
    id: str
    question: str
    answers: tuple[str, ...]
    extractive: str
    extractive_em: bool
    k: dict[int, ReadAtK]
    extractive_f1: float | None = None   # SQuAD's token F1; None for regex answers
    # with an answer memory (`odqa run --with-memory`): the vote's answer with its help, and its EM
    extractive_memory: str | None = None
    extractive_memory_em: bool | None = None
    # NQ: "answers" are DPR's, PTB-tokenised ("May 18 , 2018"); NQ-open's own, which FiD's data scores, beside
    answers_raw: tuple[str, ...] | None = None
    extractive_em_raw: bool | None = None

    @classmethod
    def from_dict(cls, d: dict) -> "RunQuestion":
        raw = d.get("answers_raw")
        return cls(d["dataset"], d["id"], d["question"], tuple(d["answers"]), d["extractive"], d["extractive_em"],
                   {int(k): ReadAtK(**v) for k, v in d["k"].items()}, d.get("extractive_f1"),
                   d.get("extractive_memory"), d.get("extractive_memory_em"),
                   None if raw is None else tuple(raw), d.get("extractive_em_raw"))

    def to_dict(self) -> dict:
        memory = {} if self.extractive_memory is None else {"extractive_memory": self.extractive_memory,
                                                            "extractive_memory_em": self.extractive_memory_em}
        raw = {} if self.answers_raw is None else {"answers_raw": list(self.answers_raw),
                                                   "extractive_em_raw": self.extractive_em_raw}
        return {"dataset": self.dataset, "id": self.id, "question": self.question, "answers": list(self.answers),
                **raw, "extractive": self.extractive, "extractive_em": self.extractive_em,
                "extractive_f1": self.extractive_f1, **memory,
                "k": {str(k): {n: v for n, v in asdict(r).items() if n != "generated_em_raw" or v is not None}
                      for k, r in sorted(self.k.items())}}
