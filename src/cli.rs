//! The command line: `gpu-guard serve | mutate | check | generate | policy`. Each command is a function that
//! returns the text to print and an exit code, so tests can call them without a process.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use k8s_openapi::api::batch::v1::{Job, JobSpec, PodFailurePolicy};
use k8s_openapi::api::core::v1::{Container, PodSpec, PodTemplateSpec, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde_json::Value;

use std::time::Duration;

use crate::check;
use crate::manifest::{self, Document, Format};
use crate::mutate::{self, SkipReason};
use crate::object;
use crate::policy::{self, Policy, PolicyError};

/// Keeps AI/ML batch Jobs on Kubernetes alive through GPU and other device failures.
///
/// The same engine runs in the mutating admission webhook and in these offline commands, so a
/// manifest mutated in CI is exactly what the webhook would admit.
#[derive(Debug, Parser)]
#[command(name = "gpu-guard", version, propagate_version = true)]
pub struct Cli {
    #[command(flatten)]
    pub global: GlobalArgs,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Args)]
pub struct GlobalArgs {
    /// Policy file to use instead of the embedded default (policies/default.yaml).
    #[arg(long, global = true, env = "GPU_GUARD_POLICY", value_name = "FILE")]
    pub policy: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the admission webhooks: HTTPS /mutate and /validate, plain-HTTP /healthz and /readyz.
    ///
    /// Without --tls-cert-file/--tls-key-file a throw-away CA and serving certificate are made
    /// in memory (for localhost, 127.0.0.1 and every --dns-name); the CA bundle is written to
    /// --ca-bundle-file and logged base64-encoded, ready for a webhook's caBundle. Certificate
    /// files are re-read when they change. SIGTERM: readiness turns false, requests are served
    /// for --drain-delay, in-flight requests finish, exit 0; a second signal exits at once.
    Serve(ServeArgs),
    /// Mutate Jobs (and the jobTemplate of CronJobs) in manifests, as the webhook would.
    ///
    /// Reads YAML or JSON files, multi-document streams, directories (every .yaml, .yml and
    /// .json file below them) and List objects; `-f -` reads stdin. Every other document passes
    /// through unchanged, in order. Warnings and a summary of the changes go to stderr.
    ///
    /// Exit status: 0 on success, 1 when an input could not be read or decoded (its documents
    /// are still written, unchanged), 2 on usage errors.
    ///
    /// Example: gpu-guard mutate -f k8s/ | kubectl apply -f -
    Mutate(MutateArgs),
    /// Run the GPU-node priority guard on manifests, as the validating webhook would, and say
    /// what `mutate` would change.
    ///
    /// Reads the same inputs as `mutate`. PriorityClass and Node objects among them, the policy
    /// file's guard.offline section and --priority-class flags supply the cluster facts; with
    /// --kubeconfig they are read from the cluster instead. Each Pod and pod-template owner is
    /// named (file, document, kind, namespace/name) with its verdict and every reason.
    ///
    /// Exit status: 0 when nothing would be denied, 1 when something would be, 2 on usage or
    /// input errors.
    ///
    /// Example: gpu-guard check -f k8s/ --priority-class high-priority=1000000
    Check(CheckArgs),
    /// Print generated configuration.
    #[command(subcommand)]
    Generate(GenerateCommand),
    /// Check or show a policy file.
    #[command(subcommand)]
    Policy(PolicyCommand),
    /// Write a development CA and a serving certificate for the webhook Service (and localhost).
    ///
    /// Writes ca.crt, tls.crt and tls.key (mode 0600) for gpu-guard.<namespace>.svc,
    /// its .cluster.local form, localhost and 127.0.0.1. For development only: production gets
    /// its certificates from cert-manager (webhook-config/overlays/cert-manager).
    Certs(CertsArgs),
    /// Run the node health controller and device-failure pod watcher.
    ///
    /// Taints GPU nodes whose devices degrade (gpu-guard.io/device-degraded) so retried pods
    /// land elsewhere, removes its own taint when they recover, and marks pods hit by a device
    /// failure with the condition gpu-guard.io/DeviceFailure=True (optionally evicting them),
    /// as the policy file's controller section says. Only the holder of the leader Lease acts.
    /// Plain-HTTP /healthz, /readyz and /metrics on --admin-listen. SIGTERM: stop after the
    /// pass in progress, release the Lease, exit 0.
    Controller(ControllerArgs),
}

