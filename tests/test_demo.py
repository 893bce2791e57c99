"""`odqa demo` end to end on a tiny world with tiny models: every stage runs and the report comes
out; a rerun reuses every stage; a changed setting reruns its stage and the later ones only; an
interrupted stage resumes and one started with other settings starts over."""
import json
import random
import shutil
import time
from dataclasses import replace
from pathlib import Path

import pytest
from tiny_data import write_jsonl
from tiny_models import make_tiny_bert

import odqa
from odqa.common.device import cpu_has_bf16
from odqa.common.questions import load_questions
from odqa.common.settings import from_flat, updated
from odqa.system.demo import Demo, run_demo
from odqa.system.recipe import Recipe, Stage
from odqa.system.recipe_config import PRESETS, RecipeConfig

NAMES = ["alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi", "ivan", "judy", "kim", "leo"]
CITIES = ["paris", "rome", "oslo", "lima", "cairo", "delhi", "tokyo", "quito", "accra", "hanoi", "dakar", "riga"]
FILLER = "the weather was mild and the river ran slowly past old mills and quiet farms".split()
STAGES = ["data", "supervise", "phrase", "index", "query", "doc", "refit", "reader", "memory", "run"]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("demo")
    rng = random.Random(0)
    filler = lambda: " ".join(rng.choice(FILLER) for _ in range(6)) + " ."  # noqa: E731
    docs = [{"id": n, "title": n, "sections": [{"title": "", "paragraphs": [f"{n} is a person . {filler()}"]},
                                               {"title": "Life", "paragraphs": [f"{n} was born in {c} . {filler()}"]}]}
            for n, c in zip(NAMES, CITIES)]
    questions = [{"id": n, "question": f"where was {n} born", "answers": [c]} for n, c in zip(NAMES, CITIES)]
    texts = [p for d in docs for s in d["sections"] for p in s["paragraphs"]] + [q["question"] for q in questions]
    cfg = from_flat(RecipeConfig, {
        "documents": str(write_jsonl(root / "docs.jsonl", docs)), "corpus": str(root / "corpus"),
        "encoder": str(make_tiny_bert(root / "bert", texts)), "examples": 2,
        "supervise": {"questions": [str(write_jsonl(root / "questions.jsonl", questions))], "validation_percent": 50},
        # the same questions under another name: the run must not evaluate the set its answer memory holds
        "run": {"questions": [str(write_jsonl(root / "test.jsonl", questions))], "limit": None, "k": [1, 3]},
        "phrase": {"max_train_examples": None, "batch_size": 2, "max_passage_tokens": 48, "max_validation_examples": 4},
        "phrase_round_lrs": [3e-5],                                                  # 2 rounds, as full
        "query": {"epochs": 1}, "query_rounds": 2, "query_final_fit": True,          # off in the demo preset
        "doc": {"max_train_examples": None, "batch_size": 2, "max_doc_tokens": 48, "validation_docs": 4,
                "max_validation_examples": 4},
        "search": {"top_docs": 6}, "tune_lambda": {"limit": 4},
        "gold_steps": 2, "gold_evals": 2, "gold_batch": 2, "reader_loop": {"max_steps": 3, "batch_size": 2},  # bert2bert
        "reader": {"k": 2, "max_validation_examples": 2, "text_maxlength": 40}, "reader_questions": None,
        "reading": {"text_maxlength": 40}})
    return {"root": root, "cfg": cfg}


@pytest.fixture(scope="module")
def first_run(world):
    return run_demo(world["root"] / "out", cfg=world["cfg"])


def test_demo_runs_every_stage_and_prints_the_report(world, first_run, capsys):
    out = world["root"] / "out"
    assert all((out / "stages" / f"{s}.json").exists() for s in STAGES)
    assert not list((out / "stages").glob("*.started.json"))
    table = [line for line in first_run.splitlines() if line.startswith("| test |")]
    assert len(table) == 2, first_run  # one row per k
    assert first_run.count("   extractive: ") == 2 and first_run.count("   generated:  ") == 2
    assert (out / "run" / "report.json").exists() and (out / "run" / "topk.png").exists()
    # The reader was warm-started from the encoder and trained on the gold passages first.
    assert (out / "reader-init" / "reader_init.json").exists() and (out / "reader-gold" / "best").exists()
    # In bfloat16 autocast where the CPU computes it natively, else as `--precision auto` chooses.
    loop = json.loads((out / "reader" / "train_config.json").read_text())["loop"]
    assert loop["precision"] == ("bf16" if cpu_has_bf16() else "auto")
    # One process, so ZeRO-0; the warm reader's embeddings and bottom encoder blocks held fixed.
    assert (loop["zero_stage"], loop["freeze_embeddings"], loop["freeze_layers"]) == (0, True, 2)
    # The question encoders were tuned against the index, on the questions whose top phrases hold an answer.
    query = json.loads((out / "stages" / "query.json").read_text())["result"]
    assert query["epochs"] == 2 and query["questions_with_positive"][0] > 0
    # Each round went on from the one before: phrase round 2 from round 1's best at its own rate and the
    # next seed, the index from round 2, query round 2 from round 1's model.
    phrase2 = json.loads((out / "phrase-r2" / "train_args.json").read_text())
    assert (phrase2["model_config"]["encoder"], phrase2["lr"], phrase2["seed"], phrase2["epochs"]) == \
        (str(out / "phrase" / "best"), 3e-5, 14, 1)
    assert len(json.loads((out / "stages" / "phrase.json").read_text())["result"]["validation_em"]) == 2
    index = json.loads((out / "phrase-index" / "manifest.json").read_text())
    from odqa.retriever.phrase_model import phrase_encoder_hash
    assert index["encoder_hash"] == phrase_encoder_hash(out / "phrase-r2" / "best")
    query2 = json.loads((out / "query-r2" / "train_args.json").read_text())
    assert (query2["model"], query2["seed"]) == (str(out / "query" / "last"), 14)
    # The final fit ran the same rounds again on the training and validation questions both.
    final2 = json.loads((out / "query-final-r2" / "train_args.json").read_text())
    assert (final2["model"], final2["seed"]) == (str(out / "query-final" / "last"), 14)
    lines = lambda path: path.read_text().rstrip("\n").split("\n")  # noqa: E731
    assert lines(Path(final2["questions"])) == lines(out / "supervision" / "train.jsonl") + \
        lines(out / "supervision" / "validation.jsonl")
    assert json.loads((out / "stages" / "refit.json").read_text())["result"]["epochs"] == 2
    # The gold-passage phase was validated twice, and FiD went on from the better of the two.
    assert len(json.loads((out / "reader-gold" / "trainer_state.json").read_text())["evals"]) == 2
    # Every checkpoint carries a model card: its base model, data and validation figures as model-index metadata.
    from huggingface_hub import ModelCard
    for trained, base in (("reader", out / "reader-gold" / "best"), ("phrase", world["cfg"].encoder)):
        for name in ("best", "last"):
            info = json.loads((out / trained / name / "trainer_info.json").read_text())
            card = ModelCard.load(out / trained / name / "README.md")
            assert card.data.base_model == str(base) and f"step {info['step']}" in card.text
            assert {(r.metric_type, r.metric_value) for r in card.data.eval_results or []} == \
                {(k, v) for k, v in info.items() if k != "step"}


