//! `gpu-guard check`: the flags and the command; [`findings`] judges the objects. Each
//! document is judged and reported as it is read.

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use serde_json::json;

use super::inputs::{InputArgs, Inputs};
use super::tally::Tally;
use super::{Log, exit};

mod findings;

use gpu_guard_core::guard::{ClusterView, StaticView};
use gpu_guard_core::policy::Policy;
use gpu_guard_manifest as manifest;

#[derive(Debug, Args)]
pub struct CheckArgs {
    #[command(flatten)]
    pub input: InputArgs,
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

/// The summary's outcomes of objects that get no verdict.
const FACTS: &str = "read as cluster facts";
const NOT_JUDGED: &str = "not judged";

pub(super) fn run(args: &CheckArgs, policy: &Policy, out: &mut dyn Write, log: &mut Log) -> i32 {
    let mut report = Report::new(out, args.output);
    let (inputs, open_errors) = Inputs::open(&args.input);
    for error in open_errors {
        report.error(log, error.to_string());
    }
    // The first pass: the cluster facts the inputs ship (a Job may come before its class).
    let mut facts = match &args.kubeconfig {
        Some(_) => StaticView::default(),
        None => StaticView::from_policy(&policy.guard.offline),
    };
    inputs.prescan(findings::FACT_KINDS, &mut |object| {
        // Errors are reported where the object is, in the second pass.
        let _ = findings::learn(&mut facts, object);
    });
    if let Err(error) = findings::add_flags(&mut facts, &args.priority_classes) {
        report.error(log, error.to_string());
        return report.finish(log, &Tally::default(), exit::INPUT);
    }
    // The runtime runs the cache's watches; it lives until the check is done.
    let cluster = match &args.kubeconfig {
        Some(path) => {
            match super::cluster_cache(path, Duration::from_secs(args.sync_timeout_seconds)) {
                Ok(cluster) => Some(cluster),
                Err(error) => {
                    report.error(log, error.to_string());
                    return report.finish(log, &Tally::default(), exit::INPUT);
                }
            }
        }
        None => None,
    };
    let layered;
    let view: &dyn ClusterView = match &cluster {
        Some((_runtime, cache)) => {
            layered = gpu_guard_core::guard::Layered {
                over: facts,
                under: cache,
            };
            &layered
        }
        None => &facts,
    };
    let mut tally = Tally::default();
    for documents in inputs.each() {
        let documents = match documents {
            Ok(documents) => documents,
            Err(error) => {
                report.error(log, error.to_string());
                continue;
            }
        };
        for item in documents {
            let document = match item {
                Ok(document) => document,
                Err(unreadable) => {
                    report.error(log, unreadable.error.to_string());
                    continue;
                }
            };
            let objects = manifest::objects(std::slice::from_ref(&document));
            for warning in objects.iter().flat_map(manifest::Object::unknown_fields) {
                report.warning(log, warning);
            }
            // The first pass learnt the facts; their errors are reported here, in place.
            for object in objects.iter().filter(|o| findings::is_fact(&o.value)) {
                if let Err(error) = findings::learn(&mut StaticView::default(), object) {
                    report.error(log, error.to_string());
                }
            }
            // Decode errors name their line (of a single object; a List's items are judged
            // together, so not theirs).
            let _lines = document.field_lines(None);
            let checked = findings::check(&objects, policy, view, &args.namespace);
            for finding in &checked.findings {
                tally.add(finding.verdict, &finding.kind);
                report.finding(finding);
            }
            for error in checked.errors {
                report.error(log, error);
            }
            for object in checked.not_judged {
                if object.is_fact {
                    tally.add(FACTS, &object.kind);
                    continue;
                }
                tally.add(NOT_JUDGED, &object.kind);
                if object.carries_pod_template {
                    // The validating webhook's rules include Pods: whatever operator creates
                    // them, they are judged then.
                    report.warning(
                        log,
                        format!(
                            "{}: the guard does not judge {} in a manifest, although it \
                             carries pod templates: the pods its operator creates are judged \
                             by the validating webhook when they are created, and a pod that \
                             would be denied is refused then",
                            object.name, object.api_kind
                        ),
                    );
                } else if let Some(runtime) = &object.trainjob_runtime {
                    log.note(&format!(
                        "{}: not judged itself: the guard judges the JobSet Kubeflow Trainer \
                         builds from {} {} when it is created, and the runtime where it is \
                         given",
                        object.name,
                        runtime.kind,
                        runtime.name.as_deref().unwrap_or("(none named)")
                    ));
                }
            }
            if report.failed_output.is_some() {
                break;
            }
        }
    }
    let code = if !report.errors.is_empty() {
        exit::INPUT
    } else if tally.count("denied") > 0 {
        exit::FINDINGS
    } else {
        exit::OK
    };
    report.finish(log, &tally, code)
}

/// The report being written: text (a block per object, then a summary line) or one JSON
/// document (`{findings, errors, warnings, denied, summary}`), written as findings come.
struct Report<'a> {
    out: &'a mut dyn Write,
    format: CheckFormat,
    findings: usize,
    errors: Vec<String>,
    warnings: Vec<String>,
    /// The first write error; nothing more is written after it.
    failed_output: Option<io::Error>,
}

