"""The settings tree: each setting declared once, in the class of its concern; larger configs hold
those classes whole as sections, whose settings keep their flat names (flags, --config files, pipeline
records, the API's overrides) and, in a recipe, their own tables."""
import dataclasses
import importlib

import pytest

from odqa.common.io import InputError
from odqa.common.settings import flat, from_flat, is_section, leaves, settings_of, updated

SETTINGS_MODULES = ("odqa.common.settings", "odqa.retriever.args", "odqa.retriever.search_config", "odqa.reader.args",
                    "odqa.system.args",
                    "odqa.system.recipe_config")


def settings_classes() -> list[type]:
    found = []
    for module in SETTINGS_MODULES:
        for value in vars(importlib.import_module(module)).values():
            if isinstance(value, type) and dataclasses.is_dataclass(value) and value.__module__ in SETTINGS_MODULES \
                    and value not in found:
                found.append(value)
    return found


def composes(a: type, b: type) -> bool:
    """Whether `a` holds `b` (or a class of its) as a section, at any depth."""
    for f in dataclasses.fields(a):
        if is_section(f):
            sub = f.metadata["section"]
            if issubclass(sub, b) or issubclass(b, sub) or composes(sub, b):
                return True
    return False


def related(a: type, b: type) -> bool:
    return issubclass(a, b) or issubclass(b, a) or composes(a, b) or composes(b, a)


def test_every_setting_is_declared_in_one_class():
    """No setting is declared in two classes unless one inherits or composes the other: a concern that
    needs another default inherits the setting and gives it there (`override`). Outside the rule are
    only a command's inputs, the files and question sets it reads and writes (metadata "input": --out,
    --corpus, --model, ...), which name that command's own files, not a setting."""
    classes = settings_classes()
    assert len(classes) > 40
    declared: dict[str, list[tuple[type, dataclasses.Field]]] = {}
    for cls in classes:
        for f in dataclasses.fields(cls):
            if is_section(f):   # a holder of another class's settings, not a setting
                continue
            # its home: the farthest base that declares it (a subclass giving it another default inherits it)
            home = [c for c in cls.__mro__ if f.name in c.__dict__.get("__annotations__", {})][-1]
            if all(home is not c for c, _ in declared.get(f.name, [])):
                declared.setdefault(f.name, []).append((home, f))
    twice = []
    for name, places in declared.items():
        for i, (a, fa) in enumerate(places):
            for b, fb in places[i + 1:]:
                inputs = fa.metadata.get("input") and fb.metadata.get("input")
                if not related(a, b) and not inputs:
                    twice.append(f"{name}: {a.__name__} and {b.__name__}")
    assert not twice, twice


def test_the_check_finds_a_setting_declared_twice():
    @dataclasses.dataclass
    class One:
        text_maxlength: int = 200

    @dataclasses.dataclass
    class Other:
        text_maxlength: int = 128
    assert not related(One, Other)
    from odqa.reader.args import ReaderArgs, ReaderSettings
    from odqa.system.recipe_config import RecipeConfig
    assert composes(ReaderArgs, ReaderSettings) and composes(RecipeConfig, ReaderSettings)


def test_a_section_keeps_its_settings_flat_names():
    """A command's tree (a trainer and its model's config, `odqa run`'s sections) has each flat name
    once: the flags, --config files and `updated` address settings by it."""
    from odqa.reader.args import ReaderArgs
    from odqa.retriever.args import PhraseTrainArgs
    from odqa.retriever.search_config import SearchConfig
    from odqa.system.args import RunArgs
    for cls in (PhraseTrainArgs, ReaderArgs, SearchConfig, RunArgs):
        names = [name for name, _, _ in leaves(cls)]
        assert len(names) == len(set(names)), cls
    args = from_flat(PhraseTrainArgs, {"max_passage_tokens": 160, "epochs": 1, "encoder": "bert"})
    assert args.model_config.max_passage_tokens == 160 and args.model_config.encoder == "bert" and args.epochs == 1
    assert flat(updated(args, max_span_len=10))["max_span_len"] == 10 and args.model_config.max_span_len == 20
    reader = from_flat(ReaderArgs, {"eval_batch_size": 4, "text_maxlength": 64})   # renamed in its holder
    assert (reader.reading.batch_size, reader.reading.text_maxlength) == (4, 64)
    search = updated(SearchConfig(), top_docs=7, answer_depth=3)
    assert (search.prefilter.top_docs, search.answer.answer_depth, SearchConfig().prefilter.top_docs) == (7, 3, 100)
    with pytest.raises(InputError, match="not settings of SearchConfig: top_doc"):
        updated(SearchConfig(), top_doc=7)
    with pytest.raises(InputError, match="--top-docs: must be at least 1"):
        updated(SearchConfig(), top_docs=0)   # each section checks its own ranges when made


def test_a_recipes_sections_are_set_in_their_own_tables():
    """The recipe's sections share names (every trainer has epochs): a flat name that more than one
    section has is refused, and a table sets one section's."""
    from odqa.system.recipe_config import RecipeConfig
    cfg = from_flat(RecipeConfig, {"phrase": {"epochs": 3}, "doc": {"max_doc_tokens": 32}, "seed": 2})
    assert (cfg.phrase.epochs, cfg.doc.model_config.max_doc_tokens, cfg.seed) == (3, 32, 2)
    assert cfg.phrase.max_train_examples == RecipeConfig().phrase.max_train_examples == 768   # the recipe's own value
    with pytest.raises(InputError, match="epochs: more than one section has it"):
        from_flat(RecipeConfig, {"epochs": 3})
    with pytest.raises(InputError, match=r"\[phrase\]: not settings of PhraseTrainArgs: epoch"):
        from_flat(RecipeConfig, {"phrase": {"epoch": 3}})


def test_a_key_holds_the_settings_not_the_files():
    from odqa.retriever.args import PhraseTrainArgs
    key = settings_of(from_flat(PhraseTrainArgs, {"train_file": "t.jsonl", "encoder": "bert", "epochs": 1}))
    assert key["epochs"] == 1 and "train_file" not in key and "encoder" not in key["model_config"]
    assert key["model_config"]["max_span_len"] == 20
