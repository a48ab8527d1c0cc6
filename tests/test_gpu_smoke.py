"""benchmarks/gpu_smoke.py: the rates its projection of the gpu and paper profiles uses, and its
--tiny run on the CPU.

The --tiny run trains for about 40 s on 2 CPU cores, so it is marked slow; the bookkeeping test
is instant.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def _smoke():
    spec = importlib.util.spec_from_file_location("gpu_smoke", ROOT / "benchmarks" / "gpu_smoke.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gpu_smoke"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_projection_rates_come_from_the_parts_or_the_table_labelled(monkeypatch, tmp_path):
    """Part 4 without --measure-rates: parts 1 and 3's rates where they measured, the RATES
    table's for every other key the gpu and paper profiles train, each labelled."""
    from bnmem_utils.run import work

    monkeypatch.chdir(tmp_path)                      # the profiles are found from anywhere
    smoke = _smoke()
    args = argparse.Namespace(
        models=64, epochs=10, samples=60_000, bank_batch=128, bank_steps=40, measure_rates=False)
    b = {"vec_s": 47.7, "seq_s": 47.7 * 23.1}
    here = smoke.part_rates(args, b, {"resnet20": {"vec": 1e5, "seq": 3e4}})   # as main() does
    queried = {}
    smoke.rates_part(args, torch.device("cpu"), here, {}, queried)   # --no-measure-rates:
    assert queried == {}                                             # measures nothing
    rates = smoke.labelled_rates(here)
    keys = {(r.arch, r.shape, r.vectorised) for name in ("gpu", "paper")
            for rows in work.training_work(name).values() for r in rows}
    assert keys <= set(rates)
    lenet = rates[("lenet", work.MNIST_SHAPE, False)]                  # 02's runs, from part 1
    assert lenet.value == pytest.approx(work.MEASURED[("lenet", work.MNIST_SHAPE, False)].value)
    assert lenet.source.startswith("measured here")
    assert rates[("resnet20", work.CIFAR_SHAPE, True)].value == 1e5
    r18 = rates[("resnet18", work.CIFAR_SHAPE, False)]
    assert r18.value == work.RATES[("resnet18", work.CIFAR_SHAPE, False)].value
    assert r18.source.startswith("from RATES")


def test_part_4_gives_each_network_its_queries_speedup_against_this_calls_rate(tmp_path):
    """Part 4's queries of one model (``queried``) over the rate of one model after another
    measured in the same call: a network's own forward speed-up, written beside its rate in
    --json, which bnmem_utils.run.work reads back. None against a rate from the RATES table
    (another machine's) or a vectorised rate (K models query stacked)."""
    import json

    from bnmem_utils.run import work

    smoke = _smoke()
    lenet, dense = ("lenet", work.MNIST_SHAPE, False), ("densenet", work.CIFAR_SHAPE, False)
    r20 = ("resnet20", work.CIFAR_SHAPE, True)
    rates = {lenet: work.Rate(30_000.0, "measured here (part 1, extrapolated)"),
             dense: work.Rate(2_000.0, "from RATES (one H200, 2026-12-04): derived from FLOPs"),
             r20: work.Rate(1e5, "measured here (part 3)")}
    queried = {k[:2]: (v, "part 4: q") for k, v in ((lenet, 3e5), (dense, 9e3), (r20, 5e4))}
    speedups = smoke.query_speedups(rates, queried)
    assert speedups == {lenet: work.Rate(10.0, "measured here (part 4: q)")}
    path = tmp_path / "rates.json"
    about = {"card": "NVIDIA H100", "short": "one H100", "device": "cuda", "tiny": False}
    smoke.write_json(str(path), about, rates, {}, quiet=True, speedups=speedups)
    entries = {e["arch"]: e for e in json.loads(path.read_text())["rates"]}
    assert entries["lenet"] | {"rate": 0} == {
        "arch": "lenet", "shape": [1, 28, 28], "vectorised": False, "rate": 0,
        "how": "part 1, extrapolated", "forward_speedup": 10.0, "queries": "part 4: q"}
    assert "forward_speedup" not in entries["resnet20"] and "densenet" not in entries
    assert work.load_query_speedups(path) == {lenet: work.Rate(10.0, "measured (part 4: q)")}


