"""Write the reference pages that are made from the code, not by hand:

    docs/reference/cli.md            the commands, one line each, linking to their pages
    docs/reference/cli/NAME.md       one command's usage and flags, from `odqa`'s parser
    docs/reference/config/MODULE.md  each settings dataclass's fields: flag, default, range, help

    python scripts/docs_reference.py           # rewrite both
    python scripts/docs_reference.py --check   # exit 1, naming the page, if either is stale (the tests run this)

The parser is formatted at a fixed width and with $ODQA_HOME shown as such, so the pages do not depend
on the machine that writes them.
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib
import os
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent.parent / "docs" / "reference"
HOME = "/ODQA_HOME"   # $ODQA_HOME while the pages are made, written back as $ODQA_HOME
MODULES = ("odqa.retriever.args", "odqa.retriever.search_config", "odqa.reader.args", "odqa.system.args",
           "odqa.system.recipe_config", "odqa.common.settings")


def commands(parser: argparse.ArgumentParser, prefix: str = "odqa"):
    """(the command's name, its one-line help, its parser) for each leaf command, in `odqa --help`'s order."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, sub in action.choices.items():
                if any(isinstance(a, argparse._SubParsersAction) for a in sub._actions):
                    yield from commands(sub, f"{prefix} {name}")
                else:
                    yield f"{prefix} {name}", helps.get(name) or "", sub


def clean(text: str) -> str:
    """Paths of this machine written as the reader's: $ODQA_HOME, and the installed package's folder."""
    from odqa.common import settings
    return text.replace(HOME, "$ODQA_HOME").replace(str(Path(settings.__file__).parent), "odqa/common")


def cli_pages() -> dict[Path, str]:
    from odqa.system.cli import build_parser
    index = ["# Command-line reference", "",
             "Every `odqa` command, with a page of its flags as `odqa COMMAND --help` prints them. Written by",
             "`python scripts/docs_reference.py` from the parser; a test fails when these pages are stale. Each",
             "flag is a field of a settings dataclass ([settings](config/index.md)). `-q` (warnings only) and",
             "`--debug` (tracebacks) go before the command: `odqa -q run ...`.", "",
             "| command | what it does |", "|---|---|"]
    pages = {}
    for name, help_, sub in commands(build_parser()):
        sub.prog = name
        slug = name.removeprefix("odqa ").replace(" ", "-")
        pages[DOCS / "cli" / f"{slug}.md"] = "\n".join(
            [f"# `{name}`", "", "```", clean(sub.format_help().rstrip()), "```", ""])
        index.append(f"| [`{name}`](cli/{slug}.md) | {clean(help_)} |")
    pages[DOCS / "cli.md"] = "\n".join(index + [""])
    return pages


def config_pages() -> dict[Path, str]:
    from odqa.common.settings import flag_of
    index = ["# Settings reference", "",
             "Every settings dataclass, by module: the one home of each setting, its default and its help. The",
             "commands' flags are made from these fields, `--config FILE` takes their names as keys, and the",
             "Python API takes the classes themselves. Written by `python scripts/docs_reference.py`; a test fails",
             "when these pages are stale. Ranges: positive (at least 1, or above 0), non_negative, percent, port,",
             "text (not empty). A section is a settings class held whole (a trainer's model config, `RunArgs.search`,",
             "a recipe's stages): its settings keep their own flags and flat names, and a recipe's preset sets it in",
             "a table of its own (`[phrase]`). A class that inherits a setting to give it another default lists it",
             "with its own default.", ""]
    pages = {}
    from odqa.common.settings import OptimArgs

    def row(f: dataclasses.Field) -> str:
        cell = lambda x: clean(str(x)).replace("|", "\\|")  # noqa: E731
        if "section" in f.metadata:   # a settings class held whole: its own table, by its flat names
            return (f"| `{f.name}` | (its settings' flags) | a `{f.metadata['section'].__name__}` | section | "
                    f"{cell(f.metadata.get('help', ''))} |")
        default = "required" if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING \
            else f.default_factory() if f.default is dataclasses.MISSING else f.default
        rule = f.metadata.get("range") or " ".join(map(str, f.metadata.get("choices", ())))
        return f"| `{f.name}` | `{flag_of(f)}` | {cell(default)} | {cell(rule)} | {cell(f.metadata.get('help', ''))} |"

    loop_rows = {f.name: row(f) for f in dataclasses.fields(OptimArgs)}
    for module, training in ((m, t) for m in MODULES for t in (False, True)):
        # a module's trainers (the loop's settings embedded) on a page of their own, so no page is long
        classes = [v for v in vars(importlib.import_module(module)).values()
                   if isinstance(v, type) and dataclasses.is_dataclass(v) and v.__module__ == module
                   and issubclass(v, OptimArgs) == training and dataclasses.fields(v)]
        if not classes:
            continue
        package, last = module.split(".")[1], module.split(".")[-1]
        name = (package if last in ("args", "settings") else f"{package}-{last.replace('_', '-')}") + \
            ("-training" if training else "")
        lines = [f"# `{module}`" + (": the trainers" if training else ""), ""]
        for cls in classes:
            fields = dataclasses.fields(cls)
            doc = " ".join((cls.__doc__ or "").split())
            doc = "" if doc.startswith(cls.__name__ + "(") else doc   # the dataclass's generated signature
            if training and cls is not OptimArgs:
                # the loop's fields once, on OptimArgs' page: here only those this trainer changes
                fields = [f for f in fields if row(f) != loop_rows.get(f.name)]
                doc += (" " if doc else "") + ("It takes every setting of the training loop ([`OptimArgs`]"
                                               "(common-training.md)); here, those it gives a default or a help of its own.")
            lines += [f"## `{cls.__name__}`", "", *([doc, ""] if doc else []),
                      "| field | flag | default | range | help |", "|---|---|---|---|---|",
                      *map(row, fields), ""]
        pages[DOCS / "config" / f"{name}.md"] = "\n".join(lines)
        index.append(f"- [`{module}`]({name}.md): " + ", ".join(f"`{c.__name__}`" for c in classes))
    pages[DOCS / "config" / "index.md"] = "\n".join(index + [""])
    return pages


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", action="store_true", help="only say whether the pages are stale")
    args = p.parse_args()
    os.environ["ODQA_HOME"] = HOME   # defaults under $ODQA_HOME read the same on every machine
    os.environ["COLUMNS"] = "100"    # argparse wraps at the terminal's width
    pages = {**cli_pages(), **config_pages()}
    stale = [path for path, text in pages.items() if not path.exists() or path.read_text() != text]
    # a page of a command or a module that is gone
    stale_files = [p for p in [*DOCS.glob("cli/*.md"), *DOCS.glob("config/*.md")] if p not in pages]
    if args.check:
        for path in stale + stale_files:
            print(f"{path} is stale: run `python scripts/docs_reference.py`", file=sys.stderr)
        return 1 if stale or stale_files else 0
    for path in stale:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(pages[path])
        print(f"wrote {path}")
    for path in stale_files:
        path.unlink()
        print(f"removed {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
