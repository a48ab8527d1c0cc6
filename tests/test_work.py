"""bnmem_utils.run.work: each notebook's training work under a profile, its projection on one
H200, and the blocks generated from it (the ``gpu`` and ``paper`` profile files, docs/ray.md).

A profile edited without ``python -m bnmem_utils.run.work --write gpu paper`` fails here: its
block no longer says what it trains. The counts are checked against hand counts of the
``smoke`` and ``quick`` profiles, a gradient-norm run's measured samples and BN batches
against what notebook 03's code measures, and the rates' FLOPs against FlopCounterMode.
"""

from __future__ import annotations

import json
import math
import re
import shutil

import pytest
import torch
import torch.nn.functional as F

from bnmem_utils.core.paths import project_root
from bnmem_utils.run import plan as runplan
from bnmem_utils.run import rates, work

ROOT = project_root()


def _sample_epochs(rows) -> float:
    return sum(r.sample_epochs for r in rows)


@pytest.mark.parametrize("profile", ["gpu", "paper"])
def test_the_profile_file_holds_its_generated_block(profile):
    text = runplan.available_profiles()[profile].read_text()
    assert text.count(work.BEGIN) == 1 and text.count(work.END) == 1
    block = text[text.index(work.BEGIN):text.index(work.END) + len(work.END)]
    assert block == work.projection_block(profile), (
        f"profiles/{profile}.yaml's block is stale: run "
        "`python -m bnmem_utils.run.work --write gpu paper` and commit it")


def test_gpu_fits_an_hour_and_paper_a_day_on_one_h200():
    for profile, limit in (("gpu", 3600), ("paper", 24 * 3600)):
        rows = [r for rows in work.training_work(profile).values() for r in rows]
        assert 0.5 * limit < work.projected_seconds(rows) <= limit, profile
        assert work.projected_seconds(rows, work.TARGET_RATES) < work.projected_seconds(rows)


def test_docs_ray_quotes_the_paper_profile_on_8_gpus():
    text = (ROOT / work.RAY_DOC).read_text()
    assert (f"<!-- projected:paper 8 -->{work.parallel_text('paper', 8)}<!-- /projected -->"
            in text)
    seconds, row, task = work.parallel_seconds("paper", 8)
    one = work.projected_seconds([r for rows in work.training_work("paper").values()
                                  for r in rows])
    assert one / 8 <= seconds < one and task <= seconds


def test_the_paper_profile_counts_its_replicate_banks():
    _, values = runplan.load_profile("paper")
    lira = {r: work.training_work({**values, "lira_replicates": r})["04_lira"] for r in (1, 3)}
    banks = {r: _sample_epochs(x for x in rows if "curve" not in x.label) for r, rows in lira.items()}
    assert banks[3] == pytest.approx(3 * banks[1])
    curve = [x for x in lira[3] if "curve" in x.label]
    assert [(x.runs, x.samples) for x in curve] == [(values["lira_curve_models"], 25_000)]
    # 04b's top rung is 04's 1% arm (one cache): counted in 04 only, as many ladders as 04 has
    # replicates; GroupNorm's and LayerNorm's top rungs are 04b's own
    top = [r for r in work.training_work(values)["04b_confound"] if r.epochs == max(values["cf_epochs"])]
    assert sum(r.runs for r in top) == 2 * values["cf_n_models"]


def test_smoke_work_matches_a_hand_count():
    """The smoke profile, counted by hand from its file and the notebooks' defaults."""
    w = work.training_work("smoke")
    assert w["01_theory"] == [] and w["06_report"] == []
    # 02: digits' 300 training images, MLP, BN and no norm, one 10% flip setting, 2 seeds, 2 epochs
    assert _sample_epochs(w["02_forced_memorization"]) == 2 * 2 * 2 * 300
    # 04: 2 norms x 3 outlier rates x 2 replicates of 4 models, 1 epoch, each on half its pool
    # (300 images plus 0, 3 and 15 OOD inserts); the curve's 8 models on half of the clean 300
    pools = (300 + 0) + (300 + 3) + (300 + 15)
    assert _sample_epochs(w["04_lira"]) == 2 * 2 * 4 * pools / 2 + 8 * 150
    # 05: BN lam 0, lam 1, no norm and GN on 2 selection seeds, BN and lam 1 again on 2
    # measurement seeds, 1 epoch on 200 images; banks of 4 for the same four arms, 2 replicates,
    # each model on 100
    assert _sample_epochs(w["05_mitigation"]) == 4 * 2 * 200 + 2 * 2 * 200 + 4 * 4 * 2 * 100
    assert {r.vectorised for r in w["04_lira"]} == {True}                 # LeNet banks
    assert {r.vectorised for r in w["02_forced_memorization"]} == {False}  # grid runs


