//! Prometheus metrics of the webhook server. The registry is owned by the server's state (not a
//! global), so tests read the same counters `/metrics` exposes.

use crate::admission::Operation;
use std::sync::atomic::AtomicU64;
use std::time::Instant;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

use super::tls::CertificateMetrics;
use gpu_guard_core::kinds;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Labels of a reviewed request.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub webhook: &'static str,
    /// The object kind for the kinds gpu-guard knows, `other` for the rest (bounded cardinality).
    pub kind: &'static str,
    pub operation: &'static str,
    /// `allowed`, `patched`, `denied`, `warned`, `audited` or `error` (a 4xx or 5xx answer).
    pub outcome: &'static str,
}

/// Labels of a guard decision.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GuardLabels {
    /// `Enforce`, `Warn` or `Audit`: the mode in force for the object's namespace.
    pub mode: &'static str,
    /// `allowed`, `exempt`, `unjudged` (no cluster, unknown PriorityClass), `denied`,
    /// `warned` or `audited`.
    pub outcome: &'static str,
}

/// Labels of a pod's avoidance of the nodes where its workload failed.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AvoidanceLabels {
    /// `excluded` (the pod was kept off nodes) or `unreadable` (the workload's memory
    /// annotation is not gpu-guard's; the pod was admitted unchanged).
    pub outcome: &'static str,
}

/// Labels of a cluster cache.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CacheLabels {
    /// `priorityclasses` or `nodes`.
    pub resource: &'static str,
}

/// Labels of the latency histogram.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WebhookLabels {
    pub webhook: &'static str,
}

/// Every metric the server exports.
#[derive(Debug)]
pub struct Metrics {
    pub registry: Registry,
    pub requests: Family<RequestLabels, Counter>,
    pub latency: Family<WebhookLabels, Histogram>,
    pub in_flight: Gauge,
    pub patches: Counter,
    pub guard_decisions: Family<GuardLabels, Counter>,
    pub avoidance: Family<AvoidanceLabels, Counter>,
    pub avoided_nodes: Counter,
    pub cache_synced: Family<CacheLabels, Gauge>,
    pub cache_objects: Family<CacheLabels, Gauge>,
    pub cache_last_event_age: Family<CacheLabels, Gauge<f64, AtomicU64>>,
    pub cache_watch_errors: Family<CacheLabels, Counter>,
    pub panics: Counter,
    pub log_lines_dropped: Counter,
    pub certificates: CertificateMetrics,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("gpu_guard");
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "admission_requests",
            "Admission requests by webhook, kind, operation and outcome",
            requests.clone(),
        );
        let latency = Family::<WebhookLabels, Histogram>::new_with_constructor(|| {
            // 25 µs to about 105 ms: the request path is sub-millisecond.
            Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
                0.000_025, 2.0, 13,
            ))
        });
        registry.register(
            "admission_duration_seconds",
            "Time to decide an admission request, from body received to response built",
            latency.clone(),
        );
        let in_flight = Gauge::default();
        registry.register(
            "admission_in_flight",
            "Admission requests being decided",
            in_flight.clone(),
        );
        let patches = Counter::default();
        registry.register(
            "patches",
            "JSON patches sent (objects changed)",
            patches.clone(),
        );
        let guard_decisions = Family::<GuardLabels, Counter>::default();
        registry.register(
            "guard_decisions",
            "GPU-node guard decisions by mode and outcome (allowed, exempt, unjudged, denied, warned, audited)",
            guard_decisions.clone(),
        );
        let avoidance = Family::<AvoidanceLabels, Counter>::default();
        registry.register(
            "failed_node_avoidance",
            "Job pods at CREATE whose workload has device failures on record: kept off those nodes (excluded), or admitted unchanged because the record does not read (unreadable)",
            avoidance.clone(),
        );
        let avoided_nodes = Counter::default();
        registry.register(
            "failed_nodes_excluded",
            "Nodes excluded from new pods' node affinity, summed over the pods kept off them",
            avoided_nodes.clone(),
        );
        let cache_synced = Family::<CacheLabels, Gauge>::default();
        registry.register(
            "cluster_cache_synced",
            "1 once the cache has had its first complete list (PriorityClasses, Nodes); absent with --no-cluster",
            cache_synced.clone(),
        );
        let cache_objects = Family::<CacheLabels, Gauge>::default();
        registry.register(
            "cluster_cache_objects",
            "Objects held by the cluster cache",
            cache_objects.clone(),
        );
        let cache_last_event_age = Family::<CacheLabels, Gauge<f64, AtomicU64>>::default();
        registry.register(
            "cluster_cache_last_event_age_seconds",
            "Seconds since the cluster cache last received an event (grows on a quiet cluster)",
            cache_last_event_age.clone(),
        );
        let cache_watch_errors = Family::<CacheLabels, Counter>::default();
        registry.register(
            "cluster_cache_watch_errors",
            "Failed lists and watches of the cluster cache (each retried with backoff)",
            cache_watch_errors.clone(),
        );
        let panics = Counter::default();
        registry.register(
            "handler_panics",
            "Panics caught in request handlers (answered 500)",
            panics.clone(),
        );
        let log_lines_dropped = Counter::default();
        registry.register(
            "log_lines_dropped",
            "Log lines dropped because stderr could not take them as fast as they came (requests never wait on a log line)",
            log_lines_dropped.clone(),
        );
        let certificates = CertificateMetrics::default();
        registry.register(
            "certificate_not_after_timestamp_seconds",
            "Expiry (notAfter, Unix time) of the serving certificate in use",
            certificates.not_after.clone(),
        );
        registry.register(
            "certificate_reloads",
            "Changed certificate pairs taken into use",
            certificates.reloads.clone(),
        );
        registry.register(
            "certificate_reload_errors",
            "Changed certificate pairs refused (the last good pair stays in use)",
            certificates.reload_errors.clone(),
        );
        Self {
            registry,
            requests,
            latency,
            in_flight,
            patches,
            guard_decisions,
            avoidance,
            avoided_nodes,
            cache_synced,
            cache_objects,
            cache_last_event_age,
            cache_watch_errors,
            panics,
            log_lines_dropped,
            certificates,
        }
    }
}

