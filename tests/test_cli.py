"""The `odqa` command's wiring: help, each subcommand end to end on a tiny corpus, errors."""
import argparse
import json
import re
import subprocess
import sys

import pytest

from odqa.system.cli import build_parser, main

SUBCOMMANDS = ["demo", "data fetch", "corpus build", "supervise", "retrieve", "eval-retrieval"]


def test_console_script_lists_subcommands():
    out = subprocess.run([sys.executable, "-m", "odqa.system.cli", "--help"], capture_output=True, text=True, check=True)
    for name in ["demo", "data", "corpus", "supervise", "retrieve", "eval-retrieval"]:
        assert name in out.stdout


@pytest.mark.parametrize("sub", SUBCOMMANDS)
def test_each_subcommand_explains_its_flags(sub, capsys):
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(sub.split() + ["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: odqa " + sub) and "--" in out


def test_build_retrieve_evaluate_supervise(tmp_path, tiny_docs, tiny_questions, capsys):
    corpus = tmp_path / "corpus"
    assert main(["-q", "corpus", "build", "--input", str(tiny_docs), "--out", str(corpus)]) == 0
    assert "6 passages from 4 documents" in capsys.readouterr().out

    run = tmp_path / "run.json"
    assert main(["-q", "retrieve", "--questions", str(tiny_questions), "--corpus", str(corpus),
                 "--k", "5", "--out", str(run)]) == 0
    entries = json.loads(run.read_text())
    assert len(entries) == 5 and all(len(e["ctxs"]) == 5 for e in entries)

    assert main(["-q", "eval-retrieval", str(run), "--corpus", str(corpus), "--topk", "1", "5",
                 "--json", str(tmp_path / "m.json")]) == 0
    table = capsys.readouterr().out
    assert "| run | all | 5 |" in table and "| run | answerable | 4 |" in table
    metrics = json.loads((tmp_path / "m.json").read_text())
    assert metrics["run"]["answerable"]["Top-5"] == 100.0

    # a FiD-format file, its ctxs without flags: scored by flags computed from the texts, the same figures
    fid = tmp_path / "fid.jsonl"
    fid.write_text("".join(json.dumps({**e, "ctxs": [{k: v for k, v in c.items() if k != "has_answer"}
                                                     for c in e["ctxs"]]}) + "\n" for e in entries))
    flipped = tmp_path / "flipped.json"
    flipped.write_text(json.dumps([{**e, "ctxs": [{**c, "has_answer": not c["has_answer"]} for c in e["ctxs"][:2]]
                                    + e["ctxs"][2:]} for e in entries]))
    assert main(["-q", "eval-retrieval", str(fid), str(flipped), "--corpus", str(corpus), "--topk", "1", "5",
                 "--recompute-has-answer", "--json", str(tmp_path / "m2.json")]) == 0
    out = capsys.readouterr().out
    recomputed = json.loads((tmp_path / "m2.json").read_text())
    assert recomputed["fid"] == recomputed["flipped"] == metrics["run"]
    assert f"{fid}: has_answer computed from each ctx's text (DPR's rule), the file holding none" in out
    assert f"{flipped}: has_answer computed from each ctx's text (DPR's rule); 10 of the file's 25 flags disagreed" in out

    assert main(["-q", "supervise", "--questions", str(tiny_questions), "--corpus", str(corpus),
                 "--validation-percent", "0"]) == 0
    assert "| tiny-q | 5 | 4 | 80.0 |" in capsys.readouterr().out
    assert (corpus / "supervision" / "train.jsonl").exists()


def test_only_commands_that_load_checkpoints_import_transformers(tmp_path, tiny_corpus, tiny_questions):
    """The light commands must not pay for importing transformers (half a second)."""
    def imports_transformers(*argv) -> bool:
        code = ("import sys; from odqa.system.cli import main; "
                f"assert main({list(argv)!r}) == 0; print('transformers' in sys.modules)")
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        return done.stdout.split()[-1] == "True"

    assert not imports_transformers("-q", "retrieve", "--questions", str(tiny_questions), "--corpus", str(tiny_corpus),
                                    "--k", "2", "--out", "r.json")
    assert not imports_transformers("-q", "eval-retrieval", "r.json", "--corpus", str(tiny_corpus))


@pytest.mark.parametrize("argv, message", [
    (["retrieve", "--questions", "no-such-set", "--out", "x.json"], "unknown question set 'no-such-set'"),
    (["retrieve", "--questions", "nq-test", "--out", "x.json"], "run `odqa data fetch` first"),
    (["corpus", "build", "--input", "/nonexistent.jsonl", "--out", "c"], "corpus input not found: /nonexistent.jsonl"),
    (["eval-retrieval", "/nonexistent.json"], "file not found: /nonexistent.json"),
])
def test_bad_input_exits_2_with_a_message_naming_it(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_empty_question_is_refused_with_its_line(tmp_path, tiny_corpus, capsys):
    questions = tmp_path / "q.jsonl"
    questions.write_text('{"question": "fine", "answers": ["a"]}\n{"question": "  ", "answers": ["b"]}\n')
    assert main(["retrieve", "--questions", str(questions), "--corpus", str(tiny_corpus), "--out", "r.json"]) == 2
    assert f'{questions}:2: empty or missing "question"' in capsys.readouterr().err


@pytest.mark.parametrize("old, new, dest, value", [
    ("--out-dir", "--out", "out_dir", "runs/x"),          # train-reader's output directory
    ("--n-passages", "--k", "k", 7),                      # passages per question
    ("--max-validation", "--max-validation-examples", "max_validation_examples", 9),
])
def test_old_flag_spellings_still_work_and_say_the_new_one(old, new, dest, value, capsys):
    base = ["train-reader", "--model", "m"]
    then = build_parser().parse_args([*base, old, str(value)] + (["--out", "o"] if dest != "out_dir" else []))
    now = build_parser().parse_args([*base, new, str(value)] + (["--out", "o"] if dest != "out_dir" else []))
    assert getattr(then, dest) == getattr(now, dest) == value
    err = capsys.readouterr().err
    assert err.count("deprecated") == 1 and f"{old} is deprecated" in err and f"use {new}" in err
    read = build_parser().parse_args(["read", "--model", "m", "--input", "i", "--out", "o", "--beams", "3"])
    assert read.num_beams == 3 and "--beams is deprecated" in capsys.readouterr().err


@pytest.mark.parametrize("argv, old, new, dest, value", [
    (["train-query", "--model", "m", "--index", "i", "--out", "o"], ["--max-questions", "5"], "--max-train-examples",
     "max_train_examples", 5),
    (["train-reranker", "--train-file", "t", "--validation-file", "v", "--out", "o"], ["--depth", "7"], "--rerank-depth",
     "rerank_depth", 7),
    (["train-reranker", "--train-file", "t", "--validation-file", "v", "--out", "o"], ["--negatives", "2"],
     "--negatives-per-question", "negatives_per_question", 2),
    (["reader", "init"], ["--preset", "small"], "--shape", "shape", "small"),
    (["reader", "cloze", "--out", "c.jsonl"], ["--passages", "4"], "--k", "k", 4),
    (["reader", "cloze", "--out", "c.jsonl"], ["--max-words", "30"], "--max-sentence-words", "max_sentence_words", 30),
    (["corpus", "build"], ["--format", "passages"], "--input-format", "input_format", "passages"),
    (["demo"], ["--reranker"], "--with-reranker", "with_reranker", True),
    (["demo"], ["--no-reranker"], "--no-with-reranker", "with_reranker", False),
])
def test_a_renamed_flag_still_works_with_one_line_saying_the_new_one(argv, old, new, dest, value, capsys):
    """One name a quantity (k, max_train_examples, rerank_depth, ...): the old flags of a renamed setting
    set it still, and say which to use."""
    then = build_parser().parse_args([*argv, *old])
    err = capsys.readouterr().err
    assert getattr(then, dest) == value
    assert err.count("deprecated") == 1 and f"{old[0]} is deprecated" in err and f"use {new}" in err
    now = build_parser().parse_args([*argv, new, *old[1:]])
    assert getattr(now, dest) == value and "deprecated" not in capsys.readouterr().err


def every_option(parser):
    """(command, action) for each option of the parser and of all its subcommands, at any depth."""
    stack = [("odqa", parser)]
    while stack:
        name, p = stack.pop()
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                stack += [(f"{name} {n}", sub) for n, sub in action.choices.items()]
            else:
                yield name, action


def test_one_flag_name_for_one_meaning():
    """Every output is --out, every beam size --num-beams, every passages-per-question --k."""
    flags = {}
    for name, action in every_option(build_parser()):
        if action.help != "==SUPPRESS==":
            for flag in action.option_strings:
                flags.setdefault(flag, []).append(name)
    for old in ("--out-dir", "--n-passages", "--beams", "--output"):
        assert old not in flags, f"{old} is offered by {flags[old]}"


def test_no_flag_is_a_double_negation():
    """A setting named as a negation is a switch: `run --no-reranker`, never `--no-no-reranker`."""
    parser = build_parser()
    for name, action in every_option(parser):
        assert not [f for f in action.option_strings if f.startswith("--no-no-")], (name, action.option_strings)
    from odqa.system.args import RunArgs
    from odqa.system.commands.args import dataclass_from_args
    run = ["run", "--out", "o"]
    settings = lambda *flags: dataclass_from_args(RunArgs, parser.parse_args(run + list(flags)))  # noqa: E731
    assert settings("--no-reranker").parts.no_reranker is True
    assert settings().parts.no_reranker is False and settings().search.answer.answer_filter is True
    assert settings("--no-answer-filter").search.answer.answer_filter is False


def test_help_imports_no_torch():
    code = ("import sys\nfrom odqa.system.cli import build_parser\nbuild_parser().format_help()\n"
            "print(sorted(m for m in ('torch', 'transformers', 'faiss', 'numpy', 'deepspeed') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    out = subprocess.run([sys.executable, "-X", "importtime", "-m", "odqa.system.cli", "train-reader", "--help"],
                         capture_output=True, text=True, check=True)
    assert "usage: odqa train-reader" in out.stdout
    assert not re.search(r"\|\s+(torch|transformers)$", out.stderr, re.M)


def test_commands_log_no_faiss_loader_chatter():
    # faiss's loader logs its instruction-set fallbacks at INFO, as an exception's repr: not for users
    code = ("import logging\nfrom odqa.system.cli import configure_logging\nconfigure_logging(quiet=False)\n"
            "import faiss\nlogging.getLogger('odqa').info('still shown')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "INFO odqa: still shown" in out.stderr
    assert "faiss.loader" not in out.stderr


TRAINING = ["train-teacher", "train-phrase", "train-query", "train-doc", "train-reranker", "pretrain-reader",
            "train-reader"]


@pytest.mark.parametrize("command", TRAINING)
def test_every_training_command_takes_a_config_file(command):
    option_strings = {s for a in build_parser()._subparsers._group_actions[0].choices[command]._actions
                      for s in a.option_strings}
    assert "--config" in option_strings


@pytest.mark.parametrize("suffix", [".toml", ".json"])
def test_a_config_file_sets_a_commands_flags_and_the_command_line_overrides_it(tmp_path, suffix):
    from odqa.system.cli import parse_args
    settings = {"train-file": "t.jsonl", "validation_file": "v.jsonl", "out": "runs/p", "lr": 1e-4, "epochs": 3,
                "title-phrases": True, "unified": False, "encoder": "some/bert"}
    path = tmp_path / f"phrase{suffix}"
    path.write_text("\n".join(f"{k} = {json.dumps(v)}" for k, v in settings.items()) if suffix == ".toml"
                    else json.dumps(settings))
    args = parse_args(["train-phrase", "--config", str(path), "--lr", "2e-4"])   # required flags from the file
    assert (args.train_file, args.validation_file, args.out_dir, args.encoder) == ("t.jsonl", "v.jsonl", "runs/p", "some/bert")
    assert (args.lr, args.epochs, args.title_phrases, args.unified) == (2e-4, 3, True, False)
    assert parse_args(["-q", "train-phrase", f"--config={path}"]).lr == 1e-4


def test_a_bad_config_file_is_refused_naming_it(tmp_path, capsys):
    from odqa.system.cli import parse_args
    cases = {"unknown.json": ('{"train-file": "t", "validation-file": "v", "out": "o", "encoder": "e", "lr_rate": 1}',
                              "not settings of `odqa train-phrase`: --lr-rate"),
             "broken.toml": ("lr = = 1", "not valid TOML"),
             "list.json": ("[1, 2]", "a table of settings")}
    for name, (text, said) in cases.items():
        (tmp_path / name).write_text(text)
        with pytest.raises(SystemExit) as refused:
            parse_args(["train-phrase", "--config", str(tmp_path / name)])
        err = capsys.readouterr().err
        assert refused.value.code == 2 and said in err and name in err, (name, err)
    # a value out of range is the settings' own check, as for the flag, before anything is loaded
    (tmp_path / "range.json").write_text('{"train-file": "t", "validation-file": "v", "out": "o", "encoder": "e", '
                                         '"epochs": 0}')
    with pytest.raises(SystemExit) as refused:    # the field's range, checked by the parser as for the flag
        main(["train-phrase", "--config", str(tmp_path / "range.json")])
    assert refused.value.code == 2 and "argument --epochs: must be at least 1, not 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_args(["train-phrase", "--config", str(tmp_path / "missing.json")])
    assert "missing.json: no such file" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_args(["read", "--config", str(tmp_path / "list.json")])   # not a training command


SETTINGS_MODULES = ("odqa.common.settings", "odqa.retriever.args", "odqa.retriever.search_config", "odqa.reader.args",
                    "odqa.system.args",
                    "odqa.system.recipe_config")


def settings_classes():
    """Every settings dataclass of the packages' settings modules (the args modules, the recipe's)."""
    import dataclasses
    import importlib
    for module in SETTINGS_MODULES:
        for value in vars(importlib.import_module(module)).values():
            if isinstance(value, type) and dataclasses.is_dataclass(value) and value.__module__ in SETTINGS_MODULES:
                yield value


def test_every_flag_is_one_settings_field_and_every_field_is_a_flag():
    """The settings dataclasses are the one home of every flag of every command: each flag (and each
    positional argument) is a field of one, no command has two flags for one field, and every field is
    the flag of some command. Outside them: --help, and -q, --debug and --config FILE, which are the
    CLI's own (a file of the flags, not a setting)."""
    import dataclasses

    from odqa.common.settings import flag_of, is_section, leaves
    from odqa.system.recipe_config import RecipeConfig
    # a field's flag, and a section's field's as its holder names it (ReaderArgs.reading.batch_size is
    # --eval-batch-size); the recipe's sections are its presets' tables, not flags: only its own fields
    # that `odqa demo` takes are
    fields = {(flag_of(f, name), name) for cls in settings_classes() if cls is not RecipeConfig
              for name, _, f in leaves(cls) if not f.metadata.get("tuned")}
    fields |= {(flag_of(f), f.name) for f in dataclasses.fields(RecipeConfig) if f.metadata.get("demo")}
    fields -= {(flag_of(f), f.name) for f in dataclasses.fields(RecipeConfig) if not is_section(f)
               and not f.metadata.get("demo")}
    used, commands = set(), 0
    for name, action in every_option(build_parser()):
        if name == "odqa" or isinstance(action, argparse._HelpAction) or action.dest == "config" \
                or action.help == argparse.SUPPRESS:   # an old spelling of a flag, which it still sets
            continue
        flag = action.option_strings[0] if action.option_strings else action.dest
        assert (flag, action.dest) in fields, f"`odqa {name[5:]} {flag}` is no settings field"
        used.add((flag, action.dest))
    stack = [build_parser()]
    while stack:   # each command's parser: no two of its flags set one field
        for action in stack.pop()._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub, p in action.choices.items():
                    if not any(isinstance(a, argparse._SubParsersAction) for a in p._actions):
                        dests = [a.dest for a in p._actions if a.help != argparse.SUPPRESS]
                        assert len(dests) == len(set(dests)), f"{sub}: {dests}"
                        commands += 1
                    stack.append(p)
    assert commands >= 26
    assert not fields - used, f"settings fields that are no command's flag: {sorted(fields - used)}"