def test_forward_images_count_queries_and_evaluation_by_hand():
    """A bank member reads its pool under every query in eval mode (and again in train mode
    with BN), the population under every query and the test split once; a grid or
    gradient-norm run its training set and test split after every epoch (a gradient-norm
    run's measured samples: :func:`test_per_sample_gradients_are_counted_by_hand`). The
    projection adds them at FORWARD_SPEEDUP times the training rate."""
    from bnmem_utils.analyses import leakage
    from bnmem_utils.jobs.config import RunConfig

    sizes = dict(dataset="digits", train_size=200, test_size=60)
    bank = dict(sizes, n_models=4, population_size=30, ood_rate=0.05)     # 10 OOD inserts
    queries = len(RunConfig.bank(**bank).measure.queries)                   # the digits': 5
    assert work.forward_images(RunConfig.bank(norm="bn", **bank)) == queries * (2 * 210 + 30) + 60
    assert work.forward_images(RunConfig.bank(norm="none", **bank)) == queries * (210 + 30) + 60
    assert work.forward_images(RunConfig.grid(epochs=3, **sizes)) == 3 * (200 + 60)
    assert work.evaluation_images(RunConfig.grid(epochs=3, **sizes)) == 3 * (200 + 60)
    assert work.evaluation_images(RunConfig.bank(norm="bn", **bank)) == 0
    row = work.WorkRow("x", "lenet", work.MNIST_SHAPE, runs=2, epochs=5, samples=100,
                       vectorised=False, forward=600)
    rates = {("lenet", work.MNIST_SHAPE, False): 10.0}
    assert work.projected_seconds([row], rates) == pytest.approx(
        (2 * 5 * 100 + 600 / work.FORWARD_SPEEDUP) / 10)
    assert work.projected_seconds([row], rates, forward=False) == pytest.approx(100)
    # smoke's 04: every bank and the curve's counted once, each member as above
    configs, curve = leakage.configs_from_params(work.profile_parameters("smoke"))
    counted = sum(r.forward for r in work.training_work("smoke")["04_lira"])
    assert counted == sum(c.measure.n_models * work.forward_images(c) for c in [*configs, curve])


def test_per_sample_gradients_are_counted_by_hand():
    """A gradient-norm run measures its capped clean and noisy samples at each measured epoch:
    their eval-mode losses and BN batches forward (train definition, BN only: every batch that
    holds one, at most the whole set), one image's gradient each (eval) and a backward of the
    whole batch per Jacobian row (train). The projection counts them at GRADIENT_COST; smoke's
    03 rows hold its runs' sums, and the run with the most as the peak."""
    from bnmem_utils.jobs import gradnorms
    from bnmem_utils.jobs.config import RunConfig

    # 200 digits, 20 flipped: min(50, 180) clean + min(10, 20) noisy = 60 measured, at 2 epochs;
    # batches of 32: 7 batches of at most 29 images (row_batch), all 7 hold a measured sample
    run = dict(dataset="digits", train_size=200, test_size=60, flip_rate=0.1, epochs=2,
               measure_epochs=[0, 2], max_clean=50, max_noisy=10, batch_size=32)
    bn, none = RunConfig.gradnorm(norm="bn", **run), RunConfig.gradnorm(norm="none", **run)
    assert work.forward_images(bn) == 2 * (200 + 60) + 2 * (60 + 200)
    assert work.forward_images(none) == 2 * (200 + 60) + 2 * 60
    assert work.evaluation_images(bn) == work.evaluation_images(none) == 2 * (200 + 60)
    assert work.row_batch(200, 32) == 29 and work.row_batch(256, 128) == 128
    assert work.gradient_work(bn) == (2 * 60, 2 * 60 * 29)
    assert work.gradient_work(none) == (2 * 60, 0)
    assert work.gradient_work(bn.replace(definitions=("eval",))) == (2 * 60, 0)
    assert work.gradient_work(bn.replace(definitions=("train",))) == (0, 2 * 60 * 29)
    assert work.gradient_work(none.replace(definitions=("train",))) == (2 * 60, 0)
    # 3 measured samples sit in at most 3 of the 7 batches (29 images each, at most)
    few = bn.replace(max_clean=2, max_noisy=1)
    assert work.forward_images(few) == 2 * (200 + 60) + 2 * (3 + 3 * 29)
    assert work.gradient_work(RunConfig.grid(dataset="digits")) == (0, 0)
    row = work.WorkRow("x", "lenet", work.MNIST_SHAPE, runs=2, epochs=5, samples=100,
                       vectorised=False, gradients=(100, 3000))
    cost = {"eval": work.Rate(2.0, ""), "train": work.Rate(0.5, "")}
    assert work.gradient_images(row, cost) == 100 * 2.0 + 3000 * 0.5
    rates = {("lenet", work.MNIST_SHAPE, False): 10.0}
    assert work.projected_seconds([row], rates, training=False, forward=False) == \
        pytest.approx(work.gradient_images(row) / 10)
    assert work.projected_seconds([row], rates, gradients=False) == pytest.approx(100)
    # smoke's 03: every run counted once, the BN run's as the peak
    configs = gradnorms.configs_from_params(work.profile_parameters("smoke"))
    rows = work.training_work("smoke")["03_gradient_norms"]
    assert [g for r in rows for g in r.gradients] == \
        [sum(work.gradient_work(c)[i] for c in configs) for i in (0, 1)]
    assert max(r.grad_peak for r in rows) == max(map(work.gradient_work, configs))
    assert max(r.grad_peak for r in rows)[1] > 0