impl Metrics {
    /// The Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry)
            .expect("writing to a String cannot fail");
        text
    }

    /// Copies the count of dropped log lines into its metric (called at each scrape).
    pub fn observe_log(&self, dropped: u64) {
        self.log_lines_dropped
            .inc_by(dropped.saturating_sub(self.log_lines_dropped.get()));
    }

    /// Copies the caches' state into their metrics (called at each scrape).
    pub fn observe_caches(&self, caches: &[gpu_guard_runtime::cluster::CacheStatus]) {
        for cache in caches {
            let labels = CacheLabels {
                resource: cache.resource,
            };
            self.cache_synced
                .get_or_create(&labels)
                .set(i64::from(cache.synced));
            self.cache_objects
                .get_or_create(&labels)
                .set(i64::try_from(cache.objects).unwrap_or(i64::MAX));
            if let Some(age) = cache.since_last_event {
                self.cache_last_event_age
                    .get_or_create(&labels)
                    .set(age.as_secs_f64());
            }
            let errors = self.cache_watch_errors.get_or_create(&labels);
            errors.inc_by(cache.watch_errors.saturating_sub(errors.get()));
        }
    }

    /// Counts one request in flight until the guard is dropped.
    pub fn in_flight(&self) -> InFlight<'_> {
        self.in_flight.inc();
        InFlight {
            metrics: self,
            started: Instant::now(),
        }
    }
}

/// An RAII guard: the in-flight gauge goes down when the request is answered.
pub struct InFlight<'a> {
    metrics: &'a Metrics,
    started: Instant,
}

impl InFlight<'_> {
    /// Records the request's outcome and latency, and returns the latency (for the log).
    pub fn finish(self, labels: RequestLabels) -> std::time::Duration {
        let latency = self.started.elapsed();
        self.metrics
            .latency
            .get_or_create(&WebhookLabels {
                webhook: labels.webhook,
            })
            .observe(latency.as_secs_f64());
        self.metrics.requests.get_or_create(&labels).inc();
        latency
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.metrics.in_flight.dec();
    }
}

/// Bounds the `kind` label to the kinds gpu-guard handles (those the kind registry marks
/// mutated or judged): `other` for the rest, `unknown` when a request names none.
pub fn kind_label(kind: &str) -> &'static str {
    if kind.is_empty() {
        return "unknown";
    }
    kinds::KINDS
        .iter()
        .find(|known| known.handled() && known.kind == kind)
        .map_or("other", |known| known.kind)
}

/// Bounds the `operation` label.
pub fn operation_label(operation: &Operation) -> &'static str {
    match operation {
        Operation::Create => "CREATE",
        Operation::Update => "UPDATE",
        Operation::Delete => "DELETE",
        Operation::Connect => "CONNECT",
        Operation::Unknown | Operation::Other(_) => "unknown",
    }
}

#[cfg(test)]
mod tests {
    use super::kind_label;

    #[test]
    fn kinds_the_webhooks_handle_keep_their_name_and_others_are_bounded() {
        for (kind, label) in [
            ("Job", "Job"),
            ("Pod", "Pod"),
            ("JobSet", "JobSet"),
            ("TrainingRuntime", "TrainingRuntime"),
            ("ClusterTrainingRuntime", "ClusterTrainingRuntime"),
            ("TrainJob", "other"),
            ("PodTemplate", "other"),
            ("jobset", "other"),
            ("", "unknown"),
        ] {
            assert_eq!(kind_label(kind), label, "{kind:?}");
        }
    }
}