#[derive(Debug, Args)]
pub struct CertsArgs {
    /// Directory to write ca.crt, tls.crt and tls.key into (created if missing).
    #[arg(long, value_name = "DIR")]
    pub out_dir: PathBuf,
    /// The namespace of the webhook Service.
    #[arg(long, default_value = "gpu-guard")]
    pub namespace: String,
    /// The name of the webhook Service.
    #[arg(long, default_value = "gpu-guard")]
    pub service_name: String,
    /// Replace existing files.
    #[arg(long)]
    pub force: bool,
}

#[derive(Debug, Args, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ServeArgs {
    /// Address of the HTTPS webhook listener.
    #[arg(long, env = "GPU_GUARD_LISTEN", default_value_t = std::net::SocketAddr::from(([0, 0, 0, 0], crate::server::WEBHOOK_PORT)))]
    pub listen: std::net::SocketAddr,
    /// Address of the plain-HTTP admin listener (/healthz, /readyz).
    #[arg(long, env = "GPU_GUARD_ADMIN_LISTEN", default_value_t = std::net::SocketAddr::from(([0, 0, 0, 0], crate::server::ADMIN_PORT)))]
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
    /// Log format.
    #[arg(long, env = "GPU_GUARD_LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: LogFormat,
    /// Log level or tracing filter (e.g. info, debug, gpu_guard=debug).
    #[arg(long, env = "GPU_GUARD_LOG_LEVEL", default_value = "info")]
    pub log_level: String,
    /// Seconds to keep serving after SIGTERM before closing the listener.
    #[arg(long, env = "GPU_GUARD_DRAIN_DELAY_SECONDS", default_value_t = 5)]
    pub drain_delay_seconds: u64,
    /// Run without an API server: PriorityClasses and GPU nodes come from the policy file's
    /// guard.offline section. Without this flag and without --kubeconfig, the cluster
    /// configuration is inferred (KUBECONFIG, ~/.kube/config, in-cluster); when there is none,
    /// `serve` runs as with --no-cluster and says so in the log.
    #[arg(long, env = "GPU_GUARD_NO_CLUSTER", conflicts_with = "kubeconfig")]
    pub no_cluster: bool,
    /// Kubeconfig file to read PriorityClasses and Nodes with (default: inferred).
    #[arg(long, env = "GPU_GUARD_KUBECONFIG", value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// Seconds the PriorityClass and Node caches may take to sync at start before a warning is
    /// logged (readiness stays false until they have synced).
    #[arg(long, env = "GPU_GUARD_CACHE_SYNC_WARN_SECONDS", default_value_t = 30)]
    pub cache_sync_warn_seconds: u64,
    /// Print the effective configuration (flags, environment, policy source) and exit.
    #[arg(long)]
    #[serde(skip)]
    pub print_config: bool,
}

