"""The reference checks' one engine (benchmarks/checks/engine.py) with a framework of the test's own: a case module
registered here is a column of the feature table, a taken name is refused, a planted error is caught, a crash is a
failed row, the tolerances and the CSV writer do what they say. No reference framework is needed."""

import csv
import io
import math

import pytest
import torch

from algorithms import kl
from benchmarks.checks import engine
from benchmarks.checks import references as refs
from benchmarks.checks.cases import tensors
from benchmarks.errors import UsageError
from benchmarks.references import features
from benchmarks.references.adapters import ADAPTERS, Adapter, columns, register_adapter


class Toy(Adapter):
    name, column, heading = "toy", "Toy", "Toy 0.1"
    has = {"kl": {"k1": "log_ratio", "k2": "half_square"}}
    theirs_only = {"kl": ("toy_kl",)}
    cells = {"algorithms": {"grpo": "ToyTrainer"}}
    options = {"beta": "toy.kl_coef"}


def _their_k1(b):
    return b.logps - b.ref_logps


def _their_k2(b):  # by design another estimator: it omits the 1/2
    return (b.logps - b.ref_logps) ** 2


class ToyCases(engine.CaseModule):
    name, adapter, check = "toy", Toy, "references"
    plants = (engine.Plant("k1-doubled", "k1 twice as large", ("kl",),
                           lambda: engine.patched(kl.KL_PENALTIES, "k1", lambda lp, ref: 2 * (lp - ref), item=True)),)

    def configs(self, cases=("random",)):
        grid = tensors.Grid(self.name, cases)
        grid.add("kl", "k1", "log_ratio", "-", tensors.loss_pair(lambda b: kl.KL_PENALTIES["k1"](b.logps, b.ref_logps),
                                                                 _their_k1))
        grid.add("kl", "k2", "half_square", "-", tensors.loss_pair(
            lambda b: kl.KL_PENALTIES["k2"](b.logps, b.ref_logps), _their_k2), "its k2 omits the 1/2")
        return grid.configs


@pytest.fixture
def toy():
    engine.register_cases(ToyCases)
    yield ToyCases
    del engine.CASE_MODULES["toy"], ADAPTERS["toy"]


def test_a_registered_case_module_is_a_column_of_the_feature_table(toy):
    rows = engine.run_configs(toy().configs())
    assert [r.status for r in rows] == ["agrees", "agrees", "differs by design", "differs by design"]  # seeds 0, 1
    assert list(columns()) == ["TRL", "verl", "OpenRLHF", "SkyRL", "ms-swift", "Tinker", "Toy"]
    text = features.feature_report(rows)
    assert text.startswith("# Features: this suite, TRL, verl, OpenRLHF, SkyRL, ms-swift, Tinker and Toy")
    header = ("| name | this suite | TRL 1.16 (+ 1.12 PPO) | verl 0.9.1 | OpenRLHF 0.11.2 | SkyRL 0.4.0 | ms-swift 4.6.0 "
              "| Tinker (docs) | Toy 0.1 |")
    assert header in text
    lines = {line.split(" | ")[0]: line for line in text.splitlines() if line.startswith("| ")}
    assert lines["| `k1`"].endswith("| log_ratio (checked: 2 agree) |")  # its rows count in its column
    assert lines["| `k2`"].endswith("| half_square (checked: 0 agree, 2 differ by design) |")
    assert lines["| `low_var_kl`"].endswith("| - |")
    assert lines["| (toy_kl)"].endswith("| - | - | - | - | - | - | `toy_kl` |")
    assert any(line.startswith("| `grpo` | algorithms.grpo |") and line.endswith("| ToyTrainer |")
               for line in text.splitlines())  # the algorithms table
    assert "| toy.kl_coef |" in lines["| `beta`"]  # the options table
    summary = features.feature_summary(rows)
    assert "| KL estimators | 10 | 2 | 10 | 6 | 5 | 1 | 2 | 2 (+1 of its own) |" in summary
    assert "| not run | not run | not run | not run | not run | not run | 2 agrees, 2 differs by design |" in summary


def test_the_feature_table_loses_the_column_with_the_adapter():
    text = features.feature_report([])
    assert "Toy" not in text and "| name | this suite | TRL 1.16 (+ 1.12 PPO) | verl 0.9.1 | OpenRLHF 0.11.2 |" in text


def test_a_taken_name_is_refused(toy):
    engine.register_cases(ToyCases)  # the same class again: a no-op

    class Other(ToyCases):
        pass

    with pytest.raises(ValueError, match="'toy' is taken by .*ToyCases"):
        engine.register_cases(Other)

    class Verl(ToyCases):
        name = "verl"

    with pytest.raises(ValueError, match="takes its adapter's name"):
        engine.register_cases(Verl)

    class NotVerl(Adapter):
        name, column, heading = "verl", "verl", "verl 9"

    class VerlAgain(engine.CaseModule):
        name, adapter, check = "verl", NotVerl, "references"

    with pytest.raises(ValueError, match="'verl' is taken by .*VerlCases"):
        engine.register_cases(VerlAgain)
    with pytest.raises(ValueError, match="'verl' is taken by .*Verl"):
        register_adapter(NotVerl)
    with pytest.raises(TypeError):
        engine.register_cases(Toy)
    assert engine.CASE_MODULES["verl"].adapter is ADAPTERS["verl"] and "NotVerl" not in str(ADAPTERS)


