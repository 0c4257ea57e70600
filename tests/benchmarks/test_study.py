"""The study registry (benchmarks/study.py): every check, bench and top-level study (claims, brief, ...) is a ``Study`` whose ``Settings`` fields are its flags. A plug-in study, registered in the test
process or through the entry-point group ``grpo_bench.studies``, shows its option in ``--help`` and gets the option's
value when it runs; a second, different class under a taken name is refused; each built-in study given only what it
requires gets its Settings' own defaults; a study's flags are its fields, and the top-level commands keep the flags
users type. The lifecycle is written once and no study goes around it: the paths a study reads and writes are checked
before it runs, a study that declares its report and renders it gets the report, its README section and --rerender
written for it, --rerender never measures, an existing report is replaced only with --overwrite; bad input is one
line and exit status 2."""

import dataclasses
import json
from dataclasses import MISSING
from importlib import metadata
from pathlib import Path

import pytest

from benchmarks import study
from benchmarks.cli import main as cli_main
from benchmarks.cli.main import load_studies, main
from benchmarks.cli.options import flag, settings_types
from benchmarks.io import atomic_write_json
from benchmarks.study import (GROUPS, PLUGIN_GROUPS, SHARED_OPTIONS, TOP, Study, StudySettings, earlier_report, option,
                              register_study)


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


@pytest.mark.parametrize("cls", [Echo, EchoBench], ids=PLUGIN_GROUPS)
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
    with pytest.raises(ValueError, match=r"study name 'check:trl' is taken by benchmarks.checks.commands.TrlCheck"):
        register_study(Other, name="trl")
    assert register_study(EchoBench) is EchoBench  # one name per group: bench echo is another study
    assert study.study_class("bench", "echo") is EchoBench and study.study_class("check", "echo") is Echo


