"""Dense phrase retrieval on a planted corpus with a tiny BERT made in the test: training lowers the
loss; dump -> index -> search finds the planted answer span; Eq. 3 aggregation; shards; resume; refusals."""
import json
import os
import random
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from loop_checks import (
    assert_reported,
    assert_same_training,
    assert_two_processes_train_as_one_with_twice_the_accumulation,
    assert_zero3_trains_like_zero2,
    losses,
    tensorboard_scalars,
    without_dropout,
)
from search_helpers import index_of, searcher_of
from tiny_data import write_jsonl
from tiny_models import make_tiny_bert

from odqa.common.corpus import build_corpus
from odqa.common.io import InputError
from odqa.common.metrics.answers import echoes_at_edge, is_echo
from odqa.common.settings import from_flat, updated
from odqa.retriever import phrase_dump
from odqa.retriever.args import FilterArgs, PhraseModelConfig
from odqa.retriever.phrase_dump import dump_phrases
from odqa.retriever.phrase_index import PhraseIndex
from odqa.retriever.phrase_model import LMS, DensePhraseModel
from odqa.retriever.phrase_search import can_answer
from odqa.retriever.phrase_train import PhraseTrainArgs, train
from odqa.retriever.query_train import QueryTrainArgs, train_query
from odqa.retriever.searcher import Searcher
from odqa.retriever.supervise import supervise

NAMES = ["alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi", "ivan", "judy", "mallory", "oscar"]
CITIES = ["paris", "rome", "oslo", "lima", "cairo", "delhi", "tokyo", "quito", "accra", "hanoi", "riga", "sofia"]
FILLER = "the weather was mild and the river ran slowly past old mills and quiet farms".split()


def planted_world(root):
    """One passage per person, 'NAME was born in CITY', among filler; questions 'where was NAME born'."""
    rng = random.Random(0)
    born = dict(zip(NAMES, rng.sample(CITIES, len(CITIES))))
    passages = []
    for i, (name, city) in enumerate(born.items()):
        before = " ".join(rng.choice(FILLER) for _ in range(rng.randint(1, 4)))
        after = " ".join(rng.choice(FILLER) for _ in range(rng.randint(1, 4)))
        passages.append({"id": f"p{i}", "title": name, "text": f"{before} . {name} was born in {city} . {after} ."})
    corpus = root / "corpus"
    build_corpus([write_jsonl(root / "passages.jsonl", passages)], corpus)
    questions = [{"id": n, "question": f"where was {n} born", "answers": [c]} for n, c in born.items()]
    write_jsonl(root / "questions.jsonl", questions)
    supervise([str(root / "questions.jsonl")], corpus, root / "sup", validation_percent=0)
    shutil.copy(root / "sup" / "train.jsonl", root / "sup" / "validation.jsonl")
    encoder = make_tiny_bert(root / "bert", [p["text"] + " " + p["title"] for p in passages]
                             + [q["question"] for q in questions])
    return corpus, born, encoder


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("phrase")
    corpus, born, encoder = planted_world(root)
    result = train(from_flat(PhraseTrainArgs, dict(train_file=str(root / "sup" / "train.jsonl"),
                                   validation_file=str(root / "sup" / "validation.jsonl"),
                                   out_dir=str(root / "model"), encoder=str(encoder), epochs=25, batch_size=4,
                                   lr=2e-3, pre_batch_warmup=10, max_passage_tokens=64, max_question_tokens=16,
                                   report_to="tensorboard")))
    return {"root": root, "corpus": corpus, "born": born, "encoder": encoder, "model": root / "model" / "best",
            "result": result}


@pytest.fixture(scope="module")
def index(world):
    dump_phrases(world["model"], world["corpus"], world["root"] / "dump", chunk_passages=5)
    index_of(world["root"] / "dump", world["root"] / "index", world["corpus"])
    return world["root"] / "index"


def test_in_batch_and_pre_batch_losses_match_a_hand_computation():
    import torch

    from odqa.retriever.phrase_train import PhraseLoss

    class Fixed(torch.nn.Module):
        """Question and token vectors given directly, to check the loss arithmetic."""
        def __init__(self, q, h):
            super().__init__()
            self.q, self.h = q, h

        def forward(self, questions, passages, negatives=None):
            return {"q_start": self.q, "q_end": self.q, "h_start": self.h, "h_end": self.h,
                    "filter": torch.zeros(*self.h.shape[:2], 2)}

    torch.manual_seed(0)
    B, T, d = 3, 5, 4
    q, h = torch.randn(B, d), torch.randn(B, T, d)
    gold = torch.zeros(B, T, dtype=torch.bool)
    gold[0, 1] = gold[1, 2] = gold[2, 0] = gold[2, 3] = True
    batch = {"questions": {}, "passages": {}, "candidate": torch.ones(B, T, dtype=torch.bool),
             "gold_start": gold, "gold_end": gold}
    loss_fn = PhraseLoss(from_flat(PhraseTrainArgs, dict(train_file="", validation_file="", out_dir="", encoder="", pre_batch=1, pre_batch_warmup=1, filter_coef=0.0)))
    _, parts = loss_fn(Fixed(q, h), batch, step=0)
    scores = torch.einsum("bd,btd->bt", q, h)
    single = torch.stack([torch.logsumexp(scores[b], 0) - torch.logsumexp(scores[b][gold[b]], 0) for b in range(B)]).mean()
    g = torch.stack([h[0, 1], h[1, 2], h[2, 0]])              # the first gold token of each passage
    in_batch = torch.nn.functional.cross_entropy(q @ g.T, torch.arange(B))
    assert parts["start_single"] == pytest.approx(single.item(), rel=1e-5)
    assert parts["start_neg"] == pytest.approx(in_batch.item(), rel=1e-5)
    # The next batch (past the warm-up) also sees the previous batch's gold vectors as negatives.
    q2, h2 = torch.randn(B, d), torch.randn(B, T, d)
    _, parts2 = loss_fn(Fixed(q2, h2), batch, step=1)
    g2 = torch.stack([h2[0, 1], h2[1, 2], h2[2, 0]])
    expected = torch.nn.functional.cross_entropy(q2 @ torch.cat([g2, g]).T, torch.arange(B))
    assert parts2["start_neg"] == pytest.approx(expected.item(), rel=1e-5)


def test_training_reports_to_tensorboard(world):
    assert_reported(world["root"] / "model", "em")


def test_training_lowers_the_loss_and_learns_the_task(world):
    state = json.loads((world["root"] / "model" / "checkpoint" / "trainer_state.json").read_text())
    losses = [h["loss"] for h in state["history"]]
    assert np.mean(losses[-5:]) < 0.5 * np.mean(losses[:5])
    assert world["result"]["best_em"] >= 75.0


def test_dump_index_search_returns_the_planted_span(world, tmp_path):
    """One passage holds a birthplace among passages that hold none: the index must give back its span."""
    rows = [{"id": "planted", "title": "alice", "text": "the river ran slowly . alice was born in tokyo . old mills ."}]
    rows += [{"id": f"d{i}", "title": "farms", "text": " ".join(random.Random(i).choices(FILLER, k=12)) + " ."}
             for i in range(8)]
    corpus = tmp_path / "corpus"
    build_corpus([write_jsonl(tmp_path / "p.jsonl", rows)], corpus)
    dump_phrases(world["model"], corpus, tmp_path / "dump", chunk_passages=4)
    index_of(tmp_path / "dump", tmp_path / "index", corpus)
    searcher = searcher_of(tmp_path / "index", world["model"], corpus)
    (result,) = searcher.search(["where was alice born"], k=3, unit="passage")
    top = result.phrases[0]
    assert top.text == "tokyo" and top.passage_id == "planted"
    assert rows[0]["text"][top.char_start:top.char_end] == "tokyo"
    assert result.hits[0].unit.id == "planted"


def passage_side(searcher):
    """The searcher's phrase model whole, in its dtype: a searcher loads only the question side."""
    from odqa.retriever.phrase_model import DensePhraseModel
    a = searcher.artifacts
    return DensePhraseModel.from_pretrained(a.model_dir).to(a.model.q_start_lm.dtype).eval()


def brute_force_top_phrase(searcher, question, max_len=None):
    """Every span (i, j), i <= j < i + L, of every passage, scored with the model directly."""
    import torch

    from odqa.retriever.phrase_data import encode_passages
    from odqa.retriever.phrase_train import best_spans
    q_start, q_end = searcher.encode([question])
    best = None
    passages = list(searcher.artifacts.store)
    enc = encode_passages(searcher.artifacts.tokenizer, [p["title"] for p in passages], [p["text"] for p in passages],
                          searcher.artifacts.model.config.max_passage_tokens)
    with torch.no_grad():
        hs, he, _ = passage_side(searcher).encode_passages(**enc.batch)
    s = torch.einsum("d,btd->bt", torch.from_numpy(q_start[0]), hs)
    e = torch.einsum("d,btd->bt", torch.from_numpy(q_end[0]), he)
    for row, (i, j, score) in enumerate(best_spans(s, e, enc.candidate, max_len or searcher.artifacts.model.config.max_span_len)):
        if best is None or score > best[0]:
            best = (score, row, int(enc.offsets[row, i, 0]), int(enc.offsets[row, j, 1]))
    return best


def test_search_equals_brute_force_over_every_span(world, index):
    searcher = searcher_of(index, world["model"], world["corpus"])
    for name in NAMES[:6]:
        question = f"where was {name} born"
        score, row, start, end = brute_force_top_phrase(searcher, question)
        top = searcher.search([question], k=1, unit="phrase")[0].phrases[0]
        assert (top.passage_id, top.char_start, top.char_end) == (searcher.artifacts.store[row]["id"], start, end)
        assert top.score == pytest.approx(score, rel=1e-2)  # the dump stores float16


