"""The one training loop: every algorithm on every task is run, evaluated, checkpointed and measured here.

A run directory holds:
    config.json     every resolved setting, the device and the library versions
    metrics.jsonl   one row per step (the shared metric vocabulary, plus eval/* every eval_every steps)
    checkpoints/    the newest checkpoints (policy, algorithm state, RNG states); --resume continues from one
    summary.json    written last, atomically: its presence with status "complete" means the run finished

A finished run is never overwritten unless asked (``overwrite``); two runs never share a directory
(a lock); a resumed run must have the settings of the run it continues, except those in RESUMABLE.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import inspect
import math
import os
import random
import re
import secrets
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, Optional

import torch
from tqdm.auto import tqdm

from algorithms import ALGORITHMS, Algorithm, Sampling
from algorithms.rollout import generate
from benchmarks.errors import TrainingFailed, UsageError
from benchmarks.harness import distributed, lora, measure, tracking
from benchmarks.harness.config import RESUMABLE, RunConfig, flat_settings, training_seed, with_task_defaults
from benchmarks.passk import parse_ks, pass_at_k_evaluation
from benchmarks.progress import progress as progress_bar
from benchmarks.io import (CPU_TIME, locked_directory, append_jsonl, atomic_write, atomic_write_json, encode_correct,
                           read_json, read_jsonl, rewrite_jsonl)
from tasks import Task, make_task
from tasks.base import Samples


def frozen_copy(model):
    ref = copy.deepcopy(model)
    ref.eval()
    ref.requires_grad_(False)
    return ref


def _checkpoints(out: Path) -> list[Path]:
    return sorted((out / "checkpoints").glob("step_*.pt"))


# The run's record of its checkpoints' sha256 (checkpoint name -> {"sha256", "token"}), written before each
# checkpoint is renamed into place. The token is also saved inside the checkpoint: a checkpoint of the same name
# that came from elsewhere (a matrix cell's archive; the record, hidden, travels with none) is not checked against
# the entry of another file.
CHECKSUMS = ".checkpoints.sha256.json"


def _checksums(out: Path) -> dict:
    return read_json(out / CHECKSUMS) or {}


def discard_checkpoints(out: Path) -> None:
    """Remove a run's checkpoints: for a run that will never be resumed (a finished matrix cell), they are
    gigabytes of optimizer state on a 135M model and nothing else."""
    for path in _checkpoints(out):
        path.unlink(missing_ok=True)
    (out / CHECKSUMS).unlink(missing_ok=True)


# The temporary files ``atomic_write`` leaves beside a checkpoint when the writer is killed mid-write
# (``.NAME.HEX8.tmp``): gigabytes each on a 135M model.
_CHECKPOINT_TEMP = re.compile(r"\.step_\d+\.pt\.[0-9a-f]{8}\.tmp")


def remove_stale_temp_files(out: Path) -> list[Path]:
    """Remove the temporary checkpoint files a killed run left in ``out``'s checkpoints (only those, by their
    pattern); the caller holds the run directory's lock, so no writer of this run is alive. Returns them."""
    folder = out / "checkpoints"
    stale = [p for p in folder.iterdir() if _CHECKPOINT_TEMP.fullmatch(p.name)] if folder.is_dir() else []
    for path in stale:
        path.unlink(missing_ok=True)
    return stale


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _os_error(exc: BaseException) -> Optional[OSError]:
    """The OSError behind ``exc``: itself, or in its chain (torch.save's RuntimeError hides a full disk's there)."""
    while exc is not None and not isinstance(exc, OSError):
        exc = exc.__cause__ or exc.__context__
    return exc


@contextmanager
def _writing(path: Path, what: str):
    """A run's file that cannot be written (a full disk) is one UsageError line naming it, not a traceback;
    its older copy, written atomically, is intact."""
    try:
        yield
    except (OSError, RuntimeError) as exc:
        cause = _os_error(exc)
        if cause is None:
            raise
        raise UsageError(f"{path}: cannot write the {what}: {cause.strerror or cause}; the run stopped there, "
                         "and --resume continues it from its newest checkpoint") from None


def _save_checkpoint(out: Path, step: int, payload: dict, keep: int = 2) -> None:
    path = out / "checkpoints" / f"step_{step:07d}.pt"
    token = secrets.token_hex(8)

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as f:  # through a Python file, so that a full disk's OSError reaches us (see _os_error)
            torch.save({**payload, CHECKSUM_TOKEN: token}, f)
        # The checksum of the bytes on disk, recorded before the checkpoint is in place: none is without its own.
        sums = {name: entry for name, entry in _checksums(out).items() if (path.parent / name).exists()}
        atomic_write_json(out / CHECKSUMS, {**sums, path.name: {"sha256": _sha256(tmp), "token": token}})

    with _writing(path, "checkpoint"):
        atomic_write(path, write)
    for old in _checkpoints(out)[:-keep]:
        old.unlink(missing_ok=True)


