//! Leader election on a `coordination.k8s.io/v1` Lease, as client-go's leaderelection does it,
//! kept small: get, create, and update with the Lease's `resourceVersion` (so two replicas that
//! race for it cannot both win: the second update is a 409 Conflict).
//!
//! - No Lease: create it, holding it (a 409 AlreadyExists means another replica was faster).
//! - Held by us: renew (`renewTime = now`).
//! - Held by nobody, or by another whose record has not changed for `leaseDurationSeconds` by
//!   this replica's monotonic clock: take it over (`leaseTransitions + 1`).
//! - Held by another, changed within the lease duration: not the leader.
//!
//! Expiry is judged like client-go does it, never by comparing the holder's wall-clock
//! `renewTime` with ours (the clocks may be skewed): this replica remembers the record it last
//! saw and the local [`Instant`] at which it saw it change.
//!
//! A leader may act until [`Elector::leading_until`]: the time its last successful renewal was
//! *sent*, plus two thirds of the lease duration (the renew deadline). Another replica cannot
//! take over before it has seen the record unchanged for a whole lease duration, which starts
//! after that request was sent: the remaining third is the margin for writes in flight and for
//! clock rate differences. Each election round is bounded by the time left until that deadline,
//! so a hung renewal cannot keep a replica leading. On shutdown [`LeaseLock::release`] clears
//! the holder so the next replica need not wait for the lease to expire.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::PostParams;
use kube::{Api, Client};

/// The record of a Lease that matters for expiry: when any of it changes, the holder is alive.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Record {
    holder: Option<String>,
    renew_time: Option<Timestamp>,
    acquire_time: Option<Timestamp>,
    duration_seconds: Option<i32>,
    transitions: Option<i32>,
}

impl Record {
    fn of(spec: &LeaseSpec) -> Self {
        Self {
            holder: spec.holder_identity.clone().filter(|h| !h.is_empty()),
            renew_time: spec.renew_time.as_ref().map(|t| t.0),
            acquire_time: spec.acquire_time.as_ref().map(|t| t.0),
            duration_seconds: spec.lease_duration_seconds,
            transitions: spec.lease_transitions,
        }
    }
}

/// The record last seen, and when (local monotonic clock) it was last seen to change.
#[derive(Clone, Debug)]
struct Observed {
    record: Record,
    changed_at: Instant,
}

/// A Lease this replica competes for.
#[derive(Clone)]
pub struct LeaseLock {
    api: Api<Lease>,
    name: String,
    identity: String,
    duration: Duration,
    observed: Option<Observed>,
}

