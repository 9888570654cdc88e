//! The webhook routes: `/mutate` and `/validate` read the body within its limits and hand it
//! to the reviewer ([`crate::admission::review`]); the answer, its metrics and its log line.

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
use crate::admission::{ReviewOutcome, Webhook};
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
    webhook(Webhook::Mutate, &state, request).await
}

async fn validate(State(state): State<Arc<AppState>>, request: Request) -> Response {
    webhook(Webhook::Validate, &state, request).await
}

/// Reads the body (within [`MAX_BODY_BYTES`]) and decides; the headers are read in place.
async fn webhook(webhook: Webhook, state: &AppState, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    match tokio::time::timeout(
        state.body_timeout,
        axum::body::to_bytes(body, MAX_BODY_BYTES),
    )
    .await
    {
        Ok(Ok(body)) => handle(webhook, state, &parts.headers, &body),
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

fn handle(webhook: Webhook, state: &AppState, headers: &HeaderMap, body: &[u8]) -> Response {
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
    let (policy, reviewer, view) = (&state.policy, state.reviewer, &*state.view);
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        reviewer(webhook, body, policy, view)
    }));
    match result {
        Ok(Ok(reviewed)) => {
            if reviewed.patch_bytes > 0 {
                state.metrics.patches.inc();
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
