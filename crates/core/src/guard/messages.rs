//! The guard's answers in words: the full message of a violation (a denial, an audit
//! annotation, `gpu-guard check`), the admission warnings of at most 120 characters each, and
//! what to do about a workload that could not be judged.

use std::fmt::Write as _;

use super::verdict::{Priority, PriorityViolation, Unjudged};
use crate::devices::UnresolvedClaim;

impl Unjudged {
    /// The full explanation, with what to do, for `gpu-guard check`: a class can be listed in
    /// the policy file, given with its `--priority-class` flag, or read from a cluster.
    pub fn message(&self) -> String {
        self.explanation(Offline::Check)
    }

    /// The full explanation for the webhook's audit log: `serve` learns a class from the
    /// policy file, or from the cluster when it runs with one (not `--no-cluster`).
    pub fn webhook_message(&self) -> String {
        self.explanation(Offline::Webhook)
    }

    fn explanation(&self, offline: Offline) -> String {
        match self {
            Self::PriorityClass(class) => {
                let flag = match offline {
                    Offline::Check => format!("pass --priority-class {class}=VALUE, "),
                    Offline::Webhook => String::new(),
                };
                format!(
                    "PriorityClass {class:?} is not known offline, so the priority of this \
                     workload, which targets GPU nodes, was not checked; list it in \
                     guard.offline.priorityClasses, {flag}or {}",
                    offline.connect()
                )
            }
            Self::Claims(claims) => format!(
                "whether this workload uses a device decides its minimum priority, and that \
                 depends on DRA claims gpu-guard cannot resolve ({}), so it was not checked; \
                 {}",
                claims
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("; "),
                match offline {
                    Offline::Check => format!(
                        "ship the ResourceClaimTemplate beside the workload, or {}",
                        offline.connect()
                    ),
                    Offline::Webhook => offline.connect().to_owned(),
                }
            ),
        }
    }

    /// The short admission warning.
    pub fn warning(&self) -> String {
        match self {
            Self::PriorityClass(class) => {
                format!("priority not checked: PriorityClass {class:?} is unknown offline")
            }
            // Only what is unknown (`ResourceClaimTemplate ns/x is not known`): a warning is
            // cut at 120 characters.
            Self::Claims(claims) => {
                let unknown: Vec<String> = claims.iter().map(UnresolvedClaim::what).collect();
                format!("priority not checked: {}", unknown.join("; "))
            }
        }
    }
}

/// Who explains an unjudged workload: the fixes each can offer differ.
#[derive(Clone, Copy)]
enum Offline {
    /// `gpu-guard check`: manifests, its flags, or `--kubeconfig`.
    Check,
    /// `gpu-guard serve` without a cluster: the policy file, or a cluster.
    Webhook,
}

impl Offline {
    fn connect(self) -> &'static str {
        match self {
            Self::Check => "read the cluster's with --kubeconfig",
            Self::Webhook => "run the webhook with a cluster (without --no-cluster)",
        }
    }
}

impl PriorityViolation {
    /// The whole story in one message (a denial, an audit annotation, `gpu-guard check`):
    /// what targets GPU nodes, the priority found, the minimum and how to fix it, for each
    /// violating pod template.
    pub fn message(&self) -> String {
        let mut text = self.template_message();
        for other in &self.other_templates {
            text.push(' ');
            text.push_str(&other.template_message());
        }
        text
    }

    /// [`PriorityViolation::message`] of this pod template alone.
    fn template_message(&self) -> String {
        let mut text = self.subject.clone();
        if let Some(job) = &self.replicated_job {
            let _ = write!(text, " replicatedJob {job:?}");
        }
        let _ = write!(
            text,
            " targets GPU nodes {}, so it needs priority >= {}, but {}. Why it targets GPU \
             nodes: ",
            if self.uses_device {
                "and uses a device"
            } else {
                "without using a device"
            },
            self.minimum,
            self.priority_found(),
        );
        for (index, target) in self.targets.iter().enumerate() {
            if index > 0 {
                text.push_str("; ");
            }
            let _ = write!(text, "{} {}", target.path, target.what);
        }
        let _ = write!(text, ". Fix: {}.", self.fix());
        text
    }

    /// The same, as admission warnings of at most 120 characters each (the API server's limit):
    /// the verdict, one line per reason, and the fix, for each violating pod template.
    pub fn warnings(&self) -> Vec<String> {
        let mut warnings = self.template_warnings();
        for other in &self.other_templates {
            warnings.extend(other.template_warnings());
        }
        warnings
    }

    /// [`PriorityViolation::warnings`] of this pod template alone.
    fn template_warnings(&self) -> Vec<String> {
        let mut warnings = vec![format!(
            "{}: priority {} is below the minimum {} for GPU nodes",
            self.subject,
            match &self.priority {
                Priority::Known { value, .. } => value.to_string(),
                Priority::UnknownClass(class) => format!("unknown (no PriorityClass {class:?})"),
            },
            self.minimum
        )];
        // On its own line: the verdict line with it would often pass 120 characters.
        if let Some(job) = &self.replicated_job {
            warnings.push(format!("in replicatedJob {job:?}:"));
        }
        // Paths relative to the pod spec, node-affinity ones from their term: a warning is cut
        // at 120 characters.
        let full = self.class_path.to_string();
        let spec_prefix = full.strip_suffix("priorityClassName").unwrap_or_default();
        for target in &self.targets {
            let path = target.path.to_string();
            let short = match path.find("nodeSelectorTerms") {
                Some(at) => &path[at..],
                None => path.strip_prefix(spec_prefix).unwrap_or(&path),
            };
            warnings.push(format!("{short}: {}", target.what));
        }
        warnings.push(match &self.priority {
            Priority::UnknownClass(class) => {
                format!(
                    "fix: create PriorityClass {class:?} (value >= {})",
                    self.minimum
                )
            }
            Priority::Known { .. } => format!(
                "fix: set priorityClassName to a class with value >= {}",
                self.minimum
            ),
        });
        if !self.uses_device {
            for undo in self.undo_list() {
                warnings.push(format!("or, if it needs no GPU node, remove {undo}"));
            }
        }
        warnings
    }

    /// What to remove to stop targeting GPU nodes, each once, in order.
    fn undo_list(&self) -> Vec<&str> {
        let mut undo: Vec<&str> = Vec::new();
        for target in &self.targets {
            if !undo.contains(&target.undo.as_str()) {
                undo.push(&target.undo);
            }
        }
        undo
    }

    fn priority_found(&self) -> String {
        match &self.priority {
            Priority::Known { value, source } => format!("its priority is {value} ({source})"),
            Priority::UnknownClass(class) => {
                format!("its priorityClassName {class:?} names no PriorityClass the cluster has")
            }
        }
    }

    /// How to fix it: a class high enough, or (when it uses no device) stop targeting GPU nodes;
    /// for this pod template (each of `other_templates` has its own).
    pub fn fix(&self) -> String {
        let mut fix = match &self.priority {
            Priority::UnknownClass(class) => format!(
                "create PriorityClass {class:?} with value >= {} or set {} to an existing class \
                 with such a value",
                self.minimum, self.class_path
            ),
            Priority::Known { .. } => format!(
                "set {} to a PriorityClass with value >= {}",
                self.class_path, self.minimum
            ),
        };
        if !self.uses_device {
            let undo = self.undo_list();
            let list = match undo.split_last() {
                Some((last, [])) => (*last).to_owned(),
                Some((last, rest)) => format!("{} and {last}", rest.join(", ")),
                None => String::new(),
            };
            let _ = write!(fix, ", or remove {list} if it does not need a GPU node");
        }
        fix
    }
}
