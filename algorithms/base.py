"""The one interface every algorithm implements, and the pieces they all share.

An algorithm is built from (policy, reference policy, task, config) and exposes ``step(prompts)``,
one training step returning a flat dict of metrics in the shared vocabulary (``train_step``, the skeleton below, returns
them; ``step`` adds the phase timings, ``time/<phase>``):

    reward/mean reward/std loss clipfrac entropy grad_norm
    advantage/mean advantage/std tokens/generated completions truncated
    time/generate time/score time/logprobs time/update

and the loss by its parts, each as it enters the loss (weighted, aggregated as the loss is), so that they add up
to ``loss``: ``loss/policy`` (the policy-gradient term), ``loss/kl`` (the KL penalty, where it sits in the loss;
where it sits in the reward instead, as in RLOO and PPO, it is inside the advantages and has no part),
``loss/entropy`` (the entropy bonus, negative; where on), ``loss/value`` (a critic's). The KL to the reference is
logged under its estimator's name: ``kl/k3`` for every algorithm with a reference (the same diagnostic everywhere:
mean per completion, then over completions), and ``kl/<estimator>`` beside it for the estimator the algorithm
itself uses in its loss or reward when that is another (``kl_estimate``).

Every step is numbered the same way: 1 generate, 2 score, 3 reference/old log-probs,
4 advantages, 5 update(s), 6 metrics. ``Algorithm.train_step`` is that skeleton, written once: steps 1-3 and 6 are
shared (one completion mask, one reference pass, one metric bookkeeping, ``StepLog``), and an algorithm holds only
its difference, ``learn`` (steps 4 and 5), and where it must, the hooks around it (DPO's pairs). The training loop,
evaluation, checkpoints and memory measurement live in the harness (benchmarks/harness/loop.py), never here.

One name per concept inside the code, whatever a setting is called: ``group_size`` (G, completions per prompt),
``kl_coef`` (the KL term's weight), ``rewards`` (the task's, one per completion; ``token_rewards`` once shaped per
token). Settings keep the names runs recorded them under (``samples_per_prompt``, RLOO's and REINFORCE's ``beta``):
their configs read them under the one name.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections import defaultdict
import typing
from dataclasses import MISSING, Field, dataclass, field, fields
from typing import Any, Callable, Optional

import torch

from algorithms import fast_llama, rollout as rollout_lib
from algorithms.diagnostics import batch_diagnostics
from algorithms.kl import kl_estimate
from algorithms.losses import masked_mean, masked_mean_per_sequence
from algorithms.registry import register_named


FUSED_ADAMW_DEVICES = ("cpu", "cuda")
# The output layer's precision under bf16 autocast: "same" (bf16, autocast's cast) or "fp32" (ScaleRL's fp32 LM head).
LOGITS_PRECISIONS = ("same", "fp32")


@dataclass
class AlgoConfig:
    """Settings every algorithm has. Subclasses add their own fields, each with a one-line doc."""

    learning_rate: Optional[float] = field(default=None, metadata={"help": "AdamW learning rate (default: the task's recommended rate)"})
    prompts_per_step: int = field(default=4, metadata={"help": "prompts sampled per training step"})
    max_grad_norm: float = field(default=1.0, metadata={"help": "clip the gradient's global norm to this (0: off)"})
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay"})

    def validate(self) -> None:
        """Raise ValueError naming the field for impossible settings."""
        for name, value in self.settings().items():
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value}")
        if self.learning_rate is None or self.learning_rate <= 0:
            raise ValueError(f"learning_rate must be > 0, got {self.learning_rate}")
        if self.prompts_per_step < 1:
            raise ValueError(f"prompts_per_step must be >= 1, got {self.prompts_per_step}")
        if self.max_grad_norm < 0:
            raise ValueError(f"max_grad_norm must be >= 0, got {self.max_grad_norm}")

    def completions_per_step(self) -> int:
        """Completions generated per step: the unit of the matrix's sample budget."""
        return self.prompts_per_step

    def completions_per_step_vary(self) -> bool:
        """Whether a step may generate more than ``completions_per_step`` (re-sampling): such a variant is
        evaluated by completion count, since its steps fall at other counts than its rivals'."""
        return False

    def settings(self) -> dict[str, Any]:
        """The flat settings, as a run records them and a matrix cell or a flag names them: every field, with an
        option group's values in place of the field that holds them."""
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            out.update(value if "option_group" in f.metadata else {f.name: value})
        return out


