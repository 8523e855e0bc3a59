#!/usr/bin/env bash
# PFPL's Table 1 and Figure 4c on digits_domains, mixed heterogeneity: PFPL vs Local, FedAvg,
# Ditto and FedProto for n = 3, 4, 5 classes per client, 20 clients, seeds 0 1 2; two runs at
# a time, each single-threaded. Writes runs/pfpl/n{N}/{algorithm}/s{seed} and
# runs/pfpl/report.md. Usage: bash benchmarks/pfpl_results.sh [DATA_DIR] [SEEDS] [NS]
# (runs that already have a summary.json are skipped, so a stopped script can be rerun).
set -euo pipefail
cd "$(dirname "$0")/.."
DATA="${1:-../shared/data}"
SEEDS="${2:-0 1 2}"
NS="${3:-3 4 5}"
# Priority order, so that a run stopped early leaves the most useful subset: the claim's
# algorithms (PFPL, FedProto, FedAvg) at n = first of NS for every seed; Local and Ditto there
# for the first seed; every algorithm at the other n for the first seed; then the rest.
read -r -a seeds <<< "$SEEDS"
read -r -a ns <<< "$NS"
claim="pfpl fedproto fedavg"
others="local ditto"
jobs=()
add() { local j="$1 $2 $3"; [[ " ${jobs[*]/%/|} " == *" $j| "* ]] || jobs+=("$j"); }
for seed in "${seeds[@]}"; do for a in $claim; do add "${ns[0]}" "$a" "$seed"; done; done
for a in $others; do add "${ns[0]}" "$a" "${seeds[0]}"; done
for n in "${ns[@]:1}"; do for a in $claim $others; do add "$n" "$a" "${seeds[0]}"; done; done
for seed in "${seeds[@]:1}"; do
  for n in "${ns[@]}"; do for a in $claim $others; do add "$n" "$a" "$seed"; done; done
done
printf '%s\n' "${jobs[@]}" | xargs -P 2 -L 1 bash -c '
  out="runs/pfpl/n$0/$1/s$2"
  [ -f "$out/summary.json" ] && exit 0
  nice -n 10 .venv/bin/protofed run "configs/pfpl_digits_mixed_n$0.yaml" --data-dir "'"$DATA"'" \
    -q --force -s algorithm.name="$1" -s seed="$2" -s train.threads=1 --out "$out" > /dev/null
  echo "done n=$0 $1 seed=$2"'
.venv/bin/python benchmarks/pfpl_table.py runs/pfpl | tee runs/pfpl/report.md
