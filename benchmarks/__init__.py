"""The harness, the ``grpo-bench`` command line, matrix runs, reports and the pytest-benchmark suites."""
