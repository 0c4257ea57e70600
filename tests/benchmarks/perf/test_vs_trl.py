"""grpo-bench bench grpo-vs-trl / rloo-vs-trl (benchmarks/perf/vs_trl.py): same loss as TRL on the same batch, the
report against TRL's default and fastest settings, the step's processed positions, and the shared-prompt log-probs."""

import pytest
import torch

from algorithms import rollout as rollout_lib
from algorithms.rollout import generate, per_token_logps
from benchmarks.references.sides import WORKLOADS, Ours, Trl, same_batch_check, same_batch_check_rloo
from tasks import make_task
from tests.conftest import ROOT


@pytest.fixture(scope="module")
def pizza():
    return make_task("pizza")


@pytest.mark.parametrize("name", ["pizza-mu1", "pizza-mu2"])
def test_same_batch_loss_matches_trl(pizza, name):
    torch.manual_seed(0)
    trl = Trl(WORKLOADS[name], seed=0, device="cpu", task=pizza)
    check = same_batch_check(trl, pizza.train_prompts()[:1])
    # The check is only worth something if the loss is not trivially 0 (ratio 1, zero KL) after TRL's update.
    assert abs(check["loss_trl_updated"]) > 1e-4
    assert check["abs_diff_sampled"] <= 1e-6
    assert check["abs_diff_updated"] <= 1e-6
    assert check["max_abs_diff_advantages"] <= 1e-6
    assert check["max_abs_diff_ref_logps"] <= 1e-5
    # Part by part: the loss function on TRL's own log-probs, our log-probs against TRL's, transformers alone.
    assert check["abs_diff_formula"] <= 1e-7 and check["max_abs_diff_logps"] <= 1e-5
    assert check["abs_diff_layout"] <= 1e-6 and check["max_abs_diff_layout_logps"] <= 1e-5
    from benchmarks.references.sides import same_loss_misses

    assert same_loss_misses(check) == []


@pytest.mark.parametrize("plant, miss", [("loss", "loss function differs by"), ("temperature", "log-probs differ by")])
def test_same_batch_parts_catch_a_planted_fault(pizza, plant, miss, monkeypatch):
    """A loss off by 1e-4 of itself, or our log-probs taken at a temperature 1% off: each fails its own part."""
    from benchmarks.references import sides
    from benchmarks.references.sides import same_loss_misses

    if plant == "loss":  # planted where the same-batch engine takes it from
        real_loss = sides._SameBatch.loss
        monkeypatch.setattr(sides._SameBatch, "loss", lambda self, *a: real_loss(self, *a) * (1 + 1e-4) + 1e-5)
    else:
        real_logps = sides.rollout_logps
        monkeypatch.setattr(sides, "rollout_logps",
                            lambda model, rollout, temperature=1.0, **k: real_logps(model, rollout, temperature=temperature * 1.01, **k))
    torch.manual_seed(0)
    check = same_batch_check(Trl(WORKLOADS["pizza-mu2"], seed=0, device="cpu", task=pizza), pizza.train_prompts()[:1])
    assert any(m.startswith(miss) for m in same_loss_misses(check)), same_loss_misses(check)


def test_same_batch_loss_matches_trl_with_lora(pizza):
    """Both sides train the same PEFT adapter; TRL keeps no reference model then, and both take the reference
    as the policy with its adapter off."""
    import dataclasses

    torch.manual_seed(0)
    w = dataclasses.replace(WORKLOADS["pizza-mu1"], name="pizza-lora", lora_r=4)
    trl = Trl(w, seed=0, device="cpu", task=pizza)
    assert trl.trainer.ref_model is None and hasattr(trl.model, "disable_adapter")
    check = same_batch_check(trl, pizza.train_prompts()[:1])
    assert abs(check["loss_trl_updated"]) > 1e-4
    assert check["abs_diff_sampled"] <= 1e-6 and check["abs_diff_updated"] <= 1e-6
    assert check["max_abs_diff_ref_logps"] <= 1e-5
    assert check["abs_diff_formula"] <= 1e-7 and check["max_abs_diff_layout_logps"] <= 1e-5  # the adapter off alone too


def test_median_interval_is_a_seeded_bootstrap_of_the_median():
    from benchmarks.perf.vs_trl import median_interval

    values = [2.0, 2.1, 2.2, 2.3, 2.4, 2.5, 2.6, 2.7, 9.0]
    low, high = median_interval(values, seed=0)
    assert 2.0 <= low < 2.4 < high <= 2.7 and (low, high) == median_interval(values, seed=0)
    # with 5 rounds the median is the largest in 6% of resamples: one wild round reaches a 95% interval
    assert median_interval([2.0, 2.2, 2.4, 2.6, 9.0], seed=0)[1] == 9.0
    assert median_interval([3.0], seed=0) == (3.0, 3.0)


def test_real_model_workloads_cover_both_tasks_both_mus_and_lora():
    real = {(w.task, w.mu, w.lora_r > 0) for w in WORKLOADS.values() if w.task in ("gsm8k", "reasoning_gym")}
    assert real == {(task, mu, lora) for task in ("gsm8k", "reasoning_gym") for mu in (1, 2) for lora in (False, True)}


