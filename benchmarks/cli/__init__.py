"""The ``grpo-bench`` command line: entry point ``main.main``; one module per group of subcommands."""
