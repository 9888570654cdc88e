//! Leadership against the fake API server (`tests/support`): the Lease acquired, renewed,
//! blocked, taken over and released; expiry by the local clock; hung and failing renewals;
//! and what the reconciler does when leadership runs out or changes hands.

use crate::support;

use std::time::{Duration, Instant};

use gpu_guard_controller::lease::{Elector, Leadership, LeaseLock};
use hyper::Method;
use k8s_openapi::jiff::Timestamp;
use serde_json::json;
use support::controller::{
    World, at, gpu_node, lease_spec, lock, namespace, pod, pod_world, policy,
};
use support::fake_api::{Fake, LEASES, Logged, NAMESPACES, NODES, PODS};

/// `seconds` after `t0` on the local monotonic clock.
fn mono(t0: Instant, seconds: u64) -> Instant {
    t0 + Duration::from_secs(seconds)
}

#[tokio::test]
async fn the_lease_is_acquired_renewed_blocked_taken_over_and_released() {
    let fake = Fake::start().await;
    let mut a = lock(&fake, "replica-a");
    let mut b = lock(&fake, "replica-b");
    let t0 = Instant::now();

    // No Lease: created, held by a.
    assert!(
        a.try_acquire_or_renew(at(0), mono(t0, 0))
            .await
            .expect("acquire")
    );
    let created = fake
        .requests()
        .into_iter()
        .find(|r| r.method == Method::POST)
        .expect("a create");
    assert_eq!(created.path, LEASES);
    assert_eq!(
        created.body["spec"],
        json!({"holderIdentity": "replica-a", "leaseDurationSeconds": 15,
               "acquireTime": "2027-01-15T08:00:00.000000Z",
               "renewTime": "2027-01-15T08:00:00.000000Z", "leaseTransitions": 0})
    );

    // b is blocked while a renews.
    assert!(
        !b.try_acquire_or_renew(at(10), mono(t0, 10))
            .await
            .expect("try")
    );
    assert!(
        a.try_acquire_or_renew(at(10), mono(t0, 10))
            .await
            .expect("renew")
    );
    let spec = lease_spec(&fake);
    assert_eq!(spec["holderIdentity"], "replica-a");
    assert_eq!(spec["renewTime"], "2027-01-15T08:00:10.000000Z");
    assert_eq!(spec["acquireTime"], "2027-01-15T08:00:00.000000Z");
    // b sees the renewal at 25 s on its clock: the lease runs 15 s from then.
    assert!(
        !b.try_acquire_or_renew(at(25), mono(t0, 25))
            .await
            .expect("try")
    );
    assert!(
        !b.try_acquire_or_renew(at(40), mono(t0, 40))
            .await
            .expect("try at the edge")
    );

    // a stops renewing: once the record has not changed for the lease duration, b takes over.
    assert!(
        b.try_acquire_or_renew(at(41), mono(t0, 41))
            .await
            .expect("take over")
    );
    let spec = lease_spec(&fake);
    assert_eq!(spec["holderIdentity"], "replica-b");
    assert_eq!(spec["leaseTransitions"], 1);
    assert_eq!(spec["acquireTime"], "2027-01-15T08:00:41.000000Z");
    assert!(
        !a.try_acquire_or_renew(at(42), mono(t0, 42))
            .await
            .expect("a is out")
    );
    // Every update carried the resourceVersion it read.
    let puts: Vec<Logged> = fake
        .requests()
        .into_iter()
        .filter(|r| r.method == Method::PUT)
        .collect();
    assert_eq!(puts.len(), 2);
    assert!(
        puts.iter()
            .all(|p| p.body["metadata"]["resourceVersion"].is_string())
    );

    // b releases: the holder is cleared and a gets it at once.
    a.release(at(43))
        .await
        .expect("a releases nothing it does not hold");
    assert_eq!(lease_spec(&fake)["holderIdentity"], "replica-b");
    b.release(at(43)).await.expect("release");
    assert_eq!(lease_spec(&fake).get("holderIdentity"), None);
    assert!(
        a.try_acquire_or_renew(at(44), mono(t0, 44))
            .await
            .expect("acquire after release")
    );
    assert_eq!(lease_spec(&fake)["leaseTransitions"], 2);
}