impl LeaseLock {
    /// `client` should have read and write timeouts and no retries of its own
    /// ([`super::write_config`]): the election bounds each round itself.
    pub fn new(
        client: Client,
        namespace: &str,
        name: &str,
        identity: &str,
        duration: Duration,
    ) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            name: name.to_owned(),
            identity: identity.to_owned(),
            duration,
            observed: None,
        }
    }

    pub fn identity(&self) -> &str {
        &self.identity
    }

    pub fn duration(&self) -> Duration {
        self.duration
    }

    fn duration_seconds(&self) -> i32 {
        i32::try_from(self.duration.as_secs().max(1)).unwrap_or(i32::MAX)
    }

    /// Remembers `record` as seen at `seen_at`; the change time moves only when it changed.
    fn observe(&mut self, record: Record, seen_at: Instant) -> Instant {
        match &self.observed {
            Some(observed) if observed.record == record => observed.changed_at,
            _ => {
                self.observed = Some(Observed {
                    record,
                    changed_at: seen_at,
                });
                seen_at
            }
        }
    }

    /// Acquires or renews the Lease, writing `now` (wall clock) as its times; `seen_at` is the
    /// local monotonic time this attempt starts, by which another holder's expiry is judged.
    /// `Ok(true)`: this replica holds it.
    ///
    /// A record read is observed when the read returns (`seen_at` plus the time the read
    /// took), not when it was sent: the holder may have written it at any moment until the
    /// answer, so its lease runs from then on. Stamped at the sending, a slow read would move
    /// the observation back, and another replica would take over before the holder's renew
    /// deadline had passed. client-go does the same (k8s.io/client-go
    /// `tools/leaderelection/leaderelection.go`, `tryAcquireOrRenew`: `setObservedRecord`
    /// reads the clock after `Lock.Get`), and judges expiry by the time the attempt started.
    pub async fn try_acquire_or_renew(
        &mut self,
        now: Timestamp,
        seen_at: Instant,
    ) -> Result<bool, kube::Error> {
        let started = Instant::now();
        // `seen_at` moved on by the time elapsed since this attempt started.
        let observed_now = || seen_at.checked_add(started.elapsed()).unwrap_or(seen_at);
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.identity.clone()),
                    lease_duration_seconds: Some(self.duration_seconds()),
                    acquire_time: Some(MicroTime(now)),
                    renew_time: Some(MicroTime(now)),
                    lease_transitions: Some(0),
                    ..LeaseSpec::default()
                }),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(created) => {
                    self.remember(&created, observed_now());
                    Ok(true)
                }
                Err(kube::Error::Api(status)) if status.is_already_exists() => Ok(false),
                Err(error) => Err(error),
            };
        };
        let duration_seconds = self.duration_seconds();
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        let record = Record::of(spec);
        let holder = record.holder.clone();
        let lease_duration = spec
            .lease_duration_seconds
            .and_then(|s| u64::try_from(s).ok())
            .map_or(self.duration, Duration::from_secs);
        let changed_at = self.observe(record, observed_now());
        if holder.as_deref() == Some(self.identity.as_str()) {
            spec.renew_time = Some(MicroTime(now));
            spec.lease_duration_seconds = Some(duration_seconds);
        } else if holder.is_none() || expired(changed_at, lease_duration, seen_at) {
            spec.holder_identity = Some(self.identity.clone());
            spec.acquire_time = Some(MicroTime(now));
            spec.renew_time = Some(MicroTime(now));
            spec.lease_duration_seconds = Some(duration_seconds);
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
        } else {
            return Ok(false);
        }
        // `lease` carries the resourceVersion read: a concurrent update makes this a 409.
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(written) => {
                self.remember(&written, observed_now());
                Ok(true)
            }
            Err(kube::Error::Api(status)) if status.is_conflict() => Ok(false),
            Err(error) => Err(error),
        }
    }

    fn remember(&mut self, lease: &Lease, seen_at: Instant) {
        if let Some(spec) = &lease.spec {
            self.observe(Record::of(spec), seen_at);
        }
    }

    /// Gives the Lease up if this replica holds it (best effort, at shutdown): the holder is
    /// cleared, so another replica takes over at once.
    pub async fn release(&self, now: Timestamp) -> Result<(), kube::Error> {
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            return Ok(());
        };
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return Ok(());
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(MicroTime(now));
        self.api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
            .map(|_| ())
    }
}

/// Whether a holder whose record was last seen to change at `changed_at` has let its lease of
/// `duration` run out at `now` (all on this replica's monotonic clock).
fn expired(changed_at: Instant, duration: Duration, now: Instant) -> bool {
    changed_at
        .checked_add(duration)
        .is_some_and(|until| until < now)
}

/// Until when this replica may act, shared by the election (which extends it on each renewal)
/// and the reconciler (which checks it before every write). `None`: not leading.
#[derive(Clone, Debug, Default)]
pub struct Leadership(Arc<Mutex<Term>>);

#[derive(Clone, Copy, Debug, Default)]
struct Term {
    until: Option<Instant>,
    /// Counts the times leadership was gained (a deadline set when none was running).
    number: u64,
}

impl Leadership {
    fn inner(&self) -> std::sync::MutexGuard<'_, Term> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub fn set(&self, until: Option<Instant>) {
        let mut term = self.inner();
        let running = term.until.is_some_and(|until| Instant::now() < until);
        if until.is_some() && !running {
            term.number = term.number.wrapping_add(1);
        }
        term.until = until;
    }

    pub fn until(&self) -> Option<Instant> {
        self.inner().until
    }

    /// Which term of leadership this is: it changes each time leadership is gained, so that a
    /// loss and a gain between two looks are not missed.
    pub fn term(&self) -> u64 {
        self.inner().number
    }

    /// Whether this replica may still act at `now`.
    pub fn leads_at(&self, now: Instant) -> bool {
        self.until().is_some_and(|until| now < until)
    }

    pub fn leads(&self) -> bool {
        self.leads_at(Instant::now())
    }
}

