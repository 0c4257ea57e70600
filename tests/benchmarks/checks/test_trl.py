"""Our GRPO / RLOO losses, advantages and DPO loss against TRL's own trainers: TRL 1.16's case module
(benchmarks/checks/cases/trl.py) run by the reference checks' engine, and its view ``grpo-bench check trl``
(benchmarks/checks/trl.py).

The full grid runs in ``grpo-bench check trl``; here one configuration per loss type and option family,
and a planted error that the check must catch."""

import copy
import dataclasses
import math
import re

import pytest
import torch

from tests.conftest import ROOT

pytest.importorskip("trl")

from algorithms import policy_losses  # noqa: E402
from algorithms.policy_losses import GRPO_LOSS_TYPES  # noqa: E402
from benchmarks.checks import engine  # noqa: E402
from benchmarks.checks import trl as trl_check  # noqa: E402
from benchmarks.checks.cases import trl as trl_cases  # noqa: E402
from benchmarks.cli.main import main  # noqa: E402
from benchmarks.references import trl as trl_ref  # noqa: E402


@pytest.fixture(scope="module")
def setup():
    with trl_cases.setup() as fixture:
        yield fixture


def _row(config, setup) -> "trl_check.CheckRow":
    return trl_check.check_row(engine.run_config(config, setup))


def _sample() -> list:
    """Each loss type once, each option family once per objective (clip, cispo, sapo, vespo), each kind of skip once."""
    picked, seen = [], set()
    for cfg in trl_cases.loss_configs():
        reason = trl_cases.skip_reason(cfg)
        if reason:
            key = ("skip", reason[:30])
        elif cfg.family == "core":
            key = (cfg.family, cfg.loss_type)
        else:
            key = (cfg.family, policy_losses.objective_family(cfg.loss_type))
        if key not in seen:
            seen.add(key)
            picked.append(cfg)
    return picked


def test_grid_covers_every_loss_type_and_option():
    cfgs = trl_cases.loss_configs()
    assert len(cfgs) + len(trl_cases.rloo_loss_configs()) + len(trl_cases.rloo_advantage_configs()) >= 150
    compared = [c for c in cfgs if trl_cases.skip_reason(c) is None]
    assert {c.loss_type for c in compared} == set(GRPO_LOSS_TYPES)
    for family in ("core", "kl_bias_correction", "delta", "top_entropy_quantile", "off_policy_mask",
                   "importance_sampling"):
        assert any(c.family == family for c in compared), family
    modes = {(c.importance_sampling_mode, c.mu) for c in compared if c.sampler and c.importance_sampling_correction}
    assert modes == {(m, mu) for m in policy_losses.IMPORTANCE_SAMPLING_MODES for mu in (1, 2)}
    assert {c.level for c in compared} == {"token", "sequence"} and {c.beta > 0 for c in compared} == {False, True}
    # The stated differences are skipped with a reason, not compared.
    assert trl_cases.skip_reason(trl_cases.LossConfig("cispo", delta=1.5))
    assert trl_cases.skip_reason(trl_cases.LossConfig("vespo", sampler=True, importance_sampling_mode="sequence_mask"))
    assert "C_min > 1" in trl_cases.skip_reason(trl_cases.LossConfig(
        "vespo", sampler=True, importance_sampling_mode="token_mask", importance_sampling_clip_min=1.05))
    # Our names reach TRL through the mapping.
    cfg = trl_cases.LossConfig("grpo", mu=2, sampler=True, importance_sampling_mode="token_mask")
    settings = trl_ref.settings({**cfg.ours(), "mu": cfg.mu})
    assert settings["num_iterations"] == 2 and settings["vllm_importance_sampling_mode"] == "token_mask"


