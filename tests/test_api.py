"""odqa as a notebook user meets it: `odqa.load` a pipeline, ask one question and many, search at each
unit, read given passages, and round-trip an `Answer` through JSON."""
import dataclasses
import json
import subprocess
import sys

import pytest
import torch
from tiny_data import TINY_QUESTIONS
from tiny_models import make_tiny_system

import odqa
from odqa.common.io import InputError
from odqa.common.settings import from_flat


@pytest.fixture(scope="module")
def record(tmp_path_factory):
    """A pipeline directory: the tiny system's parts, recorded as `odqa demo` records its own."""
    world = make_tiny_system(tmp_path_factory.mktemp("api"))
    paths = {"corpus": world["corpus"], "phrase_model": world["phrase"], "phrase_index": world["index"],
             "reader": world["t5"]}
    (world["root"] / "pipeline.json").write_text(json.dumps({k: str(v) for k, v in paths.items()}))
    return world["root"]


@pytest.fixture(scope="module")
def qa(record):
    return odqa.load(record)


QUESTIONS = [q["question"] for q in TINY_QUESTIONS[:3]]


def test_ask_one_question_and_many(qa):
    one = qa.ask(QUESTIONS[0], k=3)
    assert isinstance(one, odqa.Answer) and one.question == QUESTIONS[0]
    assert isinstance(one.generated, str) and len(one.passages) == 3
    assert all(isinstance(p, odqa.Passage) for p in one.passages)
    ex = one.extractive
    assert isinstance(ex, odqa.Phrase) and 0 < ex.support <= 1
    source = next(p for p in one.passages if p.id == ex.passage_id)
    assert (source.title if ex.in_title else source.text)[ex.char_start:ex.char_end] == ex.text != ""
    many = qa.ask(QUESTIONS, k=3)
    assert [a.question for a in many] == QUESTIONS
    # the same search (scores differ in the last bits: the question encoder reads a batch)
    assert (many[0].extractive.text, [p.id for p in many[0].passages]) == (ex.text, [p.id for p in one.passages])
    assert qa.ask([], k=3) == []


def test_an_answer_round_trips_through_json(qa):
    a = qa.ask(QUESTIONS[1], k=2)
    back = odqa.Answer.from_dict(json.loads(json.dumps(a.to_dict())))
    assert back == a and back.timings == a.timings
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.generated = "changed"


@pytest.mark.parametrize("unit, kind", [("phrase", odqa.Phrase), ("passage", odqa.Passage), ("document", odqa.Document)])
def test_search_at_each_unit(qa, unit, kind):
    one = qa.search(QUESTIONS[0], k=2, unit=unit)
    assert 1 <= len(one) <= 2 and all(isinstance(x, kind) for x in one)
    many = qa.search(QUESTIONS, k=2, unit=unit)
    assert len(many) == 3 and [type(x) for x in many[0]] == [type(x) for x in one]
    if unit != "phrase":
        assert [x.score for x in one] == sorted((x.score for x in one), reverse=True)


def test_read_given_passages(qa):
    a = qa.ask(QUESTIONS[0], k=2)
    assert qa.read(QUESTIONS[0], a.passages) == a.generated     # the same passages, the same reader
    assert isinstance(qa.read(QUESTIONS[0], ["Mount Everest is 8,849 metres tall."]), str)
    with pytest.raises(InputError, match="at least one passage"):
        qa.read(QUESTIONS[0], [])


def test_overrides_apply_to_one_call(qa):
    voted = qa.ask(QUESTIONS[0], k=3)
    first = qa.ask(QUESTIONS[0], k=3, answer_depth=1)            # the first passage's phrase, no vote
    assert first.extractive.text == first.passages[0].phrase.text
    assert qa.searcher.config.answer.answer_depth != 1 and qa.ask(QUESTIONS[0], k=3) == voted   # the pipeline is unchanged
    assert isinstance(qa.ask(QUESTIONS[0], k=3, decoding="free", max_new_tokens=4).generated, str)
    with pytest.raises(InputError, match="unknown settings: depth"):
        qa.ask(QUESTIONS[0], depth=3)
    with pytest.raises(InputError, match="--answer-depth: must be at least 1"):
        qa.ask(QUESTIONS[0], answer_depth=0)
    with pytest.raises(InputError, match="unit must be one of"):
        qa.search(QUESTIONS[0], unit="sentence")


