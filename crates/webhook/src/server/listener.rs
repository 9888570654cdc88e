//! The listeners: HTTPS for the webhooks (rustls, HTTP/1.1 and HTTP/2, slow-client timeouts),
//! plain HTTP for the admin port, and the drain on shutdown.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use super::metrics::Metrics;
use super::routes::webhook_router;
use super::state::{AppState, ClusterSource};
use super::tls::{self, CertificateFiles, CertificateStore};
use super::{BODY_TIMEOUT, HANDSHAKE_TIMEOUT, HEADER_TIMEOUT, SHUTDOWN_TIMEOUT};
use gpu_guard_core::guard::ClusterView;
use gpu_guard_core::policy::Policy;
use gpu_guard_runtime::process::{admin_router, set_nodelay, without_nagle};

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

/// A running server: its bound addresses and a handle to stop it.
pub struct RunningServer {
    pub addr: SocketAddr,
    pub admin_addr: SocketAddr,
    pub state: Arc<AppState>,
    shutdown: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl RunningServer {
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
) -> Result<RunningServer, StartError> {
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
        body_timeout: config.timeouts.body,
        ready: AtomicBool::new(false),
        draining: AtomicBool::new(false),
        metrics,
        certificates: Some(store.clone()),
        unreadable_memories: Default::default(),
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
        let _ = axum::serve(without_nagle(admin_listener), admin)
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
    Ok(RunningServer {
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
    set_nodelay(&stream);
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
