"""The cross-encoder passage reranker: it learns a planted task from a retrieval file, loads back with
the same scores and its tuned weight, refuses what is not one of its checkpoints; the searcher reorders
its top passages by z(search) + w x z(reranker), and the default pipeline's reranker is used unless a
flag says otherwise."""
import json
import random
from types import SimpleNamespace

import numpy as np
import pytest
from loop_checks import assert_reported
from tiny_models import make_tiny_bert

from odqa.common.defaults import default_pipeline, record_pipeline
from odqa.common.io import InputError
from odqa.common.settings import from_flat
from odqa.retriever.args import RerankerTrainArgs
from odqa.retriever.cross_encoder import CONFIG, CrossEncoder
from odqa.retriever.cross_encoder_train import load_groups, ranking_metrics, train_reranker
from odqa.retriever.rerank import standardise
from odqa.system.args import PipelineParts
from odqa.system.cli import main
from odqa.system.pipeline import assemble

NAMES = ["alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi", "ivan", "judy", "mallory", "oscar",
         "peggy", "rupert", "sybil", "trent", "victor", "walter", "yvonne", "zoe"]
CITIES = ["rome", "paris", "oslo", "lima", "cairo", "delhi", "tokyo", "quito", "accra", "hanoi", "kyiv", "seoul",
          "dakar", "baku", "bern", "doha", "riga", "sofia", "tunis", "minsk"]


def retrieval_file(path, names, born, rng, depth=6):
    """Each question asks where a person was born or where they died; its passages are its answer among
    depth - 1 passages of the other kind, in a random order with random search scores. Half the
    questions ask each, so no score of a passage alone ranks both kinds right: only reading the
    question with the passage does."""
    entries = []
    for i, name in enumerate(names):
        asks_birth = i % 2 == 0
        others = rng.sample([n for n in born if n != name], depth - 1)
        ctxs = [{"id": name, "title": "person", "text": sentence(name, born[name], asks_birth), "has_answer": True}]
        ctxs += [{"id": n, "title": "person", "text": sentence(n, born[n], not asks_birth), "has_answer": False}
                 for n in others]
        rng.shuffle(ctxs)
        for c, s in zip(ctxs, sorted((rng.random() for _ in ctxs), reverse=True)):
            c["score"] = s
        question = f"where was {name} born" if asks_birth else f"where did {name} die"
        entries.append({"id": name, "question": question, "answers": [born[name]], "ctxs": ctxs})
    path.write_text(json.dumps(entries))
    return path


def sentence(name, city, birth):
    return f"{name} was born in {city} ." if birth else f"{name} died in {city} ."


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("reranker")
    rng = random.Random(0)
    born = dict(zip(NAMES, CITIES))
    encoder = make_tiny_bert(root / "bert", [f"{n} was born in {c} . where did die person :" for n, c in born.items()],
                             hidden=64)
    train = retrieval_file(root / "train.json", NAMES * 6, born, rng)
    val = retrieval_file(root / "val.json", NAMES, born, rng)
    assert main(["-q", "train-reranker", "--train-file", str(train), "--validation-file", str(val),
                 "--out", str(root / "rr"), "--encoder", str(encoder), "--depth", "6", "--negatives", "3",
                 "--epochs", "20", "--batch-size", "8", "--lr", "5e-4", "--head-lr", "1e-2", "--max-tokens", "32",
                 "--eval-steps", "100", "--report-to", "tensorboard"]) == 0
    recorded = default_pipeline().get("reranker")
    return {"root": root, "val": val, "out": root / "rr", "summary": json.loads((root / "rr" / "summary.json").read_text()),
            "recorded": recorded}


def test_training_reports_to_tensorboard(trained):
    metric = json.loads((trained["out"] / "trainer_state.json").read_text())["evals"][0]
    assert_reported(trained["out"], next(k for k in metric if k not in ("step", "epoch")))