def _measured_for_real(config, monkeypatch) -> dict:
    """What notebook 03's code reads and computes when it measures ``config``: the run trained
    and measured by ``gradnorms.train_and_measure`` on the data set as ``gradnorms.run`` loads
    it, with the images of its eval-mode losses, the samples of its eval-mode gradients and the
    BN batches ``per_sample._measured_batches`` yields it (each with its measured rows)
    recorded on their way."""
    from bnmem_utils.data.datasets import load_data
    from bnmem_utils.jobs import gradnorms
    from bnmem_utils.training import loop, per_sample

    seen = {"sizes": set(), "losses": 0, "eval": 0, "batches": []}
    grads, batches, logits = (gradnorms.per_sample_grad_norms, per_sample._measured_batches,
                              loop.predict_logits)

    def grad_norms(model, x, y, *, definition, index, **kw):
        seen["sizes"].add(x.shape[0])
        seen["eval"] += index.numel() * (definition == "eval")
        return grads(model, x, y, definition=definition, index=index, **kw)

    def measured_batches(pos, batch_size, shuffle_seed):
        for batch, rows in batches(pos, batch_size, shuffle_seed):
            seen["batches"].append((batch, rows))
            yield batch, rows

    def predict(model, x, **kw):
        seen["losses"] += x.shape[0]
        return logits(model, x, **kw)

    monkeypatch.setattr(gradnorms, "per_sample_grad_norms", grad_norms)
    monkeypatch.setattr(per_sample, "_measured_batches", measured_batches)
    monkeypatch.setattr(loop, "predict_logits", predict)
    dataset = load_data(config, "cpu")
    result = gradnorms.train_and_measure(config, dataset, torch.device("cpu"))
    (size,) = seen["sizes"]
    # every BN batch of the set, whether or not it holds a measured sample
    every = [len(b) for b, _ in batches(torch.zeros(size, dtype=torch.long),
                                        config.train.batch_size, 0)]
    return seen | {"size": size, "m": result.index.numel(), "epochs": len(result.epochs),
                   "test": len(dataset.y_test), "every": every}


