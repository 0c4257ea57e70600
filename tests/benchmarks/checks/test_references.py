"""The reference check (benchmarks/checks/references.py, the case modules of benchmarks/checks/cases/ run by
benchmarks/checks/engine.py): our estimators and losses against verl 0.9.1, OpenRLHF 0.11.2, TRL 1.12.0's PPO,
SkyRL 0.4.0 and ms-swift 4.6.0.
The frameworks are fetched once per session into $GRPO_BENCH_REFERENCES (default
~/.cache/grpo-bench/references) with `pip install --no-deps --target`; the full grid runs in
`grpo-bench check references`, here a few configurations per framework, planted errors, the command line and the
feature table."""

import torch
import pytest

from algorithms import estimators, kl, losses, policy_losses
from benchmarks.checks import engine
from benchmarks.checks import references as refs
from benchmarks.checks.cases import tensors
from benchmarks.checks.cases.tensors import make_batch
from benchmarks.references import adapters, features, install, trl_ppo


@pytest.fixture(scope="session")
def frameworks():
    install.install(log=lambda line: None)
    return install.cache_root()


def _pick(configs, framework, group, function, case="random", knobs=None):
    for c in configs:
        if (c.framework, c.group, c.function, c.case) == (framework, group, function, case) and \
                (knobs is None or c.knobs == knobs):
            return c
    raise AssertionError(f"no configuration {framework} {group} {function} {case} {knobs}")


def test_grid_covers_every_framework_case_and_edge(frameworks):
    configs = refs.all_configs()
    assert len(configs) >= 300
    assert {c.framework for c in configs} == set(refs.FRAMEWORKS)
    assert {c.case for c in configs} == set(refs.CASES)
    for fw in refs.FRAMEWORKS:
        assert any(c.framework == fw and c.by_design for c in configs), fw
    # every registered estimator verl has, and every verl-mapped policy loss, is compared
    compared = {(c.framework, c.group, c.function) for c in configs}
    for name in ("grpo", "rloo", "remax", "gpg", "opo", "grpo_passk", "optimal_token_baseline", "reinforce_plus_plus"):
        assert ("verl", "estimator", name) in compared, name
    for name in ("grpo", "bnpo", "dr_grpo", "dual_clip", "gmpo", "sapo", "cispo", "dppo_tv", "dppo_kl", "kl_cov"):
        assert ("verl", "policy_loss", name) in compared, name


@pytest.mark.parametrize("framework,group,function,knobs", [
    ("verl", "policy_loss", "bnpo", "epsilon=0.2, epsilon_high=0.28"),
    ("verl", "policy_loss", "dual_clip", "epsilon=0.2, epsilon_high=0.2, clip_ratio_c=3.0"),
    ("verl", "policy_loss", "grpo(level=sequence)", None),
    ("verl", "kl", "low_var_kl", None),
    ("verl", "estimator", "rloo", None),
    ("verl", "estimator", "optimal_token_baseline", None),
    ("verl", "gae", "gae + masked_whiten", "gamma=0.99, lam=0.95"),
    ("verl", "value_loss", "ppo_value_loss", "value_clip=0.2"),
    ("openrlhf", "policy_loss", "dual_clip", None),
    ("openrlhf", "kl", "approx_kl(k3)", None),
    ("openrlhf", "estimator", "reinforce_pp_advantages(group_baseline=True)", "kl_coef=0.05"),
    ("openrlhf", "gae", "gae + batch_whiten", None),
    ("trl-ppo", "gae", "gae + masked_whiten (TRL's layout)", None),
    ("trl-ppo", "ppo_policy_loss", "ppo_policy_loss", None),
    ("trl-ppo", "value_loss", "ppo_value_loss (TRL's value mask)", None),
])
@pytest.mark.parametrize("case", ["random", "empty", "long"])
def test_configurations_agree(frameworks, framework, group, function, knobs, case):
    config = _pick(refs.all_configs([framework], [case]), framework, group, function, case, knobs)
    row = engine.run_config(config, make_batch(config.case, config.seed))
    assert row.status == "agrees", (row.value_diff, row.grad_diff, row.error)
    assert row.value_diff < 1e-6 and (row.grad_diff is None or row.grad_diff < 1e-6)