def test_the_reranker_learns_which_passage_answers(trained):
    s = trained["summary"]
    assert s["train_questions"] == 6 * len(NAMES)
    assert s["retriever"]["Top-1"] < 40           # random order: about 1 in 6
    assert [e["step"] for e in s["validation"]] == [100, 200, 300]
    assert s["best"]["value"] >= 90               # MRR@6 of the reranker alone
    # the tuned weight is the grid's smallest with the best MRR, and it is stored in both checkpoints
    best = max(s["weight_grid"], key=lambda r: r["MRR@6"])
    assert s["weight"] == best["weight"] and best["Top-1"] >= 90
    for name in ("best", "last"):
        assert json.loads((trained["out"] / name / CONFIG).read_text())["weight"] == s["weight"]
    assert trained["recorded"] == (trained["out"] / "best").resolve()   # what the next command finds by default


def test_a_trained_reranker_loads_back_with_the_same_scores(trained, tmp_path):
    a = CrossEncoder.from_pretrained(trained["out"] / "best").eval()
    passages = [{"title": "person", "text": "bob was born in rome ."}, {"title": "person", "text": "zoe died in minsk ."}]
    a.save_pretrained(tmp_path / "again")
    b = CrossEncoder.from_pretrained(tmp_path / "again").eval()
    assert np.array_equal(a.score("where was bob born", passages), b.score("where was bob born", passages))
    assert a.score("where was bob born", passages)[0] > a.score("where was bob born", passages)[1]
    assert b.weight == a.weight == json.loads((trained["out"] / "best" / CONFIG).read_text())["weight"]


def test_a_question_longer_than_the_input_is_cut_not_refused(trained):
    """TriviaQA has questions of 150 word pieces; the full preset's reranker stage met one in training."""
    model = CrossEncoder.from_pretrained(trained["out"] / "best").eval()
    question = " ".join(["where was bob born"] * 100)
    passages = [{"title": "person", "text": " ".join(["bob was born in rome ."] * 50)}]
    enc = model.encode([question], passages)
    assert enc["input_ids"].shape[1] == model.config.max_tokens
    assert np.isfinite(model.score(question, passages)).all()


def test_what_is_not_a_reranker_checkpoint_is_refused(trained, tmp_path):
    with pytest.raises(InputError, match="not a reranker checkpoint"):
        CrossEncoder.from_pretrained(tmp_path)
    from transformers import AutoModelForSequenceClassification
    one = CrossEncoder.from_pretrained(trained["out"] / "best")
    two = AutoModelForSequenceClassification.from_pretrained(trained["root"] / "bert", num_labels=2)
    CrossEncoder(two, one.tokenizer, one.config).save_pretrained(tmp_path / "two")
    with pytest.raises(InputError, match="2 outputs, not 1"):
        CrossEncoder.from_pretrained(tmp_path / "two")
    for content, error in (("[]", "bad.json: holds no questions"),
                           ('[{"question": "q", "answers": ["a"], "ctxs": []}]', "fewer than one batch")):   # no group
        (trained["root"] / "bad.json").write_text(content)
        with pytest.raises(InputError, match=error):
            train_reranker(from_flat(RerankerTrainArgs, dict(train_file=str(trained["root"] / "bad.json"), validation_file=str(trained["val"]),
                                             out_dir=str(tmp_path / "x"), encoder=str(trained["root"] / "bert"))))


def test_groups_keep_questions_with_both_kinds_in_their_top_passages(tmp_path):
    entries = [{"question": "a", "answers": ["x"], "ctxs": [{"text": "x", "has_answer": True, "score": 1},
                                                            {"text": "y", "has_answer": False, "score": 0}]},
               {"question": "b", "answers": ["x"], "ctxs": [{"text": "y", "has_answer": False, "score": 1}]},
               {"question": "c", "answers": ["x"], "ctxs": [{"text": "y", "has_answer": False, "score": 1},
                                                            {"text": "x", "has_answer": True, "score": 0}]}]
    (tmp_path / "r.json").write_text(json.dumps(entries))
    groups, asked = load_groups(str(tmp_path / "r.json"), depth=2)
    assert asked == 3 and [g["question"] for g in groups] == ["a", "c"]
    assert load_groups(str(tmp_path / "r.json"), depth=1)[0] == []   # c's answer is at rank 2


