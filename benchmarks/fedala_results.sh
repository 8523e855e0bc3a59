#!/usr/bin/env bash
# The runs and tables of docs/results/fedala.md: FedALA (AAAI 2023) against the baselines in
# the slides' settings (configs/fedala_*.yaml: 20 clients, all of them every round, 1 local
# epoch, SGD lr 0.005, batch 10, pflcnn), with ROUNDS rounds on CIFAR-10/100 and ROUNDS_MNIST on
# MNIST (the slides train 2000; docs/results/fedala.md says why so few).
#
#   bash benchmarks/fedala_results.sh [DATA_DIR]            # everything, then the tables
#   PART=accept bash benchmarks/fedala_results.sh            # accept|table|plugin|sens|long
#   bash benchmarks/fedala_results.sh --tables               # only the tables, from finished runs
#
# Run directories: runs/fedala/<part>/<dataset>_<setting>_<algorithm>[_<variant>]_s<seed>.
# Finished runs are skipped and a killed one is resumed, so the script can be re-run at will
# (and two invocations share the work: a run in progress is locked).
# Two runs at a time (JOBS), each single-threaded and niced: the machine is shared.
# Tables: `protofed report` per part (runs/fedala/<part>/report.md and .csv), then
# benchmarks/fedala_tables.py groups seeds into mean ± std (runs/fedala/tables.md).
set -euo pipefail
cd "$(dirname "$0")/.."
DATA="${1:-../shared/data}"
[[ "${1:-}" == "--tables" ]] && DATA=../shared/data
ROUNDS="${ROUNDS:-20}"             # CIFAR-10 and CIFAR-100
ROUNDS_MNIST="${ROUNDS_MNIST:-10}" # MNIST: 3.5x the samples per client, 2x the cost per round
LONG="${LONG:-20}"                 # rounds of the investigation runs (part long)
JOBS="${JOBS:-2}"
PART="${PART:-all}"
OUT=runs/fedala
PROTOFED=.venv/bin/protofed
# Settings shared by every run. FedRep trains its head for 1 epoch per round (PFLlib's
# plocal_epochs default, the library of the slides' baselines; FedRep's paper uses 10, which
# costs 3x more per round here) and its body for train.local_epochs = 1.
# Evaluation once, after the last round (the reported round); no generalization scores.
COMMON=(-s eval.generalization=false -s train.threads=1 -s train.workers=1 -q)

declare -A CONFIG=(
  [mnist_path]=configs/fedala_mnist_pathological.yaml
  [cifar10_path]=configs/fedala_cifar10_pathological.yaml
  [cifar100_path]=configs/fedala_cifar100_pathological.yaml
  [mnist_dir]=configs/fedala_mnist_dirichlet.yaml
  [cifar10_dir]=configs/fedala_cifar10_dirichlet.yaml
  [cifar100_dir]=configs/fedala_cifar100_dirichlet.yaml
)

# algorithm overrides by short name; X+ala is X with the ALA plug-in
algo_args() {
  local name="$1"
  case "$name" in
    *+ala) algo_args "${name%+ala}"; echo "-s algorithm.ala.enabled=true" ;;
    fedrep) echo "-s algorithm.name=fedrep -s algorithm.head_epochs=1" ;;
    *) echo "-s algorithm.name=$name" ;;
  esac
}

