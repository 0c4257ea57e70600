"""The reference checks' one engine: a configuration of ours against a reference framework's counterpart, run and
judged the same way whichever framework it is, and the case modules that supply the configurations.

A ``Config`` names one comparison (framework, group, our function, theirs, knobs, the case it runs on) and holds
``compare(fixture) -> Comparison``: both sides' values and, for a loss, both sides' gradients. The engine measures
the largest difference of each (``max_diff``; the gradient's relative to the reference's largest entry where the
tolerance says so) and judges it by the configuration's ``Tolerance``. A configuration may

- differ by design (``by_design``: the reason): its row says so when the difference shows, and a configuration
  beside it, ours with the matching knob, must agree;
- be skipped (``skip``: the reason): a combination one side refuses, counted and not compared.

A comparison that raises is a failed row with the error, never a crashed check (but a UsageError: a framework that
is not installed stops the check with its one line). The fixtures a comparison runs on (a float64 batch, a model
and its TRL trainer's folder) are built once per run for every configuration that names the same ``Fixture``.

A ``Plant`` is an error planted in our code for the length of one re-run: the agreeing configurations of its
groups run again under it, and at least one must fail (``run_plant``).

Each reference framework has one case module (benchmarks/checks/cases/), a ``CaseModule`` registered by name with
``@register_cases`` as algorithms, studies and adapters are: its name is its adapter's (so its rows count in that
adapter's column of the feature table, benchmarks/references/features.py), and ``check`` says which
``grpo-bench check`` runs it. ``check references`` and ``check trl`` are two views of this engine
(benchmarks/checks/references.py, trl.py): each picks its case modules, runs their configurations here and writes
its files with ``csv_text``.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional, Sequence

import torch

from algorithms.registry import register_named
from benchmarks.errors import UsageError
from benchmarks.references.adapters import Adapter, register_adapter

AGREES, FAILS, SKIPPED = "agrees", "FAILS", "skipped"
BY_DESIGN, BY_DESIGN_AGREES = "differs by design", "by design, agrees here"


# --------------------------------------------------------------------------------------------
# A configuration, what its comparison returns, and when that agrees
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tolerance:
    """When a comparison agrees: the value's largest difference within ``value``, the gradient's within ``grad``
    (default: ``value``). ``scaled``: both bounds times max(1, the reference's largest magnitude, value or gradient).
    ``relative_grad``: the gradient's difference is max|g_ours - g_theirs| / max|g_theirs| (over all of a model's
    parameters, where an entry-wise relative error is undefined near 0)."""

    value: float
    grad: Optional[float] = None
    scaled: bool = False
    relative_grad: bool = False

    def within(self, value_diff: float, grad_diff: Optional[float], scale: float, also: float = 0.0) -> bool:
        factor = max(1.0, scale) if self.scaled else 1.0
        value_limit = self.value * factor
        grad_limit = (self.value if self.grad is None else self.grad) * factor
        return value_diff <= value_limit and also <= value_limit and (grad_diff is None or grad_diff <= grad_limit)


@dataclass
class Comparison:
    """Both sides of one configuration: values (a scalar loss, per-token values, advantages) and, for a loss, the
    gradients of ours and theirs with respect to the same inputs."""

    ours: torch.Tensor
    theirs: torch.Tensor
    grad_ours: Optional[torch.Tensor] = None
    grad_theirs: Optional[torch.Tensor] = None
    shown: tuple[float, float] = (math.nan, math.nan)  # what a report prints for ours and theirs
    also: float = 0.0  # a further difference the value bound holds (the entropies beside a forward's log-probs)
    note: str = ""  # what the row's name adds after the run ("entropy max diff 1e-07")


@dataclass(frozen=True)
class Fixture:
    """What comparisons run on, built once per run: ``build(*args)``, entered when it is a context manager."""

    build: Callable[..., Any]
    args: tuple = ()

    def open(self, stack: contextlib.ExitStack):
        value = self.build(*self.args)
        return stack.enter_context(value) if isinstance(value, contextlib.AbstractContextManager) else value


@dataclass
class Config:
    framework: str  # its case module's (and adapter's) name
    group: str  # what kind of function: policy_loss, estimator, gae, ..., grpo_loss, dpo_loss; plants pick by it
    function: str  # our name (a registry name, or the losses.py function)
    theirs: str  # the framework's name
    knobs: str  # "epsilon=0.2, epsilon_high=0.28", ...
    case: str  # the batch
    seed: int
    compare: Callable[[Any], Comparison] = field(repr=False)
    tolerance: Tolerance = field(repr=False)
    fixture: Fixture = field(repr=False)
    by_design: Optional[str] = None  # the reason the framework differs here, or None: it must agree
    skip: Optional[str] = None  # the reason it is not compared, or None
    family: str = ""  # the option it exercises, for a report's counts

    @property
    def name(self) -> str:
        return f"{self.framework}:{self.group}:{self.function}[{self.knobs}]@{self.case}/{self.seed}"


@dataclass
class Row:
    framework: str
    group: str
    function: str
    theirs: str
    knobs: str
    case: str
    seed: int
    expected: str  # "agree", "differs by design" or "skipped"
    value_diff: float
    grad_diff: Optional[float]
    scale: float
    status: str  # AGREES, FAILS, BY_DESIGN, BY_DESIGN_AGREES or SKIPPED
    reason: str = ""  # why it differs by design, or why it is skipped
    error: str = ""
    family: str = ""
    ours_value: float = math.nan  # Comparison.shown
    theirs_value: float = math.nan
    note: str = ""


# --------------------------------------------------------------------------------------------
# Measuring and judging
# --------------------------------------------------------------------------------------------


def max_diff(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    """Largest absolute difference; NaNs in the same places are equal, elsewhere infinitely apart."""
    ours, theirs = ours.detach(), theirs.detach()
    if ours.shape != theirs.shape:
        try:
            ours, theirs = torch.broadcast_tensors(ours, theirs)
        except RuntimeError:
            return math.inf
    nan_o, nan_t = torch.isnan(ours), torch.isnan(theirs)
    if (nan_o != nan_t).any():
        return math.inf
    diff = (ours - theirs).abs().masked_fill(nan_o, 0.0)
    return float(diff.max()) if diff.numel() else 0.0


def relative_diff(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    """max|ours - theirs| / max|theirs|: a gradient over all of a model's parameters."""
    return float((ours - theirs).abs().max() / theirs.abs().max().clamp(min=1e-30))