@pytest.mark.parametrize("name", ["pizza-rloo", "pizza-rloo-mu2"])
def test_same_batch_rloo_loss_matches_trl(pizza, name):
    torch.manual_seed(0)
    trl = Trl(WORKLOADS[name], seed=0, device="cpu", task=pizza)
    check = same_batch_check_rloo(trl, pizza.train_prompts()[:1])
    assert abs(check["loss_trl_updated"]) > 1e-4  # the sequence ratio moved off 1
    assert check["abs_diff_sampled"] <= 1e-6 and check["abs_diff_updated"] <= 1e-6
    assert check["max_abs_diff_advantages"] <= 1e-6  # with beta's k1 KL folded into the rewards


def test_trl_fastest_setting_turns_checkpointing_off(pizza):
    default = Trl(WORKLOADS["pizza-rloo"], seed=0, device="cpu", task=pizza)
    fastest = Trl(WORKLOADS["pizza-rloo"], seed=0, device="cpu", task=pizza, setting="fastest")
    assert default.trainer.args.gradient_checkpointing is True  # TRL's own default
    assert fastest.trainer.args.gradient_checkpointing is False


def test_step_metrics_carry_the_processed_positions(pizza):
    """tokens/processed: the packed row, each group's prompt once plus each completion's real tokens but its
    last, from the step's own metrics."""
    ours = Ours(WORKLOADS["pizza-mu1"], seed=0, device="cpu", task=pizza)
    seen = []
    generate = ours.algo.generate
    ours.algo.generate = lambda *a, **k: seen.append(generate(*a, **k)) or seen[-1]
    metrics = ours.step(pizza.train_prompts()[:1])
    rollout = seen[0]
    assert metrics["tokens/processed"] == rollout.prompt_ids.size(1) + int((rollout.completion_mask.sum(1) - 1).sum())
    assert metrics["tokens/processed"] < rollout.prompt_ids.size(1) + rollout.completion_ids.numel()  # some ended early


def test_report_shows_trl_default_and_fastest_and_the_ratio_against_the_faster():
    from benchmarks.perf.vs_trl_report import SIDES, render_markdown

    def side(t):
        return {"median": {"time/step": t, **{f"time/{p}": 0.0 for p in ("generate", "score", "logprobs", "update", "other")},
                           "tokens/generated": 10.0, "tokens/processed": 20.0},
                "rates": {"generation_tokens_per_s": 1.0, "generation_gflops": 1.0, "update_gflops": 1.0}}

    ratio = lambda m: {"min": m, "median": m, "max": m}  # noqa: E731
    comparison = {"workload": {"name": "w", "group_size": 8, "max_new_tokens": 12, "mu": 1}, "parameters": 1e6,
                  "ours": side(1.0), "trl_default": side(2.3), "trl_fastest": side(2.1),
                  "ratios": {"default": ratio(2.3), "fastest": ratio(2.1)}, "faster_trl": "fastest",
                  "ratio": ratio(2.1), "same_batch": {"max_abs_diff": 0.0},
                  "memory": {s: {"peak_bytes": 2**30, "rss_after_imports_bytes": 2**29} for s in SIDES}}
    report = {"environment": {"versions": {"trl": "1.16", "torch": "2"}, "device_name": "cpu"}, "threads": 2,
              "matmul_gflops": {"fp32": 1.0, "bf16": 1.0}, "comparisons": [comparison], "memory_method": "m",
              "command": "c", "algo": "rloo"}
    text = render_markdown(report)
    assert "RLOOTrainer" in text and "TRL default s/step" in text and "TRL fastest s/step" in text
    assert "2.30 / 2.30 / 2.30" in text and "2.10 / **2.10** / 2.10" in text  # bold: against the faster TRL
    comparison["ratio"] = comparison["ratios"]["fastest"] = {**ratio(2.1), "median_ci95": [1.9, 2.4]}
    assert "2.10 / **2.10** [1.90, 2.40] / 2.10" in render_markdown(report)
    assert "peak memory TRL fastest" in text
    assert "Machine load" not in text  # a report from before the load was recorded
    report["load"] = {"cpus": 2, "load_1min": [1.9, 4.2, 3.1]}
    assert "1.9 to 4.2 on 2 CPUs, this run using 2 threads. Other work shared the cores" in render_markdown(report)
    report["load"]["load_1min"] = [2.1, 2.3]
    assert "2.1 to 2.3 on 2 CPUs, this run using 2 threads. Nothing else ran." in render_markdown(report)
    assert "Memory bandwidth" not in render_markdown(report)  # a report from before it was sampled
    report["load"]["bandwidth_gbs"] = [21.04, 18.96, 20.0]
    assert "Nothing else ran. Memory bandwidth (a STREAM triad, sampled likewise): 19.0 to 21.0 GB/s" in render_markdown(report)
    assert "Stopped before the end" not in render_markdown(report)
    report["workloads"] = ["w", "v", "u"]  # a run stopped after its first workload
    assert "**Stopped before the end**: 1 of 3 workloads measured; not measured: v, u." in render_markdown(report)


