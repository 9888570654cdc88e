//! `gpu-guard serve`: logging, the certificate source, the runtime, signals.

use std::time::Duration;

use base64::Engine as _;
use tracing_subscriber::EnvFilter;

use super::{CertificateSource, ClusterSource, ServerConfig, start, tls};
use crate::cli::{LogFormat, Report, ServeArgs};
use crate::cluster;
use crate::policy::Policy;

/// Runs the server until a signal stops it.
pub fn serve(args: &ServeArgs, policy: Policy) -> Report {
    init_logging(args.log_format, &args.log_level);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => return failed(format!("cannot start the async runtime: {error}")),
    };
    let certificate = match certificate_source(args) {
        Ok(source) => source,
        Err(message) => return failed(message),
    };
    let config = ServerConfig {
        listen: args.listen,
        admin_listen: args.admin_listen,
        certificate,
        drain_delay: Duration::from_secs(args.drain_delay_seconds),
        timeouts: super::Timeouts::default(),
    };
    runtime.block_on(async move {
        let cluster = match cluster_source(args, &policy).await {
            Ok(cluster) => cluster,
            Err(message) => return failed(message),
        };
        if let ClusterSource::Cache(cache) = &cluster {
            let cache = cache.clone();
            let warn_after = Duration::from_secs(args.cache_sync_warn_seconds.max(1));
            tokio::spawn(async move {
                if !cache.wait_synced(warn_after).await {
                    tracing::warn!(
                        waited_s = warn_after.as_secs(),
                        "the PriorityClass and Node caches have not synced yet; /readyz stays \
                         false until they do (check the API server address and RBAC: get, list \
                         and watch on priorityclasses and nodes)"
                    );
                }
            });
        }
        let running = match start(config, policy, cluster).await {
            Ok(running) => running,
            Err(error) => return failed(format!("cannot start: {error}")),
        };
        tracing::info!(webhook = %running.addr, admin = %running.admin_addr, "serving");
        wait_for_signal().await;
        tracing::info!("signal received: draining (a second signal exits at once)");
        shut_down_or_exit_at_second_signal(running.shutdown()).await
    })
}

/// Runs `shutdown` to its end (exit 0), unless a second signal comes first (exit 130, at once).
/// Shared by `serve` and `controller`.
pub(crate) async fn shut_down_or_exit_at_second_signal(
    shutdown: impl std::future::Future<Output = ()>,
) -> Report {
    tokio::select! {
        () = shutdown => Report::default(),
        () = wait_for_signal() => {
            tracing::warn!("second signal: exiting at once");
            Report { exit_code: 130, ..Report::default() }
        }
    }
}

/// The guard's view of the cluster: `--no-cluster`, `--kubeconfig`, or inferred (and offline,
/// with a warning, when no cluster is configured at all).
async fn cluster_source(args: &ServeArgs, policy: &Policy) -> Result<ClusterSource, String> {
    if args.no_cluster {
        tracing::info!("--no-cluster: PriorityClasses and GPU nodes come from the policy file");
        return Ok(ClusterSource::offline(policy));
    }
    if args.kubeconfig.is_none() && cluster::config_source().is_none() {
        tracing::warn!(
            "no cluster configured (no --kubeconfig, KUBECONFIG, ~/.kube/config or in-cluster \
             service account): running as with --no-cluster; PriorityClasses and GPU nodes \
             come from the policy file"
        );
        return Ok(ClusterSource::offline(policy));
    }
    let client = cluster::client(args.kubeconfig.as_deref())
        .await
        .map_err(|error| error.to_string())?;
    tracing::info!("watching PriorityClasses and Nodes");
    Ok(ClusterSource::Cache(cluster::ClusterCache::start(client)))
}

/// A start-up failure: logged, printed, exit 1. Shared by `serve` and `controller`.
pub(crate) fn failed(message: String) -> Report {
    tracing::error!("{message}");
    Report {
        stderr: format!("error: {message}\n"),
        exit_code: 1,
        ..Report::default()
    }
}

fn certificate_source(args: &ServeArgs) -> Result<CertificateSource, String> {
    if let (Some(cert), Some(key)) = (&args.tls_cert_file, &args.tls_key_file) {
        return Ok(CertificateSource::Files {
            files: tls::CertificateFiles {
                cert: cert.clone(),
                key: key.clone(),
            },
            poll: Duration::from_secs(args.cert_poll_seconds.max(1)),
        });
    }
    let pair = tls::generate_self_signed(&args.dns_names).map_err(|e| e.to_string())?;
    let path = args
        .ca_bundle_file
        .clone()
        .unwrap_or_else(super::default_ca_bundle_path);
    std::fs::write(&path, &pair.ca_pem)
        .map_err(|e| format!("cannot write the CA bundle to {}: {e}", path.display()))?;
    tracing::info!(
        ca_bundle_file = %path.display(),
        ca_bundle = %base64::engine::general_purpose::STANDARD.encode(&pair.ca_pem),
        "no certificate given: serving a self-signed one; trust the CA bundle (caBundle) above"
    );
    Ok(CertificateSource::Generated(pair))
}

/// Logs to stderr, as text or one JSON object a line, filtered by `level` (a level or a
/// tracing filter; `info` when it does not parse). Shared by `serve` and `controller`.
pub(crate) fn init_logging(format: LogFormat, level: &str) {
    let filter = EnvFilter::try_new(level).unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    // Ignore the error of a second initialisation (tests run several servers in one process).
    let _ = match format {
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
        LogFormat::Text => builder.try_init(),
    };
}

/// Returns at SIGTERM or SIGINT. Shared by `serve` and `controller`.
pub(crate) async fn wait_for_signal() {
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
