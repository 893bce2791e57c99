"""The docs stay true to the code: the reference pages made from the parser and the settings are not
stale, every `odqa ...` command the quickstart and the guides show parses with today's parser, and
the quickstart's Python runs against the tests' tiny world."""
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from tiny_models import make_tiny_system

from odqa.system.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
SHOWN = [DOCS / "index.md", *sorted((DOCS / "guides").glob("*.md"))]


def code_blocks(path: Path, language: str = "") -> list[str]:
    """The fenced blocks of a page (those of `language`, where given)."""
    return re.findall(r"^```" + re.escape(language) + r"[^\n]*\n(.*?)^```", path.read_text(), re.M | re.S)


def shown_commands(path: Path) -> list[str]:
    """Each `$ odqa ...` line of a page's code blocks (continuation lines joined), or the command after
    a launcher's `-m odqa.system.cli`."""
    commands = []
    for block in code_blocks(path):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            line = line.strip()
            if not line.startswith("$ "):
                continue
            words = shlex.split(line[2:], comments=True)
            if "odqa.system.cli" in words:
                words = ["odqa"] + words[words.index("odqa.system.cli") + 1:]
            while words and "=" in words[0] and words[0] != "odqa":   # VAR=value odqa ...
                words = words[1:]
            if words and words[0] == "odqa":
                commands.append(words[1:])
    return commands


def test_the_reference_pages_are_not_stale():
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "docs_reference.py"), "--check"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("page", SHOWN, ids=lambda p: str(p.relative_to(DOCS)))
def test_every_command_a_page_shows_parses(page, capsys):
    parser = build_parser()
    for argv in shown_commands(page):
        if "--help" in argv or "--config" in argv:   # --config reads its file before parsing
            continue
        try:
            parser.parse_args(argv)
        except SystemExit:
            pytest.fail(f"{page.relative_to(DOCS)}: `odqa {' '.join(argv)}` does not parse: {capsys.readouterr().err}")
        said = capsys.readouterr().err   # a page shows today's spelling of each flag
        assert "deprecated" not in said, f"{page.relative_to(DOCS)}: `odqa {' '.join(argv)}`: {said}"


def test_the_guides_show_commands():
    """The extraction finds them: a test that parses nothing would pass whatever the guides say."""
    assert len([c for page in SHOWN for c in shown_commands(page)]) >= 40
    assert ["ask", "panda is a national animal of which country", "--k", "5"] in shown_commands(DOCS / "index.md")


def test_the_quickstarts_python_runs_on_the_tiny_world(tmp_path, isolated_home, capsys):
    """Its snippet, as a notebook user pastes it, after a pipeline is recorded (here the tiny world's,
    as `odqa demo` records its own)."""
    (tmp_path / "world").mkdir()
    world = make_tiny_system(tmp_path / "world")
    isolated_home.mkdir(parents=True, exist_ok=True)
    (isolated_home / "pipeline.json").write_text(json.dumps({
        "corpus": str(world["corpus"]), "phrase_model": str(world["phrase"]), "phrase_index": str(world["index"]),
        "reader": str(world["t5"])}))
    (snippet,) = code_blocks(DOCS / "index.md", "python")
    assert len(snippet.strip().splitlines()) <= 10
    exec(compile(snippet, "docs/index.md", "exec"), {})
    out = capsys.readouterr().out.splitlines()[-4:]   # (DeepSpeed, imported by the reader, may log to stdout first)
    assert " | " in out[0] and all(len(line.split()) >= 2 for line in out[1:])   # both answers, then three documents
