"""``grpo-bench matrix FILE --out DIR``: every algorithm variant on every task and seed, at equal samples.

A matrix file (TOML) names tasks x algorithm variants x seeds and one budget in *generated
completions per cell*: a cell's step count is ``budget // completions_per_step`` of its algorithm's
config, so GRPO with mu = 2 or PPO with several epochs is compared with REINFORCE at equal samples
(wall-clock is measured beside it). A list value expands into one variant per element (lists in one
table form their product)::

    seeds = [0, 1, 2]
    budget = 2048            # generated completions per cell
    eval_every = 512         # completions between evaluations (0: before and after only)

    [tasks.pizza]            # keys: the task's options (as `grpo-bench run` takes them)
    [tasks.bandit]
    reward_mode = ["rm", "verifiable"]

    [algorithms.grpo]        # keys: fields of the algorithm's config
    level = ["token", "sequence"]
    mu = [1, 2]
    [algorithms.gspo]        # a named variant of a registered algorithm
    algo = "grpo"
    level = "sequence"

    [tasks.bandit.algorithms.gspo]   # an algorithm table's options on one task only (one value each)
    epsilon = 0.1

The whole file is validated before anything runs: an unknown key, task or algorithm, or an impossible
variant is one line ``FILE:LINE: ...`` and exit status 2. Every cell is resolved here, once, into the
full settings of its run (``Cell.settings``), which ``benchmarks.matrix.execute`` hands to an executor.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import re
import tomllib
import typing
from pathlib import Path
from typing import Any, Optional

from algorithms import ALGORITHMS
from algorithms.base import config_fields
from benchmarks.curve import PRIMARY_DEFAULT, START, evaluations_needed, parse_primary, pass_at
from benchmarks.errors import UsageError
from benchmarks.harness.config import field_type, flat_settings, resolve
from tasks import TASKS

# Top-level keys (the run settings every cell shares), with their meaning for the docs and errors.
RUN_KEYS = {
    "name": "a name for the report",
    "description": "one line for the report",
    "seeds": "list of seeds, one cell per seed",
    "budget": "generated completions per cell",
    "eval_every": "completions between evaluations (0: before and after only)",
    "checkpoint_every": "completions between checkpoints (0: none; a killed cell restarts from scratch)",
    "device": "auto, cpu or cuda",
    "precision": "auto, fp32 or bf16",
    "timeout_s": "seconds before a cell is stopped and recorded as failed (0: none)",
    "num_cpus": "CPU cores (torch threads) per cell; also settable per [tasks.X] / [algorithms.Y] table",
    "num_gpus": "GPUs per cell (Ray's num_gpus, may be a fraction); also settable per table",
    "order": "the order the cells run in: variant (default; each variant's seeds in turn) or seed (each seed's "
             "variants in turn, so cells of different variants run beside each other and at the same time of the "
             "session: what a cost ratio between variants wants)",
    "equivalent": "groups of variants that compute the same gradient (A/A controls): the report measures how often "
                  "its procedure separates them",
    "tuning": "[tuning]: seeds of its own and a grid of algorithm settings (learning_rate = [...]; "
              "[tuning.algorithms.Y] adds a table's own keys); each variant runs its evaluation seeds at the grid "
              "point with the highest mean primary metric ([analysis]) on the tuning seeds, evaluated on validation problems",
    "analysis": "[analysis], stated before the cells run: primary (the metric the verdicts and the tuning judge by: "
                "final, last_K or auc), margin (equivalence to the best within +-margin), target_mdd (optional: the "
                "minimum detectable difference the seeds were chosen for), section (optional: the heading its "
                "claims sit under in the claims report, e.g. \"2026\"), and [[analysis.claims]] (published claims "
                "this matrix tests, each a treatment variant against a control: grpo-bench claims)",
    "report": "[report], what the report shows beside its verdicts: metrics = [training metrics by name, e.g. "
              "\"mismatch/kl_v2\"], each a table column: per variant, the mean over seeds of each cell's mean over "
              "its steps",
    "tasks": "[tasks.NAME] tables",
    "algorithms": "[algorithms.NAME] tables",
}
# Run settings an [algorithms.Y] table may set besides its algorithm's options.
TABLE_RUN_KEYS = {"replicate": "an independent replicate (A/A twin) of another table's variant: its training draws "
                               "other random numbers while its evaluation keeps the seed's block (RunConfig.replicate)",
                  "precision": "this variant's precision (auto, fp32 or bf16), instead of the matrix's",
                  "logits_precision": "the output layer's product under bf16: same or fp32 (RunConfig.logits_precision)",
                  "pass_at_k": "pass@k before and after training for these k, e.g. \"1,16\" (RunConfig.pass_at_k; off)",
                  "pass_samples": "samples a question for pass_at_k, >= its largest k (default: that k)"}
# The values a string-valued run key of an [algorithms.Y] table takes (the others are integers >= 0).
TABLE_RUN_CHOICES = {"precision": ("auto", "fp32", "bf16"), "logits_precision": ("same", "fp32")}
TASK_RESERVED = {"budget": "override the budget for this task", "eval_every": "override eval_every for this task",
                 "algorithms": "[tasks.X.algorithms.Y]: options of algorithm table Y on this task only",
                 "task": "the registered task a table of another name runs (as algo = for [algorithms.Y]): two "
                         "settings of one task under two names, e.g. [tasks.chain_sum] task = \"reasoning_gym\""}
# The resources a cell asks of its executor: top level, then [tasks.X], then [algorithms.Y] (the most specific wins).
# They are not part of a cell's identity (``Cell.spec``): the same cell on more cores is the same experiment.
RESOURCE_KEYS = {"num_cpus": "CPU cores (torch threads) per cell", "num_gpus": "GPUs per cell (may be a fraction)"}
CELL_COMPLETE = "complete"


class MatrixError(UsageError):
    """A matrix file that cannot run, reported as ``FILE:LINE: message`` (exit status 2)."""


# ------------------------------------------------------------------------------------------------
# Locating keys in the TOML text (tomllib keeps no line numbers)
# ------------------------------------------------------------------------------------------------

_HEADER = re.compile(r"^\s*\[\[?\s*([^\]]+?)\s*\]\]?\s*(#.*)?$")
_ASSIGN = re.compile(r"""^\s*((?:[A-Za-z0-9_\-]+|"[^"]*"|'[^']*')(?:\s*\.\s*(?:[A-Za-z0-9_\-]+|"[^"]*"|'[^']*'))*)\s*=""")


def _dotted(s: str) -> tuple[str, ...]:
    parts = re.findall(r"""\s*("[^"]*"|'[^']*'|[^.]+)\s*(?:\.|$)""", s)
    return tuple(p.strip().strip("\"'") for p in parts if p.strip())


def line_of(text: str, table: tuple[str, ...], key: Optional[str] = None) -> int:
    """1-based line of ``key`` in ``[table]`` (or of the table's header when key is None); 0 if not found."""
    current: tuple[str, ...] = ()
    header_line = 0
    for n, line in enumerate(text.splitlines(), 1):
        header = _HEADER.match(line)
        if header:
            current = _dotted(header.group(1))
            if current == table:
                header_line = header_line or n
                if key is None:
                    return n
            continue
        assign = _ASSIGN.match(line)
        if assign and key is not None:
            path = current + _dotted(assign.group(1))
            if path == table + (key,):
                return n
            if (table + (key,))[: len(path)] == path:  # an inline table holding the key: `grpo = { mu = 0 }`
                header_line = header_line or n
    return header_line


# ------------------------------------------------------------------------------------------------
# Parsing and validation
# ------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Cell:
    """One run of the matrix: everything needed to start it and to recognise it finished."""

    task: str
    task_label: str
    task_options: dict
    algo: str
    variant: str
    algo_options: dict
    seed: int
    budget: int
    completions_per_step: int
    steps: int
    eval_every: int  # in steps
    checkpoint_every: int  # in steps
    device: str
    precision: str
    settings: dict  # the run's full resolved settings (harness.config.resolve's names), but ``out``
    # {"num_cpus": int, "num_gpus": float} where the matrix file names them; the executor's default otherwise
    resources: dict = dataclasses.field(default_factory=dict)
    # A tuning cell: its grid point's label (e.g. "learning_rate=0.0001"); "" for an evaluation cell.
    tuning_point: str = ""

    @property
    def relpath(self) -> str:
        if self.tuning_point:
            return f"tune/{_slug(self.task_label)}/{_slug(self.variant)}/{_slug(self.tuning_point)}/seed{self.seed}"
        return f"{_slug(self.task_label)}/{_slug(self.variant)}/seed{self.seed}"

    @property
    def name(self) -> str:
        if self.tuning_point:
            return f"{self.task_label} {self.variant} [{self.tuning_point}] seed {self.seed} (tuning)"
        return f"{self.task_label} {self.variant} seed {self.seed}"

    def spec(self) -> dict:
        """The cell's identity, as cell.json holds it (resources left out: they do not change the experiment;
        the tuning point is in the settings already)."""
        spec = dataclasses.asdict(self)
        spec.pop("resources"), spec.pop("tuning_point")
        return spec


@dataclasses.dataclass
class TuningGroup:
    """One variant on one task under tuning: per grid point, its tuning cells and its evaluation cells."""

    task_label: str
    variant: str
    points: list[dict]  # the grid's settings, in the file's order (the first wins a tie)
    tuning_cells: list[list[Cell]]  # [point][tuning seed]
    candidates: list[list[Cell]]  # [point][evaluation seed]: the cells run once the point is chosen

    @staticmethod
    def label(point: dict) -> str:
        return ",".join(f"{k}={v}" for k, v in point.items())


@dataclasses.dataclass
class Plan:
    path: str
    text: str
    name: str
    description: str
    cells: list[Cell]  # the evaluation cells; with tuning, empty until ``choose`` picks each variant's point
    timeout_s: float
    tuning: list[TuningGroup] = dataclasses.field(default_factory=list)
    tuning_seeds: list[int] = dataclasses.field(default_factory=list)
    analysis: Optional["Analysis"] = None
    order: str = "variant"  # the order the cells run in (in_order)

    def tuning_cells(self) -> list[Cell]:
        return in_order([c for group in self.tuning for cells in group.tuning_cells for c in cells], self.order)

    def candidate_cells(self) -> list[Cell]:
        return [c for group in self.tuning for cells in group.candidates for c in cells]

    def choose(self, chosen: list[int]) -> "Plan":
        """This plan with its evaluation cells at grid point ``chosen[i]`` of tuning group i."""
        cells = [c for group, i in zip(self.tuning, chosen) for c in group.candidates[i]]
        return dataclasses.replace(self, cells=in_order(cells, self.order))


# The seeds a variant needs to be judged at all: inference.compare's ``min_seeds`` (the report's, which the matrix
# does not import); a test holds the two equal.
VERDICT_MIN_SEEDS = 3


def evaluation_cells(plan: Plan) -> list[Cell]:
    """The cells the verdicts will read: the evaluation cells, or with [tuning] one grid point's candidates (each
    point runs the same seeds and budget)."""
    return plan.cells or [c for g in plan.tuning for c in g.candidates[0]]


def design_warnings(plan: Plan) -> list[str]:
    """What in the plan's design cannot give what a newcomer runs it for, one line each (said at --dry-run and
    before the first cell; the matrix still runs): fewer seeds per variant than a verdict needs, and a budget
    below the first evaluation during training."""
    cells = evaluation_cells(plan)
    seeds: dict[tuple[str, str], set[int]] = {}
    for c in cells:
        seeds.setdefault((c.task_label, c.variant), set()).add(c.seed)
    lines = []
    fewest = min((len(s) for s in seeds.values()), default=VERDICT_MIN_SEEDS)
    if fewest < VERDICT_MIN_SEEDS:
        short = list(dict.fromkeys(v for (_, v), s in seeds.items() if len(s) < VERDICT_MIN_SEEDS))
        lines.append(f"warning: matrix {plan.name} runs {fewest} seed(s) per variant and a verdict needs at least "
                     f"{VERDICT_MIN_SEEDS}: the report will describe {', '.join(short)} but mark no variant best or "
                     f"worse (add seeds: seeds = [0, 1, 2] or more)")
    early = sorted({(c.task_label, c.budget, c.eval_every * c.completions_per_step) for c in cells
                    if c.eval_every and c.steps <= c.eval_every})
    for task, budget, every in early:
        lines.append(f"warning: on {task} the budget of {budget} completions is below the first evaluation during "
                     f"training (eval_every {every}): each learning curve is before and after only, so AUC and "
                     f"completions to a threshold are not shown")
    return lines


def _slug(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9.=+-]+", "_", label).strip("_")


def _label(base: str, varying: dict) -> str:
    return base if not varying else base + "(" + ",".join(f"{k}={v}" for k, v in varying.items()) + ")"


def _expand(options: dict) -> list[tuple[dict, dict]]:
    """Lists expand into their product: [(all options, the options that vary)]."""
    keys = [k for k, v in options.items() if isinstance(v, list)]
    fixed = {k: v for k, v in options.items() if k not in keys}
    out = []
    for values in itertools.product(*(options[k] for k in keys)):
        varying = dict(zip(keys, values))
        out.append(({**fixed, **varying}, varying))
    return out


def _type_ok(value: Any, kind) -> bool:
    if kind is bool:
        return isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is str:
        return isinstance(value, str)
    return not isinstance(value, (dict, list))


class _Checker:
    def __init__(self, path: str, text: str):
        self.path, self.text = path, text

    def fail(self, table: tuple[str, ...], key: Optional[str], message: str) -> typing.NoReturn:
        line = line_of(self.text, table, key)
        raise MatrixError(f"{self.path}:{line or '?'}: {message}")

    def int_key(self, data: dict, key: str, default: int, minimum: int, table: tuple = ()) -> int:
        value = data.get(key, default)
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            self.fail(table, key, f"{key} must be an integer >= {minimum}, got {value!r}")
        return value


def parse(path: str | Path) -> Plan:
    """Read and validate a matrix file; every problem is a MatrixError naming the file's line."""
    path = Path(path)
    text, data = _read_toml(path)
    check = _Checker(str(path), text)
    run = _run_settings(check, data)
    algos = _algorithms(check, data)
    tasks = _tasks(check, data)
    per_task = _per_task_algorithm_options(check, data, algos)
    tuning_seeds, grids = _tuning(check, data, algos, run.seeds)
    cells, groups = [], []
    for task, algo in itertools.product(tasks, algos):
        more_cells, more_groups = _variant_cells(check, task, algo, per_task, run, tuning_seeds, grids)
        cells += more_cells
        groups += more_groups
    if not cells and not groups:
        check.fail((), None, "the matrix has no cells: add [tasks.NAME] and [algorithms.NAME] tables")
    _check_equivalent(check, data.get("equivalent", []), {c.variant for c in cells} | {g.variant for g in groups})
    plan = Plan(str(path), text, str(data.get("name", path.stem)), str(data.get("description", "")),
                in_order(cells, run.order), float(run.timeout_s), groups, tuning_seeds,
                _analysis(check, data, run.eval_every, run.budget), run.order)
    _check_folders(check, plan)
    _check_claims(check, plan)
    return plan


def _read_toml(path: Path) -> tuple[str, dict]:
    """The matrix file's text and its TOML, or a UsageError (no such file) or a MatrixError (not TOML)."""
    if not path.is_file():
        raise UsageError(f"no such matrix file: {path}")
    text = path.read_text()
    try:
        return text, tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise MatrixError(f"{path}: invalid TOML: {exc}") from None


@dataclasses.dataclass(frozen=True)
class _RunSettings:
    """The top-level run settings every cell shares (RUN_KEYS), checked."""

    seeds: list[int]
    budget: int
    eval_every: int
    checkpoint_every: int
    timeout_s: float
    device: str
    precision: str
    resources: dict
    order: str = "variant"


ORDERS = ("variant", "seed")


def in_order(cells: list["Cell"], order: str) -> list["Cell"]:
    """``cells`` in the order they run: as planned (each variant's seeds in turn) for "variant"; for "seed", each
    task's cells seed by seed, the variants of a seed in their planned order."""
    if order == "variant":
        return list(cells)
    tasks = {task: i for i, task in enumerate(dict.fromkeys(c.task_label for c in cells))}
    seeds = {seed: i for i, seed in enumerate(dict.fromkeys(c.seed for c in cells))}
    return sorted(cells, key=lambda c: (tasks[c.task_label], seeds[c.seed]))  # stable: a seed's variants in turn


def _run_settings(check: _Checker, data: dict) -> _RunSettings:
    """The file's top-level keys, each checked (an unknown one, or [racing], is refused)."""
    if "racing" in data:
        check.fail(("racing",), None, "[racing] is no longer supported: more seeds for the variants whose mark was still "
                                 "open, with no correction for the repeated looks, raised the false-'worse' rate above "
                                 "5%; a matrix runs the fixed seeds it states (benchmarks/report/inference.py)")
    if "cost_claims" in data:
        check.fail(("cost_claims",), None, "a reading of stored matrices ([[cost_claims]]), not a matrix: no cell runs "
                                           "for it; `grpo-bench claims` reads it")
    for key in data:
        if key not in RUN_KEYS:
            check.fail((), key, f"unknown key {key!r}; a matrix file has: {', '.join(RUN_KEYS)}")
    seeds = data.get("seeds", [0])
    if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds):
        check.fail((), "seeds", f"seeds must be a non-empty list of integers, got {seeds!r}")
    if len(set(seeds)) != len(seeds):
        check.fail((), "seeds", f"seeds has duplicates: {seeds}")
    budget = check.int_key(data, "budget", 1024, 1)
    eval_every = check.int_key(data, "eval_every", 0, 0)
    checkpoint_every = check.int_key(data, "checkpoint_every", 0, 0)
    timeout_s = data.get("timeout_s", 0)
    if not isinstance(timeout_s, (int, float)) or isinstance(timeout_s, bool) or timeout_s < 0:
        check.fail((), "timeout_s", f"timeout_s must be a number >= 0, got {timeout_s!r}")
    device, precision = data.get("device", "auto"), data.get("precision", "auto")
    if device not in ("auto", "cpu") and not re.fullmatch(r"cuda(:\d+)?", str(device)):
        check.fail((), "device", f"device must be auto, cpu or cuda, got {device!r}")
    if precision not in ("auto", "fp32", "bf16"):
        check.fail((), "precision", f"precision must be auto, fp32 or bf16, got {precision!r}")
    order = data.get("order", "variant")
    if order not in ORDERS:
        check.fail((), "order", f"order must be {' or '.join(ORDERS)}, got {order!r}")
    _check_report(check, data.get("report", {}))
    return _RunSettings(seeds, budget, eval_every, checkpoint_every, timeout_s, device, precision,
                        _resources(check, data, ()), order)


