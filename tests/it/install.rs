//! The installation in `webhook-config/`: generated files are up to date, and every file agrees
//! with the others and with the server (names, ports, paths, labels, RBAC, flags).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use axum::body::Body;
use axum::http::Request;
use clap::Parser;
use gpu_guard::cli::{Cli, Command};
use gpu_guard::install::{self, Options, PODS_WEBHOOK_NAME};
use gpu_guard_core::policy::Policy;
use gpu_guard_core::wellknown;
use gpu_guard_manifest as manifest;
use gpu_guard_runtime::cluster::RbacRule;
use gpu_guard_webhook::server::{self, AppState};
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration, WebhookClientConfig,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Container, Service};
use k8s_openapi::api::networking::v1::{NetworkPolicy, NetworkPolicyPeer, NetworkPolicyPort};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::Value;
use tower::ServiceExt;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn the_checked_in_base_local_overlay_and_controller_are_the_generators_output() {
    let stale =
        "stale: run the command in its first line (cargo run -- generate webhook-config ...)";
    let base = install::render(
        &install::base(&Options::default()),
        install::Generated::Base,
    );
    let controller = install::render(
        &install::controller(&Options::default()),
        install::Generated::Controller,
    );
    let local_options = Options {
        local_url: Some("https://127.0.0.1:8443".into()),
        ..Options::default()
    };
    let local = install::render(
        &[install::File {
            name: "webhooks.yaml",
            objects: install::webhooks(&local_options),
        }],
        install::Generated::Local,
    );
    for (dir, files) in [
        ("webhook-config/base", base),
        ("webhook-config/overlays/local", local),
        ("webhook-config/controller", controller),
    ] {
        let mut names: Vec<String> = std::fs::read_dir(root().join(dir))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".yaml"))
            .collect();
        names.sort();
        let mut expected: Vec<String> = files.iter().map(|(n, _)| n.clone()).collect();
        expected.sort();
        assert_eq!(names, expected, "{dir}: {stale}");
        for (name, text) in files {
            assert!(
                read(&root().join(dir).join(&name)) == text,
                "{dir}/{name} is {stale}"
            );
        }
    }
}

