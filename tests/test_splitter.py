
import pytest

from odqa.common.splitter import split_passages


def words(text):
    return len(text.split())


def test_short_text_is_one_passage():
    text = "One sentence. Another one."
    assert split_passages(text) == [(0, len(text))]


def test_empty_text_has_no_passages():
    assert split_passages("   \n ") == []


def test_bound_is_respected_and_passages_are_disjoint_and_ordered():
    text = " ".join(f"Sentence number {i} has exactly seven words." for i in range(60))
    spans = split_passages(text, max_words=100)
    assert all(words(text[s:e]) <= 100 for s, e in spans)
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:]))
    # Nothing is lost: the passages' words are the text's words.
    assert " ".join(text[s:e] for s, e in spans).split() == text.split()


def test_passages_end_at_sentence_boundaries():
    text = " ".join(f"This is sentence {i} of the text." for i in range(40))  # 7 words each
    spans = split_passages(text, max_words=30)
    for s, e in spans:
        assert text[s:e].endswith("."), text[s:e]
        assert words(text[s:e]) == 28  # four whole sentences fit in 30 words


def test_abbreviations_and_initials_do_not_end_sentences():
    text = "Dr. J. R. R. Tolkien wrote books. " + " ".join(["Word"] * 20) + "."
    s, e = split_passages(text, max_words=10)[0]
    assert text[s:e] == "Dr. J. R. R. Tolkien wrote books."


def test_sentence_longer_than_bound_is_cut_evenly_at_words():
    text = " ".join(f"w{i}" for i in range(250))
    spans = split_passages(text, max_words=100)
    assert [words(text[s:e]) for s, e in spans] == [83, 83, 84]


def test_offsets_slice_the_text_and_newlines_break_sentences():
    text = "First paragraph without a full stop\nsecond paragraph here and more words"
    spans = split_passages(text, max_words=8)
    assert [text[s:e] for s, e in spans] == ["First paragraph without a full stop",
                                             "second paragraph here and more words"]


def test_max_words_must_be_positive():
    with pytest.raises(ValueError):
        split_passages("text", max_words=0)