@dataclass(frozen=True)
class OptionGroup:
    """Settings a config takes on behalf of the members of a registry (GRPO: each registered policy loss's and
    advantage estimator's own options, one group each), named and typed by the members' ``Options`` dataclasses and
    held flat in one dict field of the config whose metadata carries this group (``option_group``): a flag, a config
    key or a matrix key like the config's own fields, so a plug-in member's options are settings too. ``selector`` is
    the field that picks the member; ``members`` a live view, member name -> its Options class."""

    selector: str
    members: Callable[[], dict[str, type]]

    def fields(self) -> dict[str, Field]:
        return {f.name: f for options in self.members().values() for f in fields(options)}

    def types(self) -> dict[str, Any]:
        return {name: hint for options in self.members().values() for name, hint in typing.get_type_hints(options).items()}

    def defaults(self) -> dict[str, Any]:
        return {name: f.default if f.default is not MISSING else f.default_factory() for name, f in self.fields().items()}

    def owners(self, name: str) -> list[str]:
        """The members that take the option ``name``."""
        return [member for member, options in self.members().items() if name in {f.name for f in fields(options)}]


def init_config(config, settings: dict[str, Any]) -> None:
    """The ``__init__`` of a config with an option group: each field from ``settings`` or its default, the group's
    field from the group's names (a dict under the field's own name, as ``dataclasses.replace`` passes it, first)."""
    settings = dict(settings)
    for f in fields(config):
        group = f.metadata.get("option_group")
        if group is not None:
            value = {**group.defaults(), **settings.pop(f.name, {})}
            value.update({name: settings.pop(name) for name in list(settings) if name in value})
        elif f.name in settings:
            value = settings.pop(f.name)
        else:
            value = f.default if f.default is not MISSING else f.default_factory()
        setattr(config, f.name, value)
    if settings:
        raise TypeError(f"{type(config).__name__}() got an unexpected keyword argument {next(iter(settings))!r}")


def option_groups(config_cls) -> list[OptionGroup]:
    """The option groups of a config (GRPO's: the policy losses' and the advantage estimators')."""
    return [f.metadata["option_group"] for f in fields(config_cls) if "option_group" in f.metadata]


def config_fields(config_cls) -> dict[str, Field]:
    """Every setting a config class takes, by name: its fields, with an option group's fields in place of the field
    that holds them."""
    out, holder = {}, {}
    for f in fields(config_cls):
        group = f.metadata.get("option_group")
        for name, field_ in (group.fields() if group is not None else {f.name: f}).items():
            if name in out:  # one flat name, two meanings: which one a flag or a matrix key sets would be a guess
                raise TypeError(f"{config_cls.__name__}: the setting {name!r} is declared by both {holder[name]} and "
                                f"{f.name}; an option needs a name of its own")
            out[name], holder[name] = field_, f.name
    return out


def config_field_types(config_cls) -> dict[str, Any]:
    """The type of every setting of ``config_fields``, Optional[...] unwrapped (bool, int, float, str)."""
    hints = typing.get_type_hints(config_cls)
    for group in option_groups(config_cls):
        hints.update(group.types())
    out = {}
    for name in config_fields(config_cls):
        args = [a for a in typing.get_args(hints.get(name, str)) if a is not type(None)]
        out[name] = args[0] if args else hints.get(name, str)
    return out


# Filled by ``register_algorithm`` at each algorithm's definition and, for installed plug-ins, by the
# entry-point group ``grpo_bench.algorithms`` (benchmarks/plugins.py).
ALGORITHMS: dict[str, type["Algorithm"]] = {}


