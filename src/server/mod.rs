//! The webhook server: HTTPS `/mutate` and `/validate` (axum on hyper, rustls), and a plain-HTTP
//! admin port with `/healthz` and `/readyz`.
//!
//! Lifecycle: ready once the certificate is loaded and the listeners are bound. On SIGTERM or
//! SIGINT readiness turns false at once (the API server's endpoints drop the pod), the server
//! keeps serving for the drain delay, then stops accepting, lets in-flight requests finish and
//! returns. A second signal exits at once.

pub mod metrics;
pub mod run;
pub mod tls;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use crate::admission::{self, Webhook};
use crate::cluster::ClusterCache;
use crate::guard::{ClusterView, StaticView};
use crate::policy::Policy;
use metrics::{Metrics, RequestLabels};
use tls::{CertificateFiles, CertificateStore};

/// The mutating webhook's path.
pub const MUTATE_PATH: &str = "/mutate";
/// The validating webhook's path.
pub const VALIDATE_PATH: &str = "/validate";
/// Liveness, on the admin port.
pub const HEALTHZ_PATH: &str = "/healthz";
/// Readiness, on the admin port.
pub const READYZ_PATH: &str = "/readyz";
/// Prometheus metrics, on the admin port.
pub const METRICS_PATH: &str = "/metrics";
/// The default HTTPS webhook port.
pub const WEBHOOK_PORT: u16 = 8443;
/// The default plain-HTTP admin port.
pub const ADMIN_PORT: u16 = 8080;

/// The largest AdmissionReview accepted (the API server's own limit is about 3 MiB per object;
/// 7 MiB matches controller-runtime).
pub const MAX_BODY_BYTES: usize = 7 * 1024 * 1024;
/// By default a client must finish the TLS handshake within this.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// By default a client must send the request headers within this.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// By default a client must send the whole body within this.
pub const BODY_TIMEOUT: Duration = Duration::from_secs(10);
/// By default shutdown waits this long for requests in flight, then closes what is left.
pub const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a slow client may take before its connection is closed.
#[derive(Clone, Copy, Debug)]
pub struct Timeouts {
    /// The TLS handshake.
    pub handshake: Duration,
    /// The request headers (HTTP/1.1; HTTP/2 connections are kept honest by keep-alive pings).
    pub headers: Duration,
    /// The request body, once the headers are in (answered 408).
    pub body: Duration,
    /// After the drain delay, how long requests in flight may take before connections close.
    pub shutdown: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            handshake: HANDSHAKE_TIMEOUT,
            headers: HEADER_TIMEOUT,
            body: BODY_TIMEOUT,
            shutdown: SHUTDOWN_TIMEOUT,
        }
    }
}

/// Where the certificate comes from.
#[derive(Clone, Debug)]
pub enum CertificateSource {
    /// PEM files, polled for changes every `poll`.
    Files {
        files: CertificateFiles,
        poll: Duration,
    },
    /// A pair made in memory at start.
    Generated(tls::GeneratedPair),
}

/// Everything `serve` needs, resolved from flags and environment.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub listen: SocketAddr,
    pub admin_listen: SocketAddr,
    pub certificate: CertificateSource,
    pub drain_delay: Duration,
    pub timeouts: Timeouts,
}

/// Where the guard's view of the cluster comes from.
#[derive(Debug)]
pub enum ClusterSource {
    /// The policy file's offline facts (`serve --no-cluster`, or no cluster configured).
    Offline(StaticView),
    /// Reflector caches of a cluster; `/readyz` waits for them to sync.
    Cache(ClusterCache),
}

impl ClusterSource {
    /// The policy's offline facts.
    pub fn offline(policy: &Policy) -> Self {
        Self::Offline(StaticView::from_policy(&policy.guard.offline))
    }
}

/// Decides one request body; [`admission::review`] in production, a stand-in in tests.
pub type Reviewer = fn(
    Webhook,
    &[u8],
    &Policy,
    &dyn ClusterView,
) -> Result<admission::Reviewed, admission::ReviewError>;

/// Shared by every request.
pub struct AppState {
    pub policy: Policy,
    /// What the guard knows of the cluster: the reflector caches, or the policy's offline facts.
    pub view: Arc<dyn ClusterView>,
    /// The caches behind `view` when there is a cluster (for their metrics).
    pub cluster: Option<ClusterCache>,
    pub reviewer: Reviewer,
    pub body_timeout: Duration,
    pub ready: AtomicBool,
    pub draining: AtomicBool,
    pub metrics: Metrics,
    pub certificates: Option<Arc<CertificateStore>>,
}

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState")
            .field("policy", &self.policy)
            .field("view_synced", &self.view.synced())
            .field("ready", &self.ready)
            .field("draining", &self.draining)
            .finish_non_exhaustive()
    }
}