def test_reader_validation_holds_questions_with_an_answer_in_their_top_k(world, first_run, tmp_path):
    cfg = world["cfg"]
    val = json.loads((world["root"] / "out" / "reader-data" / "bm25-validation.json").read_text())
    assert 0 < len(val) <= cfg.reader.max_validation_examples
    assert all(any(c["has_answer"] for c in e["ctxs"][:cfg.reader.k]) for e in val)

    def validation_ids(answers: list[str]) -> list[str]:
        out = tmp_path / "-".join(answers)
        (out / "supervision").mkdir(parents=True)
        questions = [{"id": n, "question": f"where was {n} born", "answers": [a]} for n, a in zip(NAMES, answers)]
        for split in ("train", "validation"):
            write_jsonl(out / "supervision" / f"{split}.jsonl", questions)
        return [e["id"] for e in json.loads(Recipe(cfg, out).reader_data()[1].read_text())]

    # The unanswerable first two are passed over (answers that no passage holds) ...
    assert validation_ids(["atlantis", "atlantis", *CITIES[2:5]]) == NAMES[2:2 + cfg.reader.max_validation_examples]
    # ... and where none is answerable, the first ones stay, so that validation still runs.
    assert validation_ids(["atlantis"] * 4) == NAMES[:cfg.reader.max_validation_examples]


def test_rerun_reuses_every_stage(world, first_run, monkeypatch):
    for name in ("build_data", "supervise", "train_phrase", "build_phrase_index", "tune_query", "train_doc",
                 "refit_query", "train_reader", "build_memory", "evaluate"):
        monkeypatch.setattr(Recipe, name, lambda self, resume, name=name: pytest.fail(f"{name} ran again"))
    assert run_demo(world["root"] / "out", cfg=world["cfg"]).split("example questions")[0] == \
        first_run.split("example questions")[0]


def test_a_changed_setting_reruns_that_stage_and_the_later_ones(world, first_run, tmp_path, monkeypatch):
    out, ran = tmp_path / "out", []
    shutil.copytree(world["root"] / "out", out)   # a copy: the later tests read the first run's stages as they were
    for name, stage in (("build_data", "data"), ("supervise", "supervise"), ("train_phrase", "phrase"),
                        ("build_phrase_index", "index"), ("tune_query", "query"), ("train_doc", "doc"),
                        ("refit_query", "refit"), ("train_reader", "reader"), ("build_memory", "memory"),
                        ("evaluate", "run")):
        real = getattr(Recipe, name)
        monkeypatch.setattr(Recipe, name, lambda self, resume, real=real, stage=stage: ran.append(stage) or real(self, resume))
    run_demo(out, cfg=updated(world["cfg"], search={"top_docs": 5}))
    assert ran == ["doc", "refit", "reader", "memory", "run"]


def demo_fingerprint(key):
    from odqa.common.artifact import fingerprint
    return fingerprint(key)


def test_interrupted_stage_resumes_and_other_settings_start_over(tmp_path):
    demo = Demo(RecipeConfig(corpus=str(tmp_path / "corpus")), tmp_path / "out")
    demo.stages_dir.mkdir(parents=True)
    work = tmp_path / "work"
    calls = []

    def fn(resume):
        calls.append((resume, work.exists()))
        if len(calls) == 1:
            work.mkdir()
            raise KeyboardInterrupt  # interrupted after writing a checkpoint
        return {"ok": True}
    stage = Stage("train", "a training stage", 1.0, fn, ("seed",), [work], clean=[work])
    stage.settings, stage.defaults, stage.legacy = {"seed": 0}, {"seed": 0}, None
    key = {"settings": {"seed": 0}, "after": demo_fingerprint(None)}
    with pytest.raises(KeyboardInterrupt):
        demo._run_stage(stage, key)
    assert demo._run_stage(stage, key) == {"ok": True}
    assert calls == [(False, False), (True, True)]  # resumed, checkpoint kept
    assert demo.done([stage]) == {"train": key}
    (demo.stages_dir / "train.json").unlink()
    (demo.stages_dir / "train.started.json").write_text('{"key": {"settings": {"seed": 2}}}')
    calls.clear()
    calls.append("skip the interruption")
    demo._run_stage(stage, key)
    assert calls[1:] == [(False, False)]  # the other run's output was cleared, no resume


def test_query_side_tuning_is_a_stage_of_the_full_preset_only(tmp_path):
    def names(cfg):
        return [s.name for s in Recipe(replace(cfg, corpus=str(tmp_path / "corpus")), tmp_path / "out").stages()]
    assert names(PRESETS["demo"]) == [s for s in STAGES if s not in ("query", "refit")]
    assert names(PRESETS["full"]) == STAGES


def one_question_a_split(out):
    """Supervision files whose one question is named for its split: what the final fit reads."""
    (out / "supervision").mkdir(parents=True)
    for split in ("train", "validation"):
        write_jsonl(out / "supervision" / f"{split}.jsonl", [{"question": split, "answers": ["a"]}])


