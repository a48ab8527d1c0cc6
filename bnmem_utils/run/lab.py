"""JupyterLab as ``bnmem lab`` starts it: the repository's notebooks are saved as committed.

A reader who opens ``notebooks/04_lira.ipynb`` and runs it changes nothing that git tracks: every
save (autosave included) of a notebook under the repository's ``notebooks/`` folder keeps its
sources and cell tags and drops outputs, execution counts and the metadata a session adds, so
the file stays byte for byte as committed unless the reader edits a cell. The run's numbers and
figures are under ``runs/<profile>/interactive/`` (:mod:`bnmem_utils.run.notebook`); ``bnmem
report`` or nbconvert export a run with its outputs. Imported by Jupyter's server only.
"""

from __future__ import annotations

import json
from pathlib import Path

from jupyter_server.services.contents.largefilemanager import AsyncLargeFileManager

from bnmem_utils.core.paths import notebooks_dir


def saved_as_committed(model: dict, path: str, contents_manager, **kwargs) -> None:
    """Jupyter's pre-save hook: a notebook of the repository's ``notebooks/`` folder keeps its
    cells' sources, ids and tags, and the notebook's metadata as the file on disk has it (the
    server names its kernel in its own words, "Python 3 (ipykernel)" for "Python 3"); outputs,
    execution counts and any other metadata are dropped (``model`` is changed in place). Other
    files are saved as they are."""
    if model.get("type") != "notebook" or not model.get("content"):
        return
    file = Path(contents_manager.root_dir, path).resolve()
    if file.parent != notebooks_dir().resolve():
        return
    notebook = model["content"]
    notebook["metadata"] = _metadata_on_disk(file) or {
        k: v for k, v in notebook["metadata"].items() if k == "kernelspec"}
    for cell in notebook["cells"]:
        cell["metadata"] = {k: v for k, v in cell["metadata"].items() if k == "tags"}
        if cell["cell_type"] == "code":
            cell["outputs"], cell["execution_count"] = [], None


def _metadata_on_disk(file: Path) -> dict | None:
    """The notebook-level metadata of ``file`` as saved, or None when it cannot be read."""
    try:
        metadata = json.loads(file.read_text(encoding="utf-8"))["metadata"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return metadata if isinstance(metadata, dict) else None


class SavedAsCommitted(AsyncLargeFileManager):
    """Jupyter's default contents manager with :func:`saved_as_committed` before every save."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.register_pre_save_hook(saved_as_committed)
