"""The install of the two new pinned frameworks: SkyRL as a 3.12 wheel with its light imports beside it, and a
distribution whose name has a dash (ms-swift) found by the dist-info pip writes."""

from benchmarks.references import install


def test_skyrl_is_fetched_as_a_312_wheel_with_its_light_imports():
    command = install.install_command("skyrl")
    assert command[command.index("--python-version") + 1] == "3.12" and "--only-binary=:all:" in command
    assert command.index("skyrl==0.4.0") < command.index("jaxtyping==0.3.11") and "loguru==0.8.0" in command
    assert "--python-version" not in install.install_command("verl")


def test_a_dashed_distribution_is_installed_by_its_underscored_dist_info(tmp_path, monkeypatch):
    monkeypatch.setenv("GRPO_BENCH_REFERENCES", str(tmp_path))
    assert not install.is_installed("ms-swift")
    (tmp_path / "ms-swift-4.6.0" / "ms_swift-4.6.0.dist-info").mkdir(parents=True)  # what pip writes
    assert install.is_installed("ms-swift")