/// client-go's default retry period: how often a replica tries to acquire or renew the Lease
/// (k8s.io/component-base `config/v1alpha1/defaults.go`,
/// `RecommendedDefaultLeaderElectionConfiguration`: lease 15 s, renew deadline 10 s, retry 2 s).
const RETRY_PERIOD: Duration = Duration::from_secs(2);

/// The retry period for a Lease of `lease_duration`: [`RETRY_PERIOD`], or a fifth of the renew
/// deadline (two thirds of the lease) when that is shorter, so a leader gets about five tries
/// at renewing before its deadline (15 s: 2 s, as client-go; 3 s: 400 ms).
pub fn retry_period(lease_duration: Duration) -> Duration {
    RETRY_PERIOD.min(lease_duration * 2 / 3 / 5)
}

/// Runs the election: one [`Elector::round`] every retry period tells whether this replica may
/// act, and until when.
pub struct Elector {
    lock: LeaseLock,
    leading_until: Option<Instant>,
}

impl Elector {
    pub fn new(lock: LeaseLock) -> Self {
        Self {
            lock,
            leading_until: None,
        }
    }

    pub fn lock(&self) -> &LeaseLock {
        &self.lock
    }

    /// Two thirds of the lease duration: how long a leader may act after sending a renewal
    /// that succeeded.
    fn renew_deadline(&self) -> Duration {
        self.lock.duration * 2 / 3
    }

    /// Until when this replica may act (`None`, or a time past: it may not).
    pub fn leading_until(&self) -> Option<Instant> {
        self.leading_until
    }

    /// One round of the election: whether this replica leads now. The round is bounded by the
    /// time left until [`Self::leading_until`] (a replica not leading: by the renew deadline),
    /// so a hung or throttled renewal cannot keep it leading.
    pub async fn round(&mut self) -> bool {
        // Measured from before the request is sent, like the renewTime written.
        let sent = Instant::now();
        let budget = match self.leading_until {
            Some(until) if until > sent => until - sent,
            _ => self.renew_deadline(),
        };
        let attempt = self.lock.try_acquire_or_renew(Timestamp::now(), sent);
        match tokio::time::timeout(budget, attempt).await {
            Ok(Ok(true)) => self.leading_until = sent.checked_add(self.renew_deadline()),
            Ok(Ok(false)) => self.leading_until = None,
            Ok(Err(error)) => {
                // Keep the deadline of the last renewal: it runs out by itself.
                tracing::warn!(%error, "cannot read or renew the leader Lease");
            }
            Err(_) => {
                tracing::warn!(
                    timeout = ?budget,
                    "reading or renewing the leader Lease timed out"
                );
            }
        }
        self.leading_until
            .is_some_and(|until| Instant::now() < until)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expiry_is_judged_on_the_local_monotonic_clock() {
        let t0 = Instant::now();
        let lease = Duration::from_secs(15);
        assert!(!expired(t0, lease, t0));
        assert!(!expired(t0, lease, t0 + lease));
        assert!(expired(t0, lease, t0 + lease + Duration::from_millis(1)));
        // A duration that overflows the clock never expires (and never panics).
        assert!(!expired(t0, Duration::MAX, t0 + lease));
    }

    #[test]
    fn leadership_runs_out_by_itself() {
        let leadership = Leadership::default();
        let now = Instant::now();
        assert!(!leadership.leads_at(now));
        leadership.set(Some(now + Duration::from_secs(1)));
        assert!(leadership.leads_at(now));
        assert!(!leadership.leads_at(now + Duration::from_secs(1)));
        let first = leadership.term();
        leadership.set(Some(Instant::now() + Duration::from_secs(5)));
        assert_eq!(leadership.term(), first, "a renewal is the same term");
        leadership.set(None);
        assert!(!leadership.leads_at(now));
        leadership.set(Some(Instant::now() + Duration::from_secs(5)));
        assert_eq!(leadership.term(), first + 1, "gained again: a new term");
    }
}
