#!/usr/bin/env bash
# Run a list of experiments side by side, one protofed process each: how the GPU campaigns of
# docs/results/ were run (many small federations share one GPU; each process drives its own).
#
#   bash benchmarks/parallel_runs.sh JOBS_FILE OUT_DIR [PARALLEL] [TIME_LIMIT_S]
#
# JOBS_FILE: one run a line, `NAME ARGS...`, ARGS being what `protofed run` takes (a config and
# -s overrides); blank lines and lines starting with # are skipped. Each run writes OUT_DIR/NAME
# and its log OUT_DIR/NAME.log. PARALLEL runs at a time (default: the number of cores). A run
# still going after TIME_LIMIT_S seconds (default: none) is stopped: its metrics.jsonl keeps the
# rounds it evaluated, and `protofed run --resume OUT_DIR/NAME` continues it.
# PROTOFED names the command (default: `python3 -m protofed`).
set -euo pipefail
JOBS="$1"; OUT="$2"; PARALLEL="${3:-$(nproc)}"; LIMIT="${4:-0}"
PROTOFED="${PROTOFED:-python3 -m protofed}"
mkdir -p "$OUT"
one() {
  local name="$1"; shift
  local start=$SECONDS rc=0
  mkdir -p "$(dirname "$OUT/$name")"
  # shellcheck disable=SC2086
  timeout --signal=INT "${LIMIT}" $PROTOFED run "$@" --force -q --out "$OUT/$name" \
    > "$OUT/$name.log" 2>&1 || rc=$?
  echo "$name rc=$rc $((SECONDS - start))s"
}
export -f one; export OUT LIMIT PROTOFED
grep -v -e '^\s*#' -e '^\s*$' "$JOBS" | sed 's/[[:space:]]*$//' | xargs -P "$PARALLEL" -L 1 bash -c 'one "$@"' _
