"""The report half of ``grpo-bench bench grpo-vs-trl`` / ``rloo-vs-trl`` (benchmarks/perf/vs_trl.py measures):
a finished or stopped run's report dict rendered as markdown (``render_markdown``: what ran where, the comparison
table and the target, each step's phases, the same batch part by part, bf16 and scaling where measured), the
target's one-line verdict (``target_verdict``) and the scaling plot (``plot_scaling``). It reads only the report
dict and the sides' names and tolerances (benchmarks/references/sides.py); it never imports the measuring module."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Optional

from benchmarks.io import save_figure
from benchmarks.markdown import markdown_table
from benchmarks.references.sides import (SAME_BATCH_COLUMNS, SAME_LOGPS_ATOL, SAME_LOSS_ATOL, SIDES, STEP_PARTS,
                                         TRL_SETTINGS, same_loss_misses)
from benchmarks.references.trl import TRAINERS


def _fmt_bytes(n: Optional[float]) -> str:
    return "n/a" if n is None else f"{n / 2**30:.2f} GiB"


def _fmt_mem(probe: Optional[dict]) -> str:
    if not probe:
        return "n/a"
    return f"{_fmt_bytes(probe['peak_bytes'])} ({_fmt_bytes(probe['rss_after_imports_bytes'])} at start)"


TARGET_RATIO = 2.5  # the bar: 2.5 times TRL's fastest step, no more memory, the same loss on the same batch
def _same_loss_bar(report: dict) -> str:
    if all("abs_diff_formula" in r["same_batch"] for r in report["comparisons"]):
        return (f"the same loss on the same batch: the loss function within {SAME_LOSS_ATOL:g} on TRL's own log-probs, "
                f"advantages within {SAME_LOSS_ATOL:g}, log-probs within {SAME_LOGPS_ATOL:.0e} of TRL's")
    return f"same-batch loss within {SAME_LOSS_ATOL:g}"


def _lowest_trl_peak(mem: dict) -> Optional[int]:
    peaks = [mem[side]["peak_bytes"] for side in SIDES[1:] if mem.get(side)]
    return min(peaks) if len(peaks) == len(SIDES) - 1 else None


def target_verdict(report: dict) -> str:
    """One line: on which workloads the target holds: median TRL/ours >= 2.5 against TRL's faster setting,
    peak memory no higher than the lower of TRL's, the same loss on the same batch."""
    met, missed = [], []
    for r in report["comparisons"]:
        mem = r.get("memory") or {}
        reasons = []
        if r["ratio"]["median"] < TARGET_RATIO:
            reasons.append(f"median {r['ratio']['median']:.2f} < {TARGET_RATIO:g}")
        trl_peak = _lowest_trl_peak(mem)
        if mem.get("ours") and trl_peak is not None and mem["ours"]["peak_bytes"] > trl_peak:
            reasons.append("more memory than TRL")
        if not mem.get("ours") or trl_peak is None:
            reasons.append("memory not measured")
        reasons += same_loss_misses(r["same_batch"])
        (missed if reasons else met).append(r["workload"]["name"] + (f" ({'; '.join(reasons)})" if reasons else ""))
    measured = [r["workload"]["name"] for r in report["comparisons"]]
    # A run stopped before the end has not shown the target on the workloads it never reached.
    unmeasured = [name for name in report.get("workloads", measured) if name not in measured]
    every = f"every workload measured ({len(measured)} of {len(measured) + len(unmeasured)})" if unmeasured else "every workload"
    verdict = f"met on {every}" if not missed else f"not met on {', '.join(missed)}"
    return (f"**Target** (median TRL/ours >= {TARGET_RATIO:g} against TRL's faster setting, peak memory no higher "
            f"than the lower of TRL's, {_same_loss_bar(report)}): {verdict}"
            + (f"; met on {', '.join(met)}" if met and missed else "")
            + (f"; not measured: {', '.join(unmeasured)}." if unmeasured else "."))


def _ratio_cell(ratio: dict, bold: bool) -> str:
    median = f"**{ratio['median']:.2f}**" if bold else f"{ratio['median']:.2f}"
    interval = f" [{ratio['median_ci95'][0]:.2f}, {ratio['median_ci95'][1]:.2f}]" if "median_ci95" in ratio else ""
    return f"{ratio['min']:.2f} / {median}{interval} / {ratio['max']:.2f}"


