"""The one artifact helper: a key fingerprinted one way, recorded with the artifact, checked on reuse."""
import json
from pathlib import Path

import pytest

from odqa.common.artifact import build_dir, current_manifest, fingerprint, path_fingerprint


def test_fingerprint_is_of_the_value_not_its_spelling(tmp_path):
    assert fingerprint({"a": 1, "b": [1, 2]}) == fingerprint({"b": [1, 2], "a": 1})
    assert fingerprint({"a": 1}) != fingerprint({"a": 2})
    assert fingerprint({"path": tmp_path}) == fingerprint({"path": str(tmp_path)})
    f = tmp_path / "model.bin"
    f.write_bytes(b"x")
    before = path_fingerprint(tmp_path)
    f.write_bytes(b"xy")
    assert path_fingerprint(tmp_path) != before and path_fingerprint(None) is None


def test_a_directory_is_reused_only_with_its_key_and_its_files_intact(tmp_path):
    out = tmp_path / "index"
    key = {"corpus": "c1", "params": {"k1": 1.5}}
    assert current_manifest(out, key) is None                       # nothing built yet
    with build_dir(out, key, passages=3) as (tmp, manifest):
        (tmp / "data.bin").write_bytes(b"0123456789")
        manifest["note"] = "filled in the block"
    m = current_manifest(out, key)
    assert m["passages"] == 3 and m["note"] == "filled in the block" and m["files"]["data.bin"]["bytes"] == 10
    assert current_manifest(out, {**key, "corpus": "c2"}) is None    # other inputs
    (out / "data.bin").write_bytes(b"0123456780")                    # same size, other bytes
    assert current_manifest(out, key) is None
    (out / "manifest.json").write_text("{not json")
    assert current_manifest(out, key) is None


def test_a_failed_build_leaves_the_old_directory(tmp_path):
    out = tmp_path / "index"
    with build_dir(out, {"v": 1}) as (tmp, _):
        (tmp / "a").write_text("old")
    with pytest.raises(RuntimeError), build_dir(out, {"v": 2}) as (tmp, _):
        (tmp / "a").write_text("new, half done")
        raise RuntimeError("killed")
    assert (out / "a").read_text() == "old" and json.loads((out / "manifest.json").read_text())["key"] == {"v": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["index"]          # no temporary left


def _publisher(i, target, times, errors):
    from odqa.common.io import atomic_path
    for t in range(times):
        try:
            with atomic_path(target) as tmp:
                tmp.mkdir()
                for j in range(20):
                    (tmp / f"f{j}").write_text(f"{i}-{t}")
        except Exception as e:  # noqa: BLE001 -- what the test counts
            errors.put(repr(e))


def test_writers_racing_to_publish_one_directory_each_publish_whole(tmp_path):
    """Three processes publish into one path 30 times each: none fails (the old code raised ENOTEMPTY
    or FileNotFoundError in most such runs), the last one's directory is there whole, and no
    temporary is left."""
    import multiprocessing
    ctx = multiprocessing.get_context("fork")
    errors = ctx.Queue()
    writers = [ctx.Process(target=_publisher, args=(i, tmp_path / "out", 30, errors)) for i in range(3)]
    for w in writers:
        w.start()
    for w in writers:
        w.join(120)
    failed = []
    while not errors.empty():
        failed.append(errors.get())
    assert failed == []
    files = sorted((tmp_path / "out").iterdir())
    assert len(files) == 20 and len({f.read_text() for f in files}) == 1      # one writer's, whole
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_a_shipped_deepspeed_config_is_the_same_setting_wherever_the_package_was_installed(tmp_path):
    """The trainers' default DeepSpeed JSON is a path inside the installed package: a key written by
    another checkout or virtual environment names it elsewhere, and still means the same file."""
    from odqa.common.paths import CONFIG_DIR, portable
    from odqa.common.settings import OptimArgs
    here = OptimArgs().deepspeed_config
    assert Path(here).parent == CONFIG_DIR and Path(here).is_file()
    elsewhere = "/opt/venv/lib/python3.11/site-packages/odqa/common/configs/zero2.json"
    assert portable({"deepspeed_config": here}) == portable({"deepspeed_config": elsewhere}) == \
        {"deepspeed_config": "$ODQA_CONFIGS/zero2.json"}
    # the user's own JSON, or a name the package does not ship, stays the path it is
    for own in (str(tmp_path / "zero2.json"), "/srv/odqa/common/configs/my_zero.json"):
        assert portable(own) == own


def test_a_key_naming_paths_in_the_home_is_reused_in_a_copy_of_it(tmp_path, monkeypatch):
    """Keys record paths inside $ODQA_HOME from "$ODQA_HOME/": a copied home (`cp -a`) reuses its files and
    indexes rather than making them again, and a key recorded with absolute paths in this home (before
    keys were portable) is still this home's."""
    import shutil

    from odqa.common.artifact import cached_file, cached_key
    home = tmp_path / "home"
    monkeypatch.setenv("ODQA_HOME", str(home))
    made = []

    def make(path):
        def write():
            made.append(path)
            path.write_text("x")
        return write
    (home / "corpus").mkdir(parents=True)
    key = {"corpus": str(home / "corpus"), "k": [1, 2]}
    cached_file(home / "run.json", key, make(home / "run.json"))
    assert json.loads((home / "run.json.key.json").read_text())["corpus"] == "$ODQA_HOME/corpus"
    with build_dir(home / "index", key) as (tmp, _):
        (tmp / "vectors").write_text("v")

    copy = tmp_path / "copy"
    shutil.copytree(home, copy)
    shutil.rmtree(home)
    monkeypatch.setenv("ODQA_HOME", str(copy))
    moved = {"corpus": str(copy / "corpus"), "k": [1, 2]}
    assert cached_key(copy / "run.json", moved) is not None and current_manifest(copy / "index", moved)
    cached_file(copy / "run.json", moved, make(copy / "run.json"))
    assert made == [home / "run.json"]                          # reused, not made again
    assert cached_key(copy / "run.json", {**moved, "corpus": str(tmp_path / "elsewhere")}) is None

    legacy = copy / "legacy.json"        # a key written with the home's absolute path
    legacy.write_text("y")
    (copy / "legacy.json.key.json").write_text(json.dumps(moved))
    assert cached_key(legacy, moved) is not None


def test_a_manifest_whose_files_record_is_of_the_wrong_shape_is_built_again(tmp_path):
    """A derived artifact (the answer index, BM25) with a hand-edited files record is rebuilt, as one whose
    files differ is, rather than ending in a KeyError."""
    d = tmp_path / "a"
    with build_dir(d, {"x": 1}) as (tmp, _):
        (tmp / "f.bin").write_bytes(b"abc")
    assert current_manifest(d, {"x": 1}) is not None
    manifest = json.loads((d / "manifest.json").read_text())
    for files in ({"f.bin": {"sha256": manifest["files"]["f.bin"]["sha256"]}}, 3, {"f.bin": {"bytes": "3", "sha256": "0"}}):
        (d / "manifest.json").write_text(json.dumps({**manifest, "files": files}))
        assert current_manifest(d, {"x": 1}) is None