def test_a_network_whose_queries_fail_keeps_the_file_wide_ratio_and_the_others_go_on(
        monkeypatch, capsys):
    """Part 4: a network's queries that fail (an out-of-memory error) are one line and that
    network gets no ratio of its own; every other network's queries are still timed."""
    smoke = _smoke()
    import gpu_step  # beside gpu_smoke, on the path once that is loaded

    def query_rate(arch, shape, dev, n):
        if arch == "densenet":
            raise torch.cuda.OutOfMemoryError("CUDA out of memory.\nmore")
        return {"img_s": 1e4, "images": 100, "precision": "bf16"}

    monkeypatch.setattr(gpu_step, "query_rate", query_rate)
    args = argparse.Namespace(bank_batch=128, bank_steps=40, measure_rates=True)
    here = {k: (1e3, "part 3") for k in smoke.projected_keys()}   # every rate measured already
    out, queried = {}, {}
    smoke.rates_part(args, torch.device("cpu"), here, out, queried)
    seq = {k[:2] for k in smoke.projected_keys() if not k[2]}
    assert set(queried) == {k for k in seq if k[0] != "densenet"} and queried
    assert out["queries"]["densenet 3x32x32, one after another"] == {
        "error": "OutOfMemoryError: CUDA out of memory."}
    assert "[4] queries of densenet (3, 32, 32): OutOfMemoryError" in capsys.readouterr().out


# What the GPU machines' image holds (a PyTorch image with no registry to install from), as
# import names: the benchmark must run on it with nothing carried. The standard library is
# allowed too. Not in it: jupyterlab, papermill, nbconvert, nbformat, ipywidgets, ipykernel, ray.
GPU_IMAGE = frozenset("""
    torch torchgen torchvision torchaudio triton numpy pandas scipy sklearn joblib threadpoolctl
    yaml tqdm matplotlib seaborn mpl_toolkits PIL contourpy cycler fontTools kiwisolver pyparsing
    dateutil six packaging filelock fsspec jinja2 markupsafe networkx sympy mpmath psutil
    typing_extensions cloudpickle narwhals charset_normalizer requests urllib3 idna certifi
    pytest cuda nvidia pynvml pkg_resources setuptools colorama cython Cython pyarrow rich tabulate
    opt_einsum
    """.split())

# Installed before the benchmark's first import: a top-level package outside GPU_IMAGE (and
# outside the checkout's own modules) cannot be imported, as on the GPU machine.
_IMAGE_GUARD = """\
import importlib.util
import sys
ALLOWED = set({allowed!r}) | set(sys.stdlib_module_names)
LOCAL = {{"bnmem_utils", "gpu_smoke", "gpu_step", "timebox", "bench_roofline", "sitecustomize"}}
def outside(name):
    top = name.partition(".")[0]
    return bool(top) and top not in ALLOWED and top not in LOCAL and not top.startswith("_")
class NotInImage:
    def find_spec(self, name, path=None, target=None):
        if outside(name):
            raise ModuleNotFoundError(f"{{name!r}} is not in the GPU machines' image", name=name)
find_spec = importlib.util.find_spec
importlib.util.find_spec = lambda name, package=None: (      # a probe finds it missing
    None if outside(name) else find_spec(name, package))
sys.meta_path.insert(0, NotInImage())
print("GPU image guard: on", file=sys.stderr)
"""


