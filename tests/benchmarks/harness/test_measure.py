"""What a run records of its machine: the CPU's bf16 instructions, read from /proc/cpuinfo's flags."""

import torch

from benchmarks.harness import measure

XEON = "processor\t: 0\nmodel name\t: Intel Xeon\nflags\t\t: fpu sse avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"
EPYC = "processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu sse avx2 avx512f avx512_bf16\n"
AVX2 = "processor\t: 0\nmodel name\t: AMD EPYC 7\nflags\t\t: fpu sse avx2 fma\n"


def test_the_bf16_instructions_are_read_from_the_flags():
    assert measure.cpu_bf16_instructions(XEON) == "AMX-BF16, AVX512-BF16"
    assert measure.cpu_bf16_instructions(EPYC) == "AVX512-BF16"
    assert measure.cpu_bf16_instructions(AVX2) == "none"
    assert measure.cpu_bf16_instructions("processor\t: 0\n") is None  # no flags line: not known, not "none"


def test_a_cpu_run_records_them_and_a_gpu_run_does_not_claim_them(monkeypatch):
    monkeypatch.setattr(measure, "cpu_bf16_instructions", lambda cpuinfo=None: "AVX512-BF16")
    assert measure.environment(torch.device("cpu"))["cpu_bf16"] == "AVX512-BF16"
    assert "cpu_bf16" not in measure.environment(torch.device("meta"))
