"""The suite's xdist scheduler (``tests/xdist_files.py``): the test a worker dies in runs once
more, and fails, named, if it kills a second worker; the run still ends, with every other test
run once. With the suite's faulthandler settings (pyproject.toml) a hung test is such a death."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

CRASH = "import os\n\ndef test_crash():\n    os._exit(1)\n"
#: Dies the first time only (a file beside the test remembers it).
ONCE = ("import os, pathlib\n\ndef test_once():\n    mark = pathlib.Path('died')\n"
        "    if not mark.exists():\n        mark.write_text('')\n        os._exit(1)\n")
PASS = "def test_{name}():\n    pass\n"


def _run(tmp_path: Path, files: dict[str, str], workers: int, ini: str = "") -> tuple[int, str]:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "pytest.ini").write_text("[pytest]\n" + ini)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent)}
    try:
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-c", str(tmp_path / "pytest.ini"), "--rootdir",
             str(tmp_path), "-p", "xdist_files", "-p", "no:cacheprovider", "-n", str(workers),
             "--dist", "loadfile", "--no-loadscope-reorder", "-v", *files],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired as hung:
        pytest.fail(f"the run did not end after a worker died:\n{(hung.stdout or b'')[-3000:]!r}")
    return done.returncode, done.stdout + done.stderr


def _passed(out: str) -> list[str]:
    return sorted(re.findall(r"PASSED (\S+)", out))


def test_a_dead_worker_fails_its_test_and_the_rest_run_once(tmp_path):
    files = {"test_a.py": "".join(PASS.format(name=f"a{i}") for i in range(3)),
             "test_b.py": CRASH + PASS.format(name="after") + PASS.format(name="after2"),
             "test_c.py": PASS.format(name="c"), "test_d.py": PASS.format(name="d")}
    code, out = _run(tmp_path, files, workers=2)
    assert code == 1, out[-3000:]
    assert "crashed while running 'test_b.py::test_crash'" in out, out[-3000:]
    assert "died running test_b.py::test_crash: it runs once more" in out, out[-3000:]
    assert out.count("node down") == 2, out[-3000:]                 # twice, and not a third time
    assert _passed(out) == ["test_a.py::test_a0", "test_a.py::test_a1", "test_a.py::test_a2",
                            "test_b.py::test_after", "test_b.py::test_after2",
                            "test_c.py::test_c", "test_d.py::test_d"], out[-3000:]
    assert re.search(r"\b1 failed, 7 passed\b", out), out[-3000:]


def test_a_replacement_given_a_one_test_file_still_ends(tmp_path):
    files = {"test_a.py": CRASH + PASS.format(name="after"), "test_one.py": PASS.format(name="one")}
    code, out = _run(tmp_path, files, workers=1)
    assert code == 1, out[-3000:]
    assert _passed(out) == ["test_a.py::test_after", "test_one.py::test_one"], out[-3000:]
    assert re.search(r"\b1 failed, 2 passed\b", out), out[-3000:]


def test_a_hung_test_past_the_faulthandler_timeout_fails_with_its_stack(tmp_path):
    files = {"test_a.py": "import time\n\ndef test_hangs():\n    time.sleep(600)\n"
                          + PASS.format(name="after"),
             "test_b.py": PASS.format(name="b")}
    ini = "faulthandler_timeout = 2\nfaulthandler_exit_on_timeout = true\n"
    code, out = _run(tmp_path, files, workers=1, ini=ini)
    assert code == 1, out[-3000:]
    assert "crashed while running 'test_a.py::test_hangs'" in out, out[-3000:]
    assert "in test_hangs" in out, out[-3000:]                   # the stack says where it waited
    assert _passed(out) == ["test_a.py::test_after", "test_b.py::test_b"], out[-3000:]


def test_the_suite_runs_with_these_settings():
    import tomllib

    ini = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    options = ini["tool"]["pytest"]["ini_options"]
    assert "--dist loadfile" in options["addopts"]
    assert options["faulthandler_exit_on_timeout"] is True and options["faulthandler_timeout"] > 0
    conftest = (Path(__file__).parent / "conftest.py").read_text()
    assert "from xdist_files import pytest_xdist_make_scheduler" in conftest


def test_a_worker_that_dies_once_costs_no_test(tmp_path):
    files = {"test_a.py": ONCE + PASS.format(name="after"), "test_b.py": PASS.format(name="b")}
    code, out = _run(tmp_path, files, workers=2)
    assert code == 0, out[-3000:]
    assert "died running test_a.py::test_once: it runs once more" in out, out[-3000:]
    assert _passed(out) == ["test_a.py::test_after", "test_a.py::test_once", "test_b.py::test_b"]
