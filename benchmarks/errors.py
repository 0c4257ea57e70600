"""The two ways a command can fail, shared by every part of ``benchmarks`` (and nothing else here)."""


class UsageError(Exception):
    """Bad input, detected before or during a run: reported as one line with exit status 2."""


class TrainingFailed(Exception):
    """The run itself broke (a non-finite loss): recorded in summary.json with status 'failed', exit status 1."""