/// Every object of every YAML file under `webhook-config/`, by kind.
fn objects() -> BTreeMap<String, Vec<(PathBuf, Value)>> {
    let mut by_kind: BTreeMap<String, Vec<(PathBuf, Value)>> = BTreeMap::new();
    for file in manifest::expand(&root().join("webhook-config")).unwrap() {
        if file.components().any(|c| c.as_os_str() == "certs") {
            continue;
        }
        let (documents, error) = manifest::read(&file);
        assert!(error.is_empty(), "{}: {error:?}", file.display());
        for document in documents {
            let kind = document.value["kind"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            by_kind
                .entry(kind)
                .or_default()
                .push((file.clone(), document.value));
        }
    }
    by_kind
}

fn one<T: serde::de::DeserializeOwned>(
    objects: &BTreeMap<String, Vec<(PathBuf, Value)>>,
    kind: &str,
) -> Vec<T> {
    objects
        .get(kind)
        .unwrap_or_else(|| panic!("no {kind} in webhook-config/"))
        .iter()
        .map(|(path, value)| {
            serde_json::from_value(value.clone())
                .unwrap_or_else(|e| panic!("{}: {kind} does not decode: {e}", path.display()))
        })
        .collect()
}

async fn status(router: axum::Router, method: &str, path: &str) -> u16 {
    let request = Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/json")
        .body(Body::from("{}"))
        .unwrap();
    router.oneshot(request).await.unwrap().status().as_u16()
}

fn webhook_container(deployment: &Deployment) -> &Container {
    &deployment
        .spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .unwrap()
        .containers[0]
}

#[tokio::test]
async fn every_file_agrees_with_the_others_and_with_the_server() {
    let objects = objects();
    let services: Vec<Service> = one(&objects, "Service");
    let deployments: Vec<Deployment> = one(&objects, "Deployment");
    let pdbs: Vec<PodDisruptionBudget> = one(&objects, "PodDisruptionBudget");
    let mutating: Vec<MutatingWebhookConfiguration> = one(&objects, "MutatingWebhookConfiguration");
    let validating: Vec<ValidatingWebhookConfiguration> =
        one(&objects, "ValidatingWebhookConfiguration");
    let roles: Vec<ClusterRole> = one(&objects, "ClusterRole");
    let bindings: Vec<ClusterRoleBinding> = one(&objects, "ClusterRoleBinding");
    let named = |name: &str| {
        deployments
            .iter()
            .find(|d| d.metadata.name.as_deref() == Some(name))
            .unwrap_or_else(|| panic!("no Deployment {name}"))
    };
    let (service, deployment, pdb) = (&services[0], named("gpu-guard"), &pdbs[0]);
    let namespace = service.metadata.namespace.as_deref().unwrap();
    let state = AppState::new(Policy::embedded());

    // The Deployment's selector matches its pod labels, the Service's selector and the PDB's.
    let spec = deployment.spec.as_ref().unwrap();
    let pod_labels = spec
        .template
        .metadata
        .as_ref()
        .unwrap()
        .labels
        .clone()
        .unwrap();
    let selects = |selector: &BTreeMap<String, String>| {
        selector.iter().all(|(k, v)| pod_labels.get(k) == Some(v))
    };
    assert!(selects(spec.selector.match_labels.as_ref().unwrap()));
    assert!(selects(
        service.spec.as_ref().unwrap().selector.as_ref().unwrap()
    ));
    assert!(selects(
        pdb.spec
            .as_ref()
            .unwrap()
            .selector
            .as_ref()
            .unwrap()
            .match_labels
            .as_ref()
            .unwrap()
    ));
    assert!(
        spec.replicas.unwrap() >= 2,
        "two replicas, so one can go away"
    );

    // The container's args are valid `serve` flags, and its ports are the ones it listens on.
    let container = webhook_container(deployment);
    let args = std::iter::once("gpu-guard".to_owned()).chain(container.args.clone().unwrap());
    let Command::Serve(serve) = Cli::try_parse_from(args)
        .expect("the Deployment's args parse")
        .command
    else {
        panic!("the Deployment does not run serve")
    };
    let port = |name: &str| {
        container
            .ports
            .as_ref()
            .unwrap()
            .iter()
            .find(|p| p.name.as_deref() == Some(name))
            .unwrap_or_else(|| panic!("no container port {name}"))
            .container_port
    };
    assert_eq!(i32::from(serve.listen.port()), port("webhook"));
    assert_eq!(i32::from(serve.admin_listen.port()), port("admin"));
    // The certificate files are in the mounted Secret.
    let mount = &container.volume_mounts.as_ref().unwrap()[0];
    assert!(serve.tls_cert_file.unwrap().starts_with(&mount.mount_path));
    assert!(serve.tls_key_file.unwrap().starts_with(&mount.mount_path));
    let volumes = spec
        .template
        .spec
        .as_ref()
        .unwrap()
        .volumes
        .as_ref()
        .unwrap();
    let secret = volumes
        .iter()
        .find(|v| v.name == mount.name)
        .unwrap()
        .secret
        .as_ref()
        .unwrap();
    assert_eq!(secret.secret_name.as_deref(), Some(install::TLS_SECRET));
    // The grace period covers the drain delay and the server's shutdown timeout.
    let grace = spec
        .template
        .spec
        .as_ref()
        .unwrap()
        .termination_grace_period_seconds
        .unwrap();
    assert!(
        u64::try_from(grace).unwrap()
            > serve.drain_delay_seconds + server::SHUTDOWN_TIMEOUT.as_secs(),
        "terminationGracePeriodSeconds {grace} must exceed drain + shutdown"
    );

    // The probes hit real admin routes, on the admin port.
    for probe in [&container.liveness_probe, &container.readiness_probe] {
        let get = probe.as_ref().unwrap().http_get.as_ref().unwrap();
        assert_eq!(get.port, IntOrString::String("admin".into()));
        let path = get.path.as_deref().unwrap();
        assert_eq!(
            status(
                gpu_guard_runtime::process::admin_router(state.clone()),
                "GET",
                path
            )
            .await,
            200,
            "{path}"
        );
    }

    // Every Service port targets a named container port.
    for service_port in service.spec.as_ref().unwrap().ports.as_ref().unwrap() {
        let Some(IntOrString::String(target)) = &service_port.target_port else {
            panic!("target ports are named")
        };
        port(target);
    }
    let webhook_port = service
        .spec
        .as_ref()
        .unwrap()
        .ports
        .as_ref()
        .unwrap()
        .iter()
        .find(|p| p.target_port == Some(IntOrString::String("webhook".into())))
        .unwrap()
        .port;

    // Both webhooks call that Service, at paths the server routes; or, in the local overlay, the
    // URL of a local `serve`.
    let mut client_configs: Vec<(&str, &WebhookClientConfig, Option<&str>, i32)> = Vec::new();
    for config in &mutating {
        for webhook in config.webhooks.as_ref().unwrap() {
            client_configs.push((
                webhook.name.as_str(),
                &webhook.client_config,
                webhook.failure_policy.as_deref(),
                webhook.timeout_seconds.unwrap(),
            ));
            assert_eq!(webhook.side_effects, "None");
            if webhook.name == PODS_WEBHOOK_NAME {
                // Job pods, placed at CREATE; best effort, never blocking a Job's pods.
                assert_eq!(webhook.reinvocation_policy.as_deref(), Some("Never"));
                assert_eq!(webhook.failure_policy.as_deref(), Some("Ignore"));
                let rules = webhook.rules.as_ref().unwrap();
                assert_eq!(rules.len(), 1);
                assert_eq!(
                    rules[0].resources.as_deref(),
                    Some(&["pods".to_owned()][..])
                );
                assert_eq!(
                    rules[0].operations.as_deref(),
                    Some(&["CREATE".to_owned()][..])
                );
                let selector = webhook.object_selector.as_ref().unwrap();
                let requirement = &selector.match_expressions.as_ref().unwrap()[0];
                assert_eq!(
                    (requirement.key.as_str(), requirement.operator.as_str()),
                    ("batch.kubernetes.io/job-name", "Exists")
                );
                assert!(webhook.namespace_selector.is_some());
                continue;
            }
            assert_eq!(webhook.reinvocation_policy.as_deref(), Some("IfNeeded"));
            for rule in webhook.rules.as_ref().unwrap() {
                assert_eq!(
                    rule.operations.as_deref(),
                    Some(&["CREATE".to_owned(), "UPDATE".to_owned()][..]),
                    "objects are mutated at CREATE, and put back at UPDATE"
                );
            }
            // Cluster-scoped runtimes are not filtered by a namespaceSelector: their own
            // webhook selects the opted-in ones by label.
            let cluster_scoped = webhook
                .rules
                .as_ref()
                .unwrap()
                .iter()
                .any(|rule| rule.scope.as_deref() == Some("Cluster"));
            assert_eq!(
                cluster_scoped,
                webhook.object_selector.is_some(),
                "{}",
                webhook.name
            );
        }
    }
    for config in &validating {
        let mut resources: Vec<String> = Vec::new();
        for webhook in config.webhooks.as_ref().unwrap() {
            client_configs.push((
                webhook.name.as_str(),
                &webhook.client_config,
                webhook.failure_policy.as_deref(),
                webhook.timeout_seconds.unwrap(),
            ));
            assert_eq!(webhook.side_effects, "None");
            resources.extend(
                webhook
                    .rules
                    .as_ref()
                    .unwrap()
                    .iter()
                    .flat_map(|r| r.resources.clone().unwrap()),
            );
        }
        for kind in [
            "pods",
            "deployments",
            "statefulsets",
            "daemonsets",
            "replicasets",
            "replicationcontrollers",
            "jobs",
            "cronjobs",
            "jobsets",
            "trainingruntimes",
            "clustertrainingruntimes",
        ] {
            assert!(
                resources.iter().any(|r| r == kind),
                "the validating webhooks miss {kind}"
            );
        }
    }
    let webhook_count: usize = mutating
        .iter()
        .map(|c| c.webhooks.as_ref().unwrap().len())
        .chain(
            validating
                .iter()
                .map(|c| c.webhooks.as_ref().unwrap().len()),
        )
        .sum();
    assert_eq!(client_configs.len(), webhook_count);
    for (name, client, failure_policy, timeout) in client_configs {
        assert!(
            timeout <= 10,
            "{name}: timeoutSeconds {timeout} is too long"
        );
        assert!(
            failure_policy.is_some(),
            "{name}: failurePolicy is explicit"
        );
        let path = match (&client.service, &client.url) {
            (Some(reference), None) => {
                assert_eq!(
                    reference.name,
                    service.metadata.name.clone().unwrap(),
                    "{name}"
                );
                assert_eq!(reference.namespace, namespace, "{name}");
                assert_eq!(reference.port, Some(webhook_port), "{name}");
                reference.path.clone().unwrap()
            }
            (None, Some(url)) => {
                let rest = url
                    .strip_prefix(&format!("https://127.0.0.1:{}", wellknown::WEBHOOK_PORT))
                    .unwrap_or_else(|| panic!("{name}: {url}"));
                rest.to_owned()
            }
            other => panic!("{name}: service or url, not both: {other:?}"),
        };
        assert_eq!(
            status(server::webhook_router(state.clone()), "POST", &path).await,
            400,
            "{name}: {path} is not a webhook route"
        );
    }

    // The namespaced webhooks skip kube-system and gpu-guard's own namespace, and need the
    // opt-in label on the namespace; the cluster-scoped runtimes' webhooks need it on the object.
    let selectors: Vec<_> = mutating
        .iter()
        .flat_map(|c| c.webhooks.clone().unwrap())
        .map(|w| (w.name, w.namespace_selector, w.object_selector))
        .chain(
            validating
                .iter()
                .flat_map(|c| c.webhooks.clone().unwrap())
                .map(|w| (w.name, w.namespace_selector, w.object_selector)),
        )
        .collect();
    for (name, namespace_selector, object_selector) in selectors {
        let Some(selector) = namespace_selector else {
            let labels = object_selector
                .and_then(|selector| selector.match_labels)
                .unwrap_or_else(|| panic!("{name}: neither a namespace nor an object selector"));
            assert_eq!(labels[wellknown::ENABLED_LABEL], "true", "{name}");
            continue;
        };
        let expressions = selector.match_expressions.unwrap();
        assert!(expressions.iter().any(|e| e.key == wellknown::ENABLED_LABEL
            && e.operator == "In"
            && e.values == Some(vec!["true".into()])));
        let excluded = expressions
            .iter()
            .find(|e| e.key == install::NAMESPACE_NAME_LABEL && e.operator == "NotIn")
            .unwrap();
        for namespace in ["kube-system", namespace] {
            assert!(
                excluded
                    .values
                    .as_ref()
                    .unwrap()
                    .iter()
                    .any(|v| v == namespace),
                "{namespace} must be excluded"
            );
        }
    }

    // RBAC: the binding names the Deployment's service account and the role; the role covers
    // every resource the cluster caches watch, and nothing else.
    let account = spec
        .template
        .spec
        .as_ref()
        .unwrap()
        .service_account_name
        .clone()
        .unwrap();
    let rules_of = |deployment: &Deployment| {
        let account = deployment
            .spec
            .as_ref()
            .unwrap()
            .template
            .spec
            .as_ref()
            .unwrap()
            .service_account_name
            .clone()
            .unwrap();
        let binding = bindings
            .iter()
            .find(|b| {
                b.subjects
                    .as_ref()
                    .unwrap()
                    .iter()
                    .any(|s| s.name == account && s.namespace.as_deref() == Some(namespace))
            })
            .unwrap_or_else(|| panic!("no binding for {account}"));
        let role = roles
            .iter()
            .find(|r| r.metadata.name.as_ref() == Some(&binding.role_ref.name))
            .unwrap();
        role.rules.clone().unwrap()
    };
    let covers = |rules: &[k8s_openapi::api::rbac::v1::PolicyRule], wanted: &[RbacRule]| {
        for RbacRule {
            group,
            resource,
            verbs,
            ..
        } in wanted
        {
            assert!(
                rules.iter().any(|rule| rule
                    .api_groups
                    .as_ref()
                    .unwrap()
                    .contains(&(*group).to_owned())
                    && rule
                        .resources
                        .as_ref()
                        .unwrap()
                        .contains(&(*resource).to_owned())
                    && verbs.iter().all(|v| rule.verbs.contains(&(*v).to_owned()))),
                "RBAC misses {verbs:?} on {resource}"
            );
        }
        assert_eq!(rules.len(), wanted.len(), "nothing more than the code uses");
    };
    assert_eq!(account, "gpu-guard");
    let rules = rules_of(deployment);
    covers(&rules, &gpu_guard_runtime::cluster::RBAC_RULES);
    assert!(
        rules.iter().all(|r| r
            .verbs
            .iter()
            .all(|v| ["get", "list", "watch"].contains(&v.as_str()))),
        "the webhook is read-only"
    );

    // The controller: its args parse as `controller` flags on its admin port, its probes hit the
    // admin routes, its role is exactly what it calls.
    let controller = named("gpu-guard-controller");
    covers(&rules_of(controller), &gpu_guard_controller::RBAC_RULES);
    // Least privilege: no ClusterRole touches Leases; the controller's Lease rights are a Role
    // of its namespace, bound to its account: get/update of its own Lease only, and create.
    for role in &roles {
        assert!(
            role.rules.iter().flatten().all(|rule| !rule
                .resources
                .iter()
                .flatten()
                .any(|r| r == "leases")),
            "ClusterRole {:?} grants rights on Leases cluster-wide",
            role.metadata.name
        );
    }
    let namespaced: Vec<Role> = one(&objects, "Role");
    let namespaced_bindings: Vec<RoleBinding> = one(&objects, "RoleBinding");
    let lease_binding = namespaced_bindings
        .iter()
        .find(|b| {
            b.subjects.iter().flatten().any(|s| {
                s.kind == "ServiceAccount"
                    && s.name == "gpu-guard-controller"
                    && s.namespace.as_deref() == Some(namespace)
            })
        })
        .expect("a RoleBinding for the controller");
    assert_eq!(lease_binding.metadata.namespace.as_deref(), Some(namespace));
    assert_eq!(lease_binding.role_ref.kind, "Role");
    let lease_role = namespaced
        .iter()
        .find(|r| r.metadata.name.as_ref() == Some(&lease_binding.role_ref.name))
        .expect("the controller's Role");
    assert_eq!(lease_role.metadata.namespace.as_deref(), Some(namespace));
    // (apiGroups, resources, verbs, resourceNames)
    type Rule = (Vec<String>, Vec<String>, Vec<String>, Vec<String>);
    let lease_rules: Vec<Rule> = lease_role
        .rules
        .iter()
        .flatten()
        .map(|rule| {
            (
                rule.api_groups.clone().unwrap_or_default(),
                rule.resources.clone().unwrap_or_default(),
                rule.verbs.clone(),
                rule.resource_names.clone().unwrap_or_default(),
            )
        })
        .collect();
    let strings = |items: &[&str]| items.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    assert_eq!(
        lease_rules,
        vec![
            (
                strings(&["coordination.k8s.io"]),
                strings(&["leases"]),
                strings(&["get", "update"]),
                strings(&[wellknown::LEASE_NAME]),
            ),
            (
                strings(&["coordination.k8s.io"]),
                strings(&["leases"]),
                strings(&["create"]),
                vec![],
            ),
        ]
    );
    assert_eq!(
        gpu_guard_controller::LEASE_RULES.len(),
        lease_rules.len(),
        "the Role is generated from controller::LEASE_RULES"
    );
    let container = webhook_container(controller);
    let args = std::iter::once("gpu-guard".to_owned()).chain(container.args.clone().unwrap());
    let Command::Controller(parsed) = Cli::try_parse_from(args)
        .expect("the controller's args parse")
        .command
    else {
        panic!("the controller Deployment does not run the controller")
    };
    let admin = container
        .ports
        .as_ref()
        .unwrap()
        .iter()
        .find(|p| p.name.as_deref() == Some("admin"))
        .unwrap();
    assert_eq!(i32::from(parsed.admin_listen.port()), admin.container_port);
    for probe in [&container.liveness_probe, &container.readiness_probe] {
        let get = probe.as_ref().unwrap().http_get.as_ref().unwrap();
        assert_eq!(get.port, IntOrString::String("admin".into()));
        assert!(
            [wellknown::HEALTHZ_PATH, wellknown::READYZ_PATH]
                .contains(&get.path.as_deref().unwrap())
        );
    }
    let env: Vec<&str> = container
        .env
        .as_ref()
        .unwrap()
        .iter()
        .map(|e| e.name.as_str())
        .collect();
    assert_eq!(
        env,
        ["POD_NAME", "POD_NAMESPACE"],
        "the Lease identity and namespace"
    );
    let controller_spec = controller.spec.as_ref().unwrap();
    let controller_labels = controller_spec
        .template
        .metadata
        .as_ref()
        .unwrap()
        .labels
        .clone()
        .unwrap();
    assert!(
        controller_spec
            .selector
            .match_labels
            .as_ref()
            .unwrap()
            .iter()
            .all(|(k, v)| controller_labels.get(k) == Some(v))
    );
    // The webhook's Service does not select the controller's pods.
    assert!(
        !service
            .spec
            .as_ref()
            .unwrap()
            .selector
            .as_ref()
            .unwrap()
            .iter()
            .all(|(k, v)| controller_labels.get(k) == Some(v))
    );

    // The cert-manager certificate is for the Service's DNS names and written to the mounted Secret.
    let certificates: Vec<&Value> = objects["Certificate"]
        .iter()
        .map(|(_, v)| v)
        .filter(|v| v["spec"]["isCA"] != true)
        .collect();
    assert_eq!(certificates.len(), 1);
    assert_eq!(certificates[0]["spec"]["secretName"], install::TLS_SECRET);
    let service_dns = format!("{}.{namespace}.svc", service.metadata.name.clone().unwrap());
    assert!(
        certificates[0]["spec"]["dnsNames"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n == &Value::from(service_dns.clone()))
    );
    // The ServiceMonitor scrapes the Service's metrics port at the server's metrics path.
    let monitor = &objects["ServiceMonitor"][0].1;
    let endpoint = &monitor["spec"]["endpoints"][0];
    assert_eq!(endpoint["path"], wellknown::METRICS_PATH);
    assert!(
        service
            .spec
            .as_ref()
            .unwrap()
            .ports
            .as_ref()
            .unwrap()
            .iter()
            .any(|p| p.name.as_deref() == endpoint["port"].as_str())
    );
    assert!(
        monitor["spec"]["selector"]["matchLabels"]
            .as_object()
            .unwrap()
            .iter()
            .all(|(k, v)| service
                .metadata
                .labels
                .as_ref()
                .unwrap()
                .get(k)
                .map(String::as_str)
                == v.as_str())
    );
}

#[tokio::test]
async fn the_alerts_and_the_dashboard_use_metrics_the_server_exports() {
    let mut rules = read(&root().join("webhook-config/monitoring/prometheusrule.yaml"));
    rules.push_str(&read(
        &root().join("webhook-config/monitoring/dashboard.json"),
    ));
    // Families with no sample are not exported: make one of each.
    let state = AppState::new(Policy::embedded());
    let review =
        std::fs::read(root().join("tests/fixtures/admission/016-Pod-CREATE-validate.json"))
            .unwrap();
    let request = Request::post(wellknown::VALIDATE_PATH)
        .header("content-type", "application/json")
        .body(Body::from(review))
        .unwrap();
    let response = server::webhook_router(state.clone())
        .oneshot(request)
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    state
        .metrics
        .observe_caches(&[gpu_guard_runtime::cluster::CacheStatus {
            resource: gpu_guard_runtime::cluster::NODES,
            synced: true,
            objects: 1,
            since_last_event: Some(std::time::Duration::from_secs(1)),
            watch_errors: 0,
        }]);
    let mut exported = state.metrics.encode();
    for (name, kind) in gpu_guard_controller::metrics::METRIC_NAMES {
        let family = name.strip_suffix("_total").unwrap_or(name);
        exported.push_str(&format!("# TYPE {family} {kind}\n"));
    }
    let mut checked = 0;
    for word in rules.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
        if let Some(name) = word.strip_prefix("gpu_guard_") {
            let family = name.trim_end_matches("_bucket").trim_end_matches("_total");
            assert!(
                exported.contains(&format!("# TYPE gpu_guard_{family} ")),
                "alert uses unknown metric gpu_guard_{name}:\n{exported}"
            );
            checked += 1;
        }
    }
    assert!(checked >= 20, "{checked}");
}

