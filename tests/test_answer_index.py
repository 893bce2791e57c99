import random

import numpy as np
import pytest

from odqa.common.answer_index import AnswerIndex, CorpusTexts, requirement
from odqa.common.corpus import PassageStore
from odqa.common.metrics.has_answer import has_answer

TEXTS = [
    "The Beatles formed in Liverpool in 1960.",
    "Liverpool is a city in England.",
    "Mount Everest is 8,849 metres tall.",
    "Kansas is in the middle of the United States",
    "the state of Kansas",
    "",
    "Röntgen discovered X-rays in 1895.",
]


def brute_force(answers, regex=False):
    return [i for i, t in enumerate(TEXTS) if has_answer(t, answers, regex)]


def test_find_equals_brute_force_has_answer():
    index = AnswerIndex(TEXTS)
    cases = [["Liverpool"], ["liverpool in 1960"], ["8,849 metres"], ["8849"], ["X-rays"],
             ["Kansas", "Beatles"], ["not there"], ["in"], [""], ["Röntgen"]]
    for answers in cases:
        assert index.find(answers) == brute_force(answers), answers


def test_regex_find_equals_brute_force_including_matches_across_joins():
    index = AnswerIndex(TEXTS)
    # "States\nthe state" would match across the join of passages 3 and 4; per passage it must not.
    cases = [[r"kansas"], [r"^the state"], [r"States$"], [r"States.the"], [r"States\sthe"], [r"8,?849"],
             [r".*"], [r"(unclosed"], [r"Unit.*of Kansas"]]
    for answers in cases:
        assert index.find(answers, regex=True) == brute_force(answers, regex=True), answers


@pytest.mark.parametrize("chunk_tokens", [100_000, 7, 1])
def test_find_on_random_corpus(chunk_tokens):
    """Built a chunk of tokens at a time (the chunks' bounds fall inside passages, or after each token),
    the index finds what has_answer finds, repeated words included ("beta beta beta" in "beta beta")."""
    rng = random.Random(0)
    vocab = "alpha beta gamma delta epsilon zeta eta theta".split()
    texts = [" ".join(rng.choice(vocab) for _ in range(rng.randint(0, 30))) for _ in range(200)] + ["beta beta"]
    index = AnswerIndex(texts, chunk_tokens=chunk_tokens)
    assert len(index) == len(texts)
    answers = [" ".join(rng.choice(vocab) for _ in range(rng.randint(1, 3))) for _ in range(50)]
    for answer in answers + ["beta beta beta", "beta beta", "omega", "beta omega"]:
        assert index.find([answer]) == [i for i, t in enumerate(texts) if has_answer(t, [answer])], answer


def test_regex_scan_agrees_with_re_at_a_zero_width_joiner():
    """The joined-text scan uses `re`, as the per-passage check does: the `regex` module does not
    see a word boundary between U+200D and a digit, and missed this passage."""
    texts = ["the Roman Republic (509\u200d\u2013\u200d27\xa0BC), and", "in 127 BC", "27 BC"]
    assert AnswerIndex(texts).find([r"\b2[78]\b"], regex=True) == [0, 2] == brute_force_in(texts, [r"\b2[78]\b"])


@pytest.mark.parametrize("pattern, need", [
    (r"Jack(ie)? Kennedy", ("all", ["Jack", "Kennedy"])),
    (r"After the Fall|Finishing", ("any", [("all", ["After", "the", "Fall"]), "Finishing"])),
    (r"20\s?,?\s?(32|40)0\s?f(ee|oo)t|6,194-meter",
     ("any", [("all", ["20", ("any", ["32", "40"]), "0", "f", ("any", ["ee", "oo"]), "t"]), ("all", ["6", "194", "meter"])])),
    (r"(?:ab)+c?", "ab"),
    (r"x*yz", "yz"),                         # a repeat that may be absent holds nothing
    (r"\b4\b", "4"),
    (r"four|.*", None),                      # one branch needs nothing, so the pattern does not
    (r"(ten|10)\s*(percent|%)", ("any", ["ten", "10"])),
    (r"Röntgen", ("all", ["R", "ntgen"])),   # ASCII runs only
    (r"[Kk]ansas", "ansas"),
    (r"(unclosed", None),
])
def test_requirement(pattern, need):
    assert requirement(pattern) == need