def test_the_full_presets_rounds_chain_as_the_guides_runs_did(tmp_path, monkeypatch):
    """docs/notes/retrieval.md's `phrase-e2` (a second epoch from the first's best at 3e-5, seed 14) and
    `qft-e2-56` (three rounds of 2 query epochs, seeds 13-15, each from the last's model)."""
    import odqa.retriever.phrase_train as phrase_train
    import odqa.retriever.query_train as query_train
    calls = []
    monkeypatch.setattr(phrase_train, "train", lambda a: calls.append(
        ("phrase", a.model_config.encoder, a.out_dir, a.epochs, a.lr, a.seed)) or {"best_em": 1.0, "steps": 420})
    monkeypatch.setattr(query_train, "train_query", lambda a: calls.append(
        ("query", a.model, a.out_dir, a.epochs, a.seed)) or {"history": [{"questions": 9, "loss": 1.0}] * a.epochs})
    out = tmp_path / "out"
    demo = Recipe(replace(PRESETS["full"], corpus=str(tmp_path / "corpus"), encoder="minilm"), out)
    assert demo.train_phrase(resume=False) == {"validation_em": [1.0, 1.0], "steps": 840}
    assert demo.tune_query(resume=False)["epochs"] == 6
    one_question_a_split(out)
    assert demo.refit_query(resume=False)["epochs"] == 6
    assert calls == [("phrase", "minilm", str(out / "phrase"), 1, 5e-5, 13),
                     ("phrase", str(out / "phrase" / "best"), str(out / "phrase-r2"), 1, 3e-5, 14),
                     ("query", str(out / "phrase-r2" / "best"), str(out / "query"), 2, 13),
                     ("query", str(out / "query" / "last"), str(out / "query-r2"), 2, 14),
                     ("query", str(out / "query-r2" / "last"), str(out / "query-r3"), 2, 15),
                     # the final fit: the same chain on both files (docs/notes/retrieval.md, "A final fit")
                     ("query", str(out / "phrase-r2" / "best"), str(out / "query-final"), 2, 13),
                     ("query", str(out / "query-final" / "last"), str(out / "query-final-r2"), 2, 14),
                     ("query", str(out / "query-final-r2" / "last"), str(out / "query-final-r3"), 2, 15)]
    assert [q.question for q in load_questions(out / "query-final-data" / "train+validation.jsonl")] == \
        ["train", "validation"]
    assert demo.phrase_checkpoint() == out / "phrase-r2" / "best"


def test_lambda_is_tuned_with_the_query_rounds_that_did_not_see_validation(tmp_path, monkeypatch):
    """The final fit trains on validation, so what validation tunes (lambda, in the doc stage) searches
    with the train-only rounds; everything after it searches with the final fit's."""
    import odqa.retriever.doc_index as doc_index
    import odqa.retriever.doc_train as doc_train
    import odqa.retriever.tune_lambda as tune_lambda
    import odqa.system.recipe as demo_module
    from odqa.retriever.phrase_model import CONFIG_FILE
    out = tmp_path / "out"
    for name in ("query-r3", "query-final-r3"):
        (out / name / "last").mkdir(parents=True)
        (out / name / "last" / CONFIG_FILE).write_text("{}")
    demo = Recipe(replace(PRESETS["full"], corpus=str(tmp_path / "corpus")), out)
    assert demo.phrase_model() == out / "query-final-r3" / "last"
    assert demo.phrase_model(final=False) == out / "query-r3" / "last"
    # Without the final fit, rounds an earlier run left are not searched with.
    assert Recipe(replace(PRESETS["full"], query_final_fit=False), out).phrase_model() == out / "query-r3" / "last"
    tuned_with = []
    monkeypatch.setattr(doc_train, "train_doc", lambda a: {"best_top20": 1.0})
    monkeypatch.setattr(doc_index, "build_doc_index", lambda *a: None)
    monkeypatch.setattr(tune_lambda, "tune_searcher_lambda",
                        lambda searcher, *a, **kw: tuned_with.append(searcher) or {"lambda": 0.0, "bm25_weight": 0.0})
    monkeypatch.setattr(demo_module, "load_questions", lambda *a, **kw: [])
    monkeypatch.setattr(Recipe, "searcher", lambda self, reranked=False, final=True: self.phrase_model(final))
    demo.train_doc(resume=False)
    assert tuned_with == [out / "query-r3" / "last"]


