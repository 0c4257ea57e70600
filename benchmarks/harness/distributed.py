"""Data-parallel training inside one run: ``grpo-bench run ... --nproc N`` or started under ``torchrun``.

Each rank samples its share of the step's prompts (whole groups: a group's G completions are never split
across ranks, so group statistics are the one-process ones), computes its loss on them, and
``Algorithm.update`` averages the gradients over the ranks (gloo on CPU, NCCL on CUDA) before clipping, so
every rank takes the same optimizer step. Losses whose normaliser is a count over the whole batch (bnpo,
dapo: active tokens) take that count over every rank (``DataParallel.sum``), divided by the world size
because the gradients are averaged: the update is then the one-process update on the global batch
(tests/benchmarks/harness/test_distributed.py, to 1e-6). Rank 0 alone writes files and evaluates.
"""

from __future__ import annotations

import datetime
import os
import socket
from typing import Callable, Optional, Sequence

import torch
import torch.distributed as dist


class DataParallel:
    """The ranks of one run: this process's rank, the world size, and the collectives the algorithms use."""

    def __init__(self, group=None):
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def average_gradients(self, params: Sequence[torch.nn.Parameter]) -> None:
        """grad <- mean over ranks, in one flat all-reduce (a missing gradient counts as zeros on every rank)."""
        params = [p for p in params if p.requires_grad]
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=self.group)
        flat /= self.world_size
        offset = 0
        for p in params:
            n = p.grad.numel()
            p.grad.copy_(flat[offset:offset + n].view_as(p.grad))
            offset += n

    def sum(self, value: torch.Tensor) -> torch.Tensor:
        """The sum of ``value`` over the ranks (a new tensor)."""
        out = value.detach().clone()
        dist.all_reduce(out, op=dist.ReduceOp.SUM, group=self.group)
        return out

    def any(self, flag: bool, device=None) -> bool:
        """True when ``flag`` holds on some rank: every rank takes the same branch (and no collective hangs)."""
        t = torch.tensor([float(flag)], device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
        return bool(t.item())

    def gather(self, value: torch.Tensor) -> torch.Tensor:
        """Every rank's ``value`` (equal shapes) concatenated along dim 0 in rank order."""
        parts = [torch.empty_like(value) for _ in range(self.world_size)]
        dist.all_gather(parts, value.contiguous(), group=self.group)
        return torch.cat(parts)

    def gather_padded(self, value: torch.Tensor) -> torch.Tensor:
        """Every rank's (B, T_rank) ``value`` right-padded with zeros to the widest T, concatenated along dim 0
        in rank order: the one-process batch, whose rows are padded to the longest completion of all."""
        width = torch.tensor([value.size(1)], device=value.device)
        dist.all_reduce(width, op=dist.ReduceOp.MAX, group=self.group)
        return self.gather(torch.nn.functional.pad(value, (0, int(width.item()) - value.size(1))))

    def shard(self, items: list) -> list:
        """This rank's contiguous share of ``items`` (rank order = the one-process order)."""
        if len(items) % self.world_size:
            raise ValueError(f"{len(items)} prompts per step do not split over {self.world_size} ranks; "
                             f"use a multiple of {self.world_size}")
        k = len(items) // self.world_size
        return items[self.rank * k:(self.rank + 1) * k]


def backend(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def from_env(device: Optional[torch.device] = None, timeout_s: float = 600) -> Optional[DataParallel]:
    """The run's DataParallel when started by torchrun or ``launch`` (WORLD_SIZE > 1), else None."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return None
    if not dist.is_initialized():
        device = device or torch.device("cpu")
        if device.type == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        # A rank that skipped a collective fails after timeout_s instead of hanging the run for ever.
        dist.init_process_group(backend(device), timeout=datetime.timedelta(seconds=timeout_s))
    return DataParallel()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank: int, fn: Callable, nproc: int, port: int, args: tuple) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(nproc))
    try:
        fn(*args)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def usable_cpus() -> int:
    """The CPU cores this process may run on (its affinity, else the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def nproc_problem(nproc: int, device: torch.device) -> Optional[str]:
    """Why ``nproc`` ranks cannot run on this machine, or None: on CUDA one GPU each (no more ranks than GPUs), on
    the CPU no more ranks than usable cores (each rank is a whole process with its own model and batch: more
    of them only share the cores, and 100,000 would exhaust the machine)."""
    if device.type == "cuda":
        gpus = torch.cuda.device_count()
        if nproc > gpus:
            return f"--nproc {nproc} on CUDA needs a GPU per process; this machine has {gpus}"
        return None
    cpus = usable_cpus()
    if nproc > cpus:
        return (f"--nproc {nproc} on the CPU is more processes than the {cpus} CPU cores this run may use; "
                f"use at most {cpus}")
    return None


def launch(fn: Callable, nproc: int, *args) -> None:
    """Run ``fn(*args)`` in ``nproc`` processes (torch.multiprocessing spawn) with torchrun's environment."""
    import torch.multiprocessing as mp

    mp.spawn(_entry, args=(fn, nproc, free_port(), args), nprocs=nproc, join=True)