impl AppState {
    /// State for a router without TLS (tests drive it with `oneshot`): ready at once, with the
    /// policy's offline cluster facts.
    pub fn new(policy: Policy) -> Arc<Self> {
        Self::with_reviewer(policy, admission::review)
    }

    /// [`AppState::new`] with another reviewer (tests use one that panics).
    pub fn with_reviewer(policy: Policy, reviewer: Reviewer) -> Arc<Self> {
        let view = Arc::new(StaticView::from_policy(&policy.guard.offline));
        Self::with_view(policy, view, reviewer)
    }

    /// [`AppState::new`] with another cluster view.
    pub fn with_view(policy: Policy, view: Arc<dyn ClusterView>, reviewer: Reviewer) -> Arc<Self> {
        Arc::new(Self {
            policy,
            view,
            cluster: None,
            reviewer,
            body_timeout: BODY_TIMEOUT,
            ready: AtomicBool::new(true),
            draining: AtomicBool::new(false),
            metrics: Metrics::default(),
            certificates: None,
        })
    }
}

/// The webhook routes (no TLS, no sockets: tests drive it with `tower::ServiceExt::oneshot`).
pub fn webhook_router(state: Arc<AppState>) -> Router {
    Router::new()
        .route(MUTATE_PATH, post(mutate))
        .route(VALIDATE_PATH, post(validate))
        .with_state(state)
}

/// The admin routes.
pub fn admin_router(state: Arc<AppState>) -> Router {
    Router::new()
        .route(HEALTHZ_PATH, get(|| async { "ok\n" }))
        .route(READYZ_PATH, get(readyz))
        .route(METRICS_PATH, get(metrics_text))
        .with_state(state)
}

async fn mutate(State(state): State<Arc<AppState>>, request: Request) -> Response {
    webhook(Webhook::Mutate, &state, request).await
}

async fn validate(State(state): State<Arc<AppState>>, request: Request) -> Response {
    webhook(Webhook::Validate, &state, request).await
}

/// Reads the body (within [`MAX_BODY_BYTES`]) and decides; the headers are read in place.
async fn webhook(webhook: Webhook, state: &AppState, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    match tokio::time::timeout(
        state.body_timeout,
        axum::body::to_bytes(body, MAX_BODY_BYTES),
    )
    .await
    {
        Ok(Ok(body)) => handle(webhook, state, &parts.headers, &body),
        Ok(Err(_)) => plain(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the body exceeds {MAX_BODY_BYTES} bytes (or was cut off)\n"),
        ),
        Err(_) => plain(
            StatusCode::REQUEST_TIMEOUT,
            format!(
                "the body did not arrive within {} s\n",
                state.body_timeout.as_secs_f64()
            ),
        ),
    }
}

async fn readyz(State(state): State<Arc<AppState>>) -> Response {
    if state.draining.load(Ordering::Relaxed) {
        (StatusCode::SERVICE_UNAVAILABLE, "draining\n").into_response()
    } else if !state.ready.load(Ordering::Relaxed) {
        (StatusCode::SERVICE_UNAVAILABLE, "starting\n").into_response()
    } else if !state.view.synced() {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "waiting for the PriorityClass and Node caches to sync\n",
        )
            .into_response()
    } else {
        (StatusCode::OK, "ready\n").into_response()
    }
}

async fn metrics_text(State(state): State<Arc<AppState>>) -> Response {
    if let Some(cluster) = &state.cluster {
        state.metrics.observe_caches(&cluster.status());
    }
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.metrics.encode(),
    )
        .into_response()
}