/// Every fixture request the mutating webhook changes (a Job and a CronJob CREATE, as a real API
/// server sent them) is one the generated MutatingWebhookConfiguration registers: the webhook
/// never handles a kind the API server would not send it.
#[test]
fn the_mutating_webhook_registers_every_kind_the_engine_changes() {
    use gpu_guard_core::guard::StaticView;
    use gpu_guard_webhook::admission::{Webhook, review};
    let objects = install::webhooks(&Options::default());
    let mutating = objects
        .iter()
        .find(|o| o["kind"] == "MutatingWebhookConfiguration")
        .expect("a MutatingWebhookConfiguration");
    let rules = mutating["webhooks"][0]["rules"].as_array().unwrap();
    let registered = |group: &str, resource: &str, operation: &str| {
        rules.iter().any(|rule| {
            let has = |key: &str, value: &str| {
                rule[key]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|v| v == value || v == "*")
            };
            has("apiGroups", group) && has("resources", resource) && has("operations", operation)
        })
    };
    let policy = Policy::embedded();
    let view = StaticView::from_policy(&policy.guard.offline);
    let mut patched = Vec::new();
    let dir = root().join("tests/fixtures/admission");
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if !path.to_string_lossy().ends_with("-mutate.json") {
            continue;
        }
        let body = std::fs::read(&path).unwrap();
        let reviewed = review(Webhook::Mutate, &body, &policy, &view).expect("reviewed");
        if reviewed.patch_bytes == 0 {
            continue;
        }
        let request: Value = serde_json::from_slice(&body).unwrap();
        let resource = &request["request"]["resource"];
        let (group, name) = (
            resource["group"].as_str().unwrap(),
            resource["resource"].as_str().unwrap(),
        );
        let operation = request["request"]["operation"].as_str().unwrap();
        assert!(
            registered(group, name, operation),
            "{}: the webhook patches {group}/{name} {operation}, which the generated \
             MutatingWebhookConfiguration does not register",
            path.display()
        );
        patched.push(name.to_owned());
    }
    patched.sort();
    patched.dedup();
    assert_eq!(patched, ["cronjobs", "jobs"]);
}