def code_line(env: dict) -> str:
    """" This suite at commit X." for a report's environment, or "" where the code's revision is unknown."""
    code = env.get("code")
    if not code:
        return ""
    if code["dirty"] is None:  # the commit a copy was made from, as given ($GRPO_BENCH_REVISION): its changes unknown
        return f" This suite copied from commit {code['commit'][:10]} (as given; its changes unknown)."
    return f" This suite at commit {code['commit'][:10]}" + (" with uncommitted changes." if code["dirty"] else ".")


def render_markdown(report: dict) -> str:
    """The report's markdown: what ran where, the comparison table and the target, then each step's phases, the
    same batch part by part, bf16 and scaling where measured, and how to regenerate it."""
    lines = [*_intro_lines(report), *_resumed_lines(report), *_model_lines(report), *_lora_lines(report),
             *_load_lines(report), _comparison_table(report), "", target_verdict(report), *_stopped_lines(report),
             *_phase_lines(report), *_same_batch_lines(report), *_bf16_lines(report), *_scaling_lines(report),
             "", f"Memory: {report['memory_method']}", "", f"Regenerate: `{report['command']}`"]
    return "\n".join(lines)


def _intro_lines(report: dict) -> list[str]:
    """The versions, the machine and its matmul rate; how TRL runs and how the ratio reads."""
    env = report["environment"]
    algo = report.get("algo", "grpo")  # a report from before RLOO's bench: GRPO
    settings = "; ".join(f"{name}: {', '.join(f'{k}={v}' for k, v in opts.items()) or 'TRL defaults'}"
                         for name, opts in TRL_SETTINGS.items())
    return [
        f"{algo.upper()} step, this suite vs TRL {env['versions'].get('trl')} `{TRAINERS[algo][1]}`, on "
        f"{env['device_name']} (torch {env['versions']['torch']}, {report['threads']} threads). Matmul 2048x2048: "
        f"{report['matmul_gflops']['fp32']:.0f} GFLOP/s fp32, {report['matmul_gflops']['bf16']:.0f} GFLOP/s bf16."
        + code_line(env),
        "",
        *_precision_lines(report),
        f"TRL runs twice, side by side in the same rounds: its default settings, and its fastest on this device "
        f"({settings}; TRL's configs turn gradient checkpointing on by default). TRL/ours is min / median "
        "[95% percentile-bootstrap interval of the median] / max over the rounds; the headline ratio (bold) is "
        "against the faster of the two.",
        "",
    ]


def _precision_lines(report: dict) -> list[str]:
    """At bf16: how each side trains in it, and that the same-batch check stays fp32."""
    if report.get("precision", "fp32") == "fp32":
        return []
    return [f"Precision: both sides train in {report['precision']}. Ours with `--precision {report['precision']}` "
            "(autocast for sampling, the reference and old log-probs and the update; the weights and AdamW's state "
            "stay fp32); TRL with `bf16=True` (accelerate's autocast around the model's forward, generation "
            "included; the weights stay fp32). The same-loss-on-the-same-batch check compares the functions, so it "
            "runs in fp32, on a TRL trainer built again in fp32.", ""]


def _resumed_lines(report: dict) -> list[str]:
    """A paragraph per later session of a resumed report: its machine and what it measured."""
    lines = []
    for later in report.get("resumed", []):
        later_env = later["environment"]
        lines += [f"Resumed in a later session on {later_env['device_name']} (torch {later_env['versions']['torch']}, "
                  f"{later['threads']} threads).{code_line(later_env)} It measured: "
                  f"{', '.join(later['workloads']) or 'nothing'}; each workload's rounds ran in one session.", ""]
    return lines


def _model_lines(report: dict) -> list[str]:
    """The --model in place of the tasks' own, and whether its weights were drawn at random."""
    if not report.get("model"):
        return []
    model = report["model"]
    return [f"Model: `{model['model']}`, in place of each task's default model" + (
            ", with random weights: its architecture and tokenizer, the weights drawn by transformers' "
            "initialisation, seeded (its weights could not be brought to this machine). Every product and "
            "update has the model's sizes, but completions seldom end before their cap."
            if model["random_weights"] else "."), ""]


