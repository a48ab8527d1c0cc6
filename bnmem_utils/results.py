"""Each notebook's key numbers, written to ``runs/<profile>/results/<notebook>.json``.

The runner's summary table, the report notebook (06) and ``bnmem`` read these files. A value is a
number, string, boolean or list, optionally with its interval (``lo``, ``hi``), the number of runs
behind it (``n``) and a one-line description.

Under the runner (``$BNMEM_RUN_ID`` set) a notebook writes ``<notebook>.pending.json`` instead,
which the runner renames to ``<notebook>.json`` only when the notebook succeeded (and to
``<notebook>.failed.json`` when it failed), so a failed or interrupted rerun never destroys the
previous good results. Run by hand (JupyterLab, plain papermill) a notebook writes
``<notebook>.json`` itself, from its first recorded number on: opening a notebook and running its
first cells leaves the previous file alone, but a hand run that stops half-way leaves the numbers
it recorded so far (its meta says ``"run_id": "interactive"``).
"""

from __future__ import annotations

import datetime as _dt
import fnmatch
import json
import math
import os
import string
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from .cache import atomic_write_text
from .paths import runs_dir
from .stats import Estimate

if TYPE_CHECKING:
    from .config import RunConfig

#: The shape of every assembled results key a claim of :data:`bnmem_utils.report.CLAIMS` reads,
#: written out once: family -> template. The code that records such a number and the claim that
#: reads it both call :func:`result_key` with the family's name, so a search for the name finds both
#: ends. ``cond`` (02) and ``arm`` (04, :func:`key_arm`) are both
#: ``<dataset>_<arch>_<setting>``, each part a key fragment (``memorization.slug``,
#: ``CorruptionConfig.slug``): a profile with several data sets records each one's numbers.
#: Keys without parts (notebook 01's ``theory_*``, notebook 05's ``mit_d_*_chosen``) are written
#: as they are, at both ends.
KEYS: dict[str, str] = {
    "mem": "mem_{cond}_{norm}_{metric}",                        # one norm's memorization (02)
    "mem_diff": "mem_diff_{norm}_none_{cond}_{when}",           # C1a, C1b (02)
    "mem_t3": "mem_t3_frac_above1_{cond}",                      # T3 (02)
    "gn_ratio": "gn_ratio_{norm}_{definition}_{when}",          # C2a (03)
    "gn_bn_over": "gn_bn_over_{reference}_noisy_{definition}_{when}",  # C2b, C2c (03)
    "lira_auc": "lira_auc_{norm}_{arm}_{subset}",               # one bank's AUC (04)
    "lira_auc_diff": "lira_auc_diff_{norm}_none_{arm}_{subset}",  # C3a-C3d (04)
    "lira_gapmatched_auc_diff": "lira_gapmatched_auc_diff_bn_none_{arm}",  # C3e (04)
    "lira_eval_minus_trainmode": "lira_eval_minus_trainmode_auc_bn_{arm}",  # C3f (04)
    "confound_auc_diff": "confound_auc_diff_bn_{norm}_{arm}_{at}",  # C3e, C3g (04b)
    "mit_m3_auc_diff": "mit_m3_auc_diff_{ref}",                 # M3 (05), ref e.g. groupnorm
}


def result_key(family: str, **parts) -> str:
    """The results key of ``family`` (:data:`KEYS`) with its parts filled in; a part may be a
    glob (``"*"``), which makes the key a pattern for a claim. Unknown families and missing or
    unknown parts are refused, naming the valid ones."""
    if family not in KEYS:
        raise ValueError(f"unknown results-key family {family!r}; valid choices: "
                         f"{', '.join(sorted(KEYS))}")
    template = KEYS[family]
    names = [n for _, n, _, _ in string.Formatter().parse(template) if n]
    if sorted(parts) != sorted(names):
        raise ValueError(f"results key {family!r} ({template}) needs the parts "
                         f"{', '.join(names)}; got {', '.join(sorted(parts)) or 'none'}")
    return template.format(**{n: str(v) for n, v in parts.items()})


def key_arm(config: RunConfig) -> str:
    """A bank's arm as notebook 04's results keys name it: ``<dataset>_<arch>_<setting>``, e.g.
    ``digits_lenet_ood1`` (the ``arm`` part of :data:`KEYS`)."""
    return f"{config.data.dataset}_{config.model.arch}_{config.corruption.slug()}"