// === NetworkPolicies ===

/// Where a connection comes from or goes to, as a NetworkPolicy sees it.
#[derive(Clone, Copy, Debug)]
enum Peer<'a> {
    /// A pod in this namespace.
    PodIn(&'a str),
    /// An address outside every pod: the API server calling a webhook, or its endpoint.
    Outside,
}

/// Whether `peers` (a rule's `from` or `to`) match `peer`. Only the selectors the generator uses
/// are understood (a namespace selector by labels, with no pod selector); anything else fails
/// the test, so this stays a faithful reading of what is generated.
fn peers_match(peers: Option<&Vec<NetworkPolicyPeer>>, peer: Peer<'_>) -> bool {
    let Some(peers) = peers else {
        return true; // no `from`/`to`: every source or destination
    };
    peers.iter().any(|selector| {
        assert!(
            selector.ip_block.is_none() && selector.pod_selector.is_none(),
            "unsupported peer {selector:?}: teach peers_match about it"
        );
        let labels = selector
            .namespace_selector
            .as_ref()
            .and_then(|s| s.match_labels.clone())
            .expect("a namespace selector by labels");
        match peer {
            // The only label every namespace is known to carry: its name.
            Peer::PodIn(namespace) => labels
                .iter()
                .all(|(k, v)| k == install::NAMESPACE_NAME_LABEL && v == namespace),
            Peer::Outside => false,
        }
    })
}