def _lora_lines(report: dict) -> list[str]:
    """The LoRA workloads' adapters, and why neither side takes adapter dropout."""
    lora = sorted({(r["workload"]["lora_r"], r["workload"].get("lora_dropout", 0.05)) for r in report["comparisons"]
                   if r["workload"].get("lora_r")})  # a report from before lora_dropout: the harness's 0.05
    if not lora:
        return []
    return ["LoRA workloads: PEFT adapters " + ", ".join(f"r {r}, dropout {d:g}" for r, d in lora)
            + " on both sides, the harness's targets (TRL gets the same peft_config). TRL runs with "
            "disable_dropout, so that it samples without dropout as ours does, and that zeroes its adapters' "
            "dropout too; ours then takes none either, so both sides compute one function.", ""]


def _load_lines(report: dict) -> list[str]:
    """The machine's load over the run (and on a CPU its memory bandwidth), for a reader of the absolute times."""
    if not report.get("load"):
        return []
    samples = report["load"]["load_1min"]
    shared = max(samples) > report["threads"] + 0.5  # the load average counts this run's own threads too
    text = (f"Machine load over the run (1-minute load average at its start and after each workload): "
            f"{min(samples):.1f} to {max(samples):.1f} on {report['load']['cpus']} CPUs, this run using "
            f"{report['threads']} threads. "
            + ("Other work shared the cores: the absolute times are slower than on an idle machine; the ratios "
               "are measured side by side, in the same rounds." if shared else "Nothing else ran."))
    bandwidth = report["load"].get("bandwidth_gbs")
    if bandwidth:
        text += (f" Memory bandwidth (a STREAM triad, sampled likewise): {min(bandwidth):.1f} to "
                 f"{max(bandwidth):.1f} GB/s, for a reader comparing runs: other tenants of the host take "
                 "from it unseen by the load average.")
    return [text, ""]


def _comparison_table(report: dict) -> str:
    """One row per workload: its size, each side's step time, the ratios, peak memory and the same-batch loss."""
    rows = []
    for r in report["comparisons"]:
        w, mem = r["workload"], r.get("memory", {})
        rows.append([
            w["name"], f"{r['parameters'] / 1e6:.2f}M", w["group_size"], w["max_new_tokens"], w["mu"],
            f"{r['ours']['median']['time/step']:.3f}",
            *(f"{r[f'trl_{name}']['median']['time/step']:.3f}" for name in TRL_SETTINGS),
            *(_ratio_cell(r["ratios"][name], name == r["faster_trl"]) for name in TRL_SETTINGS),
            *(_fmt_mem(mem.get(side)) for side in SIDES),
            f"{r['same_batch']['max_abs_diff']:.1e}",
        ])
    return markdown_table(
        ["workload", "params", "G", "new tokens", "mu", "ours s/step",
         *(f"TRL {name} s/step" for name in TRL_SETTINGS), *(f"TRL {name}/ours" for name in TRL_SETTINGS),
         "peak memory ours", *(f"peak memory TRL {name}" for name in TRL_SETTINGS), "same-batch loss abs diff"],
        rows)


def _stopped_lines(report: dict) -> list[str]:
    """For a run stopped before the end: how many of its planned workloads it measured."""
    done = [r["workload"]["name"] for r in report["comparisons"]]
    missing = [name for name in report.get("workloads", done) if name not in done]
    if not missing:
        return []
    return ["", f"**Stopped before the end**: {len(done)} of {len(done) + len(missing)} workloads measured; "
                f"not measured: {', '.join(missing)}."]


def _phase_lines(report: dict) -> list[str]:
    """Per workload and side: the median seconds of each phase, generation throughput and the update's FLOP rate."""
    rows = []
    for r in report["comparisons"]:
        for side in SIDES:
            m, rates = r[side]["median"], r[side]["rates"]
            rows.append([r["workload"]["name"], side, *(f"{m[f'time/{p}']:.3f}" for p in STEP_PARTS),
                         f"{m['tokens/generated']:.0f}", f"{rates['generation_tokens_per_s']:.0f}",
                         f"{rates['generation_gflops']:.1f}", f"{rates['update_gflops']:.1f}"])
    return ["", "Median seconds per phase (generate / score / ref+old log-probs / update / other; ours takes the "
            "old log-probs from its first update's forward, so its logprobs column is the reference pass alone), "
            "generation throughput and the update's FLOP rate (6 x params x positions actually processed):", "",
            markdown_table(["workload", "side", *STEP_PARTS, "tokens generated", "gen tok/s", "gen GFLOP/s",
                            "update GFLOP/s"], rows)]


