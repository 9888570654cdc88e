//! `gpu-guard controller`: the caches, the election, the reconcile loop, the admin port
//! (`/healthz`, `/readyz`, `/metrics`), signals.
//!
//! The loop runs a full pass every `controller.resyncSeconds`; one second after Node,
//! Namespace or ResourceSlice events, a node pass; one second after pod events, a pass over the
//! pods that changed (events coming in a burst make one pass). A pod to mark is marked from its
//! own watch event, by a task of its own. Only the Lease holder writes; a replica that is not
//! the leader keeps its caches warm and its node clocks running, and reports ready. On SIGTERM:
//! readiness turns false, the loop and the marking stop, the Lease is released, exit 0.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::lease::{Elector, Leadership, LeaseLock};
use super::metrics::ControllerMetrics;
use super::reconcile::marker::mark_from_events;
use super::reconcile::{Caches, Reconciler};
use gpu_guard_core::health::node;
use gpu_guard_core::policy::Policy;
use gpu_guard_runtime::cluster::{self, ClusterError};
use gpu_guard_runtime::process::{self, AdminProbes, ProcessError, Stopped, admin_router};

/// Pause after a watch event before a pass, so a burst of events makes one pass.
const DEBOUNCE: Duration = Duration::from_secs(1);

/// What the loop does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Work {
    /// Every node and every device pod (resync, a new term).
    Full,
    /// Every node, and the pods a change of node state or opt-in concerns.
    Nodes,
    /// The pods that changed.
    Pods,
}

/// Leader election settings.
#[derive(Clone, Debug)]
pub struct LeaderElection {
    pub namespace: String,
    pub name: String,
    pub identity: String,
    /// How long a lease lasts without renewal; renewed every retry period
    /// ([`super::lease::retry_period`]: 2 s for 15 s).
    pub duration: Duration,
}

/// How the controller runs.
#[derive(Clone, Debug)]
pub struct ControllerOptions {
    pub admin_listen: SocketAddr,
    /// None: act without an election (a single replica, or tests).
    pub leader_election: Option<LeaderElection>,
    /// Names this replica in Events.
    pub identity: Option<String>,
}

struct AdminState {
    metrics: Arc<ControllerMetrics>,
    synced: AtomicBool,
    stopping: AtomicBool,
    /// While leading: when the last pass completed (or leadership began). `None`: not leading.
    last_pass: Mutex<Option<Instant>>,
    /// How old the last completed pass may be while leading before `/healthz` fails.
    pass_overdue_after: Duration,
}

impl AdminState {
    fn set_last_pass(&self, at: Option<Instant>) {
        *self
            .last_pass
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = at;
    }

