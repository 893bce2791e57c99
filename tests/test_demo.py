"""`odqa demo` end to end on a tiny world with tiny models: every stage runs and the report comes
out; a rerun reuses every stage; a changed setting reruns its stage and the later ones only; an
interrupted stage resumes and one started with other settings starts over."""
import json
import random
import shutil
from dataclasses import replace

import pytest
from tiny_data import write_jsonl
from tiny_models import make_tiny_bert

from odqa.common.device import cpu_has_bf16
from odqa.system.demo import PRESETS, Demo, DemoConfig, Stage, run_demo

NAMES = ["alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi", "ivan", "judy", "kim", "leo"]
CITIES = ["paris", "rome", "oslo", "lima", "cairo", "delhi", "tokyo", "quito", "accra", "hanoi", "dakar", "riga"]
FILLER = "the weather was mild and the river ran slowly past old mills and quiet farms".split()
STAGES = ["data", "supervise", "phrase", "index", "query", "doc", "reader", "run"]


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
    cfg = DemoConfig(
        documents=str(write_jsonl(root / "docs.jsonl", docs)), corpus=str(root / "corpus"),
        train_questions=[str(write_jsonl(root / "questions.jsonl", questions))],
        test_questions=[str(root / "questions.jsonl")], validation_percent=50, validation_questions=4,
        encoder=str(make_tiny_bert(root / "bert", texts)),
        phrase_examples=None, phrase_batch=2, max_passage_tokens=48,
        query_epochs=1,                                                              # off in the demo preset
        doc_examples=None, doc_batch=2, max_doc_tokens=48, doc_validation_docs=4, top_docs=6, lambda_questions=4,
        reader_gold_steps=2, reader_gold_batch=2, reader_steps=3, reader_batch=2,   # bert2bert from the tiny BERT
        reader_k=2, reader_questions=None, reader_validation=2, text_maxlength=40,
        run_limit=None, run_k=[1, 3], examples=2)
    return {"root": root, "cfg": cfg}


@pytest.fixture(scope="module")
def first_run(world):
    return run_demo(world["root"] / "out", cfg=world["cfg"])


def test_demo_runs_every_stage_and_prints_the_report(world, first_run, capsys):
    out = world["root"] / "out"
    assert all((out / "stages" / f"{s}.json").exists() for s in STAGES)
    assert not list((out / "stages").glob("*.started.json"))
    table = [line for line in first_run.splitlines() if line.startswith("| questions |")]
    assert len(table) == 2, first_run  # one row per k
    assert first_run.count("   extractive: ") == 2 and first_run.count("   generated:  ") == 2
    assert (out / "run" / "report.json").exists() and (out / "run" / "topk.png").exists()
    # The reader was warm-started from the encoder and trained on the gold passages first.
    assert (out / "reader-init" / "reader_init.json").exists() and (out / "reader-gold" / "best").exists()
    # In bfloat16 autocast where the CPU computes it natively, else as `--precision auto` chooses.
    loop = json.loads((out / "reader" / "train_config.json").read_text())["loop"]
    assert loop["precision"] == ("bf16" if cpu_has_bf16() else "auto")
    # The question encoders were tuned against the index, on the questions whose top phrases hold an answer.
    query = json.loads((out / "stages" / "query.json").read_text())["result"]
    assert query["epochs"] == 1 and query["questions_with_positive"][0] > 0


def test_reader_validation_holds_questions_with_an_answer_in_their_top_k(world, first_run, tmp_path):
    cfg = world["cfg"]
    val = json.loads((world["root"] / "out" / "reader-data" / "bm25-validation.json").read_text())
    assert 0 < len(val) <= cfg.reader_validation
    assert all(any(c["has_answer"] for c in e["ctxs"][:cfg.reader_k]) for e in val)

    def validation_ids(answers: list[str]) -> list[str]:
        out = tmp_path / "-".join(answers)
        (out / "supervision").mkdir(parents=True)
        questions = [{"id": n, "question": f"where was {n} born", "answers": [a]} for n, a in zip(NAMES, answers)]
        for split in ("train", "validation"):
            write_jsonl(out / "supervision" / f"{split}.jsonl", questions)
        return [e["id"] for e in json.loads(Demo(cfg, out).reader_data()[1].read_text())]

    # The unanswerable first two are passed over (answers that no passage holds) ...
    assert validation_ids(["atlantis", "atlantis", *CITIES[2:5]]) == NAMES[2:2 + cfg.reader_validation]
    # ... and where none is answerable, the first ones stay, so that validation still runs.
    assert validation_ids(["atlantis"] * 4) == NAMES[:cfg.reader_validation]


