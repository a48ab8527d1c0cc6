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
queried twice under the profile's query augmentations: plainly, and under
``torch.autocast("cpu", torch.bfloat16)`` (logits upcast to float32 after the last layer, as the
bank does). Every model is the target in turn (leave-one-out); for each attack, bf16's AUC and
TPR at 0.1% and 1% FPR are compared with float32's, target by target (mean difference, its 95%
Student t interval over the targets, the largest difference), and BN minus no norm (the
notebook's comparison, paired by replicate) under each. ``--table FILE`` prints a saved run's
table; benchmarks/README.md holds it, checked by tests/test_bench_query_precision.py.
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

ATTACKS = ("lira_online_fixed", "lira_online", "lira_offline_fixed", "global_threshold")
METRICS = ("auc", "tpr@0.1%", "tpr@1%")


def bank_configs(rate: float, seeds: list[int]) -> list:
    """The fmnist profile's notebook 04 banks at OOD rate ``rate`` (BN and no norm), one per
    replicate seed (seed 0 is the profile's first replicate)."""
    from bnmem_utils.analyses import leakage

    p = work.profile_parameters("fmnist") | {"lira_outlier_rates": [rate], "lira_replicates": 1}
    return [c for s in seeds for c in leakage.configs_from_params(p | {"seed": s})[0]]


def query_both(config) -> dict:
    """Train ``config``'s members in float32 one after another; each member's pool and
    population queried in float32 and under bf16 autocast: LiRA scores (N, M, Q) and (N, P, Q)."""
    data = MB.prepare_data(config, "cpu")
    n = config.measure.n_models
    keep = keep_matrix(n, data.n_samples, config.seed, config.measure.pairs)
    seeds = B.member_seeds(config.seed, n)
    y, pop_y = data.y.numpy()[:, None], data.pop_y.numpy()[:, None]
    out = {"fp32": ([], []), "bf16": ([], [])}
    dev = torch.device("cpu")
    for i in range(n):
        model = MB._build(config, data, int(seeds[i]))
        MB._fit_one(config, model, keep, i, data, int(seeds[i]), dev, False, None)
        model.eval()
        for precision, scores in out.items():
            with torch.autocast("cpu", torch.bfloat16, enabled=precision == "bf16"):
                for x, labels, into in ((data.x, y, scores[0]), (data.pop_x, pop_y, scores[1])):
                    logits = MB.query_logits(model, x, config.measure.queries, fill=data.fill,
                                             batch_size=config.measure.query_batch_size)
                    into.append(attacks.lira_score_from_logits(logits, labels))
    return {"keep": keep,
            **{p: (np.stack(s), np.stack(ps)) for p, (s, ps) in out.items()}}


def metrics(bank: dict, precision: str):
    """Leave-one-out metrics of every attack on the bank's ``precision`` scores (all samples)."""
    scores, pop = bank[precision]
    loo = attacks.evaluate_leave_one_out(bank["keep"], scores, attacks=ATTACKS, population=pop)
    m = loo.metrics
    return m[m.subset == "all"].set_index(["attack", "target"])[list(METRICS)].sort_index()


def _ci(values) -> list[float]:
    e = mean_ci(np.asarray(values, dtype=float))
    return [float(e.mean), float(e.lo), float(e.hi)]


def measure(args) -> dict:
    torch.set_num_threads(args.threads or torch.get_num_threads())
    start = time.perf_counter()
    banks = {}
    for config in bank_configs(args.rate, args.seeds):
        bank = query_both(config)
        banks[(config.model.norm, config.seed)] = {p: metrics(bank, p) for p in ("fp32", "bf16")}
        d = np.abs(bank["bf16"][0] - bank["fp32"][0])
        banks[(config.model.norm, config.seed)]["score"] = (float(d.mean()), float(d.max()))
        print(f"  {config.model.norm:4s} seed {config.seed}: mean |score bf16 - fp32| "
              f"{d.mean():.4f}, largest {d.max():.3f} ({time.perf_counter() - start:.0f} s)",
              flush=True)
    rows = []
    for attack in ATTACKS:
        for metric in METRICS:
            diff = np.concatenate([(b["bf16"].loc[attack, metric] - b["fp32"].loc[attack, metric])
                                   .to_numpy() for b in banks.values()]) * 100
            fp32 = np.concatenate([b["fp32"].loc[attack, metric].to_numpy()
                                   for b in banks.values()]) * 100
            effect = {p: [100 * (banks["bn", s][p].loc[attack, metric].mean()
                                 - banks["none", s][p].loc[attack, metric].mean())
                          for s in args.seeds] for p in ("fp32", "bf16")}
            rows.append({"attack": attack, "metric": metric, "fp32": float(fp32.mean()),
                         "diff": _ci(diff), "largest": float(np.abs(diff).max()),
                         "bn_minus_none": {p: _ci(v) if len(v) > 1 else [v[0]] * 3
                                           for p, v in effect.items()}})
    scores = [b["score"] for b in banks.values()]
    return {"machine": {"cpu": platform.processor() or platform.machine(),
                        "torch": torch.__version__, "threads": torch.get_num_threads(),
                        "date": time.strftime("%Y-%m-%d"), "commit": args.commit,
                        "seconds": round(time.perf_counter() - start)},
            "setting": {"profile": "fmnist", "notebook": "04_lira", "rate": args.rate,
                        "seeds": args.seeds, "targets": sum(len(b["fp32"].loc[ATTACKS[0]])
                                                            for b in banks.values())},
            "score_abs_diff": {"mean": float(np.mean([s[0] for s in scores])),
                               "largest": float(max(s[1] for s in scores))},
            "rows": rows}


def table(result: dict) -> str:
    """The saved run as the markdown table benchmarks/README.md holds."""
    s, m = result["setting"], result["machine"]
    head = (f"Fashion-MNIST LeNet banks of the `{s['profile']}` profile's notebook 04, "
            f"{s['rate']:.0%} OOD, BN and no norm, seeds {', '.join(map(str, s['seeds']))}: "
            f"{s['targets']} targets; torch {m['torch']} on {m['threads']} CPU threads, "
            f"{m['date']}, commit {m['commit']}, {m['seconds']} s. Mean |LiRA score bf16 - "
            f"fp32| per query {result['score_abs_diff']['mean']:.3g} (largest "
            f"{result['score_abs_diff']['largest']:.3g}). In points (AUC and TPR x 100):\n\n")
    lines = ["| attack | metric | fp32 | bf16 - fp32 [95% t, over targets] | largest |"
             " BN - none, fp32 | BN - none, bf16 |", "|" + " --- |" * 7]

    def ci(v):
        return f"{v[0]:+.3f} [{v[1]:+.3f}, {v[2]:+.3f}]"

    for r in result["rows"]:
        e = r["bn_minus_none"]
        lines.append(f"| {r['attack']} | {r['metric']} | {r['fp32']:.2f} | {ci(r['diff'])} | "
                     f"{r['largest']:.2f} | {ci(e['fp32'])} | {ci(e['bf16'])} |")
    return head + "\n".join(lines) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=float, default=0.01, help="OOD outlier rate of the banks")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2],
                    help="replicate seeds (the fmnist profile's are 0 1 2)")
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
