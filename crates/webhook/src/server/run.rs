//! `gpu-guard serve`: the certificate source, the guard's cluster view, the server, signals.
//! The command line resolves its flags into [`ServeSettings`]; logging is set up before.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use base64::Engine as _;

use super::{CertificateSource, ClusterSource, ServerConfig, StartError, start, tls};
use gpu_guard_core::policy::Policy;
use gpu_guard_runtime::cluster::{self, ClusterError};
use gpu_guard_runtime::process::{self, ProcessError, Stopped};

/// What `serve` runs with, resolved from flags and environment.
#[derive(Clone, Debug)]
pub struct ServeSettings {
    pub listen: SocketAddr,
    pub admin_listen: SocketAddr,
    /// PEM certificate chain and key, re-read when they change; `None`: a generated pair.
    pub tls_files: Option<(PathBuf, PathBuf)>,
    pub cert_poll: Duration,
    /// Extra DNS names of a generated certificate.
    pub dns_names: Vec<String>,
    /// Where a generated certificate's CA bundle is written (default: the temp dir).
    pub ca_bundle_file: Option<PathBuf>,
    pub drain_delay: Duration,
    /// Run on the policy's offline facts, with no API server.
    pub no_cluster: bool,
    /// The kubeconfig to watch PriorityClasses and Nodes with (`None`: inferred).
    pub kubeconfig: Option<PathBuf>,
    /// How long the caches may take to sync before a warning is logged.
    pub cache_sync_warn: Duration,
}

/// Why `serve` could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Process(#[from] ProcessError),
    /// A cluster is configured but no client can be made for it.
    #[error(
        "{source}; or run without a cluster with --no-cluster (PriorityClasses and GPU nodes \
         from the policy file's guard.offline)"
    )]
    Cluster {
        #[source]
        source: ClusterError,
    },
    /// No certificate files given, and none could be generated.
    #[error(transparent)]
    Generate(tls::TlsError),
    #[error("cannot write the CA bundle to {}: {source}", path.display())]
    CaBundle {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot start: {source}")]
    Start {
        #[source]
        source: StartError,
    },
}

/// Runs the server until a signal stops it; `Err` is a start-up failure, already logged.
pub fn serve(settings: &ServeSettings, policy: Policy) -> Result<Stopped, ServeError> {
    run(settings, policy).inspect_err(|error| tracing::error!("{error}"))
}

fn run(settings: &ServeSettings, policy: Policy) -> Result<Stopped, ServeError> {
    let runtime = process::runtime(None)?;
    let certificate = certificate_source(settings)?;
    let config = ServerConfig {
        listen: settings.listen,
        admin_listen: settings.admin_listen,
        certificate,
        drain_delay: settings.drain_delay,
        timeouts: super::Timeouts::default(),
    };
    runtime.block_on(async move {
        let mut signals = process::Signals::install()?;
        let cluster = cluster_source(settings, &policy).await?;
        if let ClusterSource::Cache(cache) = &cluster {
            let cache = cache.clone();
            let warn_after = settings.cache_sync_warn.max(Duration::from_secs(1));
            tokio::spawn(async move {
                if !cache.wait_synced(warn_after).await {
                    tracing::warn!(
                        waited_s = warn_after.as_secs(),
                        "the cluster caches (PriorityClasses, Nodes, ResourceClaimTemplates, \
                         ResourceClaims, DeviceClasses) have not synced yet; /readyz stays \
                         false until they do (check the API server address and RBAC: get, list \
                         and watch on each of them)"
                    );
                }
            });
        }
        let running = start(config, policy, cluster)
            .await
            .map_err(|source| ServeError::Start { source })?;
        tracing::info!(webhook = %running.addr, admin = %running.admin_addr, "serving");
        signals.next().await;
        tracing::info!("signal received: draining (a second signal exits at once)");
        Ok(process::shut_down_or_exit_at_second_signal(&mut signals, running.shutdown()).await)
    })
}

/// The guard's view of the cluster: `--no-cluster`, `--kubeconfig`, or inferred (and offline,
/// with a warning, when no cluster is configured at all).
async fn cluster_source(
    settings: &ServeSettings,
    policy: &Policy,
) -> Result<ClusterSource, ServeError> {
    if settings.no_cluster {
        tracing::info!("--no-cluster: PriorityClasses and GPU nodes come from the policy file");
        return Ok(ClusterSource::offline(policy));
    }
    if settings.kubeconfig.is_none() && cluster::config_source().is_none() {
        tracing::warn!(
            "no cluster configured (no --kubeconfig, KUBECONFIG, ~/.kube/config or in-cluster \
             service account): running as with --no-cluster; PriorityClasses and GPU nodes \
             come from the policy file"
        );
        return Ok(ClusterSource::offline(policy));
    }
    let client = cluster::client(settings.kubeconfig.as_deref())
        .await
        .map_err(|source| ServeError::Cluster { source })?;
    tracing::info!("watching PriorityClasses and Nodes");
    Ok(ClusterSource::Cache(cluster::ClusterCache::start(client)))
}

fn certificate_source(settings: &ServeSettings) -> Result<CertificateSource, ServeError> {
    if let Some((cert, key)) = &settings.tls_files {
        return Ok(CertificateSource::Files {
            files: tls::CertificateFiles {
                cert: cert.clone(),
                key: key.clone(),
            },
            poll: settings.cert_poll.max(Duration::from_secs(1)),
        });
    }
    let pair = tls::generate_self_signed(&settings.dns_names).map_err(ServeError::Generate)?;
    let path = settings
        .ca_bundle_file
        .clone()
        .unwrap_or_else(super::default_ca_bundle_path);
    std::fs::write(&path, &pair.ca_pem).map_err(|source| ServeError::CaBundle {
        path: path.clone(),
        source,
    })?;
    tracing::info!(
        ca_bundle_file = %path.display(),
        ca_bundle = %base64::engine::general_purpose::STANDARD.encode(&pair.ca_pem),
        "no certificate given: serving a self-signed one; trust the CA bundle (caBundle) above"
    );
    Ok(CertificateSource::Generated(pair))
}