@pytest.mark.parametrize("norm, train_size, flip, ood, max_clean, max_noisy, batch, defs", [
    ("bn", 200, 0.1, 0.05, 50, 10, 32, ("eval", "train")),      # both caps bind; 7 batches of 30
    ("bn", 150, 0.2, 0.0, None, None, 40, ("eval", "train")),   # no cap; batches of 38 and 37
    ("bn", 130, 0.05, 0.05, 2, 1, 64, ("train",)),              # 3 samples: not every batch
    ("bn", 100, 0.1, 0.02, 1000, 1000, 128, ("eval", "train")), # caps above the set; one batch
    ("bn", 90, 0.1, 0.1, 20, 5, 25, ("eval",)),                 # BN measured in eval mode only
    ("none", 120, 0.0, 0.1, 30, 100, 44, ("eval", "train")),    # no BN: 132 in 3 batches of 44
])
def test_the_measured_work_is_what_notebook_03_measures(monkeypatch, norm, train_size, flip, ood,
                                                        max_clean, max_noisy, batch, defs):
    """The projection's arithmetic against notebook 03's code on the corrupted digits: its
    measured samples, its corrupted set's size, its BN batches (row_batch the largest of them)
    and its eval-mode losses and gradients exactly; the images a train-mode measurement
    forwards (the batches that hold a measured sample) within what is counted, equal where
    every batch holds one at every measured epoch, and those it backpropagates (its whole batch
    per Jacobian row) within what is counted, equal where all batches are the same size."""
    from bnmem_utils.jobs.config import RunConfig

    config = RunConfig.gradnorm(dataset="digits", arch="mlp", norm=norm, train_size=train_size,
                                test_size=60, flip_rate=flip, ood_rate=ood, epochs=2,
                                measure_epochs=[0, 1, 2], definitions=defs,
                                max_clean=max_clean, max_noisy=max_noisy, batch_size=batch)
    real = _measured_for_real(config, monkeypatch)
    size, m, epochs = real["size"], real["m"], real["epochs"]
    assert work._measured(config) == (m, size, bool(real["batches"]))
    assert max(real["every"]) == work.row_batch(size, batch)
    assert len(real["every"]) == math.ceil(size / batch)
    # eval-mode gradients: exact; Jacobian rows: each a backward of its whole batch
    rows = sum(len(b) * len(r) for b, r in real["batches"])
    eval_grads, train_images = work.gradient_work(config)
    assert eval_grads == real["eval"] and rows <= train_images
    if len(set(real["every"])) == 1:
        assert rows == train_images
    # forward passes besides training's evaluation: eval-mode losses, then the BN batches
    assert real["losses"] == epochs * m
    counted = work.forward_images(config) - config.train.epochs * (size + real["test"])
    forwarded = real["losses"] + sum(len(b) for b, _ in real["batches"])
    assert forwarded <= counted
    if not real["batches"] or len(real["batches"]) == epochs * len(real["every"]):
        assert forwarded == counted


def test_the_forward_speedup_is_the_files_measurement_or_derived(tmp_path):
    """A rates file with part 2's ``forward_speedup`` sets the ratio the forward passes count
    at; one without gets 3, said to be derived; one that is no positive number is refused, by
    --adopt too."""
    doc = json.loads(work.RATES_FILE.read_text())
    doc.pop("forward_speedup", None)
    path = tmp_path / "rates.json"
    path.write_text(json.dumps(doc))
    derived = work.load_forward_speedup(path)
    assert derived.value == 3.0 and derived.source.startswith("derived")
    path.write_text(json.dumps(doc | {"forward_speedup": {"value": 4.5, "how": "part 2"}}))
    assert work.load_forward_speedup(path) == work.Rate(4.5, "measured (part 2)")
    for bad in ({"value": 0}, {"value": "4"}, {"value": True}, 4.5):
        path.write_text(json.dumps(doc | {"forward_speedup": bad}))
        with pytest.raises(ValueError, match="forward_speedup = .* is not a positive number"):
            work.load_forward_speedup(path)
    assert work.adopt(path, []) == 2


def test_each_networks_query_speedup_prices_its_own_forward_passes(tmp_path, monkeypatch):
    """A rate of one model after another that carries a ``forward_speedup`` (part 4: that
    network's queries) prices that network's forward images; every other row keeps the
    file-wide ratio. A ratio on a vectorised rate, or one that is no positive number, is
    refused, by --adopt too; the block lists a network's ratio beside its rate."""
    doc = json.loads(work.RATES_FILE.read_text())
    lenet = ("lenet", work.MNIST_SHAPE, False)
    entries = [e | ({"forward_speedup": 12.0, "queries": "part 4"}
                    if (e["arch"], tuple(e["shape"]), e["vectorised"]) == lenet else {})
               for e in doc["rates"]]
    path = tmp_path / "rates.json"
    path.write_text(json.dumps(doc | {"rates": entries}))
    own = work.load_query_speedups(path)
    assert own == {lenet: work.Rate(12.0, "measured (part 4)")}
    row = work.WorkRow("x", "lenet", work.MNIST_SHAPE, runs=1, epochs=1, samples=0,
                       vectorised=False, forward=1200.0)
    other = row._replace(arch="densenet")
    rates = {lenet: 10.0, ("densenet", work.MNIST_SHAPE, False): 10.0}
    assert work.projected_seconds([row], rates, speedups=own) == pytest.approx(1200 / 120)
    assert work.projected_seconds([other], rates, speedups=own) == \
        pytest.approx(1200 / (work.FORWARD_SPEEDUP * 10))
    assert work.projected_seconds([row], rates, speedups={}) == \
        pytest.approx(1200 / (work.FORWARD_SPEEDUP * 10))
    monkeypatch.setattr(work, "QUERY_SPEEDUPS", own)          # the default, as adopted
    assert work.projected_seconds([row], rates) == pytest.approx(10)
    block = " ".join(work.projection_lines("gpu"))
    assert "at each network's measured speed-up of queries over its training" in block
    assert re.search(r"lenet 1x28x28, one after another: +[\d,]+ +measured, queries 12x", block)
    for i, bad in ((0, {"forward_speedup": 0}), (0, {"forward_speedup": "4"}),
                   (next(i for i, e in enumerate(doc["rates"]) if e["vectorised"]),
                    {"forward_speedup": 4.0})):
        changed = [e | bad if j == i else e for j, e in enumerate(doc["rates"])]
        path.write_text(json.dumps(doc | {"rates": changed}))
        with pytest.raises(ValueError, match=rf"rates\[{i}\]"):
            work.load_query_speedups(path)
        assert work.adopt(path, []) == 2


