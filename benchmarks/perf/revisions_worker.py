"""The worker of ``grpo-bench bench revisions``: one revision's warm process, one training step per request line.

``python FILE SETTINGS SEED THREADS TREE``, in the caller's working directory: it imports ``benchmarks`` from TREE
(a revision's tree out of ``git archive``), builds the run SETTINGS (a JSON object: a workload's flat run
settings as this checkout names them, ``Workload.run_settings``) with that revision's harness (``resolve`` and
``build``, as ``grpo-bench run`` builds a run), says which ``benchmarks`` it imported and its torch thread count in
its first line, then answers each line on stdin with one step's metrics (one JSON line per step): the step's
seconds, its phases' (``time/...``), its loss and tokens (none generated: DPO's steps after its first). Each step samples ``prompts_per_step`` of the task's
training prompts, drawn with SEED. The workload is this checkout's, so a revision older than a workload still
runs it, as far as its harness knows the settings (one it does not is its one-line error).

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
import time


def main(argv: list[str]) -> None:
    settings, seed, threads, tree = json.loads(argv[0]), int(argv[1]), int(argv[2]), argv[3]
    # The revision's tree first, then the working directory (which stays the caller's), as ``python -c`` would
    # have it: ``python FILE`` puts FILE's folder (this checkout's benchmarks/perf) where -c puts "".
    if not getattr(sys.flags, "safe_path", False):  # -P / PYTHONSAFEPATH (3.11+): neither is put there
        sys.path[0] = ""
    sys.path.insert(0, tree)
    import torch  # after the tree is first, as the measured code is

    if threads:
        torch.set_num_threads(threads)
    import benchmarks  # the revision's, from TREE
    from benchmarks.harness import build, resolve  # the revision's too

    rc, config, task_options = resolve(settings)
    task, _, algo, _ = build(rc, config, task_options)
    prompts = task.train_prompts()
    per_step = int(settings.get("prompts_per_step", 1))
    rng = random.Random(seed)
    print(json.dumps({"imported": benchmarks.__file__, "threads": torch.get_num_threads()}), flush=True)
    for _ in sys.stdin:
        batch = [rng.choice(prompts) for _ in range(per_step)]
        start = time.perf_counter()
        metrics = algo.step(batch)
        total = time.perf_counter() - start
        print(json.dumps({**{k: v for k, v in metrics.items() if k.startswith("time/")}, "time/step": total,
                          "loss": metrics["loss"], "tokens/generated": metrics.get("tokens/generated", 0.0),
                          "tokens/processed": metrics.get("tokens/processed", 0.0)}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
