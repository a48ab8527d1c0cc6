"""Each notebook's key numbers, written to ``runs/<profile>/results/<notebook>.json``.

The runner's summary table, the report notebook (06) and ``bnmem`` read these files. Each entry is
one number recorded as a :class:`Result`: its fields (what it measures: metric, norm, data set,
setting...) and the setting in words, under the key the fields make. A value is a number, string,
boolean or list, optionally with its interval (``lo``, ``hi``), the number of runs behind it
(``n``) and a one-line description.

Under the runner (``$BNMEM_RUN_ID`` set) a notebook writes ``<notebook>.pending.json`` instead,
which the runner renames to ``<notebook>.json`` only when the notebook succeeded (and to
``<notebook>.failed.json`` when it failed), so a failed or interrupted rerun never destroys the
previous good results. Run by hand (JupyterLab, plain papermill) a notebook writes
``interactive/results/<notebook>.json`` under the profile's folder itself (never the headless
run's), from its first recorded number on: opening a notebook and running its first cells
leaves the previous file alone, but a hand run that stops half-way leaves the numbers it recorded
so far (its meta says ``"run_id": "interactive-<UTC time>"``).
"""

from __future__ import annotations

import datetime as _dt
import fnmatch
import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from bnmem_utils.core.cache import atomic_write_text
from bnmem_utils.core.paths import runs_dir
from bnmem_utils.core.stats import Estimate

if TYPE_CHECKING:
    from bnmem_utils.jobs.config import RunConfig

#: The fields of a recorded number, in the order its key names them (empty fields left out).
FIELDS = ("metric", "norm", "versus", "dataset", "arch", "setting", "subset", "mode", "when",
          "ruler", "attack")


@dataclass(frozen=True)
class Result:
    """What one recorded number measures, as fields; its results key is derived from them.

    ``metric``: what is measured (``lira_auc``, ``mem_final``, ``theory_loglog_slope``);
    ``norm``: the normalizer measured; ``versus``: for a difference (or a ratio), the one
    subtracted (``norm`` minus ``versus``); ``dataset``, ``arch``; ``setting``: the corruption
    as a key fragment (``ood1``, ``flip_1pct``) and ``label`` the same in words (``OOD 1%``);
    ``subset``: which samples (``all``, ``outlier``, ``noisy``, a layer); ``mode``: how the
    model was read (``eval`` or ``train`` statistics); ``when``: an epoch or a position
    (``final``, ``at10``, ``mid``); ``ruler``: what two curves were matched on (``accgap``,
    ``lossgap``, ``globalauc``: the confound study's rulers); ``attack``: an attack other than
    the headline one, whose numbers are recorded beside it (empty: the headline attack). The
    report selects and describes claims from these fields,
    never from the key; ``label`` names the setting but is no part of the key."""

    metric: str
    norm: str = ""
    versus: str = ""
    dataset: str = ""
    arch: str = ""
    setting: str = ""
    subset: str = ""
    mode: str = ""
    when: str = ""
    ruler: str = ""
    attack: str = ""
    label: str = ""

    def __post_init__(self):
        for name, value in self.fields().items():
            if not isinstance(value, str) or not _FIELD.fullmatch(value):
                raise ValueError(f"result field {name}={value!r} must be a lower-case key "
                                 "fragment (letters, digits, '.', '_')")
        if not self.metric:
            raise ValueError("a result needs its metric")

    @property
    def key(self) -> str:
        """The results key: the non-empty fields joined by ``_`` in :data:`FIELDS` order, e.g.
        ``lira_auc_bn_none_digits_lenet_ood1_all``."""
        return "_".join(self.fields().values())

    def fields(self) -> dict[str, str]:
        """The non-empty fields (:data:`FIELDS`), as stored in the results file."""
        return {n: v for n in FIELDS if (v := getattr(self, n))}

    @classmethod
    def of(cls, config: RunConfig, metric: str, **fields) -> Result:
        """A result about the models of ``config``: its data set, architecture, norm and
        corruption (key fragment and words) filled in; ``fields`` add to or override them."""
        return cls(metric=metric, **{"norm": config.model.norm, "dataset": config.data.dataset,
                                     "arch": config.model.arch,
                                     "setting": config.corruption.slug(),
                                     "label": config.corruption.label(), **fields})


