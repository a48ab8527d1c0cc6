"""The one cache format: records read back as written; damage, another kind, version or key,
and interrupted writes are refused, never read."""

from __future__ import annotations

from pathlib import Path

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


def test_a_writer_killed_mid_write_leaves_a_temporary_file_that_the_next_opening_sweeps(tmp_path):
    """SIGKILL runs no ``finally``: the writer's temporary file stays beside the record. Its
    name carries the host and pid, so a later process deletes it once that pid is gone; a
    running process's, another host's and any other file are kept."""
    import os
    import signal
    import subprocess
    import sys
    import time

    code = ("import sys, time; from bnmem_utils.core import cache\n"
            "with cache.atomic_path(sys.argv[1]) as tmp:\n"
            "    tmp.write_bytes(b'half'); print(tmp, flush=True); time.sleep(60)\n")
    writer = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "model_0.pt")],
                              stdout=subprocess.PIPE, text=True)
    left = Path(writer.stdout.readline().strip())
    assert left.exists() and cache.sweep_orphans(tmp_path) == []      # its writer still runs
    writer.send_signal(signal.SIGKILL)
    writer.wait()
    time.sleep(0.1)
    assert left.exists() and not (tmp_path / "model_0.pt").exists()
    keep = [tmp_path / f".model_1.pt.{cache.HOST}-{os.getpid()}.abcd1234.tmp",   # running
            tmp_path / f".model_2.pt.elsewhere-{writer.pid}.abcd1234.tmp",      # another host
            tmp_path / ".model_3.pt.abcd1234.tmp", tmp_path / "model_4.pt"]
    for path in keep:
        path.write_bytes(b"x")
    assert cache.sweep_orphans(tmp_path) == [left]
    assert not left.exists() and all(p.exists() for p in keep)


def test_opening_a_bank_sweeps_its_folder(tmp_path):
    import subprocess
    import sys

    from bnmem_utils.jobs import bank as B
    from bnmem_utils.jobs.config import RunConfig

    config = RunConfig.bank(dataset="digits", arch="mlp", norm="bn", n_models=4, epochs=1,
                            train_size=64, test_size=32)
    folder = B.train_bank(config, tmp_path, device="cpu", progress=False).folder
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    orphan = Path(folder) / f".model_0.pt.{cache.HOST}-{gone.pid}.abcd1234.tmp"
    orphan.write_bytes(b"half")
    again = B.train_bank(config, tmp_path, device="cpu", progress=False)
    assert again.trained == 0 and not orphan.exists()