    fn last_pass(&self) -> Option<Instant> {
        *self
            .last_pass
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// How old the last completed pass may be while leading before `/healthz` fails (so a
/// reconcile loop that died or hangs gets the pod restarted): ten resyncs and a minute.
fn pass_overdue_after(resync: Duration) -> Duration {
    resync
        .saturating_mul(10)
        .saturating_add(Duration::from_secs(60))
}

/// Whether a leader's last completed pass, at `last_pass`, is overdue at `now`.
fn pass_overdue(last_pass: Option<Instant>, now: Instant, limit: Duration) -> bool {
    last_pass.is_some_and(|at| now.saturating_duration_since(at) > limit)
}

/// A started controller.
pub struct RunningController {
    pub admin_addr: SocketAddr,
    pub metrics: Arc<ControllerMetrics>,
    state: Arc<AdminState>,
    stop_loop: watch::Sender<bool>,
    stop_election: watch::Sender<bool>,
    stop_admin: watch::Sender<bool>,
    reconcile: JoinHandle<()>,
    /// Marks pods from their watch events ([`mark_from_events`]).
    marking: JoinHandle<()>,
    election: Option<JoinHandle<()>>,
    admin: JoinHandle<()>,
}

impl RunningController {
    /// Stops, in this order: readiness turns false; the loop ends after the pass in progress;
    /// then the Lease is released (never while this replica may still act, so two replicas
    /// never act at once); the admin port closes last.
    pub async fn shutdown(self) {
        self.state.stopping.store(true, Ordering::Relaxed);
        self.stop_loop.send_replace(true);
        let _ = self.reconcile.await;
        self.marking.abort();
        let _ = self.marking.await;
        self.stop_election.send_replace(true);
        if let Some(election) = self.election {
            let _ = election.await;
        }
        self.stop_admin.send_replace(true);
        let _ = self.admin.await;
    }
}

/// Why the controller could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// No Kubernetes client can be made from the configuration.
    #[error(transparent)]
    Client(#[from] kube::Error),
    /// The admin port cannot be bound.
    #[error(transparent)]
    Bind(#[from] std::io::Error),
}

/// Binds the admin port and starts the caches, the election and the loop. Returns at once.
pub async fn start(
    config: kube::Config,
    policy: Policy,
    options: ControllerOptions,
) -> Result<RunningController, StartError> {
    // The watches' client: no read timeout (a watch is a long-lived response).
    let client = Client::try_from(config.clone())?;
    let resync = Duration::from_secs(policy.controller.resync_seconds.max(1));
    let metrics = Arc::new(ControllerMetrics::default());
    let state = Arc::new(AdminState {
        metrics: metrics.clone(),
        synced: AtomicBool::new(false),
        stopping: AtomicBool::new(false),
        last_pass: Mutex::new(None),
        pass_overdue_after: pass_overdue_after(resync),
    });
    let listener = TcpListener::bind(options.admin_listen).await?;
    let admin_addr = listener.local_addr()?;
    let (stop_loop, stop_loop_rx) = watch::channel(false);
    let (stop_election, stop_election_rx) = watch::channel(false);
    let (stop_admin, mut stop_admin_rx) = watch::channel(false);

    let router = admin_router(state.clone());
    let admin = tokio::spawn(async move {
        let _ = axum::serve(process::without_nagle(listener), router)
            .with_graceful_shutdown(async move {
                let _ = stop_admin_rx.wait_for(|stop| *stop).await;
            })
            .await;
    });

    let (leader_tx, leader_rx) = watch::channel(options.leader_election.is_none());
    metrics
        .leader
        .set(i64::from(options.leader_election.is_none()));
    let leadership = options
        .leader_election
        .as_ref()
        .map(|_| Leadership::default());
    let election = match (&options.leader_election, &leadership) {
        (Some(election), Some(leadership)) => {
            // Timeouts and no retries of kube's own: each round is bounded by the leader's
            // deadline.
            let lease_client = Client::try_from(super::write_config(config.clone()))?;
            let lock = LeaseLock::new(
                lease_client,
                &election.namespace,
                &election.name,
                &election.identity,
                election.duration,
            );
            Some(tokio::spawn(elect(
                Elector::new(lock),
                super::lease::retry_period(election.duration),
                leader_tx,
                leadership.clone(),
                metrics.clone(),
                stop_election_rx,
            )))
        }
        _ => None,
    };

    tokio::spawn(warn_of_daemonsets_shut_out(
        client.clone(),
        policy.clone(),
        metrics.clone(),
    ));
    let (urgent, urgent_rx) = tokio::sync::mpsc::unbounded_channel();
    let caches = Caches::start(&client, &policy, Some(urgent));
    let mut reconciler =
        Reconciler::new(config, policy.clone(), options.identity, metrics.clone())?;
    if let Some(leadership) = &leadership {
        reconciler.set_leadership(leadership.clone());
    }
    let marking = tokio::spawn(mark_from_events(
        reconciler.marker(),
        urgent_rx,
        caches.pods.clone(),
        caches.namespaces.clone(),
        caches.namespaces_synced(),
        policy.clone(),
    ));
    let reconcile = tokio::spawn(reconcile_loop(
        caches,
        reconciler,
        resync,
        leader_rx,
        leadership,
        state.clone(),
        stop_loop_rx,
    ));
    Ok(RunningController {
        admin_addr,
        metrics,
        state,
        stop_loop,
        stop_election,
        stop_admin,
        reconcile,
        marking,
        election,
        admin,
    })
}

/// Lists the DaemonSets once and warns of each GPU DaemonSet that gpu-guard's taint would shut
/// out of a node it taints ([`node::daemonsets::shut_out`]): a log line each, naming the fix,
/// and their number in `gpu_guard_controller_daemonsets_not_tolerating` (an alert can watch
/// it; a log line alone scrolls away). Not an Event: an Event on someone else's DaemonSet would
/// need Event rights in every namespace, and repeats at every restart of both replicas. Once,
/// at start: a DaemonSet changed later is seen at the next restart (a watch on every
/// DaemonSet of the cluster would cost memory for a warning).
async fn warn_of_daemonsets_shut_out(
    client: Client,
    policy: Policy,
    metrics: Arc<ControllerMetrics>,
) {
    let api = kube::Api::<DaemonSet>::all(client);
    let listed = match api.list(&kube::api::ListParams::default()).await {
        Ok(listed) => listed,
        Err(error) => {
            metrics.daemonsets_not_tolerating.set(-1);
            tracing::warn!(%error, "cannot list DaemonSets to check that the GPU DaemonSets tolerate gpu-guard's taint (RBAC: list daemonsets.apps)");
            return;
        }
    };
    let shut_out: Vec<_> = listed
        .items
        .iter()
        .filter_map(|daemonset| node::daemonsets::shut_out(daemonset, &policy))
        .collect();
    for found in &shut_out {
        tracing::warn!(daemonset = %found.daemonset, "{}", found.message());
    }
    metrics
        .daemonsets_not_tolerating
        .set(i64::try_from(shut_out.len()).unwrap_or(i64::MAX));
}

async fn elect(
    mut elector: Elector,
    retry: Duration,
    leader: watch::Sender<bool>,
    leadership: Leadership,
    metrics: Arc<ControllerMetrics>,
    mut stop: watch::Receiver<bool>,
) {
    let retry = retry.max(Duration::from_millis(100));
    loop {
        // A deadline that has passed ends leadership now, not when the next round returns.
        if elector
            .leading_until()
            .is_none_or(|until| Instant::now() >= until)
            && *leader.borrow()
        {
            tracing::warn!(
                identity = elector.lock().identity(),
                "the leader's deadline passed without a renewal: standing by"
            );
            leadership.set(None);
            leader.send_replace(false);
            metrics.leader.set(0);
        }
        let leads = elector.round().await;
        leadership.set(elector.leading_until());
        if leads != *leader.borrow() {
            if leads {
                tracing::info!(
                    identity = elector.lock().identity(),
                    "leading: acting on nodes and pods"
                );
            } else {
                tracing::info!(
                    identity = elector.lock().identity(),
                    "not the leader: standing by"
                );
            }
        }
        leader.send_if_modified(|current| std::mem::replace(current, leads) != leads);
        metrics.leader.set(i64::from(leads));
        // Wake up when the deadline passes too, so that a lost leadership is noticed at once.
        let wake = elector
            .leading_until()
            .filter(|until| *until > Instant::now())
            .map_or(retry, |until| retry.min(until - Instant::now()));
        tokio::select! {
            _ = stop.wait_for(|stop| *stop) => break,
            () = tokio::time::sleep(wake) => {}
        }
    }
    leadership.set(None);
    leader.send_replace(false);
    metrics.leader.set(0);
    if let Err(error) = elector.lock().release(Timestamp::now()).await {
        tracing::warn!(%error, "cannot release the leader Lease; the next leader waits for it to expire");
    } else {
        tracing::info!("leader Lease released");
    }
}

async fn reconcile_loop(
    caches: Caches,
    mut reconciler: Reconciler,
    resync: Duration,
    mut leader: watch::Receiver<bool>,
    leadership: Option<Leadership>,
    state: Arc<AdminState>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            _ = stop.wait_for(|stop| *stop) => return,
            synced = caches.wait_synced(Duration::from_secs(30)) => {
                if synced {
                    break;
                }
                tracing::warn!(
                    "the Node, Pod and Namespace caches have not synced yet (check the API \
                     server address and RBAC: get, list and watch on nodes, pods, namespaces)"
                );
            }
        }
    }
    state.synced.store(true, Ordering::Relaxed);
    state.metrics.caches_synced.set(1);
    tracing::info!("controller caches synced");
    // (leading, term) at the previous look.
    let mut was = (false, u64::MAX);
    let mut work = Work::Full;
    let mut next_full = Instant::now();
    loop {
        let leading = leadership.as_ref().is_none_or(Leadership::leads);
        let term = (leading, leadership.as_ref().map_or(0, Leadership::term));
        if term != was {
            // Another replica may have acted meanwhile (or acts from now on): what this one did
            // is forgotten, what it observed is kept, and the leader-only gauges are the new
            // leader's to report.
            reconciler.new_term(Timestamp::now());
            state.set_last_pass(leading.then(Instant::now));
            was = term;
            work = Work::Full;
        }
        if work == Work::Full {
            next_full = Instant::now() + resync;
        }
        if leading {
            let now = Timestamp::now();
            let report = match work {
                Work::Full => reconciler.pass(&caches, now).await,
                Work::Nodes => reconciler.pass_nodes(&caches, now).await,
                Work::Pods => reconciler.pass_pods(&caches, now).await,
            };
            tracing::debug!(?work, ?report, "pass done");
            if report.stopped {
                tracing::warn!("leadership ran out during a pass: stopped it");
                continue;
            }
            state.set_last_pass(Some(Instant::now()));
        } else if work == Work::Pods {
            // The leader judges them.
            caches.pods.clear_dirty();
        } else {
            reconciler.observe(&caches, Timestamp::now());
        }
        state
            .metrics
            .device_pods
            .set(i64::try_from(caches.pods.len()).unwrap_or(i64::MAX));
        let (next, debounce) = tokio::select! {
            _ = stop.wait_for(|stop| *stop) => return,
            () = tokio::time::sleep_until(next_full.into()) => (Work::Full, false),
            () = caches.changed.notified() => (Work::Nodes, true),
            () = caches.pods.dirtied() => (Work::Pods, true),
            // A new leader acts at once.
            Ok(()) = leader.changed() => (Work::Full, false),
        };
        work = next;
        if debounce {
            tokio::select! {
                _ = stop.wait_for(|stop| *stop) => return,
                () = tokio::time::sleep(DEBOUNCE) => {}
            }
        }
    }
}

impl AdminProbes for AdminState {
    /// Fails when this replica leads and its last completed pass is overdue: the reconcile
    /// loop died (a panic) or hangs, and the kubelet should restart the pod.
    fn liveness(&self) -> Result<(), &'static str> {
        if pass_overdue(self.last_pass(), Instant::now(), self.pass_overdue_after) {
            Err("leading, but no reconcile pass has completed lately")
        } else {
            Ok(())
        }
    }

