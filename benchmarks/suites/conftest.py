"""`pytest benchmarks -n 0`: pytest-benchmark timings (losses, a generation batch, one training step per
algorithm) and, with `-m matrix`, a small end-to-end matrix; with `-m slow`, the full grpo-vs-trl bench.
Both are skipped unless asked for. Timings run one at a time: the project's addopts give the tests two xdist
workers, under which pytest-benchmark would not time anything, so under xdist every item is skipped naming -n 0."""

import os

import pytest

os.environ.setdefault("GRPO_BENCH_CACHE", os.path.expanduser("~/.cache/grpo-bench"))


def pytest_collection_modifyitems(config, items):
    if os.environ.get("PYTEST_XDIST_WORKER"):  # collected by an xdist worker: no timing would be taken
        skip = pytest.mark.skip(reason="timings run one at a time: pytest benchmarks -n 0")
        for item in items:
            item.add_marker(skip)
        return
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