def test_each_of_our_trl_loss_types_maps_to_one_trl_computes(setup):
    """The adapter's POLICY_LOSSES covers exactly the loss types TRL 1.16 documents, and each of ours becomes a
    GRPOConfig on which TRL's GRPOTrainer builds and computes its loss (TRL refuses a loss type it lacks only there,
    in ``_compute_loss``; the planted name shows that it does)."""
    import trl

    help_text = next(f.metadata["help"] for f in dataclasses.fields(trl.GRPOConfig) if f.name == "loss_type")
    documented = set(re.findall(r"'(\w+)'", help_text.split("Supported values are")[1].split(". ")[0]))
    assert set(trl_ref.POLICY_LOSSES.values()) == documented and set(trl_ref.POLICY_LOSSES) == set(GRPO_LOSS_TYPES)
    batch = setup.batch
    model = copy.deepcopy(setup.base)
    inputs = {"prompt_ids": batch.prompt_ids, "prompt_mask": batch.prompt_mask, "completion_ids": batch.completion_ids,
              "completion_mask": batch.completion_mask, "advantages": torch.linspace(-1, 1, len(batch.rewards)),
              "num_items_in_batch": batch.completion_mask.sum()}
    for loss_type in GRPO_LOSS_TYPES:
        level = "sequence" if loss_type == "luspo" else "token"
        trainer = trl_cases.grpo_trainer(model, setup.tokenizer, setup.out_dir, loss_type=loss_type, level=level)
        assert (trainer.args.loss_type, trainer.args.importance_sampling_level) == (loss_type, level)
        assert torch.isfinite(trainer.compute_loss(model, dict(inputs))), loss_type
    trainer.loss_type = "planted"
    with pytest.raises(ValueError, match="Unknown loss type"):
        trainer.compute_loss(model, dict(inputs))


def test_the_trl_the_checks_map_is_the_one_pinned_and_installed():
    """pyproject.toml pins the TRL whose names the adapter maps (and the check records the one it ran against)."""
    from pathlib import Path

    pyproject = (ROOT / "pyproject.toml").read_text()
    assert f'"trl=={trl_ref.VERSION}"' in pyproject
    assert trl_ref.version() == trl_ref.VERSION


def test_the_adapter_refuses_what_trl_has_no_counterpart_for(tmp_path):
    with pytest.raises(ValueError, match="loss_type 'gmpo' has no TRL .* counterpart; TRL has grpo, bnpo"):
        trl_ref.settings({"loss_type": "gmpo"})  # verl's geometric-mean loss
    with pytest.raises(ValueError, match="our setting 'kl_loss_type' has no TRL"):
        trl_ref.settings({"kl_loss_type": "k1"})
    with pytest.raises(ValueError, match="level 'tokens'"):
        trl_ref.settings({"level": "tokens"})
    with pytest.raises(ValueError, match="RLOOConfig has no 'importance_sampling_level' \\(from our 'level'\\)"):
        trl_ref.config(str(tmp_path), {"group_size": 2, "level": "sequence"}, trainer="rloo")
    with pytest.raises(ValueError, match="trainer 'ppo'"):
        trl_ref.config(str(tmp_path), trainer="ppo")
    # Derived settings: one batch of prompts_per_step groups, a constant learning rate, one reward clip range.
    assert trl_ref.settings({"group_size": 4, "prompts_per_step": 3, "learning_rate": 1e-3, "reward_clip_max": 2.0}) == {
        "num_generations": 4, "per_device_train_batch_size": 12, "learning_rate": 1e-3, "lr_scheduler_type": "constant",
        "warmup_steps": 0, "reward_clip_range": (None, 2.0)}


def test_batch_is_ragged_left_padded_with_a_nan_sampler_token(setup):
    batch = setup.batch
    assert len(set(batch.completion_mask.sum(1).tolist())) >= 5  # ragged completions, one truncated at T
    assert (batch.prompt_mask == 0).any()  # a left-padded prompt
    assert batch.sampler_logps.isnan().sum() == 1


@pytest.mark.parametrize("cfg", _sample(), ids=trl_cases.config_name)
def test_grpo_loss_matches_trl(setup, cfg):
    row = _row(trl_cases.grpo_config(cfg), setup)
    if row.skipped:
        assert math.isnan(row.diff)
        return
    assert row.diff <= trl_check.LOSS_TOL, row
    assert row.grad_rel_err <= trl_check.GRAD_TOL, row
    assert abs(row.trl) > 1e-4 or (cfg.mu == 1 and cfg.loss_type == "grpo" and cfg.beta == 0), row  # not 0 = 0


def test_forward_rloo_advantages_and_dpo_match_trl(setup):
    chosen = {"logprobs": None, "rloo_loss": "rloo mu=2 epsilon_high=-",
              "rloo_advantages": "rloo beta=0.05 normalize_advantages=True reward_clip=(-0.5, 3.0)",
              "advantages": "scale_rewards=group", "dpo_loss": None}
    configs = [c for c in trl_cases.extra_configs() if c.group in chosen and chosen[c.group] in (None, c.knobs)]
    rows = [_row(c, setup) for c in configs]
    assert [r.check for r in rows] == list(chosen)
    assert all(r.passed for r in rows), [r for r in rows if not r.passed]
    assert rows[0].config.startswith("per-token log-probs, left-padded prompt (entropy max diff ")
    assert abs(rows[1].trl) > 1e-2  # mu = 2: the sequence ratio is not 1
    assert abs(rows[-1].trl - math.log(2)) > 1e-3  # DPO's reference differs from the policy