@pytest.mark.slow
def test_tiny_run_passes_on_the_cpu_with_only_the_gpu_images_packages(tmp_path):
    """benchmarks/gpu_smoke.sh, as it runs on a GPU machine: only the packages of that machine's
    image importable (no Jupyter, papermill or Ray). Every part runs and prints; its --json holds
    a rate for every key the gpu and paper profiles train, which bnmem_utils.run.work refuses to
    project from (a --tiny CPU run) until the file says it is a full-size CUDA run."""
    import json
    import os
    import subprocess

    from bnmem_utils.run import work

    guard = tmp_path / "guard"
    guard.mkdir()
    (guard / "sitecustomize.py").write_text(_IMAGE_GUARD.format(allowed=sorted(GPU_IMAGE)))
    path = tmp_path / "rates.json"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env |= {"PYTHON": sys.executable, "PYTHONPATH": str(guard)}
    done = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu_smoke.sh"), "--tiny", "--device", "cpu",
         "--json", str(path), "--commit", "abc1234"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    out = done.stdout
    assert done.returncode == 0, done.stderr[-3000:]
    assert "GPU image guard: on" in done.stderr                   # the run was guarded
    assert "not in the GPU machines' image" not in out + done.stderr
    for part in ("[1]", "[2]", "[3]", "[4]", "profile gpu:", "profile paper:", "all notebooks:",
                 "total wall time", "bare step, fp32", "bank member", "of the bare fp32 step",
                 "no bf16 peak known", "resnet18", "densenet", "rule: sequential",
                 "its queries as a bank makes them", "with its queries:",
                 "per-sample gradients (notebook 03, float32, ResNet-18 BN)",
                 "sample-epochs/s, queries "):
        assert part in out
    with pytest.raises(ValueError, match="measured with --tiny on cpu; only a full-size run on a CUDA GPU"):
        work.load_rates(path)
    doc = json.loads(path.read_text())
    assert doc["machine"]["commit"] == "abc1234" and "--tiny" in doc["machine"]["command"]
    assert doc["parts"]["trainers"]["resnet18"]["seq"] > 0
    doc["machine"] |= {"device": "cuda", "tiny": False}
    path.write_text(json.dumps(doc))
    machine, measured = work.load_rates(path)
    from bnmem_utils.run.rates import read_outside
    assert read_outside(path) == doc                 # what --adopt takes from outside
    keys = {(r.arch, r.shape, r.vectorised) for name in ("gpu", "paper")
            for rows in work.training_work(name).values() for r in rows}
    assert keys <= set(measured)
    assert all(r.source.startswith("measured (one ") and "commit abc1234" in r.source
               for r in measured.values())
    speedup = work.load_forward_speedup(path)        # part 2's queries against its training
    assert speedup.value > 0 and speedup.source.startswith("measured (ResNet-18")
    cost = work.load_gradient_cost(path)              # part 2's per-sample gradients
    assert all(r.value > 0 and r.source.startswith("measured (ResNet-18 BN") for r in cost.values())
    own = work.load_query_speedups(path)              # part 4's queries, network by network
    assert set(own) == {k for k in keys if not k[2]}
    assert all(r.value > 0 and "one model's queries" in r.source for r in own.values())


def test_the_image_guard_refuses_a_package_outside_the_image(tmp_path):
    """The guard of the test above works: Jupyter's nbformat (installed here) cannot be
    imported under it, numpy can."""
    import os
    import subprocess

    guard = tmp_path / "guard"
    guard.mkdir()
    (guard / "sitecustomize.py").write_text(_IMAGE_GUARD.format(allowed=sorted(GPU_IMAGE)))
    env = {**os.environ, "PYTHONPATH": str(guard)}
    code = "import numpy\ntry:\n    import nbformat\nexcept ImportError as e:\n    print(e)"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.stdout.strip() == "'nbformat' is not in the GPU machines' image", done.stderr


def _fake_trainers(args, dev, out):
    """Part 3 at once: ResNet-20's two rates only."""
    out["resnet20"] = {"k": 2, "vec_steps": 2, "vec": 1e5, "seq": 3e4}