CHECKSUM_TOKEN = "checksum_token"  # the checkpoint's key for the token of its entry in CHECKSUMS


def _check_checksum(out: Path, path: Path, state: dict) -> None:
    """A checkpoint that loads but whose bytes are not those written (its sha256 differs from the one the run
    recorded) is one UsageError line naming it: resuming from it would change the run silently (one that does not
    load is skipped, with a warning, by the caller). One written before checksums were recorded has none."""
    entry = _checksums(out).get(path.name)
    if not isinstance(entry, dict) or entry.get("token") != state.get(CHECKSUM_TOKEN):
        return
    if _sha256(path) != entry.get("sha256"):
        raise UsageError(f"{path}: damaged checkpoint (its sha256 differs from the one recorded when it was "
                         f"written, in {out / CHECKSUMS}); delete it to resume from an older checkpoint, or "
                         "--overwrite starts the run again")


def _newest_resumable_checkpoint(out: Path, device, rows: list[dict]) -> Optional[dict]:
    """The newest checkpoint that loads and whose steps metrics.jsonl all holds. An unreadable one (a disk
    error, a file cut short) is reported and skipped, and so is one ahead of the metrics (a directory
    copied in part, e.g. a driver killed while it unpacked a cell): resuming from it would lose rows."""
    logged = {r.get("step") for r in rows}
    for path in reversed(_checkpoints(out)):
        try:
            state = torch.load(path, map_location=device, weights_only=False)
        except Exception as exc:  # torch.load raises pickle, zip and runtime errors for a damaged file
            tqdm.write(f"{path}: unreadable checkpoint ({type(exc).__name__}); falling back to an older one", file=sys.stderr)
            continue
        _check_checksum(out, path, state)  # damage that still loads would change the run silently
        missing = [s for s in range(1, state["step"] + 1) if s not in logged]
        if not missing:
            return state
        tqdm.write(f"{path}: metrics.jsonl lacks {len(missing)} of its {state['step']} steps (first: {missing[0]}); "
                   "falling back to an older checkpoint", file=sys.stderr)
    return None


def rollout_sampler(model, tokenizer, prompts, *, k: int, max_new_tokens: int, temperature: float, seed: int,
                    share_prefix: bool = False, drop_finished: bool = False) -> Samples:
    """Evaluation sampling through the training rollout (``algorithms.rollout.generate``): one prefill per
    prompt shared by its k samples, a static KV cache and early stopping; 2-3x transformers' generate
    on CPU. Installed as ``Task.eval_sampler``, since tasks never import algorithms. ``share_prefix``: the
    prompts' common leading tokens encoded once (``generate``'s); ``drop_finished``: greedy decoding goes on over the
    rows still decoding only (``generate``'s)."""
    device = next(model.parameters()).device
    generator = torch.Generator(device=device).manual_seed(seed)
    rollout = generate(model, tokenizer, prompts, k, max_new_tokens=max_new_tokens, temperature=temperature,
                       generator=generator, share_prefix=share_prefix, drop_finished=drop_finished)
    texts = [rollout.completions[i:i + k] for i in range(0, rollout.num_completions, k)]
    truncated = rollout.truncated.view(-1, k).tolist()
    return Samples(texts, truncated, rollout.tokens_generated)


def make_evaluated_task(name: str, **options) -> Task:
    """``make_task`` with the fast shared sampler installed for the task's evaluation."""
    task = make_task(name, **options)
    task.eval_sampler = rollout_sampler
    return task


def run_sampling(rc: RunConfig, task: Task) -> Sampling:
    """How a run samples: its completion cap and temperature, the task's where it leaves them unset."""
    return Sampling(max_new_tokens=rc.max_new_tokens or task.generation.max_new_tokens,
                    temperature=task.generation.temperature if rc.temperature is None else rc.temperature)


