//! The command line: `gpu-guard serve | controller | mutate | check | simulate | generate | policy |
//! certs`.
//! The only module that knows clap: one file per command, each turning its flags into the plain
//! settings of the module that does the work. `mutate` and `check` stream to the writers they
//! are given; the other commands return the text to print ([`Report`]). Every command exits
//! by one contract ([`exit`]).

mod certs;
mod check;
mod controller;
mod generate;
mod inputs;
mod mutate;
pub mod reference;
mod serve;
mod simulate;
mod tally;

use std::ffi::OsString;
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use clap::builder::PossibleValue;
use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::install;
use gpu_guard_core::policy::{self, Policy, PolicyError};
use gpu_guard_manifest::{self as manifest, Format};
use gpu_guard_runtime::cluster::{self, ClusterCache, ClusterError};
use gpu_guard_runtime::process::{self, LogColour, LogFormat, ProcessError, Stopped};

pub use certs::CertsArgs;
pub use check::{CheckArgs, CheckFormat};
pub use controller::ControllerArgs;
pub use generate::{GenerateCommand, PodFailurePolicyArgs, WebhookConfigArgs};
pub use inputs::InputArgs;
pub use mutate::MutateArgs;
pub use serve::ServeArgs;
pub use simulate::{SimulateArgs, SimulateFormat};

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
    /// Mutate Jobs, CronJobs, JobSets and Kubeflow Trainer runtimes in manifests, as the
    /// webhook would.
    ///
    /// Reads YAML or JSON files, multi-document streams, directories (every .yaml, .yml and
    /// .json file below them) and List objects; `-f -` reads stdin. Every other document passes
    /// through unchanged, in order; for the workload kinds of other operators (MPIJob,
    /// PyTorchJob, LeaderWorkerSet, Volcano Job, RayJob) and for TrainJobs, a line says what
    /// protects them or that nothing does. Warnings and a summary of the changes go to stderr.
    ///
    /// A new pod of a Job (no node, no phase past Pending) is kept off the nodes where the
    /// Job's earlier pods in the input failed of a device, as the webhook admits it.
    ///
    /// Each document is written as soon as it is mutated. A document that cannot be read is
    /// reported with its file, document number and line, and written through unchanged (YAML
    /// output); every other document is still mutated.
    ///
    /// Exit status: 0 on success; 1 with --diff when something would change; 2 when a flag,
    /// the policy or an input (file, document, object) could not be used, after writing
    /// everything else.
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
    /// Exit status: 0 when nothing would be denied, 1 when something would be, 2 when a flag,
    /// the policy or an input could not be used (-o json still prints one JSON document).
    ///
    /// Example: gpu-guard check -f k8s/ --priority-class high-priority=1000000
    Check(CheckArgs),
    /// Say what happens when a pod of each Job, CronJob, JobSet or Trainer runtime fails as
    /// described, by the Job and JobSet controllers' own rules.
    ///
    /// Reads the same inputs as `mutate`. For each workload: the podFailurePolicy rule that
    /// matches (or none), whether the failure counts against backoffLimit (or its index's
    /// backoffLimitPerIndex), whether the Job fails and with what reason and message; for a
    /// JobSet, the failurePolicy rule the child Job's failure reaches, its action and the
    /// restarts left. Objects are taken as the API server stores them (backoffLimit 6 when
    /// unset, a condition pattern's status True); the failing pod's name ends in `xxxxx`, where
    /// the Job controller puts a random suffix. With --as-mutated, as gpu-guard would admit
    /// them.
    ///
    /// Exit status: 0 when the simulation ran; 2 when a flag or an input could not be used (an
    /// unknown container or replicated Job, no workload in the input).
    ///
    /// Example: gpu-guard simulate -f job.yaml --container trainer --exit-code 74 --as-mutated
    Simulate(SimulateArgs),
    /// Print generated configuration.
    #[command(subcommand)]
    Generate(GenerateCommand),
    /// Check or show a policy file.
    #[command(subcommand)]
    Policy(PolicyCommand),
    /// Write a development CA and a serving certificate for the webhook Service (and localhost).
    ///
    /// Writes ca.crt, tls.crt and tls.key (mode 0600) for `gpu-guard.<namespace>.svc`,
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

