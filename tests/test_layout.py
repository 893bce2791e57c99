"""The codebase's shape: one installed name, and imports that flow one way."""
import ast
import importlib.util
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("common", "retriever", "reader", "system")
# Who may import whom: system -> retriever, reader -> common; common imports none of the others.
MAY_IMPORT = {"common": {"common"}, "retriever": {"retriever", "common"}, "reader": {"reader", "common"},
              "system": set(PACKAGES)}


def odqa_imports(path: Path) -> set[str]:
    """The odqa subpackages a module imports (at any depth of the file: lazy imports count too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else []
        for name in names:
            parts = name.split(".")
            if parts[0] == "odqa" and len(parts) > 1:
                found.add(parts[1])
            assert parts[0] not in PACKAGES, f"{path}: imports {name!r}; the installed name is odqa.{name}"
    return found


@pytest.mark.parametrize("package", PACKAGES)
def test_imports_flow_one_way(package):
    for path in sorted((ROOT / package).rglob("*.py")):
        wrong = odqa_imports(path) - MAY_IMPORT[package]
        assert not wrong, f"{path.relative_to(ROOT)} imports odqa.{', odqa.'.join(sorted(wrong))}"


def test_the_direction_check_sees_a_module_that_reaches_back_up(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from odqa.system.cli import main\n")
    assert odqa_imports(bad) == {"system"}


def _can_build_wheels() -> bool:
    try:
        import setuptools
    except ImportError:
        return False
    version = tuple(int(x) for x in setuptools.__version__.split(".")[:2] if x.isdigit())
    return version >= (70, 1) or importlib.util.find_spec("wheel") is not None


def test_the_installed_distribution_holds_only_the_odqa_name(tmp_path):
    """Build the wheel (from a copy of the sources, so the checkout gets no build/ folder) and list the
    top-level names it installs into site-packages."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "requirements.txt", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for name in ("odqa", *PACKAGES):
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    # The installed setuptools where it can build a wheel itself (70.1 on, or with `wheel`): no download;
    # else pip's isolated build fetches one.
    isolation = ["--no-build-isolation"] if _can_build_wheels() else []
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", *isolation, "-q", "-w",
                    str(tmp_path / "dist"), str(src)], check=True, capture_output=True)
    wheel, = (tmp_path / "dist").glob("odqa-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")} == {"odqa"}
    # Every module of the source folders is in the wheel, under odqa/ (a subpackage left out of
    # pyproject's list would work in an editable install and be missing from a real one).
    sources = {f"odqa/{p.relative_to(ROOT).as_posix()}" for package in PACKAGES for p in (ROOT / package).rglob("*.py")
               if "__pycache__" not in p.parts}
    assert sources - set(names) == set()
    for expected in ("odqa/__init__.py", "odqa/common/configs/zero2.json", "odqa/system/static/index.html"):
        assert expected in names


def import_graph() -> dict[str, set[str]]:
    """odqa's modules and the odqa modules each imports, at any depth of the file (a lazy import inside a
    function closes a cycle as surely as one at the top)."""
    modules = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            name = ".".join(("odqa", *path.relative_to(ROOT).with_suffix("").parts)).removesuffix(".__init__")
            modules[name] = path
    graph = {}
    for name, path in modules.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module, *(f"{node.module}.{a.name}" for a in node.names)] \
                if isinstance(node, ast.ImportFrom) and node.module and not node.level else []
            found |= {n for n in names if n in modules and n != name}
        graph[name] = found
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iteratively)."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    component = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        component.append(w)
                        if w == v:
                            break
                    if len(component) > 1:
                        out.append(sorted(component))
    return out


def test_no_import_cycle_inside_the_package():
    found = cycles(import_graph())
    assert not found, f"import cycles: {found}"


def test_the_cycle_check_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def code_lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def test_the_search_core_is_in_parts():
    """`Searcher` is a facade over the search's parts, a module each; no retriever module is long."""
    tree = ast.parse((ROOT / "retriever" / "searcher.py").read_text())
    searcher, = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Searcher"]
    assert searcher.end_lineno - searcher.lineno + 1 <= 150
    long = {p.name: code_lines(p) for p in (ROOT / "retriever").glob("*.py") if code_lines(p) > 400}
    assert not long, long


def test_reading_has_one_generate_function():
    tree = ast.parse((ROOT / "reader" / "read.py").read_text())
    public = [n.name for n in tree.body if isinstance(n, ast.FunctionDef) and not n.name.startswith("_")]
    assert [n for n in public if "generate" in n] == ["generate"], public