def test_bench_refuses_to_replace_a_report_and_resumes_the_workloads_it_lacks(tmp_path, monkeypatch):
    """A stopped run's report is kept: a second run is refused unless --resume (which measures only the planned
    workloads the report lacks, with the same settings) or --overwrite."""
    import dataclasses
    import json

    from benchmarks.errors import UsageError
    from benchmarks.perf import vs_trl as bench
    from benchmarks.perf.commands import GrpoVsTrl

    measured, stopped = [], []

    def run_bench(settings, command):  # as the study runs it: OUT/perf.json, its report written by the lifecycle
        assert GrpoVsTrl().run(settings, command) == 0
        return json.loads((tmp_path / "perf.json").read_text())

    def fake_compare(w, *, pairs, seed, device, log):
        if w.name == "pizza-mu2" and not stopped:  # the first run stops here
            stopped.append(w.name)
            raise KeyboardInterrupt
        measured.append(w.name)
        side = {"median": {"time/step": 1.0, "tokens/generated": 1.0, "tokens/processed": 1.0,
                           **{f"time/{p}": 0.0 for p in ("generate", "score", "logprobs", "update", "other")}},
                "rates": {"generation_tokens_per_s": 1.0, "generation_gflops": 1.0, "update_gflops": 1.0}}
        ratio = {"min": 3.0, "median": 3.0, "max": 3.0}
        return {"workload": dataclasses.asdict(w), "parameters": 1.0, "pairs": pairs, "faster_trl": "fastest",
                "ratios": {"default": ratio, "fastest": ratio}, "ratio": ratio, "same_batch": {"max_abs_diff": 0.0},
                "ours": side, "trl_default": side, "trl_fastest": side}

    monkeypatch.setattr(bench, "compare", fake_compare)
    monkeypatch.setattr(bench, "_sample_machine", lambda load: load["load_1min"].append(0.5))
    monkeypatch.setattr(bench, "matmul_gflops", lambda dtype, device: 1.0)
    settings = bench.PerfSettings(workloads=["pizza-mu1", "pizza-mu2"], pairs=5, memory=False, readme="",
                                  out=str(tmp_path), device="cpu")
    with pytest.raises(KeyboardInterrupt):
        run_bench(settings, command="first")
    first = json.loads((tmp_path / "perf.json").read_text())
    assert [r["workload"]["name"] for r in first["comparisons"]] == ["pizza-mu1"]
    with pytest.raises(UsageError, match="--resume to measure the workloads it lacks, or --overwrite"):
        run_bench(settings, command="again")
    monkeypatch.setattr(bench.measure, "requested_device", torch.device)  # as if CUDA were there
    with pytest.raises(UsageError, match="measured on cpu, this run is on cuda"):
        run_bench(dataclasses.replace(settings, resume=True, device="cuda"), command="again")
    with pytest.raises(UsageError, match="pizza-mu1 .* was measured with other settings"):
        run_bench(dataclasses.replace(settings, resume=True, pairs=6), command="again")
    report = run_bench(dataclasses.replace(settings, resume=True), command="resumed")
    assert measured == ["pizza-mu1", "pizza-mu2"]  # pizza-mu1 kept, not measured twice
    assert [r["workload"]["name"] for r in report["comparisons"]] == ["pizza-mu1", "pizza-mu2"]
    assert report["command"] == "first" and [r["workloads"] for r in report["resumed"]] == [["pizza-mu2"]]
    text = (tmp_path / "perf.md").read_text()
    assert "Resumed in a later session on" in text and "It measured: pizza-mu2;" in text
    assert "Stopped before the end" not in text and "not measured:" not in text
    run_bench(dataclasses.replace(settings, overwrite=True), command="over")
    assert json.loads((tmp_path / "perf.json").read_text())["command"] == "over"
    assert measured[-2:] == ["pizza-mu1", "pizza-mu2"]


def test_rloo_bench_refuses_a_grpo_workload(run_cli):
    code, _, err = run_cli("bench", "rloo-vs-trl", "--workloads", "pizza-mu1")
    assert code == 2 and "unknown workload 'pizza-mu1'; choose from pizza-rloo" in err


def _cache_the_prompt(monkeypatch):
    """Route the tiny pizza model's groups through the prompt's KV cache instead of a packed row."""
    monkeypatch.setattr(rollout_lib, "PACKED_MAX_LENGTH", 0)
    monkeypatch.setattr(rollout_lib, "SHARED_PROMPT_MIN_WORK", 0)


def _logps_and_grads(model, prompt_ids, prompt_mask, rollout, group_size):
    model.zero_grad()
    logps = per_token_logps(model, prompt_ids, prompt_mask, rollout.completion_ids, rollout.completion_mask,
                            temperature=0.7, group_size=group_size)
    (logps * rollout.completion_mask).sum().backward()
    return logps.detach(), torch.cat([p.grad.flatten() for p in model.parameters()])


