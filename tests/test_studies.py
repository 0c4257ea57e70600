"""The study registry (benchmarks/study.py): every check and bench is a ``Study`` whose ``Settings`` fields are its
flags. A plug-in study, registered in the test process or through the entry-point group ``grpo_bench.studies``,
shows its option in ``--help`` and gets the option's value when it runs; a second, different class under a taken
name is refused; each built-in study run without flags gets its Settings' own defaults."""

import dataclasses
from importlib import metadata

import pytest

from benchmarks import study
from benchmarks.cli.main import main
from benchmarks.cli.options import settings_types
from benchmarks.cli.studies import load_studies
from benchmarks.study import GROUPS, SHARED_OPTIONS, Study, StudySettings, option, register_study


@dataclasses.dataclass
class EchoSettings(StudySettings):
    level: int = dataclasses.field(default=1, metadata={"help": "how loud the echo is"})
    out: str = option("out", "results/echo")


RUNS = []


class Echo(Study):
    name, group = "echo", "check"
    help = "a plug-in study that records what it was asked"
    Settings = EchoSettings

    def run(self, settings: EchoSettings, command: str) -> int:
        RUNS.append((settings, command))
        return 0


class EchoBench(Echo):
    group = "bench"


@pytest.fixture
def registry(monkeypatch):
    """The built-in studies registered, then a copy of the registry: what a test registers leaves with it."""
    load_studies()
    monkeypatch.setattr(study, "STUDIES", dict(study.STUDIES))
    RUNS.clear()


@pytest.mark.parametrize("cls", [Echo, EchoBench], ids=GROUPS)
def test_a_registered_study_is_a_subcommand_with_its_option_as_a_flag(registry, cls, capsys):
    register_study(cls)
    with pytest.raises(SystemExit):
        main([cls.group, "--help"])
    assert "a plug-in study that records what it was asked" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main([cls.group, "echo", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--level LEVEL how loud the echo is (default: 1)" in text and "(default: results/echo)" in text
    assert main([cls.group, "echo", "--level", "3"]) == 0
    assert RUNS == [(EchoSettings(level=3), f"grpo-bench {cls.group} echo --level 3")]
    assert main([cls.group, "echo", "--level", "loud"]) == 2  # bad input: one line, exit 2
    assert capsys.readouterr().err.strip() == "grpo-bench: error: argument --level: invalid int value: 'loud'"


def test_a_second_class_under_a_taken_name_is_refused(registry):
    register_study(Echo)
    register_study(Echo)  # the same class again (a module imported twice): a no-op

    class Other(Echo):
        pass

    with pytest.raises(ValueError, match=r"study name 'check:echo' is taken by .*Echo; .*Other needs another name"):
        register_study(Other)
    with pytest.raises(ValueError, match=r"study name 'check:mu1' is taken by benchmarks.checks.studies.Mu1Check"):
        register_study(Other, name="mu1")
    assert register_study(EchoBench) is EchoBench  # one name per group: bench echo is another study
    assert study.study_class("bench", "echo") is EchoBench and study.study_class("check", "echo") is Echo


def test_what_is_no_study_is_refused(registry):
    with pytest.raises(TypeError, match="not a subclass of benchmarks.study.Study"):
        register_study(EchoSettings)
    with pytest.raises(TypeError, match="Settings dataclass derived from StudySettings"):
        register_study(type("Plain", (Echo,), {"Settings": dict}))
    with pytest.raises(ValueError, match="group 'checks' is none of check, bench"):
        register_study(type("Misgrouped", (Echo,), {"group": "checks"}))
    with pytest.raises(ValueError, match=r"unknown study 'check:nope'; choose from .*check:mu1"):
        study.study_class("check", "nope")


@pytest.fixture
def installed(registry, monkeypatch):
    """Installs entry points of ``grpo_bench.studies`` as a distribution would declare them."""
    import benchmarks.plugins as plugins

    def install(**entries):
        points = [metadata.EntryPoint(name, value, "grpo_bench.studies") for name, value in entries.items()]
        monkeypatch.setattr(plugins.metadata, "entry_points",
                            lambda group: points if group == "grpo_bench.studies" else [])
        monkeypatch.setattr(study, "_plugins_loaded", False)

    return install


def test_an_installed_study_runs_under_its_entry_point_name(installed):
    installed(loud=f"{__name__}:Echo")
    assert main(["check", "loud", "--level", "5"]) == 0
    assert RUNS == [(EchoSettings(level=5), "grpo-bench check loud --level 5")]
    assert study.load_study_plugins() == []  # read once per process


def test_an_installed_study_cannot_take_a_built_in_name(installed, capsys):
    installed(mu1=f"{__name__}:Echo")
    assert main(["check", "mu1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("grpo-bench: error: plug-in mu1 = ") and "'check:mu1' is taken" in err
    assert len(err.splitlines()) == 1


def _given_positionals(settings_cls) -> dict:
    """A value for each field without a default (a positional argument): its command-line text and its setting."""
    values = {}
    for f in dataclasses.fields(settings_cls):
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            values[f.name] = ("x", ["x"]) if settings_types(settings_cls)[f.name][1] is list else ("x", "x")
    return values


@pytest.mark.parametrize("group", GROUPS)
def test_every_built_in_study_without_flags_gets_its_settings_defaults(registry, group, monkeypatch):
    seen = []
    names = study.studies(group)
    assert len(names) >= 6
    for name, cls in names.items():
        monkeypatch.setattr(cls, "run", lambda self, settings, command: seen.append(settings) or 0)
        positional = _given_positionals(cls.Settings)
        assert main([group, name, *(text for text, _ in positional.values())]) == 0
        assert seen[-1] == cls.Settings(**{k: value for k, (_, value) in positional.items()}), name


def test_the_shared_options_have_one_help_text():
    load_studies()
    for key, cls in study.STUDIES.items():
        for f in dataclasses.fields(cls.Settings):
            if f.name in SHARED_OPTIONS and f.init:
                assert f.metadata["help"].startswith(SHARED_OPTIONS[f.name][0]), (key, f.name)
