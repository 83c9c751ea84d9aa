//! Master health → `RedisQuorum` status and the Events worth telling: pure, so it is tested with a fake
//! clock.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use std::time::Duration;

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use tokio::time::Instant;

use crate::api::conditions::{self, Stamp, Update};
use crate::api::quorum::{MasterStatus, RedisQuorumStatus};
use crate::controller::engines::problem::QuorumProblem;
use crate::redlock::{NodeHealth, NodeStatus};

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum QuorumEvent {
    Quarantined { endpoint: String, seconds: u64 },
    Down { endpoint: String, error: String },
    Recovered { endpoint: String },
}

/// The status for a quorum whose engine runs, and what changed since `previous`.
pub fn healthy_status(
    previous: &RedisQuorumStatus,
    nodes: &[NodeStatus],
    required: usize,
    now: Instant,
    stamp: Stamp,
) -> (RedisQuorumStatus, Vec<QuorumEvent>) {
    let wall_now = stamp.now;
    let mut events = Vec::new();
    let masters: Vec<MasterStatus> = nodes
        .iter()
        .map(|node| {
            let state = match node.health {
                NodeHealth::Up => "Up",
                NodeHealth::Quarantined => "Quarantined",
                NodeHealth::Down => "Down",
            };
            let before = previous
                .masters
                .iter()
                .find(|master| master.endpoint == node.endpoint)
                .map(|master| master.state.as_str());
            let quarantined_until = node
                .quarantined_until
                .map(|until| Time(wall_after(wall_now, until.saturating_duration_since(now))));
            if before != Some(state) {
                match node.health {
                    NodeHealth::Quarantined => events.push(QuorumEvent::Quarantined {
                        endpoint: node.endpoint.clone(),
                        seconds: node
                            .quarantined_until
                            .map_or(0, |until| until.saturating_duration_since(now).as_secs()),
                    }),
                    NodeHealth::Down => events.push(QuorumEvent::Down {
                        endpoint: node.endpoint.clone(),
                        error: node.last_error.clone().unwrap_or_else(|| "not connected".into()),
                    }),
                    NodeHealth::Up if before.is_some() => events.push(QuorumEvent::Recovered {
                        endpoint: node.endpoint.clone(),
                    }),
                    NodeHealth::Up => {}
                }
            }
            MasterStatus {
                endpoint: node.endpoint.clone(),
                state: state.to_owned(),
                quarantined_until,
                run_id: node.run_id.clone(),
                last_error: (node.health != NodeHealth::Up)
                    .then(|| node.last_error.clone())
                    .flatten(),
                // Rounded so that status does not change on every check for noise alone.
                latency_ms: node
                    .latency
                    .map(|latency| (latency.as_secs_f64() * 10_000.0).round() / 10.0),
            }
        })
        .collect();
    let eligible = nodes.iter().filter(|node| node.health == NodeHealth::Up).count();
    let mut status = RedisQuorumStatus {
        eligible: i32::try_from(eligible).ok(),
        required: i32::try_from(required).ok(),
        masters,
        observed_generation: stamp.generation,
        conditions: previous.conditions.clone(),
    };
    let not_voting = describe_not_voting(nodes);
    let total = nodes.len();
    let availability = if eligible >= required {
        available(format!(
            "{eligible} of {total} masters can vote; {required} are needed"
        ))
    } else {
        unavailable(
            "TooFewMasters",
            format!("only {eligible} of {total} masters can vote, {required} are needed: {not_voting}"),
        )
    };
    conditions::set(&mut status.conditions, availability, stamp);
    let degradation = if eligible < total {
        degraded("MastersNotVoting", not_voting)
    } else {
        not_degraded()
    };
    conditions::set(&mut status.conditions, degradation, stamp);
    (status, events)
}

/// The status for a quorum that cannot be used at all (bad spec, missing Secret).
pub fn unusable_status(
    previous: &RedisQuorumStatus,
    problem: &QuorumProblem,
    stamp: Stamp,
) -> RedisQuorumStatus {
    let mut status = RedisQuorumStatus {
        eligible: Some(0),
        required: previous.required,
        masters: Vec::new(),
        observed_generation: stamp.generation,
        conditions: previous.conditions.clone(),
    };
    let message = problem.to_string();
    conditions::set(
        &mut status.conditions,
        unavailable(problem.reason(), message.clone()),
        stamp,
    );
    conditions::set(&mut status.conditions, degraded(problem.reason(), message), stamp);
    status
}

