//! `gpu-guard mutate`: the mutation engine on manifests, as the webhook would apply it, one
//! document at a time: each is read, mutated and written before the next is read, and its
//! notes reach stderr as it is done.

use std::io::{self, Write};
use std::path::PathBuf;

use clap::Args;
use serde_json::Value;

use super::inputs::{InputArgs, Inputs};
use super::tally::{self, Tally};
use super::{Log, exit};
use gpu_guard_core::devices::DraFacts;
use gpu_guard_core::guard::{ClusterView, Layered, StaticView};
use gpu_guard_core::kinds::{KINDS, Kind};
use gpu_guard_core::memory::avoid::{self, Avoidance, Memories};
use gpu_guard_core::memory::{self as memory, MEMORY_ANNOTATION, Memory, WorkloadRef};
use gpu_guard_core::mutate::{SkipReason, object, other_kinds};
use gpu_guard_core::policy::Policy;
use gpu_guard_manifest::{self as manifest, Document, DocumentWriter, Format};
use gpu_guard_runtime::cluster::ClusterCache;

#[derive(Debug, Args)]
pub struct MutateArgs {
    #[command(flatten)]
    pub input: InputArgs,
    /// Output format.
    #[arg(short = 'o', long = "output", value_parser = super::formats(), default_value = "yaml")]
    pub output: Format,
    /// Print a unified diff of each input against its mutated form instead of the
    /// manifests; exit 1 when there is a difference (as `diff` and `kubectl diff` do).
    #[arg(long)]
    pub diff: bool,
    /// Resolve DRA claims also from the ResourceClaimTemplates, ResourceClaims and
    /// DeviceClasses of the cluster this kubeconfig names (those in the input come first).
    /// Without it, only the input's are known: a claim it does not ship is reported, not
    /// guessed. A new pod of a Job also avoids the nodes in the device-failure record of its
    /// Job or JobSet in the cluster, besides those of the input's failed pods.
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// With --kubeconfig: how long to wait for the cluster's objects to be listed.
    #[arg(long, default_value_t = 30, value_name = "SECONDS")]
    pub sync_timeout_seconds: u64,
}

/// The words the first pass looks for: the kinds that resolve DRA claims, and Kubeflow
/// Trainer runtimes (`ClusterTrainingRuntime` holds the word too), for the TrainJobs that name
/// them.
const PRESCAN_KINDS: &[&str] = &["ResourceClaim", "DeviceClass", RUNTIME_KIND];
const RUNTIME_KIND: &str = "TrainingRuntime";

/// The words of the first pass that find the memory of device failures: pods that ran (their
/// `status.phase`), and Jobs or JobSets that carry a recorded memory.
const PRESCAN_MEMORY: &[&str] = &["phase", MEMORY_ANNOTATION];

/// The summary's outcomes, in order.
const OUTCOMES: &[&str] = &["mutated", "unchanged", "skipped", "not handled", "failed"];