fn handle(webhook: Webhook, state: &AppState, headers: &HeaderMap, body: &[u8]) -> Response {
    let in_flight = state.metrics.in_flight();
    let failed = |in_flight: metrics::InFlight<'_>| {
        in_flight.finish(RequestLabels {
            webhook: webhook.as_str(),
            kind: "unknown",
            operation: "unknown",
            outcome: "error",
        });
    };
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .unwrap_or("");
    if !content_type.starts_with("application/json") {
        failed(in_flight);
        return plain(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            format!("content type must be application/json, found {content_type:?}\n"),
        );
    }
    // The closure only reads the policy and the body; a panic leaves nothing half-updated.
    let (policy, reviewer, view) = (&state.policy, state.reviewer, &*state.view);
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        reviewer(webhook, body, policy, view)
    }));
    match result {
        Ok(Ok(reviewed)) => {
            if reviewed.patch_bytes > 0 {
                state.metrics.patches.inc();
            }
            if let Some(guard) = reviewed.guard {
                state
                    .metrics
                    .guard_decisions
                    .get_or_create(&metrics::GuardLabels {
                        mode: guard.mode.as_str(),
                        outcome: guard.outcome,
                    })
                    .inc();
            }
            let latency = in_flight.finish(RequestLabels {
                webhook: webhook.as_str(),
                kind: metrics::kind_label(&reviewed.kind),
                operation: metrics::operation_label(&reviewed.operation),
                outcome: reviewed.outcome.as_str(),
            });
            tracing::info!(
                webhook = webhook.as_str(),
                uid = %reviewed.uid,
                kind = %reviewed.kind,
                namespace = %reviewed.namespace,
                name = %reviewed.name,
                operation = %reviewed.operation,
                outcome = reviewed.outcome.as_str(),
                patch_bytes = reviewed.patch_bytes,
                latency_us = latency.as_micros() as u64,
                "admission review"
            );
            Response::builder()
                .status(StatusCode::OK)
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from(reviewed.body))
                .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
        }
        Ok(Err(error)) if error.is_internal() => {
            failed(in_flight);
            tracing::error!(webhook = webhook.as_str(), %error, "internal error");
            plain(StatusCode::INTERNAL_SERVER_ERROR, format!("{error}\n"))
        }
        Ok(Err(error)) => {
            failed(in_flight);
            tracing::warn!(webhook = webhook.as_str(), %error, "bad admission request");
            plain(StatusCode::BAD_REQUEST, format!("{error}\n"))
        }
        Err(_) => {
            failed(in_flight);
            state.metrics.panics.inc();
            tracing::error!(webhook = webhook.as_str(), "panic while handling a request");
            plain(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal error; the webhook's failurePolicy applies\n".to_owned(),
            )
        }
    }
}

fn plain(status: StatusCode, message: String) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        message,
    )
        .into_response()
}