def _largest(x: Optional[torch.Tensor]) -> float:
    if x is None or not x.numel():
        return 0.0
    return float(x.detach().abs().nan_to_num(0.0).max())


def _labels(config: Config) -> dict:
    expected = "skipped" if config.skip else "agree" if config.by_design is None else BY_DESIGN
    return dict(framework=config.framework, group=config.group, function=config.function, theirs=config.theirs,
                knobs=config.knobs, case=config.case, seed=config.seed, expected=expected,
                reason=config.skip or config.by_design or "", family=config.family)


def _judged(config: Config, c: Comparison) -> Row:
    scale = max(_largest(c.theirs), _largest(c.grad_theirs))
    grad_diff = None
    if c.grad_ours is not None:
        grad_diff = (relative_diff if config.tolerance.relative_grad else max_diff)(c.grad_ours, c.grad_theirs)
    value_diff = max_diff(c.ours, c.theirs)
    within = config.tolerance.within(value_diff, grad_diff, scale, c.also)
    if config.by_design is None:
        status = AGREES if within else FAILS
    else:
        status = BY_DESIGN_AGREES if within else BY_DESIGN
    return Row(**_labels(config), value_diff=value_diff, grad_diff=grad_diff, scale=scale, status=status,
               ours_value=c.shown[0], theirs_value=c.shown[1], note=c.note)


def run_config(config: Config, fixture: Any) -> Row:
    """One configuration's row: skipped, or its comparison on ``fixture`` measured and judged."""
    if config.skip:
        return Row(**_labels(config), value_diff=math.nan, grad_diff=None, scale=math.nan, status=SKIPPED)
    try:
        comparison = config.compare(fixture)
    except UsageError:
        raise
    except Exception as exc:  # noqa: BLE001  a crash of either side is a failed row, not a crashed check
        return Row(**_labels(config), value_diff=math.inf, grad_diff=None, scale=1.0, status=FAILS,
                   error=f"{type(exc).__name__}: {exc}".splitlines()[0][:200])
    return _judged(config, comparison)


def run_configs(configs: Iterable[Config], progress: Optional[Callable[[Row], None]] = None) -> list[Row]:
    """Every configuration's row, in order; each fixture built when a configuration first names it, and closed at
    the end."""
    rows = []
    with contextlib.ExitStack() as stack:
        fixtures: dict[Fixture, Any] = {}
        for config in configs:
            if config.fixture not in fixtures:
                fixtures[config.fixture] = config.fixture.open(stack)
            rows.append(run_config(config, fixtures[config.fixture]))
            if progress:
                progress(rows[-1])
    return rows


# --------------------------------------------------------------------------------------------
# Planted errors: our code perturbed in place for one re-run; each must make an agreeing row fail
# --------------------------------------------------------------------------------------------


@contextlib.contextmanager
def patched(target, name: str, value, *, item: bool = False):
    """``target.name = value`` (``target[name]`` with ``item``) for the block, then the original back."""
    old = target[name] if item else getattr(target, name)
    if item:
        target[name] = value
    else:
        setattr(target, name, value)
    try:
        yield
    finally:
        if item:
            target[name] = old
        else:
            setattr(target, name, old)


def together(*managers: Callable[[], contextlib.AbstractContextManager]):
    """One plant's patch made of several (a function and its copy under another name)."""

    @contextlib.contextmanager
    def all_of():
        with contextlib.ExitStack() as stack:
            for manager in managers:
                stack.enter_context(manager())
            yield

    return all_of