def results_path(profile: str, notebook: str, out_dir: str | os.PathLike | None = None) -> Path:
    """Path of one notebook's results file."""
    return runs_dir(profile, out_dir) / "results" / f"{notebook}.json"


def pending_results_path(profile: str, notebook: str, out_dir: str | os.PathLike | None = None) -> Path:
    """Where a notebook run by the runner writes its results until the runner promotes them."""
    return runs_dir(profile, out_dir) / "results" / f"{notebook}.pending.json"


def failed_results_path(profile: str, notebook: str, out_dir: str | os.PathLike | None = None) -> Path:
    """Where the runner keeps the results a failed notebook recorded before failing."""
    return runs_dir(profile, out_dir) / "results" / f"{notebook}.failed.json"


def _clean(value):
    """JSON-safe value: NaN and infinities become None, numpy/torch scalars become Python numbers
    and arrays/tensors become (nested) lists."""
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
        value = value.item()
    elif hasattr(value, "tolist") and getattr(value, "ndim", 0) > 0:
        value = value.tolist()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    return value


class ResultsFile:
    """Accumulates one notebook's records and rewrites its JSON file atomically on each record."""

    def __init__(self, path: str | os.PathLike, meta: dict | None = None, *, lazy: bool = False):
        """``lazy``: write the file at the first :meth:`record`, not now (a hand run that only
        opens the notebook leaves the previous file alone)."""
        self.path = Path(path)
        self.meta = dict(meta or {})
        self.meta.setdefault("started", _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"))
        self.values: dict[str, dict] = {}
        if not lazy:
            self._write()

    def record(self, key: str, value, *, lo=None, hi=None, n=None, description: str = "",
               unit: str = "") -> dict:
        """Store ``key``; an :class:`~bnmem_utils.stats.Estimate` fills mean, lo, hi and n."""
        if not key or not isinstance(key, str):
            raise ValueError(f"a result key must be a non-empty string, got {key!r}")
        if isinstance(value, Estimate):
            value, lo, hi, n = value.mean, value.lo, value.hi, value.n
        entry = {"value": _clean(value)}
        for name, extra in (("lo", lo), ("hi", hi), ("n", n)):
            if extra is not None:
                entry[name] = _clean(extra)
        if description:
            entry["description"] = description
        if unit:
            entry["unit"] = unit
        self.values[key] = entry
        self._write()
        return entry

    def _write(self) -> None:
        payload = {"meta": _clean(self.meta), "results": self.values}
        atomic_write_text(self.path, json.dumps(payload, indent=1, default=str) + "\n")


def load_results(profile: str, out_dir: str | os.PathLike | None = None) -> dict[str, dict]:
    """All notebooks' results of a profile: ``{notebook: {"meta": ..., "results": ...}}``."""
    folder = runs_dir(profile, out_dir) / "results"
    out: dict[str, dict] = {}
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        if "." in path.stem:  # NN_name.pending.json / NN_name.failed.json: not results in effect
            continue
        try:
            out[path.stem] = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f"results file {path} is not valid JSON ({exc}); re-run its notebook") from exc
    return out


def key_numbers(recorded: dict[str, dict], *patterns: str, digits: int = 3) -> pd.DataFrame:
    """The recorded numbers whose keys match any of the glob ``patterns`` (all when none is
    given), in recording order: one row per key with the value, its 95% interval (where it has
    one), n and the description. What a notebook shows as its key numbers."""
    keys = [k for k in recorded if not patterns or any(fnmatch.fnmatchcase(k, p) for p in patterns)]
    rows = [{"key": k, "value": format_result(recorded[k], digits), "n": recorded[k].get("n"),
             "description": recorded[k].get("description", "")} for k in keys]
    frame = pd.DataFrame(rows, columns=["key", "value", "n", "description"]).set_index("key")
    return frame.astype({"n": "Int64"})                 # counts, blank where there is none


def format_result(entry: dict, digits: int = 3) -> str:
    """``value [lo, hi]`` for a results entry (just the value when it has no interval)."""
    value = entry.get("value")
    text = f"{value:.{digits}g}" if isinstance(value, float) else str(value)
    if entry.get("lo") is not None and entry.get("hi") is not None:
        text += f" [{entry['lo']:.{digits}g}, {entry['hi']:.{digits}g}]"
    return text
