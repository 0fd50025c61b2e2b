#!/usr/bin/env bash
# The checks that need GPUs, as one short script (a few minutes on one node):
#
#   1. NCCL: all-reduce of 256 MiB between the node's GPUs (torchrun, one process per GPU),
#      bus bandwidth in GB/s; skipped with one GPU.
#   2. FSDP2 mixed precision: 3 steps of online GRPO under torchrun on the GPUs with
#      model.compute_dtype=bfloat16 (parameters float32, compute bf16, gradients reduced in
#      float32) and the same run in float32: both finish with finite losses and gradient
#      norms; the figures (loss, grad norm, train-inference mismatch, seconds per step) are
#      reported side by side, not compared: the two sample different rollouts.
#   3. vLLM's GPU build (if `python -c "import vllm"` works in $VLLM_PYTHON): a launched
#      server, one run of 3 steps with rollout.engine=vllm, and the weight sync time per
#      transport (file, http) at three model sizes (benchmarks/bench_vllm.py).
#   4. Sharded generation (two GPUs or more): 3 float32 steps of online GRPO in one process
#      and under torchrun on two GPUs, the same global batch; each rank generates half of
#      every rollout on its own GPU. Reported: whether the first step's rollout metrics are
#      equal (they are on CPU; a GPU's kernels may round differently at another batch size),
#      the seconds per step of both, and the train-inference mismatch of steps 2-3 (checked:
#      <= 1e-4: every rank's engine loaded the trained weights). Then FSDP2's sharded
#      checkpoints over NCCL: the run saved after every step, resumed from step 2 in a new
#      directory: its step-3 loss equals the uninterrupted run's (checked: within 1e-5
#      relative). With one GPU NCCL cannot put two ranks on it: skipped, and said so.
#   The vLLM weight transport over NCCL is not built (docs/howto/vllm.md; its place is
#   ardea.rollout.engines.vllm.transports); check 3 measures the file and http transports.
#
# Usage, from the repository root with ardea installed in .venv and CUDA torch:
#   bash scripts/gpu_check.sh [OUT_DIR]
# Writes OUT_DIR/gpu_check.json (figures) and one log per check; exits non-zero on a failure.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-gpu_check_out}"
mkdir -p "$OUT"
PY="${PYTHON:-.venv/bin/python}"
ARDEA="$(dirname "$PY")/ardea"
VLLM_PYTHON="${VLLM_PYTHON:-.venv-vllm/bin/python}"
GPUS="$("$PY" -c 'import torch; print(torch.cuda.device_count())')"
echo "{\"gpus\": $GPUS}" > "$OUT/gpu_check.json"
if [ "$GPUS" -lt 1 ]; then
  echo "no CUDA device visible to $PY" >&2
  exit 1
fi
nvidia-smi --query-gpu=name,memory.total --format=csv > "$OUT/gpus.csv" || true

# 1. NCCL bandwidth
if [ "$GPUS" -ge 2 ]; then
  cat > "$OUT/nccl_allreduce.py" <<'EOF'
import json, os, time, torch, torch.distributed as dist
dist.init_process_group("nccl")
rank, world = dist.get_rank(), dist.get_world_size()
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
x = torch.ones(64 * 2**20, device="cuda")  # 256 MiB of float32
for _ in range(3):
    dist.all_reduce(x)
torch.cuda.synchronize()
start, reps = time.perf_counter(), 10
for _ in range(reps):
    dist.all_reduce(x)
torch.cuda.synchronize()
seconds = (time.perf_counter() - start) / reps
busbw = x.numel() * 4 * 2 * (world - 1) / world / seconds / 1e9
if rank == 0:
    print(json.dumps({"nccl_allreduce_busbw_gbs": busbw, "world": world}))
dist.destroy_process_group()
EOF
  "$PY" -m torch.distributed.run --standalone --nproc-per-node "$GPUS" \
    "$OUT/nccl_allreduce.py" | tee "$OUT/nccl.log"
fi

# 2. FSDP2 mixed precision against float32, 3 online GRPO steps on every GPU
for dtype in float32 bfloat16; do
  "$PY" -m torch.distributed.run --standalone --nproc-per-node "$GPUS" "$ARDEA" train \
    configs/online_grpo.yaml trainer.device=cuda trainer.max_steps=3 trainer.eval_every=0 \
    trainer.save_every=0 trainer.batch_size=$((8 * GPUS)) model.compute_dtype=$dtype \
    logging.progress=false "trainer.output_dir=$OUT/fsdp2_$dtype" > "$OUT/fsdp2_$dtype.log" 2>&1
done
"$PY" - "$OUT" <<'EOF'
import json, math, sys
from pathlib import Path
out = Path(sys.argv[1])
def losses(dtype):
    lines = (out / f"fsdp2_{dtype}" / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if "train/loss" in r]
