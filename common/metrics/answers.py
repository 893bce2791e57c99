"""Answer-string metrics of the SQuAD evaluation script, and regex EM for CuratedTREC.

Each metric takes one prediction and the list of gold answers and returns the max over the golds,
as SQuAD, DPR and FiD report them. `is_echo` tells an answer that only repeats the question, which
both the extractive answer (retriever.searcher) and the generated one (reader.read) refuse;
`echoes_at_edge` one that starts or ends with a question word, which the extractive answer refuses.
"""
from __future__ import annotations

import collections
import re
import string
from functools import lru_cache
from typing import Literal, Sequence

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCT = set(string.punctuation)

RegexMode = Literal["match", "search", "fullmatch"]


# an EM column that scores NQ-open's own answers ("answers_raw", which FiD's data and published EM use)
# rather than DPR's tokenised ones ends so: eval-retrieval's and odqa run's report alike
NQ_OPEN = " (NQ-open answers)"

def normalize_answer(text: str) -> str:
    """The SQuAD script's normalisation, unchanged so EM stays comparable with published numbers:
    lower case, drop ASCII punctuation, drop articles (a/an/the), squeeze white space. Accents and
    non-ASCII punctuation are kept ("Röntgen" != "Rontgen")."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCT)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def is_echo(phrase: str, question: str) -> bool:
    """Whether a phrase says nothing the question does not: every word of it, after the SQuAD
    normalisation (so articles and punctuation do not count), is a word of the question ("the Sava" for
    "... the River Sava and which other river?"), or it has none. Phrase encoders rank such spans high
    because they match the question best; as answers they are nearly always wrong, and so are a
    reader's (docs/notes/reader.md, "Echoes of the question")."""
    words = normalize_answer(phrase).split()
    return not words or set(words) <= _words(question)


def echoes_at_edge(phrase: str, question: str) -> bool:
    """Whether a phrase starts or ends with a word of the question, after the SQuAD normalisation:
    "Yamuna river" for "delhi is on the banks of which river", "ecliptic plane" for "the plane of earth's
    orbit is called the". The question's word names the kind of thing asked for; the span that takes it
    along is the answer with it attached, which exact match does not count (docs/notes/retrieval.md, "The
    question's words at a phrase's edges"). An echo (`is_echo`) is one too."""
    words, asked = normalize_answer(phrase).split(), _words(question)
    return not words or words[0] in asked or words[-1] in asked


@lru_cache(maxsize=1024)
def _words(question: str) -> frozenset[str]:   # asked once for each of a question's k passages
    return frozenset(normalize_answer(question).split())


def exact_match(prediction: str, golds: Sequence[str]) -> bool:
    norm = normalize_answer(prediction)
    return any(norm == normalize_answer(g) for g in golds)


def _f1(prediction: str, gold: str) -> float:
    pred_tokens = normalize_answer(prediction).split()
    gold_tokens = normalize_answer(gold).split()
    common = collections.Counter(pred_tokens) & collections.Counter(gold_tokens)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision = same / len(pred_tokens)
    recall = same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def f1_score(prediction: str, golds: Sequence[str]) -> float:
    return max((_f1(prediction, g) for g in golds), default=0.0)


@lru_cache(maxsize=4096)
def compile_answer_regex(pattern: str) -> re.Pattern:
    """Case-insensitive, as DrQA and DPR compile CuratedTREC patterns."""
    try:
        return re.compile(pattern, flags=re.IGNORECASE | re.UNICODE | re.MULTILINE)
    except re.error as e:
        raise ValueError(f"invalid answer regex {pattern!r}: {e}") from None


def regex_match(prediction: str, patterns: Sequence[str], mode: RegexMode = "match") -> bool:
    """Regex EM for CuratedTREC. mode="match" (default) anchors at the start of the prediction like
    `re.match`, as DrQA's `regex_match_score` and DPR's evaluation do; "search" accepts a match
    anywhere, like `re.search`; "fullmatch" requires the whole prediction to match."""
    return any(getattr(compile_answer_regex(p), mode)(prediction) is not None for p in patterns)


def answer_em(prediction: str, golds: Sequence[str], regex: bool = False) -> bool:
    """EM for a question of any dataset: regex match for regex answers, normalised EM otherwise."""
    return regex_match(prediction, golds) if regex else exact_match(prediction, golds)