def register_algorithm(cls=None, *, name: Optional[str] = None):
    """Class decorator: ``ALGORITHMS[name or cls.name] = cls``. A second, different class under a taken
    name is refused (re-registering the same class is a no-op, so a module may be imported twice)."""

    def register(cls):
        if not (isinstance(cls, type) and issubclass(cls, Algorithm)):
            raise TypeError(f"{cls!r} is not a subclass of algorithms.Algorithm")
        return register_named(ALGORITHMS, "algorithm", name or cls.name, cls)

    return register if cls is None else register(cls)


def algorithm_class(name: str) -> type["Algorithm"]:
    """The registered algorithm ``name``, or ValueError listing the choices."""
    try:
        return ALGORITHMS[name]
    except KeyError:
        raise ValueError(f"unknown algorithm {name!r}; choose from {', '.join(sorted(ALGORITHMS))}") from None


class PhaseTimer:
    """Wall-clock per named phase; synchronises CUDA so asynchronous kernels are counted where they run."""

    def __init__(self, device: torch.device):
        self.device = device
        self.totals: dict[str, float] = defaultdict(float)

    @contextlib.contextmanager
    def __call__(self, phase: str):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        start = time.perf_counter()
        try:
            yield
        finally:
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            self.totals[phase] += time.perf_counter() - start

    def pop(self) -> dict[str, float]:
        out = {f"time/{k}": v for k, v in self.totals.items()}
        self.totals.clear()
        return out


@dataclass
class Batch:
    """One step's batch, filled in step by step. Steps 1-2: the ``rollout``, its ``rewards`` (B,) and the loss ``mask``
    (B, T) (float); 3: ``ref_logps`` (B, T), the reference's (None without a KL term); 4-5: the ``advantages`` ((B,) per
    completion or (B, T) per token), the policy's ``logps`` (B, T) of the batch as sampled, before any update, and
    their ``entropy`` (B, T) where the step logs it per completion. Step 6 reads it."""

    rollout: rollout_lib.Rollout
    rewards: Optional[torch.Tensor]
    mask: torch.Tensor
    ref_logps: Optional[torch.Tensor] = None
    advantages: Optional[torch.Tensor] = None
    logps: Optional[torch.Tensor] = None
    entropy: Optional[torch.Tensor] = None


class StepLog:
    """One step's metrics, kept one way by every algorithm: ``add_update`` records each update's values (loss parts,
    ``grad_norm``, ``clipfrac``, ``skipped_update``, ...), logged as their mean over the step's updates and, for the
    names in ``per_update``, each update's own as ``NAME/iterI``; ``add`` records a value of the whole step. ``loss``,
    unless recorded, is the sum of the recorded parts ``loss/*``: the parts add up to it."""

    def __init__(self, per_update: tuple[str, ...] = ()):
        self.per_update = per_update
        self.updates: dict[str, list[float]] = {}
        self.once: dict[str, float] = {}

    def add_update(self, values: dict[str, float]) -> None:
        for name, value in values.items():
            self.updates.setdefault(name, []).append(value)

    def add(self, values: dict[str, float]) -> None:
        self.once.update(values)

    def metrics(self) -> dict[str, float]:
        out = {}
        for name, values in self.updates.items():
            if name in self.per_update:
                out.update({f"{name}/iter{i}": value for i, value in enumerate(values, 1)})
            out[name] = sum(values) / len(values)
        if "loss" not in out:
            out["loss"] = sum(out[name] for name in self.updates if name.startswith("loss/"))
        return {**out, **self.once}


@dataclass
class Sampling:
    """How completions are sampled: identical for every algorithm on a task. How many per prompt is the
    algorithm's own setting (``group_size``), passed to ``Algorithm.generate``."""

    max_new_tokens: int
    temperature: float = 1.0


