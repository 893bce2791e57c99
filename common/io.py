"""File I/O that never leaves half-written outputs and names the bad line of bad input."""
from __future__ import annotations

import bz2
import contextlib
import errno
import gzip
import hashlib
import json
import logging
import lzma
import os
import re
import shutil
import zlib
from pathlib import Path
from typing import Any, Iterable, Iterator


class InputError(ValueError):
    """Bad user input (a missing file, a malformed line, an empty question). The message names the input."""


@contextlib.contextmanager
def loading(path: str | os.PathLike, what: str) -> Iterator[None]:
    """Turn a failure inside the block into an InputError naming the path and what failed to load: a
    truncated, malformed or mismatched checkpoint or index file is bad input, not a bug to trace."""
    try:
        yield
    except (InputError, MemoryError, KeyboardInterrupt):
        raise
    except Exception as e:
        lines = [line.strip() for line in str(e).splitlines() if line.strip()]
        detail = f"{type(e).__name__}: {lines[0][:200]}" if lines else type(e).__name__
        raise InputError(f"{path}: cannot load {what} ({detail})") from e


log = logging.getLogger(__name__)


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
    only when the block finishes, so readers see either the old output or the complete new one. An output
    that is a symbolic link is written where it points, the link kept (a shared results file linked into
    several runs), as `open(path, "w")` would."""
    path = Path(path)
    if path.is_symlink():
        path = Path(os.path.realpath(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_orphans(path)
    tmp = _tmp_name(path)
    _remove(tmp)
    try:
        yield tmp
        publish(tmp, path)
    except BaseException:
        _remove(tmp)
        raise


PUBLISH_TRIES = 20
RACED = (errno.ENOENT, errno.ENOTEMPTY, errno.EEXIST)


def publish(tmp: Path, path: Path) -> None:
    """Rename a finished `tmp` (file or directory) onto `path`. Writers racing to publish the same path
    each publish whole and the last one wins: a directory is moved aside before the new one goes in
    (os.replace cannot replace a non-empty directory), and a move that another writer's overtook is
    tried again (in 13 of 40 races, two `build-index` runs into one --out once ended in ENOTEMPTY)."""
    old = path.with_name(f".{path.name}.old-{os.getpid()}")
    for _ in range(PUBLISH_TRIES - 1):
        try:
            _publish_once(tmp, path, old)
            return
        except OSError as e:
            # ENOENT: `path`, seen a moment ago, was moved aside by another writer; ENOTEMPTY/EEXIST: another
            # writer's directory went in between our look and our move
            if e.errno not in RACED or not tmp.exists():
                raise
            log.info("publishing %s raced another writer (%s); trying again", path, e.strerror)
    _publish_once(tmp, path, old)


def _publish_once(tmp: Path, path: Path, old: Path) -> None:
    if tmp.is_dir() and path.is_dir():
        _remove(old)
        os.replace(path, old)
    os.replace(tmp, path)
    _remove(old)


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


COMPRESSED = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}


def plain_suffix(path: str | os.PathLike) -> str:
    """The suffix that says what a file holds, under its compression's: ".tsv" for psgs_w100.tsv.gz."""
    path = Path(path)
    return Path(path.stem).suffix if path.suffix in COMPRESSED else path.suffix


def text_lines(path: str | os.PathLike) -> Iterator[tuple[int, str]]:
    """Yield (line number, line) of a UTF-8 text file, read through its decompressor when its name ends
    in .gz, .bz2 or .xz (DPR ships psgs_w100.tsv.gz), a line at a time. Bytes that are not UTF-8 (a
    compressed file under a plain name, Latin-1 text) raise InputError naming the file, the line and
    the byte offset (in the decompressed stream), not a UnicodeDecodeError; a damaged or truncated
    compressed file raises InputError naming it."""
    path = require_file(path)
    offset, lineno = 0, 0
    opener = COMPRESSED.get(path.suffix)
    errors = _named_decompression_errors(path, lambda: lineno) if opener else contextlib.nullcontext()
    with (opener or open)(path, "rb") as f, errors:
        for lineno, raw in enumerate(f, 1):
            yield lineno, _decode(raw, path, offset, lineno)
            offset += len(raw)


@contextlib.contextmanager
def _named_decompression_errors(path: Path, where) -> Iterator[None]:
    try:
        yield
    except (OSError, EOFError, lzma.LZMAError, zlib.error) as e:
        raise InputError(f"{path}: cannot decompress it after line {where()} ({e}); "
                         "the file is damaged or truncated") from None


def read_text(path: str | os.PathLike) -> str:
    path = require_file(path)
    return _decode(path.read_bytes(), path, 0, None)