def test_a_bfloat16_search_finds_what_a_float32_search_finds(world, index, monkeypatch):
    import torch
    questions = [f"where was {name} born" for name in NAMES]
    exact = searcher_of(index, world["model"], world["corpus"]).search(questions, k=3, unit="passage")
    monkeypatch.setenv("ODQA_SEARCH_DTYPE", "bfloat16")
    searcher = searcher_of(index, world["model"], world["corpus"])
    assert searcher.artifacts.model.q_start_lm.dtype == torch.bfloat16
    for a, b in zip(exact, searcher.search(questions, k=3, unit="passage")):
        assert a.hits[0].row == b.hits[0].row
        assert [h.score for h in a.hits] == pytest.approx([h.score for h in b.hits], rel=0.05)


def test_search_dtype_is_bfloat16_only_where_the_hardware_has_it(monkeypatch):
    import torch

    from odqa.common import device
    monkeypatch.setenv("ODQA_SEARCH_DTYPE", "auto")
    for has, want in ((True, torch.bfloat16), (False, torch.float32)):
        monkeypatch.setattr(device, "cpu_has_bf16", lambda: has)
        assert device.search_dtype("cpu") == want
    # a GPU before Ampere (a V100) makes bfloat16 tensors but emulates their arithmetic: float32 there
    for native, want in ((True, torch.bfloat16), (False, torch.float32)):
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True, n=native: n or including_emulation)
        assert device.search_dtype("cuda") == want
    monkeypatch.setenv("ODQA_SEARCH_DTYPE", "float32")
    assert device.search_dtype("cpu") == torch.float32
    monkeypatch.setenv("ODQA_SEARCH_DTYPE", "half")
    with pytest.raises(InputError, match="ODQA_SEARCH_DTYPE"):
        device.search_dtype("cpu")


def test_a_shorter_answer_cap_returns_the_best_span_that_short(world, index):
    full = searcher_of(index, world["model"], world["corpus"], max_answer_tokens=None)   # None: the index's L
    assert full.phrases.max_len == 20
    assert searcher_of(index, world["model"], world["corpus"], max_answer_tokens=50).phrases.max_len == 20
    tokens = full.artifacts.index.meta["token"].astype(np.int32)
    for cap in (1, 3):
        searcher = searcher_of(index, world["model"], world["corpus"], max_answer_tokens=cap)
        q_start, q_end = searcher.encode(["where was bob born"])
        phrases = searcher.phrases.mips(q_start, q_end, k=10_000)[0]
        assert len(phrases) and (tokens[phrases.end_vec] - tokens[phrases.start_vec] < cap).all()
        for name in NAMES[:3]:
            score, row, start, end = brute_force_top_phrase(searcher, f"where was {name} born", max_len=cap)
            top = searcher.search([f"where was {name} born"], k=1, unit="phrase")[0].phrases[0]
            assert (top.passage_id, top.char_start, top.char_end) == (searcher.artifacts.store[row]["id"], start, end)
    with pytest.raises(InputError, match="max-answer-tokens"):
        searcher_of(index, world["model"], world["corpus"], max_answer_tokens=0)


def test_token_offsets_stay_narrow_and_every_span_reads_forwards(world, index):
    """The index holds its token and character offsets unsigned, as narrow as stored (a quarter or half
    of int32's bytes), and the spans read from them still run forwards within the cap."""
    searcher = searcher_of(index, world["model"], world["corpus"], max_answer_tokens=4)
    meta = searcher.artifacts.index.meta
    assert all(meta[k].dtype.kind == "u" and meta[k].dtype.itemsize < 4 for k in ("token", "char_start", "char_end"))
    assert not meta["in_title"].any() and meta["in_title"].strides == (0,)   # no title phrases: one False, not n
    rows = list(range(len(searcher.artifacts.store)))
    tokens = meta["token"].astype(np.int64)
    for name in NAMES[:4]:
        question = f"where was {name} born"
        q_start, q_end = searcher.encode([question])
        found = searcher.phrases.best_spans(rows, q_start[0], q_end[0], question)
        assert any(found)
        for span in found:
            if span is None:
                continue
            _, start_vec, end_vec, _, char_start, char_end, _ = span
            assert 0 <= tokens[end_vec] - tokens[start_vec] < 4
            assert char_start < char_end


def hit(score, text):
    """A passage of a search, its phrase `text`."""
    from odqa.common.results import Passage, Phrase
    from odqa.retriever.results import Hit
    phrase = Phrase(text=text, score=score, passage_id=f"p{score}", char_start=0, char_end=len(text)) if text else None
    return Hit(Passage(id=f"p{score}", title="", text=text or "", score=score, phrase=phrase), 0)


def test_the_answer_is_the_phrase_string_the_top_passages_vote_for():
    from odqa.retriever.answer_aggregation import aggregate_answer
    units = [hit(3.0, "Osaka"), hit(2.8, "the Tokyo"), hit(2.7, "tokyo"), hit(-5.0, "Kyoto")]
    answer = aggregate_answer(units, depth=25, temperature=1.0)
    # "the Tokyo" and "tokyo" are one string for exact match: two votes outweigh Osaka's one
    assert answer.text == "the Tokyo" and answer.passage_id == "p2.8"
    w = np.exp(np.array([0.0, -0.2, -0.3, -8.0]))
    assert answer.support == pytest.approx((w[1] + w[2]) / w.sum())
    # one voter, or a temperature near 0, gives the first passage's phrase; two voters, the better one
    assert [aggregate_answer(units, d, t).text for d, t in ((1, 1.0), (25, 0.05), (2, 1.0))] == ["Osaka"] * 3
    assert aggregate_answer([hit(1.0, "b c"), hit(1.0, "a")], 5, 1.0).text == "b c"   # a tie: the higher-ranked
    assert aggregate_answer([hit(1.0, None)], 5, 1.0) is None
    for depth, temperature in ((0, 1.0), (5, 0.0)):
        with pytest.raises(ValueError, match="must be positive"):
            aggregate_answer(units, depth, temperature)


def test_the_searcher_votes_over_its_answer_depth_whatever_k(world, index):

    from odqa.retriever.answer_aggregation import aggregate_answer
    questions = [f"where was {name} born" for name in NAMES[:4]]
    searcher = searcher_of(index, world["model"], world["corpus"], answer_depth=5, answer_temperature=2.0)
    for one, five in zip(searcher.search(questions, k=1), searcher.search(questions, k=5)):
        assert len(one.hits) == 1 and len(five.hits) == 5
        assert one.answer == five.answer == aggregate_answer(five.hits, 5, 2.0)
        assert one.extractive is one.answer
    first = searcher_of(index, world["model"], world["corpus"], answer_depth=1)
    for r in first.search(questions, k=3):
        assert r.extractive == replace(r.hits[0].phrase, support=1.0)
    phrases = first.search(questions[:1], k=3, unit="phrase")[0]
    assert phrases.answer is None and phrases.extractive == phrases.phrases[0]
    for bad in ({"answer_depth": 0}, {"answer_temperature": 0.0}):
        with pytest.raises(InputError, match="answer-depth|answer-temperature"):
            searcher_of(index, world["model"], world["corpus"], **bad)


def test_the_answer_flags_are_refused_below_one_and_zero(world, index, tmp_path, capsys):
    from odqa.system.cli import main
    root = world["root"]
    base = ["retrieve", "--retriever", "phrase", "--index", str(index), "--model", str(world["model"]),
            "--questions", str(root / "questions.jsonl"), "--corpus", str(world["corpus"]), "--k", "2"]
    for flag, said in (("--answer-depth", "must be at least 1"), ("--answer-temperature", "must be above 0")):
        with pytest.raises(SystemExit) as refused:
            main([*base, flag, "0", "--out", str(tmp_path / "a.json")])
        assert refused.value.code == 2 and f"{flag}: {said}" in capsys.readouterr().err
    out = tmp_path / "first.json"
    assert main(["-q", *base, "--answer-depth", "1", "--out", str(out)]) == 0
    assert all(e["prediction"] == e["ctxs"][0]["phrase"]["text"] for e in json.loads(out.read_text()))


def test_is_echo_reads_words_after_squad_normalisation():
    question = "The city of Belgrade lies at the confluence of the River Sava and which other river?"
    assert is_echo("the Sava", question) and is_echo("River, Sava", question) and is_echo("the", question)
    assert is_echo("", question) and is_echo(" . ", question)
    assert not is_echo("the Danube", question) and not is_echo("Sava and Danube", question)
    text = "The urinary bladder sits on the pelvic floor."
    at = lambda span: (text.index(span), text.index(span) + len(span))  # noqa: E731
    assert can_answer(text, *at("pelvic floor"), "where is the bladder")
    assert can_answer(text, *at("pelvic floor."), "where is the bladder")
    assert not can_answer(text, *at("ur"), "where is the bladder")            # a word piece
    assert not can_answer(text, *at("inary bladder"), "where is the bladder")
    assert not can_answer(text, *at("bladder"), "where is the bladder")       # an echo
    text = 'Lithium (Li) is in "salt" beds.'
    assert can_answer(text, *at("Lithium (Li)"), "what metal") and can_answer(text, *at('"salt"'), "what metal")
    assert not can_answer(text, *at("Lithium (Li"), "what metal")            # cuts through brackets
    assert not can_answer(text, *at('salt" beds'), "what metal")             # and through quotes
    text = "Delhi lies on the Yamuna river, on the Yamuna's west bank."
    question = "delhi is on the banks of which river"
    assert echoes_at_edge("Yamuna river", question) and echoes_at_edge("River: the Yamuna", question)
    assert echoes_at_edge("Delhi", question) and echoes_at_edge(" . ", question)        # echoes are too
    assert not echoes_at_edge("the Yamuna", question) and not echoes_at_edge("Yamuna river basin", question)
    assert not can_answer(text, *at("Yamuna river"), question)                # the question's word at its end
    assert not can_answer(text, *at("on the Yamuna"), question)               # and at its start
    assert can_answer(text, *at("the Yamuna"), question)


