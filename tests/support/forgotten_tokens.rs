//! The masters as the engine checker's fair mode once found them: two know the last token given and refuse the
//! next acquisition (for another holder, or for the fair queue), two missed the last grants, and one restarted
//! empty. Those three are a majority; tokens keep rising only if the refusals say what their counters are.

use redlock_operator::redlock::{Lease, counter_key, queue_keys};

use super::redis_server::raw_command;

/// The last token given, which masters 0 and 1 know.
pub const LAST_TOKEN: i64 = 78;

/// Why masters 0 and 1 refuse.
#[derive(Clone, Copy, Debug)]
pub enum Refusal {
    /// Another value holds every lock key.
    Held,
    /// Waiters far ahead in `queue_of`'s fair queue, one per lock key, kept until long after any test.
    Queued,
}

/// Sets five masters (`urls`) up for `locks` (the keys an acquisition may take: one key, or a semaphore's
/// permit keys), whose fair queue is `queue_of`'s: masters 0 and 1 know [`LAST_TOKEN`] and refuse as
/// `refusal` says, masters 2 and 3 are at 73, master 4 knows nothing.
pub async fn masters_that_forgot_the_last_token(
    urls: &[String],
    locks: &[String],
    queue_of: &str,
    refusal: Refusal,
) {
    let last = LAST_TOKEN.to_string();
    for url in &urls[..2] {
        for lock in locks {
            raw_command(url, &["SET", &counter_key(lock), &last]).await;
            if let Refusal::Held = refusal {
                raw_command(url, &["SET", lock, "another holder"]).await;
            }
        }
        if let Refusal::Queued = refusal {
            let (queue, deadlines) = queue_keys(queue_of);
            for ahead in 0..locks.len() {
                let waiter = format!("waiter-ahead-{ahead}");
                raw_command(url, &["ZADD", &queue, "1", &waiter]).await;
                raw_command(url, &["ZADD", &deadlines, "99999999999999", &waiter]).await;
            }
        }
    }
    for url in &urls[2..4] {
        for lock in locks {
            raw_command(url, &["SET", &counter_key(lock), "73"]).await;
        }
    }
}

/// The lease a majority granted on those masters has a token above [`LAST_TOKEN`].
pub fn assert_above_the_last_token(lease: &Lease, refusal: Refusal) {
    assert!(
        lease.fencing_token() > LAST_TOKEN,
        "refused as {refusal:?}: token {} although two masters had given {LAST_TOKEN}: {}",
        lease.fencing_token(),
        lease.report()
    );
}