figures = json.loads((out / "gpu_check.json").read_text())
keys = ("train/loss", "train/grad_norm", "mismatch/abs_diff_mean")
for dtype in ("float32", "bfloat16"):
    rows = losses(dtype)
    assert len(rows) == 3 and all(math.isfinite(r[k]) for r in rows for k in keys), rows
    seconds = json.loads((out / f"fsdp2_{dtype}" / "results.json").read_text())["profile"]
    figures[f"fsdp2_{dtype}"] = {k: [r[k] for r in rows] for k in keys}
    figures[f"fsdp2_{dtype}"]["seconds_per_step"] = seconds["seconds_per_step"]
(out / "gpu_check.json").write_text(json.dumps(figures, indent=1))
print(json.dumps(figures))
EOF

# 3. vLLM's GPU build
if [ -x "$VLLM_PYTHON" ] && "$VLLM_PYTHON" -c "import vllm" 2>/dev/null; then
  "$ARDEA" train configs/online_grpo.yaml trainer.device=cuda trainer.max_steps=3 \
    trainer.eval_every=0 trainer.save_every=0 rollout.engine=vllm rollout.vllm.launch=true \
    "rollout.vllm.python=$VLLM_PYTHON" model.num_heads=4 logging.progress=false \
    "trainer.output_dir=$OUT/vllm_run" > "$OUT/vllm_run.log" 2>&1
  "$PY" benchmarks/bench_vllm.py --repeats 3 | tee "$OUT/bench_vllm.log"
else
  echo "vLLM is not installed at $VLLM_PYTHON: check 3 skipped" | tee "$OUT/vllm_skipped.log"
fi
# 4. Sharded generation: one process against two ranks on two GPUs; sharded checkpoints
if [ "$GPUS" -ge 2 ]; then
  common=(configs/online_grpo.yaml trainer.device=cuda trainer.max_steps=3 trainer.eval_every=0
          trainer.save_every=0 trainer.batch_size=16 model.compute_dtype=float32
          logging.progress=false)
  "$ARDEA" train "${common[@]}" "trainer.output_dir=$OUT/sharded_1" > "$OUT/sharded_1.log" 2>&1
  "$PY" -m torch.distributed.run --standalone --nproc-per-node 2 "$ARDEA" train "${common[@]}" \
    "trainer.output_dir=$OUT/sharded_2" > "$OUT/sharded_2.log" 2>&1
  # FSDP2's sharded checkpoints over NCCL: saved after step 2, resumed for step 3
  fsdp=(trainer.distributed=fsdp2 trainer.save_every=1)
  "$PY" -m torch.distributed.run --standalone --nproc-per-node 2 "$ARDEA" train "${common[@]}" \
    "${fsdp[@]}" "trainer.output_dir=$OUT/fsdp2_saved" > "$OUT/fsdp2_saved.log" 2>&1
  "$PY" -m torch.distributed.run --standalone --nproc-per-node 2 "$ARDEA" train "${common[@]}" \
    "${fsdp[@]}" "trainer.resume=$OUT/fsdp2_saved/checkpoints/step_0000002" \
    "trainer.output_dir=$OUT/fsdp2_resumed" > "$OUT/fsdp2_resumed.log" 2>&1
  "$PY" - "$OUT" <<'EOF'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
def steps(name):
    lines = (out / name / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if "train/loss" in r]
def rollout(record):
    return {k: v for k, v in record.items() if k.startswith("rollout/")}
one, two = steps("sharded_1"), steps("sharded_2")
mismatch = [r["mismatch/abs_diff_max"] for r in two[1:]]
assert all(m <= 1e-4 for m in mismatch), mismatch
figures = json.loads((out / "gpu_check.json").read_text())
figures["sharded_generation"] = {
    "first_rollout_equal": rollout(one[0]) == rollout(two[0]),
    "mismatch_abs_diff_max_steps_2_3": mismatch,
    "seconds_per_step": {
        n: json.loads((out / n / "results.json").read_text())["profile"]["seconds_per_step"]
        for n in ("sharded_1", "sharded_2")
    },
}
saved, resumed = steps("fsdp2_saved")[2], steps("fsdp2_resumed")
assert [r["step"] for r in resumed] == [3], resumed
figures["fsdp2_resume_step3_loss"] = [saved["train/loss"], resumed[0]["train/loss"]]
assert abs(saved["train/loss"] - resumed[0]["train/loss"]) <= 1e-5 * abs(saved["train/loss"])
(out / "gpu_check.json").write_text(json.dumps(figures, indent=1))
print(json.dumps(figures["sharded_generation"]), figures["fsdp2_resume_step3_loss"])
EOF
else
  echo "one GPU: NCCL cannot put two ranks on it, check 4 skipped" | tee "$OUT/sharded_skipped.log"
fi
echo "done: $OUT/gpu_check.json"
