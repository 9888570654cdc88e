//! The floor of the load test (`perf/load/run.sh`): the least a webhook server can do on
//! gpu-guard's own stack (tokio, hyper with HTTP/1.1 and HTTP/2, axum, rustls with ring,
//! mimalloc). It accepts, handshakes, reads the body, parses the whole AdmissionReview into a
//! `serde_json::Value` (as a webhook on kube-core's `AdmissionReview<DynamicObject>` would) and
//! answers a fixed allow with its uid. What gpu-guard costs beyond this is what it does.
//!
//! `floor --listen 127.0.0.1:8444 --cert tls.crt --key tls.key [--server-settings]`
//!
//! `--server-settings` adds what gpu-guard's listener puts around a connection and a request,
//! without its work (src/server/listener.rs and routes.rs): the HTTP/1.1 header timeout and the
//! HTTP/2 keep-alive pings on hyper's timer, the handshake and body timeouts, the
//! graceful-shutdown watcher and the set of connections. Beside the plain floor it tells what
//! gpu-guard's server costs from what its review costs.
//!
//! Built by `cargo build --release -p gpu-guard-perf --bin floor`; `cargo test` does not build it.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::Value;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

async fn allow(body: Bytes) -> Response {
    match serde_json::from_slice::<Value>(&body) {
        Ok(review) => (
            [(header::CONTENT_TYPE, "application/json")],
            format!(
                r#"{{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{{"uid":{},"allowed":true}}}}"#,
                review["request"]["uid"]
            ),
        )
            .into_response(),
        Err(error) => (StatusCode::BAD_REQUEST, format!("{error}\n")).into_response(),
    }
}

/// gpu-guard's `HANDSHAKE_TIMEOUT`, `HEADER_TIMEOUT` and `BODY_TIMEOUT` (src/server/mod.rs).
const TIMEOUT: Duration = Duration::from_secs(10);
/// gpu-guard's `MAX_BODY_BYTES`.
const MAX_BODY_BYTES: usize = 7 * 1024 * 1024;

/// [`allow`] after reading the body within [`TIMEOUT`], as gpu-guard's routes do.
async fn allow_within(request: axum::extract::Request) -> Response {
    let body = axum::body::to_bytes(request.into_body(), MAX_BODY_BYTES);
    match tokio::time::timeout(TIMEOUT, body).await {
        Ok(Ok(body)) => allow(body).await,
        Ok(Err(_)) => StatusCode::PAYLOAD_TOO_LARGE.into_response(),
        Err(_) => StatusCode::REQUEST_TIMEOUT.into_response(),
    }
}

fn flag(args: &[String], name: &str) -> String {
    args.iter()
        .position(|arg| arg == name)
        .and_then(|at| args.get(at + 1))
        .cloned()
        .unwrap_or_else(|| {
            eprintln!("usage: floor --listen ADDR --cert FILE --key FILE (missing {name})");
            std::process::exit(2)
        })
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let listen: SocketAddr = flag(&args, "--listen").parse().expect("--listen ADDR:PORT");
    let chain = CertificateDer::pem_file_iter(flag(&args, "--cert"))
        .expect("--cert: a PEM file")
        .collect::<Result<Vec<_>, _>>()
        .expect("--cert: PEM certificates");
    let key = PrivateKeyDer::from_pem_file(flag(&args, "--key")).expect("--key: a PEM key");
    rustls::crypto::ring::default_provider()
        .install_default()
        .expect("one crypto provider");
    let mut tls = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .expect("a certificate and its key");
    tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
    let settings = args.iter().any(|arg| arg == "--server-settings");
    let router = if settings {
        Router::new()
            .route("/mutate", post(allow_within))
            .route("/validate", post(allow_within))
    } else {
        Router::new()
            .route("/mutate", post(allow))
            .route("/validate", post(allow))
    };

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(listen).await.expect("bind");
        eprintln!(
            "floor: serving on {}",
            listener.local_addr().expect("bound")
        );
        let mut builder = auto::Builder::new(TokioExecutor::new());
        if settings {
            builder
                .http1()
                .timer(TokioTimer::new())
                .header_read_timeout(TIMEOUT);
            builder
                .http2()
                .timer(TokioTimer::new())
                .keep_alive_interval(Some(Duration::from_secs(20)))
                .keep_alive_timeout(Duration::from_secs(10));
        }
        let graceful = hyper_util::server::graceful::GracefulShutdown::new();
        let mut connections = tokio::task::JoinSet::new();
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let _ = stream.set_nodelay(true);
            let (acceptor, builder) = (acceptor.clone(), builder.clone());
            let service = TowerToHyperService::new(router.clone());
            if !settings {
                tokio::spawn(async move {
                    if let Ok(tls) = acceptor.accept(stream).await {
                        let _ = builder.serve_connection(TokioIo::new(tls), service).await;
                    }
                });
                continue;
            }
            // As gpu-guard's `spawn_connection` (src/server/listener.rs) does: keep the two alike.
            while connections.try_join_next().is_some() {}
            let watcher = graceful.watcher();
            connections.spawn(async move {
                let Ok(Ok(tls)) = tokio::time::timeout(TIMEOUT, acceptor.accept(stream)).await
                else {
                    return;
                };
                let connection = builder
                    .serve_connection(TokioIo::new(tls), service)
                    .into_owned();
                let _ = watcher.watch(connection).await;
            });
        }
    });
}
