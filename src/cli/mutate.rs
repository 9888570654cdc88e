//! `gpu-guard mutate`: the mutation engine on manifests, as the webhook would apply it.

use serde_json::Value;

use clap::Args;
use std::path::PathBuf;

use super::Report;
use crate::guard::{ClusterView, Layered, StaticView};
use crate::manifest::{self, Document, Format};
use crate::mutate::object;
use crate::policy::{DraFacts, Policy};

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
    /// Resolve DRA claims also from the ResourceClaimTemplates, ResourceClaims and
    /// DeviceClasses of the cluster this kubeconfig names (those in the input come first).
    /// Without it, only the input's are known: a claim it does not ship is reported, not
    /// guessed.
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// With --kubeconfig: how long to wait for the cluster's objects to be listed.
    #[arg(long, default_value_t = 30, value_name = "SECONDS")]
    pub sync_timeout_seconds: u64,
}

pub(super) fn run(args: &MutateArgs, policy: &Policy) -> Report {
    let mut report = Report::default();
    let mut outputs = Vec::new();
    let mut diffs = String::new();
    let mut inputs = Vec::new();
    for input in &args.files {
        match manifest::expand(input) {
            Ok(files) => inputs.extend(files.into_iter().map(|file| {
                let (documents, error) = manifest::read(&file);
                (file, documents, error)
            })),
            Err(error) => {
                report
                    .stderr
                    .push_str(&format!("error: {}: {error}\n", input.display()));
                report.exit_code = 1;
            }
        }
    }
    // DRA claims are resolved from the ResourceClaimTemplates, ResourceClaims and
    // DeviceClasses anywhere in the input (a template may come after its Job).
    let mut shipped = StaticView::default();
    for (_, documents, _) in &inputs {
        for object in manifest::objects(documents) {
            shipped.add_dra_object(&object.value);
        }
    }
    // The runtime runs the cache's watches; it lives until the mutation is done.
    let cluster = match &args.kubeconfig {
        Some(path) => match super::cluster_cache(
            path,
            std::time::Duration::from_secs(args.sync_timeout_seconds),
        ) {
            Ok(cluster) => Some(cluster),
            Err(message) => {
                report.stderr.push_str(&format!("error: {message}\n"));
                report.exit_code = 2;
                return report;
            }
        },
        None => None,
    };
    let layered;
    let dra: &dyn DraFacts = match &cluster {
        Some((_runtime, cache)) => {
            layered = Layered {
                over: shipped,
                under: cache,
            };
            &layered
        }
        None => shipped.dra(),
    };
    for (file, documents, error) in inputs {
        let mut mutated = Vec::with_capacity(documents.len());
        for document in &documents {
            let mut value = document.value.clone();
            if let Err(message) =
                mutate_document(&mut value, document, policy, dra, &mut report.stderr)
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
    report.stdout = if args.diff {
        diffs
    } else if outputs.is_empty() {
        String::new()
    } else {
        manifest::render(&outputs, args.output)
    };
    report
}

/// Mutates one document in place: the object, or each item of a `List`
/// ([`manifest::visit_objects_mut`]); notes go to `log`.
fn mutate_document(
    value: &mut Value,
    document: &Document,
    policy: &Policy,
    dra: &dyn DraFacts,
    log: &mut String,
) -> Result<(), String> {
    let mut errors = Vec::new();
    manifest::visit_objects_mut(value, &mut |item, object| {
        let location = manifest::location(document, item);
        if let Err(error) = mutate_object(object, &location, policy, dra, log) {
            errors.push(error);
        }
    });
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("\n"))
    }
}

/// Mutates one object in place; `location` says where it is.
fn mutate_object(
    value: &mut Value,
    location: &str,
    policy: &Policy,
    dra: &dyn DraFacts,
    log: &mut String,
) -> Result<(), String> {
    let name = object_name(value, location);
    let Some(result) = object::mutate_object_with(value, policy, dra) else {
        return Ok(());
    };
    let mutation = result.map_err(|error| format!("{name}: {error}"))?;
    for warning in mutation.outcome.warnings() {
        log.push_str(&format!("warning: {name}: {warning}\n"));
    }
    match mutation.outcome.skipped() {
        Some(reason) => log.push_str(&format!("{name}: {}\n", reason.describe())),
        None if mutation.patch.is_empty() => log.push_str(&format!("{name}: unchanged\n")),
        None => {
            *value = crate::mutate::patch::apply(value, &mutation.patch)
                .map_err(|error| format!("{name}: {error}"))?;
            log.push_str(&format!("{name}: {}\n", mutation.outcome.summary()));
        }
    }
    Ok(())
}

fn object_name(value: &Value, location: &str) -> String {
    let kind = value
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or("object");
    let name = value
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("<unnamed>");
    format!("{location} {}/{name}", kind.to_lowercase())
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