def test_difference_by_design_shows_and_the_matching_knob_agrees(frameworks):
    configs = refs.all_configs(["trl-ppo", "verl"], ["empty"])
    batch = make_batch("empty", 0)
    rows = {(c.framework, c.function): engine.run_config(c, batch) for c in configs
            if c.function in ("ppo_value_loss", "ppo_value_loss (TRL's value mask)", "grpo", "grpo(level=sequence)")
            and c.group in ("value_loss", "policy_loss")}
    assert rows[("trl-ppo", "ppo_value_loss")].status == "differs by design"
    assert "padding_mask_p1" in rows[("trl-ppo", "ppo_value_loss")].reason
    assert rows[("trl-ppo", "ppo_value_loss (TRL's value mask)")].status == "agrees"
    assert rows[("verl", "grpo")].status == "differs by design"  # all-masked rows: 1/G vs the non-empty rows


@pytest.mark.parametrize("plant", ["clip-sign", "gae-off-by-one", "whiten-biased-std", "k3-reversed"])
def test_planted_error_fails_the_check(frameworks, plant):
    configs = refs.all_configs(refs.FRAMEWORKS, ["random"])
    objective, k3, gae = policy_losses.GRPOClip.objective, kl.KL_PENALTIES["k3"], losses.gae
    (chosen,) = [p for p in refs.PLANTS if p.name == plant]
    result = refs.run_plant(chosen, configs)
    assert result.caught and result.failed > 0 and result.example
    # the plant is gone afterwards, and the same rows agree again
    assert (policy_losses.GRPOClip.objective, kl.KL_PENALTIES["k3"], losses.gae) == (objective, k3, gae)
    again = refs.run_configs([c for c in configs if c.group in chosen.groups and c.by_design is None and not c.skip])
    assert all(r.status == "agrees" for r in again), [r for r in again if r.status != "agrees"][:2]


def test_missing_framework_is_one_line_naming_install(run_cli, tmp_path, monkeypatch):
    monkeypatch.setenv("GRPO_BENCH_REFERENCES", str(tmp_path / "empty"))
    code, out, err = run_cli("check", "references", "--out", tmp_path / "out")
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "--install" in lines[0] and "verl 0.9.1" in lines[0]
    assert not (tmp_path / "out" / "references.md").exists()


def test_cli_reduced_set_writes_the_report(frameworks, run_cli, tmp_path):
    out = tmp_path / "refs"
    code, stdout, err = run_cli("check", "references", "--out", out, "--cases", "random", "one_token",
                                "--frameworks", "openrlhf", "trl-ppo")
    assert code == 0, stdout + err
    report = (out / "references.md").read_text()
    assert "every compared function agrees" in report
    assert "planted errors caught" in report and "| clip-sign |" in report
    csv_lines = (out / "references.csv").read_text().splitlines()
    assert csv_lines[0].startswith("framework,group,function,theirs") and len(csv_lines) > 50
    assert "differs by design" in (out / "references.csv").read_text()
    assert "OpenRLHF 0.11.2" in (out / "features.md").read_text()
    code, stdout, _ = run_cli("check", "references", "--frameworks", "trl-ppo", "--cases", "random",
                              "--plant", "value-clip-dropped", "--out", tmp_path / "unused")
    assert code == 1 and "caught" in stdout and not (tmp_path / "unused").exists()


def test_unknown_names_are_usage_errors(run_cli, tmp_path):
    code, _, err = run_cli("check", "references", "--frameworks", "rllib", "--out", tmp_path)
    assert code == 2 and "rllib" in err and "verl" in err
    code, _, err = run_cli("check", "references", "--plant", "nope", "--out", tmp_path)
    assert code == 2 and "clip-sign" in err


def test_feature_table_lists_plugins(frameworks):
    def plugin_objective(*, ratio, adv, **_):
        return -ratio * adv

    def plugin_estimator(rewards, *, group_size, **_):
        return rewards - rewards.mean()

    policy_losses.register_policy_loss("test_plugin_loss", aggregation="token-mean")(plugin_objective)
    estimators.register_advantage_estimator("test_plugin_estimator")(plugin_estimator)
    try:
        text = features.feature_report([])
        plugin_row = next(line for line in text.splitlines() if line.startswith("| `test_plugin_loss` |"))
        assert "aggregation `token-mean`" in plugin_row and plugin_row.count("| - ") == len(adapters.columns())
        assert "| `test_plugin_estimator` |" in text
        for name in ("grpo", "dual_clip", "seq-mean-token-mean", "low_var_kl", "gae"):
            assert f"| `{name}` |" in text, name
        assert "(grpo_vectorized)" in text and "(prompt_mean)" in text and "(dro)" in text  # theirs only
    finally:
        del policy_losses.POLICY_LOSSES["test_plugin_loss"]
        del estimators.ADVANTAGE_ESTIMATORS["test_plugin_estimator"]
    assert "test_plugin_loss" not in features.feature_report([])


