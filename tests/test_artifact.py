"""The one artifact helper: a key fingerprinted one way, recorded with the artifact, checked on reuse."""
import json

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