def test_what_is_no_study_is_refused(registry):
    with pytest.raises(TypeError, match="not a subclass of benchmarks.study.Study"):
        register_study(EchoSettings)
    with pytest.raises(TypeError, match="Settings dataclass derived from StudySettings"):
        register_study(type("Plain", (Echo,), {"Settings": dict}))
    with pytest.raises(ValueError, match="group 'checks' is none of check, bench"):
        register_study(type("Misgrouped", (Echo,), {"group": "checks"}))
    with pytest.raises(ValueError, match=r"unknown study 'check:nope'; choose from .*check:trl"):
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
    installed(trl=f"{__name__}:Echo")
    assert main(["check", "trl"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("grpo-bench: error: plug-in trl = ") and "'check:trl' is taken" in err
    assert len(err.splitlines()) == 1


def _command(group: str, name: str) -> list[str]:
    """A study's subcommand: ``grpo-bench NAME`` for a top-level one, ``grpo-bench GROUP NAME`` for the others."""
    return [name] if group == TOP else [group, name]


def _required(settings_cls, matrix: Path, skip=()) -> tuple[list[str], dict]:
    """The command-line words of every field without a default (a positional argument or a required flag) and the
    setting each one gives: "x", or the matrix folder ``matrix`` where the study reads one."""
    words, values = [], {}
    for f in dataclasses.fields(settings_cls):
        if f.name in skip or not f.init or f.default is not MISSING or f.default_factory is not MISSING:
            continue
        text = str(matrix) if "matrix" in f.metadata else "x"
        given = [text] * f.metadata.get("nargs", 1)
        value = tuple(given) if "nargs" in f.metadata else text
        words += ([flag(f.name)] if f.metadata.get("required") else []) + given
        values[f.name] = [value] if settings_types(settings_cls)[f.name][1] is list else value
    return words, values


@pytest.fixture
def matrix(tmp_path, monkeypatch):
    """A matrix folder (its matrix.json), and the test run in tmp_path: what a study writes by default lands there."""
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "matrix.json").write_text(json.dumps({"name": "m", "cells": []}))
    return folder


def _all_studies():
    load_studies()
    return sorted(tuple(key.split(":")) for key in study.STUDIES)


@pytest.mark.parametrize("group", GROUPS)
def test_every_built_in_study_given_only_what_it_requires_gets_its_settings_defaults(registry, group, matrix, monkeypatch):
    seen = []
    names = study.studies(group)
    assert len(names) >= {"check": 2, "bench": 3, TOP: 6}[group]
    for name, cls in names.items():
        monkeypatch.setattr(cls, "run", lambda self, settings, command: seen.append(settings) or 0)
        words, values = _required(cls.Settings, matrix)
        assert main([*_command(group, name), *words]) == 0, name
        assert seen[-1] == cls.Settings(**values), name


def test_the_shared_options_have_one_help_text():
    """A shared option is declared with option() and keeps its one help text; only an --out that names one file
    (not the usual folder) words its own."""
    load_studies()
    for key, cls in study.STUDIES.items():
        for f in dataclasses.fields(cls.Settings):
            if f.name in SHARED_OPTIONS and f.init:
                assert f.metadata.get("shared") == f.name, (key, f.name)
                if f.metadata.get("writes") != "file" or f.name != "out":
                    assert f.metadata["help"].startswith(SHARED_OPTIONS[f.name][0]), (key, f.name)


# --- the top-level studies: grpo-bench NAME ------------------------------------------------------------------------


def test_every_top_level_study_is_a_listed_command_and_every_listed_study_is_registered():
    """main.COMMANDS lists the top-level commands without importing anything; the registry holds the same ones, each
    with the same line of help (tests/benchmarks/cli/test_main_adversary.py holds the parsers' help to COMMANDS
    too)."""
    load_studies()
    listed = {name for name, (_, function, _) in cli_main.COMMANDS.items() if function == "add_study_command"}
    assert listed == set(study.studies(TOP)) | (set(GROUPS) - {TOP})
    for name, cls in study.studies(TOP).items():
        assert cli_main.COMMANDS[name][2] == cls.help, name
    assert {"matrix", "report", "run", "eval"}.isdisjoint(study.studies(TOP))


# Every flag of the commands that became studies, as users (the README, the reports' "Regenerate" lines, .ci) type
# them: (flag or positional, required, values per flag, default). A change to a name or a default fails here.
INTERFACE = {
    "agreement": [("first", True, None, None), ("second", True, None, None), ("--out", True, None, None)],
    "claims": [("dirs", True, "+", None), ("--out", False, None, "results/claims.md"), ("--readme", False, None, ""),
               ("--section", False, None, "claims")],
    "variance": [("dirs", True, "+", None), ("--out", True, None, None), ("--readme", False, None, ""),
                 ("--section", False, None, "variance"), ("--target-mdd", False, None, 0.05),
                 ("--variants", False, None, 8), ("--questions", False, "+", [200, 500, 1000]),
                 ("--metrics", False, "+", ["final", "last_2", "last_3", "auc"])],
    "calibration": [("dirs", True, "+", None), ("--aa", False, "+", []), ("--out", False, None, "results/calibration"),
                    ("--sims", False, None, 2000), ("--claims-sims", False, None, None), ("--claims", False, "+", []), ("--plans", False, "+", [])],
    "readme": [("--readme", False, None, "results/checks.md"), ("--matrices", False, None, "results/matrices.md"),
               ("--matrix-dir", False, None, "benchmarks/matrices"), ("--html", False, None, "results/index.html")],
}


def _parser(command: str):
    sub = cli_main.build_parser()._subparsers._group_actions[0]
    name, _, member = command.partition(" ")
    parser = sub.parser_of(name)
    return parser._subparsers._group_actions[0].choices[member] if member else parser


@pytest.mark.parametrize("command", INTERFACE)
def test_the_flags_of_each_command_that_became_a_study_are_as_users_type_them(command):
    parser = _parser(command)
    group, name = parser.get_default("study")
    defaults = {f.name: (f.default_factory() if f.default_factory is not MISSING else f.default)
                for f in dataclasses.fields(study.study_class(group, name).Settings)}
    actions = [a for a in parser._actions if a.dest != "help"]
    shown = [(a.option_strings[0] if a.option_strings else a.dest, a.required, a.nargs,
              None if defaults[a.dest] is MISSING else defaults[a.dest]) for a in actions]
    assert shown == [(flag, required, 0 if default is False else nargs, default)
                     for flag, required, nargs, default in INTERFACE[command]]


@pytest.mark.parametrize("key", [":".join(k) for k in _all_studies()])
def test_a_studys_flags_are_its_settings_fields(key):
    """One flag per field its __init__ takes, no other: a positional argument for a field without a default, a
    required flag where its metadata says so, every flag's default None (the Settings' own default applies), and the
    field's help in the flag's."""
    group, name = key.split(":")
    parser = _parser(" ".join(_command(group, name)) if group != TOP else name)
    fields = {f.name: f for f in dataclasses.fields(study.study_class(group, name).Settings) if f.init}
    actions = {a.dest: a for a in parser._actions if a.dest != "help"}
    assert set(actions) == set(fields)
    for name, f in fields.items():
        a, no_default = actions[name], f.default is MISSING and f.default_factory is MISSING
        assert (not a.option_strings) == (no_default and not f.metadata.get("required")), name
        assert a.required == bool(no_default), name
        assert a.default is None, name
        if not f.metadata.get("hidden"):
            assert f.metadata["help"] in a.help.replace("%%", "%"), name


# --- the lifecycle, written once (Study.start): paths first, --rerender measures nothing -----------------------


def _measures(self, settings, command):
    raise AssertionError(f"{type(self).__name__} measured")


@pytest.mark.parametrize("key", [":".join(k) for k in _all_studies()])
def test_every_path_a_study_writes_is_checked_before_it_runs(key, registry, matrix, monkeypatch, capsys):
    group, name = key.split(":")
    cls = study.study_class(group, name)
    monkeypatch.setattr(cls, "run", _measures)
    a_file, a_folder = matrix / "a-file", matrix / "a-folder"
    a_file.write_text("not a folder\n")
    a_folder.mkdir()
    for f in dataclasses.fields(cls.Settings):
        if not f.metadata.get("writes"):
            continue
        wrong = a_file if f.metadata["writes"] == "folder" else a_folder
        words, _ = _required(cls.Settings, matrix, skip=(f.name,))
        assert main([*_command(group, name), *words, flag(f.name), str(wrong)]) == 2, (key, f.name)
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"grpo-bench: error: {flag(f.name)} {wrong}: ") and len(err.splitlines()) == 1


