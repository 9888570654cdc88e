//! The webhook server: HTTPS `/mutate` and `/validate` (axum on hyper, rustls), and a plain-HTTP
//! admin port with `/healthz` and `/readyz`.
//!
//! Lifecycle: ready once the certificate is loaded and the listeners are bound. On SIGTERM or
//! SIGINT readiness turns false at once (the API server's endpoints drop the pod), the server
//! keeps serving for the drain delay, then stops accepting, lets in-flight requests finish and
//! returns. A second signal exits at once.

mod listener;
pub mod metrics;
mod routes;
pub mod run;
mod state;
pub mod tls;

use std::time::Duration;

pub use listener::{
    CertificateSource, RunningServer, ServerConfig, StartError, Timeouts, default_ca_bundle_path,
    start,
};
pub use routes::webhook_router;
pub use state::{AppState, ClusterSource};

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
