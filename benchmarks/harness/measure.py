"""Measurement shared by every run: device, library versions, memory."""

from __future__ import annotations

import os
import platform
import resource
import subprocess
import sys
from importlib import metadata
from typing import Optional

import torch

from benchmarks.errors import UsageError


def resolve_device(name: str) -> torch.device:
    """'auto' picks CUDA when present; asking for CUDA without it is the caller's error (ValueError)."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device {name} but CUDA is not available here (torch {torch.__version__}); use --device cpu or auto")
    if name != "cpu" and not name.startswith("cuda"):
        raise ValueError(f"unknown device {name!r}; choose auto, cpu or cuda")
    return torch.device(name)


def requested_device(name: str) -> torch.device:
    """``resolve_device`` for a command's ``--device``: a device that cannot be had is bad input (UsageError)."""
    try:
        return resolve_device(name)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def resolve_precision(name: str, device: torch.device) -> str:
    """'auto' is bf16 autocast on a CUDA GPU that supports it, fp32 everywhere else."""
    if name == "auto":
        return "bf16" if device.type == "cuda" and torch.cuda.is_bf16_supported() else "fp32"
    if name not in ("fp32", "bf16"):
        raise ValueError(f"unknown precision {name!r}; choose auto, fp32 or bf16")
    return name