def test_the_per_sample_cost_is_the_files_measurement_or_derived(tmp_path):
    """A rates file with part 2's ``per_sample_cost`` sets what 03's per-sample gradients count
    at, per definition; one without gets 1 (eval) and 2/3 (train), said to be derived; an entry
    that is no positive number is refused, by --adopt too."""
    doc = json.loads(work.RATES_FILE.read_text())
    doc.pop("per_sample_cost", None)
    path = tmp_path / "rates.json"
    path.write_text(json.dumps(doc))
    derived = work.load_gradient_cost(path)
    assert {d: r.value for d, r in derived.items()} == {"eval": 1.0, "train": 2 / 3}
    assert all(r.source.startswith("derived") for r in derived.values())
    measured = {"eval": {"value": 3.5, "how": "part 2"}}
    path.write_text(json.dumps(doc | {"per_sample_cost": measured}))
    cost = work.load_gradient_cost(path)
    assert cost["eval"] == work.Rate(3.5, "measured (part 2)") and cost["train"] == derived["train"]
    for bad in ({"train": {"value": -1}}, {"eval": 2.0}, [1, 2]):
        path.write_text(json.dumps(doc | {"per_sample_cost": bad}))
        with pytest.raises(ValueError, match="per_sample_cost.* is not a"):
            work.load_gradient_cost(path)
    assert work.adopt(path, []) == 2


def test_quick_confound_work_matches_a_hand_count():
    """quick's 04b: four norms on the ladder 1 to 32, BN and no norm as 3 ladders, GN and LN as
    one, N = 8; BN and no norm also at 32 epochs with weight decay 0.0005 and 0.002 (0, the
    ladder's own, is its top rung); the digits' 1,437 images and 14 OOD inserts, half each."""
    rows = work.training_work("quick")["04b_confound"]
    ladders = (2 * 3 + 2) * 8 * (1 + 2 + 4 + 8 + 16 + 32)
    knobs = 2 * 2 * 8 * 32
    assert _sample_epochs(rows) == (ladders + knobs) * (1437 + 14) / 2


def test_the_notebooks_build_what_is_counted_here():
    """Each training notebook builds its runs and banks with the function its builder here
    calls (one copy of the notebook's configs), from its parameters."""
    import nbformat

    calls = {"02_forced_memorization": "ex.configs_from_params(nb.params)",
             "03_gradient_norms": "G.configs_from_params(nb.params)",
             "04_lira": "banktables.configs_from_params(nb.params)",
             "04b_confound": "confound.arms_from_params(nb.params)",
             "05_mitigation": "mit.sweep_from_params(nb.params, chosen)"}
    assert set(calls) == {nb for nb, build in work.BUILDERS.items() if build}
    for nb, call in calls.items():
        cells = nbformat.read(ROOT / "notebooks" / f"{nb}.ipynb", as_version=4).cells
        assert call in "\n".join(c.source for c in cells if c.cell_type == "code"), nb


def test_rates_say_where_they_come_from():
    rates = work.RATES
    cifar, mnist = work.CIFAR_SHAPE, work.MNIST_SHAPE
    assert rates[("resnet18", cifar, False)].value == 8_986
    assert rates[("resnet18", cifar, True)].value == 565
    assert rates[("lenet", mnist, True)].value == pytest.approx(805_031, rel=1e-5)
    for key, rate in rates.items():
        measured = key in {("resnet18", cifar, False), ("resnet18", cifar, True),
                           ("lenet", mnist, True), ("lenet", mnist, False)}
        assert rate.source.startswith("measured" if measured else work.DERIVED), key
    # ResNet-20 from ResNet-18 by FLOPs per trained image; the target scales what derives from it
    assert rates[("resnet20", cifar, True)].value == pytest.approx(8_986 * 3.329 / 0.24399, rel=1e-4)
    target = work.TARGET_RATES
    assert target[("resnet20", cifar, True)].value / rates[("resnet20", cifar, True)].value == \
        pytest.approx(40_000 / 8_986)
    assert target[("lenet", cifar, False)] == rates[("lenet", cifar, False)]


