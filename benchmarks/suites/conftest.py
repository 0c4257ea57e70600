"""`pytest benchmarks`: pytest-benchmark timings (losses, a generation batch, one training step per
algorithm) and, with `-m matrix`, a small end-to-end matrix; with `-m slow`, the full grpo-vs-trl bench.
Both are skipped unless asked for."""

import os

import pytest

os.environ.setdefault("GRPO_BENCH_CACHE", os.path.expanduser("~/.cache/grpo-bench"))


def pytest_collection_modifyitems(config, items):
    # End-to-end runs (the matrix, the full grpo-vs-trl bench: ~17 minutes) only when -m names them,
    # so that a plain `pytest benchmarks` stays a few minutes.
    asked = config.getoption("-m") or ""
    for marker, how in (("matrix", "pytest benchmarks -m matrix"), ("slow", "pytest benchmarks -m slow")):
        if marker in asked:
            continue
        skip = pytest.mark.skip(reason=f"end to end; run it with: {how}")
        for item in items:
            if marker in item.keywords:
                item.add_marker(skip)