#[derive(Debug, Args)]
pub struct ControllerArgs {
    /// Kubeconfig file (default: inferred: KUBECONFIG, ~/.kube/config, in-cluster).
    #[arg(long, env = "GPU_GUARD_KUBECONFIG", value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// Change nothing (no taint, pod condition or eviction); log, count and emit Events only.
    /// Overrides the policy's controller.dryRun when set.
    #[arg(long, env = "GPU_GUARD_DRY_RUN")]
    pub dry_run: bool,
    /// Address of the plain-HTTP admin listener (/healthz, /readyz, /metrics).
    #[arg(long, env = "GPU_GUARD_ADMIN_LISTEN", default_value = "0.0.0.0:8081")]
    pub admin_listen: std::net::SocketAddr,
    /// Namespace of the leader-election Lease.
    #[arg(long, env = "POD_NAMESPACE", default_value = "gpu-guard")]
    pub lease_namespace: String,
    /// Name of the leader-election Lease.
    #[arg(long, env = "GPU_GUARD_LEASE_NAME", default_value = crate::controller::LEASE_NAME)]
    pub lease_name: String,
    /// Seconds a Lease lasts without renewal (renewed every third of it), 3 to 3600.
    #[arg(long, env = "GPU_GUARD_LEASE_DURATION_SECONDS", default_value_t = 15,
          value_parser = clap::value_parser!(u64).range(3..=3600))]
    pub lease_duration_seconds: u64,
    /// This replica's identity in the Lease and in Events (default: the host name).
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
    /// Act without leader election (one replica only, or local testing).
    #[arg(long)]
    pub no_leader_election: bool,
    /// Log format.
    #[arg(long, env = "GPU_GUARD_LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: LogFormat,
    /// Log level or tracing filter (e.g. info, debug, gpu_guard=debug).
    #[arg(long, env = "GPU_GUARD_LOG_LEVEL", default_value = "info")]
    pub log_level: String,
}

/// How logs are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Json,
    Text,
}

#[derive(Debug, Args)]
pub struct MutateArgs {
    /// A file, a directory, or - for stdin. Repeat for several.
    #[arg(short = 'f', long = "filename", value_name = "PATH", required = true)]
    pub files: Vec<PathBuf>,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value = "yaml")]
    pub output: Format,
    /// Print a unified diff of each input against its mutated form instead of the manifests.
    #[arg(long)]
    pub diff: bool,
}

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// A file, a directory, or - for stdin. Repeat for several.
    #[arg(short = 'f', long = "filename", value_name = "PATH", required = true)]
    pub files: Vec<PathBuf>,
    /// A PriorityClass value, NAME=VALUE (e.g. high-priority=1000000). Repeatable.
    #[arg(long = "priority-class", value_name = "NAME=VALUE")]
    pub priority_classes: Vec<String>,
    /// The namespace of objects that name none (as kubectl's default namespace).
    #[arg(short = 'n', long, default_value = "default")]
    pub namespace: String,
    /// Read PriorityClasses and Nodes from the cluster this kubeconfig names (instead of the
    /// policy file; PriorityClass and Node objects among the inputs and --priority-class flags
    /// still take precedence).
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// With --kubeconfig: how long to wait for the PriorityClasses and Nodes to be listed.
    #[arg(long, default_value_t = 30, value_name = "SECONDS")]
    pub sync_timeout_seconds: u64,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value = "text")]
    pub output: CheckFormat,
}

/// How `check` prints its findings.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum CheckFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum GenerateCommand {
    /// Print the podFailurePolicy the policy injects, to paste into a Job manifest.
    ///
    /// Each --container names a container that uses a device; exit-code rules name it in
    /// containerName. Without --container the rules match every container (do not use that
    /// with native sidecars: they exit 137/143 at shutdown).
    FailurePolicy(FailurePolicyArgs),
    /// Print (or write) the installation: Namespace, RBAC, Deployment, PodDisruptionBudget,
    /// Service and the two webhook configurations, from the same names, ports and paths the
    /// server uses. `webhook-config/base/` is this command's output with --out-dir.
    WebhookConfig(WebhookConfigArgs),
}

