//! Leader election on a `coordination.k8s.io/v1` Lease, as client-go's leaderelection does it,
//! kept small: get, create, and update with the Lease's `resourceVersion` (so two replicas that
//! race for it cannot both win: the second update is a 409 Conflict).
//!
//! - No Lease: create it, holding it (a 409 AlreadyExists means another replica was faster).
//! - Held by us: renew (`renewTime = now`).
//! - Held by another whose `renewTime + leaseDurationSeconds` has passed, or by nobody: take
//!   it over (`leaseTransitions + 1`).
//! - Held by another, unexpired: not the leader.
//!
//! A leader that cannot renew must stop acting before its lease expires: [`Elector`] stops
//! after two thirds of the lease duration without a renewal, on its own clock. On shutdown [`LeaseLock::release`] clears the holder so the next
//! replica need not wait for the lease to expire.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::PostParams;
use kube::{Api, Client};

/// A Lease this replica competes for.
#[derive(Clone)]
pub struct LeaseLock {
    api: Api<Lease>,
    name: String,
    identity: String,
    duration: Duration,
}

impl LeaseLock {
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
        }
    }

    pub fn identity(&self) -> &str {
        &self.identity
    }

    fn duration_seconds(&self) -> i32 {
        i32::try_from(self.duration.as_secs().max(1)).unwrap_or(i32::MAX)
    }

    /// Acquires or renews the Lease at `now`. `Ok(true)`: this replica holds it.
    pub async fn try_acquire_or_renew(&self, now: Timestamp) -> Result<bool, kube::Error> {
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
                Ok(_) => Ok(true),
                Err(kube::Error::Api(status)) if status.is_already_exists() => Ok(false),
                Err(error) => Err(error),
            };
        };
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
        if holder.as_deref() == Some(self.identity.as_str()) {
            spec.renew_time = Some(MicroTime(now));
            spec.lease_duration_seconds = Some(self.duration_seconds());
        } else if holder.is_none() || expired(spec, now) {
            spec.holder_identity = Some(self.identity.clone());
            spec.acquire_time = Some(MicroTime(now));
            spec.renew_time = Some(MicroTime(now));
            spec.lease_duration_seconds = Some(self.duration_seconds());
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        } else {
            return Ok(false);
        }
        // `lease` carries the resourceVersion read: a concurrent update makes this a 409.
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(status)) if status.is_conflict() => Ok(false),
            Err(error) => Err(error),
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

/// Whether the holder's lease has run out at `now` (a Lease without renewTime or duration has).
pub fn expired(spec: &LeaseSpec, now: Timestamp) -> bool {
    let (Some(renewed), Some(seconds)) = (&spec.renew_time, spec.lease_duration_seconds) else {
        return true;
    };
    renewed.0 + SignedDuration::from_secs(i64::from(seconds)) < now
}

/// Runs the election: tries every `retry`, and tells whether this replica may act. A leader
/// whose renewals fail for longer than the lease duration loses its leadership.
pub struct Elector {
    lock: LeaseLock,
    last_renewed: Option<std::time::Instant>,
}

impl Elector {
    pub fn new(lock: LeaseLock) -> Self {
        Self {
            lock,
            last_renewed: None,
        }
    }

    pub fn lock(&self) -> &LeaseLock {
        &self.lock
    }

    /// One round of the election: whether this replica leads now.
    pub async fn round(&mut self) -> bool {
        // Measured from before the request, like the renewTime written.
        let started = std::time::Instant::now();
        match self.lock.try_acquire_or_renew(Timestamp::now()).await {
            Ok(true) => {
                self.last_renewed = Some(started);
                true
            }
            Ok(false) => {
                self.last_renewed = None;
                false
            }
            Err(error) => {
                tracing::warn!(%error, "cannot read or renew the leader Lease");
                // Keep leading for two thirds of the lease this replica renewed last (like
                // client-go's renew deadline): it stops well before another replica may take
                // the expired lease over.
                self.last_renewed
                    .is_some_and(|at| at.elapsed() < self.lock.duration * 2 / 3)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expiry() {
        let at = |s| Timestamp::from_second(1_800_000_000 + s).unwrap();
        let spec = |renew: Option<i64>, duration: Option<i32>| LeaseSpec {
            renew_time: renew.map(|s| MicroTime(at(s))),
            lease_duration_seconds: duration,
            ..LeaseSpec::default()
        };
        assert!(!expired(&spec(Some(0), Some(15)), at(15)));
        assert!(expired(&spec(Some(0), Some(15)), at(16)));
        assert!(expired(&spec(None, Some(15)), at(0)));
        assert!(expired(&spec(Some(0), None), at(0)));
    }
}
