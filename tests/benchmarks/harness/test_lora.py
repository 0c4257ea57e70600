"""LoRA through PEFT: a GRPO run learns pizza training only the adapter, whose reference is the base
model with the adapter disabled (no copy); the adapter saves and loads with PEFT; PPO's critic is a
value head on the shared trunk, not a copy of it."""

import dataclasses

import torch

from algorithms.grpo import GRPOConfig
from algorithms.ppo import PPOConfig
from benchmarks.api import train
from benchmarks.harness import lora
from benchmarks.harness.config import RunConfig
from benchmarks.harness.loop import build
from tasks.pizza import PizzaTask


def _logits(model, text="ravin likes "):
    tokenizer = PizzaTask(eval_samples=1).tokenizer
    ids = tokenizer(text, return_tensors="pt", add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_grpo_lora_learns_and_adapter_round_trips(tmp_path):
    from peft import PeftModel

    result = train(task="pizza", config=GRPOConfig(learning_rate=1e-2, beta=0.04), steps=4, eval_samples=32, seed=0,
                   lora_r=8, save_model=True, out=tmp_path, progress=False)
    s = result.summary
    assert s["accuracy_after"] > s["accuracy_before"]
    info = s["config"]["policy"]["lora"]
    assert info["r"] == 8 and info["alpha"] == 32 and info["trainable_parameters"] < info["parameters"] / 5
    assert s["trainable_param_bytes"] < s["param_bytes"] / 5
    # AdamW's two moments (and a scalar step count per tensor), of the adapter only
    assert 2 * s["trainable_param_bytes"] <= s["optimizer_bytes"] < 2 * s["trainable_param_bytes"] + 1024
    assert (tmp_path / "final" / "adapter_config.json").exists()
    reloaded = PeftModel.from_pretrained(PizzaTask(eval_samples=1).load_policy("cpu"), tmp_path / "final").eval()
    trained = result.policy.eval()
    assert torch.equal(_logits(reloaded), _logits(trained))


def test_reference_is_the_policy_with_its_adapter_disabled():
    rc = RunConfig(task="pizza", algo="grpo", device="cpu", lora_r=4, lora_dropout=0.0)
    task, policy, algo, resolved = build(rc, GRPOConfig(beta=0.04, learning_rate=1e-3), {"eval_samples": 1})
    assert isinstance(algo.ref_policy, lora.AdapterDisabledReference)
    base = PizzaTask(eval_samples=1).load_policy("cpu").eval()
    for name, p in policy.named_parameters():
        if "lora_B" in name:
            p.data.normal_()  # the adapter now changes the function
    policy.eval()
    assert not torch.allclose(_logits(policy), _logits(base))
    assert torch.equal(_logits(algo.ref_policy), _logits(base))
    assert all(not p.requires_grad for n, p in policy.named_parameters() if "lora_" not in n)


def test_reference_log_probs_are_the_base_models_on_every_route():
    """After the adapter has moved, the reference's log-probs equal the base model's through the lean packed
    route (``frozen_logps`` engages the policy with its adapter off) and through transformers' forward (the
    reference called as a model); the policy's own differ. A lean forward that ran the adapter-off reference
    with its adapter on gave the policy's log-probs (KL 0 in every LoRA run)."""
    from algorithms import fast_llama, rollout

    rc = RunConfig(task="pizza", algo="grpo", device="cpu", lora_r=4, lora_dropout=0.0)
    task, policy, algo, _ = build(rc, GRPOConfig(beta=0.04, learning_rate=1e-3), {"eval_samples": 1})
    base = PizzaTask(eval_samples=1).load_policy("cpu").eval()
    for name, p in policy.named_parameters():
        if "lora_B" in name:
            p.data.normal_(generator=torch.Generator().manual_seed(0))
    batch = rollout.generate(policy, algo.tokenizer, task.train_prompts()[:2], 4, max_new_tokens=8,
                             generator=torch.Generator().manual_seed(0))
    mask = batch.completion_mask.bool()
    assert rollout._layout(policy, batch.prompt_ids, batch.prompt_mask, batch.completion_mask, 4)[0] == "packed"
    assert fast_llama.llama_of(algo.ref_policy) is None  # a stand-in is called, never run layer by layer
    with torch.inference_mode():
        expected = rollout.rollout_logps(base, batch)[mask]
        direct = rollout.rollout_logps(algo.ref_policy, batch)[mask]
        own = rollout.rollout_logps(policy, batch)[mask]
    engaged = algo.frozen_logps(algo.ref_policy, batch)[mask]
    assert (own - expected).abs().max() > 0.1
    torch.testing.assert_close(engaged, expected, rtol=0, atol=1e-5)
    torch.testing.assert_close(direct, expected, rtol=0, atol=1e-5)
    assert not policy.base_model.model.model.layers[0].self_attn.q_proj.disable_adapters  # the adapter is back on


def test_ppo_critic_under_lora_is_a_head_on_the_shared_trunk():
    rc = RunConfig(task="pizza", algo="ppo", device="cpu", lora_r=4)
    config = PPOConfig(learning_rate=1e-3, prompts_per_step=2, samples_per_prompt=2)
    task, policy, algo, _ = build(rc, config, {"eval_samples": 1})
    hidden = policy.config.hidden_size
    assert sum(p.numel() for p in algo.critic.parameters()) == hidden + 1  # the head alone: no trunk copy
    metrics = algo.step(task.train_prompts() * 2)
    assert all(torch.isfinite(torch.tensor(v)) for v in metrics.values())
    assert algo.critic.head.weight.abs().sum() > 0  # the value loss trained the head
    full_task, full_policy, full_algo, _ = build(dataclasses.replace(rc, lora_r=0), config, {"eval_samples": 1})
    assert sum(p.numel() for p in full_algo.critic.parameters()) > 100 * (hidden + 1)  # without LoRA: its own copy
