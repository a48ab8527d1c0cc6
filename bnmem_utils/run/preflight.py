"""What a run needs from its environment, checked before any kernel starts: folders it writes,
optional packages its executors need, data sets it downloads or reads, their digests, and a GPU
for a profile sized for one.

Each check raises :class:`bnmem_utils.run.params.UsageError` with one line naming the value
(the command line's exit code 2); :func:`bnmem_utils.run.plan.plan_run` calls them.
"""

from __future__ import annotations

import importlib.util
import os
import re
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path

from bnmem_utils.core import paths
from bnmem_utils.run.params import UsageError


def check_writable(folder: Path, label: str, *, create: bool = True) -> Path:
    """``folder``, created if needed (``create``; else its nearest existing folder is probed)
    and checked writable by writing a probe file; :class:`UsageError` naming ``label`` when it,
    or a folder above it, is a file or cannot be written."""
    for above in (folder, *folder.parents):
        if above.exists() and not above.is_dir():
            raise UsageError(f"{label}: {above} is a file, not a folder")
        if above.exists() or create:
            break
    try:
        if create:
            folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder if create else above, prefix=".bnmem-probe."):
            pass
    except OSError as exc:
        raise UsageError(f"{label}: cannot write there ({exc.strerror or exc})") from None
    return folder


def check_output_folder(out_dir: str | os.PathLike | None) -> Path:
    """The output root (``--out`` or the project root), created if needed and checked writable
    by writing a probe file; :class:`UsageError` (one line) when it is a file or cannot be
    written, instead of a traceback later."""
    root = paths.output_root(out_dir)
    label = f"--out {out_dir}" if out_dir else f"output folder {root}"
    if root.exists() and not root.is_dir():
        raise UsageError(f"{label}: {root} is a file, not a folder")
    check_writable(root / "runs", label)
    return root


def check_cache_folder(out_dir: str | None) -> Path:
    """The model cache (``$BNMEM_CACHE``, else ``<out>/runs/cache``) must be a writable folder."""
    env, folder = os.environ.get("BNMEM_CACHE"), paths.cache_dir(out_dir)
    return check_writable(folder, f"$BNMEM_CACHE={env}" if env else f"cache folder {folder}")


def check_data_variables() -> None:
    """``$BNMEM_DATA`` names a folder (or one still to make); ``$BNMEM_DATA_DIGESTS`` reads
    ``name=digest[,name=digest]`` with registered data sets' names: a typo would otherwise
    check nothing, silently."""
    from bnmem_utils.data.datasets import DATASETS
    from bnmem_utils.data.files import DIGESTS_ENV

    folder = os.environ.get("BNMEM_DATA")
    if folder and Path(folder).expanduser().exists() and not Path(folder).expanduser().is_dir():
        raise UsageError(f"$BNMEM_DATA={folder} is a file; it must name the folder that holds "
                         "the data sets (or one to create), or be unset")
    for name in digest_overrides():
        if name not in DATASETS:
            raise UsageError(f"${DIGESTS_ENV} names {name!r}, which is not a data set; valid "
                             f"choices: {', '.join(DATASETS)}")
        if name == "digits":   # the run would record a digest that nothing checked
            raise UsageError(f"${DIGESTS_ENV} names digits, which is embedded (scikit-learn's "
                             "copy), not read from files, so no digest is checked; drop it")


def check_compile_variable() -> None:
    """``$BNMEM_COMPILE`` is unset, empty or ``off`` (:func:`bnmem_utils.training.steps.
    compile_mode`): another value (``false``, ``0``) would compile on a GPU, silently."""
    value = os.environ.get("BNMEM_COMPILE", "")
    if value.strip().lower() not in ("", "off"):
        raise UsageError(f"$BNMEM_COMPILE={value} is not a choice; valid choices: off (train "
                         "eagerly on a GPU too), or unset")


def digest_overrides() -> dict[str, str]:
    """``$BNMEM_DATA_DIGESTS`` as ``{data set: digest}``; :class:`UsageError` when it does not
    read ``name=digest[,name=digest]``."""
    from bnmem_utils.data.files import digest_overrides as read

    try:
        return read()
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def check_executors(values: Iterable[tuple[str, Mapping[str, object]]]) -> None:
    """Every ``*_executor`` set to ``ray`` needs Ray importable (``values``: ``(notebook,
    parameters)`` pairs)."""
    from bnmem_utils.core.executors import RAY_INSTALL_HINT

    for notebook, params in values:
        for key, value in params.items():
            if key.endswith("_executor") and value == "ray" and importlib.util.find_spec("ray") is None:
                raise UsageError(f"{key}='ray' (for {notebook}) needs Ray, which is not installed: "
                                 f"{RAY_INSTALL_HINT}; or set {key}=local")


def download_blocked(name: str, timeout: float = 3.0) -> str:
    """Why torchvision cannot download ``name`` now (``""``: its server answers a TCP connection
    within ``timeout`` seconds)."""
    import socket
    from urllib.parse import urlsplit

    import torchvision.datasets

    from bnmem_utils.data.files import TORCHVISION_CLASS

    cls = getattr(torchvision.datasets, TORCHVISION_CLASS[name])
    url = urlsplit(cls.mirrors[0] if hasattr(cls, "mirrors") else cls.url)
    try:
        socket.create_connection((url.hostname, url.port or (443 if url.scheme == "https" else 80)),
                                 timeout=timeout).close()
    except OSError as exc:
        return f"its download server {url.hostname} cannot be reached ({exc.strerror or exc})"
    return ""


def verify_dataset(name: str) -> None:
    """Read ``name`` through :func:`bnmem_utils.data.files.load_files`, which checks its digest
    (one to be downloaded is checked as it arrives); its one-line
    :class:`~bnmem_utils.data.files.DataIntegrityError` becomes a UsageError."""
    from bnmem_utils.data.files import TORCHVISION_CLASS, load_files

    if name in TORCHVISION_CLASS:
        try:
            load_files(name)
        except FileNotFoundError:
            pass
        except ValueError as exc:  # DataIntegrityError, a damaged IDX file
            raise UsageError(str(exc)) from None


def check_gpu_sized(profile: Path, name: str, device: str, kind: str, *, allow: bool) -> None:
    """A profile sized for a GPU (its file ``profile`` carries the projected training work of
    :mod:`bnmem_utils.run.work`: gpu, paper) that ``--device auto`` would train on the CPU
    (``kind``: the device it resolved to) is a :class:`UsageError` naming its projected time
    on the GPU and what to do, before any kernel starts; a device asked for by name (``--device
    cpu``) or ``allow`` (``--allow-cpu``, a dry run) goes on."""
    from bnmem_utils.run.rates import BEGIN, load_rates

    if allow or device != "auto" or kind != "cpu":
        return
    text = profile.read_text(encoding="utf-8")
    if BEGIN not in text:
        return
    total = re.search(r"^#\s+total\s.*?(\d[\d.,]* (?:min|h))\s*$", text, re.M)
    gpu = load_rates()[0].get("short", "a GPU")
    projected = f"projected {total.group(1)} on {gpu}" if total else f"projected on {gpu}"
    raise UsageError(f"profile {name} is sized for a GPU ({projected}), and --device auto finds "
                     f"none here: it would train on the CPU, for which no projection of it "
                     f"exists (many times longer); run it on a machine with a GPU, prove it in "
                     f"minutes with --dry-run, or train on the CPU anyway with --allow-cpu (or "
                     f"--device cpu)")