# one run: PART DATASET_SETTING ALGORITHM SEED [VARIANT EXTRA-OVERRIDES...]
one() {
  local part="$1" ds="$2" algo="$3" seed="$4" variant="${5:-}"
  shift 4; [[ $# -gt 0 ]] && shift
  local dir="$OUT/$part/${ds}_${algo}${variant:+_$variant}_s${seed}"
  local rounds="$ROUNDS"; [[ "$ds" == mnist_* ]] && rounds="$ROUNDS_MNIST"
  if [[ -f "$dir/summary.json" ]]; then return 0; fi
  # a run in progress (in this or another invocation of the script) is left to it
  mkdir -p "$OUT/.locks"
  exec {lock}> "$OUT/.locks/${part}_$(basename "$dir").lock"
  flock -n "$lock" || return 0
  if [[ -f "$dir/config.yaml" ]]; then
    nice -n 10 "$PROTOFED" run --resume "$dir" -q > /dev/null
  else
    # shellcheck disable=SC2046
    nice -n 10 "$PROTOFED" run "${CONFIG[$ds]}" --data-dir "$DATA" --force --out "$dir" \
      "${COMMON[@]}" -s train.rounds="$rounds" -s eval.every="$rounds" -s seed="$seed" \
      $(algo_args "$algo") "$@" > /dev/null
  fi
  echo "done $dir"
}

# a queue of runs, JOBS at a time
queue=()
add() { queue+=("$(printf '%q ' "$@")"); }
drain() {
  local running=0
  for job in "${queue[@]}"; do
    eval "one $job" &
    running=$((running + 1))
    if (( running >= JOBS )); then wait -n; running=$((running - 1)); fi
  done
  wait
  queue=()
}

report() {  # protofed report over every finished run of a part (plus extra dirs)
  local part="$1"; shift
  local dirs=()
  for d in "$OUT/$part"/*_s[0-9]* "$@"; do [[ -f "$d/summary.json" ]] && dirs+=("$d"); done
  if (( ${#dirs[@]} )); then
    "$PROTOFED" report "${dirs[@]}" --out "$OUT/$part/report" > /dev/null
  fi
}

want() { [[ "$PART" == all || "$PART" == "$1" ]]; }

if [[ "${1:-}" != "--tables" ]]; then
  # (a) the acceptance claim: pathological MNIST and CIFAR-10, 4 methods, 3 seeds
  if want accept; then
    for seed in 0 1 2; do
      for ds in cifar10_path mnist_path; do
        for algo in ditto fedala fedrep fedavg; do add accept "$ds" "$algo" "$seed"; done
      done
    done
    drain
  fi
  # (b) the big table, seed 0: the acceptance runs of seed 0 plus every other cell
  if want table; then
    for ds in cifar100_path cifar100_dir cifar10_dir cifar10_path mnist_dir mnist_path; do
      for algo in ditto fedala fedrep fedavg fedprox local fedper; do
        if [[ "$ds" == mnist_path || "$ds" == cifar10_path ]] \
          && [[ " fedala fedavg ditto fedrep " == *" $algo "* ]]; then continue; fi
        add table "$ds" "$algo" 0
      done
    done
    drain
  fi
  # (c) X + ALA vs X on CIFAR-100, Dirichlet 0.1 (the slides' applicability table).
  # fedavg+ala is fedala (the same numbers; tests/test_fedala.py checks it), so it is not rerun.
  if want plugin; then
    for algo in ditto+ala fedrep+ala fedprox+ala; do add plugin cifar100_dir "$algo" 0; done
    drain
  fi
  # (d) sensitivity of FedALA to p (s = 80) and s (p = 1), CIFAR-100 Dirichlet 0.1
  if want sens; then
    for p in 2 3 4; do add sens cifar100_dir fedala 0 "p$p" -s algorithm.p="$p"; done
    for s in 5 10 20 40 60 100; do add sens cifar100_dir fedala 0 "s$s" -s algorithm.s="$s"; done
    drain
  fi
  # investigation of (a): the same CIFAR-10 pathological runs (seed 0) for LONG rounds,
  # scored every 5 rounds (does FedALA close its gap to Ditto with more rounds?)
  if want long; then
    for algo in ditto fedala fedrep; do
      add long cifar10_path "$algo" 0 "r$LONG" -s train.rounds="$LONG" -s eval.every=5
    done
    drain
  fi
fi

# tables (every part whose runs exist)
mkdir -p "$OUT/table" "$OUT/plugin" "$OUT/sens"
report accept
report table "$OUT"/accept/{mnist,cifar10}_path_*_s0
# (c) and (d) compare with the seed-0 runs of the same setting from (b)
report plugin "$OUT"/table/cifar100_dir_{fedavg,fedprox,ditto,fedrep,fedala}_s0
ln -sfn ../table/cifar100_dir_fedala_s0 "$OUT/sens/cifar100_dir_fedala_p1_s0"
ln -sfn ../table/cifar100_dir_fedala_s0 "$OUT/sens/cifar100_dir_fedala_s80_s0"
report sens
.venv/bin/python benchmarks/fedala_tables.py "$OUT"
