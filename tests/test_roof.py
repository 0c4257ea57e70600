"""grpo-bench bench roof: the roof is max(weight bytes / bandwidth, 2 x params x batch / FLOP rate) per decoding
step, the measured rate is the suite's own sampler with the prefill subtracted, and the report says both."""

import json

import pytest

from benchmarks.perf import roof


def test_roof_report_on_a_tiny_model(tmp_path, monkeypatch):
    from tasks.tiny_lm import char_tokenizer, tiny_llama

    tokenizer = char_tokenizer(list("abcdefghijklmnopqrstuvwxyz .,"))
    model = tiny_llama(tokenizer, hidden_size=32, num_layers=1, max_positions=128)
    monkeypatch.setattr("tasks.smollm.load_causal_lm", lambda name=None: (model, tokenizer))
    monkeypatch.setattr(roof, "memory_bandwidth", lambda mib, repeats: 1e9)  # 1 GB/s
    monkeypatch.setattr(roof, "matmul_flops", lambda size, repeats: 1e9)  # 1 GFLOP/s
    settings = roof.RoofSettings(batch_sizes=[1, 8], new_tokens=6, repeats=1, out=str(tmp_path))
    result = roof.run_roof(settings, command="grpo-bench bench roof")
    params = sum(p.numel() for p in model.parameters())
    for row in result["rows"]:
        by_hand = row["batch"] / max(4 * params / 1e9, 2 * params * row["batch"] / 1e9)
        assert row["roof_tokens_per_s"] == pytest.approx(by_hand)
        assert row["share_of_roof"] == pytest.approx(row["tokens_per_s"] / by_hand)
        assert row["bound"] == ("memory" if 4 * params >= 2 * params * row["batch"] else "compute")
        assert row["tokens_per_s"] > 0 and 2 <= row["decode_steps"] <= 6
    assert json.loads((tmp_path / "roof.json").read_text())["rows"] == result["rows"]
    text = (tmp_path / "roof.md").read_text()
    assert text.splitlines()[2].startswith("**Decoding at batch 8 runs at") and "Regenerate: `grpo-bench bench roof`" in text


def test_probes_measure_positive_rates():
    assert roof.memory_bandwidth(8, repeats=1) > 1e8  # any machine moves 100 MB/s
    assert roof.matmul_flops(256, repeats=1) > 1e8


def test_bad_settings_are_one_line(tmp_path, run_cli):
    code, _, err = run_cli("bench", "roof", "--batch-sizes", "0", "--out", tmp_path)
    assert code == 2 and "--batch-sizes must be >= 1" in err and len(err.strip().splitlines()) == 1
