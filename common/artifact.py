"""Is a built artifact current? One answer for every builder (BM25, dense, phrase and document indexes,
`odqa run`'s files, the demo's stages): the artifact's key (what it was built from, with which
settings) is fingerprinted by one function and recorded with it, and a builder reuses the artifact
only when the recorded key equals the one it would build with now.

- A directory (an index) records its key in `manifest.json`, with the size and sha256 of each of its
  files; it is built under a temporary name and renamed complete (`build_dir`), and reused only when
  the key matches and its files are as recorded (`current_manifest`).
- A file (a retrieval file, predictions, a report) records its key beside it, in `NAME.key.json`
  (`cached_file`), removed before the file is made again and written after it is complete, so a kill
  in between leaves a file without a key: made again, never a new file under an old key.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any, Callable, Iterator

from odqa.common.io import (
    VERIFY_ON_OPEN_BYTES,
    InputError,
    atomic_path,
    checksums,
    read_json,
    verify_checksums,
    write_json,
)
from odqa.common.paths import portable
from odqa.common.ranks import current

log = logging.getLogger(__name__)
MANIFEST = "manifest.json"


def fingerprint(obj: Any) -> str:
    """A short sha256 of any JSON-serialisable value (keys sorted; paths and other objects as strings)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def plain(key: dict) -> dict:
    """`key` as it reads back from JSON (paths as strings, tuples as lists), so a recorded key and a
    fresh one compare equal."""
    return json.loads(json.dumps(key, default=str))


def portable_key(key: dict) -> dict:
    """`key` as recorded and compared: as JSON reads it back, with the paths inside $ODQA_HOME written
    from "$ODQA_HOME/" (`common.paths.portable`), so that a moved home reuses what it holds."""
    return portable(plain(key))


def path_fingerprint(path: str | os.PathLike | None) -> str | None:
    """Identifies a model or index directory (or a file) by its files' names, sizes and modification
    times: cheap, not a hash of gigabytes."""
    if not path:
        return None
    p = Path(path)
    files = sorted(f for f in p.rglob("*") if f.is_file()) if p.is_dir() else [p]
    return fingerprint([(str(f.relative_to(p) if p.is_dir() else f), f.stat().st_size, int(f.stat().st_mtime))
                        for f in files])


def read_manifest(directory: str | os.PathLike) -> dict | None:
    path = Path(directory) / MANIFEST
    if not path.is_file():
        return None
    try:
        manifest = read_json(path)
    except ValueError:          # malformed: as good as absent, the artifact is built again
        return None
    return manifest if isinstance(manifest, dict) else None


def current_manifest(directory: str | os.PathLike, key: dict) -> dict | None:
    """The manifest of `directory` when it was built with `key` and its files are as recorded (every
    size; the bytes of files up to VERIFY_ON_OPEN_BYTES), else None (and why, in the log)."""
    manifest = read_manifest(directory)
    if manifest is None:
        return None
    if portable(manifest.get("key")) != portable_key(key):
        log.info("%s was built with other inputs or settings: building it again", directory)
        return None
    try:
        problems = verify_checksums(directory, manifest.get("files", {}), VERIFY_ON_OPEN_BYTES)
    except InputError as e:   # a record of the wrong shape: as good as absent, the artifact is built again
        problems = [str(e)]
    if problems:
        log.warning("%s: building it again", problems[0])
        return None
    return manifest


@contextlib.contextmanager
def build_dir(directory: str | os.PathLike, key: dict, **info) -> Iterator[tuple[Path, dict]]:
    """Yield (a temporary directory to fill, the manifest to complete); when the block ends, the
    manifest gets the key and the checksums of the files, and the directory is renamed into place."""
    manifest = {"key": portable_key(key), **info}
    with atomic_path(directory) as tmp:
        tmp.mkdir()
        yield tmp, manifest
        manifest["files"] = checksums(tmp)
        write_json(tmp / MANIFEST, manifest)


def cached_key(path: str | os.PathLike, key: dict, depth: int | None = None) -> dict | None:
    """The saved key of `path` when the file exists and was made with `key` (and at least `depth`
    results a question), else None."""
    path = Path(path)
    key_path = path.with_name(f"{path.name}.key.json")
    if path.exists() and key_path.exists():
        saved = read_json(key_path)
        if portable({k: v for k, v in saved.items() if k != "depth"}) == portable_key(key) and \
                (depth is None or saved.get("depth", 0) >= depth):
            return saved
    return None


def cached_file(path: str | os.PathLike, key: dict, make: Callable[[], None], depth: int | None = None) -> dict:
    """Make `path` (by calling `make`, which writes it atomically) unless it exists with the same key
    (and, for a ranked file, at least `depth` results a question: a deeper file serves every smaller
    k); returns the key of what is there.

    Under a launcher every rank calls it and `make` (whose stage splits its work by rank), and rank 0
    alone writes: every rank decides from the same files (a barrier before and after the look, so
    rank 0 writes nothing until every rank has looked), and none goes on before the file is there."""
    path, ranks = Path(path), current()
    ranks.barrier()
    saved = cached_key(path, key, depth)
    ranks.barrier()
    if saved is not None:
        log.info("reusing %s", path)
        return saved
    key_path = path.with_name(f"{path.name}.key.json")
    if ranks.main:
        key_path.unlink(missing_ok=True)
    make()
    key = portable_key(key)
    key = {**key, "depth": depth} if depth is not None else key
    if ranks.main:
        write_json(key_path, key)
    ranks.barrier()
    return key
