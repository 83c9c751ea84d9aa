//! What the checker found, each as a run built to show it: they failed before the fix in `src/` and pass now.

use std::time::Duration;

use tokio::time::Instant;

use super::checker::Report;
use super::controls::{held, holding_side, overlapped};
use super::{Scenario, World};
use crate::support::fault_proxy::Direction;

fn base(seed: u64) -> Scenario {
    Scenario {
        seed,
        duration: Duration::ZERO,
        clusters: 1,
        replicas: 1,
        leader_locks: 0,
        pods_per_lock: 0,
        identity_locks: 0,
        job_locks: 0,
        outside_clients: 0,
        churn_keys: 0,
        job_seconds: 1.0..2.0,
        real_clusters: false,
        nemesis: false,
        holders_per_key: 1,
        controls: String::new(),
        progress: None,
    }
}

/// Two clusters' leader-election locks on one key; the holding cluster's lock is deleted (and created again),
/// three times. Its leader must stop before the other cluster's leader starts: the label goes before the key.
pub async fn leader_lock_deleted(seed: u64) -> Report {
    let mut world = World::start(Scenario {
        clusters: 2,
        leader_locks: 1,
        pods_per_lock: 2,
        ..base(seed)
    })
    .await;
    let from = Instant::now();
    for _ in 0..3 {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut holder = None;
        while holder.is_none() && Instant::now() < deadline {
            holder = holding_side(&world, "leader-0").await;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let Some(side) = holder else { continue };
        // Long enough for the leader to see its label.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let cluster = world.sides[side].cluster.name.clone();
        world
            .recorder
            .nemesis(format!("{cluster}/leader-0 deleted and created again"));
        let side = &mut world.sides[side];
        side.leaders[0].recreate(&side.cluster).await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        if overlapped(&world) {
            break;
        }
    }
    world.finish(from).await
}

/// An identity lock and a `lock` process outside Kubernetes on one key; the cluster is cut from a majority of
/// masters while it holds the key. The lock is lost: its holder must have stopped (at the `validUntil` it was
/// shown, minus its margin) before the outside process gets the key.
pub async fn identity_lock_lost(seed: u64) -> Report {
    let world = World::start(Scenario {
        identity_locks: 1,
        outside_clients: 1,
        ..base(seed)
    })
    .await;
    let from = Instant::now();
    for _ in 0..3 {
        held(&world, 0, "ident-0").await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        world
            .recorder
            .nemesis("east cut from masters [0, 1, 2] for 5s".into());
        for index in 0..3 {
            world.sides[0].links[index].hold(Direction::Both, true);
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
        for index in 0..3 {
            world.sides[0].links[index].hold(Direction::Both, false);
        }
        if overlapped(&world) {
            break;
        }
    }
    world.finish(from).await
}
