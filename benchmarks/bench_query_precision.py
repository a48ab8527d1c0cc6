"""Do LiRA's numbers survive bf16 queries? The same trained models queried in float32 and under
bf16 autocast, every attack scored on both.

    .venv/bin/python benchmarks/bench_query_precision.py --json benchmarks/query_precision.json
    .venv/bin/python benchmarks/bench_query_precision.py --table benchmarks/query_precision.json

A bank trains in bf16 on a GPU (``TrainConfig.amp="auto"``) but queries its members in float32
(:func:`bnmem_utils.training.loop.predict_logits`): an eager ResNet-18 forward in float32 costs a
few times its bf16 forward, so the queries weigh on a GPU bank. Whether they may follow the
training precision is a question of what bf16 logits do to the attacks, measured here on the CPU
(its bf16 autocast rounds the inputs of every convolution and linear layer to bf16 as CUDA's
does; the accumulation order differs).

The banks are those of notebook 04 in the ``fmnist`` profile (Fashion-MNIST, LeNet, BN and no
norm, N = 12 models on a 4,000-image pool, 8 epochs), at ``--rate`` OOD outliers, for each
replicate seed of ``--seeds``. Each member is trained once in float32, one after another, then
queried twice under the profile's query augmentations, as a bank queries it (eval mode on the
pool and the population, train mode on the pool for BN, the test split): plainly, and under
``torch.autocast("cpu", torch.bfloat16)`` (logits upcast to float32 after the last layer, as the
bank does). Every model is the target in turn (leave-one-out); for every attack of
:data:`bnmem_utils.privacy.attacks.ATTACKS`, bf16's AUC and TPR at 0.1% and 1% FPR are compared
with float32's, target by target (mean difference, its 95% Student t interval over the targets,
the largest difference), and BN minus no norm (the notebook's comparison, paired by replicate)
under each; the same for the AUC of the train-mode queries (BN banks; RMIA left out, as the bank
leaves it out in train mode), and for each model's test accuracy and loss. ``--table FILE``
prints a saved run's table; benchmarks/README.md holds it, checked by
tests/test_bench_query_precision.py.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import numpy as np
import torch

from bnmem_utils.core.checks import keep_matrix
from bnmem_utils.core.stats import mean_ci
from bnmem_utils.jobs import bank as B
from bnmem_utils.jobs import bank_models as MB
from bnmem_utils.privacy import attacks
from bnmem_utils.run import work

ATTACKS = tuple(attacks.ATTACKS)
TRAIN_MODE = tuple(a for a in ATTACKS if not a.startswith("rmia"))
METRICS = ("auc", "tpr@0.1%", "tpr@1%")


def bank_configs(rate: float, seeds: list[int], changes: dict | None = None) -> list:
    """The fmnist profile's notebook 04 banks at OOD rate ``rate`` (BN and no norm), one per
    replicate seed (seed 0 is the profile's first replicate), with the notebook parameters
    ``changes`` (e.g. another architecture)."""
    from bnmem_utils.analyses import leakage

    p = work.profile_parameters("fmnist") | {"lira_outlier_rates": [rate], "lira_replicates": 1}
    p |= changes or {}
    return [c for s in seeds for c in leakage.configs_from_params(p | {"seed": s})[0]]


def query_both(config) -> dict:
    """Train ``config``'s members in float32 one after another; query each as the bank does
    (:func:`bnmem_utils.jobs.bank_models._query_one`), in float32 (``amp="off"``) and under bf16
    autocast (``amp="bf16"``): per precision, LiRA scores of the pool (N, M, Q), the population
    (N, P, Q) and the train-mode pool (N, M, Q) or None, and test accuracies and losses (N,)."""
    data = MB.prepare_data(config, "cpu")
    n = config.measure.n_models
    keep = keep_matrix(n, data.n_samples, config.seed, config.measure.pairs)
    seeds = B.member_seeds(config.seed, n)
    y, pop_y = data.y.numpy()[:, None], data.pop_y.numpy()[:, None]
    names = ("scores", "pop", "train", "test_acc", "test_loss")
    out = {p: {k: [] for k in names} for p in ("fp32", "bf16")}
    dev = torch.device("cpu")
    for i in range(n):
        model = MB._build(config, data, int(seeds[i]))
        MB._fit_one(config, model, keep, i, data, int(seeds[i]), dev, False, None)
        for precision, into in out.items():
            amp = "off" if precision == "fp32" else "bf16"
            q = MB._query_one(config.replace(amp=amp), model, data, int(seeds[i]))
            into["scores"].append(attacks.lira_score_from_logits(q["logits"][0], y))
            into["pop"].append(attacks.lira_score_from_logits(q["pop_logits"][0], pop_y))
            if q["train_logits"] is not None:
                into["train"].append(attacks.lira_score_from_logits(q["train_logits"][0], y))
            into["test_acc"] += q["test_acc"]
            into["test_loss"] += q["test_loss"]
    return {"keep": keep, **{p: {k: np.stack(v) if v else None for k, v in d.items()}
                             for p, d in out.items()}}


def metrics(bank: dict, precision: str, train_mode: bool = False):
    """Leave-one-out metrics of every attack on the bank's ``precision`` scores (all samples;
    ``train_mode``: the train-mode queries', RMIA left out)."""
    got = bank[precision]
    if train_mode:
        loo = attacks.evaluate_leave_one_out(bank["keep"], got["train"], attacks=TRAIN_MODE)
    else:
        loo = attacks.evaluate_leave_one_out(bank["keep"], got["scores"], attacks=ATTACKS,
                                             population=got["pop"])
    m = loo.metrics
    return m[m.subset == "all"].set_index(["attack", "target"])[list(METRICS)].sort_index()


def _ci(values) -> list[float]:
    e = mean_ci(np.asarray(values, dtype=float))
    return [float(e.mean), float(e.lo), float(e.hi)]


def _diff_row(pairs, scale: float = 100.0, **labels) -> dict:
    """``pairs``: (fp32, bf16) arrays, one per bank. Their mean under fp32 and bf16 minus fp32
    with its t interval and largest size, times ``scale``."""
    fp32 = np.concatenate([a for a, _ in pairs]) * scale
    diff = np.concatenate([b - a for a, b in pairs]) * scale
    return {**labels, "fp32": float(fp32.mean()), "diff": _ci(diff),
            "largest": float(np.abs(diff).max())}


def measure(args) -> dict:
    torch.set_num_threads(args.threads or torch.get_num_threads())
    start = time.perf_counter()
    banks, score_diffs = {}, {"eval": [], "train": []}
    for config in bank_configs(args.rate, args.seeds, changes(args)):
        bank = query_both(config)
        got = {p: metrics(bank, p) for p in ("fp32", "bf16")}
        if config.model.norm == "bn":
            got["train"] = {p: metrics(bank, p, train_mode=True) for p in ("fp32", "bf16")}
        got["model"] = {k: (bank["fp32"][k], bank["bf16"][k]) for k in ("test_acc", "test_loss")}
        banks[(config.model.norm, config.seed)] = got
        for mode, key in (("eval", "scores"), ("train", "train")):
            if bank["fp32"][key] is not None:
                score_diffs[mode].append(np.abs(bank["bf16"][key] - bank["fp32"][key]))
        print(f"  {config.model.norm:4s} seed {config.seed}: mean |score bf16 - fp32| "
              f"{score_diffs['eval'][-1].mean():.4f} ({time.perf_counter() - start:.0f} s)",
              flush=True)
    rows = []
    for attack in ATTACKS:
        for metric in METRICS:
            row = _diff_row([(b["fp32"].loc[attack, metric].to_numpy(),
                              b["bf16"].loc[attack, metric].to_numpy()) for b in banks.values()],
                            attack=attack, metric=metric)
            effect = {p: [100 * (banks["bn", s][p].loc[attack, metric].mean()
                                 - banks["none", s][p].loc[attack, metric].mean())
                          for s in args.seeds] for p in ("fp32", "bf16")}
            rows.append(row | {"bn_minus_none": {p: _ci(v) if len(v) > 1 else [v[0]] * 3
                                                 for p, v in effect.items()}})
    bn = [b for (norm, _), b in banks.items() if norm == "bn"]
    train_rows = [_diff_row([(b["train"]["fp32"].loc[a, "auc"].to_numpy(),
                              b["train"]["bf16"].loc[a, "auc"].to_numpy()) for b in bn],
                            attack=a, metric="auc") for a in TRAIN_MODE]
    model_rows = [_diff_row([b["model"][k] for b in banks.values()], scale, quantity=k)
                  for k, scale in (("test_acc", 100.0), ("test_loss", 1.0))]
    return {"machine": {"cpu": platform.processor() or platform.machine(),
                        "torch": torch.__version__, "threads": torch.get_num_threads(),
                        "date": time.strftime("%Y-%m-%d"), "commit": args.commit,
                        "seconds": round(time.perf_counter() - start)},
            "setting": {"profile": "fmnist", "notebook": "04_lira", "rate": args.rate,
                        "seeds": args.seeds, "targets": sum(len(b["fp32"].loc[ATTACKS[0]])
                                                            for b in banks.values()),
                        **({"changes": changes(args)} if changes(args) else {})},
            "score_abs_diff": {mode: {"mean": float(np.mean([d.mean() for d in ds])),
                                      "largest": float(max(d.max() for d in ds))}
                               for mode, ds in score_diffs.items()},
            "rows": rows, "train_mode_rows": train_rows, "model_rows": model_rows}


def _ci_text(v) -> str:
    return f"{v[0]:+.3f} [{v[1]:+.3f}, {v[2]:+.3f}]"


def table(result: dict) -> str:
    """The saved run as the markdown tables benchmarks/README.md holds."""
    s, m, d = result["setting"], result["machine"], result["score_abs_diff"]
    changed = "".join(f", {k} = {v}" for k, v in s.get("changes", {}).items())
    arch = s.get("changes", {}).get("lira_archs", ["LeNet"])[0]
    head = (f"Fashion-MNIST {arch} banks of the `{s['profile']}` profile's notebook 04{changed}, "
            f"{s['rate']:.0%} OOD, BN and no norm, seeds {', '.join(map(str, s['seeds']))}: "
            f"{s['targets']} targets; torch {m['torch']} on {m['threads']} CPU threads, "
            f"{m['date']}, commit {m['commit']}, {m['seconds']} s. Mean |LiRA score bf16 - "
            f"fp32| per query {d['eval']['mean']:.3g} in eval mode (largest "
            f"{d['eval']['largest']:.3g}), {d['train']['mean']:.3g} in train mode (largest "
            f"{d['train']['largest']:.3g}). In points (AUC and TPR x 100), eval-mode queries:\n\n")
    lines = ["| attack | metric | fp32 | bf16 - fp32 [95% t, over targets] | largest |"
             " BN - none, fp32 | BN - none, bf16 |", "|" + " --- |" * 7]
    for r in result["rows"]:
        e = r["bn_minus_none"]
        lines.append(f"| {r['attack']} | {r['metric']} | {r['fp32']:.2f} | "
                     f"{_ci_text(r['diff'])} | {r['largest']:.2f} | {_ci_text(e['fp32'])} | "
                     f"{_ci_text(e['bf16'])} |")
    lines += ["", "Train-mode queries (the BN banks; points of AUC):", "",
              "| attack | fp32 | bf16 - fp32 [95% t, over targets] | largest |",
              "|" + " --- |" * 4]
    lines += [f"| {r['attack']} | {r['fp32']:.2f} | {_ci_text(r['diff'])} | "
              f"{r['largest']:.2f} |" for r in result["train_mode_rows"]]
    lines += ["", "Each model's test evaluation (accuracy in points, loss in nats):", "",
              "| quantity | fp32 | bf16 - fp32 [95% t, over models] | largest |",
              "|" + " --- |" * 4]
    lines += [f"| {r['quantity']} | {r['fp32']:.3f} | {_ci_text(r['diff'])} | "
              f"{r['largest']:.3g} |" for r in result["model_rows"]]
    return head + "\n".join(lines) + "\n"


def changes(args) -> dict:
    """The notebook parameters the command line changes from the fmnist profile's."""
    given = {"lira_archs": [args.arch] if args.arch else None, "lira_n_models": args.n_models,
             "lira_train_size": args.train_size, "lira_epochs": args.epochs}
    return {k: v for k, v in given.items() if v is not None}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=float, default=0.01, help="OOD outlier rate of the banks")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2],
                    help="replicate seeds (the fmnist profile's are 0 1 2)")
    ap.add_argument("--arch", help="another architecture (the profile's: lenet)")
    ap.add_argument("--n-models", type=int, help="models per bank (the profile's: 12)")
    ap.add_argument("--train-size", type=int, help="pool size (the profile's: 4,000)")
    ap.add_argument("--epochs", type=int, help="training epochs (the profile's: 8)")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: its default)")
    ap.add_argument("--json", type=Path, help="write the result here")
    ap.add_argument("--commit", default="", help="the commit measured (recorded in --json)")
    ap.add_argument("--table", type=Path, help="print the table of a saved --json and stop")
    args = ap.parse_args(argv)
    if args.table:
        print(table(json.loads(args.table.read_text())), end="")
        return
    result = measure(args)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    print(table(result), end="")


if __name__ == "__main__":
    main()
