"""The worker of ``grpo-bench bench revisions``: one revision's warm process, one GRPO step per request line.

``python FILE WORKLOAD SEED THREADS DEVICE TREE``, in the caller's working directory: it imports ``benchmarks``
from TREE (a revision's tree out of ``git archive``), builds that revision's grpo-vs-trl ``Ours`` side on
WORKLOAD, says which ``benchmarks`` it imported and its torch thread count in its first line, then answers each
line on stdin with one step's metrics (one JSON line per step).

This file is the checkout's that runs the bench, never the measured revision's (an older revision has no such
file), and it is run by its path (``revisions.Worker``), not with ``python -m``: ``-m`` would import this
checkout's ``benchmarks`` package before the revision's, and every later import of ``benchmarks`` would then
be this checkout's. So it imports only the standard library at its top, and torch and the measured code inside
``main``, after TREE is first on ``sys.path``, in the order the program it replaces (a string run with
``python -c``) had.
"""

from __future__ import annotations

import json
import random
import sys


def main(argv: list[str]) -> None:
    workload, seed, threads, device, tree = argv[0], int(argv[1]), int(argv[2]), argv[3], argv[4]
    # The revision's tree first, then the working directory (which stays the caller's), as ``python -c`` would
    # have it: ``python FILE`` puts FILE's folder (this checkout's benchmarks/perf) where -c puts "".
    if not getattr(sys.flags, "safe_path", False):  # -P / PYTHONSAFEPATH (3.11+): neither is put there
        sys.path[0] = ""
    sys.path.insert(0, tree)
    import torch  # after the tree is first, as the measured code is

    if threads:
        torch.set_num_threads(threads)
    import benchmarks  # the revision's, from TREE
    from benchmarks.perf.grpo_vs_trl import WORKLOADS, Ours  # the revision's too

    ours = Ours(WORKLOADS[workload], seed=seed, device=device)
    prompts = ours.task.train_prompts()
    rng = random.Random(seed)
    print(json.dumps({"imported": benchmarks.__file__, "threads": torch.get_num_threads()}), flush=True)
    for _ in sys.stdin:
        print(json.dumps(ours.step([rng.choice(prompts)])), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
