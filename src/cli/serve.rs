//! `gpu-guard serve`: the flags of the webhook server, resolved into
//! [`ServeSettings`](gpu_guard_webhook::server::run::ServeSettings).

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::{KubeconfigArgs, LogArgs, Report, finished};
use gpu_guard_core::policy::{self, Policy};
use gpu_guard_manifest as manifest;
use gpu_guard_webhook::server::run::{ServeSettings, serve};

#[derive(Debug, Args, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ServeArgs {
    /// Address of the HTTPS webhook listener.
    #[arg(long, env = "GPU_GUARD_LISTEN", default_value_t = std::net::SocketAddr::from(([0, 0, 0, 0], gpu_guard_core::wellknown::WEBHOOK_PORT)))]
    pub listen: std::net::SocketAddr,
    /// Address of the plain-HTTP admin listener (/healthz, /readyz).
    #[arg(long, env = "GPU_GUARD_ADMIN_LISTEN", default_value_t = std::net::SocketAddr::from(([0, 0, 0, 0], gpu_guard_core::wellknown::SERVE_ADMIN_PORT)))]
    pub admin_listen: std::net::SocketAddr,
    /// PEM certificate chain (leaf first). Re-read when it changes.
    #[arg(long, env = "GPU_GUARD_TLS_CERT_FILE", requires = "tls_key_file")]
    pub tls_cert_file: Option<PathBuf>,
    /// PEM private key of the certificate. Re-read when it changes.
    #[arg(long, env = "GPU_GUARD_TLS_KEY_FILE", requires = "tls_cert_file")]
    pub tls_key_file: Option<PathBuf>,
    /// Seconds between checks of the certificate files.
    #[arg(long, env = "GPU_GUARD_CERT_POLL_SECONDS", default_value_t = 5)]
    pub cert_poll_seconds: u64,
    /// Extra DNS name for a generated certificate (e.g. gpu-guard.gpu-guard.svc). Repeatable.
    #[arg(long = "dns-name", env = "GPU_GUARD_DNS_NAMES", value_delimiter = ',')]
    pub dns_names: Vec<String>,
    /// Where a generated certificate's CA bundle is written.
    #[arg(long, env = "GPU_GUARD_CA_BUNDLE_FILE")]
    pub ca_bundle_file: Option<PathBuf>,
    #[command(flatten)]
    #[serde(flatten)]
    pub log: LogArgs,
    /// Seconds to keep serving after SIGTERM before closing the listener.
    #[arg(long, env = "GPU_GUARD_DRAIN_DELAY_SECONDS", default_value_t = 5)]
    pub drain_delay_seconds: u64,
    /// Run without an API server: PriorityClasses and GPU nodes come from the policy file's
    /// guard.offline section. Without this flag and without --kubeconfig, the cluster
    /// configuration is inferred (KUBECONFIG, ~/.kube/config, in-cluster); when there is none,
    /// `serve` runs as with --no-cluster and says so in the log.
    #[arg(long, env = "GPU_GUARD_NO_CLUSTER", conflicts_with = "kubeconfig")]
    pub no_cluster: bool,
    #[command(flatten)]
    #[serde(flatten)]
    pub kube: KubeconfigArgs,
    /// Seconds the cluster caches (PriorityClasses, Nodes, DRA objects) may take to sync at start before a warning is
    /// logged (readiness stays false until they have synced).
    #[arg(long, env = "GPU_GUARD_CACHE_SYNC_WARN_SECONDS", default_value_t = 30)]
    pub cache_sync_warn_seconds: u64,
    /// Print the effective configuration (flags, environment, policy source) and exit.
    #[arg(long)]
    #[serde(skip)]
    pub print_config: bool,
}

/// Runs `serve`, or prints its effective configuration (`--print-config`).
pub(super) fn run(
    args: &ServeArgs,
    policy_file: Option<&std::path::Path>,
    policy: Policy,
) -> Report {
    if args.print_config {
        return Report {
            stdout: manifest::to_yaml(&serde_json::json!({
                "serve": args,
                "policy": policy_file.map_or_else(
                    || policy::EMBEDDED_NAME.to_owned(),
                    |p| p.display().to_string(),
                ),
            })),
            ..Report::default()
        };
    }
    let _log = args.log.init();
    let settings = ServeSettings {
        listen: args.listen,
        admin_listen: args.admin_listen,
        tls_files: args.tls_cert_file.clone().zip(args.tls_key_file.clone()),
        cert_poll: Duration::from_secs(args.cert_poll_seconds),
        dns_names: args.dns_names.clone(),
        ca_bundle_file: args.ca_bundle_file.clone(),
        drain_delay: Duration::from_secs(args.drain_delay_seconds),
        no_cluster: args.no_cluster,
        kubeconfig: args.kube.kubeconfig.clone(),
        cache_sync_warn: Duration::from_secs(args.cache_sync_warn_seconds),
    };
    finished(serve(&settings, policy))
}