@pytest.mark.parametrize("arch, shape", sorted(work.TRAIN_GFLOP))
def test_flops_per_trained_image_are_counted(arch, shape):
    from torch.utils.flop_counter import FlopCounterMode

    from bnmem_utils.models.nets import build_model

    torch.manual_seed(0)
    model = build_model(arch, "bn", in_channels=shape[0], num_classes=10, image_size=shape[-1])
    x, y = torch.randn(4, *shape), torch.randint(0, 10, (4,))
    with FlopCounterMode(display=False) as counter:
        F.cross_entropy(model(x), y).backward()
    assert counter.get_total_flops() / 4 / 1e9 == pytest.approx(work.TRAIN_GFLOP[(arch, shape)],
                                                                 rel=1e-4)


def test_write_inserts_the_block_and_the_paragraph(tmp_path, monkeypatch):
    folder = tmp_path / "profiles"
    folder.mkdir()
    text = runplan.available_profiles()["gpu"].read_text()
    bare = text[:text.index(work.BEGIN)] + text[text.index(work.END) + len(work.END) + 1:]
    (folder / "gpu.yaml").write_text(bare)
    (tmp_path / "docs").mkdir()
    (tmp_path / work.RAY_DOC).write_text("On 8: <!-- projected:gpu 8 -->old<!-- /projected -->.\n")
    monkeypatch.setenv("BNMEM_PROFILES", str(folder))
    assert len(work.write(["gpu"], root=tmp_path)) == 2
    assert (folder / "gpu.yaml").read_text() == text
    assert work.parallel_text("gpu", 8) in (tmp_path / work.RAY_DOC).read_text()
    assert work.write(["gpu"], root=tmp_path) == []                 # nothing left to rewrite
    shutil.rmtree(folder)


def _rates_file(tmp_path, **machine):
    doc = json.loads(work.RATES_FILE.read_text())
    doc["machine"] |= machine
    path = tmp_path / "rates.json"
    path.write_text(json.dumps(doc))
    return path, doc


def test_the_committed_rates_file_is_what_the_projections_use():
    machine, measured = work.load_rates()
    assert machine["device"] == "cuda" and not machine["tiny"]
    assert all(work.RATES[k] == r for k, r in measured.items())
    assert set(work.RATES) == {(a, s, v) for a, s in work.TRAIN_GFLOP for v in (False, True)}
    assert work.trainer_disagreements(work.RATES) == []     # GPU_TRAINER picks the faster


def test_a_trainer_rule_against_the_measured_rates_is_named():
    cifar = work.CIFAR_SHAPE
    rates = work.rate_table({**work.MEASURED,
                             ("resnet18", cifar, True): work.Rate(9e9, "measured (fake)")})
    (line,) = work.trainer_disagreements(rates)
    assert line.startswith("resnet18: GPU_TRAINER says sequential, but vectorised measured faster")


@pytest.mark.parametrize("change, words", [
    (dict(machine={"tiny": True}), "measured with --tiny; only a full-size run on a CUDA GPU gives"),
    (dict(machine={"device": "cpu"}), "measured on cpu; only"),
    (dict(rate={"arch": "vgg"}), "rates[0] = {'arch': 'vgg'"),
    (dict(rate={"rate": -1.0}), "is not a rate of a known architecture"),
    (dict(rate={"vectorised": "yes"}), "a trainer (vectorised: true or false)"),
])
def test_a_rates_file_that_is_no_measurement_is_refused(tmp_path, change, words):
    path, doc = _rates_file(tmp_path, **change.get("machine", {}))
    doc["rates"][0] |= change.get("rate", {})
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError) as err:
        work.load_rates(path)
    assert str(path) in str(err.value) and words in str(err.value)


def test_a_rate_measured_twice_is_refused(tmp_path):
    path, doc = _rates_file(tmp_path)
    doc["rates"].append(doc["rates"][0])
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=r"rates\[4\] measures resnet18 3x32x32, one after "
                                         "another a second time"):
        work.load_rates(path)


def test_a_rates_file_without_the_rate_it_derives_from_is_refused(tmp_path):
    path, doc = _rates_file(tmp_path)
    doc["rates"] = [e for e in doc["rates"] if e["arch"] != "resnet18"]
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="no measured rate for resnet18 3x32x32, one after another"):
        work.rate_table(work.load_rates(path)[1])
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ValueError, match="not a rates file of benchmarks/gpu_smoke.py --json"):
        work.load_rates(tmp_path / "bad.json")