    fn readiness(&self) -> Result<(), &'static str> {
        if self.stopping.load(Ordering::Relaxed) {
            Err("stopping")
        } else if !self.synced.load(Ordering::Relaxed) {
            Err("waiting for the Node, Pod and Namespace caches to sync")
        } else {
            Ok(())
        }
    }

    fn metrics(&self) -> String {
        self.metrics.encode()
    }
}

// === the command ===

/// What `gpu-guard controller` runs with, resolved from flags and environment.
#[derive(Clone, Debug)]
pub struct ControllerSettings {
    /// `None`: inferred (KUBECONFIG, ~/.kube/config, in-cluster).
    pub kubeconfig: Option<PathBuf>,
    pub admin_listen: SocketAddr,
    /// This replica's identity in the Lease and in Events (`None`: the host name).
    pub identity: Option<String>,
    /// The Lease to elect a leader with; `None`: act without an election.
    pub lease: Option<LeaseSettings>,
}

/// Which Lease, and how long it lasts without renewal.
#[derive(Clone, Debug)]
pub struct LeaseSettings {
    pub namespace: String,
    pub name: String,
    pub duration: Duration,
}

/// Why `gpu-guard controller` could not start.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Process(#[from] ProcessError),
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    #[error("no identity for leader election: set --identity or POD_NAME")]
    NoIdentity,
    #[error("cannot start: {source}")]
    Start {
        #[source]
        source: StartError,
    },
}