def build(rc: RunConfig, algo_config, task_options: dict, task: Optional[Task] = None):
    """Resolve the device and precision and build (task, policy, algorithm, resolved config dict).

    Nothing given is changed: an unset learning rate becomes the task's in a copy of ``algo_config``
    (``with_task_defaults``, as ``resolve`` fills it); the algorithm validates its config, and refuses a bad one as
    one UsageError line."""
    try:
        device = measure.resolve_device(rc.device)
        precision = measure.resolve_precision(rc.precision, device)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    notice = measure.emulated_bf16_notice(precision, device)
    if notice:
        tqdm.write(f"grpo-bench: {notice}", file=sys.stderr)
    torch.manual_seed(training_seed(rc))
    random.seed(training_seed(rc))
    task = task or make_evaluated_task(rc.task, **task_options)
    algo_config = with_task_defaults(algo_config, type(task))
    policy = lora.wrap(task.load_policy(device), rc)
    algo_cls = ALGORITHMS[rc.algo]
    # With LoRA the reference is the policy with its adapter off, not a second copy of the weights.
    ref = None
    if algo_cls.needs_reference(algo_config):
        ref = lora.AdapterDisabledReference(policy) if lora.is_adapted(policy) else frozen_copy(policy)
    sampling = run_sampling(rc, task)
    _check_context(task, policy, sampling.max_new_tokens)
    _check_batch_memory(policy, algo_config, sampling.max_new_tokens, device)
    data_parallel = distributed.from_env(device)  # None in one process
    rank = data_parallel.rank if data_parallel else 0
    # Each rank samples its own completions: its generator's seed is offset by its rank.
    try:  # an algorithm may refuse a policy it cannot serve (GRPO's int8 sampling: a Llama on the CPU) or ranks
        algo = algo_cls(policy, ref, task, algo_config, sampling, seed=training_seed(rc) + rank, precision=precision,
                        logits_precision=rc.logits_precision)
        if data_parallel:
            algo.set_data_parallel(data_parallel)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    resolved = {
        "settings": flat_settings(rc, algo_config, task_options),
        "run": dataclasses.asdict(rc),
        "algo_config": algo_config.settings(),
        "task": task.describe(),
        "sampling": dataclasses.asdict(sampling),
        "precision": precision,
        "logits_precision": rc.logits_precision,
        "completions_per_step": algo_config.completions_per_step(),
        "reward_fn": reward_identity(getattr(task, "_custom_reward", None)),
        "environment": measure.environment(device),
        "policy": {"class": type(policy).__name__, "parameters": sum(p.numel() for p in policy.parameters()),
                   "trainable_parameters": sum(p.numel() for p in policy.parameters() if p.requires_grad),
                   **lora.describe(policy)},
    }
    return task, policy, algo, resolved


def _check_batch_memory(policy, algo_config, max_new_tokens: int, device) -> None:
    """A step's batch that cannot fit is refused before any work (one UsageError line), not killed by the kernel
    gigabytes later: more completions per step than MAX_COMPLETIONS_PER_STEP, or a lower bound of the batch's
    memory (``measure.rollout_memory_bytes``: completions x max new tokens x the model's widths) above the memory
    available. Prompt tokens are left out of the bound, so that it stays a bound."""
    completions = algo_config.completions_per_step()
    limit = measure.MAX_COMPLETIONS_PER_STEP
    if completions > limit:
        raise UsageError(f"{completions} completions per step (group size x prompts per step) is more than the "
                         f"{limit} this suite runs in one step; lower the group size or --prompts-per-step")
    need = measure.rollout_memory_bytes(policy, completions, max_new_tokens)
    available = measure.available_memory_bytes(device)
    if need is not None and available is not None and need > available:
        raise UsageError(f"{completions} completions per step x {max_new_tokens} new tokens need at least "
                         f"{_size(need)} for the batch (key-value cache, activations, logits over the vocabulary), "
                         f"more than the {_size(available)} available on {device}; lower the group size, "
                         "--prompts-per-step or --max-new-tokens")