@pytest.mark.parametrize("layout", ["packed", "cached"])
def test_shared_prompt_logps_equal_full_forward(pizza, layout, monkeypatch):
    """Encoding a group's prompt once, packed with its completions into one row or through its KV cache,
    gives the full forward's log-probs and gradient (fp rounding aside). Two groups whose prompts differ
    in length, so one is left-padded, and completions of different lengths."""
    if layout == "cached":
        _cache_the_prompt(monkeypatch)
    model = pizza.load_policy(torch.device("cpu"))
    prompts = pizza.train_prompts()[:2]
    rollout = generate(model, pizza.tokenizer, prompts, 8, max_new_tokens=12, temperature=1.0,
                       generator=torch.Generator().manual_seed(0))
    assert rollout.completion_mask.sum(1).unique().numel() > 1  # completions of several lengths
    prompt_ids, prompt_mask = rollout.prompt_ids.clone(), rollout.prompt_mask.clone()
    prompt_ids[8:, :3], prompt_mask[8:, :3] = pizza.tokenizer.pad_token_id, 0  # the second prompt 3 tokens shorter
    model.train()
    calls = []
    model.get_input_embeddings().register_forward_hook(lambda *_: calls.append(1))
    full, g_full = _logps_and_grads(model, prompt_ids, prompt_mask, rollout, 1)
    assert len(calls) == 1
    shared, g_shared = _logps_and_grads(model, prompt_ids, prompt_mask, rollout, 8)
    assert len(calls) == 1 + (1 if layout == "packed" else 2)
    mask = rollout.completion_mask.bool()
    assert (full - shared)[mask].abs().max() < 1e-5
    assert ((g_full - g_shared).norm() / g_full.norm()) < 1e-5
    assert not torch.equal(full[:8], full[8:])  # the two prompts really condition differently


def test_long_packed_rows_take_the_kv_cache(pizza, monkeypatch):
    """A packed row beyond PACKED_MAX_LENGTH (its attention grows with L^2) is not packed."""
    model = pizza.load_policy(torch.device("cpu"))
    rollout = generate(model, pizza.tokenizer, pizza.train_prompts()[:1], 8, max_new_tokens=12, temperature=1.0,
                       generator=torch.Generator().manual_seed(0))
    packed = []
    original = rollout_lib._packed_completion_logits
    monkeypatch.setattr(rollout_lib, "_packed_completion_logits", lambda *a: packed.append(1) or original(*a))
    rollout_lib.rollout_logps(model, rollout)
    assert packed == [1]
    # The packed row holds the prompt and each completion's real tokens but its last.
    length = rollout.prompt_ids.size(1) + int((rollout.completion_mask.sum(1) - 1).sum())
    monkeypatch.setattr(rollout_lib, "PACKED_MAX_LENGTH", length)
    rollout_lib.rollout_logps(model, rollout)
    assert packed == [1, 1]
    monkeypatch.setattr(rollout_lib, "PACKED_MAX_LENGTH", length - 1)
    rollout_lib.rollout_logps(model, rollout)
    assert packed == [1, 1]


def test_unknown_workload_is_one_line(run_cli):
    code, out, err = run_cli("bench", "grpo-vs-trl", "--workloads", "nope")
    assert code == 2
    assert "unknown workload 'nope'" in err and len(err.strip().splitlines()) == 1


def test_too_few_pairs_is_refused(run_cli):
    code, _, err = run_cli("bench", "grpo-vs-trl", "--workloads", "pizza-mu1", "--pairs", "2")
    assert code == 2 and "--pairs must be >= 5" in err


def test_rerender_writes_the_committed_report_from_its_json_and_refuses_a_missing_one(run_cli, tmp_path):
    committed = ROOT / "results" / "gpu"
    (tmp_path / "perf.json").write_text((committed / "perf.json").read_text())
    code, _, err = run_cli("bench", "grpo-vs-trl", "--rerender", "--out", tmp_path, "--readme", "")
    assert code == 0, err
    assert (tmp_path / "perf.md").read_text() == (committed / "perf.md").read_text()
    code, _, err = run_cli("bench", "grpo-vs-trl", "--rerender", "--out", tmp_path / "empty", "--readme", "")
    assert code == 2 and "--rerender needs a finished report" in err and len(err.strip().splitlines()) == 1


def test_rerender_writes_the_committed_cpu_reports_and_their_readme_sections_byte_for_byte(run_cli, tmp_path):
    """Each bench's report and its section of results/checks.md, written again from its committed json by the shared
    lifecycle: the same bytes, the page otherwise untouched."""
    committed = ROOT / "results" / "perf"
    page = tmp_path / "checks.md"
    page.write_text((ROOT / "results" / "checks.md").read_text())
    for command, stem in (("grpo-vs-trl", "perf"), ("rloo-vs-trl", "rloo")):
        (tmp_path / f"{stem}.json").write_text((committed / f"{stem}.json").read_text())
        code, out, err = run_cli("bench", command, "--rerender", "--out", tmp_path, "--readme", page)
        assert code == 0, err
        assert out == f"rewrote {tmp_path / stem}.md from {stem}.json\n"
        assert (tmp_path / f"{stem}.md").read_bytes() == (committed / f"{stem}.md").read_bytes()
    title = "# GRPO step: this suite vs TRL\n\n"
    body = (committed / "perf.md").read_text().removeprefix(title)
    text = page.read_text()
    assert f"<!-- grpo-bench:perf -->\n{body.rstrip()}\n<!-- /grpo-bench:perf -->" in text
    # The RLOO section is new on the copy (results/checks.md keeps none); everything else is the page as committed.
    start, end = text.index("\n\n<!-- grpo-bench:perf-rloo -->"), text.index("<!-- /grpo-bench:perf-rloo -->\n")
    assert text[:start] + text[end + len("<!-- /grpo-bench:perf-rloo -->"):] == (ROOT / "results" / "checks.md").read_text()