def test_ranking_metrics_order_by_the_search_then_the_reranker():
    entries = [{"ctxs": [{"score": 3.0, "has_answer": False}, {"score": 2.0, "has_answer": False},
                         {"score": 1.0, "has_answer": True}]}]
    cross = [np.array([0.0, 0.0, 5.0])]
    assert ranking_metrics(entries, cross, 0.0, 3)["Top-1"] == 0.0       # the search's order
    assert ranking_metrics(entries, cross, None, 3)["Top-1"] == 100.0    # the reranker alone
    # z(search) = (1.22, 0, -1.22), z(cross) = (-0.71, -0.71, 1.41): weight 1 keeps the first passage
    # first (0.52 against -0.71 and the answer's 0.19), weight 2 puts the answer first (1.60)
    assert ranking_metrics(entries, cross, 1.0, 3)["Top-1"] == 0.0
    assert ranking_metrics(entries, cross, 2.0, 3)["Top-1"] == 100.0


class FixedReranker:
    """Scores a passage by a table of its ids: what the searcher does with any reranker's scores."""

    def __init__(self, scores: dict, weight: float):
        self.scores, self.weight, self.asked = scores, weight, []

    def to(self, device):
        return self

    def eval(self):
        return self

    def score(self, question, passages):
        self.asked.append([p["id"] for p in passages])
        return np.array([self.scores.get(p["id"], 0.0) for p in passages])


def passage_hits(scores) -> list:
    """Passages p0, p1, ... of a search, with these scores, each showing its phrase "answer i"."""
    from odqa.common.results import Passage, Phrase
    from odqa.retriever.results import Hit
    return [Hit(Passage(id=f"p{i}", title=f"t{i}", text=f"answer {i} here", score=s,
                        phrase=Phrase(f"answer {i}", s, f"p{i}", 0, 8)), i) for i, s in enumerate(scores)]


def test_the_searcher_reorders_its_top_passages_by_both_scores():
    from odqa.retriever.rerank import cross_reranked
    passages = passage_hits([9.0, 8.0, 7.5, 7.0, 1.0])
    reranker = FixedReranker({"p3": 10.0, "p4": 5.0}, weight=1.0)
    result = cross_reranked(reranker, "q", passages, k=3)
    final = standardise([h.score for h in passages]) + standardise([0, 0, 0, 10.0, 5.0])
    want = np.argsort(-final, kind="stable")[:3]
    assert [h.unit.id for h in result] == [f"p{i}" for i in want] == ["p3", "p0", "p1"]
    assert [h.score for h in result] == pytest.approx(final[want].tolist())
    assert [h.parts["search_score"] for h in result] == [7.0, 9.0, 8.0]
    assert [h.parts["cross_score"] for h in result] == [10.0, 0.0, 0.0]
    assert result[0].phrase.text == "answer 3"     # the extractive answer follows it
    reranker.weight = 0.0                           # a weight of 0 keeps the search's order
    assert [h.unit.id for h in cross_reranked(reranker, "q", passages, k=5)] == [h.unit.id for h in passages]


