#!/usr/bin/env bash
# docs/results/feddpa.md: FedDPA vs FedAvg, FedProto, FedRep, FedPer, Ditto on CIFAR-10
# (20k subset, 100 clients, 10 % per round, 5 local epochs, `cnn`), Dirichlet 0.3 (and 1.0),
# the ablation, and the claim "FedDPA's global accuracy beats FedAvg's" over 3 seeds.
# Usage: bash benchmarks/feddpa_results.sh [DATA_DIR] [ROUNDS] [SHORT] [PARALLEL] [GROUP]
#   ROUNDS (10): rounds of the seed-0 FedDPA and FedAvg runs (Dirichlet 0.3): the curves;
#   SHORT (6): rounds of every other run (seeds 1 and 2 of the claim, ablations, baselines,
#   Dirichlet 1.0), all compared at round SHORT (the longer runs evaluate it too: every 3);
#   GROUP: all | claim | rest. The paper trains 100 rounds (docs/results/feddpa.md says why
#   not here: 2 shared CPU cores).
# Runs go to runs/feddpa/<name>/ (skipped when a finished summary.json is there; a killed
# run is resumed from its checkpoint with its rounds set as above), PARALLEL at a time, each
# single-threaded and niced; then benchmarks/feddpa_report.py writes runs/feddpa/report.md.
set -euo pipefail
cd "$(dirname "$0")/.."
DATA="${1:-../shared/data}"
ROUNDS="${2:-10}"
SHORT="${3:-6}"
PARALLEL="${4:-3}"
GROUP="${5:-all}"
EVERY=3
OUT=runs/feddpa
mkdir -p "$OUT"

# name | config | rounds | extra overrides
jobs() {
  local c03=configs/feddpa_cifar10_dirichlet0.3.yaml c10=configs/feddpa_cifar10_dirichlet1.0.yaml
  if [ "$GROUP" != rest ]; then
    for s in 0 1 2; do
      local r=$([ "$s" = 0 ] && echo "$ROUNDS" || echo "$SHORT")
      echo "d0.3_feddpa_s$s|$c03|$r|seed=$s"
      echo "d0.3_fedavg_s$s|$c03|$r|seed=$s algorithm.name=fedavg"
    done
  fi
  if [ "$GROUP" != claim ]; then
    echo "d0.3_feddpa_no_adaptive_s0|$c03|$SHORT|algorithm.adaptive=false"
    echo "d0.3_feddpa_no_hierarchical_s0|$c03|$SHORT|algorithm.hierarchical=false"
    echo "d0.3_feddpa_no_contrastive_s0|$c03|$SHORT|algorithm.contrastive=false"
    for a in fedproto fedrep fedper; do echo "d0.3_${a}_s0|$c03|$SHORT|algorithm.name=$a"; done
    echo "d1.0_feddpa_s0|$c10|$SHORT|seed=0"
    echo "d1.0_fedavg_s0|$c10|$SHORT|algorithm.name=fedavg"
    echo "d0.3_ditto_s0|$c03|$SHORT|algorithm.name=ditto"
  fi
}

run_one() {
  IFS='|' read -r name config rounds extra <<<"$1"
  [ -f "$OUT/$name/summary.json" ] && return 0
  mkdir "$OUT/$name.lock" 2>/dev/null || return 0  # another invocation is running it
  trap 'rmdir "$OUT/$name.lock"' RETURN
  if [ -f "$OUT/$name/checkpoint.pt" ]; then  # killed: continue it (same numbers as unbroken)
    sed -i "s/^  rounds: .*/  rounds: $rounds/" "$OUT/$name/config.yaml"
    nice -n 10 .venv/bin/protofed run --resume "$OUT/$name" -q >>"$OUT/$name.log" 2>&1 \
      || echo "FAILED: $name (see $OUT/$name.log)"
    return 0
  fi
  local args=()
  for kv in $extra; do args+=(-s "$kv"); done
  nice -n 10 .venv/bin/protofed run "$config" --data-dir "$DATA" -q --force --out "$OUT/$name" \
    -s train.rounds="$rounds" -s eval.every="$EVERY" -s train.threads=1 "${args[@]}" \
    >"$OUT/$name.log" 2>&1 || echo "FAILED: $name (see $OUT/$name.log)"
}
export -f run_one
export OUT DATA EVERY
jobs | xargs -P "$PARALLEL" -I{} bash -c 'run_one "$@"' _ {}
.venv/bin/python benchmarks/feddpa_report.py "$OUT" >"$OUT/report.md"
cat "$OUT/report.md"