def test_a_seed_moves_every_seed_of_the_chain_by_the_same_offset(tmp_path, monkeypatch):
    """`odqa demo --seed 1`: another draw of the whole chain, each trainer one seed on from the guides' runs."""
    import odqa.common.retrieval_file as retrieval_file
    import odqa.reader.fid_train as fid_train
    import odqa.reader.t5_init as t5_init
    import odqa.reader.warm_start as warm_start
    import odqa.retriever.cross_encoder_train as cross_encoder_train
    import odqa.retriever.doc_index as doc_index
    import odqa.retriever.doc_train as doc_train
    import odqa.retriever.phrase_train as phrase_train
    import odqa.retriever.query_train as query_train
    import odqa.retriever.retrieve as retrieve
    import odqa.retriever.tune_lambda as tune_lambda
    import odqa.system.recipe as demo_module
    seeds = []
    monkeypatch.setattr(phrase_train, "train", lambda a: seeds.append(("phrase", a.seed)) or {"best_em": 1.0, "steps": 1})
    monkeypatch.setattr(query_train, "train_query", lambda a: seeds.append(("query", a.seed)) or {"history": []})
    monkeypatch.setattr(doc_train, "train_doc", lambda a: seeds.append(("doc", a.seed)) or {"best_top20": 1.0})
    monkeypatch.setattr(doc_index, "build_doc_index", lambda *a: None)
    monkeypatch.setattr(tune_lambda, "tune_searcher_lambda", lambda *a, **kw: {"lambda": 0.0, "bm25_weight": 0.0})
    monkeypatch.setattr(demo_module, "load_questions", lambda *a, **kw: [])
    monkeypatch.setattr(warm_start, "init_warm_reader", lambda enc, out, init: seeds.append(("init", init.seed)))
    monkeypatch.setattr(t5_init, "init_reader", lambda texts, out, init: seeds.append(("t5 init", init.seed)))
    import odqa.reader.pretrain as pretrain
    monkeypatch.setattr(pretrain, "pretrain_reader", lambda a, loop: seeds.append(("pretrain", loop.seed)))
    monkeypatch.setattr(demo_module, "PassageStore", lambda corpus: type("NoPassages", (list,), {"close": list.clear})())
    monkeypatch.setattr(fid_train, "train_reader", lambda r, loop: seeds.append(("reader", loop.seed)) or {
        "evals": [{"em": 1.0}], "train_questions": 1})
    monkeypatch.setattr(retrieve, "retrieve_phrases", lambda *a: [])
    monkeypatch.setattr(retrieval_file, "write_results", lambda *a: None)
    scores = {"Top-1": 1.0, "MRR@20": 1.0}
    monkeypatch.setattr(cross_encoder_train, "train_reranker", lambda a: seeds.append(("reranker", a.seed)) or {
        "train_questions": 1, "steps": 1, "weight": 1.0, "weight_grid": [{"weight": 1.0, **scores}], "retriever": scores})

    def chain(seed, **changes):
        seeds.clear()
        demo = Recipe(replace(PRESETS["full"], corpus=str(tmp_path / "corpus"), encoder="minilm", seed=seed, **changes),
                      tmp_path / f"out{seed}{''.join(changes)}")
        monkeypatch.setattr(demo, "reader_data", lambda resume: ("train", "val"))
        monkeypatch.setattr(demo, "searcher", lambda **kw: None)
        one_question_a_split(demo.out)
        demo.train_phrase(resume=False)
        demo.tune_query(resume=False)
        demo.train_doc(resume=False)
        demo.refit_query(resume=False)
        demo.train_reader(resume=False)
        demo.train_reranker(resume=False)
        return list(seeds)

    guides = chain(0)
    assert guides == [("phrase", 13), ("phrase", 14), ("query", 13), ("query", 14), ("query", 15), ("doc", 13),
                      ("doc", 13), ("query", 13), ("query", 14), ("query", 15),   # the final fit
                      ("init", 0), ("reader", 0), ("reader", 0), ("reranker", 13)]
    assert chain(2) == [(name, seed + 2) for name, seed in guides]
    # a from-scratch T5's new weights and its pretraining move with the seed too
    t5 = chain(0, reader_kind="t5", pretrain_steps=10)
    assert t5[-5:-1] == [("t5 init", 0), ("pretrain", 0), ("reader", 0), ("reader", 0)]
    assert chain(2, reader_kind="t5", pretrain_steps=10) == [(name, seed + 2) for name, seed in t5]


def test_title_phrases_reach_every_phrase_round(tmp_path, monkeypatch):
    import odqa.retriever.phrase_train as phrase_train
    seen = []
    monkeypatch.setattr(phrase_train, "train", lambda a: seen.append(a.model_config.title_phrases) or {"best_em": 1.0,
                                                                                                       "steps": 1})
    cfg = updated(replace(PRESETS["full"], corpus=str(tmp_path / "corpus"), encoder="minilm"), phrase={"title_phrases": True})
    Recipe(cfg, tmp_path / "out").train_phrase(resume=False)
    assert seen == [True, True]


def test_machine_speed_times_float32_as_the_reference_machine_did(tmp_path, monkeypatch):
    """A CPU that computes bfloat16 natively encodes 2-4x faster in it than it trains in float32: timed in
    bfloat16, every stage's estimate came out short on such a machine."""
    import torch

    import odqa.retriever.dense as dense
    from odqa.common.corpus import build_corpus
    from odqa.system.estimate import REFERENCE, machine_speed
    dtypes = []

    class Timed:
        def __init__(self, name, max_tokens=256, device=None, dtype=None):
            dtypes.append(dtype)

        def encode(self, texts, batch_size=64):
            time.sleep(0.02 * len(texts))   # a machine that encodes a passage in 20 ms

    monkeypatch.setattr(dense, "MeanPoolEncoder", Timed)
    monkeypatch.setenv("ODQA_SEARCH_DTYPE", "bfloat16")
    corpus = tmp_path / "corpus"
    build_corpus([write_jsonl(tmp_path / "p.jsonl", [{"id": "a", "title": "a", "text": "a b c ."}])], corpus)
    expected = 0.02 / REFERENCE["encode_s"]
    assert expected <= machine_speed("minilm", corpus) < 3 * expected and dtypes == [torch.float32]


def test_only_a_reader_with_pretrained_embeddings_holds_them_fixed(tmp_path):
    def frozen(**changes):
        return Recipe(from_flat(RecipeConfig, {"corpus": str(tmp_path / "corpus"), **changes}),
                      tmp_path / "out")._reader_frozen()

    assert frozen() == {"freeze_embeddings": True, "freeze_layers": 2}
    assert frozen(reader_loop={"freeze_layers": 0}) == {"freeze_embeddings": True, "freeze_layers": 0}
    assert frozen(reader_kind="t5") == {"freeze_embeddings": False, "freeze_layers": 0}     # random embeddings
    assert frozen(reader_kind="t5", reader_model="t5-base")["freeze_embeddings"]
    full = Recipe(replace(PRESETS["full"], corpus=str(tmp_path / "corpus")), tmp_path / "full")
    assert full._reader_frozen() == {"freeze_embeddings": True, "freeze_layers": 2} and full.cfg.reader_loop.zero_stage == 0


def test_the_full_preset_runs_all_of_nq_test_and_the_first_3000_of_tqa_test(tmp_path):
    demo = Recipe(replace(PRESETS["full"], corpus=str(tmp_path / "corpus")), tmp_path / "out")
    assert demo.cfg.run.questions == ["nq-test", "tqa-test:3000"] and demo.cfg.run.limit is None
    assert demo._test_size("tqa-test:3000") == 3000
    assert Recipe(updated(demo.cfg, run={"limit": 100}), tmp_path / "out")._test_size("tqa-test:3000") == 100


