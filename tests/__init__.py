# tests/ is a package, and so is every folder under it (tests/benchmarks/report/, ...): pytest imports each test file
# by its dotted name (tests.benchmarks.report.test_matrix), so files in different folders may share a name, and
# conftest.py is the one module ``tests.conftest`` that test files import helpers from.
