import math
import unicodedata

import pytest

from odqa.common.metrics.answers import answer_em, exact_match, f1_score, normalize_answer, regex_match
from odqa.common.metrics.has_answer import TokenizedText, answer_spans, dpr_tokenize, has_answer
from odqa.common.metrics.retrieval import mrr_at_k, precision_at_k, retrieval_metrics, top_k_accuracy


@pytest.mark.parametrize("text, expected", [
    ("The Beatles", "beatles"),
    ("an apple a day", "apple day"),
    ("Theatre", "theatre"),                 # "the" only as a whole word
    ("U.S.A.!", "usa"),
    ("  many   spaces\t", "many spaces"),
    ("Röntgen", "röntgen"),                 # accents kept, as in the SQuAD script
    ("1,000 — ish", "1000 — ish"),          # only ASCII punctuation is dropped
])
def test_normalize_answer(text, expected):
    assert normalize_answer(text) == expected


def test_exact_match_takes_the_max_over_golds():
    assert exact_match("the Eiffel Tower", ["Louvre", "Eiffel tower"])
    assert not exact_match("Eiffel", ["Louvre", "Eiffel tower"])
    assert not exact_match("anything", [])


def test_f1_partial_overlap_and_max():
    assert math.isclose(f1_score("Paul McCartney", ["McCartney"]), 2 * 0.5 * 1 / 1.5)
    assert f1_score("Paul McCartney", ["John", "Paul McCartney"]) == 1.0
    assert f1_score("the", ["a"]) == 0.0  # both normalise to empty


def test_regex_match_modes():
    pattern = [r"20,?3[24]0\s*f(ee|oo)t"]
    assert regex_match("20,320 feet high", pattern)                  # anchored at the start only
    assert not regex_match("about 20,320 feet", pattern)             # re.match does not search
    assert regex_match("about 20,320 feet", pattern, mode="search")
    assert not regex_match("20,320 feet high", pattern, mode="fullmatch")
    assert regex_match("KANSAS", ["kansas"])                         # case-insensitive
    assert answer_em("Kansas", ["Kan.*"], regex=True) and not answer_em("Kansas", ["Kan.*"])


def test_dpr_tokenize_offsets_index_the_original_text():
    text = "Röntgen's X-rays (1895)"
    toks = dpr_tokenize(text)
    nfd = unicodedata.normalize("NFD", "röntgen")  # tokens are NFD, as DPR's are
    assert [t for t, _, _ in toks] == [nfd, "'", "s", "x", "-", "rays", "(", "1895", ")"]
    assert [text[s:e] for _, s, e in toks][0] == "Röntgen"


def test_has_answer_contiguous_tokens_case_and_unicode():
    text = "Wilhelm Conrad Röntgen won the first Nobel Prize in Physics."
    assert has_answer(text, ["wilhelm conrad röntgen"])
    decomposed = unicodedata.normalize("NFD", "Röntgen")
    assert has_answer(text, [decomposed])                         # NFD on both sides
    assert not has_answer(text, ["Conrad Wilhelm"])               # order matters
    assert not has_answer(text, ["Prize Physics"])                # must be contiguous
    assert not has_answer(text, ["Nobel Prizes"])                 # whole tokens only
    assert has_answer(text, ["nope", "nobel prize"])              # any gold
    assert not has_answer(text, [""])


def test_has_answer_punctuation_tokens_match_ptb_style_answers():
    # DPR's NQ answers are tokenised ("May 18 , 2018"); DPR tokens make both spellings equal.
    assert has_answer("It was released on May 18, 2018 worldwide.", ["May 18 , 2018"])


def test_answer_spans_in_original_characters():
    text = "In 1901 Röntgen won; Röntgen again."
    spans = answer_spans(text, ["röntgen"])
    assert [text[s:e] for s, e in spans] == ["Röntgen", "Röntgen"]
    assert answer_spans(text, ["1901"], tokens=TokenizedText(text)) == [(3, 7)]


def test_regex_has_answer_and_spans():
    text = "Mount McKinley is 20,320 feet tall."
    assert has_answer(text, [r"20,?3[24]0\s*f(ee|oo)t"], regex_answers=True)
    assert not has_answer(text, [r"^20,320"], regex_answers=True)
    assert [text[s:e] for s, e in answer_spans(text, [r"mckinley"], regex_answers=True)] == ["McKinley"]
    assert not has_answer(text, ["(unclosed"], regex_answers=True)   # a bad regex matches nothing


def test_retrieval_metrics_known_values():
    hits = [[False, True, False], [False, False, False], [True, True, False]]
    assert top_k_accuracy(hits, 1) == pytest.approx(100 / 3)
    assert top_k_accuracy(hits, 2) == pytest.approx(200 / 3)
    assert mrr_at_k(hits, 3) == pytest.approx(100 * (0.5 + 0 + 1) / 3)
    assert mrr_at_k(hits, 1) == pytest.approx(100 / 3)
    assert precision_at_k(hits, 2) == pytest.approx(100 * (0.5 + 0 + 1) / 3)
    m = retrieval_metrics(hits, ks=(1, 2), mrr_k=3, p_k=2)
    assert m["questions"] == 3 and set(m) == {"Top-1", "Top-2", "MRR@3", "P@2", "questions"}
    assert retrieval_metrics([], ks=(1,))["Top-1"] == 0.0


def test_evaluate_module_loads_by_path():
    from pathlib import Path

    import evaluate

    from odqa.common import metrics
    path = Path(metrics.__file__).parent / "odqa_em"
    em = evaluate.load(str(path))
    out = em.compute(predictions=["The Beatles", "Paul"], references=[["beatles"], ["Paul McCartney"]])
    assert out["exact_match"] == 50.0
    assert out["f1"] == pytest.approx(100 * (1 + 2 / 3) / 2)
    rx = evaluate.load(str(path), "regex")
    assert rx.compute(predictions=["it is Kansas"], references=[["Kansas"]])["exact_match"] == 0.0
    assert rx.compute(predictions=["it is Kansas"], references=[["Kansas"]], regex_mode="search")["exact_match"] == 100.0


def test_overlap_parts_tell_paraphrases_answer_overlap_and_novel_answers():
    from odqa.common.metrics.overlap import nearest_questions, overlap_parts
    train = [("when did the berlin wall fall", ["1989"]), ("who wrote hamlet", ["William Shakespeare"]),
             ("capital city of france", ["Paris"])]
    test = [("When did the Berlin wall fall?", ["1989"]),            # the same words, the same answer
            ("when did the berlin wall go up", ["1961"]),            # alike, another answer
            ("which city hosted the 1900 olympics", ["paris"]),      # a training answer, another question
            ("who painted the mona lisa", ["Leonardo da Vinci"])]    # nothing seen
    best, cosine = nearest_questions([q for q, _ in test], [q for q, _ in train])
    assert list(best[:2]) == [0, 0] and math.isclose(cosine[0], 1.0) and 0.0 < cosine[1] < 0.7
    parts = overlap_parts(test, train, threshold=0.7)
    assert [p["part"] for p in parts] == ["question overlap", "no overlap", "answer overlap only", "no overlap"]
    assert parts[0]["nearest"] == "when did the berlin wall fall"
    assert overlap_parts(test[:1], train, threshold=1.01)[0]["part"] == "answer overlap only"
    with pytest.raises(ValueError, match="no training questions"):
        nearest_questions(["q"], [])