fn ports_match(ports: Option<&Vec<NetworkPolicyPort>>, port: i32, protocol: &str) -> bool {
    ports.is_none_or(|ports| {
        ports.iter().any(|p| {
            let same_protocol = p.protocol.as_deref().unwrap_or("TCP") == protocol;
            match &p.port {
                None => same_protocol, // every port
                Some(IntOrString::Int(n)) => same_protocol && *n == port,
                Some(IntOrString::String(name)) => panic!("named port {name}: use numbers"),
            }
        })
    })
}

/// Whether the policy allows a connection in `direction` (`Ingress`: from `peer` to `port` of
/// the pods it selects; `Egress`: from those pods to `port` of `peer`).
fn allows(
    policy: &NetworkPolicy,
    direction: &str,
    peer: Peer<'_>,
    port: i32,
    protocol: &str,
) -> bool {
    let spec = policy.spec.as_ref().unwrap();
    let isolated = spec
        .policy_types
        .as_ref()
        .is_some_and(|types| types.iter().any(|t| t == direction));
    if !isolated {
        return true;
    }
    let rules: Vec<_> = match direction {
        "Ingress" => spec
            .ingress
            .iter()
            .flatten()
            .map(|rule| (rule.from.as_ref(), rule.ports.as_ref()))
            .collect(),
        _ => spec
            .egress
            .iter()
            .flatten()
            .map(|rule| (rule.to.as_ref(), rule.ports.as_ref()))
            .collect(),
    };
    rules
        .into_iter()
        .any(|(peers, ports)| peers_match(peers, peer) && ports_match(ports, port, protocol))
}

