#!/usr/bin/env bash
# A one-GPU check of ctrlmem's real-execution path, in under 5 minutes, with only torch installed
# (ctrlmem runs from this checkout through PYTHONPATH; no network, no pip).
#
# Usage: bash scripts/gpu-check.sh [OUT_DIR]          (default OUT_DIR: build/gpu-check)
#        PYTHON=/path/to/python bash scripts/gpu-check.sh ...
#
# Steps (each prints PASS / FAIL / SKIP; the script exits 1 if any step failed):
#   1. versions: python, torch, CUDA, the GPUs; torch inside ctrlmem's supported range.
#   2. `ctrlmem run` of the V schedules at p = 2 over gloo (V-Half, V-Min, ZB-V; the p = 2 V
#      placement puts two stages on rank 1), exact against the reference, with a P2P audit that
#      must find no operation addressed to its own rank and no shape exchange.
#   3. the NCCL preflight: `ctrlmem run --backend nccl -p N+1` on a machine with N GPUs must stop
#      before launching (exit 2) with the ranks, the GPUs and the fix in one line. Without a GPU
#      the same check runs with the GPU count faked to 1 (labelled so).
#   4. `ctrlmem replay` of the paper's 9.6B, 21B and 38.5B models at their pipeline sizes
#      (p = 16 / 24 / 32, m = 2p, devices 0, 1, p/2, p-1; 1F1B, V-Half, V-Min, V-ZB) into
#      OUT_DIR/replay/replay.json. Without a GPU: the tiny model on the CPU instead (labelled so).
#   5. activation offload (ctrlmem/runtime/hostcopy.py): the host-copy bandwidth, device to pinned
#      host memory and back (the planner's --host-gbs), and one step of the medium model over 8
#      microbatches in V-Min's worst order with every saved activation packed to host memory and
#      reloaded at its backward: identical gradients and a lower device peak than keeping them,
#      and V-Min with offload predicted at the measured copy-to-forward ratio, into
#      OUT_DIR/offload.json. Without a GPU: the tiny model on the CPU (labelled so).
# Everything it writes goes to OUT_DIR; the console output is also in OUT_DIR/gpu-check.log.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${1:-build/gpu-check}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
if [ -z "${PYTHON:-}" ]; then
  if [ -x "$ROOT/.venv/bin/python" ]; then PYTHON=$ROOT/.venv/bin/python; else PYTHON=python3; fi
fi
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
exec > >(tee "$OUT/gpu-check.log") 2>&1
fails=0
step() { echo; echo "== $*"; }
verdict() {  # verdict NAME RC
  if [ "$2" = 0 ]; then echo "PASS: $1"; else echo "FAIL: $1 (status $2)"; fails=$((fails + 1)); fi
}
T0=$(date +%s)

step "1. versions"
"$PYTHON" - <<'EOF'
import platform, sys
import torch
from ctrlmem.runtime.adapter import SUPPORTED_TORCH, check_torch_version
print(f"python {platform.python_version()}  torch {torch.__version__}  CUDA (torch built with) {torch.version.cuda}")
print(f"supported torch: {SUPPORTED_TORCH[0][0]}.{SUPPORTED_TORCH[0][1]} to {SUPPORTED_TORCH[1][0]}.{SUPPORTED_TORCH[1][1]}")
if torch.cuda.is_available():
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        print(f"GPU {i}: {p.name}, {p.total_memory // 2**20} MiB, capability {p.major}.{p.minor}")
    print(f"NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}")
else:
    print("no GPU visible to torch")
check_torch_version()
EOF
verdict "versions (torch in the supported range)" $?
GPUS=$("$PYTHON" -c "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)")

step "2. ctrlmem run: V schedules at p = 2 over gloo, P2P audit"
for s in v-half v-min zb-v; do
  "$PYTHON" -m ctrlmem.cli run --schedule "$s" -p 2 -m 4 --backend gloo --steps 1 --audit-p2p \
      --timeout 240 --hang-timeout 90 --out "$OUT/run-$s" >/dev/null
  rc=$?
  if [ $rc = 0 ]; then
    "$PYTHON" - "$OUT/run-$s/result.json" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
audit = r["p2p_audit"]
print(f"  {r['schedule']['name']}: |loss-ref| {r['loss_abs_diff']:.1e}, grad rel diff {r['grad_rel_diff']:.1e}, "
      f"saved/theory {[round(x, 3) for x in r['saved_over_theory']]}, step {r['step_time_s']['median'] * 1e3:.0f} ms, "
      f"P2P ops per rank {[a['p2p_ops'] for a in audit]}, to own rank {[a['self_ops'] for a in audit]}, "
      f"shape exchanges {[a['object_exchanges'] for a in audit]}")
ok = r["grad_rel_diff"] <= 1e-5 and all(a["self_ops"] == 0 and a["object_exchanges"] == 0 for a in audit)
sys.exit(0 if ok else 1)
EOF
    rc=$?
  else
    grep -h '"failure"' "$OUT/run-$s/result.json" 2>/dev/null | head -n 1
  fi
  verdict "ctrlmem run --schedule $s -p 2 --backend gloo" $rc
done

