#!/usr/bin/env bash
# The engine benchmark with node-redlock v5 measured beside ours on the same masters in the same run.
# Installs node-redlock (pinned in benches/compare/node-redlock/package.json) under target/, nowhere else.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v node >/dev/null || { echo "node is needed (e.g. apt-get install nodejs npm)" >&2; exit 1; }
dir="${CARGO_TARGET_DIR:-target}/compare/node-redlock"
mkdir -p "$dir"
cp benches/compare/node-redlock/package.json benches/compare/node-redlock/bench.mjs "$dir/"
(cd "$dir" && npm install --no-audit --no-fund --silent)
NODE_REDLOCK_DIR="$(cd "$dir" && pwd)" exec cargo bench --bench engine "$@"