impl<'a> Report<'a> {
    fn new(out: &'a mut dyn Write, format: CheckFormat) -> Self {
        Self {
            out,
            format,
            findings: 0,
            errors: Vec::new(),
            warnings: Vec::new(),
            failed_output: None,
        }
    }

    fn write(&mut self, text: &str) {
        if self.failed_output.is_none()
            && let Err(error) = self.out.write_all(text.as_bytes())
        {
            self.failed_output = Some(error);
        }
    }

    fn error(&mut self, log: &mut Log, message: String) {
        log.error(&message);
        self.errors.push(message);
    }

    fn warning(&mut self, log: &mut Log, message: String) {
        log.warning(&message);
        self.warnings.push(message);
    }

    fn finding(&mut self, finding: &findings::Finding) {
        let text = match self.format {
            CheckFormat::Text => findings::render_finding(finding),
            CheckFormat::Json => {
                let mut text = String::from(if self.findings == 0 {
                    "{\n  \"findings\": [\n"
                } else {
                    ",\n"
                });
                text.push_str(&manifest::indented_json(finding, 4));
                text
            }
        };
        self.findings += 1;
        self.write(&text);
    }

    /// Writes the end of the report and returns the exit status.
    fn finish(mut self, log: &mut Log, tally: &Tally, code: i32) -> i32 {
        // Every outcome but these two is a finding's verdict.
        let verdicts: BTreeMap<&str, usize> = tally
            .outcomes()
            .filter(|(outcome, _)| ![FACTS, NOT_JUDGED].contains(outcome))
            .collect();
        let not_judged = tally.line(&[FACTS, NOT_JUDGED]);
        match self.format {
            CheckFormat::Text => {
                let line = findings::summary_line(&verdicts, &not_judged);
                self.write(&format!("{line}\n"));
            }
            CheckFormat::Json => {
                let start = if self.findings == 0 {
                    "{\n  \"findings\": [],\n"
                } else {
                    "\n  ],\n"
                };
                let rest = json!({
                    "errors": self.errors,
                    "warnings": self.warnings,
                    "denied": verdicts.contains_key("denied"),
                    "summary": tally.to_json(),
                });
                // The rest of the object, at the same indentation as "findings".
                let body = serde_json::to_string_pretty(&rest).expect("JSON values serialize");
                let inner = body
                    .strip_prefix("{\n")
                    .and_then(|body| body.strip_suffix("\n}"))
                    .unwrap_or_default();
                self.write(&format!("{start}{inner}\n}}\n"));
            }
        }
        if let Some(error) = self.failed_output.take()
            && error.kind() != io::ErrorKind::BrokenPipe
        {
            log.error(&format!("cannot write the output: {error}"));
            return exit::INPUT;
        }
        if let Err(error) = self.out.flush()
            && error.kind() != io::ErrorKind::BrokenPipe
        {
            log.error(&format!("cannot write the output: {error}"));
            return exit::INPUT;
        }
        code
    }
}