fn named_port(container: &Container, name: &str) -> i32 {
    container
        .ports
        .iter()
        .flatten()
        .find(|p| p.name.as_deref() == Some(name))
        .unwrap_or_else(|| panic!("{}: no container port {name}", container.name))
        .container_port
}

/// Both components' pods get a NetworkPolicy that lets in exactly what they serve (the API
/// server's webhook calls; Prometheus in the monitoring namespace on the admin port) and lets
/// out only the API server and the cluster DNS.
#[test]
fn the_network_policies_let_in_the_api_server_and_prometheus_and_out_the_api_server_and_dns() {
    let objects = objects();
    let policies: Vec<NetworkPolicy> = one(&objects, "NetworkPolicy");
    let deployments: Vec<Deployment> = one(&objects, "Deployment");
    let services: Vec<Service> = one(&objects, "Service");
    let service_ports = services[0].spec.as_ref().unwrap().ports.clone().unwrap();
    let monitoring = install::MONITORING_NAMESPACE;
    let other_namespaces = ["default", "ml-team", "kube-system"];

    assert_eq!(deployments.len(), 2, "the webhook and the controller");
    for deployment in &deployments {
        let name = deployment.metadata.name.clone().unwrap();
        let namespace = deployment.metadata.namespace.as_deref().unwrap();
        let pod_labels = deployment.spec.as_ref().unwrap().template.metadata.clone();
        let pod_labels = pod_labels.unwrap().labels.unwrap();
        // Exactly one policy selects the pods, in their namespace.
        let selecting: Vec<&NetworkPolicy> = policies
            .iter()
            .filter(|p| {
                let selector = p.spec.as_ref().unwrap().pod_selector.clone().unwrap();
                p.metadata.namespace.as_deref() == Some(namespace)
                    && selector
                        .match_labels
                        .unwrap()
                        .iter()
                        .all(|(k, v)| pod_labels.get(k) == Some(v))
            })
            .collect();
        assert_eq!(
            selecting.len(),
            1,
            "{name}: one NetworkPolicy selects its pods"
        );
        let policy = selecting[0];
        let container = webhook_container(deployment);
        let admin = named_port(container, "admin");

        // In: every container port is open to whoever must reach it, and nothing else is.
        let open_ports: Vec<i32> = container
            .ports
            .iter()
            .flatten()
            .map(|p| p.container_port)
            .collect();
        for port in [1, 22, 80, 443, 9090, 10250] {
            if !open_ports.contains(&port) {
                assert!(
                    !allows(policy, "Ingress", Peer::Outside, port, "TCP")
                        && !allows(policy, "Ingress", Peer::PodIn(monitoring), port, "TCP"),
                    "{name}: port {port} is open though no container listens on it"
                );
            }
        }
        // Prometheus scrapes the admin port; no other namespace reaches it.
        assert!(
            allows(policy, "Ingress", Peer::PodIn(monitoring), admin, "TCP"),
            "{name}: Prometheus cannot scrape"
        );
        for namespace in other_namespaces {
            assert!(
                !allows(policy, "Ingress", Peer::PodIn(namespace), admin, "TCP"),
                "{name}: a pod in {namespace} reaches the admin port"
            );
        }
        assert!(
            !allows(policy, "Ingress", Peer::Outside, admin, "TCP"),
            "{name}: the admin port is open to all"
        );
        if name == "gpu-guard" {
            // The API server calls the Service's webhook port from an address no selector can
            // name: the port it targets is open to every source.
            let target = service_ports
                .iter()
                .find(|p| p.name.as_deref() == Some("webhook"))
                .and_then(|p| p.target_port.clone())
                .unwrap();
            let IntOrString::String(target) = target else {
                panic!("named target port")
            };
            let webhook = named_port(container, &target);
            assert_eq!(webhook, i32::from(wellknown::WEBHOOK_PORT));
            for from in [
                Peer::Outside,
                Peer::PodIn("kube-system"),
                Peer::PodIn(monitoring),
            ] {
                assert!(
                    allows(policy, "Ingress", from, webhook, "TCP"),
                    "{name}: {from:?} cannot call the webhook"
                );
            }
            assert!(!allows(policy, "Ingress", Peer::Outside, webhook, "UDP"));
            // The ServiceMonitor's port is the Service port that targets the admin port.
            let monitored = objects["ServiceMonitor"][0].1["spec"]["endpoints"][0]["port"]
                .as_str()
                .unwrap()
                .to_owned();
            let scraped = service_ports
                .iter()
                .find(|p| p.name.as_deref() == Some(monitored.as_str()))
                .unwrap();
            assert_eq!(
                scraped.target_port,
                Some(IntOrString::String("admin".into()))
            );
        } else {
            // The PodMonitor scrapes the controller's admin port by name.
            let podmonitor = &objects["PodMonitor"][0].1["spec"]["podMetricsEndpoints"][0]["port"];
            assert_eq!(named_port(container, podmonitor.as_str().unwrap()), admin);
        }

        // Out: the API server by port (its endpoints listen on 443 or 6443), DNS in kube-system.
        for port in [443, 6443] {
            assert!(
                allows(policy, "Egress", Peer::Outside, port, "TCP"),
                "{name}: cannot reach an API server on {port}"
            );
        }
        for protocol in ["UDP", "TCP"] {
            assert!(
                allows(policy, "Egress", Peer::PodIn("kube-system"), 53, protocol),
                "{name}: no DNS over {protocol}"
            );
            assert!(
                !allows(policy, "Egress", Peer::PodIn("default"), 53, protocol),
                "{name}: DNS outside kube-system"
            );
            assert!(
                !allows(policy, "Egress", Peer::Outside, 53, protocol),
                "{name}: DNS to any address"
            );
        }
        for port in [80, 5432, 8443, 10250] {
            assert!(
                !allows(policy, "Egress", Peer::Outside, port, "TCP"),
                "{name}: reaches port {port}"
            );
        }
    }
}