#[derive(Debug, Args)]
pub struct WebhookConfigArgs {
    /// The namespace gpu-guard runs in.
    #[arg(long, default_value = "gpu-guard")]
    pub namespace: String,
    /// The name of the webhook Service (and Deployment).
    #[arg(long, default_value = "gpu-guard")]
    pub service_name: String,
    /// The container image.
    #[arg(long)]
    pub image: Option<String>,
    /// A PEM CA bundle to put in the webhook configurations' caBundle (default: none, for
    /// cert-manager's CA injector or a kustomize overlay to fill).
    #[arg(long, value_name = "FILE")]
    pub ca_bundle_file: Option<PathBuf>,
    /// failurePolicy of the mutating webhook.
    #[arg(long, value_enum, default_value = "ignore")]
    pub mutate_failure_policy: crate::deploy::FailurePolicy,
    /// failurePolicy of the validating webhook.
    #[arg(long, value_enum, default_value = "ignore")]
    pub validate_failure_policy: crate::deploy::FailurePolicy,
    /// Only the webhook configurations, calling this base URL instead of the Service (e.g.
    /// https://127.0.0.1:8443 for a `gpu-guard serve` beside a local API server).
    #[arg(long, value_name = "URL")]
    pub local_url: Option<String>,
    /// The node health controller's objects (ServiceAccount, ClusterRole and binding,
    /// Deployment) instead of the webhook's.
    #[arg(long, conflicts_with = "local_url")]
    pub controller: bool,
    /// Write one file per resource and a kustomization.yaml into this directory instead of
    /// printing a YAML stream.
    #[arg(long, value_name = "DIR")]
    pub out_dir: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct FailurePolicyArgs {
    /// A container that uses a device. Repeat for several.
    #[arg(long = "container", value_name = "NAME")]
    pub containers: Vec<String>,
    /// Generate for an Indexed Job with backoffLimitPerIndex (FailJob rules become FailIndex).
    #[arg(long)]
    pub per_index: bool,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value = "yaml")]
    pub output: Format,
}

#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Validate a policy file; exit 1 if it is refused.
    ///
    /// Prints every semantic problem at once, each with file, line, column and field; a YAML
    /// syntax error, an unknown key or a wrong type stops the reading, so it is the only
    /// problem shown until it is fixed.
    Check {
        /// The policy file.
        file: PathBuf,
    },
    /// Print the effective policy (the embedded default, or --policy FILE) with every default.
    Show,
    /// Print the JSON Schema of the policy file (policies/schema.json).
    Schema,
}

/// What a command prints and how the process exits.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Report {
    pub stdout: String,
    pub stderr: String,
    pub exit_code: i32,
}

/// Loads the policy the global flags name.
pub fn load_policy(global: &GlobalArgs) -> Result<Policy, PolicyError> {
    match &global.policy {
        Some(path) => policy::load(path),
        None => Ok(Policy::embedded()),
    }
}

/// Runs a parsed command line.
pub fn run(cli: &Cli) -> Report {
    if let Command::Policy(PolicyCommand::Check { file }) = &cli.command {
        return match policy::load(file) {
            Ok(_) => Report {
                stdout: format!("{}: valid\n", file.display()),
                ..Report::default()
            },
            Err(error) => failure(format!("{error}\n")),
        };
    }
    if let Command::Policy(PolicyCommand::Schema) = &cli.command {
        return Report {
            stdout: Policy::json_schema(),
            ..Report::default()
        };
    }
    let policy = match load_policy(&cli.global) {
        Ok(policy) => policy,
        Err(error) => return failure(format!("{error}\n")),
    };
    match &cli.command {
        Command::Serve(args) if args.print_config => Report {
            stdout: manifest::to_yaml(&serde_json::json!({
                "serve": args,
                "policy": cli.global.policy.as_ref().map_or_else(
                    || policy::EMBEDDED_NAME.to_owned(),
                    |p| p.display().to_string(),
                ),
            })),
            ..Report::default()
        },
        Command::Serve(args) => crate::server::run::serve(args, policy),
        Command::Mutate(args) => run_mutate(args, &policy),
        Command::Check(args) => run_check(args, &policy),
        Command::Generate(GenerateCommand::FailurePolicy(args)) => {
            run_generate_failure_policy(args, &policy)
        }
        Command::Generate(GenerateCommand::WebhookConfig(args)) => {
            run_generate_webhook_config(args)
        }
        Command::Certs(args) => run_certs(args),
        Command::Policy(PolicyCommand::Show) => Report {
            stdout: manifest::to_yaml(&serde_json::to_value(&policy).expect("policy serializes")),
            ..Report::default()
        },
        Command::Policy(PolicyCommand::Check { .. } | PolicyCommand::Schema) => {
            unreachable!("handled before the policy is loaded")
        }
        Command::Controller(args) => crate::controller::run::controller(args, policy),
    }
}

