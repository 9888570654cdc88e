//! The webhook configurations: which kinds the API server sends to the mutating and the
//! validating webhook (read from the kind registry, [`gpu_guard_core::kinds`]), from which
//! namespaces and objects, and how it reaches the server.

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhook, MutatingWebhookConfiguration, RuleWithOperations, ServiceReference,
    ValidatingWebhook, ValidatingWebhookConfiguration, WebhookClientConfig,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use serde_json::Value;

use gpu_guard_core::kinds::{KINDS, Scope, WorkloadKind};
use gpu_guard_core::memory::failure::JOB_NAME_LABEL;
use gpu_guard_core::wellknown::{ENABLED_LABEL, MUTATE_PATH, VALIDATE_PATH};

use super::{NAMESPACE_NAME_LABEL, Options, SERVICE_PORT, meta, to_value};

/// The name of the mutating webhook (in its configuration).
pub const MUTATING_WEBHOOK_NAME: &str = "jobs.gpu-guard.io";

/// The name of the validating webhook.
pub const VALIDATING_WEBHOOK_NAME: &str = "workloads.gpu-guard.io";

/// The webhook timeout: far below the API server's 30 s, so a slow webhook cannot stall writes.
pub const TIMEOUT_SECONDS: i32 = 5;

/// Opted-in namespaces, never kube-system nor gpu-guard's own: the webhooks can never block
/// their own recovery or the control plane's.
fn namespace_selector(own_namespace: &str) -> LabelSelector {
    LabelSelector {
        match_expressions: Some(vec![
            LabelSelectorRequirement {
                key: ENABLED_LABEL.to_owned(),
                operator: "In".to_owned(),
                values: Some(vec!["true".to_owned()]),
            },
            LabelSelectorRequirement {
                key: NAMESPACE_NAME_LABEL.to_owned(),
                operator: "NotIn".to_owned(),
                values: Some(vec![
                    "kube-system".to_owned(),
                    "kube-node-lease".to_owned(),
                    own_namespace.to_owned(),
                ]),
            },
        ]),
        ..LabelSelector::default()
    }
}

fn client_config(options: &Options, path: &str) -> WebhookClientConfig {
    let ca_bundle = options.ca_bundle.clone().map(ByteString);
    match &options.local_url {
        Some(base) => WebhookClientConfig {
            url: Some(format!("{}{path}", base.trim_end_matches('/'))),
            ca_bundle,
            ..WebhookClientConfig::default()
        },
        None => WebhookClientConfig {
            service: Some(ServiceReference {
                name: options.service_name.clone(),
                namespace: options.namespace.clone(),
                path: Some(path.to_owned()),
                port: Some(SERVICE_PORT),
            }),
            ca_bundle,
            ..WebhookClientConfig::default()
        },
    }
}

/// The operations both webhooks are called for (the pods' webhook: CREATE only). The mutating webhook changes Jobs, CronJobs
/// (their `jobTemplate`, so the protection is visible on the CronJob), JobSets and Kubeflow
/// Trainer runtimes (their JobSet template) at CREATE, and at UPDATE only puts back what a
/// server-side apply dropped of gpu-guard's changes. The validating webhook judges at CREATE
/// and UPDATE: a Pod can gain tolerations and, while scheduling-gated, node selectors after it
/// is created; Kueue admits a suspended Job or JobSet by an UPDATE that adds its flavor's node
/// selector and tolerations.
const OPERATIONS: [&str; 2] = ["CREATE", "UPDATE"];

/// The registration rules of the kinds of `scope` that `wanted` selects in the kind registry:
/// one rule per API group and version, its resources in the registry's order. Subresources
/// are not listed, so never sent; when the JobSet or Trainer CRDs are not installed, the API
/// server never sends those kinds.
///
/// ClusterTrainingRuntimes are cluster-scoped: a `namespaceSelector` does not filter them, so a
/// webhook of their own ([`CLUSTER_RUNTIMES_WEBHOOK_NAME`]) selects those labelled
/// `gpu-guard.io/enabled: "true"` (the opt-in of a cluster-scoped object).
fn rules(scope: Scope, wanted: fn(&WorkloadKind) -> bool) -> Vec<RuleWithOperations> {
    rules_for(scope, wanted, &OPERATIONS)
}

/// [`rules`] for `operations`.
fn rules_for(
    scope: Scope,
    wanted: fn(&WorkloadKind) -> bool,
    operations: &[&str],
) -> Vec<RuleWithOperations> {
    let mut rules: Vec<RuleWithOperations> = Vec::new();
    for known in KINDS
        .iter()
        .filter(|known| known.scope == scope && wanted(known))
    {
        let same_api = |rule: &&mut RuleWithOperations| {
            rule.api_groups.as_deref() == Some(&[known.group.to_owned()][..])
                && rule.api_versions.as_deref() == Some(&[known.version.to_owned()][..])
        };
        match rules.iter_mut().find(same_api) {
            Some(rule) => rule
                .resources
                .get_or_insert_with(Vec::new)
                .push(known.resource.to_owned()),
            None => rules.push(RuleWithOperations {
                api_groups: Some(vec![known.group.to_owned()]),
                api_versions: Some(vec![known.version.to_owned()]),
                resources: Some(vec![known.resource.to_owned()]),
                operations: Some(operations.iter().map(|o| (*o).to_owned()).collect()),
                scope: Some(scope.as_str().to_owned()),
            }),
        }
    }
    rules
}

/// The kinds the mutating webhook is called for.
fn mutated(known: &WorkloadKind) -> bool {
    known.mutated
}

/// The kinds whose placement the mutating webhook decides at CREATE (Job pods).
fn placed(known: &WorkloadKind) -> bool {
    known.placed
}

