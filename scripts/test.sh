#!/usr/bin/env bash
# Runs every check and test of the project on a fresh machine: installs what the tests need when missing
# (redis-server, openssl and a C compiler through apt-get when run as root), then formatting, lints and the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."

need_packages=()
command -v redis-server >/dev/null 2>&1 || need_packages+=(redis-server)
command -v cc >/dev/null 2>&1 || need_packages+=(gcc)
command -v openssl >/dev/null 2>&1 || need_packages+=(openssl)
if [ ${#need_packages[@]} -gt 0 ]; then
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "==> installing ${need_packages[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need_packages[@]}" >/dev/null
  else
    echo "The tests need: ${need_packages[*]}. Install them (Debian/Ubuntu: sudo apt-get install ${need_packages[*]}) and run again." >&2
    exit 1
  fi
fi
# Tests start their own masters; a packaged service must not be mistaken for one of them.
if command -v service >/dev/null 2>&1; then service redis-server stop >/dev/null 2>&1 || true; fi

echo "==> cargo fmt --check"
cargo fmt --all -- --check
echo "==> cargo clippy"
cargo clippy --all-targets --locked -- -D warnings
echo "==> cargo test"
mkdir -p target
# What the operator's client asks the API server for, recorded by the test API server in every run below, for
# the chart check's RBAC comparison (scripts/rbac_check.py).
export REDLOCK_RBAC_RECORD_DIR="$PWD/target/rbac-requests"
rm -rf "$REDLOCK_RBAC_RECORD_DIR"
log=target/test-output.log
cargo test --locked 2>&1 | tee "$log"
# The end-to-end tests once more against the test API server in its realistic mode: jittered latency on every
# request and watch event, late initial lists of Jobs and pods, watches that end or expire (410) and relist.
# A failing test prints its seed; REDLOCK_E2E_SEED repeats the random choices.
echo "==> end-to-end tests against the realistic test API server"
REDLOCK_E2E_REALISTIC=1 cargo test --locked --no-fail-fast --test operator --test operator_faults --test leader --test jobs --test tenancy --test fencing_tokens --test cel_cases --test readme_local_path 2>&1 | tee -a "$log"
# The end-to-end tests once more in their real-cluster mode (REDLOCK_E2E_KUBECONFIG), against a stand-in cluster:
# the test API server and a simulated Job controller in a process of their own, shared by all the tests. Like a
# real API server, it evaluates the CRDs' CEL rules, so the tests take their real-cluster paths.
echo "==> end-to-end tests in real-cluster mode, against a stand-in cluster"
cargo build --locked --example stand-in-cluster
kubeconfig="$PWD/target/stand-in-cluster.kubeconfig"
rm -f "$kubeconfig"
"${CARGO_TARGET_DIR:-target}/debug/examples/stand-in-cluster" "$kubeconfig" 2>target/stand-in-cluster.log &
stand_in=$!
trap 'kill "$stand_in" 2>/dev/null || true' EXIT
for _ in $(seq 100); do [ -f "$kubeconfig" ] && break; sleep 0.1; done
if [ ! -f "$kubeconfig" ]; then
  echo "the stand-in cluster did not start:" >&2
  cat target/stand-in-cluster.log >&2
  exit 1
fi
REDLOCK_E2E_KUBECONFIG="$kubeconfig" cargo test --locked --test operator --test operator_faults --test leader --test jobs --test tenancy --test fencing_tokens --test cel_cases --test readme_local_path 2>&1 | tee -a "$log"
kill "$stand_in"
# The Helm chart: lint, render and validate (installs helm and a Python venv under target/tools when missing).
echo "==> chart check"
./scripts/chart-check.sh
# One closing line over every test binary.
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i) ~ /^passed/) p += $(i-1); if ($(i) ~ /^failed/) f += $(i-1) } }
     END { printf "tests: %d passed, %d failed\n", p, f }' "$log"