def test_a_changed_setting_changes_its_stages_key_and_a_setting_added_later_leaves_the_keys(tmp_path):
    """A stage's key is the settings of the sections and fields it uses: changing one changes that
    stage's key (and so, by the chain, reruns the later ones), no other's; a setting added to a section
    since a record was written reads there as its default, so the record still counts."""
    def stages(**changes):
        cfg = from_flat(RecipeConfig, {"corpus": str(tmp_path / "corpus"), "query_rounds": 1, **changes})
        return {s.name: s for s in Recipe(cfg, tmp_path / "out").stages()}
    before = stages()
    for change, stage in (({"phrase_round_lrs": [3e-5]}, "phrase"), ({"phrase": {"title_phrases": True}}, "phrase"),
                          ({"index": {"keep": 0.5}}, "index"), ({"filter": {"hidden": 32}}, "index"),
                          ({"query_rounds": 2}, "query"), ({"gold_evals": 3}, "reader"),
                          ({"reader_passages": "phrase"}, "reader"), ({"search": {"top_docs": 7}}, "doc"),
                          ({"reading": {"num_beams": 2}}, "run")):
        after = stages(**change)
        changed = [name for name in before if before[name].settings != after[name].settings]
        assert changed[0] == stage, change
        assert set(changed) <= {stage, "run", "refit", "memory"}, change   # only where the same sections are read
    seeded = stages(seed=1)
    assert {n for n in before if before[n].settings != seeded[n].settings} == {"phrase", "index", "query", "doc",
                                                                            "reader"}
    # A record written before `hidden` was a setting of the filter: the stage is still done.
    demo = Demo(from_flat(RecipeConfig, {"corpus": str(tmp_path / "corpus")}), tmp_path / "out")
    stages_now = demo.recipe.stages()
    demo.stages_dir.mkdir(parents=True)
    from odqa.common.artifact import fingerprint, portable_key
    from odqa.common.io import write_json
    previous = None
    for s in stages_now:
        key = {"settings": portable_key(s.settings), "after": fingerprint(previous)}
        if s.name == "index":
            key = json.loads(json.dumps(key))
            del key["settings"]["filter"]["hidden"]
        write_json(demo.stages_dir / f"{s.name}.json", {"key": key})
        for out in s.outputs:
            out.mkdir(parents=True, exist_ok=True)
        previous = key
    assert all(demo.done(stages_now).values())
    changed = Demo(from_flat(RecipeConfig, {"corpus": str(tmp_path / "corpus"), "filter": {"hidden": 32}}), tmp_path / "out")
    done = changed.done(changed.recipe.stages())
    # other than its default: rebuilt, and the stages after it
    assert [name for name, key in done.items() if key is None] == ["index", "doc", "reader", "memory", "run"]


def test_stages_done_by_another_install_of_the_package_stay_done(tmp_path):
    """A stage key names the trainers' DeepSpeed JSON by where the package that wrote it was installed
    (the default, common/configs/zero2.json): a home built from another checkout or virtual environment
    keeps every finished stage."""
    from odqa.common.artifact import fingerprint, portable_key
    from odqa.common.io import write_json
    from odqa.common.settings import OptimArgs
    here = portable_key({"path": OptimArgs().deepspeed_config})["path"]
    elsewhere = "/check/work/main/common/configs/zero2.json"   # as that install wrote it
    demo = Demo(from_flat(RecipeConfig, {"corpus": str(tmp_path / "corpus")}), tmp_path / "out")
    stages = demo.recipe.stages()
    demo.stages_dir.mkdir(parents=True)
    previous, moved = None, 0
    for s in stages:
        text = json.dumps({"settings": portable_key(s.settings), "after": fingerprint(previous)})
        moved += text.count(json.dumps(here))
        key = json.loads(text.replace(json.dumps(here), json.dumps(elsewhere)))
        write_json(demo.stages_dir / f"{s.name}.json", {"key": key})
        for out in s.outputs:
            out.mkdir(parents=True, exist_ok=True)
        previous = key
    assert moved >= 3   # the phrase, document and reader trainers' sections name it
    assert all(demo.done(stages).values())


def test_a_home_that_0_1_built_keeps_its_finished_stages(tmp_path, monkeypatch):
    """The stage records of a demo directory 0.1 built (tests/data/demo-stages-0.1: the demo preset's,
    its keys of flat settings by name): every stage is done for the same recipe, and the run rewrites
    each record in this release's keys; a changed setting still reruns its stage."""
    from odqa.common.paths import default_corpus
    monkeypatch.setenv("ODQA_HOME", str(tmp_path / "home"))
    out = tmp_path / "home" / "runs" / "demo"
    records = Path(__file__).parent / "data" / "demo-stages-0.1"
    (out / "stages").mkdir(parents=True)
    for path in records.glob("*.json"):
        shutil.copy(path, out / "stages" / path.name)
    demo = Demo(RecipeConfig(), out)
    stages = demo.recipe.stages()
    assert demo.recipe.corpus == default_corpus()
    for s in stages:
        for path in s.outputs:
            path.mkdir(parents=True, exist_ok=True)
    assert all(demo.done(stages).values())
    assert all(demo.done(stages, upgrade=True).values())
    rewritten = {s.name: json.loads((out / "stages" / f"{s.name}.json").read_text())["key"] for s in stages}
    assert all("settings" in key and s.uses[0] in key["settings"] for s, key in zip(stages, rewritten.values()))
    assert all(Demo(RecipeConfig(), out).done(stages).values())          # done in this release's keys now
    other = Demo(updated(RecipeConfig(), reader={"k": 4}), out)
    assert [n for n, key in other.done(other.recipe.stages()).items() if key is None] == ["reader", "memory", "run"]