@pytest.mark.parametrize("key", [k for k in (":".join(k) for k in _all_studies())
                                 if any(f.metadata.get("matrix") is not None for f in
                                        dataclasses.fields(study.study_class(*k.split(":")).Settings))])
def test_every_matrix_folder_a_study_reads_is_checked_before_it_runs(key, registry, matrix, monkeypatch, capsys):
    group, name = key.split(":")
    cls = study.study_class(group, name)
    monkeypatch.setattr(cls, "run", _measures)
    words, _ = _required(cls.Settings, matrix.parent / "missing")
    assert main([*_command(group, name), *words]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith(f"{matrix.parent / 'missing'}: no such folder") and len(err.splitlines()) == 1


def test_rerender_writes_the_report_again_and_measures_nothing(registry, matrix, monkeypatch):
    rerendered = []
    with_rerender = {k: cls for k, cls in study.STUDIES.items()
                     if "rerender" in {f.name for f in dataclasses.fields(cls.Settings)}}
    assert {"bench:grpo-vs-trl", "bench:rloo-vs-trl"} <= set(with_rerender)
    for key, cls in with_rerender.items():
        monkeypatch.setattr(cls, "run", _measures)
        monkeypatch.setattr(cls, "rerender", lambda self, settings, command: rerendered.append(key) or 0)
        words, _ = _required(cls.Settings, matrix)
        assert main([*_command(*key.split(":")), *words, "--rerender"]) == 0
    assert rerendered == list(with_rerender)


def test_no_built_in_study_writes_its_report_again_around_the_shared_lifecycle():
    """Every built-in study with --rerender takes the shared one (its json read, rendered, written), declaring the
    json it renders from; each one that declares a report file renders it."""
    load_studies()
    for key, cls in study.STUDIES.items():
        if "rerender" in {f.name for f in dataclasses.fields(cls.Settings)}:
            assert cls.rerender is Study.rerender and cls.source_file.endswith(".json"), key
        if cls.report_file or cls.title:
            assert cls.render is not Study.render, key


@dataclasses.dataclass
class LedgerSettings(StudySettings):
    parts: list[str] = dataclasses.field(default_factory=lambda: ["a", "b"], metadata={"help": "parts to measure"})
    out: str = option("out", "ledger")
    readme: str = option("readme", "")
    section: str = option("section", "ledger")
    resume: bool = option("resume", one_of="again")
    overwrite: bool = option("overwrite", one_of="again")
    rerender: bool = option("rerender")


MEASURED = []


class Ledger(Study):
    """A plug-in study that measures parts and declares its report: it has a Settings, run and render, and nothing of
    --resume, --overwrite, --rerender or --readme beyond what it declares: --resume measures what the report lacks,
    --overwrite replaces it, --rerender writes report.md (and the README section) again from ledger.json."""

    name, group = "ledger", "bench"
    help = "measures its parts into OUT/ledger.json"
    Settings = LedgerSettings
    report_file, source_file, title = "report.md", "ledger.json", "Ledger"

    def run(self, s: LedgerSettings, command: str) -> int:
        path = Path(s.out) / "ledger.json"
        earlier = earlier_report(s, path, "the parts")
        kept = earlier["parts"] if earlier and earlier["command"] == command.split(" --")[0] else {}
        parts = {**kept, **{p: MEASURED.append(p) or len(p) for p in s.parts if p not in kept}}
        result = {"command": command.split(" --")[0], "parts": parts}
        atomic_write_json(path, result)
        self.write(result, s, command)
        return 0

    def render(self, result: dict, s: LedgerSettings, command: str) -> str:
        return ", ".join(f"{part} {size}" for part, size in result["parts"].items()) + "\n"


def test_an_existing_report_is_replaced_only_with_overwrite_and_resume_measures_what_it_lacks(registry, tmp_path,
                                                                                               monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    register_study(Ledger)
    MEASURED.clear()
    assert main(["bench", "ledger"]) == 0 and MEASURED == ["a", "b"]
    first = (tmp_path / "ledger" / "ledger.json").read_text()
    assert main(["bench", "ledger", "--parts", "c"]) == 2  # a measured report is never replaced unasked
    err = capsys.readouterr().err.strip()
    assert err == (f"grpo-bench: error: {Path('ledger') / 'ledger.json'} holds a measured report; --resume to "
                   "measure the parts it lacks, or --overwrite to replace it")
    assert (tmp_path / "ledger" / "ledger.json").read_text() == first and MEASURED == ["a", "b"]
    assert main(["bench", "ledger", "--parts", "a", "c", "--resume"]) == 0 and MEASURED == ["a", "b", "c"]
    assert (tmp_path / "ledger" / "report.md").read_text() == "# Ledger\n\na 1, b 1, c 1\n"
    assert main(["bench", "ledger", "--parts", "a", "--overwrite"]) == 0 and MEASURED == ["a", "b", "c", "a"]
    assert (tmp_path / "ledger" / "report.md").read_text() == "# Ledger\n\na 1\n"
    (tmp_path / "ledger" / "report.md").unlink()
    assert main(["bench", "ledger", "--rerender"]) == 0 and MEASURED == ["a", "b", "c", "a"]
    assert (tmp_path / "ledger" / "report.md").read_text() == "# Ledger\n\na 1\n"
    assert main(["bench", "ledger", "--rerender", "--out", "elsewhere"]) == 2
    assert capsys.readouterr().err.startswith("grpo-bench: error: --rerender needs a finished report in elsewhere")
    assert main(["bench", "ledger", "--resume", "--overwrite"]) == 2  # one or the other


def test_a_study_that_declares_its_report_gets_rerender_and_its_readme_section_written_once(registry, tmp_path,
                                                                                          monkeypatch, capsys):
    """The report and its README section are written by the lifecycle from the study's render: the same bytes from
    run and from --rerender (which reads the json and measures nothing), the section in place between its markers
    and nothing else of the page touched; --rerender without the json is one line and exit status 2."""
    monkeypatch.chdir(tmp_path)
    register_study(Ledger)
    MEASURED.clear()
    page = tmp_path / "README.md"
    page.write_text("# Page\n\n<!-- grpo-bench:ledger -->\nold\n<!-- /grpo-bench:ledger -->\n\nkept\n")
    assert main(["bench", "ledger", "--parts", "a", "bb", "--readme", "README.md"]) == 0 and MEASURED == ["a", "bb"]
    report = tmp_path / "ledger" / "report.md"
    written = report.read_bytes()
    assert written == b"# Ledger\n\na 1, bb 2\n"
    section = "# Page\n\n<!-- grpo-bench:ledger -->\na 1, bb 2\n<!-- /grpo-bench:ledger -->\n\nkept\n"
    assert page.read_text() == section
    report.unlink()
    page.write_text("# Page\n")
    capsys.readouterr()
    assert main(["bench", "ledger", "--rerender", "--readme", "README.md", "--section", "other"]) == 0
    assert MEASURED == ["a", "bb"] and report.read_bytes() == written  # nothing measured, the same bytes
    assert page.read_text() == "# Page\n\n<!-- grpo-bench:other -->\na 1, bb 2\n<!-- /grpo-bench:other -->\n"
    assert capsys.readouterr().out == f"rewrote {Path('ledger') / 'report.md'} from ledger.json\n"
    assert main(["bench", "ledger", "--rerender"]) == 0 and page.read_text().count("grpo-bench:") == 2  # no --readme
    (tmp_path / "ledger" / "ledger.json").write_text('{"command": "x"}')  # a json without the parts its report shows
    assert main(["bench", "ledger", "--rerender"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"grpo-bench: error: --rerender needs a finished report in {Path('ledger') / 'ledger.json'}: "
                   "KeyError('parts')")
    assert main(["bench", "ledger", "--rerender", "--out", "none"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"grpo-bench: error: --rerender needs a finished report in {Path('none') / 'ledger.json'}: ")
    assert len(err.splitlines()) == 1


class Sectioned(Ledger):
    """Its README section is not its report's body; its --out names the report itself."""

    name, report_file, title = "sectioned", "", ""
    Settings = dataclasses.make_dataclass("SectionedSettings", [
        ("out", str, option("out", "s.md", file="the report")), ("readme", str, option("readme", "")),
        ("section", str, option("section", "sectioned"))], bases=(StudySettings,))

    def run(self, s, command: str) -> int:
        self.write({"parts": {"x": 1}}, s, command)
        return 0

    def render_section(self, result: dict, s, command: str, body: str) -> str:
        return f"see {s.out}: {body}"


def test_a_studys_readme_section_is_its_render_section_and_out_may_name_the_report(registry, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    register_study(Sectioned)
    assert main(["bench", "sectioned", "--readme", "R.md"]) == 0
    assert (tmp_path / "s.md").read_text() == "x 1\n"
    assert (tmp_path / "R.md").read_text() == "\n\n<!-- grpo-bench:sectioned -->\nsee s.md: x 1\n<!-- /grpo-bench:sectioned -->\n"


def test_a_study_with_rerender_but_no_json_to_render_from_is_refused(registry):
    with pytest.raises(TypeError, match="study NoSource has --rerender but no source_file"):
        register_study(type("NoSource", (Ledger,), {"name": "no-source", "source_file": ""}))


def test_the_studies_with_overwrite_refuse_through_the_shared_lifecycle():
    """Every study with --overwrite has --resume too, both the shared options (their help and their exclusion)."""
    load_studies()
    for key, cls in study.STUDIES.items():
        fields = {f.name: f for f in dataclasses.fields(cls.Settings)}
        if "overwrite" in fields:
            assert "resume" in fields, key
            assert fields["overwrite"].metadata.get("one_of") == fields["resume"].metadata.get("one_of") is not None


# --- bad input: one line, exit status 2, nothing measured ---------------------------------------------------------


@pytest.mark.parametrize("argv, line", [
    (["agreement", "M", "M"], "the following arguments are required: --out"),
    (["claims"], "the following arguments are required: dirs"),
    (["claims", "M", "--nope"], "unrecognized arguments: --nope"),
    (["brief", "M", "--toy", "M", "--pair", "a", "--out", "t.md"], "argument --pair: expected 2 arguments"),
    (["brief", "M", "--toy", "M", "--pair", "a", "a", "--pair", "b", "a", "--out", "t.md"],
     "--pair: each variant at most once on each side"),
    (["variance", "M", "--out", "v.md", "--target-mdd", "2"], "--target-mdd must be in (0, 1), got 2"),
    (["variance", "M", "--out", "v.md", "--variants", "many"], "argument --variants: invalid int value: 'many'"),
    (["calibration", "M", "--sims", "5"], "--sims must be at least 100, got 5"),
    (["calibration", "M", "--aa", "nowhere"], "nowhere: no such folder"),
    (["check", "nope"], "argument check: invalid choice: 'nope'"),
])
def test_bad_input_to_a_top_level_study_is_one_line_and_exit_2(argv, line, matrix, capsys):
    assert main([str(matrix) if word == "M" else word for word in argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("grpo-bench: error: ") and line in err and len(err.splitlines()) == 1


def test_every_device_flag_has_one_default_and_one_help():
    """``--device`` means one thing with one default wherever it appears: the studies' shared option, ``run`` and
    ``eval`` (auto: CUDA when present, else the CPU)."""
    load_studies()
    seen = []
    for group in GROUPS:
        for name, cls in study.studies(group).items():
            fields = {f.name: f for f in dataclasses.fields(cls.Settings)}
            if "device" in fields:
                seen.append(name)
                assert fields["device"].default == "auto", name
                assert fields["device"].metadata["help"] == "auto, cpu or cuda", name
    assert {"grpo-vs-trl", "rloo-vs-trl", "roof"} <= set(seen)
    for command in ("run", "eval"):
        (device,) = [a for a in cli_main.build_parser()._subparsers._group_actions[0].parser_of(command)._actions
                     if "--device" in a.option_strings]
        # run's flags default to None and take their defaults from the settings resolver, which says auto
        assert device.default in ("auto", None) and device.help == "auto, cpu or cuda (default: auto)", command