fn failure(stderr: String) -> Report {
    Report {
        stdout: String::new(),
        stderr,
        exit_code: 1,
    }
}

// === mutate ===

fn run_mutate(args: &MutateArgs, policy: &Policy) -> Report {
    let mut report = Report::default();
    let mut outputs = Vec::new();
    let mut diffs = String::new();
    for input in &args.files {
        let files = match manifest::expand(input) {
            Ok(files) => files,
            Err(error) => {
                report
                    .stderr
                    .push_str(&format!("error: {}: {error}\n", input.display()));
                report.exit_code = 1;
                continue;
            }
        };
        for file in files {
            let (documents, error) = manifest::read(&file);
            let mut mutated = Vec::with_capacity(documents.len());
            for document in &documents {
                let mut value = document.value.clone();
                if let Err(message) =
                    mutate_document(&mut value, document, policy, &mut report.stderr)
                {
                    report.stderr.push_str(&format!("error: {message}\n"));
                    report.exit_code = 1;
                }
                mutated.push(value);
            }
            if let Some(error) = error {
                report.stderr.push_str(&format!("error: {error}\n"));
                report.exit_code = 1;
            }
            if args.diff {
                diffs.push_str(&unified_diff(
                    &file.display().to_string(),
                    &documents,
                    &mutated,
                ));
            }
            outputs.extend(mutated);
        }
    }
    report.stdout = if args.diff {
        diffs
    } else if outputs.is_empty() {
        String::new()
    } else {
        manifest::render(&outputs, args.output)
    };
    report
}

/// Mutates one document in place (recursing into `List` items); notes go to `log`.
fn mutate_document(
    value: &mut Value,
    document: &Document,
    policy: &Policy,
    log: &mut String,
) -> Result<(), String> {
    let list_kind = value
        .get("kind")
        .and_then(Value::as_str)
        .filter(|kind| kind.ends_with("List"))
        .map(str::to_owned);
    if let Some(list_kind) = list_kind
        && let Some(items) = value.get_mut("items").and_then(Value::as_array_mut)
    {
        // The API's own JobList and CronJobList leave apiVersion and kind out of their items.
        let implied_kind = list_kind
            .strip_suffix("List")
            .unwrap_or_default()
            .to_owned();
        let mut errors = Vec::new();
        for item in items {
            // Only the keys an item lacks are added, and removed again afterwards (inserted
            // last and shift-removed: the item keeps its key order).
            let mut added = Vec::new();
            if !implied_kind.is_empty()
                && item.get("kind").is_none()
                && let Some(fields) = item.as_object_mut()
            {
                for (key, value) in [("apiVersion", "batch/v1"), ("kind", implied_kind.as_str())] {
                    if !fields.contains_key(key) {
                        fields.insert(key.to_owned(), Value::from(value));
                        added.push(key);
                    }
                }
            }
            if let Err(error) = mutate_document(item, document, policy, log) {
                errors.push(error);
            }
            if let Some(fields) = item.as_object_mut() {
                for key in added.iter().rev() {
                    fields.shift_remove(*key);
                }
            }
        }
        return if errors.is_empty() {
            Ok(())
        } else {
            Err(errors.join("\n"))
        };
    }
    let name = object_name(value, document);
    let Some(result) = object::mutate_object(value, policy) else {
        return Ok(());
    };
    let mutation = result.map_err(|error| format!("{name}: {error}"))?;
    for warning in &mutation.outcome.warnings {
        log.push_str(&format!("warning: {name}: {warning}\n"));
    }
    match mutation.outcome.skipped {
        Some(SkipReason::SkipAnnotation) => {
            log.push_str(&format!(
                "{name}: skipped ({} annotation)\n",
                mutate::SKIP_ANNOTATION
            ));
        }
        Some(SkipReason::NotDeviceWorkload) => log.push_str(&format!(
            "{name}: unchanged (no container requests a device resource listed in the policy)\n"
        )),
        Some(SkipReason::NoPodSpec) => {
            log.push_str(&format!("{name}: unchanged (no pod template spec)\n"));
        }
        None if mutation.patch.is_empty() => log.push_str(&format!("{name}: unchanged\n")),
        None => {
            *value = crate::patch::apply(value, &mutation.patch)
                .map_err(|error| format!("{name}: {error}"))?;
            log.push_str(&format!("{name}: {}\n", mutation.outcome.summary()));
        }
    }
    Ok(())
}