def _check_report(check: _Checker, table: Any) -> None:
    """[report]: ``metrics``, a list of distinct training-metric names (the report reads it from the file's text)."""
    if not isinstance(table, dict):
        check.fail((), "report", "report must be a table: [report]")
    for key in table:
        if key != "metrics":
            check.fail(("report",), key, f"unknown key {key!r} of [report]; it has: metrics")
    metrics = table.get("metrics", [])
    if (not isinstance(metrics, list) or not all(isinstance(m, str) and m.strip() for m in metrics)
            or len(set(metrics)) != len(metrics)):
        check.fail(("report",), "metrics", f"metrics must be a list of distinct metric names, got {metrics!r}")


def _variant_cells(check: _Checker, task: tuple, algo: tuple, per_task: dict, run: _RunSettings,
                   tuning_seeds: list[int], grids: dict[str, list[dict]]) -> tuple[list[Cell], list[TuningGroup]]:
    """One algorithm table's variant on one task: its evaluation cells, or with ``tuning_seeds`` its TuningGroup (per
    grid point, the tuning cells on the task's validation problems and the evaluation cells)."""
    _, task_label, _, task_budget, task_eval, _, task_table = task
    algo_name, variant, algo_options, table, algo_resources = algo
    overrides = per_task.get((task_table, table), {})
    algo_options = {**algo_options, **overrides}
    shared = dict(budget=task_budget or run.budget, eval_every=run.eval_every if task_eval is None else task_eval,
                  checkpoint_every=run.checkpoint_every, device=run.device, precision=run.precision,
                  resources=run.resources)
    make = functools.partial(_cells, check, task, (algo_name, variant, table, algo_resources), overrides, **shared)
    if not tuning_seeds:
        return make(algo_options, run.seeds), []
    points = grids[table]
    tune = functools.partial(_cells, check, _on_validation(task), (algo_name, variant, table, algo_resources),
                             overrides, **shared)
    return [], [TuningGroup(task_label, variant, points,
                            [tune({**algo_options, **pt}, tuning_seeds, TuningGroup.label(pt)) for pt in points],
                            [make({**algo_options, **pt}, run.seeds) for pt in points])]