def test_a_title_longer_than_the_input_is_cut_and_the_text_kept_as_far_as_it_fits(tmp_path):
    """DHR title paths ("title, section, subsection") can outgrow a short passage budget; the tokenizer
    refused the whole batch when told to cut only the text."""
    from transformers import AutoTokenizer

    from odqa.retriever.phrase_data import encode_passages
    title, text = " ".join(["the long section title"] * 30), "bob was born in rome ."
    tokenizer = AutoTokenizer.from_pretrained(make_tiny_bert(tmp_path / "bert", [title, text]))
    long_title = encode_passages(tokenizer, [title, "bob"], [text, text], 32, title_phrases=True)
    assert long_title.batch["input_ids"].shape[1] == 32
    assert long_title.candidate[0].any() and long_title.in_title[0].sum() < 30
    # a short title is never cut, the text is cut from its end, and offsets stay in their segment
    short = encode_passages(tokenizer, ["bob"], [" ".join([text] * 20)], 32)
    assert short.in_title[0].sum() == 1 and short.batch["input_ids"].shape[1] == 32
    assert short.offsets[0][short.candidate[0]][:3].tolist() == [[0, 3], [4, 7], [8, 12]]


def passage_spans_best_first(searcher, question, row):
    """Every span (i, j), i <= j < i + L, of passage `row`, scored with the model directly, best first,
    as (char_start, char_end)."""
    import torch

    from odqa.retriever.phrase_data import encode_passages
    q_start, q_end = searcher.encode([question])
    p = searcher.artifacts.store[row]
    enc = encode_passages(searcher.artifacts.tokenizer, [p["title"]], [p["text"]], searcher.artifacts.model.config.max_passage_tokens)
    with torch.no_grad():
        hs, he, _ = passage_side(searcher).encode_passages(**enc.batch)
    s = hs[0] @ torch.from_numpy(q_start[0])
    e = he[0] @ torch.from_numpy(q_end[0])
    cand = enc.candidate[0].nonzero().ravel().tolist()
    L = searcher.phrases.max_len
    spans = [(float(s[i] + e[j]), int(enc.offsets[0, i, 0]), int(enc.offsets[0, j, 1]))
             for i in cand for j in cand if 0 <= j - i < L]
    return [(a, b) for _, a, b in sorted(spans, key=lambda x: -x[0])], p["text"]


class EchoSearcher(Searcher):
    """Encodes "QUESTION | WORDS" as QUESTION alone, while the echo test reads it all: the tiny encoder
    knows its one question form, and WORDS make spans echoes without moving the question's vectors."""

    def encode(self, questions):
        return super().encode([q.split(" | ")[0] for q in questions])


def echo_searcher(index, world, **settings) -> EchoSearcher:
    s = searcher_of(index, world["model"], world["corpus"], **settings)
    return EchoSearcher(s.artifacts, s.config)


def test_each_passage_shows_its_best_phrase_that_is_not_a_question_echo(world, index):
    """A passage whose best phrase is an echo shows its best span that can answer (over every span, as
    brute force finds it); passages, their order and scores do not change; answer_filter=False shows
    the echo."""
    plain = echo_searcher(index, world, answer_filter=False)
    skip = echo_searcher(index, world)
    texts = {p["id"]: p["text"] for p in skip.artifacts.store}
    replaced = 0
    for name in NAMES[:6]:
        base = f"where was {name} born"
        question = f"{base} | {plain.search([base], k=1, unit='passage')[0].hits[0].phrase.text}"
        before, after = (s.search([question], k=3, unit="passage")[0].hits for s in (plain, skip))
        assert [(h.row, h.score) for h in before] == [(h.row, h.score) for h in after]
        for b, a in zip(before, after):
            passage = skip.artifacts.store[a.row]["text"]
            assert can_answer(passage, a.phrase.char_start, a.phrase.char_end, question)
            if can_answer(passage, b.phrase.char_start, b.phrase.char_end, question):
                assert a.phrase == b.phrase
                continue
            replaced += 1
            spans, text = passage_spans_best_first(skip, base, a.row)
            best = next(x for x in spans if can_answer(text, *x, question))
            assert (a.phrase.char_start, a.phrase.char_end) == best
        every = plain.search([question], k=40, unit="phrase")[0].phrases
        kept = skip.search([question], k=40, unit="phrase")[0].phrases
        expected = [p for p in every if can_answer(texts[p.passage_id], p.char_start, p.char_end, question)]
        assert len(expected) < len(every)
        assert len(kept) == 40 and kept[:len(expected)] == expected
    assert replaced >= 6   # at least the first passage's phrase, an echo now


def test_passage_and_document_scores_are_the_max_of_their_phrases(world, index):
    searcher = searcher_of(index, world["model"], world["corpus"])
    q_start, q_end = searcher.encode(["where was alice born"])
    all_phrases = searcher.phrases.mips(q_start, q_end, k=10_000)[0]
    result = searcher.search(["where was alice born"], k=4, unit="passage")[0]
    assert len(result.hits) == 4
    scores = [h.score for h in result.hits]
    assert scores == sorted(scores, reverse=True)
    for h in result.hits:
        assert h.score == pytest.approx(all_phrases.score[all_phrases.row == h.row].max(), rel=1e-5)
    docs = searcher.search(["where was alice born"], k=2, unit="document")[0].hits
    assert docs[0].score == pytest.approx(scores[0], rel=1e-5)
    rows, s = searcher.search_passages(["where was alice born"], k=4)
    assert list(rows[0]) == [h.row for h in result.hits]


def test_sharded_dumps_equal_an_unsharded_one(world, index):
    root = world["root"]
    for k in (1, 2, 3):
        dump_phrases(world["model"], world["corpus"], root / "dump3", shard=f"{k}/3", chunk_passages=5)
    index_of(root / "dump3", root / "index3", world["corpus"])
    a, b = np.load(index / "meta.npz"), np.load(root / "index3" / "meta.npz")
    assert all(np.array_equal(a[k], b[k]) for k in a.files)
    ids = np.arange(a["token"].shape[0])
    v1 = searcher_of(index, world["model"], world["corpus"]).artifacts.index.vectors("end", ids)
    v3 = searcher_of(root / "index3", world["model"], world["corpus"]).artifacts.index.vectors("end", ids)
    assert np.array_equal(v1, v3)


