"""The one cache format: records read back as written; damage, another kind, version or key,
and interrupted writes are refused, never read."""

from __future__ import annotations

import pytest
import torch

from bnmem_utils.core import cache


def _record(tmp_path):
    path = tmp_path / "sub" / "r.pt"
    meta = {"kind": "demo", "version": 3, "key": "abc", "seconds": float("nan"), "n": [1, 2]}
    tensors = {"w": torch.arange(6.0).reshape(2, 3), "mask": torch.tensor([True, False])}
    cache.write(path, meta, tensors)
    return path, meta, tensors


def test_a_record_reads_back_as_written(tmp_path):
    path, meta, tensors = _record(tmp_path)
    got_meta, got = cache.read(path, kind="demo", version=3, key="abc")
    assert got_meta["n"] == [1, 2] and got_meta["seconds"] != got_meta["seconds"]  # NaN kept
    assert set(got) == set(tensors) and all(torch.equal(got[k], tensors[k]) for k in tensors)
    assert cache.read(tmp_path / "absent.pt") is None


@pytest.mark.parametrize("expect", [{"kind": "other"}, {"version": 4}, {"key": "abd"}])
def test_another_kind_version_or_key_is_refused(tmp_path, expect):
    path, _, _ = _record(tmp_path)
    with pytest.raises(cache.CacheError, match=f"written for another {next(iter(expect))}"):
        cache.read(path, **expect)


@pytest.mark.parametrize("damage", ["tensor", "meta", "truncated", "garbage"])
def test_damage_is_refused(tmp_path, damage):
    path, _, _ = _record(tmp_path)
    blob = torch.load(path, weights_only=True)
    if damage == "tensor":
        blob["tensors"]["w"][0, 0] = 9.0
    elif damage == "meta":
        blob["meta"] = blob["meta"].replace('"key": "abc"', '"key": "abd"')
    if damage in ("tensor", "meta"):
        torch.save(blob, path)
    elif damage == "truncated":
        path.write_bytes(path.read_bytes()[:100])
    else:
        path.write_bytes(b"not a torch file")
    with pytest.raises(cache.CacheError, match="digest mismatch" if damage in ("tensor", "meta")
                       else "unreadable"):
        cache.read(path)


def test_the_key_covers_every_entry_and_ignores_order():
    assert cache.key({"a": 1, "b": [1, 2]}) == cache.key({"b": [1, 2], "a": 1})
    assert cache.key({"a": 1, "b": [1, 2]}) != cache.key({"a": 1, "b": [1, 3]})
    assert len(cache.key({"a": 1})) == 20


def test_atomic_path_replaces_only_on_success(tmp_path):
    target = tmp_path / "sub" / "file.txt"
    cache.atomic_write_text(target, "first")
    assert target.read_text() == "first"
    with pytest.raises(RuntimeError), cache.atomic_path(target) as tmp:
        tmp.write_text("half-writ")
        raise RuntimeError("interrupted")
    assert target.read_text() == "first"
    assert sorted(p.name for p in target.parent.iterdir()) == ["file.txt"]  # no temp left behind
    mask = cache._umask()
    assert target.stat().st_mode & 0o777 == 0o666 & ~mask  # not mkstemp's 0600


def test_a_cache_write_that_fails_names_the_file_and_the_free_space(tmp_path, monkeypatch):
    """torch's writer reports a full disk as a RuntimeError ("unexpected pos ..."): the record's
    path and the space left are named instead, and no file is left behind."""
    import torch

    from bnmem_utils.core import cache

    def full(*args, **kwargs):
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 64 vs 0")

    monkeypatch.setattr(torch, "save", full)
    target = tmp_path / "bank" / "record.pt"
    with pytest.raises(OSError, match=r"cannot write the cache record .*record\.pt \(\d+ MiB free"):
        cache.write(target, {"a": 1}, {"x": torch.zeros(2)})
    assert list(target.parent.iterdir()) == []
