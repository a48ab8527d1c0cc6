"""Stand-ins for papermill in the runner's tests see what a kernel would: the environment the
runner hands its kernel manager (the runner's own environment stays as it is)."""

from __future__ import annotations

import functools
import os
from unittest import mock


def in_kernel_env(fake):
    """``fake`` (a stand-in for ``papermill.execute_notebook``) run with the environment the
    runner gives its kernels (``kernel_manager_class.kernel_env``) added to ``os.environ``."""
    @functools.wraps(fake)
    def run(input_path, output_path, *args, **kw):
        env = getattr(kw.get("kernel_manager_class"), "kernel_env", {})
        with mock.patch.dict(os.environ, env):
            return fake(input_path, output_path, *args, **kw)

    return run