def test_an_interrupted_dump_resumes(world, index, monkeypatch):
    root = world["root"]
    real_savez, calls = np.savez, {"n": 0}

    def crash_on_second_chunk(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt("interrupted")
        return real_savez(*args, **kwargs)

    monkeypatch.setattr(phrase_dump.np, "savez", crash_on_second_chunk)
    with pytest.raises(KeyboardInterrupt):
        dump_phrases(world["model"], world["corpus"], root / "dump_r", chunk_passages=5)
    shard = next((root / "dump_r").glob("shard-*"))
    assert sorted(p.name for p in shard.glob("chunk-*")) == ["chunk-00000.npz"]   # no half-written chunk
    assert not (shard / "done.json").exists()
    monkeypatch.setattr(phrase_dump.np, "savez", real_savez)
    summary = dump_phrases(world["model"], world["corpus"], root / "dump_r", chunk_passages=5)
    assert summary["chunks"] == 3
    index_of(root / "dump_r", root / "index_r", world["corpus"])
    a, b = np.load(index / "meta.npz"), np.load(root / "index_r" / "meta.npz")
    assert all(np.array_equal(a[k], b[k]) for k in a.files)
    s1, s2 = searcher_of(index, world["model"], world["corpus"]), searcher_of(root / "index_r", world["model"], world["corpus"])
    ids = np.arange(s1.artifacts.index.manifest["vectors"])
    assert np.array_equal(s1.artifacts.index.vectors("start", ids), s2.artifacts.index.vectors("start", ids))


def test_corrupt_or_mismatched_index_is_refused(world, index, tmp_path):
    other = tmp_path / "other_model"
    DensePhraseModel(PhraseModelConfig(encoder=str(world["encoder"]))).save_pretrained(other)
    with pytest.raises(InputError, match=r"another phrase encoder .*odqa build-index"):
        searcher_of(index, other, world["corpus"])
    broken = tmp_path / "broken"
    shutil.copytree(index, broken)
    meta = dict(np.load(broken / "meta.npz"))
    meta["token"] = meta["token"][:-1]
    np.savez(broken / "meta.npz", **meta)
    with pytest.raises(InputError, match="corrupt phrase index"):
        searcher_of(broken, world["model"], world["corpus"])
    (broken / "end.faiss").write_bytes(b"not an index")
    with pytest.raises(InputError, match="corrupt phrase index"):
        searcher_of(broken, world["model"], world["corpus"])
    with pytest.raises(InputError, match="not a phrase index"):
        searcher_of(tmp_path, world["model"], world["corpus"])
    with pytest.raises(InputError, match="incomplete|not complete"):
        dump_dir = tmp_path / "dump"
        (dump_dir / "shard-001-of-001").mkdir(parents=True)
        index_of(dump_dir, tmp_path / "ix", world["corpus"])


def test_a_linear_head_starts_with_the_split_heads_scores(world):
    """Two d x d heads, started as the split padded with zeros: every phrase and question scores as
    the paper's split model does, until training moves them."""
    import torch
    split = DensePhraseModel(PhraseModelConfig(encoder=str(world["encoder"]), head="split")).eval()
    linear = DensePhraseModel(PhraseModelConfig(encoder=str(world["encoder"]), head="linear"),
                              lms={n: getattr(split, n) for n in LMS}).eval()
    torch.manual_seed(0)
    vocab = split.phrase_lm.config.vocab_size
    passages = {"input_ids": torch.randint(5, vocab, (2, 12)), "attention_mask": torch.ones(2, 12, dtype=torch.long)}
    questions = {"input_ids": torch.randint(5, vocab, (3, 6)), "attention_mask": torch.ones(3, 6, dtype=torch.long)}
    with torch.no_grad():
        scores = []
        for m in (split, linear):
            hs, he, _ = m.encode_passages(**passages)
            qs, qe = m.encode_questions(**questions)
            scores.append((torch.einsum("qd,btd->qbt", qs, hs), torch.einsum("qd,btd->qbt", qe, he)))
    assert linear.dim == 2 * split.dim
    for a, b in zip(*scores):
        torch.testing.assert_close(a, b)
    assert not torch.equal(scores[0][0], scores[0][1])   # start and end scores differ: the halves are apart


@pytest.mark.parametrize("head, qenc, unified", [("linear", "shared", False), ("split", "dual", True)])
def test_model_options_train(world, tmp_path, head, qenc, unified):
    root = world["root"]
    train(from_flat(PhraseTrainArgs, dict(train_file=str(root / "sup" / "train.jsonl"), validation_file=str(root / "sup" / "validation.jsonl"),
                          out_dir=str(tmp_path / "m"), encoder=str(world["encoder"]), head=head, question_encoder=qenc,
                          unified=unified, epochs=6, batch_size=4, lr=2e-3, pre_batch_warmup=4,
                          max_passage_tokens=64, max_question_tokens=16)))
    state = json.loads((tmp_path / "m" / "checkpoint" / "trainer_state.json").read_text())
    losses = [h["loss"] for h in state["history"]]
    assert np.mean(losses[-3:]) < np.mean(losses[:3])
    model = DensePhraseModel.from_pretrained(tmp_path / "m" / "best")
    assert model.config.head == head and model.config.question_encoder == qenc
    assert (model.q_end_lm is None) == (qenc == "shared")


def test_the_query_loss_adds_the_weighted_passage_term_to_the_phrase_term():
    import torch

    from odqa.retriever.query_train import query_loss

    class Fixed(torch.nn.Module):
        def __init__(self, q):
            super().__init__()
            self.q = q

        def forward(self, questions):
            return {"q_start": self.q, "q_end": self.q}

    torch.manual_seed(0)
    d, n = 4, 6
    q = torch.randn(2, d)
    start, end = [torch.randn(n, d) for _ in range(2)], [torch.randn(n, d) for _ in range(2)]
    pos = [torch.tensor([0, 1, 0, 0, 0, 0], dtype=torch.bool), torch.tensor([0, 0, 0, 0, 0, 1], dtype=torch.bool)]
    ppos = [torch.tensor([1, 1, 1, 0, 0, 0], dtype=torch.bool), torch.tensor([0, 0, 0, 0, 1, 1], dtype=torch.bool)]
    batch = {"questions": {}, "start": start, "end": end, "positive": pos, "passage_positive": ppos}

    def term(b, mask):
        s = q[b] @ start[b].T + q[b] @ end[b].T
        return torch.logsumexp(s, 0) - torch.logsumexp(s[mask], 0)

    loss, _ = query_loss(Fixed(q), batch, step=0, passage_weight=0.5)
    expected = (term(0, pos[0]) + 0.5 * term(0, ppos[0]) + term(1, pos[1]) + 0.5 * term(1, ppos[1])) / 2
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    plain, _ = query_loss(Fixed(q), batch, step=0)
    assert plain.item() == pytest.approx((term(0, pos[0]) + term(1, pos[1])).item() / 2, rel=1e-5)
    with pytest.raises(InputError, match="--passage-weight: must be at least 0, not -0.5"):
        from_flat(QueryTrainArgs, dict(model="m", index="i", corpus="c", out_dir="o", passage_weight=-0.5))


@pytest.mark.parametrize("factory, label, passage_weight", [("Flat", "phrase", 0.0), ("IVF2,SQ8", "document", 0.0),
                                                            ("Flat", "phrase", 1.0)])
def test_query_side_fine_tuning_raises_the_gold_phrase(world, index, tmp_path, factory, label, passage_weight):
    from odqa.retriever.query_train import QueryTrainArgs, train_query
    root = world["root"]
    index_of(root / "dump", tmp_path / "index", world["corpus"], factory=factory)
    questions = write_jsonl(tmp_path / "q.jsonl", [{"question": f"where was {n} born", "answers": [c]}
                                                   for n, c in world["born"].items()])
    qs = [f"where was {n} born" for n in NAMES]

    def hits(model) -> int:
        """Top phrases that are positives as `label` means it: the answer itself, or a phrase of the
        person's passage (their document: one passage each)."""
        found = searcher_of(tmp_path / "index", model, world["corpus"]).search(qs, k=1, unit="phrase")
        if label == "phrase":
            return sum(r.phrases[0].text == world["born"][n] for r, n in zip(found, NAMES))
        return sum(r.phrases[0].passage_id == f"p{i}" for i, r in enumerate(found))

    hits_before = hits(world["model"])
    result = train_query(from_flat(QueryTrainArgs, dict(model=str(world["model"]), index=str(tmp_path / "index"),
                                        corpus=str(world["corpus"]), out_dir=str(tmp_path / "tuned"),
                                        questions=str(questions), label=label, top_k=30, epochs=8,
                                        batch_size=4, lr=2e-3, passage_weight=passage_weight,
                                        report_to="tensorboard")))
    assert_reported(tmp_path / "tuned", None)
    losses = [h["loss"] for h in result["history"]]
    assert losses[-1] < losses[0]
    assert hits(tmp_path / "tuned" / "last") >= hits_before   # same phrase encoder: accepted


def test_cli_train_dump_index_retrieve_evaluate(world, index, tmp_path, capsys):
    from odqa.system.cli import main
    root, corpus = world["root"], str(world["corpus"])
    assert main(["-q", "train-phrase", "--train-file", str(root / "sup" / "train.jsonl"),
                 "--validation-file", str(root / "sup" / "validation.jsonl"), "--out", str(tmp_path / "m"),
                 "--encoder", str(world["encoder"]), "--epochs", "2", "--batch-size", "4",
                 "--max-passage-tokens", "64"]) == 0
    assert "validation EM by epoch" in capsys.readouterr().out
    for k in ("1/2", "2/2"):
        assert main(["-q", "dump-phrases", "--model", str(world["model"]), "--out", str(tmp_path / "dump"),
                     "--shard", k, "--corpus", corpus, "--threshold", "-100"]) == 0
    build = ["-q", "build-index", "--dump", str(tmp_path / "dump"), "--out", str(tmp_path / "index"), "--corpus", corpus]
    assert main(build) == 2     # the default keeps 20% of tokens: it needs the phrase filter
    assert "run `odqa train-filter --dump DUMP` first" in capsys.readouterr().err
    assert main(["-q", "train-filter", "--dump", str(tmp_path / "dump"), "--train-file", str(root / "sup" / "train.jsonl"),
                 "--validation-file", str(root / "sup" / "validation.jsonl"), "--epochs", "300", "--corpus", corpus,
                 "--report-to", "tensorboard"]) == 0
    assert "| 20% |" in capsys.readouterr().out
    scalars = tensorboard_scalars(tmp_path / "dump" / "filter")   # the loss, and each share's answer recall
    assert [step for step, _ in scalars["train/loss"]] == list(range(10, 301, 10))
    recall = {row["keep"]: row["answer_recall"] for row in
              json.loads((tmp_path / "dump" / "filter" / "filter.json").read_text())["calibration"]}
    assert scalars["eval/answer_recall_keep_0.2"] == [(300, pytest.approx(recall[0.2]))]
    assert main(build) == 0
    assert "Flat index of" in capsys.readouterr().out   # tiny: too few vectors for IVF-PQ
    assert json.loads((tmp_path / "index" / "manifest.json").read_text())["keep"] == 0.2
    run = tmp_path / "run.json"
    assert main(["-q", "retrieve", "--retriever", "phrase", "--index", str(tmp_path / "index"), "--model",
                 str(world["model"]), "--questions", str(root / "questions.jsonl"), "--corpus", corpus,
                 "--k", "3", "--out", str(run)]) == 0
    entries = json.loads(run.read_text())
    assert all("prediction" in e and "phrase" in e["ctxs"][0] for e in entries)
    one_word = tmp_path / "one-word.json"
    assert main(["-q", "retrieve", "--retriever", "phrase", "--index", str(tmp_path / "index"), "--model",
                 str(world["model"]), "--questions", str(root / "questions.jsonl"), "--corpus", corpus,
                 "--k", "3", "--max-answer-tokens", "1", "--out", str(one_word)]) == 0
    assert all(len(e["prediction"].split()) == 1 for e in json.loads(one_word.read_text()))
    # Each question with its own top phrase appended: over the index of every token (where a passage has
    # other spans) the filter must show another span, and --no-answer-filter the echo.
    echoes = [{"id": e["id"], "question": f"{e['question']} {e['prediction']}", "answers": e["answers"]}
              for e in json.loads(run.read_text())]
    asked = tmp_path / "echo-questions.jsonl"
    asked.write_text("".join(json.dumps(q) + "\n" for q in echoes))
    shown = {}
    for flags in ([], ["--no-answer-filter"]):
        out = tmp_path / f"echo{len(flags)}.json"
        assert main(["-q", "retrieve", "--retriever", "phrase", "--index", str(index), "--model",
                     str(world["model"]), "--questions", str(asked), "--corpus", corpus, "--k", "3",
                     "--out", str(out), *flags]) == 0
        shown[bool(flags)] = [is_echo(e["prediction"], e["question"]) for e in json.loads(out.read_text())]
    assert not any(shown[False]) and any(shown[True])
    assert main(["-q", "eval-retrieval", str(run), "--corpus", corpus, "--topk", "1", "3"]) == 0
    header = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| run |")][0]
    assert "| extractive EM |" in header
    assert main(["retrieve", "--retriever", "phrase", "--questions", str(root / "questions.jsonl"),
                 "--out", str(run)]) == 2
    assert main(["dump-phrases", "--model", str(world["model"]), "--out", str(tmp_path / "d2"),
                 "--shard", "3/2", "--corpus", corpus]) == 2


def test_an_interrupted_training_resumes_with_the_same_losses(world, tmp_path, monkeypatch):
    from odqa.retriever import phrase_train
    root = world["root"]

    def args(out):
        # Pre-batch negatives off: their FIFO is not checkpointed (it refills within C batches).
        return from_flat(PhraseTrainArgs, dict(train_file=str(root / "sup" / "train.jsonl"), validation_file=str(root / "sup" / "validation.jsonl"),
                               out_dir=str(out), encoder=str(world["encoder"]), epochs=2, batch_size=4, lr=2e-3,
                               pre_batch=0, save_steps=3, max_passage_tokens=64, max_question_tokens=16))

    train(args(tmp_path / "straight"))
    real_validation = phrase_train.validation_em

    def interrupt(*a, **k):
        raise KeyboardInterrupt("interrupted after the step-3 checkpoint")

    monkeypatch.setattr(phrase_train, "validation_em", interrupt)
    with pytest.raises(KeyboardInterrupt):
        train(args(tmp_path / "resumed"))
    monkeypatch.setattr(phrase_train, "validation_em", real_validation)
    resumed = args(tmp_path / "resumed")
    resumed.resume = True
    train(resumed)
    straight = json.loads((tmp_path / "straight" / "checkpoint" / "trainer_state.json").read_text())
    again = json.loads((tmp_path / "resumed" / "checkpoint" / "trainer_state.json").read_text())
    assert [h["step"] for h in again["history"]] == [h["step"] for h in straight["history"]]
    assert [h["loss"] for h in again["history"]] == pytest.approx([h["loss"] for h in straight["history"]], rel=1e-4)


def _train_phrase_cli(world, encoder, out, batch_size, nproc):
    sup = world["root"] / "sup"
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "--standalone",
           "-m", "odqa.system.cli", "-q", "train-phrase", "--train-file", str(sup / "train.jsonl"),
           "--validation-file", str(sup / "validation.jsonl"), "--out", str(out), "--encoder", str(encoder),
           "--epochs", "2", "--batch-size", str(batch_size), "--lr", "2e-3", "--warmup-ratio", "0",
           "--max-passage-tokens", "64", "--max-question-tokens", "16",
           # Only the per-example loss: in-batch, pre-batch and filter terms mix the examples of a batch.
           "--neg-coef", "0", "--pre-batch", "0", "--filter-coef", "0"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, env=env, cwd=Path(__file__).parent.parent, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return DensePhraseModel.from_pretrained(out / "last").state_dict()


def test_two_processes_train_phrases_as_one_with_twice_the_batch(world, tmp_path):
    """Under torchrun each process takes every other batch and DDP averages the gradients, so two
    processes with batches of 1 make the same updates as one process with batches of 2."""
    encoder = tmp_path / "bert"
    shutil.copytree(world["encoder"], encoder)
    config = json.loads((encoder / "config.json").read_text())
    config.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    (encoder / "config.json").write_text(json.dumps(config))
    two = _train_phrase_cli(world, encoder, tmp_path / "two", batch_size=1, nproc=2)
    one = _train_phrase_cli(world, encoder, tmp_path / "one", batch_size=2, nproc=1)
    start = DensePhraseModel(PhraseModelConfig(encoder=str(encoder))).state_dict()
    # Not tensor by tensor: the last LayerNorm's bias adds the same amount to every token's score, so
    # the in-passage softmax gives it a zero gradient, and Adam blows float noise there up to full steps.
    moved = sum(((one[k] - start[k]) ** 2).sum() for k in one)
    apart = sum(((one[k] - two[k]) ** 2).sum() for k in one)
    assert moved > 1.0 and apart / moved < 1e-6


def test_train_phrase_at_zero3_trains_like_zero2(world, tmp_path):
    root = world["root"]

    def run(out, **loop):
        train(from_flat(PhraseTrainArgs, dict(train_file=str(root / "sup" / "train.jsonl"), validation_file=str(root / "sup" / "validation.jsonl"),
                              out_dir=str(out), encoder=str(world["encoder"]), epochs=1, batch_size=4, lr=2e-3,
                              max_passage_tokens=64, max_question_tokens=16, **loop)))
        return losses(out), DensePhraseModel.from_pretrained(out / "last").state_dict()

    assert_zero3_trains_like_zero2(run, tmp_path)


def _query_run(world, index, tmp_path, model=None):
    questions = write_jsonl(tmp_path / "q.jsonl", [{"question": f"where was {n} born", "answers": [c]}
                                                   for n, c in world["born"].items()])

    def run(out, **loop):
        train_query(from_flat(QueryTrainArgs, dict(model=str(model or world["model"]), index=str(index), corpus=str(world["corpus"]),
                                   out_dir=str(out), questions=str(questions), top_k=30, epochs=2, batch_size=2,
                                   lr=2e-3, **loop)))
        return losses(out), DensePhraseModel.from_pretrained(out / "last").state_dict()
    return run


def test_an_interrupted_query_training_resumes_with_the_same_losses(world, index, tmp_path, monkeypatch):
    from odqa.retriever import query_train
    run = _query_run(world, index, tmp_path)
    straight = run(tmp_path / "straight", save_steps=2)
    calls = {"n": 0}
    real = query_train.query_loss

    def interrupt(*a, **k):
        calls["n"] += 1
        if calls["n"] > 9:   # in the second epoch, after the step-8 checkpoint
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(query_train, "query_loss", interrupt)
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path / "resumed", save_steps=2)
    monkeypatch.setattr(query_train, "query_loss", real)
    again = run(tmp_path / "resumed", save_steps=2, resume=True)
    assert_same_training(straight, again, rel=1e-5, atol=1e-6)
    # another recipe is refused before anything is written over, its mined candidates included
    written = {p: p.read_bytes() for p in (tmp_path / "resumed").rglob("*.json")}
    with pytest.raises(InputError, match="passage_weight 0.0 there, 1.0 here"):
        run(tmp_path / "resumed", save_steps=2, resume=True, passage_weight=1.0)
    assert {p: p.read_bytes() for p in (tmp_path / "resumed").rglob("*.json")} == written


