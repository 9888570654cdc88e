//! `gpu-guard controller`: the caches, the election, the reconcile loop, the admin port
//! (`/healthz`, `/readyz`, `/metrics`), signals.
//!
//! The loop runs a pass every `controller.resyncSeconds`, and one second after a watch event
//! (events coming in a burst make one pass). Only the Lease holder runs passes; a replica that
//! is not the leader keeps its caches warm and reports ready. On SIGTERM: readiness turns
//! false, the loop stops after the pass in progress, the Lease is released, exit 0.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing_subscriber::EnvFilter;

use super::lease::{Elector, LeaseLock};
use super::metrics::ControllerMetrics;
use super::reconcile::{Caches, Reconciler};
use crate::cli::{ControllerArgs, LogFormat, Report};
use crate::cluster;
use crate::policy::Policy;

/// Pause after a watch event before a pass, so a burst of events makes one pass.
const DEBOUNCE: Duration = Duration::from_secs(1);

/// Leader election settings.
#[derive(Clone, Debug)]
pub struct LeaderElection {
    pub namespace: String,
    pub name: String,
    pub identity: String,
    /// How long a lease lasts without renewal; renewed every third of it.
    pub duration: Duration,
}

/// How the controller runs.
#[derive(Clone, Debug)]
pub struct Options {
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
}

/// A started controller.
pub struct Running {
    pub admin_addr: SocketAddr,
    pub metrics: Arc<ControllerMetrics>,
    state: Arc<AdminState>,
    stop_loop: watch::Sender<bool>,
    stop_election: watch::Sender<bool>,
    stop_admin: watch::Sender<bool>,
    reconcile: JoinHandle<()>,
    election: Option<JoinHandle<()>>,
    admin: JoinHandle<()>,
}

impl Running {
    /// Stops, in this order: readiness turns false; the loop ends after the pass in progress;
    /// then the Lease is released (never while this replica may still act, so two replicas
    /// never act at once); the admin port closes last.
    pub async fn shutdown(self) {
        self.state.stopping.store(true, Ordering::Relaxed);
        self.stop_loop.send_replace(true);
        let _ = self.reconcile.await;
        self.stop_election.send_replace(true);
        if let Some(election) = self.election {
            let _ = election.await;
        }
        self.stop_admin.send_replace(true);
        let _ = self.admin.await;
    }
}

/// Binds the admin port and starts the caches, the election and the loop. Returns at once.
pub async fn start(
    config: kube::Config,
    policy: Policy,
    options: Options,
) -> std::io::Result<Running> {
    let client = Client::try_from(config.clone()).map_err(std::io::Error::other)?;
    let metrics = Arc::new(ControllerMetrics::default());
    let state = Arc::new(AdminState {
        metrics: metrics.clone(),
        synced: AtomicBool::new(false),
        stopping: AtomicBool::new(false),
    });
    let listener = TcpListener::bind(options.admin_listen).await?;
    let admin_addr = listener.local_addr()?;
    let (stop_loop, stop_loop_rx) = watch::channel(false);
    let (stop_election, stop_election_rx) = watch::channel(false);
    let (stop_admin, mut stop_admin_rx) = watch::channel(false);

    let router = admin_router(state.clone());
    let admin = tokio::spawn(async move {
        let _ = axum::serve(listener, router)
            .with_graceful_shutdown(async move {
                let _ = stop_admin_rx.wait_for(|stop| *stop).await;
            })
            .await;
    });

    let (leader_tx, leader_rx) = watch::channel(options.leader_election.is_none());
    metrics
        .leader
        .set(i64::from(options.leader_election.is_none()));
    let election = options.leader_election.as_ref().map(|election| {
        let lock = LeaseLock::new(
            client.clone(),
            &election.namespace,
            &election.name,
            &election.identity,
            election.duration,
        );
        tokio::spawn(elect(
            Elector::new(lock),
            election.duration / 3,
            leader_tx,
            metrics.clone(),
            stop_election_rx,
        ))
    });

    let caches = Caches::start(&client);
    let reconciler = Reconciler::new(config, policy.clone(), options.identity, metrics.clone())
        .map_err(std::io::Error::other)?;
    let resync = Duration::from_secs(policy.controller.resync_seconds.max(1));
    let reconcile = tokio::spawn(reconcile_loop(
        caches,
        reconciler,
        resync,
        leader_rx,
        state.clone(),
        stop_loop_rx,
    ));
    Ok(Running {
        admin_addr,
        metrics,
        state,
        stop_loop,
        stop_election,
        stop_admin,
        reconcile,
        election,
        admin,
    })
}

async fn elect(
    mut elector: Elector,
    retry: Duration,
    leader: watch::Sender<bool>,
    metrics: Arc<ControllerMetrics>,
    mut stop: watch::Receiver<bool>,
) {
    let retry = retry.max(Duration::from_millis(100));
    loop {
        let leads = elector.round().await;
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
        leader.send_replace(leads);
        metrics.leader.set(i64::from(leads));
        tokio::select! {
            _ = stop.wait_for(|stop| *stop) => break,
            () = tokio::time::sleep(retry) => {}
        }
    }
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
    loop {
        if *leader.borrow() {
            let report = reconciler.pass(&caches, Timestamp::now()).await;
            tracing::debug!(?report, "pass done");
        }
        let changed = tokio::select! {
            _ = stop.wait_for(|stop| *stop) => return,
            () = tokio::time::sleep(resync) => false,
            () = caches.changed.notified() => true,
            // A new leader acts at once.
            Ok(()) = leader.changed() => false,
        };
        if changed {
            tokio::select! {
                _ = stop.wait_for(|stop| *stop) => return,
                () = tokio::time::sleep(DEBOUNCE) => {}
            }
        }
    }
}

