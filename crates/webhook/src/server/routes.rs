//! The webhook routes: `/mutate` and `/validate` read the body within its limits and hand it
//! to [`crate::admission::review`]; the answer, its metrics and its log line.

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;

use super::MAX_BODY_BYTES;
use super::metrics::{self, RequestLabels};
use super::state::AppState;
use crate::admission::{self, Avoided, ReviewError, ReviewOutcome, Reviewed, Webhook};
use gpu_guard_core::guard::ClusterView;
use gpu_guard_core::memory::avoid::Memories;
use gpu_guard_core::policy::Policy;
use gpu_guard_core::wellknown::{MUTATE_PATH, VALIDATE_PATH};

/// The webhook routes (no TLS, no sockets: tests drive it with `tower::ServiceExt::oneshot`).
pub fn webhook_router(state: Arc<AppState>) -> Router {
    Router::new()
        .route(MUTATE_PATH, post(mutate))
        .route(VALIDATE_PATH, post(validate))
        .with_state(state)
}

/// The target of the line each review logs: `--log-level info,gpu_guard::admission=debug` logs
/// every review, not only denials, guard findings and objects left unchanged with warnings.
pub const REVIEW_LOG_TARGET: &str = "gpu_guard::admission";

async fn mutate(State(state): State<Arc<AppState>>, request: Request) -> Response {
    webhook(
        Webhook::Mutate,
        &state,
        request,
        admission::review_with_memories,
    )
    .await
}

async fn validate(State(state): State<Arc<AppState>>, request: Request) -> Response {
    webhook(
        Webhook::Validate,
        &state,
        request,
        admission::review_with_memories,
    )
    .await
}

/// What decides a request body: [`admission::review_with_memories`]. A parameter, not a fixed
/// call, so that the unit tests below can show what a panic or an internal error of it
/// becomes; no such input is known to reach the real one.
type Review =
    fn(Webhook, &[u8], &Policy, &dyn ClusterView, &dyn Memories) -> Result<Reviewed, ReviewError>;

/// Reads the body (within [`MAX_BODY_BYTES`]) and decides; the headers are read in place.
async fn webhook(webhook: Webhook, state: &AppState, request: Request, review: Review) -> Response {
    let (parts, body) = request.into_parts();
    match tokio::time::timeout(
        state.body_timeout,
        axum::body::to_bytes(body, MAX_BODY_BYTES),
    )
    .await
    {
        Ok(Ok(body)) => handle(webhook, state, &parts.headers, &body, review),
        Ok(Err(_)) => plain(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the body exceeds {MAX_BODY_BYTES} bytes (or was cut off)\n"),
        ),
        Err(_) => plain(
            StatusCode::REQUEST_TIMEOUT,
            format!(
                "the body did not arrive within {} s\n",
                state.body_timeout.as_secs_f64()
            ),
        ),
    }
}

fn handle(
    webhook: Webhook,
    state: &AppState,
    headers: &HeaderMap,
    body: &[u8],
    review: Review,
) -> Response {
    let in_flight = state.metrics.in_flight();
    let failed = |in_flight: metrics::InFlight<'_>| {
        in_flight.finish(RequestLabels {
            webhook: webhook.as_str(),
            kind: "unknown",
            operation: "unknown",
            outcome: "error",
        });
    };
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .unwrap_or("");
    if !content_type.starts_with("application/json") {
        failed(in_flight);
        return plain(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            format!("content type must be application/json, found {content_type:?}\n"),
        );
    }
    // The closure only reads the policy and the body; a panic leaves nothing half-updated.
    let (policy, view, memories) = (&state.policy, &*state.view, state.memories());
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        review(webhook, body, policy, view, memories)
    }));
    match result {
        Ok(Ok(reviewed)) => {
            if reviewed.patch_bytes > 0 {
                state.metrics.patches.inc();
            }
            match &reviewed.avoided {
                Some(Avoided::Excluded(nodes)) => {
                    state
                        .metrics
                        .avoidance
                        .get_or_create(&metrics::AvoidanceLabels {
                            outcome: "excluded",
                        })
                        .inc();
                    state.metrics.avoided_nodes.inc_by(*nodes as u64);
                }
                Some(Avoided::Unreadable { workload, error }) => {
                    state
                        .metrics
                        .avoidance
                        .get_or_create(&metrics::AvoidanceLabels {
                            outcome: "unreadable",
                        })
                        .inc();
                    // A Job of a thousand pods creates a thousand at once: one line a
                    // minute per workload says it all.
                    if state.unreadable_memories.first_in_a_while(workload) {
                        tracing::warn!(
                            target: REVIEW_LOG_TARGET,
                            %workload,
                            %error,
                            namespace = %reviewed.namespace,
                            "pod admitted without avoiding its workload's failed nodes (logged \
                             once a minute per workload)"
                        );
                    }
                }
                None => {}
            }
            if let Some(guard) = reviewed.guard {
                state
                    .metrics
                    .guard_decisions
                    .get_or_create(&metrics::GuardLabels {
                        mode: guard.mode.as_str(),
                        outcome: guard.outcome,
                    })
                    .inc();
            }
            let latency = in_flight.finish(RequestLabels {
                webhook: webhook.as_str(),
                kind: metrics::kind_label(&reviewed.kind),
                operation: metrics::operation_label(&reviewed.operation),
                outcome: reviewed.outcome.as_str(),
            });
            // One line a review, at info only when it tells someone something: a denial, a
            // guard warning or audit finding, or an object left unchanged with warnings to the
            // client (a Job gpu-guard could not protect, and why). Routine answers (allowed
            // without warnings; patched, whose warnings note the changes) are debug:
            // at 200 requests/s, a line each is 17 million lines and about 4 GB a day, and
            // their record is elsewhere (the object's `gpu-guard.io/mutated` annotation, the
            // `mutation` audit annotation in the API server's audit log, the request metrics).
            macro_rules! log_review {
                ($level:expr) => {
                    tracing::event!(
                        target: REVIEW_LOG_TARGET,
                        $level,
                        webhook = webhook.as_str(),
                        uid = %reviewed.uid,
                        kind = %reviewed.kind,
                        namespace = %reviewed.namespace,
                        name = %reviewed.name,
                        operation = reviewed.operation.as_str(),
                        outcome = reviewed.outcome.as_str(),
                        patch_bytes = reviewed.patch_bytes,
                        warnings = reviewed.warnings,
                        latency_us = latency.as_micros() as u64,
                        "admission review"
                    )
                };
            }
            let notable = match reviewed.outcome {
                ReviewOutcome::Denied | ReviewOutcome::Warned | ReviewOutcome::Audited => true,
                ReviewOutcome::Allowed => reviewed.warnings > 0,
                ReviewOutcome::Patched => false,
            };
            if notable {
                log_review!(tracing::Level::INFO)
            } else {
                log_review!(tracing::Level::DEBUG)
            }
            Response::builder()
                .status(StatusCode::OK)
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from(reviewed.body))
                .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
        }
        Ok(Err(error)) if error.is_internal() => {
            failed(in_flight);
            tracing::error!(webhook = webhook.as_str(), %error, "internal error");
            plain(StatusCode::INTERNAL_SERVER_ERROR, format!("{error}\n"))
        }
        Ok(Err(error)) => {
            failed(in_flight);
            tracing::warn!(webhook = webhook.as_str(), %error, "bad admission request");
            plain(StatusCode::BAD_REQUEST, format!("{error}\n"))
        }
        Err(_) => {
            failed(in_flight);
            state.metrics.panics.inc();
            tracing::error!(webhook = webhook.as_str(), "panic while handling a request");
            plain(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal error; the webhook's failurePolicy applies\n".to_owned(),
            )
        }
    }
}