@pytest.mark.parametrize("shared", [False, True], ids=["packed", "cached-prompt"])
@pytest.mark.parametrize("beta, mu", [(0.0, 1), (0.04, 1), (0.0, 2), (0.04, 2)])
def test_no_reference_or_old_pass_unless_needed(pizza, beta, mu, shared, monkeypatch):
    """Reference log-probs only when beta > 0; never a forward of its own for old log-probs (the first
    update's forward gives them)."""
    if shared:
        _cache_the_prompt(monkeypatch)
    from algorithms.grpo import GRPOConfig
    from benchmarks.harness import RunConfig, build

    rc = RunConfig(task="pizza", algo="grpo", device="cpu", precision="fp32", out="/dev/null")
    _, policy, algo, _ = build(rc, GRPOConfig(beta=beta, mu=mu, prompts_per_step=1), {}, pizza)
    sampling, calls, ref_calls = [False], [], []
    generate = algo.generate

    def tracked_generate(*args, **kwargs):
        sampling[0] = True
        try:
            return generate(*args, **kwargs)
        finally:
            sampling[0] = False

    algo.generate = tracked_generate
    # The embedding runs once per forward, in transformers' forward and in fast_llama's alike.
    policy.get_input_embeddings().register_forward_hook(
        lambda *_: calls.append("sample" if sampling[0] else "grad" if torch.is_grad_enabled() else "no_grad"))
    if algo.ref_policy is not None:
        algo.ref_policy.get_input_embeddings().register_forward_hook(lambda *_: ref_calls.append(1))
    metrics = algo.step(pizza.train_prompts()[:1])
    assert (algo.ref_policy is not None) == (beta > 0)
    # A log-prob pass is one call (the tiny pizza model: prompt and completions packed), or two with the
    # prompt's KV cache (the group's prompt once, then its completions).
    per_pass = 2 if shared else 1
    assert calls.count("grad") == per_pass * mu
    assert calls.count("no_grad") == 0
    assert len(ref_calls) == (per_pass if beta > 0 else 0)
    assert ("time/logprobs" in metrics) == (beta > 0)


def test_prompt_sharing_is_chosen_by_the_work_it_saves():
    """Where a group cannot be packed, tiny models re-encode the prompt (one call beats two); SmolLM2-sized ones
    take it through the KV cache once per group."""

    class Sized:
        def __init__(self, parameters):
            self._parameters = parameters

        def parameters(self):
            return iter(self._parameters)

    mask = torch.ones(8, 12, dtype=torch.long)  # one 12-token prompt, G = 8
    assert not rollout_lib._sharing_pays(Sized([torch.empty(1).expand(130_000)]), mask, 8)  # pizza: 1.1e7
    gsm8k_mask = torch.ones(4, 150, dtype=torch.long)  # one 150-token prompt, G = 4
    assert rollout_lib._sharing_pays(Sized([torch.empty(1).expand(134_515_008)]), gsm8k_mask, 4)  # 6e10
    assert not rollout_lib._sharing_pays(Sized([torch.empty(1).expand(134_515_008)]), gsm8k_mask[:1], 1)