class Algorithm:
    """Base class: owns the optimizer, the timer, the sampling RNG and the shared step pieces."""

    name = "base"
    Config = AlgoConfig
    # The KL estimator the algorithm puts in its loss or reward, logged beside k3 (``kl_metrics``).
    kl_estimator = "k3"
    # Metrics of several updates per step logged per update too (NAME/iterI), beside their mean (StepLog).
    per_update_metrics: tuple[str, ...] = ()

    def __init__(self, policy, ref_policy, task, config: AlgoConfig, sampling: Sampling, *, seed: int = 0,
                 precision: str = "fp32", logits_precision: str = "same"):
        """``precision`` "bf16" runs forward passes under bf16 autocast; ``logits_precision`` "fp32" then keeps the
        output layer's product in fp32 (``fast_llama.fp32_head``: a policy ``fast_llama.llama_of`` serves)."""
        if logits_precision not in LOGITS_PRECISIONS:
            raise ValueError(f"logits_precision must be one of {', '.join(LOGITS_PRECISIONS)}, got {logits_precision!r}")
        if logits_precision == "fp32" and precision == "bf16" and fast_llama.llama_of(policy) is None:
            raise ValueError(f"logits_precision fp32 needs a Llama policy the lean forward serves; "
                             f"{type(policy).__name__} is not one")
        config.validate()
        self.policy, self.ref_policy, self.task, self.config = policy, ref_policy, task, config
        self.tokenizer = task.tokenizer
        self.sampling = sampling
        self.device = next(policy.parameters()).device
        self.timer = PhaseTimer(self.device)
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        self.precision, self.logits_precision = precision, logits_precision
        self.optimizer = self.make_optimizer(policy.parameters(), config.learning_rate)
        # Data parallelism (benchmarks/harness/distributed.py): None in one process. Anything with
        # average_gradients(params), sum(tensor), any(flag) and world_size; set through set_data_parallel.
        self.data_parallel = None
        # Completions the next step may generate in all, as the caller's sample budget leaves (None: no cap). A
        # step always generates its first round; only the extra rounds of a varying step (dynamic sampling) obey
        # it, so that no algorithm passes an equal-samples budget by more than one ordinary step.
        self.completions_allowed: Optional[int] = None

    def generates_more(self) -> bool:
        """Whether the next step samples completions: a sample budget that is spent ends the run only then (DPO
        that built its pairs up front from the budget's samples takes its planned steps over them)."""
        return True

    def set_data_parallel(self, data_parallel) -> None:
        """Train as one rank of ``data_parallel``: update() averages the gradients over the ranks before
        clipping, and global counts (``global_token_count``) span every rank's batch."""
        self.data_parallel = data_parallel

    @property
    def world_size(self) -> int:
        return self.data_parallel.world_size if self.data_parallel is not None else 1

    def global_token_count(self, mask: torch.Tensor) -> torch.Tensor:
        """Active tokens of the global batch (every rank's ``mask``): the one-process ``mask.sum()``."""
        count = mask.sum().to(torch.float32)
        return count if self.data_parallel is None else self.data_parallel.sum(count)

    def data_parallel_token_count(self, mask: torch.Tensor) -> Optional[torch.Tensor]:
        """The normaliser of a token mean over this rank's share (TRL's ``num_items_in_batch``): the global
        active-token count over the world size, since update() averages the ranks' gradients; None in one
        process (the mask's own count)."""
        return None if self.data_parallel is None else self.global_token_count(mask) / self.world_size

    def any_rank(self, flag: bool) -> bool:
        """``flag`` on any rank: ranks must agree whether to update, or the gradient all-reduce would hang."""
        return flag if self.data_parallel is None else self.data_parallel.any(flag)

    def on_global_batch(self, fn: Callable, *tensors: torch.Tensor):
        """``fn(*tensors)`` as one process computes it on the global batch: under data parallelism every rank's
        rows of each tensor (equal row counts; a (B, T) one right-padded to the widest T), then this rank's rows
        (and columns) of each result. For batch statistics (a whitening's mean and std): one rank's rows alone
        would give another update than the one process's."""
        if self.data_parallel is None:
            return fn(*tensors)
        dp = self.data_parallel
        out = fn(*(dp.gather(t) if t.dim() == 1 else dp.gather_padded(t) for t in tensors))
        rows = tensors[0].size(0)
        width = next((t.size(1) for t in tensors if t.dim() > 1), None)

        def mine(value: torch.Tensor) -> torch.Tensor:
            value = value[dp.rank * rows:(dp.rank + 1) * rows]
            return value[:, :width] if value.dim() > 1 and width is not None else value

        return tuple(mine(v) for v in out) if isinstance(out, tuple) else mine(out)

    def from_first_rank(self, value: torch.Tensor) -> torch.Tensor:
        """Rank 0's ``value`` on every rank (itself in one process): what every rank must draw alike."""
        if self.data_parallel is None:
            return value
        return self.data_parallel.sum(value if self.data_parallel.rank == 0 else torch.zeros_like(value))

    # --- the interface ---------------------------------------------------------------------------
    @classmethod
    def needs_reference(cls, config) -> bool:
        """Whether a frozen reference policy must be loaded for this config: its KL coefficient is above 0 (read
        under GRPO's setting's own name, ``beta``, where its config has no ``kl_coef``)."""
        return getattr(config, "kl_coef", getattr(config, "beta", 0.0)) > 0

    def step(self, prompts: list[str]) -> dict[str, float]:
        """One training step: ``train_step``'s metrics, then the seconds each phase of it took (``time/<phase>``)."""
        metrics = self.train_step(prompts)
        metrics.update(self.timer.pop())
        return metrics

    def train_step(self, prompts: list[str]) -> dict[str, float]:
        """Steps 1-6 of one training step (module docstring), returning its metrics without the timings: the
        skeleton every algorithm's step follows, each holding its difference in ``learn``."""
        batch = self.collect(prompts)  # 1 generate, 2 score
        batch.ref_logps = self.reference_logps(batch)  # 3 reference log-probs
        log = StepLog(self.per_update_metrics)
        self.learn(batch, log)  # 4 advantages, 5 update(s)
        return self.step_metrics(batch, log)  # 6 metrics

    def learn(self, batch: Batch, log: StepLog) -> None:
        """Steps 4 and 5, the algorithm's own: the advantages (or targets) into ``batch``, then the update(s), each
        recorded in ``log``; the policy's log-probs of the batch as sampled (and their entropy) into ``batch``."""
        raise NotImplementedError

    def trainable_modules(self) -> list[torch.nn.Module]:
        """Every module the optimizers update (the critic too), for memory accounting and checkpoints."""
        return [self.policy]

    def optimizers(self) -> list[torch.optim.Optimizer]:
        return [self.optimizer]

    def state_dict(self) -> dict:
        return {
            "optimizers": [o.state_dict() for o in self.optimizers()],
            "modules": [m.state_dict() for m in self.trainable_modules()[1:]],  # the policy is saved by the harness
            "generator": self.generator.get_state(),
        }

    def load_state_dict(self, state: dict) -> None:
        for opt, s in zip(self.optimizers(), state["optimizers"]):
            opt.load_state_dict(s)
        for module, s in zip(self.trainable_modules()[1:], state["modules"]):
            module.load_state_dict(s)
        self.generator.set_state(state["generator"])

    # --- the skeleton's shared steps ------------------------------------------------------------------
    def collect(self, prompts: list[str]) -> Batch:
        """Steps 1 and 2: ``group_size`` completions of each prompt, their rewards and the loss mask."""
        rollout = self.generate(prompts, self.config.group_size)
        rewards = self.score(rollout)
        return Batch(rollout, rewards, self.loss_mask(rollout))

    def loss_mask(self, rollout: rollout_lib.Rollout) -> torch.Tensor:
        """(B, T) float: the completion tokens the loss reads (the mask convention, algorithms/rollout.py), without
        the truncated completions where the config's ``mask_truncated`` asks."""
        return rollout.loss_mask(getattr(self.config, "mask_truncated", False)).float()

    def reference_logps(self, batch: Batch) -> Optional[torch.Tensor]:
        """Step 3: the frozen reference's log-probs of the batch (B, T), where a KL term reads them (None: none)."""
        return self.frozen_logps(self.ref_policy, batch.rollout) if self.needs_reference(self.config) else None

    def policy_logps(self, batch: Batch, iteration: int = 1) -> torch.Tensor:
        """The policy's log-probs (B, T) of the batch at update ``iteration`` on it. The first pass also fills in
        ``batch.logps`` (detached) and ``batch.entropy``: the batch as sampled. The old policy's log-probs need no pass
        of their own: until the first update the policy *is* the sampling policy."""
        if iteration > 1:
            return self.logps(self.policy, batch.rollout)
        logps, batch.entropy = self.logps(self.policy, batch.rollout, with_entropy=True)
        batch.logps = logps.detach()
        return logps

    def policy_update(self, loss: torch.Tensor, signal: bool) -> dict[str, float]:
        """One policy update, taken only where the batch carries a signal (``signal``, decided over every rank by
        ``any_rank``: AdamW's momentum would move the weights without one), as the step logs it."""
        return {"grad_norm": self.update(loss) if signal else 0.0, "skipped_update": float(not signal)}

    def step_metrics(self, batch: Batch, log: StepLog) -> dict[str, float]:
        """Step 6: the updates' metrics, the KL to the reference and the entropy of the batch as sampled, the
        rollout's and the advantages' metrics."""
        metrics = log.metrics()
        metrics.update(self.kl_metrics(batch.logps, batch.ref_logps, batch.mask, self.kl_estimator))
        if batch.entropy is not None:
            metrics["entropy"] = masked_mean_per_sequence(batch.entropy, batch.mask).mean().item()
        metrics.update(self.rollout_metrics(batch.rollout, batch.rewards))
        per_token = batch.advantages.dim() == 2
        metrics.update(self.advantage_metrics(batch.advantages, batch.mask if per_token else None))
        return metrics

    # --- shared pieces of a step -----------------------------------------------------------------
    def make_optimizer(self, params, lr: float) -> torch.optim.Optimizer:
        params = list(params)
        # torch's fused AdamW kernel: TRL's default too (transformers' adamw_torch_fused), and the fastest
        # here (one AdamW step, 2-core CPU: pizza 0.38 -> 0.11 ms, SmolLM2-135M 358 -> 75 ms, no more memory).
        fused = all(p.device.type in FUSED_ADAMW_DEVICES and p.is_floating_point() for p in params)
        return torch.optim.AdamW(params, lr=lr, weight_decay=self.config.weight_decay, fused=fused or None)

    def autocast(self):
        """bf16 autocast for forward passes when the run asked for it, the logits in fp32 inside it where asked;
        fp32 otherwise."""
        if self.precision != "bf16":
            return contextlib.nullcontext()
        stack = contextlib.ExitStack()
        stack.enter_context(torch.autocast(self.device.type, dtype=torch.bfloat16))
        if self.logits_precision == "fp32":
            stack.enter_context(fast_llama.fp32_head())
        return stack

    def generate(self, prompts: list[str], group_size: int) -> rollout_lib.Rollout:
        """``group_size`` completions of each prompt."""
        with self.timer("generate"), self.autocast():
            return rollout_lib.generate(
                self.policy, self.tokenizer, prompts, group_size,
                max_new_tokens=self.sampling.max_new_tokens, temperature=self.sampling.temperature,
                generator=self.generator,
            )

    def score(self, rollout: rollout_lib.Rollout) -> torch.Tensor:
        with self.timer("score"):
            rewards = self.task.score(rollout.prompts, rollout.completions)
        return torch.tensor(rewards, dtype=torch.float32, device=self.device)  # (B,)

    def logps(self, model, rollout: rollout_lib.Rollout, *, with_entropy: bool = False, entropy_grad: bool = False,
              with_sum_pi_squared: bool = False):
        with self.autocast():
            return rollout_lib.rollout_logps(model, rollout, temperature=self.sampling.temperature, with_entropy=with_entropy,
                                             entropy_grad=entropy_grad, with_sum_pi_squared=with_sum_pi_squared)

    def frozen_logps(self, model, rollout: rollout_lib.Rollout) -> torch.Tensor:
        """Log-probs that no gradient flows through (old, reference): computed in inference mode, returned
        as an ordinary tensor so the loss can use them. A ``model`` that stands for another model in some
        state (a LoRA policy with its adapter off) gives the module to run, in that state, from ``engaged()``."""
        engaged = getattr(model, "engaged", None)
        with self.timer("logprobs"):
            with torch.inference_mode(), (engaged() if engaged is not None else contextlib.nullcontext(model)) as module:
                logps = self.logps(module, rollout)
            return logps.clone()

    def update(self, loss: torch.Tensor, optimizer: Optional[torch.optim.Optimizer] = None, params=None) -> float:
        """Backward, (under data parallelism: average the gradients over the ranks,) clip, step.
        Returns the pre-clip global gradient norm."""
        optimizer = optimizer or self.optimizer
        if params is None:  # the optimizer's own list: walking the module tree costs 0.1 ms per update
            params = [p for group in optimizer.param_groups for p in group["params"]]
        params = list(params)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if self.data_parallel is not None:
            self.data_parallel.average_gradients(params)
        if self.config.max_grad_norm > 0:
            norm = torch.nn.utils.clip_grad_norm_(params, self.config.max_grad_norm)
        else:
            norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params if p.grad is not None]))
        optimizer.step()
        return float(norm)

    @staticmethod
    def kl_metrics(logps: torch.Tensor, ref_logps: Optional[torch.Tensor], mask: torch.Tensor,
                   used: Optional[str] = None) -> dict[str, float]:
        """``kl/k3`` (0 without a reference: no KL term) and, when the algorithm uses another estimator, ``kl/<used>``
        (``kl_estimate``), each averaged per completion, then over completions."""
        def mean(estimator: str) -> float:
            if ref_logps is None:
                return 0.0
            return masked_mean_per_sequence(kl_estimate(estimator, logps, ref_logps), mask).mean().item()

        return {"kl/k3": mean("k3"), **({f"kl/{used}": mean(used)} if used and used != "k3" else {})}

    @staticmethod
    def advantage_metrics(advantages: torch.Tensor, mask: Optional[torch.Tensor] = None) -> dict[str, float]:
        """``advantage/mean`` and ``advantage/std`` over every entry of ``advantages`` or, given a token ``mask``
        (advantages per token), over the active tokens; the std of a single value is 0."""
        values = advantages if mask is None else advantages[mask.bool()]
        mean = advantages.mean() if mask is None else masked_mean(advantages, mask)
        return {"advantage/mean": mean.item(), "advantage/std": values.std().item() if values.numel() > 1 else 0.0}

    @staticmethod
    def mean_over_updates(metrics: dict[str, float], updates: int, names=("loss", "grad_norm", "clipfrac")) -> None:
        """Each of ``names`` as the mean of its per-update values ``NAME/iterI`` (I = 1 .. ``updates``), where logged."""
        for name in names:
            values = [metrics[f"{name}/iter{i}"] for i in range(1, updates + 1) if f"{name}/iter{i}" in metrics]
            if values:
                metrics[name] = sum(values) / len(values)

    def rollout_metrics(self, rollout: rollout_lib.Rollout, rewards: torch.Tensor) -> dict[str, float]:
        return {
            "reward/mean": rewards.mean().item(),
            "reward/std": rewards.std().item() if rewards.numel() > 1 else 0.0,
            "tokens/generated": float(rollout.tokens_generated),
            "tokens/processed": float(rollout_lib.positions_processed(self.policy, rollout)),
            "completions": float(rollout.num_completions),
            "truncated": float(rollout.truncated.sum()),
            **batch_diagnostics(rollout, rewards, getattr(self.task, "success_threshold", None)),
        }