def test_the_engine_catches_a_planted_error(toy):
    configs = toy().configs()
    rows = engine.run_configs(configs)
    (plant,) = toy.plants
    real = kl.KL_PENALTIES["k1"]
    result = engine.run_plant(plant, configs, rows)
    assert (result.rows, result.failed, result.caught, result.verdict) == (2, 2, True, "yes")  # not the by-design row
    assert result.example.startswith("toy k1 [-] on random: value diff")
    assert kl.KL_PENALTIES["k1"] is real
    assert [r.status for r in engine.run_configs(configs[:2])] == ["agrees", "agrees"]
    harmless = engine.Plant("nothing", "changes nothing", ("kl",), lambda: engine.patched(kl.KL_PENALTIES, "k1", real,
                                                                                         item=True))
    assert engine.run_plant(harmless, configs, rows).verdict == "NO"  # re-run and missed: the check exits 1
    elsewhere = engine.Plant("elsewhere", "touches no row", ("gae",), harmless.patch)
    assert engine.run_plant(elsewhere, configs, rows).verdict == "not exercised (no rows)"
    # a plant on one member re-runs that member's rows only: its group's other rows would agree and call it missed
    other_member = engine.Plant("k2-only", plant.what, ("kl",), plant.patch, functions=("k2",))
    assert engine.run_plant(other_member, configs, rows).verdict == "not exercised (no rows)"
    assert engine.run_plant(engine.Plant("k1-only", plant.what, ("kl",), plant.patch, functions=("k1",)), configs,
                            rows).rows == 2


def test_a_crash_is_a_failed_row_and_a_missing_framework_stops_the_check():
    def crash(_):
        raise RuntimeError("their shapes\nsecond line")

    def missing(_):
        raise UsageError("toy 0.1 is not installed: run --install")

    fixture = engine.Fixture(tensors.make_batch, ("random", 0))
    config = engine.Config("toy", "kl", "k1", "log_ratio", "-", "random", 0, crash, tensors.TOLERANCE, fixture)
    (row,) = engine.run_configs([config])
    assert (row.status, row.value_diff, row.error) == ("FAILS", math.inf, "RuntimeError: their shapes")
    skipped = engine.Config("toy", "kl", "k1", "log_ratio", "-", "random", 0, crash, tensors.TOLERANCE, fixture,
                            skip="it refuses")
    assert engine.run_config(skipped, None).status == "skipped"
    with pytest.raises(UsageError, match="not installed"):
        engine.run_configs([engine.Config("toy", "kl", "k1", "log_ratio", "-", "random", 0, missing,
                                          tensors.TOLERANCE, fixture)])


def test_tolerances_scale_and_measure_gradients_relatively():
    scaled, absolute = engine.Tolerance(1e-5, scaled=True), engine.Tolerance(1e-5)
    assert scaled.within(2e-5, None, scale=3.0) and not absolute.within(2e-5, None, scale=3.0)
    assert not scaled.within(1e-6, 4e-5, scale=3.0)
    assert not absolute.within(1e-6, None, scale=0.0, also=2e-5)  # the further difference is held too
    loss = engine.Tolerance(1e-6, 1e-5, relative_grad=True)
    ours, theirs = torch.tensor([1000.0, 5e-3]), torch.tensor([1000.0, 0.0])
    assert engine.relative_diff(ours, theirs) == pytest.approx(5e-6)
    comparison = engine.Comparison(torch.tensor(1.0), torch.tensor(1.0), ours, theirs)
    config = engine.Config("toy", "kl", "k1", "x", "-", "c", 0, lambda _: comparison, loss, None)
    assert engine.run_config(config, None).status == "agrees"  # 1e-5 of the largest gradient entry, not 1e-5 absolute
    comparison.grad_ours = torch.tensor([1000.0, 2e-2])
    assert engine.run_config(config, None).status == "FAILS"
    assert engine.max_diff(torch.tensor([1.0, math.nan]), torch.tensor([1.0, math.nan])) == 0.0
    assert engine.max_diff(torch.tensor([1.0, math.nan]), torch.tensor([1.0, 2.0])) == math.inf


def test_csv_text_quotes_as_the_csv_module_does_and_always_where_asked():
    records = [("a", 'say "hi", then', 1.5), ("b", "plain", None)]
    columns = [engine.Column("x", lambda r: r[0]), engine.Column("y", lambda r: r[1]),
               engine.Column("z", lambda r: "" if r[2] is None else repr(r[2]))]
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerows([["x", "y", "z"], *[[r[0], r[1], r[2] or ""] for r in records]])
    assert engine.csv_text(columns, records) == buffer.getvalue()
    always = [engine.Column("x", lambda r: r[0], quoted=True)]
    assert engine.csv_text(always, records) == 'x\n"a"\n"b"\n'


def test_each_check_runs_its_registered_case_modules(toy):
    assert list(engine.case_modules("trl")) == ["trl"]
    assert refs.FRAMEWORKS == ("verl", "openrlhf", "trl-ppo", "skyrl", "ms-swift")  # the default, as registered
    assert list(engine.case_modules("references")) == ["verl", "openrlhf", "trl-ppo", "skyrl", "ms-swift", "toy"]
    refs.validate(refs.ReferencesSettings(frameworks=("toy",), cases=("random",)))  # a registered one is accepted
    with pytest.raises(UsageError, match="choose from verl, openrlhf, trl-ppo, skyrl, ms-swift, toy"):
        refs.validate(refs.ReferencesSettings(frameworks=("rllib",)))
    assert {c.framework for c in refs.all_configs(["toy"], ["one_token"])} == {"toy"}