def test_rerun_reuses_every_stage(world, first_run, monkeypatch):
    for name in ("build_data", "supervise", "train_phrase", "build_phrase_index", "tune_query", "train_doc",
                 "train_reader", "run"):
        monkeypatch.setattr(Demo, name, lambda self, resume, name=name: pytest.fail(f"{name} ran again"))
    assert run_demo(world["root"] / "out", cfg=world["cfg"]).split("example questions")[0] == \
        first_run.split("example questions")[0]


def test_a_changed_setting_reruns_that_stage_and_the_later_ones(world, first_run, monkeypatch):
    ran = []
    for name, stage in (("build_data", "data"), ("supervise", "supervise"), ("train_phrase", "phrase"),
                        ("build_phrase_index", "index"), ("tune_query", "query"), ("train_doc", "doc"),
                        ("train_reader", "reader"),
                        ("run", "run")):
        real = getattr(Demo, name)
        monkeypatch.setattr(Demo, name, lambda self, resume, real=real, stage=stage: ran.append(stage) or real(self, resume))
    run_demo(world["root"] / "out", cfg=replace(world["cfg"], top_docs=5))
    assert ran == ["doc", "reader", "run"]


def test_interrupted_stage_resumes_and_other_settings_start_over(tmp_path):
    demo = Demo(DemoConfig(corpus=str(tmp_path / "corpus")), tmp_path / "out")
    demo.stages_dir.mkdir(parents=True)
    work = tmp_path / "work"
    calls = []

    def fn(resume):
        calls.append((resume, work.exists()))
        if len(calls) == 1:
            work.mkdir()
            raise KeyboardInterrupt  # interrupted after writing a checkpoint
        return {"ok": True}
    stage = Stage("train", "a training stage", 1.0, fn, {"lr": 1}, [work], clean=[work])
    key = {"settings": {"lr": 1}, "after": "x"}
    with pytest.raises(KeyboardInterrupt):
        demo._run_stage(stage, key)
    assert demo._run_stage(stage, key) == {"ok": True}
    assert calls == [(False, False), (True, True)]  # resumed, checkpoint kept
    assert demo._done(stage, key)
    (demo.stages_dir / "train.json").unlink()
    (demo.stages_dir / "train.started.json").write_text('{"key": {"settings": {"lr": 2}}}')
    calls.clear()
    calls.append("skip the interruption")
    demo._run_stage(stage, key)
    assert calls[1:] == [(False, False)]  # the other run's output was cleared, no resume


def test_query_side_tuning_is_a_stage_of_the_full_preset_only(tmp_path):
    def names(cfg):
        return [s.name for s in Demo(replace(cfg, corpus=str(tmp_path / "corpus")), tmp_path / "out").stages()]
    assert names(PRESETS["demo"]) == [s for s in STAGES if s != "query"] and names(PRESETS["full"]) == STAGES


def test_a_phrase_model_that_finds_no_answer_is_searched_with_as_it_is(tmp_path, monkeypatch):
    import odqa.retriever.query_train as query_train

    def finds_none(args):
        (tmp_path / "out" / "query" / "checkpoint").mkdir(parents=True)
        raise query_train.NoPositives("no training question has a positive phrase among its top 100 phrases")
    monkeypatch.setattr(query_train, "train_query", finds_none)
    demo = Demo(DemoConfig(corpus=str(tmp_path / "corpus"), query_epochs=1), tmp_path / "out")
    assert demo.tune_query(resume=False)["epochs"] == 0
    assert not (tmp_path / "out" / "query").exists()
    assert demo.phrase_model() == tmp_path / "out" / "phrase" / "best"


def test_the_demo_becomes_the_default_pipeline_of_later_commands(world, first_run, tmp_path, capsys):
    from odqa.common.defaults import default_pipeline
    from odqa.system.cli import main
    run_demo(world["root"] / "out", cfg=world["cfg"])   # every stage reused; records the pipeline in this $ODQA_HOME
    out = world["root"] / "out"
    pipeline = default_pipeline()
    assert pipeline["phrase_index"] == (out / "phrase-index").resolve()
    assert pipeline["reader"] == (out / "reader" / "best").resolve()
    assert pipeline["phrase_model"] == (out / "query" / "last").resolve()   # the query-tuned model
    assert pipeline["doc_index"] == (out / "doc-index").resolve()
    capsys.readouterr()
    run = tmp_path / "r.json"
    assert main(["-q", "retrieve", "--retriever", "phrase", "--questions", str(world["root"] / "questions.jsonl"),
                 "--k", "3", "--out", str(run)]) == 0
    entries = json.loads(run.read_text())
    assert len(entries) == len(NAMES) and all(e["ctxs"] and "prediction" in e for e in entries)
    assert main(["-q", "ask", "where was alice born", "--k", "2"]) == 0
    said = capsys.readouterr().out
    assert "extractive:" in said and "generated:" in said
    assert main(["-q", "ask", "where was alice born", "--index", str(tmp_path / "nowhere")]) == 2  # a flag wins
    assert "not a phrase index" in capsys.readouterr().err


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
