//! The in-cluster suite: the product installed the way a user installs it, driven with real pods.
//!
//! Against the cluster of `REDLOCK_E2E_KUBECONFIG` (a kind cluster, a development cluster, the project's
//! single-node cluster), with the images of `REDLOCK_E2E_OPERATOR_IMAGE` (default `localhost/redlock-operator:e2e`),
//! and `REDLOCK_E2E_REDIS_IMAGE` (default: the chart's own, `redis:7.4`, a name `scripts/build-images.sh` gives the
//! kit's image too), built as tars to load into the cluster, and the examples' own `busybox:1.36` (the same
//! script's `busybox`). One test, in phases that share one installation:
//!
//! 1. `helm install` as the README and docs/how-to/install.md say (a fresh namespace; the chart's defaults but
//!    for a 30 s `maxTtl` that shortens the drills' quarantines), the quorum Available, the operator Ready, `helm
//!    test`.
//!    Then holders injected by the chart's admission policies (`injected`, first: its drill stops the operator):
//!    examples/leader-election.yaml as written (busybox, no redlock binary) and examples/job-fencing.yaml, in
//!    a namespace of their own, the leader's path to the reports port cut and healed (`cut_off`); a labelled pod without `command` refused; a Job's lock lost (the operator
//!    stopped, three masters deleted) and its guard's exit 76 ignored. `REDLOCK_E2E_ONLY=injected` runs the
//!    installation and this phase alone.
//! 2. The tutorials' examples applied as written, with the application (image and program) replaced by the app
//!    image and a shell command: the README's first lock, a leader for a Deployment (`elect`), a Job queue (the
//!    guard) and a Job semaphore of three permits; a cooperating leader's hand-over measured.
//! 3. Failure drills: the active operator pod force-deleted; one, two, then three masters deleted (an empty master
//!    sits out its quarantine); `helm upgrade` while locks are held; a second release beside the first, its Job
//!    queue run while a Job of the first's runs (`second_release`).
//! 4. Uninstalling as docs/how-to/install.md#uninstall says: the locks deleted while the operator runs (each holder
//!    fenced), `helm uninstall` (it leaves what the page lists, nothing more), the rest removed, the namespaces gone.
//! 5. The release's static manifest applied as its header says, without Helm: the operator Ready, the quorum
//!    Available, the README's first lock held; then removed with `kubectl delete -f`.
//!
//! Throughout, watches check what the docs promise: never two leaders, never more Jobs running than permits,
//! tokens rising per lock and permit, fences before the validity shown. A failed check does not stop the phases
//! after it; the test fails at the end with the list. On a cluster shared with other operators, the locks carry
//! the release's `redlock.io/installation` annotation from the start; the chart is installed as it is, and a
//! second release beside it (`second_release`) runs its own Jobs while the first's run.
//! Run it with `cargo test --test in_cluster -- --ignored --test-threads=1` (docs/contributing/testing.md).

// The shared polling helper (the in-cluster suite includes nothing else of tests/support); its blocking form is
// for the tests' plain threads.
#[path = "support/poll.rs"]
#[expect(
    dead_code,
    reason = "until_blocking: every wait of the in-cluster suite is async"
)]
mod poll;

mod in_cluster {
    pub mod api_versions;
    pub mod cluster;
    pub mod cut_off;
    pub mod drills;
    pub mod holder_phases;
    pub mod injected;
    pub mod install;
    pub mod manifests;
    pub mod masters_restart;
    pub mod observe;
    pub mod report;
    pub mod second_release;
    pub mod static_manifest;
    pub mod tutorials;
    pub mod uninstall;
}

use in_cluster::cluster::Cluster;
use in_cluster::observe::Observer;
use in_cluster::report::Report;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a cluster and the images: see docs/contributing/testing.md"]
async fn helm_install_tutorials_failure_drills_and_uninstall() {
    let report = Report::new();
    let cluster = Cluster::from_env().await;
    report.step(&format!(
        "in-cluster suite: release {} in {}, tutorials in {}; images {}, {}",
        in_cluster::cluster::RELEASE,
        cluster.release_ns,
        cluster.app_ns,
        cluster.operator_image.reference,
        cluster
            .redis_image
            .as_ref()
            .map_or("the chart's default masters' image", |image| image
                .reference
                .as_str()),
    ));
    cluster.remove_leftovers().await;
    let mut cleanup = cluster.cleanup_guard();
    // `REDLOCK_E2E_ONLY=injected`: install, the injected holders' phase, and the cleanup (no uninstall phase).
    let only_injected = std::env::var("REDLOCK_E2E_ONLY").is_ok_and(|only| only == "injected");

    // Created before the install as a user would create it after: the chart's default binds the holder
    // ClusterRole cluster-wide, so nothing is added to the namespace by hand.
    let created = cluster
        .kubectl(&["create", "namespace", &cluster.holders_ns])
        .await;
    report.check(
        "the injected holders' namespace is created",
        created.ok,
        created.text(),
    );
    let installed = in_cluster::install::install(&cluster, &report).await;
    if installed && only_injected {
        in_cluster::injected::run(&cluster, &report).await;
    } else if installed {
        // First: its drill stops the operator, which no other phase's lock must live through.
        in_cluster::injected::run(&cluster, &report).await;
        let observer = Observer::start(&cluster.client, &cluster.app_ns);
        let held = in_cluster::tutorials::run(&cluster, &report, &observer).await;
        in_cluster::drills::run(&cluster, &report, &observer, &held).await;
        in_cluster::second_release::run(&cluster, &report).await;
        in_cluster::observe::summarize(&report, &observer);
        in_cluster::uninstall::run(&cluster, &report, &observer).await;
        // The release binds the holder ClusterRole there (a `helm upgrade` needs it until the uninstall).
        cluster.remove_namespace_now(&cluster.holders_ns).await;
        in_cluster::static_manifest::run(&cluster, &report).await;
        cleanup.done = true;
    }
    let failed = report.summary();
    assert!(
        installed && failed.is_empty(),
        "{} checks failed:\n{}",
        failed.len(),
        failed.join("\n")
    );
}