/// A running server: its bound addresses and a handle to stop it.
pub struct Running {
    pub addr: SocketAddr,
    pub admin_addr: SocketAddr,
    pub state: Arc<AppState>,
    shutdown: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Running {
    /// Starts draining (readiness false), waits the drain delay, stops accepting and waits
    /// for in-flight requests. What a SIGTERM does.
    pub async fn shutdown(self) {
        let _ = self.shutdown.send(true);
        let _ = self.task.await;
    }
}

/// Binds the listeners and starts serving. Returns once both ports accept connections (the
/// admin port's `/readyz` also waits for `view` to sync).
pub async fn start(
    config: ServerConfig,
    policy: Policy,
    cluster: ClusterSource,
) -> Result<Running, StartError> {
    let (view, cluster): (Arc<dyn ClusterView>, _) = match cluster {
        ClusterSource::Offline(view) => (Arc::new(view), None),
        ClusterSource::Cache(cache) => (Arc::new(cache.clone()), Some(cache)),
    };
    let (key, files) = match &config.certificate {
        CertificateSource::Files { files, poll } => {
            let (key, bytes) = files.load()?;
            (key, Some((files.clone(), bytes, *poll)))
        }
        CertificateSource::Generated(pair) => (
            tls::certified_key(
                pair.cert_pem.as_bytes(),
                pair.key_pem.as_bytes(),
                "<generated>",
                "<generated>",
            )?,
            None,
        ),
    };
    let metrics = Metrics::default();
    let store = CertificateStore::new(key, metrics.certificates.clone());
    let mut tls_config = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_cert_resolver(store.clone());
    tls_config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let acceptor = TlsAcceptor::from(Arc::new(tls_config));

    let state = Arc::new(AppState {
        policy,
        view,
        cluster,
        reviewer: admission::review,
        body_timeout: config.timeouts.body,
        ready: AtomicBool::new(false),
        draining: AtomicBool::new(false),
        metrics,
        certificates: Some(store.clone()),
    });
    let listener = TcpListener::bind(config.listen).await?;
    let admin_listener = TcpListener::bind(config.admin_listen).await?;
    let addr = listener.local_addr()?;
    let admin_addr = admin_listener.local_addr()?;

    let watcher = files.map(|(files, bytes, poll)| tokio::spawn(files.watch(store, bytes, poll)));
    let (shutdown, mut shutdown_rx) = tokio::sync::watch::channel(false);
    let admin = admin_router(state.clone());
    // The admin port outlives the drain: /readyz must answer 503 while the webhook drains.
    let (admin_stop, mut admin_shutdown) = tokio::sync::watch::channel(false);
    let admin_task = tokio::spawn(async move {
        let _ = axum::serve(admin_listener, admin)
            .with_graceful_shutdown(async move { stopped(&mut admin_shutdown).await })
            .await;
    });

    let router = webhook_router(state.clone());
    let serving_state = state.clone();
    let drain_delay = config.drain_delay;
    let handshake_timeout = config.timeouts.handshake;
    let shutdown_timeout = config.timeouts.shutdown;
    let task = tokio::spawn(async move {
        let graceful = hyper_util::server::graceful::GracefulShutdown::new();
        // Every connection task, so the ones still open at the shutdown timeout can be ended.
        let mut connections = tokio::task::JoinSet::new();
        let mut builder = auto::Builder::new(TokioExecutor::new());
        builder
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(config.timeouts.headers);
        // HTTP/2 has no header timeout: pings find dead or stalled peers instead.
        builder
            .http2()
            .timer(TokioTimer::new())
            .keep_alive_interval(Some(Duration::from_secs(20)))
            .keep_alive_timeout(Duration::from_secs(10));
        loop {
            tokio::select! {
                accepted = listener.accept() => {
                    let Some(stream) = accepted_or_pause(accepted).await else { continue };
                    spawn_connection(&mut connections, stream, &acceptor, &router, &builder, graceful.watcher(), handshake_timeout);
                }
                () = stopped(&mut shutdown_rx) => {
                    serving_state.draining.store(true, Ordering::Relaxed);
                    tracing::info!(drain_delay_s = drain_delay.as_secs_f64(), "draining");
                    // Keep accepting while endpoints are updated and the API server stops
                    // sending new requests here.
                    let deadline = tokio::time::sleep(drain_delay);
                    tokio::pin!(deadline);
                    loop {
                        tokio::select! {
                            _ = &mut deadline => break,
                            accepted = listener.accept() => {
                                let Some(stream) = accepted_or_pause(accepted).await else { continue };
                                spawn_connection(&mut connections, stream, &acceptor, &router, &builder, graceful.watcher(), handshake_timeout);
                            }
                        }
                    }
                    break;
                }
            }
        }
        drop(listener);
        if tokio::time::timeout(shutdown_timeout, graceful.shutdown())
            .await
            .is_err()
        {
            tracing::warn!(
                timeout_s = shutdown_timeout.as_secs_f64(),
                open = connections.len(),
                "requests still in flight at the shutdown timeout; closing their connections"
            );
        }
        // What is left: connections past the timeout, and handshakes not yet finished.
        connections.abort_all();
        while connections.join_next().await.is_some() {}
        if let Some(watcher) = watcher {
            watcher.abort();
        }
        let _ = admin_stop.send(true);
        let _ = admin_task.await;
        tracing::info!("stopped");
    });
    state.ready.store(true, Ordering::Relaxed);
    Ok(Running {
        addr,
        admin_addr,
        state,
        shutdown,
        task,
    })
}

/// The stream of an accepted connection, or, after an accept error (out of file descriptors,
/// say), a short pause so the loop does not spin, as axum::serve does.
async fn accepted_or_pause(
    accepted: std::io::Result<(tokio::net::TcpStream, SocketAddr)>,
) -> Option<tokio::net::TcpStream> {
    match accepted {
        Ok((stream, _peer)) => Some(stream),
        Err(error) => {
            tracing::warn!(%error, "accept failed; pausing 50 ms");
            tokio::time::sleep(Duration::from_millis(50)).await;
            None
        }
    }
}

async fn stopped(receiver: &mut tokio::sync::watch::Receiver<bool>) {
    // An error means the sender is gone: nobody can ask for a stop any more, so stop.
    let _ = receiver.wait_for(|stop| *stop).await;
}

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
    #[error("cannot bind: {0}")]
    Bind(#[from] std::io::Error),
}

/// One TLS connection: handshake within `handshake_timeout`, then HTTP/1.1 or HTTP/2 until
/// the client closes it or the server shuts down gracefully.
fn spawn_connection(
    connections: &mut tokio::task::JoinSet<()>,
    stream: tokio::net::TcpStream,
    acceptor: &TlsAcceptor,
    router: &Router,
    builder: &auto::Builder<TokioExecutor>,
    watcher: hyper_util::server::graceful::Watcher,
    handshake_timeout: Duration,
) {
    let acceptor = acceptor.clone();
    let service = TowerToHyperService::new(router.clone());
    let builder = builder.clone();
    // Reap the finished ones so the set stays as small as the open connections.
    while connections.try_join_next().is_some() {}
    connections.spawn(async move {
        let Ok(Ok(tls)) = tokio::time::timeout(handshake_timeout, acceptor.accept(stream)).await
        else {
            return;
        };
        let connection = builder
            .serve_connection(TokioIo::new(tls), service)
            .into_owned();
        let _ = watcher.watch(connection).await;
    });
}

/// Where `serve` writes the CA bundle of a generated certificate by default.
pub fn default_ca_bundle_path() -> PathBuf {
    std::env::temp_dir().join("gpu-guard-ca.pem")
}