def test_the_reader_can_train_on_the_pipelines_own_passages(world, first_run, monkeypatch):
    from odqa.common.io import InputError
    from odqa.common.questions import load_questions
    from odqa.retriever.retrieve import retrieve_phrases
    out, cfg = world["root"] / "out", replace(world["cfg"], reader_passages="phrase")
    k = cfg.reader.k
    demo = Recipe(cfg, out)
    train, validation = demo.reader_data()
    assert (train.name, validation.name) == ("phrase-train.json", "phrase-validation.json")
    entries = json.loads(train.read_text())
    searched = retrieve_phrases(demo.searcher(), load_questions(out / "supervision" / "train.jsonl"), k)
    assert [[c["id"] for c in e["ctxs"]] for e in entries] == [[c["id"] for c in e["ctxs"]] for e in searched]
    assert all(len(e["ctxs"]) == k and all("phrase" in c for c in e["ctxs"]) for e in entries)
    val = json.loads(validation.read_text())
    assert 0 < len(val) <= cfg.reader.max_validation_examples and all(any(c["has_answer"] for c in e["ctxs"]) for e in val)
    # A resumed stage finds the files it wrote and searches no more.
    monkeypatch.setattr(Recipe, "searcher", lambda self: pytest.fail("searched again"))
    assert demo.reader_data(resume=True) == (train, validation)
    with pytest.raises(InputError, match="reader_passages must be one of bm25, phrase, not 'dense'"):
        replace(cfg, reader_passages="dense")


def test_a_phrase_model_that_finds_no_answer_is_searched_with_as_it_is(tmp_path, monkeypatch):
    import odqa.retriever.query_train as query_train

    def finds_none(args):
        (tmp_path / "out" / "query" / "checkpoint").mkdir(parents=True)
        raise query_train.NoPositives("no training question has a positive phrase among its top 100 phrases")
    monkeypatch.setattr(query_train, "train_query", finds_none)
    demo = Recipe(from_flat(RecipeConfig, {"corpus": str(tmp_path / "corpus"), "query_rounds": 1, "query": {"epochs": 1}}),
                  tmp_path / "out")
    assert demo.tune_query(resume=False)["epochs"] == 0
    assert not (tmp_path / "out" / "query").exists()
    assert demo.phrase_model() == tmp_path / "out" / "phrase" / "best"

    # A later round that finds none leaves the rounds before it as they are.
    from odqa.retriever.phrase_model import CONFIG_FILE

    def second_finds_none(args):
        out = tmp_path / "out2" / ("query" if args.out_dir.endswith("query") else "query-r2")
        if out.name == "query":
            (out / "last").mkdir(parents=True)
            (out / "last" / CONFIG_FILE).write_text("{}")
            return {"history": [{"epoch": 1, "questions": 3, "loss": 1.0}]}
        (out / "checkpoint").mkdir(parents=True)
        raise query_train.NoPositives("none")
    monkeypatch.setattr(query_train, "train_query", second_finds_none)
    demo = Recipe(from_flat(RecipeConfig, {"corpus": str(tmp_path / "corpus"), "query_rounds": 2, "query": {"epochs": 1}}),
                  tmp_path / "out2")
    assert demo.tune_query(resume=False) == {"epochs": 1, "questions_with_positive": [3], "loss": [1.0]}
    assert not (tmp_path / "out2" / "query-r2").exists()
    assert demo.phrase_model() == tmp_path / "out2" / "query" / "last"


def test_the_demo_becomes_the_default_pipeline_of_later_commands(world, first_run, tmp_path, capsys):
    from transformers.utils import logging as hf_logging

    from odqa.common.defaults import default_pipeline
    from odqa.system.cli import main
    run_demo(world["root"] / "out", cfg=world["cfg"])   # every stage reused; records the pipeline in this $ODQA_HOME
    out = world["root"] / "out"
    pipeline = default_pipeline()
    assert pipeline["phrase_index"] == (out / "phrase-index").resolve()
    assert pipeline["reader"] == (out / "reader" / "best").resolve()
    assert pipeline["phrase_model"] == (out / "query-final-r2" / "last").resolve()   # the final fit's last model
    assert pipeline["doc_index"] == (out / "doc-index").resolve()
    capsys.readouterr()
    run = tmp_path / "r.json"
    # transformers draws a "Loading weights" bar for each checkpoint opened, unless the load hides it
    # (`quiet_loading`, for that load only: no hook is left behind)
    previous_hook = hf_logging.set_tqdm_hook(None)
    try:
        assert main(["-q", "retrieve", "--retriever", "phrase", "--questions", str(world["root"] / "questions.jsonl"),
                     "--k", "3", "--out", str(run)]) == 0
        assert "Loading weights" not in capsys.readouterr().err
        entries = json.loads(run.read_text())
        assert len(entries) == len(NAMES) and all(e["ctxs"] and "prediction" in e for e in entries)
        assert main(["ask", "where was alice born", "--k", "2"]) == 0
        said = capsys.readouterr()
        assert "extractive:" in said.out and "generated:" in said.out
        assert "Loading weights" not in said.err
        assert odqa.load().ask("where was alice born", k=2).generated is not None   # the library as quiet
        assert "Loading weights" not in capsys.readouterr().err
        assert hf_logging.set_tqdm_hook(None) is None
    finally:
        hf_logging.set_tqdm_hook(previous_hook)
    assert main(["-q", "ask", "where was alice born", "--index", str(tmp_path / "nowhere")]) == 2  # a flag wins
    assert "not a phrase index" in capsys.readouterr().err


