//! What the checker found, each as a run built to show it: they failed before the fix in `src/` and pass now.

use std::time::Duration;

use tokio::time::Instant;

use super::checker::Report;
use super::controls::{holding_side, overlapped};
use super::{Scenario, World};

fn base(seed: u64) -> Scenario {
    Scenario {
        seed,
        ..Scenario::default()
    }
}

/// Two clusters' leader-election locks on one key; the holding cluster's lock is deleted (and created again a
/// few seconds later), up to three times. Its leader must stop before the other cluster's leader starts: the
/// label goes before the key.
pub async fn leader_lock_deleted(seed: u64) -> Report {
    let world = World::start(Scenario {
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
        let side = &world.sides[side];
        world
            .recorder
            .nemesis(format!("{}/leader-0 deleted", side.cluster.name));
        side.leaders[0].delete(&side.cluster).await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        side.leaders[0].create_lock(&side.cluster).await;
        if overlapped(&world) {
            break;
        }
    }
    world.finish(from).await
}