pub(super) fn run(args: &MutateArgs, policy: &Policy, out: &mut dyn Write, log: &mut Log) -> i32 {
    let (inputs, errors) = Inputs::open(&args.input);
    for error in errors {
        log.error(&error.to_string());
    }
    // DRA claims are resolved from the ResourceClaimTemplates, ResourceClaims and
    // DeviceClasses anywhere in the input (a template may come after its Job).
    let mut shipped = StaticView::default();
    let mut runtimes = Vec::new();
    let mut memories = OfflineMemories::default();
    let mut ran = Vec::new();
    inputs.prescan(PRESCAN_MEMORY, &mut |object| {
        memories.learn(&object.value, &mut ran);
    });
    inputs.prescan(PRESCAN_KINDS, &mut |object| {
        if object
            .value
            .get("kind")
            .and_then(Value::as_str)
            .is_some_and(|kind| kind.ends_with(RUNTIME_KIND))
        {
            runtimes.push(object.value.clone());
        } else {
            shipped.add_dra_object(&object.value);
        }
    });
    // The runtime runs the cache's watches; it lives until the mutation is done.
    let cluster = match &args.kubeconfig {
        Some(path) => match super::cluster_cache(
            path,
            std::time::Duration::from_secs(args.sync_timeout_seconds),
        ) {
            Ok(cluster) => Some(cluster),
            Err(error) => {
                log.error(&error.to_string());
                if !args.diff {
                    let _ = DocumentWriter::new(out, args.output).finish();
                }
                return exit::INPUT;
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
    let runtimes = runtimes
        .iter()
        .filter_map(|runtime| KnownRuntime::judge(runtime, policy, dra))
        .collect();
    memories.record_failures(&ran, policy, dra);
    let memories = LayeredMemories {
        input: &memories,
        cluster: cluster.as_ref().map(|(_runtime, cache)| cache),
    };
    let mut run = Run {
        policy,
        dra,
        memories: &memories,
        runtimes,
        log,
        tally: Tally::default(),
        changed: false,
        unreadable: 0,
    };
    let written = if args.diff {
        run.diffs(&inputs, out)
    } else {
        run.manifests(&inputs, DocumentWriter::new(out, args.output))
    };
    let Run {
        log,
        tally,
        changed,
        unreadable,
        ..
    } = run;
    if let Err(error) = written
        && error.kind() != io::ErrorKind::BrokenPipe
    {
        log.error(&format!("cannot write the output: {error}"));
    }
    let mut summary = format!("summary: {} object(s)", tally.total());
    let line = tally.line(OUTCOMES);
    if !line.is_empty() {
        summary.push_str(&format!(": {line}"));
    }
    if unreadable > 0 {
        summary.push_str(&format!("; {unreadable} document(s) unreadable"));
    }
    log.note(&summary);
    if log.errors > 0 {
        exit::INPUT
    } else if args.diff && changed {
        exit::FINDINGS
    } else {
        exit::OK
    }
}

/// One run of `mutate`: what it mutates with, where its notes go, and what it counted.
struct Run<'a, 'w> {
    policy: &'a Policy,
    dra: &'a dyn DraFacts,
    /// The device failures of the input's workloads, for their new pods.
    memories: &'a dyn Memories,
    /// The Trainer runtimes of the input, for the TrainJobs that name them.
    runtimes: Vec<KnownRuntime>,
    log: &'a mut Log<'w>,
    tally: Tally,
    changed: bool,
    unreadable: usize,
}

impl Run<'_, '_> {
    /// Writes every document, mutated (unreadable ones as they came, when the format
    /// allows).
    fn manifests(
        &mut self,
        inputs: &Inputs,
        mut writer: DocumentWriter<&mut dyn Write>,
    ) -> io::Result<()> {
        for documents in inputs.each() {
            let Some(documents) = self.opened(documents) else {
                continue;
            };
            for item in documents {
                match item {
                    Ok(mut document) => {
                        let mut value = std::mem::take(&mut document.value);
                        self.mutate_document(&mut value, &document);
                        writer.write(&value)?;
                    }
                    Err(unreadable) => {
                        self.unreadable += 1;
                        let written = match &unreadable.text {
                            Some(text) => writer.write_raw(text)?,
                            None => false,
                        };
                        self.log.error(&format!(
                            "{} ({})",
                            unreadable.error,
                            if written {
                                "written through unchanged"
                            } else {
                                "left out of the output"
                            }
                        ));
                    }
                }
            }
        }
        writer.finish().map(drop)
    }

    /// Writes a unified diff per input of its documents against their mutated forms.
    fn diffs(&mut self, inputs: &Inputs, out: &mut dyn Write) -> io::Result<()> {
        for documents in inputs.each() {
            let Some(documents) = self.opened(documents) else {
                continue;
            };
            let mut diff = FileDiff::new(documents.source());
            for item in documents {
                match item {
                    Ok(mut document) => {
                        let mut value = std::mem::take(&mut document.value);
                        let before = manifest::to_yaml(&value);
                        self.mutate_document(&mut value, &document);
                        let after = manifest::to_yaml(&value);
                        self.changed |= diff.add(&before, &after, out)?;
                    }
                    Err(unreadable) => {
                        self.unreadable += 1;
                        self.log.error(&unreadable.error.to_string());
                    }
                }
            }
        }
        Ok(())
    }

    /// The documents of an input, or `None` when it could not be opened (reported).
    fn opened(
        &mut self,
        documents: Result<manifest::Documents, manifest::InputError>,
    ) -> Option<manifest::Documents> {
        documents
            .inspect_err(|error| self.log.error(&error.to_string()))
            .ok()
    }

    /// Mutates one document in place: the object, or each item of a `List`
    /// ([`manifest::visit_objects_mut`]).
    fn mutate_document(&mut self, value: &mut Value, document: &Document) {
        manifest::visit_objects_mut(value, &mut |item, object| {
            let location = manifest::location(document, item);
            let _lines = document.field_lines(item);
            for unknown in manifest::unknown_fields(object) {
                let name = object_name(object, &location);
                self.log.warning(&format!("{name}: {unknown}"));
            }
            self.mutate_object(object, &location);
        });
    }

    /// Mutates one object in place; `location` says where it is.
    fn mutate_object(&mut self, value: &mut Value, location: &str) {
        let name = object_name(value, location);
        let kind = tally::kind_of(value).to_owned();
        if gpu_guard_core::kinds::of(value).is_some_and(|known| known.id == Kind::Pod)
            && self.avoid(value, &name, &kind)
        {
            return;
        }
        let Some(result) = object::mutate_object(value, self.policy, self.dra) else {
            self.not_handled(value, &name);
            self.tally.add("not handled", &kind);
            return;
        };
        let mutation = match result {
            Ok(mutation) => mutation,
            Err(error) => {
                self.log
                    .error(&format!("{name}: {error} (written through unchanged)"));
                self.tally.add("failed", &kind);
                return;
            }
        };
        for warning in mutation.outcome.warnings() {
            self.log.warning(&format!("{name}: {warning}"));
        }
        match mutation.outcome.skipped() {
            Some(reason) => {
                self.log.note(&format!("{name}: {}", reason.describe()));
                self.tally.add("skipped", &kind);
            }
            None if mutation.patch.is_empty() => {
                self.log.note(&format!("{name}: unchanged"));
                self.tally.add("unchanged", &kind);
            }
            None => match gpu_guard_core::mutate::patch::apply(value, &mutation.patch) {
                Ok(mutated) => {
                    *value = mutated;
                    self.log
                        .note(&format!("{name}: {}", mutation.outcome.summary()));
                    self.tally.add("mutated", &kind);
                }
                Err(error) => {
                    self.log
                        .error(&format!("{name}: {error} (written through unchanged)"));
                    self.tally.add("failed", &kind);
                }
            },
        }
    }
}

impl Run<'_, '_> {
    /// Keeps a new pod off the nodes where its workload failed of a device, as the webhook
    /// admits it ([`avoid::avoid_failed_nodes`]); returns whether it was changed (or failed to
    /// be). Every other pod goes on as any object.
    fn avoid(&mut self, value: &mut Value, name: &str, kind: &str) -> bool {
        match avoid::avoid_failed_nodes(value, self.policy, self.memories) {
            Avoidance::Unchanged => false,
            Avoidance::BadMemory { workload, error } => {
                self.log.warning(&format!(
                    "{name}: not kept off the nodes where {workload} failed: {error}"
                ));
                false
            }
            Avoidance::Excluded {
                workload,
                nodes,
                patch,
            } => {
                match gpu_guard_core::mutate::patch::apply(value, &patch) {
                    Ok(mutated) => {
                        *value = mutated;
                        self.log
                            .note(&format!("{name}: {}", avoid::describe(&workload, &nodes)));
                        self.tally.add("mutated", kind);
                    }
                    Err(error) => {
                        self.log
                            .error(&format!("{name}: {error} (written through unchanged)"));
                        self.tally.add("failed", kind);
                    }
                }
                true
            }
        }
    }

    /// Says what protects an object of a kind the engine does not mutate, or that nothing
    /// does ([`other_kinds`]): a TrainJob through its runtime, an operator's kind by what its
    /// operator creates, any other kind that carries pod templates not at all.
    fn not_handled(&mut self, value: &Value, name: &str) {
        if let Some(runtime) = other_kinds::trainjob_runtime(value) {
            let namespace = value
                .pointer("/metadata/namespace")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let known = runtime.name.as_deref().and_then(|runtime_name| {
                self.runtimes
                    .iter()
                    .find(|known| known.is(&runtime.kind, runtime_name, namespace))
                    .map(|known| known.status.as_str())
            });
            let message = format!("{name}: {}", runtime.describe(known));
            if known.is_some_and(|status| status.starts_with(NOT_PROTECTED)) {
                self.log.warning(&message);
            } else {
                self.log.note(&message);
            }
            return;
        }
        let api_kind = tally::api_kind(value);
        if let Some(other) = other_kinds::other_kind(value) {
            self.log.warning(&format!(
                "{name}: gpu-guard does not mutate {api_kind}, so its pods get no \
                 podFailurePolicy for device failures: {}",
                other.why
            ));
        } else if tally::carries_pod_template(value) && !tally::is_core_workload(value) {
            let mutated: Vec<&str> = KINDS
                .iter()
                .filter(|kind| kind.mutated)
                .map(|kind| kind.kind)
                .collect();
            self.log.warning(&format!(
                "{name}: gpu-guard does not mutate {api_kind}, although it carries pod \
                 templates: its pods get no podFailurePolicy for device failures (supported: \
                 {}; docs/mutation.md#what-is-not-handled)",
                mutated.join(", ")
            ));
        }
    }
}

/// The memories of the input's workloads, computed from the input as the controller records
/// them: the memory a Job or JobSet carries already (`kubectl get -o yaml` shows it), and
/// each device failure of a pod that ran ([`device_failure`](gpu_guard_core::health::pod::device_failure)), on its workload
/// ([`memory::workload_of`]).
#[derive(Debug, Default)]
struct OfflineMemories {
    memories: std::collections::BTreeMap<WorkloadRef, Memory>,
    /// Annotations that are not gpu-guard's memory, reported where a pod of theirs is.
    foreign: std::collections::BTreeMap<WorkloadRef, String>,
}

impl OfflineMemories {
    /// Takes the memory of a Job or JobSet, and keeps a pod that ran (in `ran`) for
    /// [`OfflineMemories::record_failures`] (which needs the DRA facts of the whole input).
    fn learn(&mut self, value: &Value, ran: &mut Vec<Value>) {
        let Some(known) = gpu_guard_core::kinds::of(value) else {
            return;
        };
        match known.id {
            Kind::Pod if value.pointer("/status/phase").is_some() => ran.push(value.clone()),
            Kind::Job | Kind::JobSet => {
                let text = value
                    .pointer("/metadata/annotations")
                    .and_then(|annotations| annotations.get(MEMORY_ANNOTATION))
                    .and_then(Value::as_str);
                let workload = WorkloadRef {
                    kind: if known.id == Kind::Job {
                        memory::WorkloadKind::Job
                    } else {
                        memory::WorkloadKind::JobSet
                    },
                    namespace: text_at(value, "/metadata/namespace"),
                    name: text_at(value, "/metadata/name"),
                };
                let Some(text) = text else {
                    return;
                };
                match Memory::of_annotation(Some(text)) {
                    Ok(memory) => {
                        let known = self.memories.entry(workload).or_default();
                        known.total = known.total.max(memory.total);
                        for failure in memory.failures {
                            known.record(failure);
                        }
                    }
                    Err(_) => {
                        self.foreign.insert(workload, text.to_owned());
                    }
                }
            }
            _ => {}
        }
    }

    /// Records the device failures of the pods that ran.
    fn record_failures(&mut self, ran: &[Value], policy: &Policy, dra: &dyn DraFacts) {
        for value in ran {
            let Ok(pod) = serde_json::from_value::<k8s_openapi::api::core::v1::Pod>(value.clone())
            else {
                continue;
            };
            if let (Some(workload), Some(failure)) = (
                memory::workload_of(&pod),
                gpu_guard_core::health::pod::device_failure(&pod, policy, dra),
            ) {
                self.memories.entry(workload).or_default().record(failure);
            }
        }
    }
}

impl Memories for OfflineMemories {
    fn memory_annotation(&self, workload: &WorkloadRef) -> Option<String> {
        self.over(workload, None)
    }
}

impl OfflineMemories {
    /// The memory of `workload`: the input's, recorded over `under` (the cluster's record,
    /// with --kubeconfig), as the controller would record the input's pods on it. A record
    /// that is not gpu-guard's, in the input or the cluster, is returned as it is, to be
    /// reported.
    fn over(&self, workload: &WorkloadRef, under: Option<String>) -> Option<String> {
        if let Some(foreign) = self.foreign.get(workload) {
            return Some(foreign.clone());
        }
        let input = self.memories.get(workload);
        let Some(under) = under else {
            return input
                .filter(|memory| !memory.failures.is_empty())
                .map(Memory::to_annotation);
        };
        let (Some(input), Ok(mut memory)) = (input, Memory::of_annotation(Some(&under))) else {
            return Some(under);
        };
        for failure in &input.failures {
            memory.record(failure.clone());
        }
        Some(memory.to_annotation())
    }
}

/// The input's memories over the cluster's (`--kubeconfig`).
struct LayeredMemories<'a> {
    input: &'a OfflineMemories,
    cluster: Option<&'a ClusterCache>,
}

impl Memories for LayeredMemories<'_> {
    fn memory_annotation(&self, workload: &WorkloadRef) -> Option<String> {
        let under = self
            .cluster
            .and_then(|cluster| cluster.memory_annotation(workload));
        self.input.over(workload, under)
    }
}

fn text_at(value: &Value, pointer: &str) -> String {
    value
        .pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned()
}

/// How a known Trainer runtime's status begins when gpu-guard does not protect it.
const NOT_PROTECTED: &str = "not protected";

/// A Kubeflow Trainer runtime found in the input, and what gpu-guard makes of it, for the
/// TrainJobs that name it.
struct KnownRuntime {
    kind: String,
    name: String,
    namespace: String,
    /// `protected: ...` or `not protected: ...`.
    status: String,
}

impl KnownRuntime {
    /// Reads a runtime object and judges it with the engine, as the webhook would at admission.
    fn judge(value: &Value, policy: &Policy, dra: &dyn DraFacts) -> Option<Self> {
        let text = |pointer: &str| {
            value
                .pointer(pointer)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        let status = match object::mutate_object(value, policy, dra)? {
            Err(error) => format!("{NOT_PROTECTED}: {error}"),
            Ok(mutation) => match mutation.outcome.skipped() {
                Some(SkipReason::NotDeviceWorkload) => format!(
                    "{NOT_PROTECTED}: none of its replicated Jobs requests a device resource \
                     listed in the policy"
                ),
                Some(reason) => format!("{NOT_PROTECTED}: {}", reason.describe()),
                None if !mutation.patch.is_empty() => {
                    "protected: gpu-guard mutates it at admission".to_owned()
                }
                None if carries_gang_rules(value) => {
                    "protected: it carries gpu-guard's rules".to_owned()
                }
                None => format!(
                    "{NOT_PROTECTED}: {}",
                    mutation
                        .outcome
                        .warnings()
                        .first()
                        .map_or("gpu-guard leaves it unchanged", String::as_str)
                ),
            },
        };
        Some(Self {
            kind: text("/kind"),
            name: text("/metadata/name"),
            namespace: text("/metadata/namespace"),
            status,
        })
    }

    /// Whether this is the runtime a TrainJob in `namespace` names (a TrainingRuntime is in
    /// the TrainJob's namespace; a manifest may leave both namespaces to `kubectl -n`).
    fn is(&self, kind: &str, name: &str, namespace: &str) -> bool {
        self.kind == kind
            && self.name == name
            && (kind != "TrainingRuntime"
                || self.namespace == namespace
                || self.namespace.is_empty()
                || namespace.is_empty())
    }
}

/// Whether a Trainer runtime's JobSet template carries gpu-guard's gang rules already.
fn carries_gang_rules(value: &Value) -> bool {
    value
        .pointer("/spec/template/spec/failurePolicy/rules")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|rule| rule.get("name").and_then(Value::as_str))
        .any(|name| name.starts_with(gpu_guard_core::mutate::jobset::RULE_PREFIX))
}

fn object_name(value: &Value, location: &str) -> String {
    let kind = value
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or("object");
    let name = value.pointer("/metadata/name").and_then(Value::as_str);
    // A pod the Job controller creates has only a prefix; the API server completes it.
    let generated = value
        .pointer("/metadata/generateName")
        .and_then(Value::as_str)
        .map(|prefix| format!("{prefix}<generated>"));
    let name = name
        .map(str::to_owned)
        .or(generated)
        .unwrap_or_else(|| "<unnamed>".to_owned());
    format!("{location} {}/{name}", kind.to_lowercase())
}

/// The unified diff of one input, built document by document: the same hunks as a diff of
/// the whole rendered input (`---` separators included), except that a hunk never spans two
/// documents.
struct FileDiff {
    file: String,
    /// Lines of the input's rendering before the next document, before and after.
    old_lines: usize,
    new_lines: usize,
    documents: usize,
    header_written: bool,
}

impl FileDiff {
    fn new(file: &str) -> Self {
        Self {
            file: file.trim_start_matches('/').to_owned(),
            old_lines: 0,
            new_lines: 0,
            documents: 0,
            header_written: false,
        }
    }

    /// Adds one document's rendering before and after; returns whether they differ.
    fn add(&mut self, before: &str, after: &str, out: &mut dyn Write) -> io::Result<bool> {
        let separator = if self.documents > 0 { "---\n" } else { "" };
        self.documents += 1;
        let (old, new) = (
            format!("{separator}{before}"),
            format!("{separator}{after}"),
        );
        let (old_offset, new_offset) = (self.old_lines, self.new_lines);
        self.old_lines += old.lines().count();
        self.new_lines += new.lines().count();
        if before == after {
            return Ok(false);
        }
        if !self.header_written {
            self.header_written = true;
            writeln!(out, "--- a/{}\n+++ b/{}", self.file, self.file)?;
        }
        let diff = similar::TextDiff::from_lines(&old, &new);
        for group in diff.grouped_ops(3) {
            let (Some(first), Some(last)) = (group.first(), group.last()) else {
                continue;
            };
            let old_range = first.old_range().start..last.old_range().end;
            let new_range = first.new_range().start..last.new_range().end;
            writeln!(
                out,
                "@@ -{} +{} @@",
                hunk_range(old_offset + old_range.start, old_range.len()),
                hunk_range(new_offset + new_range.start, new_range.len())
            )?;
            for op in &group {
                for change in diff.iter_changes(op) {
                    let sign = match change.tag() {
                        similar::ChangeTag::Equal => ' ',
                        similar::ChangeTag::Delete => '-',
                        similar::ChangeTag::Insert => '+',
                    };
                    write!(out, "{sign}{}", change.value())?;
                    if change.missing_newline() {
                        writeln!(out)?;
                    }
                }
            }
        }
        Ok(true)
    }
}

/// A hunk's range as unified diffs write it: `start,length` (1-based), `start` alone for one
/// line, and the line before for none.
fn hunk_range(start: usize, length: usize) -> String {
    match length {
        1 => format!("{}", start + 1),
        0 => format!("{start},0"),
        _ => format!("{},{length}", start + 1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Applies a unified diff (one file) to `old`, checking every context and removed line.
    fn apply(old: &str, diff: &str) -> String {
        let old: Vec<&str> = old.split_inclusive('\n').collect();
        let mut new = String::new();
        let mut next = 0; // the next line of `old` to copy
        for line in diff.split_inclusive('\n').skip(2) {
            if let Some(header) = line.strip_prefix("@@ -") {
                let range = header.split(' ').next().unwrap();
                let start: usize = range.split(',').next().unwrap().parse().unwrap();
                let length: usize = range.split(',').nth(1).map_or(1, |l| l.parse().unwrap());
                let start = if length == 0 { start } else { start - 1 };
                for line in &old[next..start] {
                    new.push_str(line);
                }
                next = start;
                continue;
            }
            let (sign, text) = line.split_at(1);
            match sign {
                " " | "-" => {
                    assert_eq!(old[next], text, "context or removed line {next}");
                    next += 1;
                    if sign == " " {
                        new.push_str(text);
                    }
                }
                "+" => new.push_str(text),
                other => panic!("unexpected line {other}{text}"),
            }
        }
        for line in &old[next..] {
            new.push_str(line);
        }
        new
    }

    #[test]
    fn the_diff_built_document_by_document_applies_to_the_whole_rendering() {
        let documents: Vec<(String, String)> = (0..6)
            .map(|i| {
                let before: String = (0..12).map(|l| format!("doc{i} line{l}\n")).collect();
                let after = match i % 3 {
                    // unchanged, changed in the middle, changed at both ends
                    0 => before.clone(),
                    1 => before
                        .replace("line5\n", "line5\nadded\n")
                        .replace("line7\n", ""),
                    _ => format!("first\n{}last\n", before.replace("line0\n", "LINE0\n")),
                };
                (before, after)
            })
            .collect();
        let mut out = Vec::new();
        let mut diff = FileDiff::new("/x.yaml");
        let mut changed = false;
        for (before, after) in &documents {
            changed |= diff.add(before, after, &mut out).unwrap();
        }
        assert!(changed);
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.starts_with("--- a/x.yaml\n+++ b/x.yaml\n@@ "),
            "{text}"
        );
        let whole = |pick: fn(&(String, String)) -> &String| {
            documents
                .iter()
                .map(pick)
                .cloned()
                .collect::<Vec<_>>()
                .join("---\n")
        };
        assert_eq!(apply(&whole(|d| &d.0), &text), whole(|d| &d.1), "{text}");

        let mut out = Vec::new();
        let mut diff = FileDiff::new("same.yaml");
        assert!(!diff.add("a\n", "a\n", &mut out).unwrap());
        assert!(out.is_empty(), "no diff, no header");
    }
}
