//! `gpu-guard generate`: the podFailurePolicy a policy injects, and the installation
//! (`webhook-config/`).

use std::path::PathBuf;

use clap::{Args, Subcommand};
use k8s_openapi::api::batch::v1::{Job, JobSpec, PodFailurePolicy};
use k8s_openapi::api::core::v1::{Container, PodSpec, PodTemplateSpec, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde_json::Value;

use super::{Report, failure};
use crate::install;
use gpu_guard_core::api_rules::names::dns_label_errors;
use gpu_guard_core::mutate;
use gpu_guard_core::policy::Policy;
use gpu_guard_manifest::{self as manifest, Format};

#[derive(Debug, Subcommand)]
pub enum GenerateCommand {
    /// Print the podFailurePolicy the policy injects, to paste into a Job manifest.
    ///
    /// Each --container names a container that uses a device; exit-code rules name it in
    /// containerName. Without --container the rules match every container (do not use that
    /// with native sidecars: they exit 137/143 at shutdown).
    #[command(name = "failure-policy")]
    PodFailurePolicy(PodFailurePolicyArgs),
    /// Print (or write) the installation: Namespace, RBAC, Deployment, PodDisruptionBudget,
    /// Service, the two webhook configurations and a NetworkPolicy, from the same names, ports
    /// and paths the server uses. `webhook-config/base/` is this command's output with
    /// --out-dir.
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
    pub mutate_failure_policy: install::WebhookFailurePolicy,
    /// failurePolicy of the validating webhook.
    #[arg(long, value_enum, default_value = "ignore")]
    pub validate_failure_policy: install::WebhookFailurePolicy,
    /// Only the webhook configurations, calling this base URL instead of the Service (e.g.
    /// https://127.0.0.1:8443 for a `gpu-guard serve` beside a local API server).
    #[arg(long, value_name = "URL")]
    pub local_url: Option<String>,
    /// The node health controller's objects (ServiceAccount, ClusterRole and binding,
    /// Deployment, NetworkPolicy) instead of the webhook's.
    #[arg(long, conflicts_with = "local_url")]
    pub controller: bool,
    /// Write one file per resource and a kustomization.yaml into this directory instead of
    /// printing a YAML stream.
    #[arg(long, value_name = "DIR")]
    pub out_dir: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct PodFailurePolicyArgs {
    /// A container that uses a device. Repeat for several.
    #[arg(long = "container", value_name = "NAME")]
    pub containers: Vec<String>,
    /// Generate for an Indexed Job with backoffLimitPerIndex (FailJob rules become FailIndex).
    #[arg(long)]
    pub per_index: bool,
    /// Output format.
    #[arg(short = 'o', long = "output", value_parser = super::formats(), default_value = "yaml")]
    pub output: Format,
}

pub(super) fn webhook_config(args: &WebhookConfigArgs) -> Report {
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
    let defaults = install::Options::default();
    let options = install::Options {
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
            install::controller(&options),
            install::Generated::Controller,
        )
    } else if options.local_url.is_some() {
        (
            vec![install::File {
                name: "webhooks.yaml",
                objects: install::webhooks(&options),
            }],
            install::Generated::Local,
        )
    } else {
        (install::base(&options), install::Generated::Base)
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
    for (name, text) in install::render(&files, generated) {
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

/// Why the `--container` names cannot be the containers of one pod, as the API server checks
/// them (kubernetes `pkg/apis/core/validation/validation.go`: `validateContainerCommon` checks
/// each name with `ValidateDNS1123Label`, and the names of a pod's containers must differ).
fn container_name_errors(names: &[String]) -> Vec<String> {
    let mut errors = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    let mut repeated = std::collections::BTreeSet::new();
    for name in names {
        for error in dns_label_errors(name) {
            errors.push(format!("--container {name:?}: a container name {error}"));
        }
        if !seen.insert(name) && repeated.insert(name) {
            errors.push(format!(
                "--container {name:?} is given more than once: the containers of a pod must \
                 have different names"
            ));
        }
    }
    errors
}

pub(super) fn failure_policy(args: &PodFailurePolicyArgs, policy: &Policy) -> Report {
    let errors = container_name_errors(&args.containers);
    if !errors.is_empty() {
        return Report {
            stderr: errors.iter().map(|e| format!("error: {e}\n")).collect(),
            exit_code: 2,
            ..Report::default()
        };
    }
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
    // Only the podFailurePolicy is printed: the other settings stay out of the run, and so do
    // their warnings (a grace period raised on this made-up Job would mean nothing).
    let mut only_failure_policy = policy.clone();
    let mutation = &mut only_failure_policy.mutation;
    mutation.termination_grace_period.enabled = false;
    mutation.node_readiness_tolerations.enabled = false;
    mutation.restart_rules.enabled = false;
    mutation.active_deadline_seconds = None;
    let outcome = mutate::mutate_job(&job, &only_failure_policy);
    let Some(mut generated) = outcome.job.spec.and_then(|spec| spec.pod_failure_policy) else {
        return failure(format!(
            "the policy injects no podFailurePolicy (is mutation.podFailurePolicy.enabled false?)\n{}",
            outcome.warnings.join("\n")
        ));
    };
    // The engine's warnings, e.g. the fallback from containerName when one rule per container
    // would pass the API server's limit of 20 rules.
    let mut stderr: String = outcome
        .warnings
        .iter()
        .map(|warning| format!("warning: {warning}\n"))
        .collect();
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