/// Whether the quorum's Secrets are outside this installation's Secrets namespace while its status, for its
/// current spec, shows another verdict than that: another installation (the release whose namespace holds the
/// Secrets) reads them and writes the status (available, or not for its masters: either way not this one's
/// problem). Writing `SecretNamespaceNotAllowed` over it made the status flap between the two installations'
/// verdicts; the lock controller leaves such a quorum's locks to that installation too (`claim::claim_step`). A
/// quorum nobody else has a verdict on (a lone installation, a fresh quorum, a changed spec) still shows the
/// problem. Pure.
pub fn kept_by_another_installation(
    previous: &RedisQuorumStatus,
    problem: &QuorumProblem,
    generation: Option<i64>,
) -> bool {
    matches!(problem, QuorumProblem::SecretNamespaceNotAllowed { .. })
        && previous.observed_generation == generation
        && previous
            .conditions
            .iter()
            .any(|condition| condition.type_ == "Available" && condition.reason != problem.reason())
}

/// `wall_now` plus `left`, clamped to the latest time a timestamp can show: a quarantine is bounded by the
/// quorum's maxTtl, but status must not be where an unbounded one (a quorum admitted before the bound) panics.
fn wall_after(wall_now: Timestamp, left: Duration) -> Timestamp {
    SignedDuration::try_from(left)
        .ok()
        .and_then(|left| wall_now.checked_add(left).ok())
        .unwrap_or(Timestamp::MAX)
}

/// `Available=True`: enough masters can vote.
fn available(message: String) -> Update {
    Update::new("Available", true, "QuorumReachable", message)
}

/// `Available=False`: locks on the quorum cannot be acquired or extended.
fn unavailable(reason: &'static str, message: String) -> Update {
    Update::new("Available", false, reason, message)
}

/// `Degraded=True`: some masters cannot vote; one more failure may make the quorum unavailable.
fn degraded(reason: &'static str, message: String) -> Update {
    Update::new("Degraded", true, reason, message)
}

fn not_degraded() -> Update {
    Update::new(
        "Degraded",
        false,
        "AllMastersVoting",
        "every master is up and voting",
    )
}