def _same_batch_lines(report: dict) -> list[str]:
    """The same batch part by part (loss function, log-probs, transformers against itself), where measured."""
    parts = [r for r in report["comparisons"] if "abs_diff_formula" in r["same_batch"]]
    if not parts:
        return []
    nan = float("nan")
    columns = [(key, label) for key, label in SAME_BATCH_COLUMNS if key != "max_abs_diff_advantages"]
    return ["", "The same batch, part by part (largest over the two stages, as sampled and after one TRL update): "
            "the end-to-end loss difference; the loss function alone (our loss on TRL's own log-prob tensors "
            "against TRL's); our log-probs and reference log-probs against TRL's (the forward's rounding: our "
            "packed rows against its padded ones); and, for scale, transformers against itself: TRL's loss and "
            "log-probs with each row run alone, unpadded, against its padded batch.", "",
            markdown_table(["workload", *(label for _, label in columns)],
                           [[r["workload"]["name"], *(f"{r['same_batch'].get(key, nan):.1e}" for key, _ in columns)]
                            for r in parts])]


def _bf16_lines(report: dict) -> list[str]:
    """Our bf16-autocast step beside fp32, and what bf16 does to the same batch's loss, where measured."""
    if not report.get("bf16"):
        return []
    checks = {r["workload"]["name"]: r["same_batch"] for r in report["comparisons"]}
    nan = float("nan")
    rows = []
    for b in report["bf16"]:
        c = checks.get(b["workload"], {})
        rows.append([b["workload"], f"{b['median_s']['fp32']:.3f}", f"{b['median_s']['bf16']:.3f}",
                     f"{b['speedup']:.2f}x", f"{c.get('loss_ours_updated', nan):.6g}",
                     f"{c.get('loss_ours_updated_bf16', nan):.6g}", f"{c.get('abs_diff_bf16_vs_fp32', nan):.1e}",
                     f"{c.get('max_abs_diff_logps_bf16_vs_fp32', nan):.1e}"])
    return ["", "bf16 autocast (ours), step time beside fp32, and its effect on the same batch after one update "
            "(current, old and reference log-probs all in bf16):", "",
            markdown_table(["workload", "fp32 s/step", "bf16 s/step", "speed-up", "loss fp32", "loss bf16",
                            "abs diff", "max abs log-prob diff"], rows)]


def _scaling_lines(report: dict) -> list[str]:
    """Our step's median seconds as G, length and model grow, where measured."""
    if not report.get("scaling"):
        return []
    return ["", "Scaling (ours): median seconds per step as the work grows; plot `scaling.png`.", "",
            markdown_table(
                ["task", "params", "G", "max new tokens", "tokens generated", "s/step"],
                [[s["task"], f"{s['parameters'] / 1e6:.2f}M", s["group_size"], s["max_new_tokens"],
                  f"{s['tokens_generated']:.0f}", f"{s['median_s']:.3f}"] for s in report["scaling"]])]


def plot_scaling(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, ax = plt.subplots(figsize=(6, 4))
    for task_name in sorted({r["task"] for r in rows}):
        for vary, fixed_key in (("group_size", "max_new_tokens"), ("max_new_tokens", "group_size")):
            pts = [r for r in rows if r["task"] == task_name]
            base = statistics.mode(r[fixed_key] for r in pts)
            pts = sorted((r for r in pts if r[fixed_key] == base), key=lambda r: r[vary])
            if len(pts) < 2:
                continue
            ax.plot([r["tokens_generated"] for r in pts], [r["median_s"] for r in pts], marker="o",
                    label=f"{task_name} ({pts[0]['parameters'] / 1e6:.2f}M params): vary "
                          f"{'G' if vary == 'group_size' else 'length'} ({fixed_key}={base})")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xlabel("completion tokens generated per step")
    ax.set_ylabel("seconds per GRPO step (ours)")
    ax.legend(fontsize=7)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    save_figure(fig, path, dpi=120)
    plt.close(fig)