/// The kinds the validating webhook is called for.
fn guarded(known: &WorkloadKind) -> bool {
    known.guarded
}

/// The name of the webhooks for cluster-scoped Trainer runtimes (in both configurations).
pub const CLUSTER_RUNTIMES_WEBHOOK_NAME: &str = "clustertrainingruntimes.gpu-guard.io";

/// The name of the mutating webhook for the pods of Jobs.
pub const PODS_WEBHOOK_NAME: &str = "job-pods.gpu-guard.io";

/// The pods' webhook timeout: a pod is answered from memory, and the Job controller's pod
/// creation should never wait on it for long (with `failurePolicy: Ignore`, a timeout admits
/// the pod as it is).
pub const PODS_TIMEOUT_SECONDS: i32 = 2;

/// The pods the Job controller creates: they carry `batch.kubernetes.io/job-name` (kubernetes
/// `pkg/controller/job/job_controller.go`, set on every pod of a Job since 1.27). The
/// webhook is called for these only, not for every pod of the namespace.
fn job_pods() -> LabelSelector {
    LabelSelector {
        match_expressions: Some(vec![LabelSelectorRequirement {
            key: JOB_NAME_LABEL.to_owned(),
            operator: "Exists".to_owned(),
            values: None,
        }]),
        ..LabelSelector::default()
    }
}

fn opted_in_objects() -> LabelSelector {
    LabelSelector {
        match_labels: Some([(ENABLED_LABEL.to_owned(), "true".to_owned())].into()),
        ..LabelSelector::default()
    }
}

/// The two webhook configurations.
pub fn webhooks(options: &Options) -> Vec<Value> {
    let own = options.namespace.as_str();
    let mutating = MutatingWebhookConfiguration {
        metadata: meta("gpu-guard", None),
        webhooks: Some(vec![
            MutatingWebhook {
                name: MUTATING_WEBHOOK_NAME.to_owned(),
                admission_review_versions: vec!["v1".to_owned()],
                client_config: client_config(options, MUTATE_PATH),
                failure_policy: Some(options.mutate_failure_policy.as_str().to_owned()),
                match_policy: Some("Equivalent".to_owned()),
                namespace_selector: Some(namespace_selector(own)),
                reinvocation_policy: Some("IfNeeded".to_owned()),
                rules: Some(rules(Scope::Namespaced, mutated)),
                side_effects: "None".to_owned(),
                timeout_seconds: Some(TIMEOUT_SECONDS),
                ..MutatingWebhook::default()
            },
            MutatingWebhook {
                name: CLUSTER_RUNTIMES_WEBHOOK_NAME.to_owned(),
                admission_review_versions: vec!["v1".to_owned()],
                client_config: client_config(options, MUTATE_PATH),
                failure_policy: Some(options.mutate_failure_policy.as_str().to_owned()),
                match_policy: Some("Equivalent".to_owned()),
                object_selector: Some(opted_in_objects()),
                reinvocation_policy: Some("IfNeeded".to_owned()),
                rules: Some(rules(Scope::Cluster, mutated)),
                side_effects: "None".to_owned(),
                timeout_seconds: Some(TIMEOUT_SECONDS),
                ..MutatingWebhook::default()
            },
            // A new pod of a Job is kept off the nodes where its workload's devices failed.
            // Best effort, whatever --mutate-failure-policy says: a webhook that is down must
            // never stop a Job from creating its pods. Node affinity is immutable after
            // CREATE, and nothing gpu-guard adds is undone by another webhook's change: no
            // reinvocation.
            MutatingWebhook {
                name: PODS_WEBHOOK_NAME.to_owned(),
                admission_review_versions: vec!["v1".to_owned()],
                client_config: client_config(options, MUTATE_PATH),
                failure_policy: Some("Ignore".to_owned()),
                match_policy: Some("Equivalent".to_owned()),
                namespace_selector: Some(namespace_selector(own)),
                object_selector: Some(job_pods()),
                reinvocation_policy: Some("Never".to_owned()),
                rules: Some(rules_for(Scope::Namespaced, placed, &["CREATE"])),
                side_effects: "None".to_owned(),
                timeout_seconds: Some(PODS_TIMEOUT_SECONDS),
                ..MutatingWebhook::default()
            },
        ]),
    };
    let validating = ValidatingWebhookConfiguration {
        metadata: meta("gpu-guard", None),
        webhooks: Some(vec![
            ValidatingWebhook {
                name: VALIDATING_WEBHOOK_NAME.to_owned(),
                admission_review_versions: vec!["v1".to_owned()],
                client_config: client_config(options, VALIDATE_PATH),
                failure_policy: Some(options.validate_failure_policy.as_str().to_owned()),
                match_policy: Some("Equivalent".to_owned()),
                namespace_selector: Some(namespace_selector(own)),
                rules: Some(rules(Scope::Namespaced, guarded)),
                side_effects: "None".to_owned(),
                timeout_seconds: Some(TIMEOUT_SECONDS),
                ..ValidatingWebhook::default()
            },
            ValidatingWebhook {
                name: CLUSTER_RUNTIMES_WEBHOOK_NAME.to_owned(),
                admission_review_versions: vec!["v1".to_owned()],
                client_config: client_config(options, VALIDATE_PATH),
                failure_policy: Some(options.validate_failure_policy.as_str().to_owned()),
                match_policy: Some("Equivalent".to_owned()),
                object_selector: Some(opted_in_objects()),
                rules: Some(rules(Scope::Cluster, guarded)),
                side_effects: "None".to_owned(),
                timeout_seconds: Some(TIMEOUT_SECONDS),
                ..ValidatingWebhook::default()
            },
        ]),
    };
    vec![to_value(mutating), to_value(validating)]
}
