"""File I/O that never leaves half-written outputs and names the bad line of bad input."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
from pathlib import Path
from typing import Any, Iterable, Iterator


class InputError(ValueError):
    """Bad user input (a missing file, a malformed line, an empty question). The message names the input."""


def require_file(path: str | os.PathLike, what: str = "file") -> Path:
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{what} not found: {path}")
    return path


def _tmp_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary sibling of `path` to write (a file or a directory); rename it onto `path`
    only when the block finishes, so readers see either the old output or the complete new one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_orphans(path)
    tmp = _tmp_name(path)
    _remove(tmp)
    try:
        yield tmp
    except BaseException:
        _remove(tmp)
        raise
    publish(tmp, path)


def publish(tmp: Path, path: Path) -> None:
    """Rename a finished `tmp` (file or directory) onto `path`."""
    if path.is_dir() and tmp.is_dir():
        # os.replace cannot replace a non-empty directory: move the old one aside first.
        old = path.with_name(f".{path.name}.old-{os.getpid()}")
        os.replace(path, old)
        os.replace(tmp, path)
        shutil.rmtree(old)
    else:
        os.replace(tmp, path)


def remove_orphans(path: Path) -> list[Path]:
    """Remove the temporaries (`.NAME.tmp-PID`, `.NAME.old-PID`) that killed writers of `path` left: a
    killed `build-index` leaves a gigabyte-sized one. A temporary whose process still runs is kept."""
    removed = []
    for sibling in path.parent.glob(f".{glob_escape(path.name)}.*-*"):
        kind, _, pid = sibling.name[len(path.name) + 2:].rpartition("-")
        if kind not in ("tmp", "old") or not pid.isdigit() or _alive(int(pid)):
            continue
        _remove(sibling)
        removed.append(sibling)
    return removed


def glob_escape(name: str) -> str:
    return "".join(f"[{c}]" if c in "*?[" else c for c in name)


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True      # someone else's process
    return True


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()


def read_jsonl(path: str | os.PathLike) -> Iterator[tuple[int, dict]]:
    """Yield (line number, object) for each non-blank line; a line that is not a JSON object raises
    InputError naming the file and line."""
    path = require_file(path)
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise InputError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
            if not isinstance(obj, dict):
                raise InputError(f"{path}:{lineno}: expected a JSON object, got {type(obj).__name__}")
            yield lineno, obj


def write_jsonl(path: str | os.PathLike, rows: Iterable[dict]) -> int:
    """Write rows atomically; returns how many."""
    n = 0
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
            n += 1
    return n


def write_json(path: str | os.PathLike, obj: Any, indent: int | None = 2) -> None:
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, indent=indent)
        f.write("\n")


def read_json(path: str | os.PathLike) -> Any:
    path = require_file(path)
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise InputError(f"{path}:{e.lineno}: not valid JSON ({e.msg})") from None


def hash_files(root: str | os.PathLike, files) -> str:
    """A short sha256 of the named files' paths (relative to root) and bytes: identifies a model part."""
    import hashlib
    h = hashlib.sha256()
    root = Path(root)
    for f in files:
        if f.is_file():
            h.update(f.relative_to(root).as_posix().encode())
            with open(f, "rb") as fh:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    h.update(block)
    return h.hexdigest()[:16]