fn describe_not_voting(nodes: &[NodeStatus]) -> String {
    nodes
        .iter()
        .filter(|node| node.health != NodeHealth::Up)
        .map(|node| match node.health {
            NodeHealth::Quarantined => format!("{} quarantined (restarted recently)", node.endpoint),
            _ => format!(
                "{} down ({})",
                node.endpoint,
                node.last_error.as_deref().unwrap_or("not connected")
            ),
        })
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quorum_another_installation_keeps_available_is_left_to_it() {
        let elsewhere = QuorumProblem::SecretNamespaceNotAllowed {
            field: "spec.auth.secretNamespace",
            requested: "team2".into(),
            allowed: "redlock".into(),
        };
        let stamp = Stamp {
            generation: Some(3),
            now: Timestamp::from_second(1_000_000).unwrap(),
        };
        let nodes = [node("redis://a", NodeHealth::Up)];
        let (available, _) = healthy_status(&RedisQuorumStatus::default(), &nodes, 1, Instant::now(), stamp);
        assert!(kept_by_another_installation(&available, &elsewhere, Some(3)));
        // The other installation's verdict that the masters are down is its own too.
        let down = [node("redis://a", NodeHealth::Down)];
        let (unavailable, _) = healthy_status(&available, &down, 1, Instant::now(), stamp);
        assert!(!conditions::is_true(&unavailable.conditions, "Available"));
        assert!(kept_by_another_installation(&unavailable, &elsewhere, Some(3)));
        // A spec changed since (the other installation has not looked at it yet), a quorum never looked at, one
        // shown with this very problem, another problem: this installation says what it sees.
        assert!(!kept_by_another_installation(&available, &elsewhere, Some(4)));
        assert!(!kept_by_another_installation(
            &RedisQuorumStatus::default(),
            &elsewhere,
            Some(3)
        ));
        let refused = unusable_status(&available, &elsewhere, stamp);
        assert!(!kept_by_another_installation(&refused, &elsewhere, Some(3)));
        let missing = QuorumProblem::SecretNotFound {
            namespace: "redlock".into(),
            name: "s".into(),
        };
        assert!(!kept_by_another_installation(&available, &missing, Some(3)));
    }

    fn node(endpoint: &str, health: NodeHealth) -> NodeStatus {
        NodeStatus {
            endpoint: endpoint.into(),
            health,
            run_id: Some("r".into()),
            quarantined_until: None,
            last_error: (health == NodeHealth::Down).then(|| "connection refused".into()),
            latency: Some(Duration::from_micros(123)),
            restarts_seen: 0,
        }
    }

    #[test]
    fn availability_follows_the_voting_masters_and_events_follow_transitions() {
        let now = Instant::now();
        let wall = Timestamp::from_second(1_000_000).unwrap();
        let stamp = |now| Stamp {
            generation: Some(1),
            now,
        };
        let mut nodes = vec![
            node("redis://a", NodeHealth::Up),
            node("redis://b", NodeHealth::Up),
            node("redis://c", NodeHealth::Up),
        ];
        let (status, events) = healthy_status(&RedisQuorumStatus::default(), &nodes, 2, now, stamp(wall));
        assert!(events.is_empty(), "first sight of healthy masters is no news");
        assert!(conditions::is_true(&status.conditions, "Available"));
        assert!(!conditions::is_true(&status.conditions, "Degraded"));
        assert_eq!(status.masters[0].latency_ms, Some(0.1));

        nodes[0].health = NodeHealth::Quarantined;
        nodes[0].quarantined_until = Some(now + Duration::from_secs(60));
        nodes[1].health = NodeHealth::Down;
        nodes[1].last_error = Some("connection refused".into());
        let later = Timestamp::from_second(1_000_010).unwrap();
        let (next, events) = healthy_status(&status, &nodes, 2, now, stamp(later));
        assert_eq!(events.len(), 2);
        assert!(matches!(&events[0], QuorumEvent::Quarantined { seconds: 60, .. }));
        let available = next.conditions.iter().find(|c| c.type_ == "Available").unwrap();
        assert_eq!(available.status, "False");
        assert_eq!(available.last_transition_time, Time(later));
        assert!(
            available.message.contains("redis://a quarantined"),
            "{}",
            available.message
        );
        assert!(available.message.contains("redis://b down (connection refused)"));
        assert_eq!(
            next.masters[0].quarantined_until,
            Some(Time(later + SignedDuration::from_secs(60)))
        );

        let (_, events) = healthy_status(
            &next,
            &[
                node("redis://a", NodeHealth::Up),
                node("redis://b", NodeHealth::Up),
                node("redis://c", NodeHealth::Up),
            ],
            2,
            now,
            stamp(later),
        );
        assert_eq!(events.len(), 2, "{events:?}");
        assert!(
            events
                .iter()
                .all(|event| matches!(event, QuorumEvent::Recovered { .. }))
        );
    }

    #[test]
    fn a_quarantine_beyond_the_calendar_is_shown_as_the_latest_time() {
        let now = Instant::now();
        let mut quarantined = node("redis://a", NodeHealth::Quarantined);
        quarantined.quarantined_until = Some(now + Duration::from_secs(100_000_000 * 3600));
        let stamp = Stamp {
            generation: Some(1),
            now: Timestamp::from_second(1_000).unwrap(),
        };
        let (status, _) = healthy_status(&RedisQuorumStatus::default(), &[quarantined], 1, now, stamp);
        assert_eq!(status.masters[0].quarantined_until, Some(Time(Timestamp::MAX)));
        assert_eq!(wall_after(Timestamp::MAX, Duration::MAX), Timestamp::MAX);
    }

    #[test]
    fn unusable_keeps_the_transition_time_while_nothing_changes() {
        let t0 = Timestamp::from_second(1_000).unwrap();
        let t1 = Timestamp::from_second(2_000).unwrap();
        let problem = QuorumProblem::InvalidSpec("x".into());
        let stamp = |now| Stamp {
            generation: Some(1),
            now,
        };
        let first = unusable_status(&RedisQuorumStatus::default(), &problem, stamp(t0));
        let second = unusable_status(&first, &problem, stamp(t1));
        assert_eq!(second.conditions[0].last_transition_time, Time(t0));
    }
}
