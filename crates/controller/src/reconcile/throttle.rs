//! How fast the controller evicts: one [`TokenBucket`] for all evictions
//! (`controller.pods.evictionsPerMinute`), and a `Backoff` per pod whose eviction a
//! PodDisruptionBudget refused, so that pod waits on its own without holding up the others.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

/// The first wait before evicting again a pod whose eviction a PodDisruptionBudget refused;
/// doubled on each further refusal, up to [`EVICTION_BACKOFF_MAX`].
pub const EVICTION_BACKOFF: Duration = Duration::from_secs(10);
pub const EVICTION_BACKOFF_MAX: Duration = Duration::from_secs(300);

/// A token bucket: `per_minute` tokens, refilled continuously.
#[derive(Clone, Debug)]
pub struct TokenBucket {
    capacity: f64,
    tokens: f64,
    last: Option<Timestamp>,
}

impl TokenBucket {
    pub fn per_minute(per_minute: u32) -> Self {
        let capacity = f64::from(per_minute.max(1));
        Self {
            capacity,
            tokens: capacity,
            last: None,
        }
    }

    /// A bucket with no token at `now`, filling at `per_minute` from then: what a new leader
    /// starts with, so a change of leader adds no burst to the previous leader's.
    pub fn empty(per_minute: u32, now: Timestamp) -> Self {
        Self {
            tokens: 0.0,
            last: Some(now),
            ..Self::per_minute(per_minute)
        }
    }

    /// Takes a token if one is there at `now`.
    pub fn take(&mut self, now: Timestamp) -> bool {
        if let Some(last) = self.last {
            let elapsed = now.duration_since(last).as_secs_f64().max(0.0);
            self.tokens = (self.tokens + elapsed * self.capacity / 60.0).min(self.capacity);
        }
        self.last = Some(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// Gives back a token taken for an eviction that did not happen.
    pub fn refund(&mut self) {
        self.tokens = (self.tokens + 1.0).min(self.capacity);
    }
}

/// When a pod whose eviction was refused may be tried again, and how often it was refused.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Backoff {
    pub(crate) next: Timestamp,
    refusals: u32,
}

impl Backoff {
    /// The backoff after a refusal at `now`, following `previous` (the pod's backoff so far, if
    /// it was refused before): [`EVICTION_BACKOFF`], doubled for each earlier refusal, at most
    /// [`EVICTION_BACKOFF_MAX`].
    pub(crate) fn after_refusal(previous: Option<&Backoff>, now: Timestamp) -> Backoff {
        let refusals = previous.map_or(0, |b| b.refusals);
        let wait = EVICTION_BACKOFF
            .saturating_mul(2u32.saturating_pow(refusals.min(16)))
            .min(EVICTION_BACKOFF_MAX);
        Backoff {
            next: now.checked_add(wait).unwrap_or(Timestamp::MAX),
            refusals: refusals.saturating_add(1),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refunded_token_is_available_again() {
        let at = |s: i64| Timestamp::from_second(1_800_000_000 + s).unwrap();
        let mut bucket = TokenBucket::per_minute(1);
        assert!(bucket.take(at(0)));
        assert!(!bucket.take(at(1)));
        bucket.refund();
        assert!(bucket.take(at(1)));
        bucket.refund();
        bucket.refund();
        assert!(bucket.take(at(1)));
        assert!(!bucket.take(at(1)), "a refund never exceeds the capacity");
    }

    #[test]
    fn a_new_leaders_bucket_starts_empty_and_fills_at_the_rate() {
        let at = |s: i64| Timestamp::from_second(1_800_000_000 + s).unwrap();
        // 6 a minute: one token every 10 s, none at the start of the term.
        let mut bucket = TokenBucket::empty(6, at(0));
        assert!(!bucket.take(at(0)));
        assert!(!bucket.take(at(9)));
        assert!(bucket.take(at(12)));
        assert!(!bucket.take(at(13)));
        // A minute later it is full again, never more.
        let taken = (0..10).filter(|_| bucket.take(at(200))).count();
        assert_eq!(taken, 6);
    }

    #[test]
    fn each_refusal_doubles_the_wait_up_to_the_maximum() {
        let now = Timestamp::from_second(1_800_000_000).unwrap();
        let mut backoff: Option<Backoff> = None;
        let mut waits = Vec::new();
        for _ in 0..8 {
            let next = Backoff::after_refusal(backoff.as_ref(), now);
            waits.push(next.next.duration_since(now).as_secs());
            backoff = Some(next);
        }
        assert_eq!(waits, [10, 20, 40, 80, 160, 300, 300, 300]);
    }
}