def test_a_failing_part_is_reported_in_one_line_and_the_others_still_run(capsys, tmp_path,
                                                                        monkeypatch):
    """A part that raises (an out-of-memory error on the GPU) is one line of the output and an
    "error" in the JSON; the parts after it still run, and --json still holds their rates."""
    import json

    smoke = _smoke()

    def broken(*_args, **_kw):
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB\nthe allocator's notes")

    monkeypatch.setattr(smoke, "bank_part", broken)
    monkeypatch.setattr(smoke, "trainers_part", _fake_trainers)
    path = tmp_path / "rates.json"
    smoke.main(["--tiny", "--device", "cpu", "--skip-resnet", "--no-measure-rates",
                "--json", str(path), "--commit", "abc1234"])
    out = capsys.readouterr().out
    assert "[1] FAILED: RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB\n" in out
    assert "allocator's notes" not in out
    assert "vectorised   not measured" in out and "resnet18      2 at once" not in out
    assert "resnet18" in out and "not measured" in out and "profile paper:" in out
    assert "NOT complete: lenet_bank: RuntimeError" in out
    doc = json.loads(path.read_text())
    assert doc["parts"]["lenet_bank"] == {
        "error": "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB"}
    assert {(r["arch"], r["vectorised"]) for r in doc["rates"]} == {("resnet20", True),
                                                                   ("resnet20", False)}


def test_the_budget_stops_a_part_keeps_what_it_measured_and_says_so(capsys, tmp_path,
                                                                    monkeypatch):
    """--budget: a part still measuring at the end of its share is stopped (what it measured
    before stays, in the output and the JSON), a part whose time is spent is skipped, and the
    run ends, its JSON written."""
    import json
    import time

    smoke = _smoke()

    def slow_bank(args, dev, out):
        out.update(vec_s=2.0, finite=True, first_loss=2.3, last_loss=0.5)
        time.sleep(60)                                           # the sequential baseline

    monkeypatch.setattr(smoke, "bank_part", slow_bank)
    monkeypatch.setattr(smoke, "trainers_part", _fake_trainers)
    path = tmp_path / "rates.json"
    t0 = time.perf_counter()
    smoke.main(["--tiny", "--device", "cpu", "--skip-resnet", "--no-measure-rates",
                "--budget", "2", "--json", str(path), "--commit", "abc1234"])
    assert time.perf_counter() - t0 < 30
    out = capsys.readouterr().out
    assert "[1] stopped: its time (until 1 s of the --budget of 2 s) was spent" in out
    assert "vectorised        2.0 s" in out and "sequential   not measured" in out
    assert "NOT complete: lenet_bank: stopped" in out
    doc = json.loads(path.read_text())
    assert doc["parts"]["lenet_bank"]["vec_s"] == 2.0 and "seq_s" not in doc["parts"]["lenet_bank"]
    measured = {(r["arch"], r["vectorised"]): r["how"] for r in doc["rates"]}
    assert measured[("lenet", True)] == "part 1" and ("lenet", False) not in measured
    done = []
    skipped = smoke.run_part("[9]", done.append, smoke.Clock(time.perf_counter() - 1, "its time"),
                             {}, torch.device("cpu"))
    assert skipped == {"skipped": "not run: its time was spent"} and not done


def test_part_2_prints_what_it_measured_on_a_gpu_and_names_what_it_did_not(capsys):
    """Part 2's output on a CUDA device with some settings not measured (stopped by the budget,
    or failed): each missing one named, no ratio against a bare step that was not measured."""
    smoke = _smoke()
    r = {"gflop": 3.33, "peak": ("H100", 989e12),
         "fp32": {"img_s": 10_000.0, "seconds": 1.0, "compile_s": 0.1},
         "members": [{"img_s": 9_000.0, "bare": "bf16 compiled", "mode": "default", "syncs": 3,
                      "steps": 30, "compile_s": 50.0, "graphs": 0, "members": 2}]}
    args = argparse.Namespace(resnet_batch=512, step_steps=30, step_warm=5, compile=True)
    smoke.print_step_part(args, torch.device("cuda"), r)
    out = capsys.readouterr().out
    assert "bare step, bf16 autocast, channels-last, eager" in out
    for name in ("bf16 autocast, channels-last, eager", "step function compiled",
                 "(CUDA graphs)"):
        assert [line for line in out.splitlines() if name in line][0].endswith("not measured")
    assert "(the bare bf16 compiled step not measured: no ratio)" in out
    assert "bank members, compile 'reduce-overhead': not measured" in out
    assert "the bank's first member 50.0 s (its compilation, once a bank), then 0 more" in out
    assert "best bare step 10,000 img/s = 3.4% of the H100's dense bf16 peak" in out
    assert "per-sample gradients (notebook 03): not measured" in out
    r["bf16 compiled"] = {"img_s": 5_000.0, "seconds": 1.0, "compile_s": 40.0, "graphs": 1}
    smoke.print_step_part(args, torch.device("cuda"), r)
    line = [x for x in capsys.readouterr().out.splitlines() if "step function compiled" in x][0]
    assert line.endswith("(compilation and warm-up 40.0 s, apart; 1 graph(s) compiled in the "
                         "timed steps: NOT steady state, more --step-warm)")


