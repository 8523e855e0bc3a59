#!/usr/bin/env bash
# docs/results/fedali.md: FedAli against FedAvg, FedProx (mu 0.01, the paper's tuned value),
# FedPer and Local, all on the same HART backbone (the baselines without ALP layers), natural
# clients (UCI-HAR: 30 subjects), Adam 1e-4, batch 64, seed 0, every client every round.
# Usage: bash benchmarks/fedali_results.sh [DATA_DIR] [ROUNDS] [LOCAL_EPOCHS] [DATASET] [METHODS]
#   ROUNDS (default 8; the paper: 600) and LOCAL_EPOCHS (default 1; the paper: 5) are what
#   fit 2 shared CPU cores; evaluation runs once, after the last round (eval.every=ROUNDS).
#   DATASET: uci_har (default), hhar or wisdm (configs/fedali_<DATASET>_natural.yaml).
#   METHODS: default "fedali fedavg fedprox fedper local".
# Runs go to runs/fedali_<DATASET>/<method>; the table to runs/fedali_<DATASET>/report.md;
# FedAli re-evaluated with batch-independent inference and without local prototypes at
# inference (same trained run, benchmarks/fedali_reeval.py) to runs/fedali_<DATASET>/reeval.jsonl.
set -euo pipefail
cd "$(dirname "$0")/.."
DATA="${1:-../shared/data}"
ROUNDS="${2:-8}"
EPOCHS="${3:-1}"
SET="${4:-uci_har}"
METHODS="${5:-fedali fedavg fedprox fedper local}"
CONFIG="configs/fedali_${SET}_natural.yaml"
OUT="runs/fedali_${SET}"
COMMON=(--data-dir "$DATA" -q --force -s "train.rounds=$ROUNDS" -s "eval.every=$ROUNDS"
        -s "train.local_epochs=$EPOCHS" -s train.threads=1)
declare -A EXTRA=(
  [fedali]=""
  [fedavg]="-s algorithm.name=fedavg -s model.alp.enabled=false"
  [fedprox]="-s algorithm.name=fedprox -s algorithm.mu=0.01 -s model.alp.enabled=false"
  [fedper]="-s algorithm.name=fedper -s model.alp.enabled=false"
  [local]="-s algorithm.name=local -s model.alp.enabled=false"
)
for m in $METHODS; do
  # shellcheck disable=SC2086
  nice -n 10 .venv/bin/protofed run "$CONFIG" "${COMMON[@]}" ${EXTRA[$m]} --out "$OUT/$m"
done
.venv/bin/protofed report $(for m in $METHODS; do echo "$OUT/$m"; done) --out "$OUT/report"
if [[ " $METHODS " == *" fedali "* ]]; then
  : > "$OUT/reeval.jsonl"
  for s in model.alp.inference=sample model.alp.local_at_inference=false; do
    nice -n 10 .venv/bin/python benchmarks/fedali_reeval.py "$OUT/fedali" -s "$s" -s train.workers=1 \
      >> "$OUT/reeval.jsonl"
  done
fi
