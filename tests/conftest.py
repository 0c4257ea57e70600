import os

import pytest

# Tests share one cache of pretrained task models; CI starts with an empty one and builds it once.
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

TIME_KEYS = ("time/",)


def strip_timing(rows):
    """Metric rows without wall-clock fields, which legitimately differ between identical runs."""
    return [{k: v for k, v in r.items() if not k.startswith(TIME_KEYS)} for r in rows]


@pytest.fixture
def run_cli(capsys):
    """Run `grpo-bench ARGS...` in-process; returns (exit status, stdout, stderr)."""
    from benchmarks.cli.main import main

    def _run(*args):
        code = main([str(a) for a in args])
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return _run