def test_load_takes_the_default_a_directory_or_a_file_and_names_what_is_missing(record, isolated_home):
    with pytest.raises(InputError, match="run `odqa demo`"):
        odqa.load()
    isolated_home.mkdir(parents=True, exist_ok=True)
    recorded = json.loads((record / "pipeline.json").read_text())
    (isolated_home / "pipeline.json").write_text(json.dumps(recorded))
    assert odqa.load().ask(QUESTIONS[0], k=1).passages          # "default": $ODQA_HOME/pipeline.json
    assert odqa.load(record / "pipeline.json", answer_depth=1).searcher.config.answer.answer_depth == 1
    gone = isolated_home / "gone.json"
    gone.write_text(json.dumps({**recorded, "reader": str(record / "no-reader")}))
    with pytest.raises(InputError, match="no-reader"):
        odqa.load(gone)
    tuned = isolated_home / "tuned.json"   # a record's own settings, which load's keywords override
    tuned.write_text(json.dumps({**recorded, "settings": {"answer_depth": 1, "decoding": "free"}}))
    qa = odqa.load(tuned)
    assert (qa.searcher.config.answer.answer_depth, qa.settings.decoding) == (1, "free")
    assert odqa.load(tuned, answer_depth=3).searcher.config.answer.answer_depth == 3
    tuned.write_text(json.dumps({**recorded, "settings": {"depth": 1}}))
    with pytest.raises(InputError, match='tuned.json: "settings" holds what is not a search or reading setting: '
                                         'unknown settings: depth'):
        odqa.load(tuned)
    tuned.write_text(json.dumps({**recorded, "settings": {"answer_depth": 0}}))
    with pytest.raises(InputError, match="--answer-depth: must be at least 1"):
        odqa.load(tuned)
    partial = isolated_home / "partial.json"
    partial.write_text(json.dumps({k: v for k, v in recorded.items() if k != "phrase_index"}))
    with pytest.raises(InputError, match="records no phrase index"):
        odqa.load(partial)


def test_import_odqa_loads_no_torch():
    code = "import sys, odqa; print(sorted({'torch', 'transformers', 'faiss', 'numpy'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("config, commands", [
    ("SearchConfig", ("retrieve", "ask", "serve", "run", "tune-lambda")),
    ("ReaderSettings", ("read", "ask", "serve", "run"))])
def test_each_setting_is_one_flag_of_every_command_that_uses_it(config, commands):
    """SearchConfig and ReaderSettings are the one declaration of their settings: every field is exactly
    one flag of each command that searches (reads), unset unless given (so that a pipeline record's
    settings can fill it), its help showing the field's default, and `odqa run`'s settings embed both
    whole."""
    import dataclasses

    from odqa.common.settings import flag_of, leaves
    from odqa.reader.args import ReaderSettings
    from odqa.retriever.search_config import SearchConfig
    from odqa.system.args import RunArgs
    from odqa.system.cli import build_parser
    cls = {"SearchConfig": SearchConfig, "ReaderSettings": ReaderSettings}[config]
    parsers = build_parser()._subparsers._group_actions[0].choices
    for name in commands:
        for flat_name, _, f in leaves(cls):
            owners = [a for a in parsers[name]._actions if flag_of(f, flat_name) in a.option_strings]
            assert len(owners) == 1 and owners[0].dest == flat_name, (name, flat_name)
            # `read` reads with a reader it is given, not a pipeline's: its defaults are the fields'
            assert owners[0].default == (f.default if name == "read" else None), (name, flat_name)
            assert f.default is None or "(default: " in owners[0].help or owners[0].nargs == 0, (name, flat_name)
    assert any(f.metadata.get("section") is cls for f in dataclasses.fields(RunArgs))


def test_a_pipeline_records_settings_are_the_defaults_of_the_flags_not_given(tmp_path):
    """`odqa demo` records the settings its report was made with (text_maxlength 128 where the field
    says 200); `ask`, `serve`, `run` and `retrieve` then search and read with them unless a flag says
    otherwise. The search settings come with the default phrase index, the reading ones with its reader."""
    from odqa.common.defaults import pipeline_file, record_pipeline
    from odqa.common.io import InputError
    from odqa.system.args import RunArgs
    from odqa.system.cli import build_parser
    from odqa.system.commands.args import dataclass_from_args
    from odqa.system.commands.retrieval import pipeline_of
    paths = {name: tmp_path / name for name in ("phrase_index", "phrase_model", "reader", "corpus")}
    for path in paths.values():
        path.mkdir()
    record_pipeline(paths, by="test", settings={"top_docs": 7, "text_maxlength": 64})
    parser = build_parser()

    def ask(*flags):
        p = pipeline_of(parser.parse_args(["ask", "q", *flags]), reader=True)
        return p.parts.index, p.search_config.prefilter.top_docs, p.settings.text_maxlength

    index = str(paths["phrase_index"].resolve())
    assert ask() == (index, 7, 64)
    assert ask("--top-docs", "9", "--text-maxlength", "32") == (index, 9, 32)
    mine = str(tmp_path / "mine")   # an index of one's own: the record's search settings stay with its own
    assert ask("--index", mine) == (mine, 100, 64)
    assert ask("--reader", mine)[1:] == (7, 200)
    p = pipeline_of(parser.parse_args(["retrieve", "--retriever", "phrase", "--questions", "q", "--out", "o"]))
    assert (p.search_config.prefilter.top_docs, p.settings.text_maxlength) == (7, 200)   # no reader: not its settings
    # `odqa run` takes them the same way (cmd_run); in Python, RunArgs are as given
    run = dataclass_from_args(RunArgs, parser.parse_args(["run", "--out", "o"]), {"top_docs": 7})
    assert run.search.prefilter.top_docs == 7 and run.reading.text_maxlength == 200 and run.evaluation.k == [5, 10, 25, 50]
    record_pipeline({}, by="test", settings={"top_doc": 7})
    with pytest.raises(InputError, match=f"{pipeline_file()}: \"settings\" holds .*unknown settings: top_doc"):
        ask()


