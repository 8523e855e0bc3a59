#!/usr/bin/env bash
# The README's UCI-HAR table: every core baseline, natural clients (30 subjects), cnn1d,
# 6 channels, 30 rounds, seed 0. Usage: bash benchmarks/uci_har_baselines.sh [DATA_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
DATA="${1:-../shared/data}"
for algo in local centralized fedavg fedprox fedper fedrep ditto; do
  .venv/bin/protofed run configs/uci_har_natural.yaml --data-dir "$DATA" -q --force \
    -s algorithm.name="$algo" --out "runs/uci_har/$algo"
done
.venv/bin/protofed report runs/uci_har/{local,centralized,fedavg,fedprox,fedper,fedrep,ditto} \
  --out runs/uci_har/report