/// The logging flags of the long-running commands.
#[derive(Debug, Args, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LogArgs {
    /// Log format.
    #[arg(long, env = "GPU_GUARD_LOG_FORMAT", value_parser = log_formats(), default_value = "text")]
    pub log_format: LogFormat,
    /// Log level or tracing filter (e.g. info, debug, gpu_guard=debug). At info `serve` logs a
    /// line for each denial, guard finding and object left unchanged with a warning;
    /// info,gpu_guard::admission=debug logs one for every admission review.
    #[arg(long, env = "GPU_GUARD_LOG_LEVEL", default_value = "info")]
    pub log_level: String,
    /// Colour codes in text logs: auto (only when stderr is a terminal and NO_COLOR is unset),
    /// always or never.
    #[arg(long, env = "GPU_GUARD_LOG_COLOR", value_parser = log_colours(), default_value = "auto")]
    pub log_color: LogColour,
}

impl LogArgs {
    /// Starts logging; the guard keeps the log writer until the command returns.
    fn init(&self) -> process::LogGuard {
        process::init_logging(self.log_format, &self.log_level, self.log_color)
    }
}

/// Where the long-running commands find their cluster.
#[derive(Debug, Args, serde::Serialize)]
pub struct KubeconfigArgs {
    /// Kubeconfig file (default: inferred: KUBECONFIG, ~/.kube/config, in-cluster).
    #[arg(long, env = "GPU_GUARD_KUBECONFIG", value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Validate a policy file; exit 1 if it is refused, 2 if it cannot be read.
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

/// The exit statuses, one contract for every command (docs/cli.md#exit-status).
pub mod exit {
    /// Nothing to report.
    pub const OK: i32 = 0;
    /// Findings: something would be denied (`check`), would change (`mutate --diff`), or the
    /// policy file is refused (`policy check`); for `serve` and `controller`, a failure.
    pub const FINDINGS: i32 = 1;
    /// A usage or input error: a bad flag, an unreadable or invalid policy, an unreadable
    /// input, file, document or object.
    pub const INPUT: i32 = 2;
}

/// What a command prints and how the process exits.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Report {
    pub stdout: String,
    pub stderr: String,
    pub exit_code: i32,
}

/// Where a command's notes, warnings and errors go (stderr), each line as it happens.
pub(crate) struct Log<'a> {
    out: &'a mut dyn Write,
    /// How many errors were written.
    pub errors: usize,
}

impl<'a> Log<'a> {
    pub fn new(out: &'a mut dyn Write) -> Self {
        Self { out, errors: 0 }
    }

    pub fn error(&mut self, message: &str) {
        self.errors += 1;
        self.line("error: ", message);
    }

    pub fn warning(&mut self, message: &str) {
        self.line("warning: ", message);
    }

    pub fn note(&mut self, message: &str) {
        self.line("", message);
    }

    fn line(&mut self, prefix: &str, message: &str) {
        // stderr that cannot be written to has no one to tell.
        let _ = writeln!(self.out, "{prefix}{message}");
    }
}