def test_odqa_run_leaves_the_memory_out_unless_asked_and_says_when_there_is_none(tmp_path):
    """The report's extractive EM is the phrase model's own answer, as the papers give it: `run` takes the
    default pipeline's answer memory only with --with-memory, and refuses that where there is none."""
    from odqa.common.defaults import record_pipeline
    from odqa.common.io import InputError
    from odqa.system.args import RunArgs
    from odqa.system.run import run
    paths = {name: tmp_path / name for name in ("phrase_index", "phrase_model", "reader", "corpus")}
    for path in paths.values():
        path.mkdir()
    record_pipeline(paths, by="test")
    with pytest.raises(InputError, match="--with-memory: there is no answer memory to consult"):
        run(from_flat(RunArgs, dict(out_dir=str(tmp_path / "run"), with_memory=True)))
    assert from_flat(RunArgs, dict(out_dir=str(tmp_path / "run"))).evaluation.with_memory is False


def test_odqa_runs_command_leaves_the_default_pipelines_memory_out_unless_asked(tmp_path, capsys):
    """Through the CLI too: a pipeline with a memory that holds the evaluated set is refused only when
    --with-memory brings that memory in; without it the run goes on (here to the next missing part)."""
    from odqa.common.defaults import record_pipeline
    from odqa.system.cli import main
    questions = tmp_path / "q.jsonl"
    questions.write_text('{"id": "1", "question": "q", "answers": ["a"]}\n')
    paths = {name: tmp_path / name for name in ("phrase_index", "phrase_model", "reader", "corpus", "memory")}
    for path in paths.values():
        path.mkdir()
    (paths["memory"] / "manifest.json").write_text(json.dumps({"key": {"sets": [str(questions)]}}))
    record_pipeline(paths, by="test")
    argv = ["-q", "run", "--out", str(tmp_path / "run"), "--questions", str(questions), "--baselines", "none"]
    assert main([*argv, "--with-memory"]) == 2
    assert "which this run evaluates" in capsys.readouterr().err
    assert main(argv) == 2
    assert "which this run evaluates" not in capsys.readouterr().err


def test_an_answer_says_where_its_time_went(qa):
    stages = qa.ask(QUESTIONS[0], k=3).timings["stages_ms"]
    assert {"question encoders", "phrase search", "aggregation", "reader encoder", "reader decoder"} <= set(stages)
    assert all(ms >= 0 for ms in stages.values())
    # each stage's own time: together no more than the whole
    a = qa.ask(QUESTIONS[0], k=3).timings
    assert sum(a["stages_ms"].values()) <= a["retrieve_ms"] + a["read_ms"] + 1


def test_the_api_names_a_bad_argument_and_what_it_takes(qa, record):
    for call, error, said in (
            (lambda: qa.ask(None), TypeError, "question must be a string or a list of strings, not NoneType"),
            (lambda: qa.ask(3), TypeError, "question must be a string or a list of strings, not int"),
            (lambda: qa.ask(["who", 3]), TypeError, "question 1 must be a string, not int"),
            (lambda: qa.ask("who", k=1.5), TypeError, "k must be a whole number"),
            (lambda: qa.ask("who", k="5"), TypeError, "k must be a whole number"),
            (lambda: qa.ask("who", k=None), TypeError, "k must be a whole number"),
            (lambda: qa.ask("who", k=0), InputError, "k must be in 1..100, not 0"),
            (lambda: qa.ask("   "), InputError, "question is empty"),
            (lambda: qa.ask("\u200b\u200b\u2060"), InputError, "question has no visible characters"),
            (lambda: qa.ask("who\udcff"), InputError, "lone surrogate"),
            (lambda: qa.ask("who " * 30_000), InputError, "question is longer than 1000 characters"),
            (lambda: qa.search(None), TypeError, "question must be a string"),
            (lambda: qa.read("who", [None]), TypeError, r"passages\[0\] must be a Passage, a text or a \(title, text\) pair"),
            (lambda: qa.read("who", [("one",)]), TypeError, r"passages\[0\] must be"),
            (lambda: qa.read("who", "a passage"), TypeError, "passages must be a list of passages, not str"),
            (lambda: qa.read(None, ["text"]), TypeError, "question must be a string, not NoneType"),
            (lambda: odqa.load(record, device="tpu9"), InputError, "device 'tpu9' is not a torch device"),
    ):
        with pytest.raises(error, match=said):
            call()
    if not torch.cuda.is_available():
        with pytest.raises(InputError, match="device 'cuda': torch sees no CUDA GPU here"):
            odqa.load(record, device="cuda")