def test_tiny_sizes_give_way_to_an_option_given():
    """--tiny sets each size's default; an option given on the command line keeps its value."""
    smoke = _smoke()
    tiny = smoke.parse(["--tiny"])
    assert (tiny.step_warm, tiny.bank_models, tiny.budget) == (2, 2, 0.0)
    given = smoke.parse(["--tiny", "--step-warm", "3", "--bank-models", "4"])
    assert (given.step_warm, given.bank_models, given.resnet_batch) == (3, 4, 16)
    full = smoke.parse([])
    assert (full.step_warm, full.bank_models, full.budget) == (5, 0, 255.0)


def test_part_2_prices_queries_and_per_sample_gradients_at_the_projections_rate(capsys):
    """Part 2's forward speed-up and per-sample gradient costs are in trained images' time at
    its ``rate`` (ResNet-18 one model after another at --bank-batch, what the projections
    divide by), not at its bank members' (another batch, compiled): eval seconds x rate per
    sample; train the same per image of a row's batch, less the batches' forward timed at the
    queries' rate. Without a rate, or a failed measurement, no cost and one line saying why."""
    from bnmem_utils.run import work

    smoke = _smoke()
    grads = {"eval": 0.5, "train": 2.0, "measured": 256, "batch": 128, "n": 4000,
             "forward": 4000}
    member = {"img_s": 30_000.0, "mode": "default",               # batch 512, compiled
              "queries": {"images": 8000, "bank": 0.2, "precision": "bf16"}}   # 40,000 img/s
    r = {"grads": grads, "members": [member], "rate": {"img_s": 9_000.0, "how": "part 3"}}
    assert smoke.forward_speedup({"resnet18_step": r})["value"] == pytest.approx(40_000 / 9000)
    cost = smoke.per_sample_cost({"resnet18_step": r})
    assert cost["eval"]["value"] == pytest.approx(0.5 * 9000 / 256)
    rows = 256 * work.row_batch(4000, 128)                        # 125 images a batch
    assert cost["train"]["value"] == pytest.approx((2.0 - 4000 / 40_000) * 9000 / rows)
    assert "(part 3)" in cost["eval"]["how"]
    # no queries timed: the batches' forward at the forward speed-up in use
    alone = {**r, "members": [member | {"queries": None}]}
    assert smoke.per_sample_cost({"resnet18_step": alone})["train"]["value"] == pytest.approx(
        (2.0 - 4000 / (work.FORWARD_SPEEDUP * 9000)) * 9000 / rows)
    failed = {**r, "rate": {"error": "OutOfMemoryError: CUDA out of memory"}}
    assert smoke.per_sample_cost({"resnet18_step": failed}) is None
    assert smoke.forward_speedup({"resnet18_step": failed}) is None
    smoke.print_grads(r)
    smoke.print_grads(failed)
    smoke.print_grads({**r, "grads": {"error": "RuntimeError: vmap"}})
    out = capsys.readouterr().out.splitlines()
    assert "in trained images' time at 9,000 img/s (part 3): eval mode 0.50 s = 17.6 per " \
           "sample (derived: 1)" in out[0] and "(4,000 images forward)" in out[0]
    assert "no training rate to price them (OutOfMemoryError: CUDA out of memory)" in out[1]
    assert out[2].endswith("per-sample gradients (notebook 03): not measured (RuntimeError: vmap)")