def test_algorithms_step_fused_adamw_with_the_reference_adamw_numbers(pizza):
    """Every algorithm's optimizer is torch's fused AdamW (TRL's default kernel too); its updates are
    AdamW's: within a float32 rounding of torch's per-tensor reference loop after several steps."""
    from algorithms.grpo import GRPOConfig
    from benchmarks.harness import RunConfig, build

    rc = RunConfig(task="pizza", algo="grpo", device="cpu", precision="fp32", out="/dev/null")
    _, policy, algo, _ = build(rc, GRPOConfig(beta=0.0, learning_rate=1e-2, weight_decay=0.01), {}, pizza)
    assert algo.optimizer.defaults["fused"] is True
    models = [policy, pizza.load_policy(torch.device("cpu"))]
    reference = torch.optim.AdamW(models[1].parameters(), lr=1e-2, weight_decay=0.01, foreach=False)
    generator = torch.Generator().manual_seed(0)
    for _ in range(3):
        grads = [torch.randn(p.shape, generator=generator) for p in models[0].parameters()]
        for model, optimizer in zip(models, (algo.optimizer, reference)):
            for p, g in zip(model.parameters(), grads):
                p.grad = g.clone()
            optimizer.step()
    start = pizza.load_policy(torch.device("cpu"))
    for a, b, p0 in zip(models[0].parameters(), models[1].parameters(), start.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
        assert (a - p0).abs().max() > 1e-3  # three steps of lr 1e-2 moved every tensor


def test_target_verdict_names_each_workload_that_misses():
    from benchmarks.perf.vs_trl_report import target_verdict

    def comparison(name, median, ours_bytes, trl_bytes, diff):
        return {"workload": {"name": name}, "ratio": {"median": median}, "same_batch": {"max_abs_diff": diff},
                "memory": {"ours": {"peak_bytes": ours_bytes}, "trl_default": {"peak_bytes": trl_bytes},
                           "trl_fastest": {"peak_bytes": trl_bytes * 2}}}

    report = {"comparisons": [comparison("a", 2.6, 1, 2, 1e-7), comparison("b", 2.4, 1, 2, 1e-7),
                              comparison("c", 2.7, 3, 2, 1e-7), comparison("d", 2.7, 1, 2, float("nan"))]}
    line = target_verdict(report)
    assert "not met on b (median 2.40 < 2.5), c (more memory than TRL), d (loss differs by nan)" in line
    assert line.endswith("met on a.")
    assert target_verdict({"comparisons": report["comparisons"][:1]}).endswith("met on every workload.")
    # A run stopped before the end claims the target only on what it measured, and names the rest.
    stopped = target_verdict({"workloads": ["a", "b", "e"], "comparisons": report["comparisons"][:1]})
    assert stopped.endswith("met on every workload measured (1 of 3); not measured: b, e."), stopped
    stopped = target_verdict({"workloads": ["a", "b", "e"], "comparisons": report["comparisons"][:2]})
    assert stopped.endswith("not met on b (median 2.40 < 2.5); met on a; not measured: e."), stopped


@pytest.mark.parametrize("shared", [False, True], ids=["packed", "cached-prompt"])
def test_first_update_logps_are_the_old_logps_bit_for_bit(pizza, shared, monkeypatch):
    """At mu > 1 the old log-probs are the first iteration's, detached: exactly what a separate
    no-grad pass over the unchanged policy computes, so skipping that pass changes no number."""
    if shared:
        _cache_the_prompt(monkeypatch)
    from algorithms.grpo import GRPOConfig
    from benchmarks.harness import RunConfig, build

    rc = RunConfig(task="pizza", algo="grpo", device="cpu", precision="fp32", out="/dev/null")
    _, policy, algo, _ = build(rc, GRPOConfig(beta=0.0, mu=2, prompts_per_step=2), {}, pizza)
    rollout = algo.generate(pizza.train_prompts()[:1] * 2, 8)
    frozen = algo.frozen_logps(policy, rollout)
    with_grad, _ = algo.logps(policy, rollout, with_entropy=True)
    assert with_grad.requires_grad and torch.equal(frozen, with_grad.detach())


def test_the_command_line_hands_the_bench_typed_settings_and_the_command_as_typed(run_cli, monkeypatch):
    from benchmarks.perf import commands
    from benchmarks.perf.vs_trl import GrpoVsTrlSettings, RlooVsTrlSettings

    seen = []
    monkeypatch.setattr(commands, "run_bench", lambda settings, command, path, write: seen.append((settings, command)))
    assert run_cli("bench", "rloo-vs-trl", "--pairs", "7", "--no-memory")[0] == 0
    assert seen == [(RlooVsTrlSettings(pairs=7, memory=False), "grpo-bench bench rloo-vs-trl --pairs 7 --no-memory")]
    rloo = seen[0][0]
    assert (rloo.algo, rloo.workloads, rloo.bf16_steps, rloo.scaling_steps) == ("rloo", ["pizza-rloo"], 0, 0)
    assert run_cli("bench", "grpo-vs-trl", "--workloads", "pizza-mu1, pizza-mu2", "--bf16-steps", "0")[0] == 0
    assert seen[1][0] == GrpoVsTrlSettings(workloads=["pizza-mu1", "pizza-mu2"], bf16_steps=0)
    assert (seen[1][0].algo, seen[1][0].scaling_steps) == ("grpo", 1)
    assert seen[1][1] == "grpo-bench bench grpo-vs-trl --workloads 'pizza-mu1, pizza-mu2' --bf16-steps 0"


def test_scaling_skips_a_task_without_scaling_points():
    from benchmarks.perf.vs_trl import SCALING, scaling

    assert "reasoning_gym" not in SCALING
    lines = []
    assert scaling(["reasoning_gym"], steps=1, seed=0, device="cpu", log=lines.append) == []
    assert lines == ["  scaling: no scaling points for reasoning_gym; skipped"]


def test_a_completion_mask_with_holes_is_not_packed(pizza):
    """The packed row holds each completion's real tokens as a prefix; a mask with a hole inside a completion
    (not what sampling makes) takes another route and still gives the full forward's log-probs."""
    model = pizza.load_policy(torch.device("cpu"))
    rollout = generate(model, pizza.tokenizer, pizza.train_prompts()[:1], 8, max_new_tokens=12, temperature=1.0,
                       generator=torch.Generator().manual_seed(0))
    mask = rollout.completion_mask.clone()
    longest = int(mask.sum(1).argmax())
    mask[longest, 1] = 0  # a hole
    assert not rollout_lib._prefix(mask) and rollout_lib._prefix(rollout.completion_mask)
    assert rollout_lib._layout(model, rollout.prompt_ids, rollout.prompt_mask, mask, 8) != "packed"
    grouped = per_token_logps(model, rollout.prompt_ids, rollout.prompt_mask, rollout.completion_ids, mask, group_size=8)
    one_by_one = per_token_logps(model, rollout.prompt_ids, rollout.prompt_mask, rollout.completion_ids, mask)
    assert (grouped - one_by_one)[mask.bool()].abs().max() < 1e-5


def test_reports_name_the_commit_of_the_code_they_measured(tmp_path):
    """measure.environment carries the suite's git commit (and whether the tracked code differs from it); the
    perf report's first line names it."""
    import subprocess
    from pathlib import Path

    from benchmarks.harness import measure
    from benchmarks.perf.vs_trl_report import code_line

    root = ROOT
    if not (root / ".git").exists():
        pytest.skip("not a git checkout")
    head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert measure.environment(torch.device("cpu"))["code"]["commit"] == head
    assert code_line({"code": {"commit": "0123456789abcdef", "dirty": True}}) == " This suite at commit 0123456789 with uncommitted changes."
    assert code_line({"code": {"commit": "0123456789abcdef", "dirty": False}}) == " This suite at commit 0123456789."
    assert code_line({"code": None}) == ""


def test_a_copy_of_the_checkout_names_the_commit_it_was_given(monkeypatch):
    """A checkout copied to another machine (the GPU machine got the session's first .git beside a later tree)
    records the commit it is told, over git's own and without any."""
    import os

    from benchmarks.harness import measure
    from benchmarks.perf.vs_trl_report import code_line

    monkeypatch.setenv("GRPO_BENCH_REVISION", "0123456789abcdef\n")
    code = measure.code_revision()
    assert code == {"commit": "0123456789abcdef", "dirty": None}
    assert code_line({"code": code}) == " This suite copied from commit 0123456789 (as given; its changes unknown)."
    real = os.path.exists
    monkeypatch.setattr(measure.os.path, "exists", lambda p: False if str(p).endswith(".git") else real(p))
    assert measure.code_revision() == code
    monkeypatch.delenv("GRPO_BENCH_REVISION")
    assert measure.code_revision() is None


def test_a_workload_reaches_the_memory_probe_whole():
    """The probe subprocess rebuilds the workload from JSON, the run's overrides (completion cap, model) kept."""
    import dataclasses
    import json

    from benchmarks.perf.vs_trl import with_model, workload_of_json

    w = with_model([dataclasses.replace(WORKLOADS["chain_sum-lora-mu2"], max_new_tokens=7)], "/models/m")[0]
    assert dict(w.task_options)["model"] == "/models/m" and w.max_new_tokens == 7
    assert workload_of_json(json.dumps(dataclasses.asdict(w))) == w


def test_lora_workloads_run_the_adapter_without_dropout_on_both_sides(pizza):
    """TRL's disable_dropout zeroes its adapters' dropout; ours must take none, or the two compute different
    functions (and ours pays for masks TRL never draws)."""
    import dataclasses

    w = dataclasses.replace(WORKLOADS["pizza-mu1"], name="pizza-lora", lora_r=4)
    assert all(v.lora_dropout == 0 for v in WORKLOADS.values() if v.lora_r)
    ours, trl = Ours(w, seed=0, device="cpu", task=pizza), Trl(w, seed=0, device="cpu", task=pizza)
    for model in (ours.policy, trl.model):
        dropouts = [m for name, m in model.named_modules() if ".lora_dropout." in name]
        assert dropouts, "no LoRA adapter found"
        assert all(isinstance(m, torch.nn.Identity) or m.p == 0 for m in dropouts)


def _saved_pizza_model(path):
    task = make_task("pizza", eval_samples=1)
    model = task.load_policy("cpu")
    model.save_pretrained(path)
    task.tokenizer.save_pretrained(path)
    return model


def test_random_weights_keep_the_architecture_and_are_seeded(tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    from benchmarks.perf.vs_trl import random_weight_checkpoint

    source = _saved_pizza_model(tmp_path / "model")
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    first = random_weight_checkpoint(str(tmp_path / "model"), seed=0)
    made = (first / "config.json").stat().st_mtime_ns
    assert random_weight_checkpoint(str(tmp_path / "model"), seed=0) == first  # reused, not rewritten
    assert (first / "config.json").stat().st_mtime_ns == made
    random0 = AutoModelForCausalLM.from_pretrained(first)
    shapes = lambda m: {n: p.shape for n, p in m.named_parameters()}  # noqa: E731
    assert shapes(random0) == shapes(source)
    weight = "model.layers.0.mlp.down_proj.weight"
    params = lambda m: dict(m.named_parameters())  # noqa: E731
    assert not torch.equal(params(random0)[weight], params(source)[weight])
    import shutil

    shutil.rmtree(first)
    again = AutoModelForCausalLM.from_pretrained(random_weight_checkpoint(str(tmp_path / "model"), seed=0))
    other = AutoModelForCausalLM.from_pretrained(random_weight_checkpoint(str(tmp_path / "model"), seed=1))
    assert torch.equal(params(again)[weight], params(random0)[weight])
    assert not torch.equal(params(other)[weight], params(random0)[weight])


def test_the_bench_runs_the_model_given_with_random_weights(run_cli, tmp_path, monkeypatch):
    import json

    _saved_pizza_model(tmp_path / "model")
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    code, _, err = run_cli("bench", "grpo-vs-trl", "--random-weights")
    assert code == 2 and "--random-weights needs --model" in err and "Traceback" not in err
    code, _, err = run_cli("bench", "grpo-vs-trl", "--workloads", "pizza-mu1", "--model", tmp_path / "model",
                           "--random-weights", "--pairs", "1", "--allow-few-pairs", "--no-memory", "--bf16-steps", "0",
                           "--scaling-steps", "0", "--readme", "", "--out", tmp_path / "out")
    assert code == 0, err
    report = json.loads((tmp_path / "out" / "perf.json").read_text())
    assert report["model"] == {"model": str(tmp_path / "model"), "random_weights": True}
    model = dict(report["comparisons"][0]["workload"]["task_options"])["model"]
    assert model.startswith(str(tmp_path / "tmp" / "grpo-bench-random-weights"))
    assert (f"Model: `{tmp_path / 'model'}`, in place of each task's default model, with random weights"
            in (tmp_path / "out" / "perf.md").read_text())


def test_at_bf16_both_sides_train_in_bf16_and_the_same_batch_check_stays_fp32(pizza, monkeypatch, tmp_path):
    """--precision bf16: our step under bf16 autocast and TRL's with bf16=True (accelerate's autocast around the
    model's forward, generation included), the same prompts, and the same-loss check on a TRL trainer built again in
    fp32, so its tolerance of 1e-6 still reads the functions, not the rounding. The report says so, goes to its
    own folder and README section, and a resume at another precision is refused."""
    import dataclasses

    from benchmarks.perf import vs_trl
    from benchmarks.perf.vs_trl import GrpoVsTrlSettings, _planned, compare, out_folder
    from benchmarks.perf.commands import GrpoVsTrl

    w = dataclasses.replace(WORKLOADS["pizza-mu1"], precision="bf16")
    dtypes = {}
    real_trl = vs_trl.Trl

    def watched_trl(workload, **kwargs):
        side = real_trl(workload, **kwargs)
        linear = next(m for m in side.trainer.model.modules() if isinstance(m, torch.nn.Linear))
        linear.register_forward_hook(lambda m, a, out: dtypes.setdefault(  # the first product TRL's step runs
            (workload.precision, kwargs.get("setting", "default")), out.dtype) and None)  # its output kept
        return side

    monkeypatch.setattr(vs_trl, "Trl", watched_trl)
    real_ours = vs_trl.Ours

    def watched_ours(workload, **kwargs):
        side = real_ours(workload, **kwargs)
        dtypes[("ours", workload.precision)] = side.algo.precision  # its forward passes' autocast (algorithms/base)
        return side

    monkeypatch.setattr(vs_trl, "Ours", watched_ours)
    import gc
    import weakref
    alive = []  # the timed bf16 trainers, freed before the fp32 one is built (memory: one more 135M trainer at most)
    real_watched = watched_trl

    def counted_trl(workload, **kwargs):
        if workload.precision == "fp32":
            gc.collect()
            assert all(ref() is None for ref in alive), "a timed trainer is still held when the check's is built"
        side = real_watched(workload, **kwargs)
        alive.append(weakref.ref(side))
        return side

    monkeypatch.setattr(vs_trl, "Trl", counted_trl)
    result = compare(w, pairs=1, seed=0, device="cpu", log=lambda _: None)
    assert len(alive) == 3 and set(result) >= {"ours", "trl_default", "trl_fastest"}
    assert dtypes[("ours", "bf16")] == "bf16"
    assert dtypes[("bf16", "default")] == torch.bfloat16 and dtypes[("bf16", "fastest")] == torch.bfloat16
    assert dtypes[("fp32", "default")] == torch.float32  # the check's own trainer
    assert result["same_batch"]["max_abs_diff"] < 1e-6 and result["workload"]["precision"] == "bf16"
    # The settings carry it to every workload, its folder and section are its own, the report says how
    settings = GrpoVsTrlSettings(workloads=["pizza-mu1"], precision="bf16", device="cpu")
    assert [x.precision for x in _planned(settings, {"pizza-mu1": WORKLOADS["pizza-mu1"]}, ["pizza-mu1"], {})] == ["bf16"]
    assert out_folder(settings) == vs_trl.Path("results/perf/bf16")
    assert out_folder(dataclasses.replace(settings, precision="fp32")) == vs_trl.Path("results/perf")
    assert GrpoVsTrl().readme_section(settings) == ("results/checks.md", "perf-bf16")
    assert GrpoVsTrl().readme_section(dataclasses.replace(settings, precision="fp32")) == ("results/checks.md", "perf")
    # checks.md's section is the default folder's report: a run elsewhere writes it only when --readme asks
    assert GrpoVsTrl().readme_section(dataclasses.replace(settings, out="results/perf/bf16"))[0] == "results/checks.md"
    assert GrpoVsTrl().readme_section(dataclasses.replace(settings, out="results/perf/bf16-quiet"))[0] == ""
    assert GrpoVsTrl().readme_section(dataclasses.replace(settings, precision="fp32", out="results/perf/bf16"))[0] == ""
    assert GrpoVsTrl().readme_section(dataclasses.replace(settings, out="x", readme="page.md"))[0] == "page.md"
    # A kept workload measured at fp32 (a report from before the setting has no precision) is not a bf16 one
    fp32_kept = {"workload": dataclasses.asdict(WORKLOADS["pizza-mu1"]), "pairs": 5}
    fp32_kept["workload"].pop("precision")
    vs_trl._check_kept(WORKLOADS["pizza-mu1"], vs_trl._as_json(fp32_kept), dataclasses.replace(
        settings, precision="fp32", pairs=5), tmp_path / "perf.json")
    with pytest.raises(vs_trl.UsageError, match="measured with other settings"):
        vs_trl._check_kept(w, vs_trl._as_json(fp32_kept), dataclasses.replace(settings, pairs=5),
                                tmp_path / "perf.json")
    report = {"precision": "bf16", "environment": {"versions": {"trl": "1", "torch": "2"}, "device_name": "cpu"},
              "threads": 1, "matmul_gflops": {"fp32": 1.0, "bf16": 2.0}}
    from benchmarks.perf.vs_trl_report import _intro_lines
    intro = "\n".join(_intro_lines(report))
    assert "both sides train in bf16" in intro and "`bf16=True`" in intro and "runs in fp32" in intro
    assert "Precision:" not in "\n".join(_intro_lines({**report, "precision": "fp32"}))