fn plain(status: StatusCode, message: String) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        message,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::ServiceExt;

    const JOB: &[u8] = include_bytes!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/fixtures/admission/001-Job-CREATE-mutate.json"
    ));

    /// [`webhook_router`]'s `/mutate`, deciding with `review`.
    fn mutate_with(state: Arc<AppState>, review: Review) -> Router {
        Router::new()
            .route(
                MUTATE_PATH,
                post(
                    move |State(state): State<Arc<AppState>>, request: Request| async move {
                        webhook(Webhook::Mutate, &state, request, review).await
                    },
                ),
            )
            .with_state(state)
    }

    fn request(body: &'static [u8]) -> Request {
        Request::post(MUTATE_PATH)
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(body))
            .expect("a valid request")
    }

    /// What the admin port's `/metrics` serves.
    fn exposition(state: &AppState) -> String {
        gpu_guard_runtime::process::AdminProbes::metrics(state)
    }

    fn panics_on_marker(
        webhook: Webhook,
        body: &[u8],
        policy: &Policy,
        view: &dyn ClusterView,
        memories: &dyn Memories,
    ) -> Result<Reviewed, ReviewError> {
        assert!(body != b"{\"panic\": true}", "a bug in a handler");
        admission::review_with_memories(webhook, body, policy, view, memories)
    }

    fn internal_error(
        _: Webhook,
        _: &[u8],
        _: &Policy,
        _: &dyn ClusterView,
        _: &dyn Memories,
    ) -> Result<Reviewed, ReviewError> {
        Err(ReviewError::Internal(
            "the computed patch does not apply".to_owned(),
        ))
    }

    #[tokio::test]
    async fn a_panic_is_a_counted_500_and_the_next_request_is_served() {
        let state = AppState::new(Policy::embedded());
        let router = mutate_with(state.clone(), panics_on_marker);
        let response = router
            .clone()
            .oneshot(request(b"{\"panic\": true}"))
            .await
            .expect("an answer");
        assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(state.metrics.panics.get(), 1);

        let response = router.oneshot(request(JOB)).await.expect("an answer");
        assert_eq!(response.status(), StatusCode::OK);
        let text = exposition(&state);
        assert!(text.contains("gpu_guard_handler_panics_total 1"), "{text}");
        assert!(
            text.contains(
                r#"gpu_guard_admission_requests_total{webhook="mutate",kind="unknown",operation="unknown",outcome="error"} 1"#
            ),
            "{text}"
        );
    }

    #[tokio::test]
    async fn an_internal_error_is_a_500_so_the_failure_policy_applies() {
        let state = AppState::new(Policy::embedded());
        let response = mutate_with(state.clone(), internal_error)
            .oneshot(request(JOB))
            .await
            .expect("an answer");
        assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
        let body = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .expect("a body");
        assert_eq!(
            &body[..],
            b"internal error: the computed patch does not apply\n"
        );
        let text = exposition(&state);
        assert!(
            text.contains(
                r#"gpu_guard_admission_requests_total{webhook="mutate",kind="unknown",operation="unknown",outcome="error"} 1"#
            ),
            "{text}"
        );
        assert_eq!(state.metrics.panics.get(), 0);
    }
}