def test_readme_feature_summary_counts_the_registries(frameworks, tmp_path):
    rows = refs.run_configs(refs.all_configs(["verl"], ["random"]))
    text = features.feature_summary(rows)
    lines = {line.split(" | ")[0].lstrip("| "): line for line in text.splitlines() if line.startswith("| ")}
    assert f"| {len(policy_losses.POLICY_LOSSES)} |" in lines["policy losses"]
    assert f"| {len(estimators.ADVANTAGE_ESTIMATORS) + 1} |" in lines["advantage estimators"]
    verl_counts = lines["`grpo-bench check references` rows"]
    assert f"{sum(r.status == 'agrees' for r in rows)} agrees" in verl_counts and "not run" in verl_counts  # openrlhf
    assert "| `grpo` | algorithms.grpo | GRPOTrainer |" in text
    readme = tmp_path / "README.md"
    readme.write_text("# x\n\n<!-- grpo-bench:features -->\nold\n<!-- /grpo-bench:features -->\n")
    from benchmarks.markdown import update_section
    update_section(readme, "features", text)
    assert "old" not in readme.read_text() and "| policy losses |" in readme.read_text()


def test_trl_ppo_code_is_read_from_the_pinned_file(frameworks, monkeypatch):
    assert trl_ppo.invalid_logprob() == 1.0
    assert "lastgaelam = delta + args.gamma * args.lam * lastgaelam" in trl_ppo.block("advantages")
    x = torch.tensor([[1.0, 2.0, 3.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 0]], dtype=torch.bool)
    assert torch.allclose(trl_ppo.masked_whiten(x, mask)[mask], losses.masked_whiten(x, mask.double())[mask])
    monkeypatch.setitem(trl_ppo.BLOCKS, "advantages", ("no such line", "nor this"))
    with pytest.raises(install.MissingFramework, match="not the pinned file"):
        trl_ppo.block("advantages")


# The 2026 members against the frameworks that ship them: (framework, group, function, our registry, our name).
NEW_MEMBERS = [
    ("skyrl", "estimator", "maxrl", estimators.ADVANTAGE_ESTIMATORS, "maxrl"),
    ("openrlhf", "estimator", "flash_reinforce", estimators.ADVANTAGE_ESTIMATORS, "flash_reinforce"),
    ("ms-swift", "policy_loss", "real", policy_losses.POLICY_LOSSES, "real"),
    ("ms-swift", "policy_loss", "fipo", policy_losses.POLICY_LOSSES, "fipo"),
    ("skyrl", "sampler_correction", "sequence_geometric_mask", None, "sequence_geometric_mask"),
    ("skyrl", "sampler_correction", "sequence_outlier_mask (bnpo)", None, "sequence_outlier_mask"),
    ("verl", "sampler_correction", "sequence_geometric_mask", None, "sequence_geometric_mask"),
    ("verl", "sampler_correction", "bypass (bnpo)", None, "bypass"),
    ("openrlhf", "sampler_correction", "gated (bnpo)", None, "gated"),
]


@pytest.mark.parametrize("framework,group,function,registry,name", NEW_MEMBERS)
def test_new_members_agree_with_their_frameworks(frameworks, framework, group, function, registry, name):
    registry = tensors.sampler_corrections() if registry is None else registry
    configs = [c for c in refs.all_configs([framework], ["random", "far"])
               if (c.group, c.function) == (group, function) and c.by_design is None]
    assert configs
    if name not in registry:
        assert all(c.skip and name in c.skip for c in configs)  # skipped, never failed, before the member lands
        pytest.skip(f"this suite has no {name} yet")
    rows = refs.run_configs(configs)
    assert all(r.status == "agrees" for r in rows), [(r.knobs, r.case, r.value_diff, r.error) for r in rows][:3]


@pytest.mark.parametrize("plant", ["maxrl-divides-by-std", "flash-reinforce-group-mean", "real-signs-swapped",
                                   "fipo-past-kl", "geometric-mask-product", "outlier-token-only",
                                   "gate-drops-is-weight", "bypass-keeps-old-logps"])
def test_new_members_planted_errors_are_caught(frameworks, plant):
    chosen = [p for p in refs.PLANTS if p.name == plant]
    if not chosen:
        pytest.skip(f"{plant}: this suite lacks its member")
    configs = refs.all_configs(refs.FRAMEWORKS, ["random", "far"])
    result = refs.run_plant(chosen[0], configs)
    assert result.caught, result


def test_missing_member_is_a_skip_reason():
    assert tensors.missing({"a": 1}, "a", "policy loss") is None
    assert tensors.missing({}, "real", "policy loss") == "this suite has no policy loss 'real'"