CLAIM_KEYS = {"id": "a short name for the claim (unique in the file)", "source": "who claims it (paper, year)",
              "claim": "the claim, in a sentence", "treatment": "the variant the claim says is better (or equal)",
              "control": "the variant it is compared with, or start: the policy before training, read from the "
                         "treatment's own cells (its accuracy before training stands for its primary metric)",
              "expects": "better (default), worse, equal, or differs (a difference of either sign: the source claims a "
                         "sensitivity, not a direction)",
              "task": "the task label it is judged on (default: every task of the matrix)",
              "secondary": "a training metric shown beside the claim's mark, described not judged (e.g. entropy, "
                           "length/incorrect): its mean over the last quarter of each cell's steps",
              "metric": "what the claim is judged on: the primary metric (default), or pass@K after training (both "
                        "variants evaluate pass_at_k with this K)"}


@dataclasses.dataclass(frozen=True)
class Claim:
    """A published claim this matrix tests (``[[analysis.claims]]``): the treatment variant against the control
    on the primary metric, judged with the other claims as one family (benchmarks/report/inference.contrasts)."""
    id: str
    source: str
    claim: str
    treatment: str
    control: str
    expects: str = "better"
    task: Optional[str] = None
    secondary: Optional[str] = None
    metric: Optional[str] = None  # None: the primary metric


