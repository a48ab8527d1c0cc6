"""Figure outputs are byte-identical when the same figure is saved again (warm reruns)."""

from __future__ import annotations

import json
import time

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from bnmem_utils.figures import plotting  # noqa: E402


def _figure():
    fig, ax = plt.subplots(figsize=(3, 2))
    ax.plot([0, 1, 2], [0.1, 0.3, 0.2], label="bn")
    ax.set_title("gamma/sigma")
    ax.legend()
    return fig


def _save(folder, fig, data):
    plotting.save_figure(fig, "02_gamma_sigma", data, folder=folder, notebook="02_x",
                         profile="quick", parameters={"seed": 0}, commit="abc123")
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if not p.name.startswith(".")}


def test_saving_the_same_figure_twice_gives_the_same_bytes(tmp_path):
    data = {"x": np.arange(3), "y": np.array([0.1, 0.3, 0.2], dtype=np.float32)}
    fig = _figure()
    first = _save(tmp_path / "a", fig, data)
    time.sleep(1.1)  # a creation date or wall-clock time in any file would now differ
    second = _save(tmp_path / "b", fig, data)
    again = _save(tmp_path / "a", fig, data)
    plt.close(fig)
    assert set(first) == {"02_gamma_sigma.pdf", "02_gamma_sigma.png", "02_gamma_sigma.csv",
                          "manifest.json", "manifest.md"}
    for name in first:
        assert first[name] == second[name], name
        assert first[name] == again[name], name


def test_manifest_has_no_wall_clock_time(tmp_path):
    fig = _figure()
    _save(tmp_path, fig, None)
    plt.close(fig)
    entry = json.loads((tmp_path / "manifest.json").read_text())["02_gamma_sigma"]
    assert "created" not in entry and entry["commit"] == "abc123"


def test_float32_and_float64_frames_write_the_same_csv(tmp_path):
    values = np.array([0.1, 1 / 3, 2.5e-7, 12345.678, 0.0], dtype=np.float32)
    f32 = pd.DataFrame({"layer": ["a", "b", "c", "d", "e"], "ratio": values})
    f64 = f32.astype({"ratio": np.float64})  # what a warm (cached) rerun hands over
    fig = _figure()
    plotting.save_figure(fig, "f32", f32, folder=tmp_path)
    plotting.save_figure(fig, "f64", f64, folder=tmp_path)
    plt.close(fig)
    a, b = (tmp_path / "f32.csv").read_text(), (tmp_path / "f64.csv").read_text()
    assert a == b
    assert "0.1\n" in a and "0.333333" in a


def test_git_commit_names_the_last_change_to_the_code(tmp_path, monkeypatch):
    """Rewritten figures and commits of other files leave the commit alone; a change to the
    package or the notebooks marks it dirty, and committing that change moves it."""
    import subprocess

    from bnmem_utils.core import device

    repo = tmp_path / "repo"
    (repo / "figures" / "quick").mkdir(parents=True)
    (repo / "notebooks").mkdir()
    (repo / "bnmem_utils").mkdir()
    (repo / "figures" / "quick" / "f.csv").write_text("x\n1\n")
    (repo / "bnmem_utils" / "src.py").write_text("a = 1\n")
    (repo / "README.md").write_text("v1\n")
    run = {"cwd": repo, "check": True, "capture_output": True}

    def commit(message):
        subprocess.run(["git", "add", "."], **run)
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm",
                        message], **run)

    subprocess.run(["git", "init", "-q"], **run)
    commit("x")
    monkeypatch.setenv("BNMEM_ROOT", str(repo))
    clean = device.git_commit()
    assert clean != "unknown" and not clean.endswith("+dirty")
    (repo / "figures" / "quick" / "f.csv").write_text("x\n2\n")
    (repo / "README.md").write_text("v2\n")
    assert device.git_commit() == clean
    commit("figures and README only")
    assert device.git_commit() == clean
    (repo / "bnmem_utils" / "src.py").write_text("a = 2\n")
    assert device.git_commit() == clean + "+dirty"
    commit("code")
    assert device.git_commit() not in (clean, clean + "+dirty")


def test_a_figure_saved_as_its_table_alone_leaves_its_old_pictures(tmp_path):
    from bnmem_utils.core.outputs import Promotion, promote_figures, read_manifest

    folder, staged = tmp_path / "figures", tmp_path / "staged"
    fig = _figure()
    plotting.save_figure(fig, "06_claims_forest", {"x": [1]}, folder=folder, notebook="06_report")
    plotting.save_figure(None, "06_claims_forest", {"x": [2]}, folder=staged, notebook="06_report")
    plotting.save_figure(fig, "06_claims_forest_theory", {"x": [3]}, folder=staged,
                         notebook="06_report")
    plt.close(fig)
    promotion = Promotion()
    promote_figures(promotion, staged, folder, "06_report")
    promotion.commit()
    assert sorted(p.name for p in folder.iterdir()) == [
        "06_claims_forest.csv", "06_claims_forest_theory.csv", "06_claims_forest_theory.pdf",
        "06_claims_forest_theory.png", "manifest.json", "manifest.md"]
    assert read_manifest(folder)["06_claims_forest"]["files"] == ["06_claims_forest.csv"]


def test_each_published_markdown_manifest_renders_its_json_twin():
    """``figures/<profile>/manifest.md`` is what the current code renders from the
    ``manifest.json`` beside it, the data sets' digests included."""
    import json

    from bnmem_utils.core.outputs import MANIFEST_MD, manifest_texts
    from bnmem_utils.core.paths import project_root

    folders = [p.parent for p in (project_root() / "figures").glob("*/manifest.json")]
    assert folders
    for folder in folders:
        manifest = json.loads((folder / "manifest.json").read_text())
        assert (folder / MANIFEST_MD).read_text() == manifest_texts(manifest)[MANIFEST_MD], folder
