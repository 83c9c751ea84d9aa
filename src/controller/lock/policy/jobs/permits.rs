//! Job fencing with several permits (a Job semaphore): which permit each Job belongs to, and what each permit
//! does next. Every permit goes through the one-permit rules of [`next_step`] with its own Jobs, pods, holder
//! and token; only the waiting queue is shared, handed out in queue order to the free permits, lowest first.
//! Pure, so every rule is tested without a cluster.
//!
//! The reconciler runs [`plan`] for every Jobs lock: for a plain lock, its one permit, where [`plan`] is
//! exactly [`next_step`].

use super::queue::{GrantedPod, JobStep, JobView, next_step, queue};
use crate::controller::lock::permit_count::is_closing;

/// What one permit is, as far as the Jobs are concerned.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PermitState<'a> {
    /// The Job holding the permit (per this replica's lease, or per status right after a restart).
    pub current: Option<&'a str>,
    /// The highest token known for the permit.
    pub latest_token: i64,
}

/// The permit a Job belongs to: the one its grant named. Only a Job that was granted belongs to one; a waiting
/// Job (never granted, or requeued for a new token) belongs to none and may get any.
fn permit_of(job: &JobView) -> Option<u32> {
    if job.waiting() { None } else { Some(job.permit) }
}

/// What each permit does next, in permit order. `permits[i]` is permit i's holder and token; `pods` are the
/// unfinished pods of every grant of the lock (each names its permit).
///
/// A Job keeps its permit from its grant until it finishes or is requeued: its holding, fencing, resuming and
/// the wait for its pods are that permit's alone, so one permit's loss or wait holds up no other. Waiting Jobs
/// go, in queue order, to the permits that have nothing of their own to do (no holder, no fenced Job, no pods of
/// an earlier grant), lowest permit first. A Job some permit holds is that permit's and never queued for, or
/// taken as fenced by, another, even where the cache does not show its grant yet.
///
/// Only the first `open` permits (spec.permits) take waiting Jobs. A permit above, left from a higher count,
/// lets its Job run to its end (held, extended and fenced as any other) and is then released, never handed out
/// again; a Job fenced on it is queued again for an open permit and a new token rather than resumed on it.
pub fn plan(jobs: &[JobView], pods: &[GrantedPod], permits: &[PermitState<'_>], open: usize) -> Vec<JobStep> {
    let holders: Vec<&str> = permits.iter().filter_map(|state| state.current).collect();
    let mut waiting = queue(jobs)
        .into_iter()
        .filter(|job| !holders.contains(&job.name.as_str()));
    permits
        .iter()
        .zip(0u32..)
        .map(|(state, permit)| {
            // Its holder is its own whatever the cache shows of the grant (a grant not seen yet, or an earlier
            // grant's annotations); a Job another permit holds is not, whatever its annotations say.
            let own_jobs: Vec<JobView> = jobs
                .iter()
                .filter(|job| {
                    let name = Some(job.name.as_str());
                    name == state.current
                        || (permit_of(job) == Some(permit) && !holders.contains(&job.name.as_str()))
                })
                .cloned()
                .collect();
            let own_pods: Vec<GrantedPod> = pods.iter().filter(|pod| pod.permit == permit).cloned().collect();
            let step = next_step(&own_jobs, &own_pods, state.current, state.latest_token);
            if is_closing(permit, open) {
                return match step {
                    JobStep::ResumeFenced { job, token } => JobStep::Requeue { job, token },
                    step => step,
                };
            }
            if step != JobStep::Idle {
                return step;
            }
            match waiting.next() {
                None => JobStep::Idle,
                Some(job) => {
                    let mut with_next = own_jobs;
                    with_next.push(job.clone());
                    next_step(&with_next, &own_pods, None, state.latest_token)
                }
            }
        })
        .collect()
}

/// The waiting Jobs status shows (`status.queue`), in the order they get a permit: the queue less every Job that
/// holds a permit (per this replica's leases, whatever the cache shows of its grant yet) and every Job in `granted`
/// (granted a permit since the Jobs were read, or being shown holding one). One list for the whole lock, whichever
/// permit's status write shows it: a Job that runs is never in it.
pub fn waiting_shown(jobs: &[JobView], permits: &[PermitState<'_>], granted: &[&str]) -> Vec<String> {
    queue(jobs)
        .into_iter()
        .map(|job| job.name.as_str())
        .filter(|name| !permits.iter().any(|state| state.current == Some(*name)) && !granted.contains(name))
        .map(str::to_owned)
        .collect()
}

/// The grants of `permit` whose Jobs stopped for good, with their tokens: Jobs that finished, and Jobs fenced and
/// then queued again for a new token or marked stale (both only once their pods were confirmed gone; both stay
/// suspended until granted anew, which writes the new token and clears the mark in one patch). No pod acts on such
/// a grant any more, so its value on the permit's key may be deleted wherever a late write put it back.
pub fn stopped_grants(jobs: &[JobView], permit: u32) -> Vec<(String, i64)> {
    jobs.iter()
        .filter(|job| job.permit == permit && (job.finished || job.requeued || job.stale))
        .filter_map(|job| Some((job.name.clone(), job.granted_token.or(job.fenced_token)?)))
        .collect()
}

/// Jobs that run (are not suspended) without holding any permit: created unsuspended, or left running by a
/// failed suspension. They are suspended at once. A Job holding one permit is no stray of another.
pub fn strays<'a>(jobs: &'a [JobView], permits: &[PermitState<'_>]) -> Vec<&'a JobView> {
    jobs.iter()
        .filter(|job| {
            !job.suspended
                && !job.finished
                && !permits
                    .iter()
                    .any(|state| state.current == Some(job.name.as_str()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::queue::tests::{job, pod_of};
    use super::*;

    fn waiting(name: &str, created: i64) -> JobView {
        job(name, created, 0)
    }

    /// Granted `permit` with `token` and running.
    fn running(name: &str, created: i64, permit: u32, token: i64) -> JobView {
        JobView {
            suspended: false,
            granted_token: Some(token),
            pods: 1,
            permit,
            ..waiting(name, created)
        }
    }

    fn holding(job: &'static str, latest_token: i64) -> PermitState<'static> {
        PermitState {
            current: Some(job),
            latest_token,
        }
    }

    /// Nobody holds the permit; `latest_token` was its last.
    fn after(latest_token: i64) -> PermitState<'static> {
        PermitState {
            current: None,
            latest_token,
        }
    }

    fn free(permits: usize) -> Vec<PermitState<'static>> {
        vec![PermitState::default(); permits]
    }

    fn grant(name: &str) -> JobStep {
        JobStep::Grant(name.into())
    }

    fn queue_of(count: i64) -> Vec<JobView> {
        (0..count)
            .map(|index| waiting(&format!("job-{index}"), index))
            .collect()
    }

    #[test]
    fn the_first_jobs_of_the_queue_get_the_lowest_permits() {
        let jobs = queue_of(10);
        assert_eq!(
            plan(&jobs, &[], &free(3), 3),
            [grant("job-0"), grant("job-1"), grant("job-2")]
        );
        assert_eq!(
            plan(&jobs[..2], &[], &free(3), 3),
            [grant("job-0"), grant("job-1"), JobStep::Idle]
        );
    }

    #[test]
    fn holders_keep_their_permits_and_a_freed_permit_goes_to_the_next_in_queue() {
        let mut jobs = queue_of(10);
        jobs[0] = running("job-0", 0, 0, 4);
        jobs[1] = running("job-1", 1, 1, 9);
        jobs[2] = running("job-2", 2, 2, 1);
        let mut permits = vec![holding("job-0", 4), holding("job-1", 9), holding("job-2", 1)];
        assert_eq!(
            plan(&jobs, &[], &permits, permits.len()),
            [
                JobStep::Hold("job-0".into()),
                JobStep::Hold("job-1".into()),
                JobStep::Hold("job-2".into())
            ]
        );
        // job-1 completes: its permit is released, then given to the next Job; the others hold on.
        jobs[1].finished = true;
        assert_eq!(
            plan(&jobs, &[], &permits, permits.len())[1],
            JobStep::ReleaseFinished("job-1".into())
        );
        permits[1].current = None;
        assert_eq!(
            plan(&jobs, &[], &permits, permits.len()),
            [
                JobStep::Hold("job-0".into()),
                grant("job-3"),
                JobStep::Hold("job-2".into())
            ]
        );
    }

    #[test]
    fn a_lowered_count_lets_the_jobs_above_it_finish_and_hands_their_permits_to_nobody() {
        let mut jobs = queue_of(6);
        jobs[0] = running("job-0", 0, 0, 4);
        jobs[1] = running("job-1", 1, 1, 9);
        jobs[2] = running("job-2", 2, 2, 1);
        let mut permits = vec![holding("job-0", 4), holding("job-1", 9), holding("job-2", 1)];
        assert_eq!(
            plan(&jobs, &[], &permits, 1),
            [
                JobStep::Hold("job-0".into()),
                JobStep::Hold("job-1".into()),
                JobStep::Hold("job-2".into())
            ],
            "lowered from three to one: the running Jobs are not stopped"
        );
        jobs[2].finished = true;
        assert_eq!(
            plan(&jobs, &[], &permits, 1)[2],
            JobStep::ReleaseFinished("job-2".into())
        );
        permits[2].current = None;
        assert_eq!(
            plan(&jobs, &[], &permits, 1)[2],
            JobStep::Idle,
            "released, permit 2 takes no waiting Job"
        );
        // job-1 is fenced on permit 1 (its key was lost): once its pods are gone it waits for permit 0 with a new
        // token instead of resuming on the permit being given up.
        jobs[1] = JobView {
            suspended: true,
            fenced_token: Some(9),
            pods: 0,
            ..running("job-1", 1, 1, 9)
        };
        permits[1].current = None;
        assert_eq!(
            plan(&jobs, &[], &permits, 1)[1],
            JobStep::Requeue {
                job: "job-1".into(),
                token: 9
            }
        );
        assert_eq!(
            plan(&jobs, &[], &permits, 3)[1],
            JobStep::ResumeFenced {
                job: "job-1".into(),
                token: 9
            },
            "where permit 1 is still open, it resumes there"
        );
    }

    #[test]
    fn a_held_job_is_never_queued_for_another_permit_even_before_the_cache_shows_its_grant() {
        // Permit 0 holds job-0, whose grant the Job cache does not show yet: it still looks waiting.
        let jobs = queue_of(3);
        let permits = vec![holding("job-0", 1), PermitState::default()];
        assert_eq!(
            plan(&jobs, &[], &permits, permits.len()),
            [JobStep::Hold("job-0".into()), grant("job-1")]
        );
    }

    #[test]
    fn a_job_regranted_on_another_permit_is_not_taken_as_fenced_on_its_old_one() {
        // job-0, once granted permit 0, was requeued and granted permit 1; the cache still shows the first grant.
        let mut jobs = queue_of(3);
        jobs[0] = running("job-0", 0, 0, 2);
        let permits = vec![after(2), holding("job-0", 5)];
        assert_eq!(
            plan(&jobs, &[], &permits, permits.len()),
            [grant("job-1"), JobStep::Hold("job-0".into())]
        );
    }

    #[test]
    fn a_fenced_job_holds_up_only_its_own_permit() {
        let mut jobs = queue_of(5);
        // job-0 was fenced on permit 1 and its pods still run; job-1 holds permit 0.
        jobs[0] = JobView {
            suspended: true,
            fenced_token: Some(3),
            ..running("job-0", 0, 1, 3)
        };
        jobs[1] = running("job-1", 1, 0, 7);
        let permits = vec![holding("job-1", 7), after(3), PermitState::default()];
        assert_eq!(
            plan(&jobs, &[], &permits, permits.len()),
            [
                JobStep::Hold("job-1".into()),
                JobStep::WaitForFenced("job-0".into()),
                grant("job-2")
            ]
        );
        // Its pods gone and the Job controller showing it suspended: it resumes on its own permit with its
        // own token, not on the free permit 2.
        jobs[0].pods = 0;
        let steps = plan(&jobs, &[], &permits, permits.len());
        assert_eq!(
            steps[1],
            JobStep::ResumeFenced {
                job: "job-0".into(),
                token: 3
            }
        );
        assert_eq!(steps[2], grant("job-2"));
    }

    #[test]
    fn pods_of_an_earlier_grant_hold_up_only_their_permit() {
        let jobs = queue_of(4);
        let pods = vec![pod_of("old-pod", None, 2)];
        let steps = plan(&jobs, &pods, &free(2), 2);
        assert!(
            matches!(&steps[0], JobStep::WaitForPods(pods) if pods[0].contains("old-pod")),
            "{steps:?}"
        );
        assert_eq!(steps[1], grant("job-1"), "the queue moves on at permit 1");
    }

    #[test]
    fn a_requeued_job_waits_in_the_queue_for_any_permit() {
        let mut jobs = queue_of(3);
        jobs[0] = JobView {
            requeued: true,
            fenced_token: Some(5),
            ..running("job-0", 0, 2, 5)
        };
        jobs[0].suspended = true;
        jobs[0].pods = 0;
        assert_eq!(plan(&jobs, &[], &free(2), 2), [grant("job-0"), grant("job-1")]);
    }

    #[test]
    fn one_permit_is_the_plain_queue() {
        let cases: Vec<(Vec<JobView>, Vec<GrantedPod>, PermitState<'static>)> = vec![
            (queue_of(3), Vec::new(), PermitState::default()),
            (
                vec![running("a", 0, 0, 4), waiting("b", 1)],
                Vec::new(),
                holding("a", 4),
            ),
            (vec![running("a", 0, 0, 4), waiting("b", 1)], Vec::new(), after(4)),
            (
                queue_of(2),
                vec![pod_of("p", Some("gone"), 1)],
                PermitState::default(),
            ),
        ];
        for (jobs, pods, state) in cases {
            assert_eq!(
                plan(&jobs, &pods, std::slice::from_ref(&state), 1),
                [next_step(&jobs, &pods, state.current, state.latest_token)],
                "{jobs:?}"
            );
        }
    }

    #[test]
    fn the_queue_shown_leaves_out_every_permits_holder_and_the_jobs_granted_since_they_were_read() {
        // Two permits granted in one look: job-0 and job-1, whose grants the cache does not show yet.
        let jobs = queue_of(5);
        let free = free(2);
        assert_eq!(
            waiting_shown(&jobs, &free, &["job-0"]),
            ["job-1", "job-2", "job-3", "job-4"],
            "permit 0's write, before permit 1 is granted"
        );
        assert_eq!(
            waiting_shown(&jobs, &free, &["job-0", "job-1"]),
            ["job-2", "job-3", "job-4"],
            "permit 1's write leaves out permit 0's Job too"
        );
        // A later look: the keeper holds both, the cache still shows them waiting.
        let held = vec![holding("job-0", 1), holding("job-1", 1)];
        assert_eq!(waiting_shown(&jobs, &held, &[]), ["job-2", "job-3", "job-4"]);
        // Granted and seen so by the cache: not waiting any more, whoever holds what.
        let mut granted = jobs.clone();
        granted[2] = running("job-2", 2, 0, 2);
        assert_eq!(waiting_shown(&granted, &held, &[]), ["job-3", "job-4"]);
        // A fenced Job queued again for a new token waits again, in its place.
        granted[0] = JobView {
            requeued: true,
            suspended: true,
            pods: 0,
            ..running("job-0", 0, 0, 1)
        };
        assert_eq!(
            waiting_shown(&granted, &[holding("job-1", 1), after(2)], &[]),
            ["job-0", "job-3", "job-4"]
        );
    }

    #[test]
    fn the_grants_stopped_for_good_are_those_of_finished_requeued_and_stale_jobs_on_their_permit() {
        let mut finished = running("done", 0, 0, 3);
        finished.finished = true;
        let requeued = JobView {
            requeued: true,
            suspended: true,
            pods: 0,
            ..running("again", 1, 0, 5)
        };
        let stale = JobView {
            stale: true,
            suspended: true,
            fenced_token: Some(2),
            granted_token: None,
            pods: 0,
            ..running("stale", 2, 0, 2)
        };
        let fenced = JobView {
            suspended: true,
            fenced_token: Some(6),
            ..running("fenced", 3, 0, 6)
        };
        let elsewhere = JobView {
            requeued: true,
            ..running("other-permit", 4, 1, 9)
        };
        let jobs = vec![
            finished,
            requeued,
            stale,
            fenced,
            running("holder", 5, 0, 7),
            waiting("never-granted", 6),
            elsewhere,
        ];
        assert_eq!(
            stopped_grants(&jobs, 0),
            [
                ("done".to_owned(), 3),
                ("again".to_owned(), 5),
                ("stale".to_owned(), 2)
            ],
            "a fenced Job may still be taken back with its token; a running one holds it"
        );
        assert_eq!(stopped_grants(&jobs, 1), [("other-permit".to_owned(), 9)]);
    }

    #[test]
    fn unsuspended_jobs_without_the_lock_are_strays() {
        let mut sneaky = waiting("sneaky", 1);
        sneaky.suspended = false;
        let jobs = [sneaky, running("holder", 0, 0, 1), waiting("waiting", 2)];
        let names: Vec<&str> = strays(&jobs, &[holding("holder", 1)])
            .iter()
            .map(|job| job.name.as_str())
            .collect();
        assert_eq!(names, ["sneaky"]);
    }

    #[test]
    fn a_job_holding_one_permit_is_no_stray_of_another() {
        let jobs = vec![
            running("a", 0, 0, 1),
            running("b", 1, 1, 1),
            running("c", 2, 0, 1),
        ];
        let permits = vec![holding("a", 1), holding("b", 1)];
        let names: Vec<&str> = strays(&jobs, &permits)
            .iter()
            .map(|job| job.name.as_str())
            .collect();
        assert_eq!(names, ["c"]);
    }
}