@dataclasses.dataclass(frozen=True)
class Analysis:
    """A matrix's pre-registered analysis (``[analysis]``): the primary metric its verdicts and its tuning judge
    by, the margin of equivalence to the best, the MDD its seeds were chosen for (benchmarks/report/inference.py),
    and the claims it tests."""
    primary: str = PRIMARY_DEFAULT
    margin: Optional[float] = None
    target_mdd: Optional[float] = None
    claims: tuple[Claim, ...] = ()
    section: Optional[str] = None  # the claims report's heading for this matrix's claims

    def as_dict(self) -> dict:
        out = dataclasses.asdict(self)
        if not self.claims:  # matrices stated before claims existed keep their recorded analysis equal
            del out["claims"]
        else:  # so do those stated before a claim could name its metric
            out["claims"] = [{k: v for k, v in dataclasses.asdict(c).items() if k != "metric" or v is not None}
                             for c in self.claims]
        if self.section is None:  # and before a section could be named
            del out["section"]
        return out


def _analysis(check: _Checker, data: dict, eval_every: int, budget: int) -> Optional[Analysis]:
    table = data.get("analysis")
    if table is None:
        return None
    where = ("analysis",)
    if not isinstance(table, dict):
        check.fail((), "analysis", "analysis must be a table: [analysis]")
    unknown = sorted(set(table) - {"primary", "margin", "target_mdd", "claims", "section"})
    if unknown:
        check.fail(where, unknown[0], f"unknown key {unknown[0]!r} of [analysis]; it has: primary, margin, target_mdd, "
                                      "section, claims")
    section = table.get("section")
    if section is not None and not (isinstance(section, str) and section.strip()):
        check.fail(where, "section", f"section must be a heading (text), got {section!r}")
    primary = table.get("primary", PRIMARY_DEFAULT)
    try:
        parse_primary(primary if isinstance(primary, str) else repr(primary))
    except ValueError as exc:
        check.fail(where, "primary", str(exc))
    need = evaluations_needed(primary)
    have = -(-budget // eval_every) if eval_every else 1  # evaluations below the budget, and the final one
    if need > 1 and have < need:
        check.fail(where, "primary", f"primary {primary!r} needs {need} evaluations after the start, but eval_every "
                                     f"{eval_every} gives {have} over a budget of {budget}")
    numbers = {}
    for key in ("margin", "target_mdd"):
        value = table.get(key)
        if value is not None and (not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value < 1):
            check.fail(where, key, f"{key} must be a number in (0, 1), got {value!r}")
        numbers[key] = None if value is None else float(value)
    return Analysis(primary, **numbers, claims=_claims(check, table.get("claims", [])), section=section)


def _claims(check: _Checker, claims: Any) -> tuple[Claim, ...]:
    where = ("analysis", "claims")
    if not isinstance(claims, list) or not all(isinstance(c, dict) for c in claims):
        check.fail(("analysis",), "claims", "claims must be tables: [[analysis.claims]]")
    out = []
    for claim in claims:
        unknown = sorted(set(claim) - set(CLAIM_KEYS))
        if unknown:
            check.fail(where, unknown[0], f"unknown key {unknown[0]!r} of [[analysis.claims]]; it has: "
                                          f"{', '.join(CLAIM_KEYS)}")
        for key in ("id", "source", "claim", "treatment", "control"):
            if not isinstance(claim.get(key), str) or not claim[key].strip():
                check.fail(where, key if key in claim else None, f"[[analysis.claims]] needs {key} (text): "
                                                                 f"{CLAIM_KEYS[key]}")
        expects = claim.get("expects", "better")
        if expects not in ("better", "worse", "equal", "differs"):
            check.fail(where, "expects", f"expects must be better, worse, equal or differs, got {expects!r}")
        if claim["treatment"] == claim["control"]:
            check.fail(where, "control", f"claim {claim['id']!r}: the treatment and the control are one variant")
        for key in ("task", "secondary"):
            if claim.get(key) is not None and not (isinstance(claim[key], str) and claim[key].strip()):
                check.fail(where, key, f"{key} must be a name (text), got {claim[key]!r}")
        if claim.get("metric") is not None and pass_at(claim["metric"]) is None:
            check.fail(where, "metric", f"claim {claim['id']!r}: metric must be pass@K (e.g. pass@16) or left out "
                                        f"for the primary metric, got {claim['metric']!r}")
        out.append(Claim(claim["id"], claim["source"], claim["claim"], claim["treatment"], claim["control"], expects,
                         claim.get("task"), claim.get("secondary"), claim.get("metric")))
    ids = [c.id for c in out]
    if len(set(ids)) != len(ids):
        check.fail(where, "id", f"claim ids repeat: {sorted({i for i in ids if ids.count(i) > 1})}")
    return tuple(out)


def _check_claims(check: _Checker, plan: "Plan") -> None:
    """Every claim names variants and a task the matrix runs; a claim on pass@K, variants that evaluate it."""
    if plan.analysis is None:
        return
    variants = {c.variant for c in plan.cells} | {g.variant for g in plan.tuning}
    tasks = {c.task_label for c in plan.cells} | {g.task_label for g in plan.tuning}
    for claim in plan.analysis.claims:
        k = pass_at(claim.metric)
        for side in ("treatment", "control"):
            name = getattr(claim, side)
            if side == "control" and name == START and START not in variants:
                continue
            if name not in variants:
                check.fail(("analysis", "claims"), side, f"claim {claim.id!r}: {side} {name!r} is not a "
                                                         f"variant of this matrix ({', '.join(sorted(variants))})")
            if k is not None and not all(k in _pass_ks(c) for c in evaluation_cells(plan) if c.variant == name):
                check.fail(("analysis", "claims"), "metric", f"claim {claim.id!r} reads pass@{k}, but variant "
                                                             f"{name!r} does not evaluate it (pass_at_k with {k} in "
                                                             "its table)")
        if claim.task is not None and claim.task not in tasks:
            check.fail(("analysis", "claims"), "task", f"claim {claim.id!r}: task {claim.task!r} is not one of this "
                                                       f"matrix's ({', '.join(sorted(tasks))})")


def _pass_ks(cell: Cell) -> tuple[int, ...]:
    """The ks a cell evaluates pass@k at (none: off)."""
    text = cell.settings.get("pass_at_k")
    return tuple(int(part) for part in str(text).split(",")) if text else ()


def _on_validation(task: tuple) -> tuple:
    """A task's tuning cells evaluate on its validation problems (``eval_set``), disjoint from the test problems the
    verdicts judge on, when the task has them; the task's label stays, so a tuning cell names its task as before."""
    name, label, options, *rest = task
    if "eval_set" in TASKS[name].options() and "eval_set" not in options:
        return (name, label, {**options, "eval_set": "validation"}, *rest)
    return task


def _cells(check: _Checker, task: tuple, algo: tuple, overrides: dict, algo_options: dict, seeds: list[int],
           tuning_point: str = "", *, budget: int, eval_every: int, checkpoint_every: int, device: str, precision: str,
           resources: dict) -> list[Cell]:
    """One variant's cells on one task, one per seed, their settings resolved (and checked) here."""
    task_name, task_label, task_options, task_budget, task_eval, task_resources, task_table = task
    algo_name, variant, table, algo_resources = algo
    precision = algo_options.get("precision", precision)  # a variant's own precision wins over the matrix's
    settings = _resolved(check, task_name, task_label, task_options, algo_name, variant, algo_options, table, overrides,
                         task_table)
    cps, vary = settings.pop("completions_per_step"), settings.pop("completions_per_step_vary")
    steps = budget // cps
    if steps < 1:
        where = ("tasks", task_table) if task_budget else ()
        check.fail(where, "budget", f"budget {budget} completions is less than one step of {variant} "
                                    f"({cps} completions per step)")
    eval_steps = _eval_steps(check, task_table if task_eval is not None else None, task_label, variant, eval_every, cps)
    checkpoint_steps = max(1, checkpoint_every // cps) if checkpoint_every else 0
    run = {"steps": steps, "budget": budget, "eval_every": eval_steps, "device": device,
           "checkpoint_every": checkpoint_steps, "precision": precision}
    if vary and eval_every:  # its steps fall at other completion counts than its rivals': evaluate by count
        run["eval_every_completions"] = eval_every
    return [Cell(task=task_name, task_label=task_label, task_options=task_options, algo=algo_name, variant=variant,
                 algo_options=algo_options, seed=seed, budget=budget, completions_per_step=cps, steps=steps,
                 eval_every=eval_steps, checkpoint_every=checkpoint_steps, device=device, precision=precision,
                 settings={**settings, **run, "seed": seed}, resources={**resources, **task_resources, **algo_resources},
                 tuning_point=tuning_point)
            for seed in seeds]


def _tuning(check: _Checker, data: dict, algos: list, seeds: list[int]) -> tuple[list[int], dict[str, list[dict]]]:
    """``[tuning]``: its seeds (disjoint from the evaluation seeds, so that the verdicts are not measured on
    the seeds that chose the settings) and, per algorithm table, the grid: the product of the top-level keys'
    lists and the table's own ``[tuning.algorithms.Y]`` lists, in the file's order. ([], {}) without one."""
    table = data.get("tuning")
    if table is None:
        return [], {}
    where = ("tuning",)
    if not isinstance(table, dict):
        check.fail((), "tuning", "tuning must be a table: [tuning]")
    table = dict(table)
    tuning_seeds = table.pop("seeds", None)
    if (not isinstance(tuning_seeds, list) or not tuning_seeds
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in tuning_seeds)
            or len(set(tuning_seeds)) != len(tuning_seeds)):
        check.fail(where, "seeds", f"tuning needs seeds = a list of distinct integers, got {tuning_seeds!r}")
    shared_seeds = sorted(set(tuning_seeds) & set(seeds))
    if shared_seeds:
        check.fail(where, "seeds", f"tuning seeds must differ from the evaluation seeds; both have {shared_seeds}")
    per_table = table.pop("algorithms", {})
    if not isinstance(per_table, dict):
        check.fail(where, "algorithms", "tuning.algorithms must hold [tuning.algorithms.NAME] tables")
    tables = {t: a for a, _, _, t, _ in algos}
    unknown = sorted(set(per_table) - set(tables))
    if unknown:
        check.fail(where + ("algorithms", unknown[0]), None, f"no [algorithms.{unknown[0]}] table to tune; the matrix has: "
                                                             f"{', '.join(tables)}")
    grids = {}
    for name, algo in tables.items():
        keys = {**table, **per_table.get(name, {})}
        config_cls = ALGORITHMS[algo].Config
        fields = set(config_fields(config_cls))
        for key, values in keys.items():
            at = where + (("algorithms", name) if key in per_table.get(name, {}) else ())
            if key not in fields:
                check.fail(at, key, f"tuning key {key!r} is not an option of {algo} (table {name}); its options: "
                                    f"{', '.join(sorted(fields))}")
            kind = field_type(config_cls, key)
            if not isinstance(values, list) or not values or not all(_type_ok(v, kind) for v in values):
                check.fail(at, key, f"tuning key {key} must be a non-empty list of {getattr(kind, '__name__', kind)}, "
                                    f"got {values!r}")
        grids[name] = [dict(zip(keys, combo)) for combo in itertools.product(*keys.values())] if keys else [{}]
    return tuning_seeds, grids


def _check_equivalent(check: _Checker, groups, variants: set[str]) -> None:
    """``equivalent``: a list of groups, each a list of at least two variants of this matrix."""
    if not isinstance(groups, list) or not all(isinstance(g, list) and len(g) >= 2 and all(isinstance(v, str) for v in g)
                                               for g in groups):
        check.fail((), "equivalent", f"equivalent must be a list of lists of at least two variant names, got {groups!r}")
    unknown = sorted({v for g in groups for v in g} - variants)
    if unknown:
        check.fail((), "equivalent", f"equivalent names variants this matrix does not define: {', '.join(unknown)} "
                                     f"(its variants: {', '.join(sorted(variants))})")


def _eval_steps(check: _Checker, task_table: Optional[str], task_label: str, variant: str, eval_every: int, cps: int) -> int:
    """``eval_every`` completions as a step interval. Every variant is evaluated at the same completion
    counts (the multiples of eval_every) only when its completions per step divide eval_every; anything
    else would put its learning-curve points elsewhere than the other variants', so it is refused."""
    if not eval_every:
        return 0
    if eval_every % cps:
        where = ("tasks", task_table) if task_table else ()
        check.fail(where, "eval_every", f"eval_every {eval_every} completions is not a multiple of {variant}'s {cps} "
                                        f"completions per step on {task_label}: its evaluations would fall at other "
                                        f"completion counts than the other variants' (use a multiple of {cps}, "
                                        f"e.g. {-(-eval_every // cps) * cps})")
    return eval_every // cps


def _resolved(check: _Checker, task: str, task_label: str, task_options: dict, algo: str, variant: str,
              algo_options: dict, table: str, overrides: dict, task_table: str) -> dict:
    """The variant's full settings on this task, validated once here (the cell's process only reads them),
    with ``completions_per_step`` of the resolved config. ``overrides``: the task's own options for it."""
    try:
        rc, algo_config, resolved_task_options = resolve({"task": task, "algo": algo, **task_options, **algo_options})
    except UsageError as exc:
        key = next((k for k in sorted(algo_options, key=len, reverse=True) if k in str(exc)), None)
        where = ("tasks", task_table, "algorithms", table) if key in overrides else ("algorithms", table)
        check.fail(where, key, f"impossible variant {variant} on {task_label}: {exc}")
    settings = flat_settings(rc, algo_config, resolved_task_options)
    for name in ("out", "resume", "overwrite"):  # the executor's to set, per cell
        settings.pop(name)
    return {**settings, "completions_per_step": algo_config.completions_per_step(),
            "completions_per_step_vary": algo_config.completions_per_step_vary()}


def _resources(check: _Checker, table: dict, where: tuple) -> dict:
    """num_cpus (an integer >= 1) and num_gpus (a number >= 0) of a table, where given."""
    out = {}
    if "num_cpus" in table:
        out["num_cpus"] = check.int_key(table, "num_cpus", 1, 1, where)
    if "num_gpus" in table:
        value = table["num_gpus"]
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
            check.fail(where, "num_gpus", f"num_gpus must be a number >= 0, got {value!r}")
        out["num_gpus"] = value
    return out


def _tasks(check: _Checker, data: dict) -> list[tuple[str, str, dict, Optional[int], Optional[int], dict, str]]:
    """(registered task, label, options, budget, eval_every, resources, table name) per task setting."""
    tables = data.get("tasks", {})
    if not isinstance(tables, dict) or not tables:
        check.fail((), "tasks", "the matrix needs at least one [tasks.NAME] table")
    out = []
    for table_name, options in tables.items():
        where = ("tasks", table_name)
        if not isinstance(options, dict):
            check.fail(("tasks",), table_name, f"tasks.{table_name} must be a table")
        options = dict(options)
        name = options.pop("task", table_name)
        if not isinstance(name, str) or name not in TASKS:
            check.fail(where, "task" if "task" in tables[table_name] else None,
                       f"unknown task {name!r}; registered tasks: {', '.join(sorted(TASKS))}")
        task_budget = check.int_key(options, "budget", 0, 1, where) if "budget" in options else None
        task_eval = check.int_key(options, "eval_every", 0, 0, where) if "eval_every" in options else None
        options.pop("budget", None), options.pop("eval_every", None), options.pop("algorithms", None)
        resources = _resources(check, options, where)
        for key in RESOURCE_KEYS:
            options.pop(key, None)
        params = TASKS[name].options()
        for key, value in options.items():
            if key not in params:
                check.fail(where, key, f"unknown option {key!r} of task {name}; it takes: "
                                       f"{', '.join(list(params) + list(TASK_RESERVED) + list(RESOURCE_KEYS))}")
            values = value if isinstance(value, list) else [value]
            if not values:
                check.fail(where, key, f"{key} is an empty list")
            kind = params[key].kind
            for v in values:
                if not _type_ok(v, kind) or isinstance(v, (dict, list)):
                    check.fail(where, key, f"{key} of task {name} must be {kind.__name__}, got {v!r}")
                if key == "reward_mode" and v not in TASKS[name].reward_modes:
                    check.fail(where, key, f"task {name} has no reward mode {v!r}; "
                                           f"choose from {', '.join(TASKS[name].reward_modes)}")
        for full, varying in _expand(options):
            _check_folder_name(check, where, "task", _label(table_name, varying))
            out.append((name, _label(table_name, varying), full, task_budget, task_eval, resources, table_name))
    return out


def _per_task_algorithm_options(check: _Checker, data: dict, algos: list) -> dict[tuple[str, str], dict]:
    """(task, algorithm table) -> the options a [tasks.X.algorithms.Y] table sets for Y on X alone: a setting
    that only makes sense per task (DAPO's overlong buffer is a share of the task's length limit). One
    value each: a list would make the variant mean different things on different tasks."""
    algo_of = {table: algo for algo, _, _, table, _ in algos}
    out = {}
    for task_name, options in data.get("tasks", {}).items():
        tables = options.get("algorithms", {})
        if not isinstance(tables, dict):
            check.fail(("tasks", task_name), "algorithms", f"tasks.{task_name}.algorithms must hold [tasks.{task_name}"
                                                           f".algorithms.NAME] tables")
        for table, overrides in tables.items():
            where = ("tasks", task_name, "algorithms", table)
            if table not in algo_of:
                check.fail(where, None, f"no [algorithms.{table}] table to set options of on {task_name}; the "
                                        f"matrix has: {', '.join(algo_of)}")
            if not isinstance(overrides, dict):
                check.fail(("tasks", task_name, "algorithms"), table, f"tasks.{task_name}.algorithms.{table} must be a table")
            config_cls = ALGORITHMS[algo_of[table]].Config
            fields = set(config_fields(config_cls))
            for key, value in overrides.items():
                if key not in fields:
                    check.fail(where, key, f"{key!r} is not an option of {algo_of[table]}; its options: "
                                           f"{', '.join(sorted(fields))}")
                kind = field_type(config_cls, key)
                if isinstance(value, (list, dict)) or not _type_ok(value, kind):
                    check.fail(where, key, f"{key} of {algo_of[table]} on {task_name} must be one "
                                           f"{getattr(kind, '__name__', kind)}, got {value!r}")
            out[(task_name, table)] = dict(overrides)
    return out


def _algorithms(check: _Checker, data: dict) -> list[tuple[str, str, dict, str, dict]]:
    tables = data.get("algorithms", {})
    if not isinstance(tables, dict) or not tables:
        check.fail((), "algorithms", "the matrix needs at least one [algorithms.NAME] table")
    out = []
    for table_name, options in tables.items():
        where = ("algorithms", table_name)
        if not isinstance(options, dict):
            check.fail(("algorithms",), table_name, f"algorithms.{table_name} must be a table")
        options = dict(options)
        resources = _resources(check, options, where)
        for key in RESOURCE_KEYS:
            options.pop(key, None)
        algo = options.pop("algo", table_name)
        if algo not in ALGORITHMS:
            key = "algo" if "algo" in tables[table_name] else None
            check.fail(where, key, f"unknown algorithm {algo!r}; registered algorithms: {', '.join(sorted(ALGORITHMS))}")
        config_cls = ALGORITHMS[algo].Config
        fields = set(config_fields(config_cls))
        for key, value in options.items():
            if key == "pass_at_k":  # its ks are checked with the run's settings (RunConfig.validate)
                if not isinstance(value, str):
                    check.fail(where, key, f"pass_at_k must be text such as \"1,16\", got {value!r}")
                continue
            if key in TABLE_RUN_CHOICES:
                if value not in TABLE_RUN_CHOICES[key]:
                    check.fail(where, key, f"{key} must be one of {', '.join(TABLE_RUN_CHOICES[key])}, got {value!r}")
                continue
            if key in TABLE_RUN_KEYS:
                if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                    check.fail(where, key, f"{key} must be an integer >= 0, got {value!r}")
                continue
            if key not in fields:
                check.fail(where, key, f"{key!r} is not an option of {algo}; its options: {', '.join(sorted(fields))}")
            kind = field_type(config_cls, key)
            for v in (value if isinstance(value, list) else [value]):
                if not _type_ok(v, kind):
                    check.fail(where, key, f"{key} of {algo} must be {getattr(kind, '__name__', kind)}, got {v!r}")
            if isinstance(value, list) and not value:
                check.fail(where, key, f"{key} is an empty list")
        for full, varying in _expand(options):
            _check_folder_name(check, where, "algorithm variant", _label(table_name, varying))
            out.append((algo, _label(table_name, varying), full, table_name, resources))
    labels = [v for _, v, _, _, _ in out]
    for label in labels:
        if labels.count(label) > 1:
            check.fail(("algorithms",), None, f"two algorithm variants are both called {label!r}")
    folders: dict[str, str] = {}  # a variant's folder name (casefolded: one folder on macOS) -> its variant
    for _, label, _, table_name, _ in out:
        other = folders.setdefault(_slug(label).casefold(), label)
        if other != label:
            check.fail(("algorithms", table_name), None,
                       f"algorithm variants {other!r} and {label!r} would share the folder {_slug(label)!r} (a folder "
                       "name keeps letters, digits and . = + -, the rest becomes _): rename one")
    return out


def _check_folder_name(check: _Checker, where: tuple, kind: str, label: str) -> None:
    """A task's or variant's label names one folder of each of its cells: its folder name must be one path component
    of its own (".." would put the cells of one task into another's folder)."""
    if _slug(label) in ("", ".", ".."):
        check.fail(where[:-1], where[-1], f"{kind} {label!r} cannot name a folder (its folder name would be "
                                          f"{_slug(label)!r}): name it with a letter or digit")


def _check_folders(check: _Checker, plan: "Plan") -> None:
    """One folder per cell: two cells in one folder would overwrite each other's run and share one entry of
    the store (a variant's or a task's label whose folder name is another's, e.g. "fast lr" and "fast_lr")."""
    # A tuning group's candidates share their folders by design: one point of each is chosen.
    cells = plan.cells + plan.tuning_cells() + [c for group in plan.tuning for c in group.candidates[0]]
    seen: dict[str, Cell] = {}
    for cell in cells:
        other = seen.setdefault(cell.relpath.casefold(), cell)
        if other is not cell:
            where = ("tasks", cell.task) if other.task_label != cell.task_label else ("tuning",)
            check.fail(where, None, f"cells {other.name!r} and {cell.name!r} would share the folder {cell.relpath!r}: "
                                 "rename a variant or task option")
