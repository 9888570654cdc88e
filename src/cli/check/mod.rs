//! `gpu-guard check`: the flags and the command; [`findings`] judges the objects.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::Report;

mod findings;

use crate::manifest;
use crate::policy::Policy;

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
    /// Read PriorityClasses, Nodes and DRA objects (ResourceClaimTemplates, ResourceClaims,
    /// DeviceClasses) from the cluster this kubeconfig names (instead of the policy file; such
    /// objects among the inputs and --priority-class flags still take precedence).
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// With --kubeconfig: how long to wait for the cluster's objects to be listed.
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

pub(super) fn run(args: &CheckArgs, policy: &Policy) -> Report {
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
    let objects = manifest::objects(&documents);
    let usage_error = |message: String| Report {
        stderr: format!("error: {message}\n"),
        exit_code: 2,
        ..Report::default()
    };
    let built = match &args.kubeconfig {
        Some(_) => findings::manifest_facts(&objects, &args.priority_classes),
        None => findings::offline_view(policy, &objects, &args.priority_classes),
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
        Some(path) => {
            match super::cluster_cache(path, Duration::from_secs(args.sync_timeout_seconds)) {
                Ok(cluster) => Some(cluster),
                Err(message) => return usage_error(message),
            }
        }
        None => None,
    };
    let checked = match &cluster {
        Some((_runtime, cache)) => {
            let layered = crate::guard::Layered {
                over: facts,
                under: cache,
            };
            findings::check(&objects, policy, &layered, &args.namespace)
        }
        None => findings::check(&objects, policy, &facts, &args.namespace),
    };
    errors.extend(checked.errors.iter().cloned());
    let stdout = match args.output {
        CheckFormat::Text => findings::render_text(&checked),
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