#[tokio::test]
async fn expiry_does_not_depend_on_the_holders_wall_clock() {
    let fake = Fake::start().await;
    let mut a = lock(&fake, "replica-a");
    let mut b = lock(&fake, "replica-b");
    let t0 = Instant::now();
    // a's clock is 26 years behind, but a keeps renewing: b never takes over.
    let behind = |seconds: i64| Timestamp::from_second(1_000_000_000 + seconds).expect("time");
    for i in 0..6 {
        assert!(
            a.try_acquire_or_renew(behind(i * 10), mono(t0, (i * 10) as u64))
                .await
                .expect("renew")
        );
        assert!(
            !b.try_acquire_or_renew(at(i * 10 + 5), mono(t0, (i * 10 + 5) as u64))
                .await
                .expect("try"),
            "taken over at round {i}"
        );
    }
    assert_eq!(lease_spec(&fake)["holderIdentity"], "replica-a");

    // a's clock is 70 years ahead, and a stops renewing: b takes over after a lease duration
    // of its own clock, although the renewTime is in the future.
    let fake = Fake::start().await;
    let mut a = lock(&fake, "replica-a");
    let mut b = lock(&fake, "replica-b");
    let ahead = Timestamp::from_second(4_000_000_000).expect("time");
    assert!(
        a.try_acquire_or_renew(ahead, mono(t0, 0))
            .await
            .expect("acquire")
    );
    assert!(
        !b.try_acquire_or_renew(at(1), mono(t0, 1))
            .await
            .expect("try")
    );
    assert!(
        !b.try_acquire_or_renew(at(16), mono(t0, 16))
            .await
            .expect("try")
    );
    assert!(
        b.try_acquire_or_renew(at(17), mono(t0, 17))
            .await
            .expect("take over")
    );
    assert_eq!(lease_spec(&fake)["holderIdentity"], "replica-b");
}

/// A record is observed when the read that returns it comes back, not when the read was sent
/// (as client-go stamps it): a read that takes a second (a slow API server) may return a
/// renewal written at its very end, so the holder's lease runs from the answer.
#[tokio::test]
async fn a_lease_record_is_observed_when_the_read_returns() {
    let fake = Fake::start().await;
    let mut a = lock(&fake, "replica-a");
    let mut b = lock(&fake, "replica-b");
    let t0 = Instant::now();
    assert!(
        a.try_acquire_or_renew(at(0), mono(t0, 0))
            .await
            .expect("acquire")
    );
    fake.lock().lease_delay = Some(Duration::from_secs(1));
    let sent = Instant::now();
    assert!(
        !b.try_acquire_or_renew(at(0), t0)
            .await
            .expect("a slow read")
    );
    let took = sent.elapsed();
    assert!(took >= Duration::from_secs(1));
    fake.lock().lease_delay = None;
    // 15.5 s after the read was sent, 14.5 s after it returned: the lease runs on.
    assert!(
        !b.try_acquire_or_renew(at(15), t0 + Duration::from_millis(15_500))
            .await
            .expect("try")
    );
    assert_eq!(lease_spec(&fake)["holderIdentity"], "replica-a");
    // A lease duration after the read returned (at the latest), a takes no more part: b takes
    // over.
    assert!(
        b.try_acquire_or_renew(at(17), t0 + took + Duration::from_millis(15_001))
            .await
            .expect("take over")
    );
    assert_eq!(lease_spec(&fake)["holderIdentity"], "replica-b");
}

#[tokio::test]
async fn a_hung_renewal_stops_the_leader_within_its_deadline() {
    let fake = Fake::start().await;
    let lock = LeaseLock::new(
        fake.client(),
        "gpu-guard",
        "gpu-guard-controller",
        "replica-a",
        Duration::from_millis(900),
    );
    let mut elector = Elector::new(lock);
    let started = Instant::now();
    assert!(elector.round().await);
    let until = elector.leading_until().expect("a deadline");
    assert!(until <= Instant::now() + Duration::from_millis(600));
    // The API server stops answering (the request is held for a minute).
    fake.lock().lease_delay = Some(Duration::from_secs(60));
    let renewing = Instant::now();
    assert!(
        !elector.round().await,
        "a hung renewal keeps the replica leading"
    );
    // The round gave up at the leader's deadline: two thirds of the lease after the last
    // successful renewal was sent, well before another replica could take over.
    let now = Instant::now();
    assert!(now >= until, "gave up before the deadline");
    assert!(
        now < started + Duration::from_millis(900),
        "still waiting {:?} after the renewal was sent",
        now - renewing
    );
}

#[tokio::test]
async fn a_leader_that_cannot_renew_stops_before_its_lease_expires() {
    let fake = Fake::start().await;
    let lock = LeaseLock::new(
        fake.client(),
        "gpu-guard",
        "gpu-guard-controller",
        "replica-a",
        Duration::from_millis(600),
    );
    let mut elector = Elector::new(lock);
    assert!(elector.round().await);
    fake.lock().leases_failing = true;
    // Within two thirds of the lease: still leading, though the renewal failed.
    assert!(elector.round().await);
    tokio::time::sleep(Duration::from_millis(450)).await;
    assert!(!elector.round().await);
    // The API server answers again: leading again (the lease is still ours).
    fake.lock().leases_failing = false;
    assert!(elector.round().await);
}

