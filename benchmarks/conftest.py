"""`pytest benchmarks`: pytest-benchmark timings (losses, a generation batch, one training step per
algorithm) and, with `-m matrix`, a small end-to-end matrix. The matrix is skipped unless asked for."""

import os

import pytest

os.environ.setdefault("GRPO_BENCH_CACHE", os.path.expanduser("~/.cache/grpo-bench"))


def pytest_collection_modifyitems(config, items):
    if "matrix" in (config.getoption("-m") or ""):
        return
    skip = pytest.mark.skip(reason="end to end; run it with: pytest benchmarks -m matrix")
    for item in items:
        if "matrix" in item.keywords:
            item.add_marker(skip)
