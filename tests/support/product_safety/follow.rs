//! Holders that learn what they hold from the API: each object (a leader pod, an identity lock) stands for one
//! holder's process, which follows it through one watch of its cluster's namespace (one stream, delivered in the
//! API server's order) and believes from the moment it sees a grant until it sees it gone or its own fence
//! time comes, whichever is first — whether or not its watch delivers anything.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::sync::Arc;

use futures::StreamExt;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::recorder::{ACT_INTERVAL, Belief, Recorder};

/// What a holder's process sees in its object: it holds `key` with `token` until `fence_at` at the latest.
pub struct Seen {
    pub key: String,
    pub holder: String,
    pub token: i64,
    pub fence_at: Instant,
    pub evidence: String,
}

/// The process of the object named `.0` is killed (its kubelet stops its containers): its belief ends now, and
/// it never believes again. `.1` is told once that is recorded.
pub type Kill = (String, oneshot::Sender<()>);

/// Follows the objects of `api` (selected by `config`) until `stop`; `view` says what each object's holder sees.
/// `kills`: the processes killed from outside (a leader pod's by the harness's kubelet), if any.
pub async fn follow<K>(
    api: Api<K>,
    config: watcher::Config,
    view: impl Fn(&K, Instant) -> Option<Seen>,
    (recorder, mut kills): (Arc<Recorder>, Option<mpsc::UnboundedReceiver<Kill>>),
    stop: CancellationToken,
) where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    let stream = watcher::watcher(api, config).default_backoff();
    let mut stream = std::pin::pin!(stream);
    let mut believing: BTreeMap<String, Belief> = BTreeMap::new();
    // The objects whose process was killed: what their object shows later is seen by nobody.
    let mut dead: std::collections::BTreeSet<String> = std::collections::BTreeSet::new();
    // The objects of a relist in progress, seen all at once when it is done.
    let mut relisted: Option<Vec<K>> = None;
    let mut next_act = Instant::now() + ACT_INTERVAL;
    loop {
        let next_fence = believing.values().map(|belief| belief.fence_at).min();
        let wake = next_fence.map_or(next_act, |fence| fence.min(next_act));
        let killed = async {
            match kills.as_mut() {
                Some(kills) => kills.recv().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = stop.cancelled() => break,
            Some((name, done)) = killed => {
                if let Some(belief) = believing.remove(&name) {
                    belief.end(&recorder, Instant::now(), "its process was killed");
                }
                dead.insert(name);
                let _ = done.send(());
            }
            () = tokio::time::sleep_until(wake) => {
                let now = Instant::now();
                let fenced: Vec<String> = believing
                    .iter()
                    .filter(|(_, belief)| belief.fence_at <= now)
                    .map(|(name, _)| name.clone())
                    .collect();
                for name in fenced {
                    if let Some(belief) = believing.remove(&name) {
                        belief.end(&recorder, now, "its fence time came");
                    }
                }
                if now >= next_act {
                    for belief in believing.values() {
                        belief.act(&recorder);
                    }
                    next_act = now + ACT_INTERVAL;
                }
            }
            event = stream.next() => {
                let now = Instant::now();
                match event {
                    Some(Ok(watcher::Event::Apply(object))) => {
                        let seen = view(&object, now).filter(|_| !dead.contains(&object.name_any()));
                        see(object.name_any(), seen, &mut believing, &recorder, now);
                    }
                    Some(Ok(watcher::Event::Delete(object))) => {
                        if let Some(belief) = believing.remove(&object.name_any()) {
                            belief.end(&recorder, now, "its object is gone");
                        }
                    }
                    Some(Ok(watcher::Event::Init)) => relisted = Some(Vec::new()),
                    Some(Ok(watcher::Event::InitApply(object))) => {
                        relisted.get_or_insert_default().push(object);
                    }
                    Some(Ok(watcher::Event::InitDone)) => {
                        let snapshot: Vec<(String, Option<Seen>)> = relisted
                            .take()
                            .unwrap_or_default()
                            .iter()
                            .map(|object| {
                                let seen = view(object, now).filter(|_| !dead.contains(&object.name_any()));
                                (object.name_any(), seen)
                            })
                            .collect();
                        see_snapshot(snapshot, &mut believing, &recorder, now);
                    }
                    Some(Err(_)) => {}
                    None => break,
                }
            }
        }
    }
    let now = Instant::now();
    for (_, belief) in std::mem::take(&mut believing) {
        belief.end(&recorder, now, "the run ended");
    }
}

/// A relist: one moment of the API server. What it no longer shows (or shows changed) ended before anything it
/// shows began, so every end is recorded before any start.
fn see_snapshot(
    snapshot: Vec<(String, Option<Seen>)>,
    believing: &mut BTreeMap<String, Belief>,
    recorder: &Recorder,
    now: Instant,
) {
    let ended: Vec<String> = believing
        .iter()
        .filter(|(name, belief)| {
            let seen = snapshot
                .iter()
                .find(|(listed, _)| listed == *name)
                .and_then(|(_, seen)| seen.as_ref());
            !continues(belief, seen, now)
        })
        .map(|(name, _)| name.clone())
        .collect();
    for name in ended {
        if let Some(belief) = believing.remove(&name) {
            belief.end(recorder, now, "a relist no longer showed its grant");
        }
    }
    for (name, seen) in snapshot {
        see(name, seen, believing, recorder, now);
    }
}

/// Whether what the holder sees now is the grant it believes in, still in time: the same permit (its resource;
/// tokens of different permits are different sequences), token and holder.
fn continues(belief: &Belief, seen: Option<&Seen>, now: Instant) -> bool {
    seen.is_some_and(|seen| {
        seen.fence_at > now
            && seen.token == belief.token
            && seen.holder == belief.holder
            && seen.key == belief.key
    })
}

/// One object as its holder sees it now: a belief starts, goes on (a later fence time), or ends.
fn see(
    name: String,
    seen: Option<Seen>,
    believing: &mut BTreeMap<String, Belief>,
    recorder: &Recorder,
    now: Instant,
) {
    match believing.remove(&name) {
        Some(mut belief) if continues(&belief, seen.as_ref(), now) => {
            if let Some(seen) = seen {
                belief.fence_at = seen.fence_at;
            }
            believing.insert(name, belief);
        }
        previous => {
            let seen = seen.filter(|seen| seen.fence_at > now);
            if let Some(belief) = previous {
                let why = if seen.is_some() {
                    "it saw another grant"
                } else {
                    "it saw its grant gone"
                };
                belief.end(recorder, now, why);
            }
            if let Some(seen) = seen {
                let belief = Belief {
                    key: seen.key,
                    holder: seen.holder,
                    token: seen.token,
                    start: now,
                    fence_at: seen.fence_at,
                    evidence: seen.evidence,
                };
                belief.act(recorder);
                believing.insert(name, belief);
            }
        }
    }
}