fn object_name(value: &Value, document: &Document) -> String {
    let kind = value
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or("object");
    let name = value
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("<unnamed>");
    format!(
        "{} (document {}) {}/{}",
        document.source,
        document.index,
        kind.to_lowercase(),
        name
    )
}

fn unified_diff(file: &str, before: &[Document], after: &[Value]) -> String {
    let before: Vec<Value> = before.iter().map(|d| d.value.clone()).collect();
    let old = manifest::render(&before, Format::Yaml);
    let new = manifest::render(after, Format::Yaml);
    if old == new {
        return String::new();
    }
    similar::TextDiff::from_lines(&old, &new)
        .unified_diff()
        .context_radius(3)
        .header(
            &format!("a/{}", file.trim_start_matches('/')),
            &format!("b/{}", file.trim_start_matches('/')),
        )
        .to_string()
}

// === check ===

fn run_check(args: &CheckArgs, policy: &Policy) -> Report {
    let mut errors = Vec::new();
    let mut documents = Vec::new();
    for input in &args.files {
        match manifest::expand(input) {
            Ok(files) => {
                for file in files {
                    let (read, error) = manifest::read(&file);
                    documents.extend(read);
                    errors.extend(error.map(|e| e.to_string()));
                }
            }
            Err(error) => errors.push(format!("{}: {error}", input.display())),
        }
    }
    let objects = check::objects(&documents);
    let usage_error = |message: String| Report {
        stderr: format!("error: {message}\n"),
        exit_code: 2,
        ..Report::default()
    };
    let built = match &args.kubeconfig {
        Some(_) => check::manifest_facts(&objects, &args.priority_classes),
        None => check::offline_view(policy, &objects, &args.priority_classes),
    };
    let facts = match built {
        Ok((facts, learn_errors)) => {
            errors.extend(learn_errors);
            facts
        }
        Err(message) => return usage_error(message),
    };
    // The runtime runs the cache's watches; it lives until the check is done.
    let cluster = match &args.kubeconfig {
        Some(path) => match cluster_view(path, Duration::from_secs(args.sync_timeout_seconds)) {
            Ok(cluster) => Some(cluster),
            Err(message) => return usage_error(message),
        },
        None => None,
    };
    let checked = match &cluster {
        Some((_runtime, cache)) => {
            let layered = check::Layered {
                over: facts,
                under: cache,
            };
            check::check(&objects, policy, &layered, &args.namespace)
        }
        None => check::check(&objects, policy, &facts, &args.namespace),
    };
    errors.extend(checked.errors.iter().cloned());
    let stdout = match args.output {
        CheckFormat::Text => check::render_text(&checked),
        CheckFormat::Json => {
            let mut text = serde_json::to_string_pretty(&serde_json::json!({
                "findings": checked.findings,
                "errors": errors,
                "denied": checked.denied(),
            }))
            .expect("findings serialize");
            text.push('\n');
            text
        }
    };
    Report {
        stdout,
        stderr: errors.iter().map(|e| format!("error: {e}\n")).collect(),
        exit_code: if !errors.is_empty() {
            2
        } else if checked.denied() {
            1
        } else {
            0
        },
    }
}