def test_a_failing_measurement_in_part_2_is_one_line_and_the_part_goes_on():
    smoke = _smoke()

    def boom():
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB\nmore")

    assert smoke._attempt(boom) == {
        "error": "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"}
    assert smoke._attempt(lambda: {"img_s": 1.0}) == {"img_s": 1.0}


def test_part_3_goes_on_past_a_network_whose_k_models_run_out_of_memory(monkeypatch):
    """Part 3: a vectorised block too large for the card (an out-of-memory error) is recorded
    for that network and trainer; every other network and trainer is still measured, the
    rule's trainer of each first."""
    smoke = _smoke()
    calls = []

    def rate(arch, shape, dev, *, k, batch, steps):
        calls.append((arch, k > 1))
        if arch == "resnet18" and k > 1:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 9.00 GiB")
        return 100.0

    monkeypatch.setattr(smoke, "train_rate", rate)
    args = argparse.Namespace(bank_models=2, bank_batch=8, bank_steps=4)
    out = {}
    smoke.trainers_part(args, torch.device("cpu"), out)
    assert calls == [(a, False) for a in smoke.WIDE] + [(a, True) for a in smoke.WIDE]
    assert out["resnet18"]["vec_error"].startswith("OutOfMemoryError: CUDA out of memory.")
    assert "vec" not in out["resnet18"] and out["resnet18"]["seq"] == 100.0
    assert out["densenet"]["vec"] == out["resnet20"]["vec"] == 100.0


def test_a_failing_cleanup_after_a_failed_part_is_one_line(capsys, monkeypatch):
    """The cleanup after a failed part (the compiler's reset, the allocator's cache) that fails
    in turn, as on a device left mid-capture, prints one line and the run goes on."""
    import torch._dynamo

    smoke = _smoke()

    def broken(out):
        raise RuntimeError("capture failed")

    def reset():
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(torch._dynamo, "reset", reset)
    out = smoke.run_part("[2]", broken, smoke.Clock(), {}, torch.device("cpu"))
    assert out == {"error": "RuntimeError: capture failed"}
    assert "[2] cleanup failed: RuntimeError: operation not permitted" in capsys.readouterr().out


def test_parts_run_in_the_order_given_with_budget_shares_by_weight(capsys, tmp_path,
                                                                   monkeypatch):
    """--parts: the parts named, in that order, each until its cumulative share of the budget
    (by :data:`WEIGHTS`, over the parts run); a bad list is one line before any work."""
    import json

    smoke = _smoke()
    assert smoke.schedule(["1", "3", "4", "2"]) == pytest.approx(
        {"1": 0.40, "3": 0.80, "4": 0.85, "2": 1.0})
    assert smoke.schedule(["2"]) == {"2": 1.0}
    assert smoke.schedule(["3", "1"]) == pytest.approx({"3": 0.5, "1": 1.0})
    order = []
    monkeypatch.setattr(smoke, "bank_part", lambda args, dev, out: order.append("1"))
    monkeypatch.setattr(smoke, "trainers_part",
                        lambda args, dev, out: (order.append("3"), _fake_trainers(args, dev, out)))
    path = tmp_path / "rates.json"
    smoke.main(["--tiny", "--device", "cpu", "--parts", "3,1", "--json", str(path),
                "--commit", "abc1234"])
    out = capsys.readouterr().out
    assert order == ["3", "1"] and "parts in the order 3 1" in out
    assert "[4]" not in out and "[2]" not in out
    doc = json.loads(path.read_text())
    assert set(doc["parts"]) == {"trainers", "lenet_bank", "wall_s"}
    assert {(r["arch"], r["vectorised"]) for r in doc["rates"]} == {("resnet20", True),
                                                                   ("resnet20", False)}
    for bad, words in (("1,5", "each of 1, 2, 3, 4 at most once"), ("1,1", "at most once"),
                       ("2", "leaves no part to run")):
        with pytest.raises(SystemExit) as exc:
            smoke.main(["--tiny", "--device", "cpu", "--parts", bad, "--skip-resnet"])
        assert exc.value.code == 2 and words in capsys.readouterr().err
