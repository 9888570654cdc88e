//! The floor of the load test (`benches/load/run.sh`): the least a webhook server can do on
//! gpu-guard's own stack (tokio, hyper with HTTP/1.1 and HTTP/2, axum, rustls with ring,
//! mimalloc). It accepts, handshakes, reads the body, parses the whole AdmissionReview into a
//! `serde_json::Value` (as a webhook on kube-core's `AdmissionReview<DynamicObject>` would) and
//! answers a fixed allow with its uid. What gpu-guard costs beyond this is what it does.
//!
//! `floor --listen 127.0.0.1:8444 --cert tls.crt --key tls.key`
//!
//! Built as the example `floor` (`cargo build --release --example floor`): compiled by
//! `cargo test`, never run by it.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use hyper_util::rt::{TokioExecutor, TokioIo};
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
    let router = Router::new()
        .route("/mutate", post(allow))
        .route("/validate", post(allow));

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
        let builder = auto::Builder::new(TokioExecutor::new());
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let _ = stream.set_nodelay(true);
            let (acceptor, builder) = (acceptor.clone(), builder.clone());
            let service = TowerToHyperService::new(router.clone());
            tokio::spawn(async move {
                if let Ok(tls) = acceptor.accept(stream).await {
                    let _ = builder.serve_connection(TokioIo::new(tls), service).await;
                }
            });
        }
    });
}