def test_train_query_at_zero3_trains_like_zero2(world, index, tmp_path):
    assert_zero3_trains_like_zero2(_query_run(world, index, tmp_path), tmp_path)


def test_train_query_in_two_processes_trains_as_one_with_twice_the_accumulation(world, index, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(world["model"], model)
    (model / "checksums.json").unlink()    # edited by hand below, as a model of its own
    for lm in ("q_start_lm", "q_end_lm"):   # dropout off: its masks depend on the rank
        if (model / lm / "config.json").exists():
            without_dropout(model / lm, tmp_path / "nodrop")
            shutil.rmtree(model / lm)
            (tmp_path / "nodrop").rename(model / lm)
    questions = write_jsonl(tmp_path / "q.jsonl", [{"question": f"where was {n} born", "answers": [c]}
                                                   for n, c in world["born"].items()])

    def command(out):
        return ["train-query", "--model", str(model), "--index", str(index), "--corpus", str(world["corpus"]),
                "--out", str(out), "--questions", str(questions), "--top-k", "30", "--epochs", "2",
                "--batch-size", "2", "--lr", "2e-3"]
    assert_two_processes_train_as_one_with_twice_the_accumulation(
        command, tmp_path, lambda d: DensePhraseModel.from_pretrained(d).state_dict())


def test_round_two_mines_hard_negatives_with_the_round_one_model(world, index, tmp_path, monkeypatch):
    from odqa.retriever import searcher as searcher_module
    sup = world["root"] / "sup"

    def args(**kw):
        return from_flat(PhraseTrainArgs, dict(train_file=str(sup / "train.jsonl"), validation_file=str(sup / "validation.jsonl"),
                               out_dir=str(tmp_path / "r2"), encoder=str(world["model"]), epochs=1, batch_size=4,
                               lr=1e-3, max_passage_tokens=64, max_question_tokens=16, corpus=str(world["corpus"]),
                               hard_negatives=str(index), hard_negative_count=2, **kw))
    result = train(args())
    mined = json.loads((tmp_path / "r2" / "hard_negatives.json").read_text())
    texts = {p["id"]: p for p in map(json.loads, (world["corpus"] / "passages.jsonl").read_text().splitlines())}
    examples = [json.loads(line) for line in (sup / "train.jsonl").read_text().splitlines()]
    assert set(mined["rows"]) == {e["question"] for e in examples}
    from odqa.retriever.phrase_train import load_examples, mine_hard_negatives
    mined_examples = load_examples(str(sup / "train.jsonl"))
    mine_hard_negatives(mined_examples, args())
    for ex in mined_examples:
        negatives = ex["negative_passages"]
        assert len(negatives) == 2                       # 12 passages, one answers: always two to pick
        for p in negatives:
            assert p["id"] != ex["passage_id"] and ex["answers"][0] not in texts[p["id"]]["text"]
    assert result["steps"] == 3 and result["best_em"] >= 50.0
    # A resumed run reads the mined passages back instead of searching again.
    monkeypatch.setattr(searcher_module, "Searcher", None)
    train(args(resume=True))
    # Round 2 needs a round-1 model to mine with.
    with pytest.raises(InputError, match="round-1"):
        train(updated(args(), encoder=str(world["encoder"]), out_dir=str(tmp_path / "bad")))


def test_filter_report_keeps_less_and_recalls_less_as_the_threshold_rises(world):
    from odqa.retriever.lm import load_tokenizer
    from odqa.retriever.phrase_train import filter_report, load_examples, validation_em
    examples = load_examples(str(world["root"] / "sup" / "validation.jsonl"))
    rows = filter_report(world["model"], examples, [None, -1e9, -0.5, 0.0, 0.5, 1e9], batch_size=5)
    none, low, *mid, high = rows
    model = DensePhraseModel.from_pretrained(world["model"]).eval()
    assert none["share_kept"] == low["share_kept"] == 1.0 and none["answer_recall"] == 1.0
    assert 100 * none["em"] == pytest.approx(validation_em(model, load_tokenizer(world["model"]), examples, model.config))
    assert high["share_kept"] == high["answer_recall"] == high["em"] == 0.0
    for a, b in zip([low, *mid], [*mid, high]):
        assert a["share_kept"] >= b["share_kept"] and a["answer_recall"] >= b["answer_recall"]


def test_the_phrase_filter_keeps_answer_tokens_and_build_index_keeps_its_share(world, index, tmp_path):
    from odqa.retriever.phrase_filter import train_filter
    root = world["root"]
    sup = root / "sup"
    info = train_filter(FilterArgs(dump=root / "dump", train_file=sup / "train.jsonl",
                                   validation_file=sup / "validation.jsonl", corpus=world["corpus"], epochs=300,
                                   out=tmp_path / "filter"))
    table = {row["keep"]: row for row in info["calibration"]}
    recalls = [row["answer_recall"] for row in info["calibration"]]
    assert recalls == sorted(recalls) and table[1.0]["answer_recall"] == 1.0
    assert table[0.2]["answer_recall"] == 1.0     # the planted cities are what a filter should keep
    m = index_of(root / "dump", tmp_path / "kept", world["corpus"], keep=0.2, filter=tmp_path / "filter")
    full = json.loads((index / "manifest.json").read_text())
    assert m["vectors"] == pytest.approx(0.2 * full["vectors"], abs=2)
    assert m["bytes_per_passage"] < full["bytes_per_passage"] / 3

    def gold_passage_answers(index_dir) -> int:
        """Questions whose own passage's best phrase is the planted city."""
        searcher = searcher_of(index_dir, world["model"], world["corpus"])
        results = searcher.search([f"where was {n} born" for n in NAMES], k=len(NAMES), unit="passage")
        return sum(h.phrase.text == world["born"][n] for r, n in zip(results, NAMES)
                   for h in r.hits if h.unit.title == n)
    assert gold_passage_answers(tmp_path / "kept") >= gold_passage_answers(index) - 1 >= 9
    with pytest.raises(InputError, match="no phrase filter"):
        index_of(root / "dump", tmp_path / "x", world["corpus"], keep=0.2, filter=tmp_path / "none")
    # Answers that fall inside tokens teach the filter nothing: refused, and nothing is written.
    inside = [{**ex, "answer_char_spans": [[a + 1, b - 1] for a, b in ex["answer_char_spans"]]}
              for ex in map(json.loads, (sup / "train.jsonl").read_text().splitlines())]
    write_jsonl(tmp_path / "inside.jsonl", inside)
    with pytest.raises(InputError, match="inside.jsonl: no answer occurrence falls on the dump's token boundaries"):
        train_filter(FilterArgs(dump=root / "dump", train_file=tmp_path / "inside.jsonl",
                                validation_file=sup / "validation.jsonl", corpus=world["corpus"], out=tmp_path / "bad-filter"))
    assert not (tmp_path / "bad-filter").exists()
    with pytest.raises(InputError, match="--keep"):
        index_of(root / "dump", tmp_path / "x", world["corpus"], keep=0.0)


def test_build_index_reads_the_dump_a_chunk_at_a_time_and_builds_the_same_index_however_it_is_chunked(
        world, index, tmp_path):
    """The dump's chunks rewritten one passage each, in reverse order: the same share kept over the whole
    dump, the same vector ids (passages in corpus order), vectors and metadata, for an index filled in id
    order (Flat) and one filled a chunk at a time (IVF). A chunk out of token order is refused."""
    from odqa.retriever.phrase_dump import read_dump
    from odqa.retriever.phrase_filter import load_filter, train_filter
    root = world["root"]
    # train-filter reads only its supervision passages whole (three here); its shares are still of
    # every dumped token
    few = tmp_path / "few.jsonl"
    few.write_text("\n".join((root / "sup" / "train.jsonl").read_text().split("\n")[:3]) + "\n")
    info = train_filter(FilterArgs(dump=root / "dump", train_file=few, validation_file=few, corpus=world["corpus"],
                                   epochs=20, out=tmp_path / "filter"))
    every, _ = read_dump(root / "dump", world["corpus"])
    scores = load_filter(tmp_path / "filter")[0].score(every["start"], every["end"])
    assert {row["keep"]: row["threshold"] for row in info["calibration"]}[0.5] == pytest.approx(
        float(np.quantile(scores, 0.5)), abs=1e-5)
    src = next((root / "dump").glob("shard-*"))
    split = tmp_path / "dump" / src.name
    split.mkdir(parents=True)
    for name in ("settings.json", "done.json"):
        shutil.copy(src / name, split / name)
    n = 0
    for c in sorted(src.glob("chunk-*.npz")):
        z = dict(np.load(c))
        for row in np.unique(z["passage_row"])[::-1]:
            np.savez(split / f"chunk-{n:05d}.npz", **{k: v[z["passage_row"] == row] for k, v in z.items()})
            n += 1
    assert n > len(list(src.glob("chunk-*.npz")))
    # the dump the filter scored is built from the scores train-filter saved; the rechunked one, which it
    # did not score, is scored again: the same tokens kept either way
    from odqa.retriever.phrase_dump import dump_chunks
    from odqa.retriever.phrase_filter import saved_scores
    chunks = dump_chunks(root / "dump", world["corpus"])[0]
    sizes = [len(np.load(c)["token"]) for c in chunks]
    assert saved_scores(tmp_path / "filter", chunks, sizes) is not None
    assert saved_scores(tmp_path / "filter", dump_chunks(tmp_path / "dump", world["corpus"])[0], sizes) is None
    for factory in ("Flat", "IVF2,SQ8"):
        built = [index_of(dump, tmp_path / f"{name}-{factory}", world["corpus"], factory=factory, keep=0.5,
                             filter=tmp_path / "filter") for name, dump in (("a", root / "dump"), ("b", tmp_path / "dump"))]
        assert built[0]["filter_threshold"] == built[1]["filter_threshold"]
        every = json.loads((index / "manifest.json").read_text())["vectors"]
        assert built[0]["vectors"] == built[1]["vectors"] == pytest.approx(0.5 * every, abs=2)
        a, b = (np.load(tmp_path / f"{name}-{factory}" / "meta.npz") for name in "ab")
        assert a.files == b.files and all(np.array_equal(a[k], b[k]) for k in a.files)
        ix = [PhraseIndex(tmp_path / f"{name}-{factory}") for name in "ab"]
        ids = np.arange(built[0]["vectors"])
        for side in ("start", "end"):
            assert np.array_equal(ix[0].vectors(side, ids), ix[1].vectors(side, ids))
    z = dict(np.load(split / "chunk-00000.npz"))
    np.savez(split / "chunk-00000.npz", **{k: v[::-1] for k, v in z.items()})
    with pytest.raises(InputError, match="chunk-00000.npz: not a chunk of `odqa dump-phrases`"):
        index_of(tmp_path / "dump", tmp_path / "bad", world["corpus"])


@pytest.mark.parametrize("factory", ["default", "IVF16,PQ8"])
def test_ivf_pq_scores_from_codes_equal_decoded_vectors(factory):
    import faiss

    from odqa.retriever.index_build import default_factory
    from odqa.retriever.ivfpq_codes import IVFPQCodes
    rng = np.random.default_rng(0)
    x = rng.standard_normal((6000, 48)).astype(np.float32)
    index = faiss.index_factory(48, default_factory(len(x), 48) if factory == "default" else factory,
                                faiss.METRIC_INNER_PRODUCT)
    assert factory != "default" or isinstance(faiss.downcast_index(index), faiss.IndexPreTransform)
    index.train(x)
    index.add(x)
    codes = IVFPQCodes.of(index, len(x))
    assert (codes.rotation is not None) == (factory != "IVF16,PQ8")
    ids = rng.choice(len(x), 500)
    q = rng.standard_normal(48).astype(np.float32)
    faiss.extract_index_ivf(index).make_direct_map()
    decoded = index.reconstruct_batch(ids)
    assert np.allclose(codes.vectors(ids), decoded, atol=1e-5)
    assert np.allclose(codes.scores(ids, q), decoded @ q, atol=1e-4)
    # The index's own search scores its hits the same way.
    top, hit = index.search(q[None], 10)
    assert np.allclose(codes.scores(hit[0], q), top[0], atol=1e-4)
    assert IVFPQCodes.of(faiss.index_factory(48, "IVF4,SQ8", faiss.METRIC_INNER_PRODUCT), 0) is None
    assert IVFPQCodes.of(faiss.index_factory(48, "PCA16,IVF4,PQ4", faiss.METRIC_INNER_PRODUCT), 0) is None


def test_encoding_reads_a_list_number_of_two_bytes():
    """Past 256 lists faiss writes a vector's list in two little-endian bytes before its code."""
    import faiss

    from odqa.retriever.ivfpq_codes import IVFPQCodes
    x = np.random.default_rng(0).standard_normal((8000, 8)).astype(np.float32)
    index = faiss.index_factory(8, "IVF300,PQ2np", faiss.METRIC_INNER_PRODUCT)
    index.train(x)
    lists, codes = IVFPQCodes.encode(index, x)
    index.add(x)
    filled = IVFPQCodes.of(index, len(x))
    assert lists.max() > 255 and faiss.extract_index_ivf(index).coarse_code_size() == 2
    np.testing.assert_array_equal(lists, filled.list_of)
    np.testing.assert_array_equal(codes, filled.codes)


@pytest.mark.parametrize("factory", ["OPQ4,IVF8,PQ4np", "IVF8,PQ4np"])
def test_an_ivf_pq_index_is_stored_without_its_ids(tmp_path, factory):
    """The codes in id order and each vector's list, encoded as `build_index` encodes them, beside the
    trained but empty index: they are the codes `add` stores, and opened, the index searches exactly as
    the index that was filled, in fewer bytes (faiss stores an 8-byte id a code)."""
    import faiss

    from odqa.retriever.ivfpq_codes import IVFPQCodes
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3000, 16)).astype(np.float32)
    q = rng.standard_normal((20, 16)).astype(np.float32)
    index = faiss.index_factory(16, factory, faiss.METRIC_INNER_PRODUCT)
    if factory.startswith("OPQ"):    # a rough rotation is as good a test as a trained one, at a tenth of the time
        faiss.downcast_VectorTransform(faiss.downcast_index(index).chain.at(0)).niter = 3
    index.train(x)
    empty = faiss.clone_index(index)
    index.add(x)
    faiss.extract_index_ivf(index).nprobe = 2
    want = index.search(q, 50)
    whole = len(faiss.serialize_index(index))
    assert IVFPQCodes.encodes(empty) and IVFPQCodes.code_size(empty) == 4
    lists, codes = IVFPQCodes.encode(empty, x[:1000])
    more_lists, more_codes = IVFPQCodes.encode(empty, x[1000:])
    filled = IVFPQCodes.of(index, len(x))
    np.testing.assert_array_equal(np.concatenate([codes, more_codes]), filled.codes)
    np.testing.assert_array_equal(np.concatenate([lists, more_lists]), filled.list_of)
    np.save(tmp_path / "start.codes.npy", filled.codes)
    np.save(tmp_path / "start.lists.npy", filled.list_of.astype(np.uint8))
    faiss.write_index(empty, str(tmp_path / "start.faiss"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["start.codes.npy", "start.faiss", "start.lists.npy"]
    stored = sum(p.stat().st_size for p in tmp_path.iterdir())
    assert stored < whole - 6 * len(x)          # 7 bytes a vector less, but for the .npy headers

    opened = faiss.read_index(str(tmp_path / "start.faiss"))
    assert opened.ntotal == 0
    codes = IVFPQCodes.load(opened, tmp_path, "start", len(x))
    assert opened.ntotal == 0                   # scoring by id needs no lists
    codes.fill(opened)
    faiss.extract_index_ivf(opened).nprobe = 2
    got = opened.search(q, 50)
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_array_equal(got[0], want[0])
    ids = rng.choice(len(x), 200)
    assert np.allclose(codes.scores(ids, q[0]), codes.vectors(ids) @ q[0], atol=1e-4)

    np.save(tmp_path / "start.lists.npy", np.zeros(len(x) - 1, np.uint8))
    with pytest.raises(InputError, match="corrupt phrase index"):
        IVFPQCodes.load(faiss.read_index(str(tmp_path / "start.faiss")), tmp_path, "start", len(x))
    with pytest.raises(InputError, match="start.faiss is not one"):
        IVFPQCodes.load(faiss.index_factory(16, "Flat", faiss.METRIC_INNER_PRODUCT), tmp_path, "start", len(x))


def test_default_factory_is_ivf_pq_at_about_a_kilobyte_a_passage():
    from odqa.retriever.index_build import default_factory
    assert default_factory(1000, 192) == "Flat"
    assert default_factory(201_946, 192) == "OPQ16,IVF256,PQ16"       # the demo's: 16 bytes a vector
    assert default_factory(340_000_000, 192) == "OPQ16,IVF8192,PQ16"  # 21M passages at 16 vectors each
    assert default_factory(50_000, 384) == "OPQ32,IVF128,PQ32"


def test_bad_numbers_and_factories_are_refused_up_front(world, index, tmp_path, capsys):
    from odqa.system.cli import main
    root, corpus = world["root"], str(world["corpus"])
    q = str(root / "questions.jsonl")
    for argv in (["retrieve", "--retriever", "bm25", "--questions", q, "--k", "0", "--out", str(tmp_path / "r.json")],
                 ["retrieve", "--retriever", "bm25", "--questions", q, "--limit", "0", "--out", str(tmp_path / "r.json")],
                 ["eval-retrieval", str(tmp_path / "r.json"), "--topk", "-3"]):
        with pytest.raises(SystemExit) as e:
            main(["-q", *argv, "--corpus", corpus])
        assert e.value.code == 2 and "must be at least 1" in capsys.readouterr().err
    assert not (tmp_path / "r.json").exists()
    assert main(["-q", "build-index", "--dump", str(root / "dump"), "--out", str(tmp_path / "ix"), "--keep", "1",
                 "--factory", "Bogus", "--corpus", corpus]) == 2
    assert "--factory 'Bogus': faiss cannot make this index" in capsys.readouterr().err
    assert not (tmp_path / "ix").exists()


def test_a_dump_that_fails_to_start_leaves_its_directory_usable(world, tmp_path):
    out = tmp_path / "dump"
    broken = tmp_path / "broken-model"
    shutil.copytree(world["model"], broken)
    (broken / "phrase_heads.pt").write_bytes(b"truncated")     # hashes fine, fails to load
    with pytest.raises(InputError, match="phrase_heads.pt"):
        dump_phrases(broken, world["corpus"], out)
    dump_phrases(world["model"], world["corpus"], out, chunk_passages=5)   # the right model, same directory
    assert (out / "shard-001-of-001" / "done.json").exists()


def test_title_tokens_are_candidates_and_gold_only_with_title_phrases(world):
    from odqa.retriever.lm import load_tokenizer
    from odqa.retriever.phrase_data import encode_passages, gold_spans
    tokenizer = load_tokenizer(world["encoder"])
    example = {"title": "alice", "text": "the river ran . alice was born in paris .", "answers": ["alice"],
               "answer_char_spans": [(15, 20)]}
    for title_phrases in (False, True):
        enc = encode_passages(tokenizer, [example["title"]], [example["text"]], 32, title_phrases=title_phrases)
        title_tokens = enc.in_title[0].nonzero().flatten().tolist()
        assert len(title_tokens) == 1 and bool(enc.candidate[0, title_tokens[0]]) == title_phrases
        spans = gold_spans(enc, 0, example, example["title"], 20, title_phrases)
        for i, j in spans:   # each gold span lies in one segment and spells the answer there
            source = example["title"] if enc.in_title[0, i] else example["text"]
            assert enc.in_title[0, i] == enc.in_title[0, j]
            assert source[int(enc.offsets[0, i, 0]):int(enc.offsets[0, j, 1])] == "alice"
        assert len(spans) == 1 + title_phrases


def test_title_phrases_answer_from_the_title_and_never_span_both_segments(tmp_path):
    """Passages that name their person only in the title ('this person was born in rome'): trained with
    title phrases, the model reads the title out of its passage (gold-passage EM), the index holds the
    title tokens, search answers with a title read from the title, and neither search nor a brute-force
    reading of every span pairs a title token with a text token."""
    import torch

    from odqa.retriever.phrase_data import encode_passages
    from odqa.retriever.phrase_train import best_spans
    rng = random.Random(1)
    born = dict(zip(NAMES, rng.sample(CITIES, len(CITIES))))
    passages, examples = [], []
    for i, (name, city) in enumerate(born.items()):
        text = f"this person was born in {city} . " + " ".join(rng.choice(FILLER) for _ in range(3)) + " ."
        passages.append({"id": f"p{i}", "title": name, "text": text})
        examples.append({"id": name, "question": f"who was born in {city}", "answers": [name], "regex": False,
                         "passage_id": f"p{i}", "title": name, "text": text, "answer_char_spans": []})
    sup = write_jsonl(tmp_path / "train.jsonl", examples)
    encoder = make_tiny_bert(tmp_path / "bert", [e["text"] + " " + e["title"] for e in examples]
                             + [e["question"] for e in examples])
    result = train(from_flat(PhraseTrainArgs, dict(train_file=str(sup), validation_file=str(sup), out_dir=str(tmp_path / "model"),
                                   encoder=str(encoder), epochs=25, batch_size=4, lr=2e-3, pre_batch_warmup=10,
                                   max_passage_tokens=64, max_question_tokens=16, title_phrases=True)))
    model = tmp_path / "model" / "best"
    assert DensePhraseModel.from_pretrained(model).config.title_phrases
    assert result["best_em"] >= 75.0    # the answer is in no passage's text: only a title phrase gets it

    corpus = tmp_path / "corpus"
    build_corpus([write_jsonl(tmp_path / "passages.jsonl", passages)], corpus)
    dump_phrases(model, corpus, tmp_path / "dump")
    index_of(tmp_path / "dump", tmp_path / "index", corpus)
    searcher = searcher_of(tmp_path / "index", model, corpus)
    assert searcher.artifacts.index.meta["in_title"].sum() == len(passages)   # one title token each
    questions = [e["question"] for e in examples]
    results = searcher.search(questions, k=5, unit="passage")
    assert all(r.phrases[0].in_title and r.phrases[0].text in NAMES for r in results)
    by_id = {p["id"]: p for p in passages}
    for r in results:
        for ph in r.phrases + [h.phrase for h in r.hits]:
            p = by_id[ph.passage_id]
            assert ph.text == (p["title"] if ph.in_title else p["text"])[ph.char_start:ph.char_end]
    q_start, q_end = searcher.encode(questions)
    title = searcher.artifacts.index.meta["in_title"]
    for ph in searcher.phrases.mips(q_start, q_end, k=40):   # every start hit with its best end, and back
        assert (title[ph.start_vec] == title[ph.end_vec]).all()
    enc = encode_passages(searcher.artifacts.tokenizer, [p["title"] for p in passages], [p["text"] for p in passages], 64,
                          title_phrases=True)
    with torch.no_grad():
        hs, he, _ = passage_side(searcher).float().encode_passages(**enc.batch)
    for qs, qe, r in zip(q_start, q_end, results):
        s = torch.einsum("d,btd->bt", torch.from_numpy(qs), hs)
        e = torch.einsum("d,btd->bt", torch.from_numpy(qe), he)
        spans = best_spans(s, e, enc.candidate, 20, enc.in_title)
        assert all(enc.in_title[b, i] == enc.in_title[b, j] for b, (i, j, _) in enumerate(spans))
        best = max(range(len(spans)), key=lambda b: spans[b][2])
        assert passages[best]["id"] == r.phrases[0].passage_id


def test_the_answer_memory_adds_its_votes_to_the_passages_votes():
    from odqa.common.results import Phrase
    from odqa.retriever.answer_aggregation import aggregate_answer
    units = [hit(3.0, "Osaka"), hit(2.0, "Tokyo")]
    assert aggregate_answer(units, 25, 1.0, prior=[]).text == "Osaka"
    # Tokyo's passage vote exp(-1) and the memory's 1 outweigh Osaka's 1; the passage's own phrase is shown
    answer = aggregate_answer(units, 25, 1.0, prior=[(Phrase("tokyo", 1.0, "p2.0", 0, 5), 1.0)])
    assert answer.text == "Tokyo" and answer.support == pytest.approx((np.exp(-1) + 1) / (2 + np.exp(-1)))
    # a phrase that is no passage's best can win on the memory's votes alone, and too few votes do not
    kyoto = Phrase("Kyoto", 1.0, "p2.0", 0, 5)
    assert aggregate_answer(units, 25, 1.0, prior=[(kyoto, 2.0)]).text == "Kyoto"
    assert aggregate_answer(units, 25, 1.0, prior=[(kyoto, 0.5)]).text == "Osaka"


def test_may_hold_is_false_only_where_the_answer_has_no_occurrence():
    from odqa.retriever.phrase_search import may_hold, occurrences
    # re's case-insensitive match pairs "i" with "İ" and "ı", "s" with "ſ"; str.lower keeps them apart
    cases = [("Born in Oslo.", "OSLO"), ("Born in Oslo.", "paris"), ("İstanbul", "istanbul"), ("the ſun", "sun"),
             ("Dıyar", "diyar"), ("\u212aelvin", "kelvin"), ("Zürich", "ZÜRICH"), ("a.b c", "A.B"), ("", "x"), ("x", "")]
    rng = random.Random(0)
    cases += [("".join(rng.choice("abAB .İıſ") for _ in range(12)), "".join(rng.choice("abAB si") for _ in range(2)))
              for _ in range(2000)]
    for text, answer in cases:
        assert may_hold(text, answer) or next(occurrences(text, answer), None) is None, (text, answer)
    assert not may_hold("Born in Oslo.", "paris")   # ASCII both: the regex is skipped
    assert may_hold("İstanbul", "istanbul") and next(occurrences("İstanbul", "istanbul")).group() == "İstanbul"


def test_memory_neighbours_are_the_nearest_above_the_threshold_nearest_first(world, tmp_path):
    from odqa.retriever.answer_memory import AnswerMemory
    questions = ["where was alice born", "where was bob born", "where was alice born", "who is carol",
                 "where was dave born", "who is erin"]
    memory = AnswerMemory(_memory(world, tmp_path, [{"id": f"m{i}", "question": q, "answers": [f"a{i}"]}
                                                    for i, q in enumerate(questions)]))
    asked = memory.vectors[[0, 3]]   # asked again: rows 0 and 2 tie, the first row first
    sims = asked @ memory.vectors.T
    for threshold in (-1.0, float(np.sort(sims[0])[2]), 1.01):
        got = memory.neighbours(asked, 4, threshold)
        for s, neighbours in zip(sims, got):
            want = [r for r in np.argsort(-s, kind="stable")[:4] if s[r] >= threshold]
            assert [(n.answers, n.similarity) for n in neighbours] == [((f"a{r}",), float(s[r])) for r in want]
    assert got == [[], []] and [n.answers for n in memory.neighbours(asked, 4, -1.0)[0][:2]] == [("a0",), ("a2",)]


def _memory(world, tmp_path, rows, name="memory"):
    from odqa.common.questions import load_questions
    from odqa.retriever.answer_memory import build_memory
    path = write_jsonl(tmp_path / f"{name}.jsonl", rows)
    build_memory(world["model"], load_questions(path), [str(path)], tmp_path / name)
    return tmp_path / name


def test_the_answer_memory_lends_its_answers_where_a_top_passage_holds_them_as_a_phrase(world, index, tmp_path):
    from odqa.common.corpus import PassageStore
    from odqa.retriever.answer_memory import AnswerMemory
    question = "where was alice born"
    plain = searcher_of(index, world["model"], world["corpus"]).search([question], k=3)[0]
    assert plain.memory is None
    # The memory says alice was born where someone else was, a city the tiny model does not answer.
    other = next(i for i, n in enumerate(NAMES) if world["born"][n] != plain.answer.text)
    city = world["born"][NAMES[other]]
    memory = _memory(world, tmp_path, [{"id": "m0", "question": question, "answers": [city.upper()]},
                                       {"id": "m1", "question": "where was carol born", "answers": ["atlantis"]}])

    def search(**kw):
        return searcher_of(index, world["model"], world["corpus"],
                        memory=AnswerMemory(memory), **kw).search([question], k=3)[0]
    lent = search(memory_weight=100.0)
    assert lent.hits == plain.hits                            # the memory moves no passage
    nearest = lent.memory[0]
    assert (nearest.question, nearest.answers) == (question, (city.upper(),)) and nearest.similarity > 0.99
    # The answer is the city as that person's passage writes it, an indexed phrase of the passage.
    answer = lent.answer
    text = {p["id"]: p["text"] for p in PassageStore(world["corpus"])}[answer.passage_id]
    assert answer.text == city == text[answer.char_start:answer.char_end]
    assert answer.passage_id == f"p{other}" or city in {h.phrase.text for h in plain.hits}
    # Nothing consulted above the threshold, no weight, or an answer no passage holds: the vote as without it.
    assert search(memory_weight=100.0, memory_threshold=1.01).memory == []
    for kw in ({"memory_weight": 100.0, "memory_threshold": 1.01}, {"memory_weight": 0.0}):
        assert search(**kw).answer.text == plain.answer.text
    atlantis = _memory(world, tmp_path, [{"id": "m0", "question": question, "answers": ["atlantis"]}], "atlantis")
    s = searcher_of(index, world["model"], world["corpus"], memory_weight=100.0,
                 memory=AnswerMemory(atlantis))
    assert s.search([question], k=3)[0].answer == plain.answer


def test_an_answer_memory_of_other_question_encoders_or_corrupt_is_refused(world, index, tmp_path):
    from odqa.retriever.answer_memory import AnswerMemory
    from odqa.retriever.phrase_model import question_encoder_hash
    rows = [{"id": "m0", "question": "where was alice born", "answers": ["oslo"]}]
    memory = _memory(world, tmp_path, rows)
    opened = AnswerMemory(memory)
    assert len(opened) == 1 and opened.question_encoder == question_encoder_hash(world["model"])
    opened.manifest["key"]["question_encoder"] = "another model's"
    with pytest.raises(InputError, match="other question encoders"):
        searcher_of(index, world["model"], world["corpus"], memory=opened)
    with pytest.raises(InputError, match="not an answer memory"):
        AnswerMemory(tmp_path / "nowhere")
    with open(memory / "vectors.npy", "ab") as f:
        f.write(b"\0")
    with pytest.raises(InputError, match="corrupt answer memory"):
        AnswerMemory(memory)
    # Regular-expression answers cannot be looked up in a passage: left out, and a set of nothing else refused.
    regex = [{"id": "r0", "question": "where was bob born", "answers": ["os.o"], "regex": True}]
    assert len(AnswerMemory(_memory(world, tmp_path, rows + regex, "mixed"))) == 1
    with pytest.raises(InputError, match="no questions with plain answers"):
        _memory(world, tmp_path, regex, "regex")


def test_cli_build_memory_then_retrieve_and_run_refuses_to_evaluate_what_the_memory_holds(world, index, tmp_path, capsys):
    from odqa.common.io import InputError
    from odqa.system.cli import main
    from odqa.system.run import RunArgs, run
    root = world["root"]
    memory = tmp_path / "memory"
    assert main(["-q", "build-memory", "--model", str(world["model"]), "--questions", str(root / "questions.jsonl"),
                 "--out", str(memory)]) == 0
    assert f"{len(NAMES)} questions of {root / 'questions.jsonl'} (32 dims) -> {memory}" in capsys.readouterr().out
    out = tmp_path / "r.json"
    base = ["-q", "retrieve", "--retriever", "phrase", "--index", str(index), "--model", str(world["model"]),
            "--questions", str(root / "questions.jsonl"), "--corpus", str(world["corpus"]), "--k", "2"]
    assert main([*base, "--memory", str(memory), "--out", str(out)]) == 0
    entries = json.loads(out.read_text())
    # the nearest memory questions each entry consulted (to the tiny model's question encoders all are alike)
    held = {q["question"]: q["answers"] for q in map(json.loads, (root / "questions.jsonl").read_text().split("\n")[:-1])}
    assert all(len(e["memory"]) == 3 and all(held[m["question"]] == m["answers"] and m["similarity"] > 0.99
                                             for m in e["memory"]) for e in entries)
    with pytest.raises(SystemExit) as refused:
        main([*base, "--memory", str(memory), "--memory-weight", "-1", "--out", str(out)])
    assert refused.value.code == 2 and "--memory-weight: must be at least 0" in capsys.readouterr().err
    assert main(["-q", "retrieve", "--retriever", "bm25", "--questions", str(root / "questions.jsonl"), "--corpus",
                 str(world["corpus"]), "--memory", str(memory), "--out", str(tmp_path / "b.json")]) == 2
    with pytest.raises(InputError, match="holds questions, which this run evaluates"):
        run(from_flat(RunArgs, dict(out_dir=str(tmp_path / "run"), index=str(index), model=str(world["model"]), reader=str(tmp_path),
                    questions=[str(root / "questions.jsonl")], memory=str(memory))))


def test_the_default_pipelines_memory_comes_with_its_model_only(tmp_path):
    from odqa.common.defaults import record_pipeline
    from odqa.system.args import PipelineParts
    from odqa.system.pipeline import assemble
    paths = {}
    for name in ("phrase_index", "phrase_model", "memory", "corpus"):
        paths[name] = tmp_path / name
        paths[name].mkdir()
    record_pipeline(paths, by="test")

    def filled(**kw):
        return assemble(PipelineParts(**kw), reader=False).parts.memory
    assert filled() == str(paths["memory"].resolve())
    assert filled(no_memory=True) is None
    assert filled(model=str(tmp_path / "other")) is None      # its vectors are the default model's questions
    assert filled(memory=str(tmp_path / "mine")) == str(tmp_path / "mine")
