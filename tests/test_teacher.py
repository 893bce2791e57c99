"""The cross-encoder span teacher and its distillation into the phrase model, on the planted corpus:
the joint input lines passage tokens up with the phrase model's; the teacher learns the task and
loads back; `train-phrase --teacher` adds a KL term that trains the phrase model towards it."""
import json

import numpy as np
import pytest
import torch
from loop_checks import assert_reported
from test_phrase_retriever import planted_world
from tiny_models import make_tiny_bert

from odqa.common.io import InputError
from odqa.common.settings import from_flat
from odqa.retriever.args import TeacherTrainArgs
from odqa.retriever.lm import load_tokenizer
from odqa.retriever.phrase_data import encode_passages, encode_questions
from odqa.retriever.phrase_train import PhraseTrainArgs, distill_kl
from odqa.retriever.phrase_train import train as train_phrase
from odqa.retriever.teacher import SpanTeacher, cross_inputs
from odqa.retriever.teacher_train import train as train_teacher


@pytest.fixture(scope="module")
def taught(tmp_path_factory):
    root = tmp_path_factory.mktemp("teacher")
    corpus, born, encoder = planted_world(root)
    result = train_teacher(from_flat(TeacherTrainArgs, dict(
        train_file=str(root / "sup" / "train.jsonl"), validation_file=str(root / "sup" / "validation.jsonl"),
        out_dir=str(root / "teacher"), encoder=str(encoder), epochs=25, batch_size=4, lr=2e-3,
        max_passage_tokens=64, max_question_tokens=16, report_to="tensorboard")))
    return {"root": root, "encoder": encoder, "teacher": root / "teacher" / "best", "result": result}


def test_training_reports_to_tensorboard(taught):
    assert_reported(taught["root"] / "teacher", "em")


def test_the_joint_input_puts_each_passage_token_where_its_position_says(taught):
    tok = load_tokenizer(taught["encoder"])
    questions = encode_questions(tok, ["where was bob born", "where was alice born ."], 16)
    passages = encode_passages(tok, ["bob", "alice"], ["bob was born in rome .", "the river ran . alice was born"], 64)
    joint = cross_inputs(questions, passages.batch)
    for b in range(2):
        q = int(questions["attention_mask"][b].sum())
        assert joint["input_ids"][b, :q].tolist() == questions["input_ids"][b, :q].tolist()
        assert joint["token_type_ids"][b, :q].tolist() == [0] * q
        real = passages.batch["attention_mask"][b].bool()
        real[0] = False                                    # the passage's [CLS] maps to the joint one
        pos = joint["position"][b][real]
        assert joint["input_ids"][b, pos].tolist() == passages.batch["input_ids"][b][real].tolist()
        assert joint["token_type_ids"][b, pos].tolist() == [1] * len(pos)
        assert int(joint["attention_mask"][b].sum()) == q + int(real.sum())


def test_the_teacher_learns_the_task_and_loads_back(taught, tmp_path):
    assert taught["result"]["best_em"] >= 75.0
    tok = load_tokenizer(taught["teacher"])
    questions = encode_questions(tok, ["where was bob born"], 16)
    passages = encode_passages(tok, ["bob"], ["bob was born in rome ."], 64)
    a = SpanTeacher.from_pretrained(taught["teacher"]).eval()
    a.save_pretrained(tmp_path / "again", tok)
    b = SpanTeacher.from_pretrained(tmp_path / "again").eval()
    with torch.no_grad():
        for x, y in zip(a(questions, passages.batch), b(questions, passages.batch)):
            assert torch.equal(x, y)
    with pytest.raises(InputError, match="not a span-teacher checkpoint"):
        SpanTeacher.from_pretrained(taught["encoder"])


def test_distill_kl_is_zero_only_where_the_student_matches_the_teacher():
    allowed = torch.tensor([[False, True, True, True, False]])
    teacher = torch.tensor([[9.0, 2.0, 0.0, -1.0, 9.0]])
    assert float(distill_kl(teacher + 3.0, teacher, allowed)) == pytest.approx(0.0, abs=1e-6)
    # Tokens outside `allowed` do not count, whatever their scores.
    assert float(distill_kl(teacher * torch.tensor([[0.0, 1, 1, 1, -5]]), teacher, allowed)) == pytest.approx(0.0, abs=1e-6)
    student = torch.zeros(1, 5, requires_grad=True)
    kl = distill_kl(student, teacher, allowed)
    kl.backward()
    assert kl.item() > 0.1 and student.grad[0, 1] < 0 < student.grad[0, 3]


def test_distillation_pulls_the_phrase_model_towards_the_teacher(taught, tmp_path):
    root = taught["root"]

    def run(out, teacher, coef=1.0):
        train_phrase(from_flat(PhraseTrainArgs, dict(
            train_file=str(root / "sup" / "train.jsonl"), validation_file=str(root / "sup" / "validation.jsonl"),
            out_dir=str(out), encoder=str(taught["encoder"]), epochs=6, batch_size=4, lr=2e-3, pre_batch=0,
            max_passage_tokens=64, max_question_tokens=16, teacher=teacher, distill_coef=coef, log_steps=1)))
        history = json.loads((out / "checkpoint" / "trainer_state.json").read_text())["history"]
        return [h.get("start_distill", np.nan) + h.get("end_distill", np.nan) for h in history]

    assert np.isnan(run(tmp_path / "plain", None)).all()
    # With weight 0 the KL is only measured: the gold spans alone bring the two models part of the way.
    measured = run(tmp_path / "measured", str(taught["teacher"]), coef=0.0)
    distilled = run(tmp_path / "distilled", str(taught["teacher"]))
    assert measured[0] == pytest.approx(distilled[0])
    assert np.mean(distilled[-3:]) < 0.5 * np.mean(measured[-3:])


def test_a_teacher_with_another_vocabulary_is_refused(taught, tmp_path):
    other = make_tiny_bert(tmp_path / "other", ["an entirely different vocabulary"])
    root = taught["root"]
    with pytest.raises(InputError, match="vocabulary"):
        train_phrase(from_flat(PhraseTrainArgs, dict(
            train_file=str(root / "sup" / "train.jsonl"), validation_file=str(root / "sup" / "validation.jsonl"),
            out_dir=str(tmp_path / "m"), encoder=str(other), epochs=1, batch_size=4,
            max_passage_tokens=64, max_question_tokens=16, teacher=str(taught["teacher"]))))


def test_a_joint_input_longer_than_the_teachers_positions_is_refused(taught):
    tok = load_tokenizer(taught["teacher"])
    teacher = SpanTeacher.from_pretrained(taught["teacher"])       # the tiny BERT has 128 positions
    questions = encode_questions(tok, ["where was bob born " * 8], 40)
    passages = encode_passages(tok, ["bob"], ["bob was born in rome . " * 30], 120)
    with pytest.raises(InputError, match="more than the teacher's 128 positions"):
        teacher(questions, passages.batch)