def test_a_model_is_recorded_with_the_index_built_from_it_never_beside_another(world, first_run, tmp_path):
    """A second demo whose phrase stage is done and whose index stage is not (a full preset run after
    the demo, say) leaves the recorded pair as it was: its new model beside the old index would make
    every search refuse to start. The pair moves once the index is built from the model."""
    from odqa.common.defaults import default_pipeline
    from odqa.retriever.phrase_model import phrase_encoder_hash
    out = world["root"] / "out"
    run_demo(out, cfg=world["cfg"])   # every stage reused; records the pipeline
    before = default_pipeline()
    second = Demo(world["cfg"], tmp_path / "second")
    model = second.recipe.phrase_checkpoint()
    shutil.copytree(out / model.relative_to(second.out), model)
    with open(model / "phrase_heads.pt", "ab") as heads:   # another training run's phrase side
        heads.write(b"\0")
    assert phrase_encoder_hash(model) != phrase_encoder_hash(before["phrase_model"])
    second.record()                                         # no index yet
    after = default_pipeline()
    assert (after["phrase_model"], after["phrase_index"]) == (before["phrase_model"], before["phrase_index"])
    shutil.copytree(out / "phrase-index", second.recipe.p["phrase-index"])
    second.record()                                         # an index, but built from the first demo's model
    assert default_pipeline()["phrase_model"] == before["phrase_model"]
    shutil.rmtree(model)
    shutil.copytree(out / model.relative_to(second.out), model)
    second.record()                                         # the model the index was built from: the pair moves
    after = default_pipeline()
    assert (after["phrase_model"], after["phrase_index"]) == (model.resolve(), second.recipe.p["phrase-index"].resolve())
    assert after["doc_index"] == before["doc_index"] and after["reader"] == before["reader"]
    run_demo(out, cfg=world["cfg"])   # the first demo's pipeline again, for the tests after this one
    assert default_pipeline()["phrase_index"] == before["phrase_index"]


def test_training_commands_read_the_demos_supervision_until_odqa_supervise_writes_its_own(world, first_run, tmp_path):
    from odqa.common.defaults import default_supervision
    from odqa.common.paths import default_corpus
    from odqa.system.cli import build_parser
    run_demo(world["root"] / "out", cfg=world["cfg"])   # every stage reused; records the pipeline
    demo_sup = (world["root"] / "out" / "supervision").resolve()
    own = default_corpus() / "supervision"
    assert not own.exists()
    assert default_supervision() == demo_sup
    for command in ("train-phrase", "train-teacher", "train-doc"):
        args = build_parser().parse_args([command, "--out", str(tmp_path / "m")])
        assert (args.train_file, args.validation_file) == (str(demo_sup / "train.jsonl"),
                                                          str(demo_sup / "validation.jsonl"))
    own.mkdir(parents=True)
    try:
        (own / "train.jsonl").write_text("")
        assert default_supervision() == own                  # `odqa supervise`'s own output wins
    finally:
        shutil.rmtree(own)


def test_a_broken_pipeline_record_leaves_the_training_commands_their_own_default(tmp_path, monkeypatch):
    from odqa.system.cli import build_parser
    monkeypatch.setenv("ODQA_HOME", str(tmp_path))
    (tmp_path / "pipeline.json").write_text("{not json")
    args = build_parser().parse_args(["train-phrase", "--out", str(tmp_path / "m")])
    assert args.train_file == str(tmp_path / "corpus" / "default" / "supervision" / "train.jsonl")


def test_without_a_default_pipeline_a_command_says_what_makes_one(capsys):
    from odqa.system.cli import main
    assert main(["-q", "ask", "who directed jaws"]) == 2
    assert "run `odqa demo`" in capsys.readouterr().err


def test_no_fixture_touched_the_users_cache(world, first_run):
    from conftest import USER_HOME

    from odqa.common.defaults import pipeline_file
    user_record = USER_HOME / "pipeline.json"
    assert pipeline_file() != user_record
    if user_record.exists():
        assert str(world["root"]) not in user_record.read_text()


def test_the_reranker_is_an_opt_in_stage_before_the_run_which_reads_through_it(world, first_run, tmp_path, monkeypatch):
    from odqa.common.defaults import default_pipeline
    from odqa.retriever.cross_encoder import CrossEncoder
    out = tmp_path / "out"
    shutil.copytree(world["root"] / "out", out)
    for preset in PRESETS.values():     # off in both presets
        assert "reranker" not in [s.name for s in Recipe(replace(preset, corpus=str(tmp_path / "c")), out).stages()]
    ran = []
    for name in ("train_reader", "train_reranker", "evaluate"):
        real = getattr(Recipe, name)
        monkeypatch.setattr(Recipe, name, lambda self, resume, real=real, name=name: ran.append(name) or real(self, resume))
    cfg = updated(replace(world["cfg"], with_reranker=True),
                  reranker={"batch_size": 1, "max_validation_examples": 4, "rerank_depth": 20})
    run_demo(out, cfg=cfg)
    assert ran == ["train_reranker", "evaluate"]          # the stages before it are reused
    result = json.loads((out / "stages" / "reranker.json").read_text())["result"]
    assert result["steps"] >= 1 and result["weight"] > 0 and "reranked MRR@20" in result
    entries = json.loads((out / "reranker-data" / "train.json").read_text())
    assert entries and all(0 < len(e["ctxs"]) <= 20 for e in entries)
    best = (out / "reranker" / "best").resolve()
    assert CrossEncoder.from_pretrained(best).weight == result["weight"]
    assert default_pipeline()["reranker"] == best  # ask and serve read through it too
    assert json.loads((out / "run" / "run_args.json").read_text())["parts"]["reranker"] == str(out / "reranker" / "best")

    # Turned off again: the run reruns without it, and the pipeline forgets the demo's reranker.
    ran.clear()
    run_demo(out, cfg=world["cfg"])
    assert ran == ["evaluate"]
    assert "reranker" not in default_pipeline()
    assert json.loads((out / "run" / "run_args.json").read_text())["parts"]["reranker"] is None