/// The PriorityClasses and Nodes of the cluster `kubeconfig` names, listed within `timeout`.
fn cluster_view(
    kubeconfig: &std::path::Path,
    timeout: Duration,
) -> Result<(tokio::runtime::Runtime, crate::cluster::ClusterCache), String> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .map_err(|error| format!("cannot start the async runtime: {error}"))?;
    let cache = runtime.block_on(async {
        let client = crate::cluster::client(Some(kubeconfig))
            .await
            .map_err(|error| error.to_string())?;
        let cache = crate::cluster::ClusterCache::start(client);
        if cache.wait_synced(timeout).await {
            Ok(cache)
        } else {
            Err(format!(
                "the PriorityClasses and Nodes of the cluster in {} were not listed within {} s \
                 (is the API server reachable, and may this user list priorityclasses and nodes?)",
                kubeconfig.display(),
                timeout.as_secs()
            ))
        }
    })?;
    Ok((runtime, cache))
}

// === generate webhook-config, certs ===

fn run_generate_webhook_config(args: &WebhookConfigArgs) -> Report {
    let ca_bundle = match &args.ca_bundle_file {
        Some(path) => match std::fs::read(path) {
            Ok(bytes) if bytes.starts_with(b"-----BEGIN CERTIFICATE-----") => Some(bytes),
            Ok(_) => {
                return failure(format!(
                    "{}: not a PEM certificate (expected -----BEGIN CERTIFICATE-----)\n",
                    path.display()
                ));
            }
            Err(error) => return failure(format!("{}: cannot read: {error}\n", path.display())),
        },
        None => None,
    };
    let defaults = crate::deploy::Options::default();
    let options = crate::deploy::Options {
        namespace: args.namespace.clone(),
        service_name: args.service_name.clone(),
        image: args.image.clone().unwrap_or(defaults.image),
        ca_bundle,
        mutate_failure_policy: args.mutate_failure_policy,
        validate_failure_policy: args.validate_failure_policy,
        local_url: args.local_url.clone(),
    };
    let (files, generated) = if args.controller {
        (
            crate::deploy::controller(&options),
            crate::deploy::Generated::Controller,
        )
    } else if options.local_url.is_some() {
        (
            vec![crate::deploy::File {
                name: "webhooks.yaml",
                objects: crate::deploy::webhooks(&options),
            }],
            crate::deploy::Generated::Local,
        )
    } else {
        (
            crate::deploy::base(&options),
            crate::deploy::Generated::Base,
        )
    };
    let Some(dir) = &args.out_dir else {
        let objects: Vec<Value> = files.into_iter().flat_map(|f| f.objects).collect();
        return Report {
            stdout: manifest::render(&objects, Format::Yaml),
            ..Report::default()
        };
    };
    if let Err(error) = std::fs::create_dir_all(dir) {
        return failure(format!("{}: cannot create: {error}\n", dir.display()));
    }
    let mut written = String::new();
    for (name, text) in crate::deploy::render(&files, generated) {
        let path = dir.join(&name);
        if let Err(error) = std::fs::write(&path, text) {
            return failure(format!("{}: cannot write: {error}\n", path.display()));
        }
        written.push_str(&format!("wrote {}\n", path.display()));
    }
    Report {
        stderr: written,
        ..Report::default()
    }
}

