//! Building a Kubernetes client: from a kubeconfig file given on the command line, or inferred
//! the way kubectl and client-go do (`KUBECONFIG`, `~/.kube/config`, then in-cluster).

use std::fmt;
use std::path::{Path, PathBuf};

use kube::config::{InferConfigError, KubeConfigOptions, Kubeconfig, KubeconfigError};
use kube::{Client, Config};

/// Why no Kubernetes client could be made. Each message says what is wrong and how to fix it,
/// naming only `--kubeconfig`, which every command that makes a client has; a command with
/// another way out (`serve --no-cluster`) adds it.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// The kubeconfig file given (`--kubeconfig`) cannot be read.
    #[error(
        "cannot read the kubeconfig {}: {source}; check the path given with --kubeconfig",
        path.display()
    )]
    KubeconfigRead {
        /// The file.
        path: PathBuf,
        /// Why it cannot be read.
        #[source]
        source: std::io::Error,
    },
    /// The kubeconfig file given (`--kubeconfig`) was read but does not parse, or its current
    /// context does not lead to a usable cluster and user.
    #[error(
        "the kubeconfig {} cannot be used: {source}; fix the file (`kubectl --kubeconfig {} \
         config view` shows what it holds) or pass another one with --kubeconfig",
        path.display(),
        path.display()
    )]
    KubeconfigInvalid {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        #[source]
        source: KubeconfigError,
    },
    /// No `--kubeconfig`: a kubeconfig was found (`KUBECONFIG` or `~/.kube/config`) but cannot
    /// be used, and the in-cluster configuration is not available either.
    #[error(
        "the kubeconfig {found} cannot be used and this is not running in a cluster: {source}; \
         fix it, or pass another one with --kubeconfig"
    )]
    FoundKubeconfigInvalid {
        /// Where the kubeconfig was found.
        found: ConfigSource,
        /// What kube says of the kubeconfig and of the in-cluster configuration.
        #[source]
        source: InferConfigError,
    },
    /// No `--kubeconfig` and no kubeconfig found; `KUBERNETES_SERVICE_HOST` is set but the
    /// in-cluster configuration (service account token and CA) cannot be loaded.
    #[error(
        "running in a cluster (KUBERNETES_SERVICE_HOST is set) but the in-cluster configuration \
         cannot be loaded: {source}; mount the service account token \
         (automountServiceAccountToken: true), or pass a kubeconfig with --kubeconfig"
    )]
    InCluster {
        /// What kube says of the in-cluster configuration (and of the missing kubeconfig).
        #[source]
        source: InferConfigError,
    },
    /// No `--kubeconfig`, no kubeconfig found and not running in a cluster.
    #[error(
        "no kubeconfig found (KUBECONFIG is unset and there is no ~/.kube/config) and not running \
         in a cluster (KUBERNETES_SERVICE_HOST is unset): pass a kubeconfig with --kubeconfig"
    )]
    NoConfig {
        /// kube's own account of what it tried.
        #[source]
        source: InferConfigError,
    },
    /// The configuration loaded but no client can be built from it (TLS setup, for example).
    #[error("cannot make a Kubernetes client from the configuration: {source}")]
    Client {
        /// kube's error.
        #[source]
        source: kube::Error,
    },
}

/// Where a cluster configuration would come from without `--kubeconfig`, in the order kube
/// (like kubectl) looks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConfigSource {
    /// The files named by the `KUBECONFIG` environment variable (merged, first wins).
    KubeconfigEnv(Vec<PathBuf>),
    /// `~/.kube/config`.
    DefaultKubeconfig(PathBuf),
    /// The in-cluster configuration: `KUBERNETES_SERVICE_HOST` and `KUBERNETES_SERVICE_PORT` are
    /// set (the service account token and CA are read when the client is made).
    InCluster,
}

impl fmt::Display for ConfigSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::KubeconfigEnv(paths) => {
                let paths: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
                write!(f, "named by KUBECONFIG ({})", paths.join(", "))
            }
            Self::DefaultKubeconfig(path) => write!(f, "{}", path.display()),
            Self::InCluster => f.write_str("in-cluster configuration"),
        }
    }
}

/// Where a configuration would be looked for without `--kubeconfig` (see [`ConfigSource`]), or
/// `None` when there is none: no `KUBECONFIG`, no `~/.kube/config`, not in a cluster. Cheap: it
/// looks at environment variables and whether a file exists, and parses nothing; whether the
/// configuration is usable is for [`client`] (or [`config_available`]) to find out.
pub fn config_source() -> Option<ConfigSource> {
    if let Some(value) = std::env::var_os("KUBECONFIG") {
        let paths: Vec<PathBuf> = std::env::split_paths(&value)
            .filter(|path| !path.as_os_str().is_empty())
            .collect();
        if !paths.is_empty() {
            return Some(ConfigSource::KubeconfigEnv(paths));
        }
    }
    if let Some(home) = std::env::home_dir() {
        let path = home.join(".kube").join("config");
        if path.is_file() {
            return Some(ConfigSource::DefaultKubeconfig(path));
        }
    }
    let in_cluster = ["KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"]
        .iter()
        .all(|name| std::env::var_os(name).is_some_and(|value| !value.is_empty()));
    in_cluster.then_some(ConfigSource::InCluster)
}

/// Whether a usable cluster configuration can be inferred without `--kubeconfig` (what
/// [`client`]`(None)` would use): reads and checks the kubeconfig or the in-cluster files, but
/// makes no API call.
pub async fn config_available() -> bool {
    Config::infer().await.is_ok()
}

/// A Kubernetes client: from the kubeconfig file `kubeconfig` (its current context), or, with
/// `None`, inferred like kubectl does: `KUBECONFIG`, `~/.kube/config`, then the in-cluster
/// service account. No API call is made here; a wrong server or wrong credentials show up when
/// the caches list (see [`crate::cluster::ClusterCache::wait_synced`]).
///
/// Must be called within a Tokio runtime (the client spawns its request buffer on it).
pub async fn client(kubeconfig: Option<&Path>) -> Result<Client, ClusterError> {
    let config = config(kubeconfig).await?;
    Client::try_from(config).map_err(|source| ClusterError::Client { source })
}

/// The configuration [`client`] builds its client from, for callers that need to adjust it
/// (the controller makes a second client without kube's default retry of 429 answers).
pub async fn config(kubeconfig: Option<&Path>) -> Result<Config, ClusterError> {
    match kubeconfig {
        Some(path) => config_from_file(path).await,
        None => inferred_config().await,
    }
}

async fn config_from_file(path: &Path) -> Result<Config, ClusterError> {
    let kubeconfig = Kubeconfig::read_from(path).map_err(|source| match source {
        KubeconfigError::ReadConfig(source, _) => ClusterError::KubeconfigRead {
            path: path.to_owned(),
            source,
        },
        source => ClusterError::KubeconfigInvalid {
            path: path.to_owned(),
            source,
        },
    })?;
    let mut config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|source| ClusterError::KubeconfigInvalid {
            path: path.to_owned(),
            source,
        })?;
    // What `Config::infer` does too: kube's documented debugging overrides (KUBE_RS_DEBUG_*).
    config.apply_debug_overrides();
    Ok(config)
}

async fn inferred_config() -> Result<Config, ClusterError> {
    Config::infer()
        .await
        .map_err(|source| match config_source() {
            Some(ConfigSource::InCluster) => ClusterError::InCluster { source },
            Some(found) => ClusterError::FoundKubeconfigInvalid { found, source },
            None => ClusterError::NoConfig { source },
        })
}