def test_the_answer_memory_is_a_stage_before_the_run_and_is_recorded_with_its_model(world, first_run, tmp_path, monkeypatch):
    from odqa.common.defaults import default_pipeline
    from odqa.retriever.answer_memory import memory_sets
    out = tmp_path / "out"
    shutil.copytree(world["root"] / "out", out)
    run_demo(out, cfg=world["cfg"])                     # every stage reused; this copy becomes the pipeline
    assert json.loads((out / "stages" / "memory.json").read_text())["result"] == {"questions": len(NAMES)}
    assert memory_sets(out / "memory") == world["cfg"].supervise.questions
    assert default_pipeline()["memory"] == (out / "memory").resolve()
    # (the run stage was reused from the copied demo, whose memory it consulted)
    assert json.loads((out / "run" / "run_args.json").read_text())["parts"]["memory"] == str(world["root"] / "out" / "memory")
    assert all("memory" in e for e in json.loads((out / "run" / "retrieval-test.json").read_text()))
    # the report's extractive EM is the phrase model's own answer; the memory's help, a column of its own
    rows = json.loads((out / "run" / "report.json").read_text())["rows"]
    assert all("extractive + memory EM" in r for r in rows)
    records = [json.loads(line) for line in (out / "run" / "questions.jsonl").read_text().splitlines()]
    entries = json.loads((out / "run" / "retrieval-test.json").read_text())
    assert [r["extractive"] for r in records] == [e["prediction_without_memory"] for e in entries]
    assert [r["extractive_memory"] for r in records] == [e["prediction"] for e in entries]
    ran = []
    for name in ("build_memory", "evaluate"):
        real = getattr(Recipe, name)
        monkeypatch.setattr(Recipe, name, lambda self, resume, real=real, name=name: ran.append(name) or real(self, resume))
    run_demo(out, cfg=replace(world["cfg"], answer_memory=False))
    assert ran == ["evaluate"]                               # off: the run reruns without it, and the pipeline forgets it
    assert "memory" not in default_pipeline()
    assert json.loads((out / "run" / "run_args.json").read_text())["parts"]["memory"] is None
    assert not any("memory" in e for e in json.loads((out / "run" / "retrieval-test.json").read_text()))
    assert not any("extractive + memory EM" in r for r in json.loads((out / "run" / "report.json").read_text())["rows"])
    run_demo(world["root"] / "out", cfg=world["cfg"])   # the first demo's pipeline again, for the tests after this one
    assert default_pipeline()["memory"] == (world["root"] / "out" / "memory").resolve()


def test_the_estimates_grow_with_the_work_and_follow_the_machine():
    from odqa.system.estimate import PRIOR_S, Estimates, refined
    cfg, sizes, frozen = RecipeConfig(), (12_374, 10_033, 6_725), {"freeze_embeddings": False, "freeze_layers": 0}
    base = Estimates(cfg, sizes, lambda name: 100, False, frozen)
    assert Estimates(updated(cfg, reader_loop={"max_steps": 2 * cfg.reader_loop.max_steps}), sizes, lambda name: 100,
                     False, frozen).reader() > base.reader()
    assert Estimates(cfg, sizes, lambda name: 100, True, frozen).reader() < base.reader()       # bf16 trains faster
    assert Estimates(cfg, sizes, lambda name: 1000, False, frozen).run() > base.run()
    assert Estimates(cfg, (2 * sizes[0], *sizes[1:]), lambda name: 100, False, frozen).index() > base.index()
    assert base.phrase_steps == cfg.phrase.epochs * (min(cfg.phrase.max_train_examples or sizes[2], sizes[2])
                                                     // cfg.phrase.batch_size)
    # the machine's speed: the calibration until stages finish, then pulled towards what they took
    assert refined(2.0, 0.0, 0.0) == 2.0
    assert refined(1.0, 3 * PRIOR_S, PRIOR_S) == 2.0


def test_a_preset_of_0_1s_flat_names_is_read_with_one_line_saying_so(tmp_path, capsys):
    old = tmp_path / "old.toml"
    old.write_text('reader_steps = 7\nrun_k = [3]\nrun_limit = "all"\ntext_maxlength = 100\nquery_epochs = 2\n')
    from odqa.system.recipe_config import preset_config
    cfg = preset_config(old)
    assert cfg == updated(RecipeConfig(), reader_loop={"max_steps": 7}, run={"k": [3], "limit": None},
                          reader={"text_maxlength": 100}, reading={"text_maxlength": 100}, query_rounds=1,
                          query={"epochs": 2})
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "0.1's flat names" in err and "write it in sections" in err


def test_the_recipes_are_files_and_a_file_of_ones_own_runs_the_same_way(tmp_path):
    from odqa.common.io import InputError
    from odqa.system.recipe_config import PRESET_DIR, preset_config, recipe_config
    assert sorted(p.stem for p in PRESET_DIR.glob("*.toml")) == sorted(PRESETS) == ["demo", "full"]
    assert preset_config("demo") == RecipeConfig()                    # the demo preset changes nothing
    full = preset_config(PRESET_DIR / "full.toml")
    assert full == PRESETS["full"] and full.run.limit is None and full.phrase.max_train_examples is None   # "all"
    mine = tmp_path / "mine.toml"
    mine.write_text('[reader_loop]\nmax_steps = 7\n[run]\nk = [3]\nlimit = "all"\n')
    assert preset_config(mine) == updated(RecipeConfig(), reader_loop={"max_steps": 7}, run={"k": [3], "limit": None})
    (tmp_path / "mine.json").write_text('{"reader_loop": {"max_steps": 7}, "run": {"limit": null}}')
    assert preset_config(tmp_path / "mine.json") == updated(RecipeConfig(), reader_loop={"max_steps": 7},
                                                            run={"limit": None})
    (tmp_path / "bad.toml").write_text("[reader_loop]\nmax_stpes = 7\n")
    with pytest.raises(InputError, match=r"bad.toml\[reader_loop\]: not settings of LoopArgs: max_stpes"):
        preset_config(tmp_path / "bad.toml")
    (tmp_path / "bad2.toml").write_text("reader_stpes = 7\n")
    with pytest.raises(InputError, match="bad2.toml: not settings of RecipeConfig: reader_stpes"):
        preset_config(tmp_path / "bad2.toml")
    with pytest.raises(InputError, match="unknown preset 'fast': one of demo, full"):
        preset_config("fast")
    (tmp_path / "list.json").write_text("[1, 2]")
    with pytest.raises(InputError, match="list.json: a table of settings, not list"):
        preset_config(tmp_path / "list.json")
    # the recipe on a corpus of one's own: built in the run's directory, not over the default corpus
    out = tmp_path / "out"
    assert recipe_config("full", out, documents="psgs.tsv.gz").corpus == str(out / "corpus")
    assert recipe_config("full", out, documents="psgs.tsv.gz", corpus="/data/c").corpus == "/data/c"
    assert recipe_config("demo", out).corpus is None