_FIELD = re.compile(r"[a-z0-9][a-z0-9._]*")

#: The possible range of the bounded metrics: fractions (accuracies, AUCs) lie in [0, 1] and
#: differences of two fractions in [-1, 1]. :meth:`ResultsFile.record` cuts an interval that
#: spills over (a t interval over few seeds can) and marks the entry ``clipped``.
_FRACTION, _FRACTION_DIFF = (0.0, 1.0), (-1.0, 1.0)
RANGES = {**dict.fromkeys(("mem_final", "mem_test_acc", "mem_t3_frac_above1", "lira_auc",
                           "lira_tpr1", "confound_auc", "mit_mem", "mit_acc"), _FRACTION),
          **dict.fromkeys(("mem_diff", "lira_auc_diff", "lira_eval_minus_trainmode_auc",
                           "confound_auc_diff", "confound_knob_auc_diff", "confound_reg_auc_diff",
                           "mit_d_mem", "mit_d_acc", "mit_m3_auc_diff", "mit_m3_auc_flipped_diff"),
                         _FRACTION_DIFF)}


def results_path(profile: str, notebook: str, out_dir: str | os.PathLike | None = None,
                 state: str = "") -> Path:
    """Path of one notebook's results file; ``state`` ``"pending"``: where a notebook run by the
    runner writes its results until the runner promotes them, ``"failed"``: where the runner
    keeps the results a failed notebook recorded before failing."""
    name = f"{notebook}.{state}" if state else notebook
    return runs_dir(profile, out_dir) / "results" / f"{name}.json"


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

    def record(self, what: Result | str, value, *, lo=None, hi=None, n=None,
               description: str = "", unit: str = "", replicates: int | None = None,
               calibration: dict | None = None) -> dict:
        """Store one number under its :class:`Result` (a plain string: a metric with no
        setting), keyed by :attr:`Result.key`, its fields (and the setting's words) beside it;
        an :class:`~bnmem_utils.core.stats.Estimate` fills mean, lo, hi and n. A number measured
        on shadow-model banks also stores how many replicate banks per arm it rests on and, with
        two or more, how one bank's interval compares with theirs
        (:func:`~bnmem_utils.core.stats.one_bank_calibration`)."""
        result = what if isinstance(what, Result) else Result(what)
        est = value if isinstance(value, Estimate) else None
        if est is not None:
            n = est.n
        elif isinstance(value, int | float) and lo is not None and hi is not None:
            est = Estimate(float(value), float(lo), float(hi), n or 0)
        if est is not None and result.metric in RANGES:
            est = est.within(*RANGES[result.metric])
        if est is not None:
            value, lo, hi = est.mean, est.lo, est.hi
        entry = {"value": _clean(value)}
        for name, extra in (("lo", lo), ("hi", hi), ("n", n)):
            if extra is not None:
                entry[name] = _clean(extra)
        optional = {"method": est and est.method, "clipped": bool(est and est.clipped),
                    "description": description, "unit": unit}
        entry.update({name: extra for name, extra in optional.items() if extra})
        if replicates is not None:
            entry["replicates"] = int(replicates)
        if calibration:
            entry["calibration"] = {k: _clean(v) for k, v in calibration.items()}
        entry["fields"] = result.fields()
        if result.label:
            entry["label"] = result.label
        self.values[result.key] = entry
        self._write()
        return entry

    def _write(self) -> None:
        payload = {"meta": _clean(self.meta), "results": self.values}
        atomic_write_text(self.path, json.dumps(payload, indent=1, default=str) + "\n")


#: The environment variable through which the runner tells a kernel the data its run reads
#: (``{data set: digest}``, JSON), recorded in the results' meta and the figures' manifest.
DATA_ENV = "BNMEM_DATA_RECORD"


class NothingToReport(FileNotFoundError):
    """A profile with no results but a report's own: a report would be an empty table (one
    line naming what to run first)."""

    def __init__(self, profile: str):
        super().__init__(f"nothing to report for profile {profile}: runs/{profile}/results/ "
                         f"holds no notebook's results; run `bnmem reproduce --profile {profile}` "
                         "first")


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
