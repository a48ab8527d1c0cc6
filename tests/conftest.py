"""Shared fixtures: small, fast, deterministic; CPU only (nothing here needs a GPU)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _few_threads():
    """Tests run beside other jobs on a small machine: keep torch to one thread per test."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture(scope="session")
def digits():
    """The embedded digits data set on the CPU (1,437 train / 360 test 8x8 images)."""
    from bnmem_utils.data import load_dataset

    return load_dataset("digits")
