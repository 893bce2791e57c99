import json

from tiny_data import write_jsonl

from odqa.common.io import read_jsonl
from odqa.common.questions import split_of
from odqa.retriever.supervise import supervise


def test_supervise_writes_examples_with_answer_spans(tiny_corpus, tiny_questions, tmp_path):
    out = tmp_path / "sup"
    stats = supervise([str(tiny_questions)], tiny_corpus, out, validation_percent=0)
    examples = [obj for _, obj in read_jsonl(out / "train.jsonl")]
    assert stats["datasets"]["tiny-q"]["with_positive"] == 4          # the telephone question has none
    assert {e["id"] for e in examples} == {"q0", "q1", "q2", "q3"}
    for e in examples:
        assert e["answer_char_spans"]
        for s, t in e["answer_char_spans"]:
            assert e["text"][s:t].lower().replace(" ", "") in [a.lower().replace(" ", "") for a in e["answers"]]
    assert (out / "validation.jsonl").read_text() == ""
    assert json.loads((out / "stats.json").read_text())["examples"] == {"train": 4, "validation": 0}


def test_positives_are_ranked_by_bm25(tmp_path, tiny_corpus):
    questions = write_jsonl(tmp_path / "q.jsonl", [
        {"id": "a", "question": "which tribe founded the city", "answers": ["city"]}])
    supervise([str(questions)], tiny_corpus, tmp_path / "sup", positives_per_question=2, validation_percent=0)
    examples = [obj for _, obj in read_jsonl(tmp_path / "sup" / "train.jsonl")]
    assert [e["passage_id"] for e in examples] == ["paris#1", "paris#0"]  # the tribe passage ranks first
    assert examples[0]["bm25_score"] >= examples[1]["bm25_score"]


def test_regex_answers_match_by_regex(tmp_path, tiny_corpus):
    questions = write_jsonl(tmp_path / "q.jsonl", [
        {"id": "r", "question": "how high is everest", "answers": [r"8,?849\s*m"], "regex": True}])
    stats = supervise([str(questions)], tiny_corpus, tmp_path / "sup", validation_percent=0)
    assert stats["datasets"]["q"]["with_positive"] == 1
    (example,) = [obj for _, obj in read_jsonl(tmp_path / "sup" / "train.jsonl")]
    (s, e), = example["answer_char_spans"]
    assert example["text"][s:e] == "8,849 m"


def test_split_is_deterministic_and_near_the_asked_share():
    questions = [f"question number {i}" for i in range(5000)]
    splits = [split_of(q, 10.0) for q in questions]
    assert splits == [split_of(q, 10.0) for q in questions]
    assert 0.08 < splits.count("validation") / len(splits) < 0.12
    assert split_of("  Same Question ", 10.0) == split_of("same question", 10.0)


def test_examples_carry_their_passage_rank_among_all_passages(tmp_path, tiny_corpus):
    from odqa.retriever.bm25 import BM25Index
    questions = write_jsonl(tmp_path / "q.jsonl", [
        {"id": "a", "question": "which tribe founded the city", "answers": ["city"]}])
    stats = supervise([str(questions)], tiny_corpus, tmp_path / "sup", positives_per_question=2, validation_percent=0)
    examples = [obj for _, obj in read_jsonl(tmp_path / "sup" / "train.jsonl")]
    scores = BM25Index.open(tiny_corpus).scores("which tribe founded the city")
    for e in examples:
        assert e["bm25_rank"] == 1 + sum(s > e["bm25_score"] for s in scores)
    assert examples[0]["bm25_rank"] < examples[1]["bm25_rank"]
    assert stats["datasets"]["q"]["examples_in_bm25_top20"] == sum(e["bm25_rank"] <= 20 for e in examples)