/// `gpu-guard controller`: runs until a signal stops it; `Err` is a start-up failure, already
/// logged.
pub fn run(settings: &ControllerSettings, policy: Policy) -> Result<Stopped, RunError> {
    run_until_signal(settings, policy).inspect_err(|error| tracing::error!("{error}"))
}

fn run_until_signal(settings: &ControllerSettings, policy: Policy) -> Result<Stopped, RunError> {
    let runtime = process::runtime(None)?;
    runtime.block_on(async move {
        let mut signals = process::Signals::install()?;
        let config = cluster::config(settings.kubeconfig.as_deref()).await?;
        let identity = settings.identity.clone().or_else(hostname);
        let leader_election = match &settings.lease {
            None => None,
            Some(lease) => Some(LeaderElection {
                namespace: lease.namespace.clone(),
                name: lease.name.clone(),
                identity: identity.clone().ok_or(RunError::NoIdentity)?,
                duration: lease.duration,
            }),
        };
        let options = ControllerOptions {
            admin_listen: settings.admin_listen,
            leader_election,
            identity,
        };
        let dry_run = policy.controller.dry_run;
        let running = start(config, policy, options)
            .await
            .map_err(|source| RunError::Start { source })?;
        tracing::info!(admin = %running.admin_addr, dry_run, "controller running");
        signals.next().await;
        tracing::info!("signal received: stopping (a second signal exits at once)");
        Ok(process::shut_down_or_exit_at_second_signal(&mut signals, running.shutdown()).await)
    })
}

