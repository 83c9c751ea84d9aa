#!/usr/bin/env bash
# Runs every check and test of the project on a fresh machine: installs what the tests need when missing
# (redis-server, redis-cli, sqlite3, openssl and a C compiler through apt-get when run as root), then formatting, lints and the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."

# Each `==>` phase, when it started (seconds since the script did) and the machine's CPU time by then: the table at
# the end says where the time went, and how many cores were busy meanwhile (what tells whether a phase could run
# more tests at a time).
phase_names=()
phase_starts=()
phase_cpu=()
# "busy total" clock ticks of all CPUs since boot (busy: all but idle and iowait), or "0 0" where /proc has none.
cpu_ticks() {
  awk '/^cpu / { total = 0; for (i = 2; i <= NF; i++) total += $i; print total - $5 - $6, total; found = 1 }
       END { if (!found) print 0, 0 }' /proc/stat 2>/dev/null || echo 0 0
}
phase() {
  phase_names+=("$1")
  phase_starts+=("$SECONDS")
  phase_cpu+=("$(cpu_ticks)")
  echo "==> $1"
}
phase_table() {
  local i seconds cores busy_from total_from busy_to total_to busy
  cores=$(nproc 2>/dev/null || echo 1)
  echo "==> phases (minutes, and the cores busy on average of the machine's $cores)"
  phase_cpu+=("$(cpu_ticks)")
  for i in "${!phase_names[@]}"; do
    seconds=$((${phase_starts[$((i + 1))]:-$SECONDS} - phase_starts[i]))
    read -r busy_from total_from <<<"${phase_cpu[$i]}"
    read -r busy_to total_to <<<"${phase_cpu[$((i + 1))]}"
    busy=$(awk -v b=$((busy_to - busy_from)) -v t=$((total_to - total_from)) -v c="$cores" \
      'BEGIN { if (t > 0) printf "%4.1f", b / t * c; else printf "   -" }')
    printf '%4d.%d  %s  %s\n' $((seconds / 60)) $((seconds % 60 * 10 / 60)) "$busy" "${phase_names[$i]}"
  done
  printf '%4d.%d        in all\n' $((SECONDS / 60)) $((SECONDS % 60 * 10 / 60))
}
# What to undo however the script ends (a function stopping a cluster it started), and on a failure the phases so far: where the time
# went and which phase failed.
cleanup=""
finish() {
  local status=$?
  # Interrupted while the in-cluster suite ran in the background: it goes before its cluster does.
  if [ -n "${in_cluster_pid:-}" ]; then kill_tree "$in_cluster_pid"; fi
  if [ -n "$cleanup" ]; then "$cleanup"; fi
  if [ "$status" -ne 0 ] && [ ${#phase_names[@]} -gt 0 ]; then
    phase_table
    echo "==> failed (exit $status) in the phase: ${phase_names[-1]}"
  fi
}
trap finish EXIT

need_packages=()
command -v redis-server >/dev/null 2>&1 || need_packages+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || need_packages+=(redis-tools)
command -v sqlite3 >/dev/null 2>&1 || need_packages+=(sqlite3)
command -v cc >/dev/null 2>&1 || need_packages+=(gcc)
command -v openssl >/dev/null 2>&1 || need_packages+=(openssl)
if [ ${#need_packages[@]} -gt 0 ]; then
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
    phase "installing ${need_packages[*]}"
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

phase "cargo fmt --check"
cargo fmt --all -- --check
phase "cargo clippy"
cargo clippy --all-targets --locked -- -D warnings
mkdir -p target
# What the operator's client asks the API server for, recorded by the test API server in every run below, for
# the chart check's RBAC comparison (scripts/rbac_check.py).
export REDLOCK_RBAC_RECORD_DIR="$PWD/target/rbac-requests"
rm -rf "$REDLOCK_RBAC_RECORD_DIR"
log=target/test-output.log
# The binary as a release ships it, linked static (crt-static) from the tests' own build: only the final link is
# redone (with the negative-controls feature the tests' build has, so that nothing else is rebuilt), naming this
# commit, and copied at once (the `cargo test` below links it dynamically again). The chroot test
# (tests/lock_cli/static_binary.rs) runs it in a root holding nothing else, and the real-node phase ships it. A
# release build would cost 7-17 minutes on two cores; REDLOCK_E2E_OPERATOR_BINARY names another static binary
# (scripts/release.sh's own build, say).
phase "the test build's binary, linked static"
static_binary=${REDLOCK_E2E_OPERATOR_BINARY:-}
if [ -z "$static_binary" ]; then
  REDLOCK_COMMIT=$(git rev-parse HEAD 2>/dev/null || true) \
    cargo rustc --locked --bin redlock-operator --features negative-controls -- -C target-feature=+crt-static
  static_binary=target/redlock-operator-static
  cp "${CARGO_TARGET_DIR:-target}/debug/redlock-operator" "$static_binary"
fi
REDLOCK_STATIC_BINARY=$(realpath "$static_binary")
export REDLOCK_STATIC_BINARY
# The tests run under cargo-nextest where it is installed (the project's machines come with it): a process per
# test, and the tests of every binary side by side instead of one binary after another. Most tests wait on timers,
# masters and API servers, so the plain phase takes half the time on two cores (11 minutes against about 24,
# measured in one session on a machine busy with builds). Without it, cargo test runs them as before.
# run_tests THREADS ARGS...: the tests ARGS selects, THREADS at a time (cargo test: two per binary).
# Against a real cluster the end-to-end tests run side by side too: each test's operators look only at its own
# namespaces and at the RedisQuorums labelled as its own (tests/e2e/mod.rs, Env::default_scope). The tests that
# change what the whole cluster shares (the CRDs' rules, the fenced-objects policy, a second installation from the
# README's path that looks at everything) run first, alone, one at a time (`cluster_wide`, a nextest filter).
# A test's name starts with the module (the former test file) it is in: `tenancy::...` in the binary `operator`.
cluster_wide='test(/^(cel_cases|fenced_objects|readme_local_path|tenancy)::/) | test(=operator_faults::bad_lock_specs_are_reported_as_conditions)'
# The end-to-end suites, run again below against other kinds of API: these modules of the binaries `operator` and
# `docs` (readme_local_path).
e2e_tests=(--test operator --test docs)
e2e_filter='test(/^(operator|operator_faults|leader|jobs|tenancy|fencing_tokens|cel_cases|readme_local_path|fenced_objects)::/)'
if cargo nextest --version >/dev/null 2>&1; then
  run_tests() {
    local threads=$1
    shift
    cargo nextest run --locked --no-fail-fast --test-threads "$threads" "$@"
  }
  # The end-to-end tests (e2e_tests, e2e_filter), against the cluster of REDLOCK_E2E_KUBECONFIG.
  e2e_run() { # THREADS
    run_tests "$1" "${e2e_tests[@]}" -E "$e2e_filter"
  }
  real_cluster_tests() {
    local status=0
    run_tests 1 "${e2e_tests[@]}" -E "($e2e_filter) & ($cluster_wide)" || status=$?
    run_tests 4 "${e2e_tests[@]}" -E "($e2e_filter) & not ($cluster_wide)" || status=$?
    return "$status"
  }
else
  echo "cargo-nextest is not installed: the tests run under cargo test, one binary at a time (slower)"
  run_tests() {
    shift
    cargo test --locked --no-fail-fast "$@"
  }
  # cargo test takes no filter expression: the end-to-end runs take the whole binaries (the product checker's and
  # the docs' tests too). One binary at a time, and inside each the tests take turns (tests/e2e/mod.rs,
  # REAL_CLUSTER_TURN).
  e2e_run() {
    run_tests "$1" "${e2e_tests[@]}"
  }
  real_cluster_tests() {
    run_tests 1 "${e2e_tests[@]}"
  }
fi
# Built first in a phase of its own, so that the table tells building from testing (what a warm rerun skips).
phase "building the tests"
cargo test --locked --no-run
# Six at a time: four kept the two cores 0.8 busy on average (the phase table), and six took 5.5 minutes, not 8.
phase "the tests"
run_tests 6 2>&1 | tee "$log"
# The end-to-end tests once more against the test API server in its realistic mode: jittered latency on every
# request and watch event, late initial lists of Jobs and pods, watches that end or expire (410) and relist.
# A failing test prints its seed; REDLOCK_E2E_SEED repeats the random choices. Six at a time: those delays are
# waits, not work (four kept the cores 0.7 busy). On the real node it runs beside the in-cluster suite (below).
realistic_tests() { # PHASE-NAME
  phase "$1"
  REDLOCK_E2E_REALISTIC=1 e2e_run 6 2>&1 | tee -a "$log"
}
# The Helm chart: lint, render and validate (installs helm and a Python venv under target/tools when missing).
chart_check() { # PHASE-NAME
  phase "$1"
  ./scripts/chart-check.sh
}
# The end-to-end tests once more in their real-cluster mode (REDLOCK_E2E_KUBECONFIG), then the in-cluster suite
# (the chart installed with the operator's image, `helm test`, the tutorials with real pods, failure drills), on
# the first of: the cluster REDLOCK_E2E_KUBECONFIG names (a user's, kind for example: load the images first, see
# docs/contributing/testing.md); a real single-node Kubernetes started here from ../shared/k8s-node
# (REDLOCK_K8S_NODE_KIT), when it is beside the checkout and this runs as root; otherwise a stand-in cluster.
node_kit=${REDLOCK_K8S_NODE_KIT:-$PWD/../shared/k8s-node}
# Issue 40's proof on a real API server: the product checker's fenced mode, a holder paused past its validity
# refused by the chart's fenced-objects policy, and its negative control without the policy.
fenced_proof() { # KUBECONFIG
  phase "the paused holder against a real API server's fenced-objects policy"
  REDLOCK_E2E_KUBECONFIG="$1" run_tests 1 --test operator paused 2>&1 | tee -a "$log"
}
in_cluster_suite() { # KUBECONFIG
  REDLOCK_E2E_KUBECONFIG="$1" REDLOCK_E2E_CHART="${in_cluster_chart:-${REDLOCK_E2E_CHART:-}}" \
    cargo test --locked --test in_cluster -- --ignored --test-threads=1 2>&1
}
# The in-cluster suite spends most of its 8 minutes waiting on real pods (0.4 of the two cores busy): what needs no
# cluster (the realistic-mode tests and the chart check, 4.6 minutes at 0.8 and 1.1 cores) runs beside it, not
# after it. Its output goes to a file of its own, shown once it ends, so that the two runs' lines do not mix.
in_cluster_pid=""
in_cluster_log=target/in-cluster.log
# kill_tree PID: the background suite with cargo and the test binary under it (the script has no job control).
kill_tree() {
  local child
  for child in $(pgrep -P "$1" 2>/dev/null); do kill_tree "$child"; done
  kill "$1" 2>/dev/null || true
}
in_cluster_beside_the_rest() { # KUBECONFIG
  phase "the in-cluster suite starts in the background (its output: $in_cluster_log, shown when it ends)"
  in_cluster_suite "$1" >"$in_cluster_log" &
  in_cluster_pid=$!
  local realistic=0 chart=0 suite=0
  realistic_tests "end-to-end tests against the realistic test API server (beside the in-cluster suite)" ||
    realistic=$?
  chart_check "chart check (beside the in-cluster suite)" || chart=$?
  phase "the in-cluster suite, to its end"
  wait "$in_cluster_pid" || suite=$?
  in_cluster_pid=""
  tee -a "$log" <"$in_cluster_log"
  [ "$realistic" -eq 0 ] || echo "==> the end-to-end tests against the realistic test API server failed" >&2
  [ "$chart" -eq 0 ] || echo "==> the chart check failed" >&2
  [ "$suite" -eq 0 ] || echo "==> the in-cluster suite failed (exit $suite)" >&2
  [ "$realistic" -eq 0 ] && [ "$chart" -eq 0 ] && [ "$suite" -eq 0 ]
}
if [ -n "${REDLOCK_E2E_KUBECONFIG:-}" ]; then
  realistic_tests "end-to-end tests against the realistic test API server"
  phase "end-to-end tests against the cluster of REDLOCK_E2E_KUBECONFIG"
  real_cluster_tests 2>&1 | tee -a "$log"
  fenced_proof "$REDLOCK_E2E_KUBECONFIG"
  if [ "${REDLOCK_E2E_IN_CLUSTER:-1}" != 0 ]; then
    phase "the in-cluster suite"
    in_cluster_suite "$REDLOCK_E2E_KUBECONFIG" | tee -a "$log"
  fi
  chart_check "chart check"
elif [ -x "$node_kit/start.sh" ] && [ "$(id -u)" -eq 0 ]; then
  node_dir=${REDLOCK_K8S_NODE_DIR:-$PWD/target/k8s-node}
  phase "a real single-node Kubernetes in $node_dir (from $node_kit)"
  # Stopped however this script ends: stop.sh undoes every change start.sh made to the host.
  stop_node() { "$node_kit/stop.sh" "$node_dir" >target/k8s-node-stop.log 2>&1 || true; }
  cleanup=stop_node
  kubeconfig=$("$node_kit/start.sh" "$node_dir" 2>target/k8s-node-start.log | tail -n1)
  # What a user installs, as scripts/release.sh makes it (the binary's tarball, the image archive, the chart's
  # .tgz), around the static binary linked above.
  phase "the release artifacts (scripts/release.sh) of the test build linked static, loaded into the node"
  operator_binary=$static_binary
  dist=$(scripts/release.sh --snapshot --binary "$operator_binary" --out target/dist)
  "$node_kit/load-image.sh" "$node_dir" "$(grep '\.image\.tar$' <<<"$dist")"
  # The in-cluster suite installs that .tgz with its defaults: the image loaded from the archive.
  in_cluster_chart=$(grep '\.tgz$' <<<"$dist")
  # The masters', the Job tests' and the tutorials' images (not shipped: the kit's mk-image.sh builds them).
  K8S_NODE_KIT=$node_kit scripts/build-images.sh target/images --only redis --only busybox \
    --binary "$operator_binary" --load "$node_dir" >/dev/null
  phase "end-to-end tests against the real node"
  REDLOCK_E2E_KUBECONFIG="$kubeconfig" real_cluster_tests 2>&1 | tee -a "$log"
  fenced_proof "$kubeconfig"
  in_cluster_beside_the_rest "$kubeconfig"
  "$node_kit/stop.sh" "$node_dir" >target/k8s-node-stop.log 2>&1
  cleanup=""
else
  realistic_tests "end-to-end tests against the realistic test API server"
  phase "end-to-end tests in real-cluster mode, against a stand-in cluster (no ../shared/k8s-node here, or not root)"
  cargo build --locked --example stand-in-cluster
  kubeconfig="$PWD/target/stand-in-cluster.kubeconfig"
  rm -f "$kubeconfig"
  "${CARGO_TARGET_DIR:-target}/debug/examples/stand-in-cluster" "$kubeconfig" 2>target/stand-in-cluster.log &
  stand_in=$!
  stop_stand_in() { kill "$stand_in" 2>/dev/null || true; }
  cleanup=stop_stand_in
  for _ in $(seq 100); do [ -f "$kubeconfig" ] && break; sleep 0.1; done
  if [ ! -f "$kubeconfig" ]; then
    echo "the stand-in cluster did not start:" >&2
    cat target/stand-in-cluster.log >&2
    exit 1
  fi
  REDLOCK_E2E_KUBECONFIG="$kubeconfig" real_cluster_tests 2>&1 | tee -a "$log"
  kill "$stand_in"
  cleanup=""
  chart_check "chart check"
fi
phase_table
# One closing line over every run: cargo test's lines per binary (`test result: ok. N passed; N failed; ...`, at
# the start of a line: nextest indents the ones in a failed test's output) and nextest's summaries
# (`Summary [ 672.359s] 521 tests run: 518 passed (8 slow), 3 failed, 2 skipped`).
awk '/^test result:|^ *Summary \[/ { for (i = 2; i <= NF; i++) { if ($(i) ~ /^passed/) p += $(i-1); if ($(i) ~ /^failed/) f += $(i-1) } }
     END { printf "tests: %d passed, %d failed\n", p, f }' "$log"