def cpu_bf16_native() -> bool | None:
    """Whether torch multiplies bf16 through oneDNN on this CPU (its test: AVX-512 BW, VL and DQ; AVX512-BF16 or AMX
    then make it fast); None where torch cannot say. Without it torch falls back to its own emulated products: a
    512 x 512 bf16 product ran at 1.2 GFLOP/s against 124 in fp32 on an AVX2 AMD EPYC."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return None


# The CPU's own bf16 instructions as /proc/cpuinfo names them, and as reports name them. Two CPUs with oneDNN bf16
# round bf16 products differently where one has AMX tiles and the other AVX512-BF16 only: a report flags the mix.
BF16_INSTRUCTIONS = (("amx_bf16", "AMX-BF16"), ("avx512_bf16", "AVX512-BF16"))


def cpu_bf16_instructions(cpuinfo: str | None = None) -> str | None:
    """The bf16 instructions of this CPU ("AMX-BF16, AVX512-BF16", or "none"), read from the flags of
    ``cpuinfo`` (/proc/cpuinfo's text; read here when None); None where the flags cannot be read."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo") as f:
                cpuinfo = f.read()
        except OSError:
            return None
    line = next((line for line in cpuinfo.splitlines() if line.startswith("flags")), None)
    if line is None:
        return None
    flags = set(line.split(":", 1)[1].split())
    return ", ".join(label for flag, label in BF16_INSTRUCTIONS if flag in flags) or "none"


def emulated_bf16_notice(precision: str, device: torch.device) -> str | None:
    """The one line a bf16 run on such a CPU prints before it starts (None elsewhere): it would run, correctly and
    many times slower than in fp32, with nothing saying why."""
    if precision != "bf16" or device.type != "cpu" or cpu_bf16_native() is not False:
        return None
    return (f"note: --precision bf16 on {cpu_name()} ({torch.backends.cpu.get_cpu_capability()}: no oneDNN bf16, "
            "which needs AVX-512): torch emulates bf16 products, many times slower than fp32; --precision fp32 "
            "(auto's choice on a CPU) runs at full speed")


def cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{cpu_name()} ({torch.get_num_threads()} threads)"


def library_versions() -> dict[str, str]:
    versions = {"python": sys.version.split()[0]}
    for pkg in ("torch", "transformers", "trl", "datasets", "tokenizers", "accelerate"):
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = "not installed"
    return versions


# Settings that change floating-point rounding without changing the code: the kernels MKL and ATen dispatch to
# (what differs on another CPU) and the thread count. A rerun's agreement report reads them.
ROUNDING_SETTINGS = ("MKL_CBWR", "ATEN_CPU_CAPABILITY", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "ONEDNN_MAX_CPU_ISA")


def rounding_settings() -> dict[str, str]:
    settings = {name: os.environ[name] for name in ROUNDING_SETTINGS if name in os.environ}
    settings["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    return settings


def environment(device: torch.device) -> dict:
    found = {"device": str(device), "device_name": device_name(device), "platform": platform.platform(),
             "versions": library_versions(), "rounding": rounding_settings(), "code": code_revision()}
    if device.type == "cpu":
        found["cpu_bf16"] = cpu_bf16_instructions()
    return found


def code_revision() -> dict | None:
    """The git commit of the suite's own checkout, and whether its tracked files differ from it ("dirty"): the
    code a number was measured with. None when the suite is not a git checkout (an installed wheel, a tree
    extracted with git archive). $GRPO_BENCH_REVISION, when set, names the commit a copy of the checkout was made
    from and wins over git (a copy sent to another machine may carry a stale .git folder, or none); "dirty" is
    then None: not known."""
    given = os.environ.get("GRPO_BENCH_REVISION", "").strip()
    if given:
        return {"commit": given, "dirty": None}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if not os.path.exists(os.path.join(root, ".git")):
        return None
    try:
        commit = subprocess.run(["git", "-C", root, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "--untracked-files=no", "--", "algorithms",
                                "tasks", "benchmarks"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if commit.returncode or dirty.returncode:
        return None
    return {"commit": commit.stdout.strip(), "dirty": bool(dirty.stdout.strip())}


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_kind(device: torch.device) -> str:
    """What ``peak_memory_bytes`` measures on ``device``, as reports name it."""
    return "cuda_max_memory_allocated" if device.type == "cuda" else "process_peak_rss"


def peak_memory_bytes(device: torch.device) -> int:
    """CUDA: torch.cuda.max_memory_allocated. CPU: the peak RSS of this process.

    On Linux this is VmHWM from /proc/self/status, not getrusage's ru_maxrss: ru_maxrss survives
    fork + exec, so a subprocess started by a large parent would report the parent's peak.
    """
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024  # kB
    except OSError:
        pass
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux reports KiB


def _tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


def training_state_bytes(modules, optimizers) -> dict[str, int]:
    """Bytes of parameters, gradients and optimizer state of everything trained (a critic included)."""
    params = [p for m in modules for p in m.parameters()]
    optimizer_tensors = [v for opt in optimizers for state in opt.state.values() for v in state.values()]
    return {
        "param_bytes": _tensor_bytes(params),
        "grad_bytes": _tensor_bytes(p.grad for p in params if p.grad is not None),
        "optimizer_bytes": _tensor_bytes(optimizer_tensors),
    }


def available_memory_bytes(device: torch.device) -> Optional[int]:
    """Memory a run can still take on ``device``: CUDA's free memory; on the CPU /proc/meminfo's MemAvailable, less
    where a cgroup's limit leaves less. None where it cannot be read."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    available = None
    try:
        with open("/proc/meminfo") as f:
            available = next((int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:")), None)
    except OSError:
        pass
    for limit, usage in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                         ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                          "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            with open(limit) as f, open(usage) as g:
                text = f.read().strip()
                if text != "max" and int(text) < 2**60:
                    left = int(text) - int(g.read().strip())
                    available = left if available is None else min(available, left)
        except (OSError, ValueError):
            continue
    return available


# The most completions one training step may generate: the DeepSeekMath GRPO step (64 per prompt x 1024 prompts),
# on a whole cluster. Above it a step is a typo, not an experiment.
MAX_COMPLETIONS_PER_STEP = 64 * 1024


def rollout_memory_bytes(policy, completions: int, positions: int) -> Optional[int]:
    """A lower bound of the memory one step's batch takes: ``completions`` rows of ``positions`` tokens, each
    position holding the sampler's key-value cache (2 x layers x kv width), one hidden state per layer kept for
    the backward and the logits over the vocabulary, in the parameters' dtype. None for a model without a
    transformers config."""
    config = getattr(policy, "config", None)
    try:
        layers, hidden, vocab = config.num_hidden_layers, config.hidden_size, config.vocab_size
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or hidden // heads
        kv_width = getattr(config, "num_key_value_heads", heads) * head_dim
    except (AttributeError, TypeError, ZeroDivisionError):
        return None
    element = next(policy.parameters()).element_size()
    return completions * positions * element * (layers * (2 * kv_width + hidden) + vocab)