/// Runs a parsed command line, writing to `out` (stdout) and `err` (stderr) as it goes;
/// returns the exit status.
pub fn run_with(cli: &Cli, out: &mut dyn Write, err: &mut dyn Write) -> i32 {
    let mut log = Log::new(err);
    if let Command::Policy(PolicyCommand::Check { file }) = &cli.command {
        return match policy::load(file) {
            Ok(_) => {
                let _ = writeln!(out, "{}: valid", file.display());
                exit::OK
            }
            Err(error) => {
                log.note(&error.to_string());
                match error {
                    PolicyError::Read { .. } => exit::INPUT,
                    PolicyError::Invalid { .. } => exit::FINDINGS,
                }
            }
        };
    }
    if let Command::Policy(PolicyCommand::Schema) = &cli.command {
        let _ = out.write_all(Policy::json_schema().as_bytes());
        return exit::OK;
    }
    let policy = match load_policy(&cli.global) {
        Ok(policy) => policy,
        Err(error) => {
            log.error(&error.to_string());
            if let Some(json) = empty_json_output(&cli.command, &error.to_string()) {
                let _ = out.write_all(json.as_bytes());
            }
            return exit::INPUT;
        }
    };
    let report = match &cli.command {
        Command::Mutate(args) => return mutate::run(args, &policy, out, &mut log),
        Command::Check(args) => return check::run(args, &policy, out, &mut log),
        Command::Simulate(args) => return simulate::run(args, &policy, out, &mut log),
        Command::Serve(args) => serve::run(args, cli.global.policy.as_deref(), policy),
        Command::Controller(args) => controller::run(args, policy),
        Command::Generate(GenerateCommand::PodFailurePolicy(args)) => {
            generate::failure_policy(args, &policy)
        }
        Command::Generate(GenerateCommand::WebhookConfig(args)) => generate::webhook_config(args),
        Command::Certs(args) => certs::run(args),
        Command::Policy(PolicyCommand::Show) => Report {
            stdout: manifest::to_yaml(&serde_json::to_value(&policy).expect("policy serializes")),
            ..Report::default()
        },
        Command::Policy(PolicyCommand::Check { .. } | PolicyCommand::Schema) => {
            unreachable!("handled before the policy is loaded")
        }
    };
    let _ = out.write_all(report.stdout.as_bytes());
    let _ = log.out.write_all(report.stderr.as_bytes());
    report.exit_code
}

/// The JSON document `-o json` prints when a command fails before it has any result: an
/// empty `List` for `mutate`, the report with only the error for `check`, an empty list for
/// `simulate`.
fn empty_json_output(command: &Command, message: &str) -> Option<String> {
    match command {
        Command::Mutate(args) if args.output == Format::Json => Some(failed_json(false, message)),
        Command::Check(args) if args.output == CheckFormat::Json => {
            Some(failed_json(true, message))
        }
        Command::Simulate(args) if args.output == SimulateFormat::Json => Some("[]\n".to_owned()),
        _ => None,
    }
}

/// For a command line the parser refuses: the JSON document `-o json` promises, when the
/// arguments ask for JSON output of `mutate`, `check` or `simulate` (the message is on stderr
/// too).
pub fn usage_error_json(args: &[OsString], message: &str) -> Option<String> {
    let message = message.lines().next().unwrap_or_default();
    let message = message.strip_prefix("error: ").unwrap_or(message);
    let args: Vec<String> = args
        .iter()
        .map(|arg| arg.to_string_lossy().into_owned())
        .collect();
    let json = args
        .windows(2)
        .any(|pair| matches!(pair[0].as_str(), "-o" | "--output") && pair[1] == "json")
        || args
            .iter()
            .any(|arg| matches!(arg.as_str(), "-ojson" | "--output=json" | "-o=json"));
    if !json {
        return None;
    }
    if args.iter().any(|arg| arg == "check") {
        Some(failed_json(true, message))
    } else if args.iter().any(|arg| arg == "mutate") {
        Some(failed_json(false, message))
    } else if args.iter().any(|arg| arg == "simulate") {
        // No workload was simulated: the empty list (the error is on stderr).
        Some("[]\n".to_owned())
    } else {
        None
    }
}

/// The JSON output of a `check` (`{findings, errors, ...}` with the error) or a `mutate` (an
/// empty `List`: the error is on stderr) that failed before it had any result.
fn failed_json(check: bool, message: &str) -> String {
    if !check {
        let empty = manifest::DocumentWriter::new(Vec::new(), Format::Json).finish();
        return String::from_utf8(empty.expect("writing to memory cannot fail"))
            .expect("JSON is UTF-8");
    }
    let value = serde_json::json!({
        "findings": [], "errors": [message], "warnings": [], "denied": false, "summary": {}
    });
    let mut text = serde_json::to_string_pretty(&value).expect("JSON values serialize");
    text.push('\n');
    text
}

/// Loads the policy the global flags name.
fn load_policy(global: &GlobalArgs) -> Result<Policy, PolicyError> {
    match &global.policy {
        Some(path) => policy::load(path),
        None => Ok(Policy::embedded()),
    }
}