#[tokio::test]
async fn of_two_replicas_racing_only_one_wins() {
    let fake = Fake::start().await;
    let mut a = lock(&fake, "replica-a");
    let mut b = lock(&fake, "replica-b");
    let now = Instant::now();
    // Both find no Lease; both create; the API server lets one create succeed.
    let (won_a, won_b) = tokio::join!(
        a.try_acquire_or_renew(at(0), now),
        b.try_acquire_or_renew(at(0), now)
    );
    let (won_a, won_b) = (won_a.expect("a"), won_b.expect("b"));
    assert!(won_a ^ won_b, "a: {won_a}, b: {won_b}");
    let (holder, other) = if won_a {
        (&mut a, &mut b)
    } else {
        (&mut b, &mut a)
    };
    assert!(
        holder
            .try_acquire_or_renew(at(1), now)
            .await
            .expect("renew")
    );
    assert!(
        !other
            .try_acquire_or_renew(at(5), now)
            .await
            .expect("blocked")
    );
}

#[tokio::test]
async fn a_pass_that_outlasts_leadership_stops_writing() {
    let objects = vec![
        (NODES, gpu_node("gpu-1", 8, 8)),
        (NAMESPACES, namespace("ml", true)),
        (PODS, pod("ml", "a", "gpu-1", true, true)),
        (PODS, pod("ml", "b", "gpu-1", true, true)),
    ];
    let mut world = World::start(policy(|p| p.controller.pods.evict_pods = true), objects).await;
    let leadership = Leadership::default();
    world.reconciler.set_leadership(leadership.clone());
    // Not leading: nothing is written at all.
    let report = world.pass(0).await;
    assert!(report.stopped);
    assert!(world.fake.requests().iter().all(|r| !r.is_write()));
    // Leading for 1 s; the first write takes 1.5 s: nothing is written after it.
    world.fake.lock().status_delay = Some(Duration::from_millis(1500));
    leadership.set(Some(Instant::now() + Duration::from_secs(1)));
    let report = world.pass(1).await;
    assert!(report.stopped, "{report:?}");
    assert_eq!(report.marked, ["ml/a"]);
    assert!(report.evicted.is_empty());
    let writes: Vec<String> = world
        .fake
        .requests()
        .into_iter()
        .filter(Logged::is_write)
        .map(|w| w.path)
        .collect();
    assert_eq!(writes, ["/api/v1/namespaces/ml/pods/a/status"]);
}

#[tokio::test]
async fn a_new_term_keeps_the_node_clocks_and_forgets_what_was_done() {
    let mut world = World::start(policy(|_| {}), pod_world()).await;
    let report = world.pass(0).await;
    assert_eq!(report.marked, ["ml/sick"]);
    assert_eq!(world.metrics.degraded_nodes.get(), 1);
    assert_eq!(world.metrics.gpu_nodes.get(), 2);
    world.reconciler.new_term(at(60));
    // The gauges are the leader's to report; what was observed stays.
    assert_eq!(world.metrics.degraded_nodes.get(), 0);
    assert_eq!(world.metrics.gpu_nodes.get(), 0);
    assert_eq!(world.metrics.tainted_nodes.get(), 0);
    // What was done is forgotten, what the cache shows is not: the pod marked in the last term
    // (another leader may have acted meanwhile) is not marked again once the cache shows its
    // mark. The pass does not wait for its Events, so the watch event may still be on its way.
    world.pod_cached("sick", |pod| pod.marked).await;
    // The degradation clock did not start again: not tainted at 119 s, tainted at 120 s, as
    // without the change.
    world.fake.clear_requests();
    assert!(world.pass(119).await.tainted.is_empty());
    let report = world.pass(120).await;
    assert_eq!(report.tainted, ["gpu-1"]);
    assert!(!report.marked.contains(&"ml/sick".to_owned()), "{report:?}");
}

#[tokio::test]
async fn a_replica_standing_by_keeps_the_clocks_and_a_new_leader_adds_no_eviction_burst() {
    let mut world =
        World::start(policy(|p| p.controller.pods.evict_pods = true), pod_world()).await;
    let leadership = Leadership::default();
    world.reconciler.set_leadership(leadership.clone());
    // Standing by at t=0: the node is judged, nothing is written.
    world.reconciler.observe(&world.caches, at(0));
    assert!(world.fake.requests().iter().all(|r| !r.is_write()));
    // Leading from t=120: the node has been degraded for 120 s, so it is tainted at once.
    leadership.set(Some(Instant::now() + Duration::from_secs(60)));
    world.reconciler.new_term(at(120));
    let report = world.pass(120).await;
    assert_eq!(report.tainted, ["gpu-1"]);
    // The new leader's eviction budget starts empty (5 a minute: one token every 12 s).
    assert!(report.evicted.is_empty(), "{report:?}");
    assert_eq!(report.evictions_deferred, ["ml/on-degraded", "ml/sick"]);
    let report = world.pass(132).await;
    assert_eq!(report.evicted, ["ml/on-degraded"]);
    assert_eq!(report.evictions_deferred, ["ml/sick"]);
}