step "3. NCCL preflight"
if [ "$GPUS" -ge 1 ]; then
  want=$((GPUS + 1))
  msg=$("$PYTHON" -m ctrlmem.cli run --schedule v-half -p "$want" -m $((2 * want)) --backend nccl \
        --out "$OUT/nccl-preflight" 2>&1 >/dev/null)
  rc=$?
  label="ctrlmem run --backend nccl -p $want on $GPUS GPU(s)"
else
  want=2
  msg=$("$PYTHON" - "$OUT/nccl-preflight" 2>&1 >/dev/null <<'EOF'
import sys
from ctrlmem.runtime import launch
launch.visible_gpus = lambda: 1  # a faked one-GPU machine (this one has none)
from ctrlmem.cli import main
sys.exit(main(["run", "--schedule", "v-half", "-p", "2", "-m", "4", "--backend", "nccl", "--out", sys.argv[1]]))
EOF
)
  rc=$?
  label="ctrlmem run --backend nccl -p 2 on a FAKED one-GPU machine (no GPU here)"
fi
echo "  $msg"
case "$msg" in
  *"needs $want ranks"*"GPU(s) are visible"*"--backend gloo"*) [ $rc = 2 ] && rc=0 || rc=1 ;;
  *) rc=1 ;;
esac
verdict "$label stops before launching with the fix (exit 2)" $rc
if [ "$GPUS" -ge 2 ]; then
  "$PYTHON" -m ctrlmem.cli run --schedule v-half -p 2 -m 4 --backend nccl --model small --steps 3 \
      --timeout 240 --out "$OUT/run-nccl-v-half"
  verdict "ctrlmem run --schedule v-half -p 2 --backend nccl" $?
fi

step "4. ctrlmem replay of the paper's models"
if [ "$GPUS" -ge 1 ]; then
  for spec in 9.6b:16 21b:24 38.5b:32; do
    model=${spec%:*}; p=${spec#*:}
    "$PYTHON" -m ctrlmem.cli replay --model "$model" -p "$p" -m $((2 * p)) \
        --schedules 1f1b,v-half,v-min,v-zb --devices "0,1,$((p / 2)),$((p - 1))" --device cuda \
        --tag gpu-check --out "$OUT/replay"
    verdict "ctrlmem replay --model $model -p $p (cuda)" $?
  done
else
  echo "  no GPU: replaying the tiny model on the CPU instead of the paper's models"
  "$PYTHON" -m ctrlmem.cli replay --model tiny -p 4 -m 8 --schedules 1f1b,v-half,v-min,v-zb \
      --devices 0,1,2,3 --device cpu --tag gpu-check-cpu --out "$OUT/replay" 2>&1 | grep -v '^USDT'
  verdict "ctrlmem replay --model tiny -p 4 (CPU stand-in)" "${PIPESTATUS[0]}"
fi

step "5. activation offload: host-copy bandwidth and an offloaded V-Min step"
if [ "$GPUS" -ge 1 ]; then dev=cuda; model=medium; else dev=cpu; model=tiny; echo "  no GPU: host memcpy and the tiny model on the CPU"; fi
"$PYTHON" - "$dev" "$model" "$OUT/offload.json" <<'EOF'
import json, sys
from ctrlmem.runtime import hostcopy
dev, model, out = sys.argv[1:4]
bw = hostcopy.copy_bandwidth(dev, mib=256 if dev == "cuda" else 16)
step = hostcopy.offloaded_step(model, dev, microbatches=8)
pred = hostcopy.predicted_v_min(step, bw)
json.dump({"bandwidth": bw, "step": step, "v_min": pred}, open(out, "w"), indent=1)
print(f"  host link ({bw['how']}): device->host {bw['d2h_gbs']:.1f} GB/s, host->device {bw['h2d_gbs']:.1f} GB/s "
      f"(ctrlmem plan --host-gbs {min(bw['d2h_gbs'], bw['h2d_gbs']):.0f})")
print(f"  {model} on {dev}, 8 microbatches: {step['offloaded_bytes'] / 2**20:.1f} MiB of saved tensors to host; "
      f"step {step['step_s'] * 1e3:.0f} ms kept, {step['offloaded_step_s'] * 1e3:.0f} ms offloaded; device peak "
      f"{step['peak_device_bytes'] / 2**20:.0f} MiB kept, {step['offloaded_peak_device_bytes'] / 2**20:.0f} MiB "
      f"offloaded; gradients identical: {step['grads_identical']}")
print(f"  V-Min p = {pred['p']}, m = {pred['m']} ({pred['how']}, copy = {pred['copy_over_forward']:.2f} F): makespan "
      f"{pred['makespan']:g} -> {pred['offloaded_makespan']:g}, peak {pred['peak']:g} a -> {pred['offloaded_peak']:g} a")
ok = step["grads_identical"] and step["offloaded_bytes"] > 0 and (
    dev != "cuda" or step["offloaded_peak_device_bytes"] < step["peak_device_bytes"])
sys.exit(0 if ok else 1)
EOF
verdict "host-copy bandwidth and an offloaded step ($model on $dev)" $?

echo
echo "gpu-check: $fails failed step(s) in $(( $(date +%s) - T0 )) s; output in $OUT"
[ "$fails" = 0 ]