def test_adopt_copies_a_measurement_then_rewrites_the_profiles(tmp_path, monkeypatch, capsys):
    import subprocess

    calls = []
    monkeypatch.setattr(subprocess, "call", lambda argv: calls.append(argv) or 0)
    new, doc = _rates_file(tmp_path, card="NVIDIA H100 80GB HBM3", short="one H100")
    bad = tmp_path / "tiny.json"
    bad.write_text(json.dumps({**doc, "machine": {**doc["machine"], "tiny": True}}))
    target = tmp_path / "gpu_rates.json"
    monkeypatch.setattr(work, "RATES_FILE", target)
    assert work.main(["--adopt", str(new), "gpu"]) == 0
    assert json.loads(target.read_text()) == doc
    assert calls[0][-3:] == ["bnmem_utils.run.work", "--write", "gpu"]
    assert "adopted" in capsys.readouterr().out
    # a run without part 2 (no forward_speedup) keeps the committed measurement of it
    older = {**doc["machine"], "date": "2000-01-01"}      # an earlier measurement than new's
    target.write_text(json.dumps(doc | {"machine": older,
                                        "forward_speedup": {"value": 4.5, "how": "part 2"}}))
    assert work.main(["--adopt", str(new), "gpu"]) == 0
    assert json.loads(target.read_text())["forward_speedup"] == {"value": 4.5, "how": "part 2"}
    assert "4.5x the training rate, kept: measured (part 2)" in capsys.readouterr().out
    cost = {"eval": {"value": 3.0, "how": "part 2"}, "train": {"value": 0.9, "how": "part 2"}}
    target.write_text(json.dumps(doc | {"machine": older, "per_sample_cost": cost}))
    assert work.main(["--adopt", str(new), "gpu"]) == 0
    assert json.loads(target.read_text())["per_sample_cost"] == cost
    assert "3 and 0.9 (eval, train), kept: measured (part 2)" in capsys.readouterr().out
    target.unlink()
    assert work.main(["--adopt", str(bad)]) == 2 and not target.exists()
    assert capsys.readouterr().err.startswith("--adopt: ")


def test_adopt_merges_the_files_of_one_cards_split_calls(tmp_path, monkeypatch, capsys):
    """``--adopt step.json --adopt rates.json`` (gpu_smoke.sh --parts 2, then --parts 1,3,4):
    the rates of both, each ratio from the file that measured it, both commands in the
    machine's words. Refused in one line, the committed file untouched: two cards, a ratio
    measured twice, a rate measured twice (both files named)."""
    import subprocess

    monkeypatch.setattr(subprocess, "call", lambda argv: 0)
    rates, doc = _rates_file(tmp_path, card="NVIDIA H100 80GB HBM3", short="one H100",
                             command="benchmarks/gpu_smoke.sh --parts 1,3,4")
    cost = {"eval": {"value": 3.0, "how": "part 2"}, "train": {"value": 0.9, "how": "part 2"}}
    step = tmp_path / "step.json"
    step_doc = {**doc, "machine": doc["machine"] | {"command": "benchmarks/gpu_smoke.sh --parts 2"},
                "rates": [], "forward_speedup": {"value": 4.5, "how": "part 2"},
                "per_sample_cost": cost}
    step.write_text(json.dumps(step_doc))
    target = tmp_path / "gpu_rates.json"
    target.write_text("{}")
    monkeypatch.setattr(work, "RATES_FILE", target)
    assert work.main(["--adopt", str(step), "--adopt", str(rates), "gpu"]) == 0
    merged = json.loads(target.read_text())
    assert merged["rates"] == doc["rates"] and merged["per_sample_cost"] == cost
    assert merged["forward_speedup"] == {"value": 4.5, "how": "part 2"}
    assert merged["machine"]["command"] == ("benchmarks/gpu_smoke.sh --parts 2 and "
                                            "benchmarks/gpu_smoke.sh --parts 1,3,4")
    machine, measured = work.load_rates(target)
    assert measured.keys() == work.load_rates(rates)[1].keys()
    assert f"adopted {step} + {rates} as {target}" in capsys.readouterr().out
    other = tmp_path / "h200.json"
    other.write_text(json.dumps({**step_doc, "machine": doc["machine"] | {"card": "NVIDIA H200"}}))
    twice = tmp_path / "twice.json"
    twice.write_text(json.dumps(step_doc | {"rates": doc["rates"][:1]}))
    for files, words in (((other, rates), "measured on NVIDIA H100 80GB HBM3 and NVIDIA H200"),
                         ((step, step), "forward_speedup is measured in more than one of them"),
                         ((twice, rates), re.escape(f"{twice} + {rates}: rates[") + r"\d\] measures .* a second")):
        before = target.read_text()
        assert work.main([a for f in files for a in ("--adopt", str(f))]) == 2
        err = capsys.readouterr().err
        assert re.match(f"--adopt: .*{words}", err) and err.count("\n") == 1
        assert target.read_text() == before


