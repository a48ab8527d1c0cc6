"""How well one shadow-model bank's interval describes retraining: the calibration table of
notebook 06 and the docs.

A number measured on R >= 2 replicate banks per arm (notebook 04's LiRA differences, each bank
from its own seed) is recorded with its Student t interval over the replicates, which the
verdict uses, and with how its replicates' own one-bank intervals fared
(:func:`bnmem_utils.core.stats.one_bank_calibration`): their mean half-width, the half-width
one bank would need given how far the replicates' numbers scatter, and in how many replicates
one bank's interval covers the mean of the others. One-bank intervals much narrower than
needed, or that miss the other replicates' mean in more than about one replicate in twenty,
under-cover: they leave out what retraining changes.
"""

from __future__ import annotations

import os

import pandas as pd

from bnmem_utils.analyses.report import Claim, setting_words
from bnmem_utils.core.results import load_results

__all__ = ["calibration_table"]


def calibration_table(claims: list[Claim], profile: str,
                      out_dir: str | os.PathLike | None = None) -> pd.DataFrame:
    """Per number measured on replicate banks (one row per results key, with every claim that
    reads it): how wide one bank's own interval is (the mean over replicates of its half-width);
    the Student t interval over the replicates the verdict uses (of the mean of R banks); the
    half-width one bank would need to carry retraining as well (1.96 times the standard
    deviation of the replicates' numbers); their ratio (above 1: one bank's interval is too
    narrow); and in how many replicates one bank's interval
    covers the mean of the other replicates (calibrated intervals nearly always do). Half-widths
    in the claim's display unit. Empty when no number has replicates."""
    results = load_results(profile, out_dir)
    rows: dict[str, dict] = {}
    for claim in claims:
        for key, entry in results.get(claim.notebook, {}).get("results", {}).items():
            cal = entry.get("calibration")
            if not (claim.bank and claim.matches(entry) and cal):
                continue
            if key in rows:
                rows[key]["claims"] += f", {claim.id}"
                continue
            one, two, need = (cal[k] * claim.scale for k in (
                "one_bank_halfwidth", "replicate_halfwidth", "one_bank_needed_halfwidth"))
            r = int(cal["replicates"])
            rows[key] = {"claims": claim.id, "setting": setting_words(claim, entry),
                         "replicates": r, "one-bank half-width": one,
                         "replicate-aware half-width": two, "one bank with retraining": need,
                         "ratio": need / one if one else None,
                         "one bank covers the others' mean": f"{round(cal['covers_others'] * r)} of {r}",
                         "unit": claim.unit, "key": key}
    return pd.DataFrame(list(rows.values()))