/// A command that could not do what it was asked: a usage or input error.
fn failure(stderr: String) -> Report {
    Report {
        stdout: String::new(),
        stderr,
        exit_code: exit::INPUT,
    }
}

/// The report of a long-running command: exit 0 or 130 after a signal, 1 when it failed to
/// start (the error was logged already, and is printed too).
fn finished(result: Result<Stopped, impl std::error::Error>) -> Report {
    match result {
        Ok(stopped) => Report {
            exit_code: stopped.exit_code(),
            ..Report::default()
        },
        Err(error) => Report {
            stderr: format!("error: {error}\n"),
            exit_code: exit::FINDINGS,
            ..Report::default()
        },
    }
}

// === value enums of the modules below: clap stays here ===

/// A value parser for an enum of another crate (the orphan rule keeps clap's `ValueEnum` off
/// it), with each value's name and help text: `--help` lists them as for a `ValueEnum`.
macro_rules! values_of {
    ($parser:ident -> $type:ident { $($variant:ident => $name:literal $(: $help:literal)?),+ $(,)? }) => {
        pub(crate) fn $parser() -> impl clap::builder::TypedValueParser<Value = $type> {
            let names = clap::builder::PossibleValuesParser::new([
                $(PossibleValue::new($name)$(.help($help))?),+
            ]);
            clap::builder::TypedValueParser::map(names, |value: String| match value.as_str() {
                $($name => $type::$variant,)+
                _ => unreachable!("clap accepts only the values listed"),
            })
        }
    };
}

values_of!(log_formats -> LogFormat {
    Json => "json": "One JSON object a line (for log collectors)",
    Text => "text": "Human-readable lines",
});
values_of!(log_colours -> LogColour {
    Auto => "auto": "Colour only when stderr is a terminal and NO_COLOR is unset or empty",
    Always => "always",
    Never => "never",
});
values_of!(formats -> Format { Yaml => "yaml", Json => "json" });
use install::WebhookFailurePolicy;
impl ValueEnum for WebhookFailurePolicy {
    fn value_variants<'a>() -> &'a [Self] {
        &[WebhookFailurePolicy::Ignore, WebhookFailurePolicy::Fail]
    }

    fn to_possible_value(&self) -> Option<PossibleValue> {
        Some(match self {
            WebhookFailurePolicy::Ignore => PossibleValue::new("ignore").help(
                "Admit the object when the webhook cannot be reached (the default: gpu-guard can never block the cluster)",
            ),
            WebhookFailurePolicy::Fail => {
                PossibleValue::new("fail").help("Reject the object when the webhook cannot be reached")
            }
        })
    }
}

/// Why `mutate --kubeconfig` or `check --kubeconfig` could not read the cluster's facts.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ClusterCacheError {
    #[error(transparent)]
    Process(#[from] ProcessError),
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    #[error(
        "the PriorityClasses, Nodes and DRA objects of the cluster in {} were not listed \
         within {} s (is the API server reachable, and may this user list \
         priorityclasses, nodes, resourceclaimtemplates, resourceclaims and \
         deviceclasses?)",
        kubeconfig.display(),
        timeout.as_secs()
    )]
    NotSynced {
        kubeconfig: PathBuf,
        timeout: Duration,
    },
}

/// The cluster caches (PriorityClasses, Nodes, DRA objects) of the cluster `kubeconfig` names,
/// listed within `timeout`, and the runtime that keeps them (it must live while they are read).
pub(crate) fn cluster_cache(
    kubeconfig: &std::path::Path,
    timeout: Duration,
) -> Result<(tokio::runtime::Runtime, ClusterCache), ClusterCacheError> {
    let runtime = process::runtime(Some(1))?;
    let cache = runtime.block_on(async {
        let cache = ClusterCache::start(cluster::client(Some(kubeconfig)).await?);
        if cache.wait_synced(timeout).await {
            Ok(cache)
        } else {
            Err(ClusterCacheError::NotSynced {
                kubeconfig: kubeconfig.to_owned(),
                timeout,
            })
        }
    })?;
    Ok((runtime, cache))
}
