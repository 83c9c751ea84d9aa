#!/usr/bin/env bash
# The test command with one CPU-bound process per core beside it: the suite must pass on a busy machine, not only
# on a quiet one. Arguments are passed to scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
cores=$(nproc)
busy=()
stop_load() {
  for pid in "${busy[@]}"; do kill "$pid" 2>/dev/null || true; done
}
trap stop_load EXIT
for _ in $(seq "$cores"); do
  # A shell loop that never sleeps: as much CPU as the scheduler gives it, at the tests' own priority.
  bash -c 'while :; do :; done' &
  busy+=($!)
done
echo "==> ${cores} busy processes beside the test command"
./scripts/test.sh "$@"