fn admin_router(state: Arc<AdminState>) -> Router {
    Router::new()
        .route(crate::server::HEALTHZ_PATH, get(|| async { "ok\n" }))
        .route(crate::server::READYZ_PATH, get(readyz))
        .route(crate::server::METRICS_PATH, get(metrics_text))
        .with_state(state)
}

async fn readyz(State(state): State<Arc<AdminState>>) -> Response {
    if state.stopping.load(Ordering::Relaxed) {
        (StatusCode::SERVICE_UNAVAILABLE, "stopping\n").into_response()
    } else if !state.synced.load(Ordering::Relaxed) {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "waiting for the Node, Pod and Namespace caches to sync\n",
        )
            .into_response()
    } else {
        (StatusCode::OK, "ready\n").into_response()
    }
}

async fn metrics_text(State(state): State<Arc<AdminState>>) -> Response {
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.metrics.encode(),
    )
        .into_response()
}

// === the command ===

/// `gpu-guard controller`: runs until a signal stops it.
pub fn controller(args: &ControllerArgs, policy: Policy) -> Report {
    init_logging(args.log_format, &args.log_level);
    let policy = effective_policy(args, policy);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => return failed(format!("cannot start the async runtime: {error}")),
    };
    runtime.block_on(async move {
        let config = match cluster::config(args.kubeconfig.as_deref()).await {
            Ok(config) => config,
            Err(error) => return failed(error.to_string()),
        };
        let identity = args.identity.clone().or_else(hostname);
        let leader_election = if args.no_leader_election {
            None
        } else {
            let Some(identity) = identity.clone() else {
                return failed(
                    "no identity for leader election: set --identity or POD_NAME".to_owned(),
                );
            };
            Some(LeaderElection {
                namespace: args.lease_namespace.clone(),
                name: args.lease_name.clone(),
                identity,
                duration: Duration::from_secs(args.lease_duration_seconds.max(3)),
            })
        };
        let options = Options {
            admin_listen: args.admin_listen,
            leader_election,
            identity,
        };
        let dry_run = policy.controller.dry_run;
        let running = match start(config, policy, options).await {
            Ok(running) => running,
            Err(error) => return failed(format!("cannot start: {error}")),
        };
        tracing::info!(admin = %running.admin_addr, dry_run, "controller running");
        wait_for_signal().await;
        tracing::info!("signal received: stopping (a second signal exits at once)");
        tokio::select! {
            () = running.shutdown() => Report::default(),
            () = wait_for_signal() => {
                tracing::warn!("second signal: exiting at once");
                Report { exit_code: 130, ..Report::default() }
            }
        }
    })
}

/// The policy with the command line's overrides: `--dry-run` turns dry run on (it never turns
/// a policy's `dryRun: true` off).
pub fn effective_policy(args: &ControllerArgs, mut policy: Policy) -> Policy {
    if args.dry_run {
        policy.controller.dry_run = true;
    }
    policy
}

/// The host name (a pod's name, in a cluster), for the Lease identity.
fn hostname() -> Option<String> {
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|name| name.trim().to_owned())
        .filter(|name| !name.is_empty())
}

fn failed(message: String) -> Report {
    tracing::error!("{message}");
    Report {
        stderr: format!("error: {message}\n"),
        exit_code: 1,
        ..Report::default()
    }
}

fn init_logging(format: LogFormat, level: &str) {
    let filter = EnvFilter::try_new(level).unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
        LogFormat::Text => builder.try_init(),
    };
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut terminate) => {
                tokio::select! {
                    _ = terminate.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cli, Command};
    use clap::Parser;

    fn args(flags: &[&str]) -> ControllerArgs {
        let cli =
            Cli::try_parse_from(["gpu-guard", "controller"].iter().chain(flags)).expect("parses");
        match cli.command {
            Command::Controller(args) => args,
            _ => panic!("not the controller command"),
        }
    }

    #[test]
    fn dry_run_flag_overrides_the_policy() {
        let mut policy = Policy::default();
        assert!(
            !effective_policy(&args(&[]), policy.clone())
                .controller
                .dry_run
        );
        assert!(
            effective_policy(&args(&["--dry-run"]), policy.clone())
                .controller
                .dry_run
        );
        policy.controller.dry_run = true;
        assert!(effective_policy(&args(&[]), policy).controller.dry_run);
    }

    #[test]
    fn defaults() {
        let args = args(&["--identity", "replica-a"]);
        assert_eq!(args.admin_listen.to_string(), "0.0.0.0:8081");
        assert_eq!(args.lease_name, "gpu-guard-controller");
        assert_eq!(args.lease_duration_seconds, 15);
        assert_eq!(args.identity.as_deref(), Some("replica-a"));
        assert!(!args.no_leader_election);
    }
}
