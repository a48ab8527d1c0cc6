"""The one cache of the package: one key rule, one record format, atomic writes, one error type.

Everything the package caches (a grid run and its weights, each model of a shadow bank, a
gradient-norm run, a converted data set) is a *record*: one file holding a JSON ``meta`` (what
produced it: kind, format version, key, plain numbers) and a dict of CPU tensors, with a digest
over both. :func:`write` writes it atomically; :func:`read` checks the digest and the ``meta``
entries its caller expects and raises :class:`CacheError` when anything is off: the caller then
rebuilds what the record describes. File names are :func:`key` of everything that produced the
content (the whole resolved run description, defaults included, the device type, the code version,
:func:`source_digest` of the package code that produced it as this process read it, the data's
digest and the torch and numpy versions: :meth:`bnmem_utils.jobs.config.RunConfig.key`).
"""

from __future__ import annotations

import ast
import contextlib
import errno
import functools
import hashlib
import json
import os
import re
import shutil
import socket
import tempfile
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import torch


class CacheError(ValueError):
    """A cache file that cannot be trusted (unreadable, truncated, bad digest, written for
    another configuration or format): the one error type of every cache of the package. The
    caller rebuilds what it describes."""


def key(payload: dict, length: int = 20) -> str:
    """The one key rule of every cache: a sha256 of ``payload`` as sorted JSON. Callers put in
    everything that produced a result: the full resolved configuration (defaults included),
    the device type, the code version, the source of registered user code."""
    text = json.dumps(payload, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:length]


#: The layers that only present results (figures, explorers, the notebook context, the runner,
#: the command line): never on the path of a cached object, so never in a key. The layer rule
#: (tests/test_layers.py) already keeps every job's imports below them; this is the safeguard.
PRESENTATION = frozenset({"figures", "run"})
_PACKAGE = Path(__file__).resolve().parent.parent       # bnmem_utils/ (this file is in core/)
_PACKAGE_NAME = _PACKAGE.name


def module_file(module: str) -> Path:
    """The source file of the package module ``module``, named from the package down
    (``"core.cache"``)."""
    return _PACKAGE / (module.replace(".", "/") + ".py")


def package_imports(source: str) -> set[str]:
    """The package modules that ``source`` imports, at the top or inside a function, named from
    the package down (``from bnmem_utils.core import cache`` and ``from bnmem_utils.core.cache
    import key`` give ``"core.cache"``; ``import bnmem_utils.core.cache`` too); names that are
    not a module file of the package (a subpackage, ``bnmem_utils.start``) are left out."""
    names: set[str] = set()
    with _PARSE_LOCK:
        tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0:
            top, _, base = (node.module or "").partition(".")
            if top == _PACKAGE_NAME:  # the module itself, or modules of the package it names
                names.update([base, *(f"{base}.{a.name}".lstrip(".") for a in node.names)])
        elif isinstance(node, ast.Import):
            names.update(a.name.split(".", 1)[1] for a in node.names
                         if a.name.startswith(f"{_PACKAGE_NAME}."))
    return {n for n in names if module_file(n).is_file()}


#: One parse at a time: Python 3.11's parser, run from two threads at once (the banks of
#: :func:`bnmem_utils.analyses.mitigation.train_arm_banks` key themselves in parallel), can
#: fail with "SystemError: AST constructor recursion depth mismatch".
_PARSE_LOCK = threading.Lock()


class SourceChanged(RuntimeError):
    """A package module on the path of a cached kind was edited after this process read it:
    the code running here and the text a key would hash may differ, so no key is given."""


#: The source of every module outside the :data:`PRESENTATION` layers as this process read
#: it, at the package's first import (every module imports this one): what its code is loaded
#: from. A module made later is added when first asked for (:func:`module_source`).
_SOURCES = {".".join(p.relative_to(_PACKAGE).with_suffix("").parts): p.read_bytes()
            for p in sorted(_PACKAGE.rglob("*.py"))
            if p.relative_to(_PACKAGE).parts[0] not in PRESENTATION}


def module_source(module: str) -> bytes:
    """The source of the package module ``module`` as this process read it."""
    if module not in _SOURCES:
        _SOURCES[module] = module_file(module).read_bytes()
    return _SOURCES[module]


@functools.cache
def code_path(module: str) -> tuple[str, ...]:
    """``module`` (``"jobs.bank"``) and every package module it imports, directly or through
    others, sorted: the code on the path of what ``module`` computes (the import graph, read
    from the source files as this process read them, :func:`module_source`; the
    :data:`PRESENTATION` layers and the ``__init__`` files left out)."""
    seen, todo = set(), [module]
    while todo:
        name = todo.pop()
        if name in seen or name.split(".")[0] in PRESENTATION:
            continue
        seen.add(name)
        todo.extend(package_imports(module_source(name).decode()))
    return tuple(sorted(seen))