/// The host name (a pod's name, in a cluster), for the Lease identity.
fn hostname() -> Option<String> {
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|name| name.trim().to_owned())
        .filter(|name| !name.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lease_is_renewed_every_retry_period_within_the_deadline() {
        use super::super::lease::retry_period;
        // client-go's defaults: 15 s lease, 10 s deadline, 2 s retry.
        assert_eq!(
            retry_period(Duration::from_secs(15)),
            Duration::from_secs(2)
        );
        assert_eq!(
            retry_period(Duration::from_secs(3600)),
            Duration::from_secs(2)
        );
        // Short leases: a fifth of the deadline, about five tries before it.
        assert_eq!(
            retry_period(Duration::from_secs(3)),
            Duration::from_millis(400)
        );
        for seconds in [3, 5, 10, 15, 60] {
            let lease = Duration::from_secs(seconds);
            let deadline = lease * 2 / 3;
            assert!(retry_period(lease) * 5 <= deadline, "{seconds} s");
        }
    }

    #[test]
    fn a_leader_whose_passes_stopped_fails_its_liveness_probe() {
        let limit = pass_overdue_after(Duration::from_secs(15));
        assert_eq!(limit, Duration::from_secs(210));
        let now = Instant::now();
        let at = |ago: u64| now.checked_sub(Duration::from_secs(ago));
        assert!(!pass_overdue(None, now, limit), "not leading");
        assert!(!pass_overdue(at(210), now, limit));
        assert!(pass_overdue(at(211), now, limit));
        assert_eq!(
            pass_overdue_after(Duration::MAX),
            Duration::MAX,
            "never an overflow"
        );
    }
}