def _size(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def _check_context(task: Task, policy, max_new_tokens: int) -> None:
    """A training prompt longer than the model's context is refused (it trained with no warning on positions the
    model never learned, or failed deep in attention). Completions that run past the context are the user's call
    (a rotary model extrapolates; the toy models' 64 positions with the default 64 new tokens do)."""
    limit = getattr(getattr(policy, "config", None), "max_position_embeddings", None)
    if not limit or task.tokenizer is None:
        return
    prompts = task.train_prompts()
    lengths = [len(ids) for ids in task.tokenizer(prompts, add_special_tokens=False)["input_ids"]]
    longest = max(range(len(prompts)), key=lengths.__getitem__, default=None)
    if longest is not None and lengths[longest] >= limit:
        raise UsageError(f"training prompt {longest} of task {task.name!r} is {lengths[longest]} tokens, as long as or "
                         f"longer than the model's context of {limit} positions, with no room for a completion: shorten "
                         "it or use a model with a longer context")


def reward_identity(fn) -> Optional[dict]:
    """A reward function's module, name and source hash (None: the task's own reward): part of a run's identity,
    so that a resume with another function, or the same one edited, cannot put rewards of two scales in one run.
    A lambda's source is the whole statement around it (a ``train(...)`` call and its other arguments), so a
    lambda is hashed by its code instead."""
    if fn is None:
        return None
    identity = {"module": getattr(fn, "__module__", None) or type(fn).__module__,
                "name": getattr(fn, "__qualname__", None) or type(fn).__qualname__}
    if getattr(fn, "__name__", None) == "<lambda>" and hasattr(fn, "__code__"):
        return {**identity, "code_sha256": hashlib.sha256(_code_bytes(fn.__code__)).hexdigest()}
    try:  # a callable object's source is its class's; a function typed into a bare interpreter has none
        source = inspect.getsource(fn if inspect.isroutine(fn) else type(fn))
    except Exception:  # inspect raises OSError or TypeError, and more for a file changed since it was imported
        source = None
    return {**identity, "source_sha256": hashlib.sha256(source.encode()).hexdigest() if source is not None else None}


def _code_bytes(code) -> bytes:
    """What a code object computes, without where it was written (nested code objects by their own bytes)."""
    consts = [_code_bytes(c) if inspect.iscode(c) else repr(c).encode() for c in code.co_consts]
    return b"\0".join([code.co_code, repr(code.co_names).encode(), repr(code.co_varnames).encode(), *consts])


def _describe_reward(identity: Optional[dict]) -> str:
    if identity is None:
        return "the task's own reward"
    kind = "code" if "code_sha256" in identity else "source"
    sha = identity.get(f"{kind}_sha256")
    return f"{identity.get('module')}:{identity.get('name')} ({kind} sha256 {sha[:12] if sha else 'unknown'})"


def train_steps(algo: Algorithm, task: Task, prompt_rng: random.Random, steps: range,
                completions_left: Optional[Callable[[], int]] = None) -> Iterator[tuple[int, dict, float]]:
    """The training loop proper: (step, metrics, seconds) for each step, prompts drawn from ``prompt_rng``, the
    metrics with the step's CPU seconds (``time/cpu``: the process's, all its threads; unlike ``seconds``, a wall
    clock, not lengthened by a pause or by other processes' turns on the cores). ``completions_left`` (the sample
    budget's remainder, asked before each step) caps a varying step's extra rounds (``Algorithm.completions_allowed``).

    A non-finite loss stops the loop with TrainingFailed; everything else (evaluation, files,
    checkpoints) is the caller's, so the checks can drive the very loop that ``run`` drives."""
    train_prompts = task.train_prompts()
    for step in steps:
        prompts = prompt_rng.choices(train_prompts, k=algo.config.prompts_per_step)  # the same on every rank
        if algo.data_parallel is not None:
            prompts = algo.data_parallel.shard(prompts)  # whole prompts: each rank samples whole groups
        algo.completions_allowed = completions_left() if completions_left is not None else None
        start, cpu = time.perf_counter(), time.process_time()
        try:
            metrics = algo.step(prompts)
        except RuntimeError as exc:  # torch.multinomial's words, from any algorithm's sampling
            if "probability tensor contains either" not in str(exc):
                raise
            raise TrainingFailed(f"non-finite sampling probabilities at step {step}: the policy's weights diverged "
                                 "(is the learning rate too high?)") from None
        seconds = time.perf_counter() - start
        metrics[CPU_TIME] = time.process_time() - cpu
        if not math.isfinite(metrics.get("loss", 0.0)):
            raise TrainingFailed(f"non-finite loss {metrics['loss']} at step {step}")
        yield step, metrics, seconds


def _run_directory(out: Path):
    """Create ``out`` and hold its lock for the run: bad paths fail here, before any work."""
    return locked_directory(out, ".run.lock", what="run directory", busy="another grpo-bench run is writing to")


# What a run writes into its directory (besides its lock and the other ranks' scratch folders).
RUN_FILES = ("config.json", "summary.json", "metrics.jsonl", "checkpoints", "final")


def _run_files(out: Path) -> list[str]:
    """The run's files present in ``out`` (a folder counts when it holds something)."""
    return [name for name in RUN_FILES
            if (out / name).is_file() or ((out / name).is_dir() and any((out / name).iterdir()))]


def _check_previous_run(out: Path, rc: RunConfig, resolved: dict) -> Optional[dict]:
    """Refuse to overwrite a run without being asked, or to resume one with other settings.

    Returns the previous config.json when resuming."""
    previous = read_json(out / "config.json")
    summary = read_json(out / "summary.json")
    if rc.overwrite:
        return None
    if previous is None and summary is None:
        found = _run_files(out)
        if found:  # a run's files whose record is unreadable: still a run's results, never replaced unasked
            raise UsageError(f"{out} holds a run's files ({', '.join(found)}) but no readable config.json or "
                             "summary.json to resume from: --overwrite replaces them")
        return None
    if not rc.resume:
        state = "a finished run" if (summary or {}).get("status") == "complete" else "a run"
        old = (previous or {}).get("settings") or {}
        differ = sorted(k for k in old if k not in RESUMABLE and old[k] != resolved["settings"].get(k))
        if differ:  # a hint that would itself be refused is no hint
            changes = ", ".join(f"{k} {old[k]!r} -> {resolved['settings'].get(k)!r}" for k in differ[:3])
            raise UsageError(f"{out} holds {state} with other settings ({changes}{', ...' if len(differ) > 3 else ''}): "
                             "give this run its own --out, or --overwrite replaces that one")
        raise UsageError(f"{out} holds {state}: --resume continues it, --overwrite replaces it")
    old = (previous or {}).get("settings")
    if old is None:
        raise UsageError(f"{out}: its config.json has no settings to resume from; --overwrite replaces the run")
    new = resolved["settings"]
    # A setting the old run did not record (a field added since) is taken to be its default.
    differ = sorted(k for k in old if k not in RESUMABLE and old[k] != new.get(k))
    if differ:
        changes = ", ".join(f"{k} {old.get(k)!r} -> {new.get(k)!r}" for k in differ)
        raise UsageError(f"--resume with other settings than the run in {out}: {changes} "
                         f"(only {', '.join(RESUMABLE)} may change)")
    reward = resolved["reward_fn"]
    if "reward_fn" in previous:
        same, was = previous["reward_fn"] == reward, _describe_reward(previous["reward_fn"])
    else:  # a run recorded before the reward function's identity was: its name is all there is to compare
        name = (previous.get("task") or {}).get("custom_reward_fn")
        same, was = name == (reward or {}).get("name"), name or _describe_reward(None)
    if not same:
        raise UsageError(f"--resume with another reward function than the run in {out}: "
                         f"{was} -> {_describe_reward(reward)}")
    # A run only grows: fewer steps would delete the rows (and change the results) of the steps past them.
    done = max([r.get("step", 0) for r in read_jsonl(out / "metrics.jsonl")] + [(summary or {}).get("steps") or 0])
    if rc.steps < done:
        raise UsageError(f"--resume with --steps {rc.steps}, fewer than the {done} steps the run in {out} has done: "
                         f"a run resumes to as many steps or more (--overwrite replaces it)")
    return previous


def _evaluate(task: Task, policy, seed: int) -> tuple[dict[str, float], dict]:
    """The evaluation's metrics and its per-question record (``encode_correct``; empty where the task's evaluation
    has no per-question correctness). The same seed before, during and after: paired samples make the change less noisy."""
    metrics = task.evaluate_recorded(policy, seed=seed)
    detail = metrics.per_question
    record = encode_correct(detail["correct"]) if detail and detail.get("correct") else None
    return dict(metrics), record or {}


def _pass_at_k(rc: RunConfig, task: Task, policy, metrics: dict, questions: dict, when: str) -> None:
    """With --pass-at-k: ``pass_at_k`` into the evaluation's ``metrics`` (the summary's pass_at_k_before/after) and
    its per-question counts into ``questions`` (under pass_at_k_before/after)."""
    found, record = pass_at_k_evaluation(task, policy, *parse_ks(rc.pass_at_k, rc.pass_samples), rc.seed)
    metrics.update(found)
    if record:
        questions[f"pass_at_k_{when}"] = record


def run(rc: RunConfig, algo_config, task_options: Optional[dict] = None, *, task: Optional[Task] = None,
        on_step: Optional[Callable[[dict], None]] = None, progress: bool = True,
        on_build: Optional[Callable[[Task, object, Algorithm], None]] = None) -> dict:
    """Train, evaluate before/during/after, checkpoint, and write config.json, metrics.jsonl, summary.json.

    ``on_step(row)`` sees each metrics row; ``on_build(task, policy, algorithm)`` what was built (the API
    returns the trained policy through it)."""
    out = Path(rc.out)
    rc.validate()
    if rc.nproc > 1 and int(os.environ.get("WORLD_SIZE", "1")) == 1:
        try:
            problem = distributed.nproc_problem(rc.nproc, measure.resolve_device(rc.device))
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        if problem:
            raise UsageError(problem)
        # --nproc N: N processes, each running this function as one rank; rank 0 writes the run directory.
        _launch_ranks(rc, algo_config, task_options)
        return read_json(out / "summary.json")
    tracking.require(rc.report_to)  # a tracker that is not installed fails here, before any work
    rank = int(os.environ.get("RANK", "0"))
    if rank:  # the other ranks train beside rank 0 and write nothing to --out: a scratch directory per rank
        out = out / ".ranks" / f"rank{rank}"
    with _run_directory(out):
        for path in remove_stale_temp_files(out):
            tqdm.write(f"{path}: removed, a checkpoint write that never finished", file=sys.stderr)
        task, policy, algo, resolved = build(rc, algo_config, task_options or {}, task)
        if on_build:
            on_build(task, policy, algo)
        previous = _check_previous_run(out, rc, resolved)
        summary = read_json(out / "summary.json")
        if previous and summary and summary.get("status") == "complete" and _finished(summary, rc):
            tqdm.write(f"{out}: the run is complete at {rc.steps} steps; nothing to do")
            return summary
        return _train_and_record(out, rc, task, policy, algo, resolved, previous, on_step, progress)


def _evaluation_due(rc: RunConfig, step: int, generated_before: float, generated: float) -> bool:
    """Every ``eval_every_completions`` completions (the step that crosses a multiple), else every ``eval_every`` steps."""
    if rc.eval_every_completions:
        return generated // rc.eval_every_completions > generated_before // rc.eval_every_completions
    return bool(rc.eval_every) and step % rc.eval_every == 0


def _rank_run(rc: RunConfig, algo_config, task_options) -> None:
    run(rc, algo_config, task_options, progress=int(os.environ.get("RANK", "0")) == 0)


# What a rank's error says when it failed only because another rank stopped (gloo's transport).
PEER_LOST = ("Connection closed by peer", "Connection reset by peer")


def _launch_ranks(rc: RunConfig, algo_config, task_options) -> None:
    """``rc.nproc`` ranks of the run; a rank that fails is the run's failure, in one line: its UsageError or
    TrainingFailed as such, anything else (a crash, a rank that lost its peer) as TrainingFailed naming the rank."""
    import torch.multiprocessing as mp

    try:
        distributed.launch(_rank_run, rc.nproc, rc, algo_config, task_options)
    except mp.ProcessRaisedException as exc:  # its message ends with the rank's traceback's last line
        last = next((line for line in reversed(str(exc).splitlines()) if line.strip()), "")
        for error in (UsageError, TrainingFailed):
            prefix = f"{error.__module__}.{error.__name__}: "
            if last.startswith(prefix):
                raise error(last[len(prefix):]) from None
        if any(sign in last for sign in PEER_LOST):  # this rank only saw another one stop: which one is not known
            raise TrainingFailed(f"{rc.algo} on {rc.task}: rank {exc.error_index} of {rc.nproc} lost its peer (another "
                                 f"rank stopped first): {last}") from None
        raise TrainingFailed(f"{rc.algo} on {rc.task}: rank {exc.error_index} of {rc.nproc} failed: {last}") from None
    except mp.ProcessExitedException as exc:  # killed (a signal, the kernel's OOM killer)
        raise TrainingFailed(f"{rc.algo} on {rc.task}: rank {exc.error_index} of {rc.nproc} exited with status "
                             f"{exc.exit_code}") from None


def _finished(summary: dict, rc: RunConfig) -> bool:
    if rc.budget is not None and summary.get("completions_generated", 0) >= rc.budget:
        return True
    return summary.get("steps") == rc.steps


@dataclasses.dataclass
class _Progress:
    """Where a run stands: its last step, its training seconds, the completions it generated, the evaluation
    before training and the per-question records so far."""

    step: int
    elapsed: float
    before: Optional[dict]
    questions: dict
    generated: float = 0.0


def _train_and_record(out: Path, rc: RunConfig, task: Task, policy, algo: Algorithm, resolved: dict,
                      previous: Optional[dict], on_step, progress: bool) -> dict:
    """Train from the newest checkpoint (or from step 0, after the evaluation before training) to ``rc.steps`` or
    the budget: each step's row appended to metrics.jsonl, evaluations and checkpoints when due, then the
    evaluation after training and summary.json (a failed run's summary says so)."""
    _record_settings(out, resolved, previous)
    prompt_rng = random.Random(training_seed(rc))
    measure.reset_peak_memory(algo.device)
    at = _starting_point(out, rc, task, policy, algo, prompt_rng)
    trackers = tracking.start(rc, out, resolved)
    bar = progress_bar(rc.steps, initial=at.step, desc=f"{rc.task}/{rc.algo} seed {rc.seed}", unit="step",
                       enabled=progress)
    left = (lambda: rc.budget - int(at.generated)) if rc.budget is not None else None
    steps = train_steps(algo, task, prompt_rng, range(at.step + 1, rc.steps + 1), left)
    try:
        for step, metrics, seconds in steps:
            row, spent = _advance(at, rc, task, policy, step, metrics, seconds, algo.generates_more())
            with _writing(out / "metrics.jsonl", "step's metrics"):
                append_jsonl(out / "metrics.jsonl", row)
            trackers.log(row)
            bar.update(1)
            bar.set_postfix({"reward": f"{metrics.get('reward/mean', float('nan')):.3f}", "loss": f"{metrics.get('loss', 0.0):.4f}"})
            if on_step:
                on_step(row)
            if spent:
                break  # every generated completion counts, discarded ones included: equal samples
            if rc.checkpoint_every and step % rc.checkpoint_every == 0 and step != rc.steps:
                _save_checkpoint(out, step, _checkpoint(at, policy, algo, prompt_rng))
    except TrainingFailed as exc:
        _write_summary(out, rc, resolved, at.before, None, at.elapsed, at.step, algo, status="failed", error=str(exc),
                       questions=at.questions)
        raise TrainingFailed(f"{rc.algo} on {rc.task}: {exc}") from None
    finally:
        bar.close()
        trackers.finish()
    return _finish(out, rc, task, policy, algo, resolved, at)


def _check_ranks_finished(algo: Algorithm, step: int) -> None:
    """Under data parallelism a run is complete only when every rank finished every step: the ranks compare their
    last steps (a rank that died fails this collective, and with it the run) before any summary says complete."""
    dp = algo.data_parallel
    if dp is None:
        return
    steps = dp.gather(torch.tensor([step], dtype=torch.int64, device=algo.device)).tolist()
    if any(s != step for s in steps):
        raise TrainingFailed(f"the ranks stopped at different steps ({', '.join(map(str, steps))}); "
                             "the run is not complete")


def _record_settings(out: Path, resolved: dict, previous: Optional[dict]) -> None:
    """config.json with the resolved settings (a resumed run's with what each session changed); any summary.json
    goes, since a summary only ever describes a finished run."""
    if previous:
        changed = {k: [previous["settings"].get(k), v] for k, v in resolved["settings"].items()
                   if previous["settings"].get(k) != v}
        resolved["resumed"] = previous.get("resumed", []) + [{"changed": changed}]
    (out / "summary.json").unlink(missing_ok=True)
    with _writing(out / "config.json", "run's settings"):
        atomic_write_json(out / "config.json", resolved)


def _starting_point(out: Path, rc: RunConfig, task: Task, policy, algo: Algorithm, prompt_rng: random.Random) -> _Progress:
    """With --resume and a checkpoint to resume from: its state restored and metrics.jsonl cut back to its step.
    Otherwise step 0: metrics.jsonl started afresh and the policy evaluated before training."""
    metrics_path = out / "metrics.jsonl"
    state = _newest_resumable_checkpoint(out, algo.device, read_jsonl(metrics_path)) if rc.resume else None
    if state is not None:
        policy.load_state_dict(state["policy"])
        algo.load_state_dict(state["algorithm"])
        torch.set_rng_state(state["torch_rng"])
        prompt_rng.setstate(state["prompt_rng"])
        # a checkpoint written before per-question records has none
        at = _Progress(state["step"], state["elapsed"], state["eval_before"], state.get("eval_questions", {}))
        rewrite_jsonl(metrics_path, [r for r in read_jsonl(metrics_path) if r.get("step", 0) <= at.step])
    else:
        if rc.resume:
            tqdm.write(f"no resumable checkpoint in {out}: starting from step 0", file=sys.stderr)
        metrics_path.unlink(missing_ok=True)
        before, record = _evaluate(task, policy, rc.seed)
        at = _Progress(0, 0.0, before, {"before": record} if record else {})
        _pass_at_k(rc, task, policy, before, at.questions, "before")
    at.generated = sum(r.get("completions", 0.0) for r in read_jsonl(metrics_path))
    return at


def _advance(at: _Progress, rc: RunConfig, task: Task, policy, step: int, metrics: dict, seconds: float,
             samples_more: bool) -> tuple[dict, bool]:
    """``at`` moved past ``step``: the step's metrics row (with the evaluation's, when one is due before the last
    step: the evaluation after training is the last one), and whether the sample budget ends the run here (it is
    spent and the next step samples: ``samples_more``)."""
    at.step = step
    generated_before, at.generated = at.generated, at.generated + metrics.get("completions", 0.0)
    spent = rc.budget is not None and at.generated >= rc.budget and samples_more
    at.elapsed += seconds
    row = {"step": step, **metrics, "time/step": seconds, "time/wall": at.elapsed}
    last = step == rc.steps or spent
    if _evaluation_due(rc, step, generated_before, at.generated) and not last:
        during, record = _evaluate(task, policy, rc.seed)
        row.update({f"eval/{k}": v for k, v in during.items()}, **record)
    return row, spent


def _checkpoint(at: _Progress, policy, algo: Algorithm, prompt_rng: random.Random) -> dict:
    """Everything a resumed run continues from: the step, the policy, the algorithm's state and both RNGs."""
    return {"step": at.step, "elapsed": at.elapsed, "eval_before": at.before, "eval_questions": at.questions,
            "policy": policy.state_dict(), "algorithm": algo.state_dict(), "torch_rng": torch.get_rng_state(),
            "prompt_rng": prompt_rng.getstate()}


def _finish(out: Path, rc: RunConfig, task: Task, policy, algo: Algorithm, resolved: dict, at: _Progress) -> dict:
    """The evaluation after training, the model saved where asked, and the complete run's summary."""
    after, record = _evaluate(task, policy, rc.seed)
    if record:
        at.questions["after"] = record
    _pass_at_k(rc, task, policy, after, at.questions, "after")
    if rc.save_model:
        policy.save_pretrained(out / "final")
        task.tokenizer.save_pretrained(out / "final")
    _check_ranks_finished(algo, at.step)  # the last thing before "complete": every rank got this far
    return _write_summary(out, rc, resolved, at.before, after, at.elapsed, at.step, algo, status="complete",
                          questions=at.questions)


def _write_summary(out: Path, rc: RunConfig, resolved: dict, before: dict, after: Optional[dict], elapsed: float,
                   steps_done: int, algo: Algorithm, *, status: str, error: Optional[str] = None,
                   questions: Optional[dict] = None) -> dict:
    rows = read_jsonl(out / "metrics.jsonl")
    phases = sorted({k for r in rows for k in r if k.startswith("time/") and k not in ("time/step", "time/wall", CPU_TIME)})
    cpu = [r[CPU_TIME] for r in rows if CPU_TIME in r]
    tokens = sum(r.get("tokens/generated", 0.0) for r in rows)
    gen_time = sum(r.get("time/generate", 0.0) for r in rows)
    device = algo.device
    summary = {
        "task": rc.task,
        "algo": rc.algo,
        "variant": resolved["algo_config"],
        "seed": rc.seed,
        "device": str(device),
        "device_name": resolved["environment"]["device_name"],
        "versions": resolved["environment"]["versions"],
        "precision": resolved["precision"],
        "status": status,
        "error": error,
        "steps": steps_done,
        "completions_generated": sum(r.get("completions", 0.0) for r in rows),
        "tokens_generated": tokens,
        "tokens_per_second": tokens / gen_time if gen_time > 0 else None,
        "wall_clock_s": elapsed,
        # the steps' CPU seconds, every thread's (None where a step predates the record): core-seconds, with no pause in
        "training_cpu_s": sum(cpu) if cpu and len(cpu) == len(rows) else None,
        "time_per_step_s": elapsed / steps_done if steps_done else None,
        "phase_seconds": {p[len("time/"):]: sum(r.get(p, 0.0) for r in rows) for p in phases},
        "peak_memory_bytes": measure.peak_memory_bytes(device),
        "peak_memory_kind": measure.peak_memory_kind(device),
        **measure.training_state_bytes(algo.trainable_modules(), algo.optimizers()),
        "trainable_param_bytes": sum(p.numel() * p.element_size() for m in algo.trainable_modules()
                                     for p in m.parameters() if p.requires_grad),
        **{f"{k}_before": v for k, v in before.items()},
        **({f"{k}_after": v for k, v in after.items()} if after else {}),
        **({"eval_questions": questions} if questions else {}),  # before / after: per-question records (io.encode_correct)
        "config": resolved,
    }
    with _writing(out / "summary.json", "summary"):
        atomic_write_json(out / "summary.json", summary)
    return summary