def test_a_planted_error_fails_the_check(setup):
    """The case module's planted error (SAPO's negative-advantage temperature off by 1%): under it the sapo rows
    fail and the others still pass; the engine counts it caught, and the rows agree again once it is lifted."""
    sapo = policy_losses.SAPO.objective
    (plant,) = trl_cases.TrlCases.plants
    cfgs = [trl_cases.LossConfig("sapo", mu=1), trl_cases.LossConfig("sapo", mu=2, beta=0.04),
            trl_cases.LossConfig("grpo", mu=2), trl_cases.LossConfig("cispo", mu=2, epsilon_high=1.1)]
    configs = [trl_cases.grpo_config(cfg) for cfg in cfgs]
    with plant.patch():
        rows = [_row(c, setup) for c in configs]
    assert [r.passed for r in rows] == [False, False, True, True], rows
    assert policy_losses.SAPO.objective is sapo
    result = engine.run_plant(plant, configs[:2], [engine.run_config(c, setup) for c in configs[:2]])
    assert (result.rows, result.failed, result.caught) == (2, 2, True) and "sapo" in result.example


def test_command_writes_results_and_fails_on_mismatch(tmp_path, monkeypatch):
    rows = [trl_check.CheckRow("grpo_loss", "a", 1.0, 1.0, 0.0, 0.0, True, "core", "grpo"),
            trl_check.CheckRow("grpo_loss", "s", math.nan, math.nan, math.nan, None, True, "delta", "sapo", "refused")]
    monkeypatch.setattr(trl_check, "run_checks", lambda progress=None: rows)
    assert main(["check", "trl", "--out", str(tmp_path)]) == 0
    assert {p.name for p in tmp_path.iterdir()} == {"report.md", "results.csv", "results.json"}
    text = (tmp_path / "report.md").read_text()
    assert "1/1 configurations agree, 1 skipped" in text and "1 x refused" in text
    rows.append(trl_check.CheckRow("dpo_loss", "b", 1.0, 2.0, 1.0, 0.5, False, "dpo", "dpo"))
    assert main(["check", "trl", "--out", str(tmp_path)]) == 1
    assert "**NO**" in (tmp_path / "report.md").read_text()


def test_every_trl_side_scores_with_the_one_task_reward():
    """One reward wrapper for every TRL side (the sides of the perf bench and the same-batch check, the train check, the LoRA bench): the task's reward of
    the text our rollout scores, each completion cut at its first end-of-sequence token with special tokens kept."""
    import ast
    from pathlib import Path

    from tasks import make_task

    task = make_task("pizza")
    model, tokenizer = task.load_policy(torch.device("cpu")), task.tokenizer
    seen = []
    reward = trl_ref.task_reward(task, model, tokenizer, on_score=lambda *args: seen.append(args))
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    pizza = tokenizer("pizza", add_special_tokens=False)["input_ids"]
    # TRL's own completion text drops special tokens; ours stops at the first EOS: "pizza<eos>pizza" scores "pizza"
    ids = [pizza + [eos] + pizza, pizza + pizza, pizza[:2] + [eos, pad]]
    rewards = reward(["ravin likes "] * 3, ["unused"] * 3, ids)
    assert rewards == [4.0, 0.0, 0.0] and reward.__name__ == "task_reward"
    (prompts, texts, completion_ids, scored), = seen
    assert texts == ["pizza", "pizzapizza", tokenizer.decode(pizza[:2])] and scored == rewards
    # and no TRL side builds a reward function of its own
    root = ROOT / "benchmarks"
    for module in ("references/sides.py",):
        tree = ast.parse((root / module).read_text())
        calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "trainer"]
        assert calls, module
        for call in calls:
            (given,) = [k.value for k in call.keywords if k.arg == "reward_funcs"]
            names = {n.id for n in ast.walk(given) if isinstance(n, ast.Name)}
            assigned = {t.id for n in ast.walk(tree) if isinstance(n, ast.Assign)
                        and getattr(n.value, "func", None) is not None and getattr(n.value.func, "attr", "") == "task_reward"
                        for t in n.targets if isinstance(t, ast.Name)}
            assert names <= assigned, (module, names)