def source_digest(module: str) -> str:
    """A sha256 of the source text of every module of :func:`code_path` (line endings
    normalised), as this process read it: any edit to code on the path, a comment included,
    gives another digest; an edit to a presentation module or a notebook does not. Each call
    first checks that no file on the path was edited since (:class:`SourceChanged`)."""
    edited = [n for n in code_path(module) if module_file(n).read_bytes() != module_source(n)]
    if edited:   # the process may run the old code, or import the new one lazily: no key says which
        raise SourceChanged(f"{module_file(edited[0])} changed since this process read it, so no "
                            "cache key is given; restart the process (the notebook's kernel)")
    return _source_digest(module)


@functools.cache
def _source_digest(module: str) -> str:
    h = hashlib.sha256()
    for name in code_path(module):
        text = module_source(name).replace(b"\r\n", b"\n")
        h.update(f"{name}.py:{len(text)}:".encode())
        h.update(text)
    return h.hexdigest()[:20]


def digest(tensors: Mapping[str, torch.Tensor], meta: str = "") -> str:
    """A content digest of ``meta`` and of each tensor's name, dtype, shape and bytes."""
    h = hashlib.blake2b(meta.encode(), digest_size=16)
    for name in sorted(tensors):
        t = tensors[name].contiguous()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
        h.update(t.numpy().tobytes())
    return h.hexdigest()


def write(path: str | os.PathLike, meta: Mapping, tensors: Mapping[str, torch.Tensor] | None = None
          ) -> None:
    """Write a record atomically: ``meta`` (JSON-able), ``tensors`` (moved to the CPU), digest."""
    text = json.dumps(meta, sort_keys=True)
    tensors = {k: v.detach().cpu().contiguous() for k, v in (tensors or {}).items()}
    with atomic_path(path) as tmp:
        try:
            torch.save({"meta": text, "tensors": tensors, "digest": digest(tensors, text)}, tmp)
        except RuntimeError as exc:  # torch's zip writer reports a failed write (a full disk) so
            free = shutil.disk_usage(tmp.parent).free // 2**20   # nearly none: a full disk
            raise OSError(errno.ENOSPC if free < 64 else errno.EIO,
                          f"cannot write the cache record {path} ({free} MiB free there; free "
                          f"space or point $BNMEM_CACHE elsewhere): {str(exc).splitlines()[0]}"
                          ) from None


def read(path: str | os.PathLike, **expect) -> tuple[dict, dict[str, torch.Tensor]] | None:
    """``(meta, tensors)`` of the record at ``path``; None when there is no file.

    :class:`CacheError` when the file cannot be read, fails its digest, or its ``meta`` differs
    from ``expect`` in any entry (another kind, format version, key or run description).
    """
    path = Path(path)
    if not path.exists():
        return None
    try:
        blob = torch.load(path, map_location="cpu", weights_only=True)
        text, tensors = blob["meta"], blob["tensors"]
        intact = blob["digest"] == digest(tensors, text)
        meta = json.loads(text)
    except Exception as exc:  # noqa: BLE001 - any failure to read means "rebuild"
        raise CacheError(f"{path}: unreadable ({type(exc).__name__}: {exc})") from exc
    if not intact:
        raise CacheError(f"{path}: digest mismatch (file damaged or edited)")
    for name, value in expect.items():
        if meta.get(name) != value:
            raise CacheError(f"{path}: written for another {name}")
    return meta, tensors


def _umask() -> int:
    """The process umask (read by setting it and restoring it at once)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def promote(src: str | os.PathLike, dst: str | os.PathLike) -> None:
    """Rename ``src`` over ``dst`` with the usual umask-based mode (mkstemp makes files 0600)."""
    os.chmod(src, 0o666 & ~_umask())
    os.replace(src, dst)


#: This host in a temporary file's name (letters, digits and dashes), beside the writer's pid.
HOST = re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname()) or "host"
_TEMP = re.compile(r"^\..+\.(?P<host>[A-Za-z0-9-]+)-(?P<pid>\d+)\.[^.]+\.tmp$")


def temp_prefix(name: str) -> str:
    """The start of a temporary file's name for ``name``: ``.NAME.HOST-PID.`` (then mkstemp's
    random part and ``.tmp``), so that :func:`sweep_orphans` can tell a dead writer's file."""
    return f".{name}.{HOST}-{os.getpid()}."


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:                      # another user's process: running
        return True
    return True


def sweep_orphans(folder: str | os.PathLike) -> list[Path]:
    """Delete the temporary files in ``folder`` that a writer on this host left when it was
    killed mid-write (SIGKILL, the out-of-memory killer: no ``finally`` ran), told by the pid
    in their name no longer running; another host's, and a running process's, are kept.
    Returns the files deleted."""
    gone = []
    with contextlib.suppress(OSError), os.scandir(folder) as entries:
        for entry in entries:
            m = _TEMP.match(entry.name)
            if m and m["host"] == HOST and not _running(int(m["pid"])):
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)
                    gone.append(Path(entry.path))
    return gone


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it over ``path`` only if the block succeeds.

    An interrupted write therefore never leaves a half-written file under the final name (a
    killed writer's temporary file goes at the folder's next :func:`sweep_orphans`).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=temp_prefix(path.name), suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        promote(tmp_path, path)
    finally:
        tmp_path.unlink(missing_ok=True)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(text)