def test_a_reranked_retrieval_file_keeps_both_parts_of_each_score():
    from odqa.common.questions import Question
    from odqa.retriever.rerank import cross_reranked
    from odqa.retriever.results import SearchResult
    from odqa.retriever.retrieve import retrieve_phrases
    passages = passage_hits([9.0, 8.0, 7.0])
    reranker = FixedReranker({"p2": 10.0}, weight=2.0)

    def search(questions, k, unit, queries):
        hits = cross_reranked(reranker, questions[0], passages, k)
        return [SearchResult("passage", [], hits, answer=hits[0].phrase)]
    entry, = retrieve_phrases(SimpleNamespace(queries=lambda qs: SimpleNamespace(questions=qs), search=search),
                              [Question("q0", "which", ["answer 2"])], k=3)
    assert [c["id"] for c in entry["ctxs"]] == ["p2", "p0", "p1"] and entry["prediction"] == "answer 2"
    assert [c["search_score"] for c in entry["ctxs"]] == [7.0, 9.0, 8.0]
    assert [c["cross_score"] for c in entry["ctxs"]] == [10.0, 0.0, 0.0]
    assert entry["ctxs"][0]["has_answer"] and not entry["ctxs"][1]["has_answer"]
    plain = retrieve_phrases(SimpleNamespace(queries=lambda qs: SimpleNamespace(questions=qs),
                                             search=lambda qs, k, unit, queries: [SearchResult("passage", [], passages)]),
                             [Question("q0", "which", ["answer 2"])], k=3)[0]
    assert "search_score" not in plain["ctxs"][0] and "cross_score" not in plain["ctxs"][0]


def test_the_default_pipelines_reranker_is_used_unless_a_flag_says_otherwise(tmp_path):
    paths = {}
    for name in ("phrase_index", "phrase_model", "reranker", "corpus"):
        paths[name] = tmp_path / name
        paths[name].mkdir()
    record_pipeline(paths, by="test")

    def reranker(**kw):
        return assemble(PipelineParts(**kw), reader=False).parts.reranker

    assert reranker() == str(paths["reranker"].resolve())
    assert reranker(no_reranker=True) is None
    assert reranker(index=str(tmp_path / "other")) is None        # a phrase index named by a flag is searched as named
    assert reranker(reranker=str(tmp_path / "mine")) == str(tmp_path / "mine")   # a named reranker wins


def test_a_reranker_is_refused_for_the_other_retrievers(tiny_corpus, tiny_questions, tmp_path):
    assert main(["-q", "retrieve", "--retriever", "bm25", "--questions", str(tiny_questions), "--corpus",
                 str(tiny_corpus), "--reranker", str(tmp_path), "--out", str(tmp_path / "r.json")]) == 2
    assert not (tmp_path / "r.json").exists()
    # tune-lambda tunes what comes before the reranker: a reranker named there would be silently unused
    assert main(["-q", "tune-lambda", "--questions", str(tiny_questions), "--corpus", str(tiny_corpus),
                 "--reranker", str(tmp_path)]) == 2
    assert main(["-q", "tune-lambda", "--questions", str(tiny_questions), "--corpus", str(tiny_corpus),
                 "--memory", str(tmp_path)]) == 2


def test_the_reranker_scores_under_bfloat16_where_search_does(trained, monkeypatch):
    model = CrossEncoder.from_pretrained(trained["out"] / "best").eval()
    # as in training: the answer among passages of the other kind (a passage that names someone else
    # with the question's verb was never ranked against it, so its margin is no test of precision)
    passages = [{"title": "person", "text": sentence(n, c, birth=n != "bob")} for n, c in zip(NAMES[:6], CITIES)]
    monkeypatch.setenv("ODQA_SEARCH_DTYPE", "float32")
    full = model.score("where did bob die", passages)
    monkeypatch.setenv("ODQA_SEARCH_DTYPE", "bfloat16")
    half = model.score("where did bob die", passages)
    assert not np.array_equal(full, half)                  # it did run in bfloat16
    assert np.allclose(full, half, atol=0.1 * np.abs(full).max())
    assert np.argmax(full) == np.argmax(half) == NAMES.index("bob")


def test_a_demo_forgets_only_its_own_reranker(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "demo").mkdir()
    record_pipeline({"reranker": tmp_path / "mine"}, by="odqa train-reranker")
    record_pipeline({}, by="odqa demo", forget={"reranker": tmp_path / "demo"})    # one trained by hand stays
    assert default_pipeline()["reranker"] == (tmp_path / "mine").resolve()
    record_pipeline({}, by="odqa demo", forget={"reranker": tmp_path / "mine"})
    assert "reranker" not in default_pipeline()
