//! The Event recorders alone, against the same test API server: kube-runtime's `Recorder` and the operator's
//! own (`telemetry::events`), each fresh, publishing `OPERATOR_BENCH_EVENTS` Events about distinct objects
//! (the baseline), then `OPERATOR_BENCH_LOCKS` (a burst of acquisitions), then as many as first, 32 at a
//! time; three rounds, alternating, summed. The publishing runs on a thread of its own (a current-thread
//! runtime), so its CPU time (from /proc/thread-self/schedstat, in nanoseconds) is the recorder's and its
//! HTTP client's, not the API server's.

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Reporter};
use tokio::time::Instant;

use super::BoxError;
use super::support::apiserver::TestApiServer;

/// Publishing `events` Events took `seconds` and `cpu_seconds` of the publishing thread.
#[derive(Default)]
pub struct Publishing {
    pub events: u64,
    pub seconds: f64,
    pub cpu_seconds: f64,
}

impl Publishing {
    pub fn per_second(&self) -> f64 {
        self.events as f64 / self.seconds.max(1e-9)
    }

    pub fn cpu_per_thousand(&self) -> f64 {
        self.cpu_seconds * 1000.0 / (self.events.max(1) as f64)
    }

    fn add(&mut self, other: Publishing) {
        self.events += other.events;
        self.seconds += other.seconds;
        self.cpu_seconds += other.cpu_seconds;
    }
}

/// One recorder's figures: with an empty cache, during the burst, and just after it.
#[derive(Default)]
pub struct RecorderFigures {
    pub idle: Publishing,
    pub burst: Publishing,
    pub after: Publishing,
}

enum Recorder {
    Kube(kube::runtime::events::Recorder),
    Ours(redlock_operator::telemetry::events::Recorder),
}

impl Recorder {
    async fn publish(&self, event: &Event, regarding: &ObjectReference) -> Result<(), kube::Error> {
        match self {
            Recorder::Kube(recorder) => recorder.publish(event, regarding).await,
            Recorder::Ours(recorder) => recorder.publish(event, regarding).await,
        }
    }
}

const ROUNDS: usize = 3;

/// kube-runtime's figures, then the operator's recorder's; `count` Events before and after a `burst`.
pub async fn measure(
    server: &TestApiServer,
    count: usize,
    burst: usize,
) -> Result<[RecorderFigures; 2], BoxError> {
    let mut figures = [RecorderFigures::default(), RecorderFigures::default()];
    for round in 0..ROUNDS {
        for (ours, sums) in [false, true].into_iter().zip(figures.iter_mut()) {
            let url = server.url();
            let round = tokio::task::spawn_blocking(move || -> Result<RecorderFigures, BoxError> {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?;
                runtime.block_on(one_recorder(&url, ours, round, count, burst))
            })
            .await??;
            sums.idle.add(round.idle);
            sums.burst.add(round.burst);
            sums.after.add(round.after);
        }
    }
    Ok(figures)
}

async fn one_recorder(
    url: &str,
    ours: bool,
    round: usize,
    count: usize,
    burst: usize,
) -> Result<RecorderFigures, BoxError> {
    let client = kube::Client::try_from(kube::Config::new(url.parse()?))?;
    let reporter = Reporter {
        controller: "redlock-operator".into(),
        instance: Some("bench".into()),
    };
    let (recorder, namespace) = if ours {
        let recorder = redlock_operator::telemetry::events::Recorder::new(client, reporter);
        (Recorder::Ours(recorder), format!("recorder-ours-{round}"))
    } else {
        let recorder = kube::runtime::events::Recorder::new(client, reporter);
        (Recorder::Kube(recorder), format!("recorder-kube-{round}"))
    };
    let idle = publish(&recorder, &namespace, "idle", count).await?;
    let burst = publish(&recorder, &namespace, "burst", burst).await?;
    let after = publish(&recorder, &namespace, "after", count).await?;
    Ok(RecorderFigures { idle, burst, after })
}

/// Publishes an `Acquired` Event about each of `count` locks `{prefix}-N`, 32 at a time.
async fn publish(
    recorder: &Recorder,
    namespace: &str,
    prefix: &str,
    count: usize,
) -> Result<Publishing, BoxError> {
    let event = Event {
        type_: EventType::Normal,
        reason: "Acquired".into(),
        note: Some("holder-1 holds the lock with fencing token 1 (5 of 5 masters)".into()),
        action: "Acquired".into(),
        secondary: None,
    };
    let cpu_before = thread_cpu_seconds()?;
    let started = Instant::now();
    futures::stream::iter(0..count)
        .map(|index| {
            let regarding = ObjectReference {
                api_version: Some("redlock.io/v1beta1".into()),
                kind: Some("DistributedLock".into()),
                namespace: Some(namespace.into()),
                name: Some(format!("{prefix}-{index:05}")),
                uid: Some(format!("{namespace}-{prefix}-{index}")),
                ..ObjectReference::default()
            };
            let event = &event;
            async move { recorder.publish(event, &regarding).await }
        })
        .buffer_unordered(32)
        .try_collect::<Vec<()>>()
        .await?;
    let seconds = started.elapsed().as_secs_f64();
    Ok(Publishing {
        events: count as u64,
        seconds,
        cpu_seconds: thread_cpu_seconds()? - cpu_before,
    })
}

/// The calling thread's time on a CPU, in seconds (to the nanosecond: a round's Events take milliseconds).
fn thread_cpu_seconds() -> Result<f64, BoxError> {
    let schedstat = std::fs::read_to_string("/proc/thread-self/schedstat")?;
    let nanoseconds: f64 = schedstat
        .split_whitespace()
        .next()
        .ok_or("empty schedstat")?
        .parse()?;
    Ok(nanoseconds / 1e9)
}

/// The figures of one recorder, each beside its empty-cache baseline.
pub fn describe(name: &str, figures: &RecorderFigures) -> String {
    let RecorderFigures { idle, burst, after } = figures;
    format!(
        "{name}: empty cache {} at {:.0}/s, {:.3} CPU-s per 1,000; a burst of {} at {:.0}/s; just after it {:.0}/s ({:.2}x the baseline), {:.3} CPU-s per 1,000 ({:.2}x)",
        idle.events,
        idle.per_second(),
        idle.cpu_per_thousand(),
        burst.events,
        burst.per_second(),
        after.per_second(),
        after.per_second() / idle.per_second().max(1e-9),
        after.cpu_per_thousand(),
        after.cpu_per_thousand() / idle.cpu_per_thousand().max(1e-9),
    )
}