def _decode(raw: bytes, path: Path, offset: int, lineno: int | None) -> str:
    """UTF-8 text; a byte-order mark at the start of a file (Windows editors write one) is dropped."""
    if offset == 0 and raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        where = f"{path}:{lineno}" if lineno is not None else str(path)
        raise InputError(f"{where}: not UTF-8 text (byte {offset + e.start} is {raw[e.start]:#04x}); "
                         "give UTF-8 text, plain or compressed under a .gz, .bz2 or .xz name") from None


# A JSON escape of a lone UTF-16 surrogate ("\ud800") parses to a str that no UTF-8 writer or tokenizer
# accepts; the pattern keeps the full check off lines that cannot hold one.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def parse_json(text: str, where: str, whole_file: bool = False) -> Any:
    """json.loads, with errors (bad JSON, a lone surrogate escape, nesting too deep for the decoder, an
    integer of more digits than Python converts) as InputError naming `where` (and, for a whole file,
    the line)."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(f"{where}{f':{e.lineno}' if whole_file else ''}: not valid JSON ({e.msg})") from None
    except RecursionError:
        raise InputError(f"{where}: JSON nested too deeply to read") from None
    except ValueError as e:     # int("1" * 5000): past sys.get_int_max_str_digits()
        raise InputError(f"{where}: not readable JSON ({str(e).split(';')[0]})") from None
    if _SURROGATE_ESCAPE.search(text):
        try:
            json.dumps(obj, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError as e:
            raise InputError(f"{where}: a lone surrogate escape ({e.object[e.start]!r}) is not text") from None
    return obj


def read_jsonl(path: str | os.PathLike) -> Iterator[tuple[int, dict]]:
    """Yield (line number, object) for each non-blank line; a line that is not UTF-8 or not a JSON
    object raises InputError naming the file and line."""
    path = require_file(path)
    for lineno, line in text_lines(path):
        if not line.strip():
            continue
        obj = parse_json(line, f"{path}:{lineno}")
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


def write_json_array(path: str | os.PathLike, items: Iterable) -> None:
    """`items` as one JSON array, the bytes of `write_json(path, list(items), indent=None)`, encoded an
    item at a time by the C encoder: `json.dump` streams through the pure-Python one, which took a
    fifth of a 1,000-question `odqa retrieve` writing its results."""
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        f.write("[")
        for i, item in enumerate(items):
            f.write((", " if i else "") + json.dumps(item, ensure_ascii=False))
        f.write("]\n")


def read_json(path: str | os.PathLike) -> Any:
    path = require_file(path)
    return parse_json(read_text(path), str(path), whole_file=True)


def hash_files(root: str | os.PathLike, files) -> str:
    """A short sha256 of the named files' paths (relative to root) and bytes: identifies a model part.
    Remembered (`remembered`) while no file of it is written: a search compares three such hashes with
    its index's at every opening, 360 MB of the demo's models."""
    root = Path(root)
    files = [f for f in files if f.is_file()]

    def digest() -> str:
        h = hashlib.sha256()
        for f in files:
            h.update(f.relative_to(root).as_posix().encode())
            _hash_into(h, f)
        return h.hexdigest()[:16]
    names = " ".join(f.relative_to(root).as_posix() for f in files)
    return remembered(f"hash_files {os.path.realpath(root)} {names}", files, digest)


def _hash_into(h, path: str | os.PathLike) -> None:
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)


# Files up to this size are hashed when their index is opened (once while they are not written:
# `remembered_sha256`); larger ones have their sizes checked then, and their bytes by `odqa verify DIR`.
VERIFY_ON_OPEN_BYTES = 256 << 20


def file_sha256(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    _hash_into(h, path)
    return h.hexdigest()


def checksums(directory: str | os.PathLike) -> dict[str, dict]:
    """{name: {"bytes", "sha256"}} of the files in an index directory, manifest.json aside: recorded in the
    manifest, so that a file corrupted in place (same size, other bytes) is refused rather than searched."""
    directory = Path(directory)
    return {p.name: {"bytes": p.stat().st_size, "sha256": file_sha256(p)}
            for p in sorted(directory.iterdir()) if p.is_file() and p.name != "manifest.json"}


def verify_checksums(directory: str | os.PathLike, recorded: dict[str, dict],
                     hash_up_to: int | None = None, record: str = "the manifest", remember: bool = False) -> list[str]:
    """Problems (an empty list when none) of the files against `recorded` checksums: a missing file, a
    size or a sha256 that differs. Files over `hash_up_to` bytes have only their size checked. With
    `remember`, a file's hash is kept (`remembered_sha256`), so a checkpoint is hashed once, not at every
    load (the demo's models are 560 MB)."""
    directory, problems = Path(directory), []
    for name, want in checked_record(recorded, _record_path(directory, record)).items():
        path = directory / name
        if not path.is_file():
            problems.append(f"{path}: missing")
        elif path.stat().st_size != want["bytes"]:
            problems.append(f"{path}: {path.stat().st_size} bytes, {record} says {want['bytes']}")
        elif hash_up_to is None or want["bytes"] <= hash_up_to:
            if (remembered_sha256(path) if remember else file_sha256(path)) != want["sha256"]:
                problems.append(f"{path}: its sha256 differs from {record}'s (the file is corrupted)")
    return problems


def _hashes_file() -> Path:
    from odqa.common.paths import odqa_home
    return odqa_home() / "hashes.json"


def remembered_sha256(path: str | os.PathLike) -> str:
    """A file's sha256, computed once (1.1 s a GiB on a 2-core AMD EPYC, with another job running) and
    kept while the file is not written (`remembered`)."""
    return remembered(f"sha256 {os.path.realpath(path)}", [Path(path)], lambda: file_sha256(path))


def remembered(key: str, files: list[Path], digest) -> str:
    """`digest()`, kept in $ODQA_HOME/hashes.json under `key` with each of `files`' real path, size, inode,
    mtime and ctime, and computed again once any of them differs: a file written since (in place or
    replaced) has another mtime and ctime, and the ctime cannot be set back by hand, as mtime can.
    Entries of files gone are dropped as a new one is kept."""
    stamps = []
    for f in files:
        real = os.path.realpath(f)
        st = os.stat(real)
        stamps.append([real, st.st_size, st.st_ino, st.st_mtime_ns, st.st_ctime_ns])
    store = _hashes_file()
    try:
        known = json.loads(store.read_text(encoding="utf-8"))
        entry = known.get(key) if isinstance(known, dict) else None
    except (OSError, ValueError):   # none yet, unreadable, damaged: hash again
        known, entry = {}, None
    if isinstance(entry, dict) and entry.get("files") == stamps and isinstance(entry.get("digest"), str):
        return entry["digest"]
    value = digest()
    known = {k: v for k, v in known.items() if isinstance(v, dict) and isinstance(v.get("files"), list)
             and all(isinstance(s, list) and s and os.path.exists(str(s[0])) for s in v["files"])} \
        if isinstance(known, dict) else {}
    known[key] = {"files": stamps, "digest": value}
    try:
        write_json(store, known, indent=None)
    except OSError as e:   # a read-only home: hashed again next time
        log.info("cannot keep the hash of %s in %s (%s)", key, store, e)
    return value


def _record_path(directory, record: str) -> str:
    return str(Path(directory) / "manifest.json") if record == "the manifest" else f"{directory}: {record}"


def read_object(path: str | os.PathLike, what: str) -> dict:
    """A JSON file that must hold an object (a manifest, a record): anything else is an InputError naming
    it, not an AttributeError where a field is looked up."""
    obj = read_json(path)
    if not isinstance(obj, dict):
        raise InputError(f"{path}: not {what} (a JSON {type(obj).__name__}, not an object)")
    return obj


def checked_record(recorded, where: str) -> dict[str, dict]:
    """`recorded` if it has the shape of a files record, {name: {"bytes": int, "sha256": 64 hex digits}};
    else an InputError naming `where` and the entry (a hand-edited manifest once ended in a KeyError)."""
    if not isinstance(recorded, dict):
        raise InputError(f"{where}: its \"files\" are {type(recorded).__name__}, not a table of files")
    for name, want in recorded.items():
        if not isinstance(want, dict) or type(want.get("bytes")) is not int or want["bytes"] < 0 or \
                not isinstance(want.get("sha256"), str) or not re.fullmatch(r"[0-9a-f]{64}", want["sha256"]):
            raise InputError(f"{where}: the entry of {name!r} is not {{\"bytes\": a size, \"sha256\": a hash}}: "
                             f"{json.dumps(want)[:80]}")
    return recorded


def check_checksums(directory: str | os.PathLike, manifest: dict, what: str = "index", state: str = "corrupt",
                    record: str = "the manifest", advice: str = "rebuild it",
                    hash_up_to: int | None = VERIFY_ON_OPEN_BYTES, reads: Iterable[str] = (),
                    remember: bool = True) -> None:
    """On opening an index (or a checkpoint): sizes of all its files and bytes of those up to `hash_up_to`,
    as its manifest's "files" record them; an InputError naming the first that differs, or a file the
    opener `reads` that the record leaves out (and so would go unchecked). A file's hash is remembered
    (`remembered_sha256`) unless `remember` is False (`odqa verify` hashes anew)."""
    recorded = checked_record(manifest.get("files", {}), _record_path(directory, record))
    unrecorded = [name for name in reads if name not in recorded]
    if unrecorded:
        raise InputError(f"{state} {what}: {Path(directory) / unrecorded[0]} is not in {record}'s files, so it "
                         f"cannot be checked; {advice}")
    problems = verify_checksums(directory, recorded, hash_up_to, record, remember)
    if problems:
        raise InputError(f"{state} {what}: {problems[0]}" + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else "")
                         + f"; {advice}")