fn run_certs(args: &CertsArgs) -> Report {
    let service = format!("{}.{}.svc", args.service_name, args.namespace);
    let names = vec![service.clone(), format!("{service}.cluster.local")];
    let pair = match crate::server::tls::generate_self_signed(&names) {
        Ok(pair) => pair,
        Err(error) => return failure(format!("cannot make the certificates: {error}\n")),
    };
    if let Err(error) = std::fs::create_dir_all(&args.out_dir) {
        return failure(format!(
            "{}: cannot create: {error}\n",
            args.out_dir.display()
        ));
    }
    let files = [
        ("ca.crt", &pair.ca_pem, 0o644),
        ("tls.crt", &pair.cert_pem, 0o644),
        ("tls.key", &pair.key_pem, 0o600),
    ];
    if !args.force
        && let Some((name, _, _)) = files
            .iter()
            .find(|(name, _, _)| args.out_dir.join(name).exists())
    {
        return failure(format!(
            "{}: exists; pass --force to replace the certificates\n",
            args.out_dir.join(name).display()
        ));
    }
    let mut written = String::new();
    for (name, pem, mode) in files {
        let path = args.out_dir.join(name);
        if let Err(error) = write_private(&path, pem.as_bytes(), mode) {
            return failure(format!("{}: cannot write: {error}\n", path.display()));
        }
        written.push_str(&format!("wrote {}\n", path.display()));
    }
    written.push_str(&format!(
        "serving certificate for {service}, {service}.cluster.local, localhost and 127.0.0.1, \
         signed by ca.crt; for development only\n"
    ));
    Report {
        stderr: written,
        ..Report::default()
    }
}

/// Writes a file with `mode` (a key must never be readable by others, not even for a moment).
fn write_private(path: &std::path::Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    use std::io::Write as _;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
        options.mode(mode);
        let mut file = options.open(path)?;
        file.set_permissions(std::fs::Permissions::from_mode(mode))?;
        file.write_all(bytes)
    }
    #[cfg(not(unix))]
    {
        let _ = mode;
        options.open(path)?.write_all(bytes)
    }
}

// === generate failure-policy ===

fn run_generate_failure_policy(args: &FailurePolicyArgs, policy: &Policy) -> Report {
    // A Job whose named containers each request a device, with nothing else the engine would
    // change, run through the real engine.
    let device = policy
        .devices
        .names
        .first()
        .cloned()
        .unwrap_or_else(|| format!("{}0", policy.devices.prefixes[0]));
    let names = if args.containers.is_empty() {
        vec!["main".to_owned()]
    } else {
        args.containers.clone()
    };
    let containers = names
        .iter()
        .map(|name| Container {
            name: name.clone(),
            resources: Some(ResourceRequirements {
                limits: Some([(device.clone(), Quantity("1".to_owned()))].into()),
                ..ResourceRequirements::default()
            }),
            ..Container::default()
        })
        .collect();
    let job = Job {
        spec: Some(JobSpec {
            backoff_limit_per_index: args.per_index.then_some(1),
            completion_mode: args.per_index.then(|| "Indexed".to_owned()),
            template: PodTemplateSpec {
                metadata: None,
                spec: Some(PodSpec {
                    restart_policy: Some("Never".to_owned()),
                    containers,
                    ..PodSpec::default()
                }),
            },
            ..JobSpec::default()
        }),
        ..Job::default()
    };
    let outcome = mutate::mutate_job(&job, policy);
    let Some(mut generated) = outcome.job.spec.and_then(|spec| spec.pod_failure_policy) else {
        return failure(format!(
            "the policy injects no podFailurePolicy (is mutation.podFailurePolicy.enabled false?)\n{}",
            outcome.warnings.join("\n")
        ));
    };
    let mut stderr = String::new();
    if args.containers.is_empty() {
        for rule in &mut generated.rules {
            if let Some(exit_codes) = &mut rule.on_exit_codes {
                exit_codes.container_name = None;
            }
        }
        stderr.push_str(
            "note: without --container the exit-code rules match every container; name the \
             device containers if the pod has native sidecars\n",
        );
    }
    Report {
        stdout: render_failure_policy(&generated, args.output),
        stderr,
        exit_code: 0,
    }
}

fn render_failure_policy(policy: &PodFailurePolicy, format: Format) -> String {
    let value = serde_json::json!({ "podFailurePolicy": policy });
    manifest::render(&[value], format)
}