@dataclass(frozen=True)
class Plant:
    name: str
    what: str
    groups: tuple[str, ...]  # the config groups re-run under it
    patch: Callable[[], contextlib.AbstractContextManager]
    functions: tuple[str, ...] = ()  # of those, only the rows of these functions (a member few frameworks compare)


@dataclass
class PlantResult:
    name: str
    what: str
    rows: int  # agreeing rows re-run
    failed: int  # of those, rows that failed under the plant
    example: str  # one failed row

    @property
    def caught(self) -> bool:
        return self.failed > 0

    @property
    def missed(self) -> bool:
        """Re-run rows all agreed (a plant whose functions no chosen framework or case compares is not missed)."""
        return self.rows > 0 and self.failed == 0

    @property
    def verdict(self) -> str:
        return "yes" if self.caught else "NO" if self.missed else "not exercised (no rows)"


def short(x: Optional[float]) -> str:
    """A difference in a table: 1 significant digit and its exponent, 0, inf or "-"."""
    if x is None:
        return "-"
    if not math.isfinite(x):
        return "inf"
    return "0" if x == 0 else f"{x:.1e}"


def run_plant(plant: Plant, configs: list[Config], baseline: Optional[list[Row]] = None) -> PlantResult:
    """Re-run under ``plant`` the configurations of its groups that must agree (and, given the unplanted
    ``baseline`` rows, do): the plant is caught when one of them fails."""
    agreeing = None if baseline is None else {id(c) for c, r in zip(configs, baseline) if r.status == AGREES}
    chosen = [c for c in configs if c.by_design is None and not c.skip and c.group in plant.groups
              and (not plant.functions or c.function in plant.functions) and (agreeing is None or id(c) in agreeing)]
    with plant.patch():
        rows = run_configs(chosen)
    failed = [(c, r) for c, r in zip(chosen, rows) if r.status == FAILS]
    example = ""
    if failed:
        c, r = max(failed, key=lambda cr: cr[1].value_diff if math.isfinite(cr[1].value_diff) else 1e300)
        example = f"{c.framework} {c.function} [{c.knobs}] on {c.case}: value diff {short(r.value_diff)}"
    return PlantResult(plant.name, plant.what, len(chosen), len(failed), example)


# --------------------------------------------------------------------------------------------
# Case modules: one per reference framework, registered by name
# --------------------------------------------------------------------------------------------


class CaseModule:
    """A reference framework's configurations: a subclass names its ``adapter`` (whose name it takes), the check
    that runs it, its planted errors, and builds its configurations in ``configs``."""

    name: str
    adapter: type[Adapter]
    check: str  # the `grpo-bench check` command that runs it: "references" or "trl"
    plants: tuple[Plant, ...] = ()

    def configs(self, cases: Sequence[str]) -> list[Config]:
        """Its configurations on ``cases`` (the batches; a case module with one fixed batch ignores them)."""
        raise NotImplementedError

    def prepare(self, fetch: bool, log=print) -> None:
        """Make the framework importable (``fetch``: download it first), or raise its one-line UsageError."""


# Filled by ``register_cases`` as the case modules are imported (benchmarks/checks/cases/__init__.py imports the
# built-in ones); keyed by name.
CASE_MODULES: dict[str, type[CaseModule]] = {}


def register_cases(cls: type[CaseModule]) -> type[CaseModule]:
    """Class decorator: ``CASE_MODULES[cls.name] = cls``, and its adapter registered (so it is a column of the
    feature table). A second, different class under a taken name is refused, as is a name that is not its
    adapter's."""
    if not (isinstance(cls, type) and issubclass(cls, CaseModule)):
        raise TypeError(f"{cls!r} is not a subclass of benchmarks.checks.engine.CaseModule")
    if cls.name != cls.adapter.name:
        raise ValueError(f"case module {cls.__qualname__} is named {cls.name!r} but checks the adapter "
                         f"{cls.adapter.name!r}: a case module takes its adapter's name")
    register_named(CASE_MODULES, "reference case module", cls.name, cls)
    register_adapter(cls.adapter)
    return cls


def case_modules(check: str) -> dict[str, type[CaseModule]]:
    """The case modules that ``grpo-bench check CHECK`` runs, in the order they registered."""
    return {name: cls for name, cls in CASE_MODULES.items() if cls.check == check}


# --------------------------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Column:
    """A CSV column: its header and its cell's text; ``quoted``: always in double quotes (else only where needed)."""

    name: str
    text: Callable[[Any], str]
    quoted: bool = False


def _quote(text: str, always: bool) -> str:
    if always or any(ch in text for ch in ',"\r\n'):
        return '"' + text.replace('"', '""') + '"'
    return text


def csv_text(columns: Sequence[Column], records: Iterable[Any]) -> str:
    """A CSV file's text: a header line, then one line per record."""
    lines = [",".join(c.name for c in columns)]
    lines += [",".join(_quote(c.text(r), c.quoted) for c in columns) for r in records]
    return "\n".join(lines) + "\n"