def _outside(tmp_path, change) -> tuple:
    """A copy of the committed rates file changed by ``change`` (a function of its text), and
    the key its refusal names."""
    text = work.RATES_FILE.read_text()
    path = tmp_path / "outside.json"
    path.write_text(change(text))
    return path


OUTSIDE = {
    "rates[0].rate": lambda t: t.replace('"rate": 8986.0', '"rate": Infinity'),
    "rates[1].rate": lambda t: t.replace('"rate": 565.0', '"rate": true'),
    "forward_speedup.value": lambda t: t.replace('"rates": [', '"forward_speedup": {"value": '
                                                 'Infinity, "how": "x"}, "rates": ['),
    '"pad"': lambda t: t.replace('"rates": [', '"pad": "x", "rates": ['),
    "bytes": lambda t: t.replace('"rates": [', f'"pad": "{"x" * (2 * rates.MAX_BYTES)}", '
                                               '"rates": ['),
    "machine.card": lambda t: t.replace('"NVIDIA H200"', f'"{"H" * 100_000}"'),
    "rates[2].shape": lambda t: t.replace('[1, 28, 28], "vectorised": true',
                                          '[true, 28, 28], "vectorised": true'),
    "rates[0].rate ": lambda t: t.replace('"rate": 8986.0', '"rate": 1' + "0" * 400),
}


@pytest.mark.parametrize("key", OUTSIDE)
def test_adopt_refuses_what_a_rates_file_from_outside_may_not_hold(tmp_path, monkeypatch, capsys,
                                                                    key):
    """A rates file comes from outside: a rate or ratio that is not a finite number above 0 (an
    infinity, a bool, an int too large for a float), an unknown key, a file of more than
    MAX_BYTES, a string too long to write into the profiles and a shape of bools are each
    refused in one line naming the file and the key, exit status 2, nothing written."""
    import subprocess

    calls = []
    monkeypatch.setattr(subprocess, "call", lambda argv: calls.append(argv) or 0)
    target = tmp_path / "gpu_rates.json"
    target.write_text(work.RATES_FILE.read_text())
    monkeypatch.setattr(work, "RATES_FILE", target)
    path = _outside(tmp_path, OUTSIDE[key])
    assert work.main(["--adopt", str(path), "gpu", "paper"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"--adopt: {path}: ") and err.count("\n") == 1, err[:300]
    assert key.strip() in err and len(err) < 400 and ("valid" in err or "not read" in err), err
    assert target.read_text() == work.RATES_FILE.read_text() and calls == []


def test_adopting_what_the_rates_file_holds_writes_nothing(tmp_path, monkeypatch, capsys):
    """An exact copy of the committed rates file changes nothing: the file keeps its bytes and
    the profiles are not rewritten."""
    import subprocess

    calls = []
    monkeypatch.setattr(subprocess, "call", lambda argv: calls.append(argv) or 0)
    text = work.RATES_FILE.read_text()
    target, copy = tmp_path / "gpu_rates.json", tmp_path / "copy.json"
    target.write_text(text)
    copy.write_text(text)
    monkeypatch.setattr(work, "RATES_FILE", target)
    assert work.main(["--adopt", str(copy), "gpu"]) == 0
    assert target.read_text() == text and calls == []
    assert "nothing written" in capsys.readouterr().out


def test_adopt_takes_a_benchmark_file_without_its_figures(tmp_path, monkeypatch):
    """What benchmarks/gpu_smoke.py --json writes besides the rates (its ``about``, the
    machine's budget, each part's figures) is taken as input; the figures stay out of the
    committed file, whose ``about`` says what it is."""
    import subprocess

    monkeypatch.setattr(subprocess, "call", lambda argv: 0)
    new, doc = _rates_file(tmp_path, budget_s=255.0)
    new.write_text(json.dumps(doc | {"about": "benchmarks/gpu_smoke.py --json: " + "x" * 300,
                                     "parts": {"lenet_bank": {"error": "y" * 5000}}}))
    target = tmp_path / "gpu_rates.json"
    monkeypatch.setattr(work, "RATES_FILE", target)
    assert work.main(["--adopt", str(new), "gpu"]) == 0
    written = json.loads(target.read_text())
    assert "parts" not in written and written["about"] == rates.ABOUT
    assert written["machine"]["budget_s"] == 255.0 and written["rates"] == doc["rates"]