@pytest.mark.parametrize("scan_above", [1.0, 0.0])
def test_regex_by_candidates_equals_the_scan_and_brute_force(scan_above, monkeypatch):
    """With every pattern's candidates read one by one (1.0), or every pattern scanned (0.0), the rows
    are DPR's per-passage search: case, Unicode case folding (the Kelvin sign, the long s and the dotless i
    match k, s and i), accents and the joins included."""
    rng = random.Random(1)
    words = ["Kennedy", "kennedy's", "Jackie", "Jack", "Fall", "after", "the", "play", "4", "44", "BC", "27",
             "\u212aelvin", "ſpring", "\u0131ndia", "Röntgen", "Rontgen", "feet", "20,320", "x-rays", "\u200d"]
    texts = [" ".join(rng.choice(words) for _ in range(rng.randint(0, 12))) for _ in range(300)] + [""]
    index = AnswerIndex(texts)
    monkeypatch.setattr(AnswerIndex, "SCAN_ABOVE", scan_above)
    scans = []
    monkeypatch.setattr(AnswerIndex, "_scan", lambda self, exact, scan=AnswerIndex._scan: scans.append(1) or scan(self, exact))
    patterns = [r"Jack(ie)? Kennedy", r"After the Fall|Finishing the Play", r"\b4\b", r"kelvin", r"spring", r"india",
                r"r(ö|o)ntgen", r"20,?320\s*f(ee|oo)t", r"\d+ BC", r"^the", r"play$", r"s\s+the", r"x-rays?",
                r"four|4", r"(?-i:JACK)", r"nothing here", r"\b2[78]\b"]
    for pattern in patterns:
        assert index.find([pattern], regex=True) == brute_force_in(texts, [pattern]), pattern
    assert len(scans) == (0 if scan_above else len(patterns) - 1)   # but "nothing here": no candidate to scan


def brute_force_in(texts, patterns):
    return [i for i, t in enumerate(texts) if has_answer(t, patterns, True)]


def test_a_corpus_on_disk_is_read_again_only_for_a_regex_answer(tiny_corpus):
    texts = CorpusTexts(tiny_corpus)
    store = PassageStore(tiny_corpus)
    want = [p["text"] for p in store]
    store.close()
    assert len(texts) == len(want) and list(texts) == want == list(texts)   # a fresh read each time
    index = AnswerIndex(texts)
    assert index.find(["1901"]) == [i for i, t in enumerate(want) if has_answer(t, ["1901"])] != []
    assert index.find([r"nobel\s+prize"], regex=True) == brute_force_in(want, [r"nobel\s+prize"]) != []
    with pytest.raises(TypeError, match="not an iterator"):
        AnswerIndex(iter(want))


def test_the_answer_index_is_built_once_a_corpus_and_memory_mapped_after(tiny_corpus, monkeypatch):
    store = PassageStore(tiny_corpus)
    want = [p["text"] for p in store]
    store.close()
    built = AnswerIndex.open(tiny_corpus)
    assert (tiny_corpus / "answer-index" / "manifest.json").exists()
    monkeypatch.setattr(AnswerIndex, "__init__", lambda *a, **k: pytest.fail("built again"))
    saved = AnswerIndex.open(tiny_corpus)
    assert all(isinstance(getattr(saved, f"_{name}"), np.memmap) for name in AnswerIndex.ARRAYS)
    for answers, regex in ((["1901"], False), (["Eiffel Tower", "paris"], False), (["no such words"], False),
                           ([r"nobel\s+prize"], True)):
        expected = brute_force_in(want, answers) if regex else [i for i, t in enumerate(want) if has_answer(t, answers)]
        assert built.find(answers, regex) == saved.find(answers, regex) == expected
    monkeypatch.undo()
    # a damaged file is not trusted: the index is built again
    tokens = tiny_corpus / "answer-index" / "tokens.npy"
    tokens.write_bytes(tokens.read_bytes()[:-4] + b"\0\0\0\0")
    assert AnswerIndex.open(tiny_corpus).find(["1901"]) == built.find(["1901"])
