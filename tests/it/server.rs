//! The webhook server over real sockets: TLS on 127.0.0.1:0 with certificates made in a temp
//! dir, a reqwest client that trusts only the test CA, every AdmissionReview fixture, the bad
//! inputs, certificate rotation and draining.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use gpu_guard_core::devices::NoDraFacts;
use gpu_guard_core::mutate::object::mutate_object;
use gpu_guard_core::mutate::patch;
use gpu_guard_core::policy::Policy;
use gpu_guard_webhook::server::tls::{CertificateFiles, GeneratedPair, generate_self_signed};
use gpu_guard_webhook::server::{
    CertificateSource, ClusterSource, RunningServer, ServerConfig, Timeouts, start,
};
use json_patch::Patch;
use serde_json::{Value, json};

use crate::reviews;

pub(crate) fn client(ca_pem: &str) -> reqwest::Client {
    let tls = client_tls(ca_pem);
    reqwest::Client::builder()
        .tls_backend_preconfigured(tls)
        .build()
        .unwrap()
}

/// A rustls client configuration that trusts only the given CA.
fn client_tls(ca_pem: &str) -> rustls::ClientConfig {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pemfile_certs(ca_pem) {
        roots.add(cert).unwrap();
    }
    rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth()
}

fn rustls_pemfile_certs(pem: &str) -> Vec<rustls::pki_types::CertificateDer<'static>> {
    use rustls::pki_types::pem::PemObject;
    rustls::pki_types::CertificateDer::pem_slice_iter(pem.as_bytes())
        .map(Result::unwrap)
        .collect()
}

/// A TLS connection to the server trusting only the test CA, for writing raw HTTP by hand.
async fn raw_tls(
    running: &RunningServer,
    pair: &GeneratedPair,
) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(client_tls(&pair.ca_pem)));
    let tcp = tokio::net::TcpStream::connect(running.addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    connector.connect(name, tcp).await.unwrap()
}

fn write_pair(dir: &Path, pair: &GeneratedPair) {
    std::fs::write(dir.join("tls.crt"), &pair.cert_pem).unwrap();
    std::fs::write(dir.join("tls.key"), &pair.key_pem).unwrap();
}

/// The cluster facts of the embedded policy (no API server).
fn offline_view() -> ClusterSource {
    ClusterSource::offline(&Policy::embedded())
}

async fn server(dir: &Path, pair: &GeneratedPair, drain: Duration) -> RunningServer {
    server_with(dir, pair, drain, offline_view(), Policy::embedded()).await
}

pub(crate) async fn server_with(
    dir: &Path,
    pair: &GeneratedPair,
    drain: Duration,
    cluster: ClusterSource,
    policy: Policy,
) -> RunningServer {
    let _ = rustls::crypto::ring::default_provider().install_default();
    write_pair(dir, pair);
    let localhost: SocketAddr = "127.0.0.1:0".parse().unwrap();
    start(
        ServerConfig {
            listen: localhost,
            admin_listen: localhost,
            certificate: CertificateSource::Files {
                files: CertificateFiles {
                    cert: dir.join("tls.crt"),
                    key: dir.join("tls.key"),
                },
                poll: Duration::from_millis(100),
            },
            drain_delay: drain,
            timeouts: Timeouts {
                handshake: Duration::from_millis(300),
                headers: Duration::from_millis(300),
                body: Duration::from_secs(1),
                shutdown: Duration::from_secs(5),
            },
        },
        policy,
        cluster,
    )
    .await
    .unwrap()
}

pub(crate) fn url(running: &RunningServer, path: &str) -> String {
    format!("https://localhost:{}{path}", running.addr.port())
}

pub(crate) async fn post(client: &reqwest::Client, url: &str, body: Vec<u8>) -> (u16, String) {
    let response = client
        .post(url)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    (response.status().as_u16(), response.text().await.unwrap())
}

/// The API server's rules for a webhook response.
fn check_response(webhook: &str, request: &Value, response: &Value) {
    assert_eq!(response["kind"], "AdmissionReview");
    assert_eq!(response["apiVersion"], request["apiVersion"]);
    let answer = &response["response"];
    assert_eq!(answer["uid"], request["request"]["uid"], "uid is echoed");
    assert!(answer["allowed"].is_boolean());
    assert_eq!(
        answer.get("patch").is_some(),
        answer.get("patchType").is_some(),
        "patch and patchType go together"
    );
    if webhook == "validate" {
        assert!(
            answer.get("patch").is_none(),
            "validating webhooks send no patch"
        );
    }
    for warning in answer["warnings"].as_array().into_iter().flatten() {
        assert!(warning.as_str().unwrap().chars().count() <= 120);
    }
}

#[tokio::test]
async fn every_fixture_gets_the_engines_answer_over_https() {
    let dir = tempfile::tempdir().unwrap();
    let pair = generate_self_signed(&[]).unwrap();
    let running = server(dir.path(), &pair, Duration::ZERO).await;
    let client = client(&pair.ca_pem);
    let mut paths: Vec<_> = std::fs::read_dir("tests/fixtures/admission")
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    paths.sort();
    let mut patched = 0;
    for path in paths {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let bytes = std::fs::read(&path).unwrap();
        let review: Value = serde_json::from_slice(&bytes).unwrap();
        // The fixtures were sent to /mutate or /validate: post each where it was sent.
        let webhook = if name.contains("-mutate") {
            "mutate"
        } else {
            "validate"
        };
        let (status, body) = post(&client, &url(&running, &format!("/{webhook}")), bytes).await;
        assert_eq!(status, 200, "{name}: {body}");
        let response: Value = serde_json::from_str(&body).unwrap();
        check_response(webhook, &review, &response);
        let answer = &response["response"];
        assert_eq!(answer["allowed"], true, "{name}");
        let object = &review["request"]["object"];
        let expected = (webhook == "mutate" && review["request"]["operation"] == "CREATE")
            .then(|| mutate_object(object, &Policy::embedded(), &NoDraFacts))
            .flatten()
            .map(|m| m.unwrap().patch)
            .filter(|p| !p.is_empty());
        match (answer.get("patch"), expected) {
            (None, None) => {}
            (Some(sent), Some(expected)) => {
                let sent = base64::engine::general_purpose::STANDARD
                    .decode(sent.as_str().unwrap())
                    .unwrap();
                let sent: Patch = serde_json::from_slice(&sent).unwrap();
                assert_eq!(answer["patchType"], "JSONPatch");
                assert_eq!(
                    patch::apply(object, &sent).unwrap(),
                    patch::apply(object, &expected).unwrap(),
                    "{name}"
                );
                patched += 1;
            }
            (sent, expected) => panic!("{name}: sent {sent:?}, expected {expected:?}"),
        }
    }
    assert_eq!(
        patched, 7,
        "six Job CREATEs (one a dry run) and a CronJob are patched"
    );
    running.shutdown().await;
}

/// The patch of a `/mutate` response, decoded.
pub(crate) fn sent_patch(answer: &Value) -> Patch {
    let sent = base64::engine::general_purpose::STANDARD
        .decode(answer["patch"].as_str().expect("a patch"))
        .unwrap();
    serde_json::from_slice(&sent).unwrap()
}

#[tokio::test]
async fn the_in_place_restart_profile_adds_restart_rules_over_https() {
    let profile =
        gpu_guard_core::policy::load(Path::new("policies/in-place-restart.yaml")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let pair = generate_self_signed(&[]).unwrap();
    let running = server_with(
        dir.path(),
        &pair,
        Duration::ZERO,
        offline_view(),
        profile.clone(),
    )
    .await;
    let client = client(&pair.ca_pem);

    // The recorded GPU Job CREATE, as is, and with a CPU container in front of the trainer
    // and a restart rule of the trainer's own (so the rule is appended by index).
    let plain = reviews::fixture("001-Job-CREATE-mutate.json");
    let mut own_rules = plain.clone();
    let containers = own_rules["request"]["object"]["spec"]["template"]["spec"]["containers"]
        .as_array_mut()
        .unwrap();
    containers[0]["restartPolicy"] = json!("Never");
    containers[0]["restartPolicyRules"] =
        json!([{"action": "Restart", "exitCodes": {"operator": "In", "values": [3]}}]);
    containers.insert(
        0,
        json!({"name": "metrics", "image": "registry.example/metrics:1.0",
        "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File",
        "imagePullPolicy": "IfNotPresent"}),
    );

    let ours = json!({"action": "Restart", "exitCodes": {"operator": "In", "values": [70, 140]}});
    for (review, trainer, expected_rules, rule_path) in [
        (
            &plain,
            0,
            json!([ours]),
            "/spec/template/spec/containers/0/restartPolicyRules",
        ),
        (
            &own_rules,
            1,
            json!([{"action": "Restart", "exitCodes": {"operator": "In", "values": [3]}}, ours]),
            "/spec/template/spec/containers/1/restartPolicyRules/-",
        ),
    ] {
        let body = serde_json::to_vec(review).unwrap();
        let (status, text) = post(&client, &url(&running, "/mutate"), body).await;
        assert_eq!(status, 200, "{text}");
        let response: Value = serde_json::from_str(&text).unwrap();
        check_response("mutate", review, &response);
        let answer = &response["response"];
        assert_eq!(answer["allowed"], true);
        let sent = sent_patch(answer);
        let paths: Vec<String> = sent.iter().map(|op| op.path().to_string()).collect();
        assert!(paths.iter().any(|p| p == rule_path), "{paths:?}");

        let object = &review["request"]["object"];
        let patched = patch::apply(object, &sent).unwrap();
        let pod = &patched["spec"]["template"]["spec"];
        assert_eq!(pod["containers"][trainer]["restartPolicy"], "Never");
        assert_eq!(
            pod["containers"][trainer]["restartPolicyRules"],
            expected_rules
        );
        if trainer == 1 {
            assert!(pod["containers"][0].get("restartPolicyRules").is_none());
        }
        // The device rules still name the trainer, for codes the restart rules leave alone.
        let device = patched["spec"]["podFailurePolicy"]["rules"][3]["onExitCodes"].clone();
        assert_eq!(device["values"], json!([74, 75, 138]));
        let job: k8s_openapi::api::batch::v1::Job = serde_json::from_value(patched).unwrap();
        assert_eq!(gpu_guard_core::api_rules::job::check_job(&job), Vec::new());
        let expected = mutate_object(object, &profile, &NoDraFacts)
            .unwrap()
            .unwrap()
            .patch;
        assert_eq!(sent, expected, "the server sends the engine's patch");
    }
    running.shutdown().await;
}

#[tokio::test]
async fn bad_input_gets_a_clear_answer_and_the_server_keeps_serving() {
    let dir = tempfile::tempdir().unwrap();
    let pair = generate_self_signed(&[]).unwrap();
    let running = server(dir.path(), &pair, Duration::ZERO).await;
    let client = client(&pair.ca_pem);
    let mutate = url(&running, "/mutate");
    let job = std::fs::read("tests/fixtures/admission/001-Job-CREATE-mutate.json").unwrap();
    let job_review: Value = serde_json::from_slice(&job).unwrap();
    let with = |edit: &dyn Fn(&mut Value)| {
        let mut review = job_review.clone();
        edit(&mut review);
        serde_json::to_vec(&review).unwrap()
    };
    let cases: Vec<(&str, Vec<u8>, u16, &str)> = vec![
        (
            "not JSON",
            b"{not json".to_vec(),
            400,
            "not a JSON AdmissionReview",
        ),
        (
            "wrong shape",
            b"[1, 2]".to_vec(),
            400,
            "not a JSON AdmissionReview",
        ),
        (
            "no request",
            with(&|r| {
                r.as_object_mut().unwrap().remove("request");
            }),
            400,
            "no request",
        ),
        (
            "no object on CREATE",
            with(&|r| {
                r["request"].as_object_mut().unwrap().remove("object");
            }),
            400,
            "object is missing",
        ),
        (
            "unknown version",
            with(&|r| r["apiVersion"] = json!("admission.k8s.io/v2")),
            400,
            "unsupported apiVersion",
        ),
        ("too large", vec![b' '; 8 * 1024 * 1024], 413, ""),
    ];
    for (name, body, status, message) in cases {
        let (got, text) = post(&client, &mutate, body).await;
        assert_eq!(got, status, "{name}: {text}");
        assert!(text.contains(message), "{name}: {text}");
    }
    // 100,000 levels of nesting in a field nothing reads: serde_json skips it without recursing,
    // and the Job is mutated as without it.
    let text = String::from_utf8(job.clone()).unwrap();
    let object = text.find(r#""object""#).unwrap();
    let at = object + text[object..].find('{').unwrap() + 1;
    let deep = format!(
        r#"{}"x-unread":{}{},{}"#,
        &text[..at],
        "[".repeat(100_000),
        "]".repeat(100_000),
        &text[at..]
    );
    let (got, text) = post(&client, &mutate, deep.into_bytes()).await;
    assert_eq!(got, 200, "{text}");
    assert!(text.contains(r#""patchType":"JSONPatch""#), "{text}");

    // v1beta1 is answered in v1beta1.
    let beta = with(&|r| r["apiVersion"] = json!("admission.k8s.io/v1beta1"));
    let (status, text) = post(&client, &mutate, beta).await;
    assert_eq!(status, 200);
    assert_eq!(
        serde_json::from_str::<Value>(&text).unwrap()["apiVersion"],
        "admission.k8s.io/v1beta1"
    );

    // An object that does not decode as a Job: allowed, unchanged, with a warning.
    let broken =
        with(&|r| r["request"]["object"]["spec"]["template"]["spec"]["containers"] = json!("x"));
    let (status, text) = post(&client, &mutate, broken).await;
    assert_eq!(status, 200);
    let answer = &serde_json::from_str::<Value>(&text).unwrap()["response"];
    assert_eq!(answer["allowed"], true);
    assert!(answer.get("patch").is_none());
    assert!(
        answer["warnings"][0]
            .as_str()
            .unwrap()
            .contains("does not decode"),
        "{answer}"
    );

    // Wrong method and content type.
    let get = client.get(&mutate).send().await.unwrap();
    assert_eq!(get.status().as_u16(), 405);
    let form = client
        .post(&mutate)
        .header("content-type", "text/plain")
        .body(job.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(form.status().as_u16(), 415);

    // And the server still answers a good request.
    let (status, _) = post(&client, &mutate, job).await;
    assert_eq!(status, 200);
    running.shutdown().await;
}

async fn served_certificate_ca(
    running: &RunningServer,
    candidates: &[&GeneratedPair],
) -> Option<usize> {
    for (index, pair) in candidates.iter().enumerate() {
        // A new client is a new connection: it sees the certificate served now.
        let client = client(&pair.ca_pem);
        if client.get(url(running, "/mutate")).send().await.is_ok() {
            return Some(index);
        }
    }
    None
}

async fn wait_for_ca(running: &RunningServer, candidates: &[&GeneratedPair], want: usize) {
    for _ in 0..50 {
        if served_certificate_ca(running, candidates).await == Some(want) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the server never served the certificate of CA {want}");
}

#[tokio::test]
async fn certificates_rotate_in_place_and_by_symlink_swap_and_a_broken_pair_is_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let first = generate_self_signed(&[]).unwrap();
    let second = generate_self_signed(&[]).unwrap();
    let third = generate_self_signed(&[]).unwrap();

    // Kubernetes Secret volume layout: tls.crt -> ..data/tls.crt, ..data -> ..2026_a.
    let volume = dir.path();
    let version_a = volume.join("..2026_a");
    std::fs::create_dir(&version_a).unwrap();
    write_pair(&version_a, &first);
    std::os::unix::fs::symlink("..2026_a", volume.join("..data")).unwrap();
    std::os::unix::fs::symlink("..data/tls.crt", volume.join("tls.crt")).unwrap();
    std::os::unix::fs::symlink("..data/tls.key", volume.join("tls.key")).unwrap();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let localhost: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let running = start(
        ServerConfig {
            listen: localhost,
            admin_listen: localhost,
            certificate: CertificateSource::Files {
                files: CertificateFiles {
                    cert: volume.join("tls.crt"),
                    key: volume.join("tls.key"),
                },
                poll: Duration::from_millis(100),
            },
            drain_delay: Duration::ZERO,
            timeouts: Timeouts::default(),
        },
        Policy::embedded(),
        offline_view(),
    )
    .await
    .unwrap();
    let all = [&first, &second, &third];
    assert_eq!(served_certificate_ca(&running, &all).await, Some(0));

    // Symlink swap, as the kubelet does it.
    let version_b = volume.join("..2026_b");
    std::fs::create_dir(&version_b).unwrap();
    write_pair(&version_b, &second);
    std::os::unix::fs::symlink("..2026_b", volume.join("..data_tmp")).unwrap();
    std::fs::rename(volume.join("..data_tmp"), volume.join("..data")).unwrap();
    wait_for_ca(&running, &all, 1).await;

    // A half-written pair (certificate of one, key of another) keeps the last good one.
    std::fs::write(version_b.join("tls.crt"), &third.cert_pem).unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(served_certificate_ca(&running, &all).await, Some(1));
    let (_, metrics) = admin_get(&running, "/metrics").await;
    let refused: u64 = metrics
        .lines()
        .find_map(|line| line.strip_prefix("gpu_guard_certificate_reload_errors_total "))
        .and_then(|count| count.parse().ok())
        .unwrap_or_else(|| panic!("no reload error count in {metrics}"));
    assert!(refused >= 1, "{metrics}");

    // Rewritten in place: the key arrives, the pair is whole again.
    std::fs::write(version_b.join("tls.key"), &third.key_pem).unwrap();
    wait_for_ca(&running, &all, 2).await;
    running.shutdown().await;
}

#[tokio::test]
async fn draining_turns_readiness_false_and_lets_requests_through_until_the_delay_ends() {
    let dir = tempfile::tempdir().unwrap();
    let pair = generate_self_signed(&[]).unwrap();
    let running = server(dir.path(), &pair, Duration::from_secs(2)).await;
    let admin = format!("http://{}", running.admin_addr);
    let plain = reqwest::Client::new();
    assert_eq!(
        plain
            .get(format!("{admin}/readyz"))
            .send()
            .await
            .unwrap()
            .status()
            .as_u16(),
        200
    );
    assert_eq!(
        plain
            .get(format!("{admin}/healthz"))
            .send()
            .await
            .unwrap()
            .status()
            .as_u16(),
        200
    );

    let client = client(&pair.ca_pem);
    let job = std::fs::read("tests/fixtures/admission/001-Job-CREATE-mutate.json").unwrap();
    let mutate = url(&running, "/mutate");
    let state = running.state.clone();
    let admin_addr = running.admin_addr;
    let stopping = tokio::spawn(running.shutdown());
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(state.draining.load(std::sync::atomic::Ordering::Relaxed));
    let readyz = plain
        .get(format!("http://{admin_addr}/readyz"))
        .send()
        .await
        .unwrap();
    assert_eq!(readyz.status().as_u16(), 503, "not ready while draining");
    // Still serving during the drain delay.
    let (status, _) = post(&client, &mutate, job).await;
    assert_eq!(status, 200);
    stopping.await.unwrap();
}

mod in_process {
    //! The router without sockets, driven with `tower::ServiceExt::oneshot`. What a panic or an
    //! internal error of the review becomes is a unit test of the routes
    //! (`crates/webhook/src/server/routes.rs`): no request is known to cause either.

    use super::*;
    use axum::body::Body;
    use axum::http::Request;
    use gpu_guard_runtime::process::admin_router;
    use gpu_guard_webhook::server::{AppState, webhook_router};
    use tower::ServiceExt;

    fn request(path: &str, body: Vec<u8>) -> Request<Body> {
        Request::post(path)
            .header("content-type", "application/json")
            .body(Body::from(body))
            .unwrap()
    }

    async fn metrics_text(state: &Arc<AppState>) -> String {
        let response = admin_router(state.clone())
            .oneshot(Request::get("/metrics").body(Body::empty()).unwrap())
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), 200);
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap();
        String::from_utf8(bytes.to_vec()).unwrap()
    }

    #[tokio::test]
    async fn requests_are_counted_by_webhook_kind_operation_and_outcome() {
        let state = AppState::new(Policy::embedded());
        let router = webhook_router(state.clone());
        for fixture in [
            "001-Job-CREATE-mutate.json",
            "003-Job-CREATE-mutate.json",
            "017-Job-UPDATE-mutate.json",
        ] {
            let body = std::fs::read(format!("tests/fixtures/admission/{fixture}")).unwrap();
            let response = router
                .clone()
                .oneshot(request("/mutate", body))
                .await
                .unwrap();
            assert_eq!(response.status().as_u16(), 200);
        }
        let response = router
            .oneshot(request("/mutate", b"nope".to_vec()))
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), 400);

        assert_eq!(state.metrics.patches.get(), 2);
        assert_eq!(state.metrics.in_flight.get(), 0);
        let text = metrics_text(&state).await;
        for (kind, operation, outcome, count) in [
            ("Job", "CREATE", "patched", 2),
            ("Job", "UPDATE", "allowed", 1),
            ("unknown", "unknown", "error", 1),
        ] {
            let sample = format!(
                "gpu_guard_admission_requests_total{{webhook=\"mutate\",kind=\"{kind}\",\
                 operation=\"{operation}\",outcome=\"{outcome}\"}} {count}\n"
            );
            assert!(text.contains(&sample), "no {sample:?} in {text}");
        }
        assert!(
            text.contains(r#"gpu_guard_admission_duration_seconds_count{webhook="mutate"} 4"#),
            "every request is timed: {text}"
        );
    }
}

#[tokio::test]
async fn the_certificate_expiry_is_exported() {
    let dir = tempfile::tempdir().unwrap();
    let pair = generate_self_signed(&[]).unwrap();
    let running = server(dir.path(), &pair, Duration::ZERO).await;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let not_after = running.state.metrics.certificates.not_after.get();
    assert!(
        not_after > now + 300.0 * 86_400.0,
        "about a year ahead: {not_after}"
    );
    let text = reqwest::get(format!("http://{}/metrics", running.admin_addr))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        text.contains("gpu_guard_certificate_not_after_timestamp_seconds"),
        "{text}"
    );
    running.shutdown().await;
}

#[tokio::test]
async fn a_request_in_flight_when_shutdown_starts_is_answered_before_the_server_stops() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let dir = tempfile::tempdir().unwrap();
    let pair = generate_self_signed(&[]).unwrap();
    // No drain delay: the listener closes at once, only in-flight requests keep it alive.
    let running = server(dir.path(), &pair, Duration::ZERO).await;
    let mut tls = raw_tls(&running, &pair).await;

    // The request starts: headers sent, body not yet.
    let body = std::fs::read("tests/fixtures/admission/001-Job-CREATE-mutate.json").unwrap();
    let head = format!(
        "POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    tls.write_all(head.as_bytes()).await.unwrap();
    tls.flush().await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;

    let state = running.state.clone();
    let stopping = tokio::spawn(running.shutdown());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(state.draining.load(std::sync::atomic::Ordering::Relaxed));
    assert!(
        !stopping.is_finished(),
        "the server waits for the request in flight"
    );

    tls.write_all(&body).await.unwrap();
    tls.flush().await.unwrap();
    let mut response = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), tls.read_to_end(&mut response)).await;
    let response = String::from_utf8_lossy(&response);
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert!(
        response.contains("\"patchType\":\"JSONPatch\""),
        "{response}"
    );
    tokio::time::timeout(Duration::from_secs(5), stopping)
        .await
        .expect("the server stops once the request is answered")
        .unwrap();
}

#[tokio::test]
async fn slow_clients_are_disconnected_and_others_are_served_meanwhile() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let dir = tempfile::tempdir().unwrap();
    let pair = generate_self_signed(&[]).unwrap();
    let running = server(dir.path(), &pair, Duration::ZERO).await;

    // Connects and never starts the TLS handshake: closed after the handshake timeout.
    let mut silent = tokio::net::TcpStream::connect(running.addr).await.unwrap();
    // Finishes the handshake, then sends half a request line: closed after the header timeout.
    let mut dawdler = raw_tls(&running, &pair).await;
    dawdler
        .write_all(b"POST /mutate HTTP/1.1\r\nHost: loc")
        .await
        .unwrap();
    dawdler.flush().await.unwrap();

    // Meanwhile a normal client is served.
    let job = std::fs::read("tests/fixtures/admission/001-Job-CREATE-mutate.json").unwrap();
    let (status, _) = post(&client(&pair.ca_pem), &url(&running, "/mutate"), job).await;
    assert_eq!(status, 200);

    let mut buffer = [0u8; 1];
    let closed = tokio::time::timeout(Duration::from_secs(3), silent.read(&mut buffer)).await;
    assert!(
        matches!(closed, Ok(Ok(0)) | Ok(Err(_))),
        "silent client closed: {closed:?}"
    );
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(3), dawdler.read_to_end(&mut rest)).await;
    assert!(
        closed.is_ok(),
        "the slow client's connection is closed by the server"
    );

    // Headers complete, body short of its Content-Length: 408 after the body timeout.
    let mut short = raw_tls(&running, &pair).await;
    short
        .write_all(b"POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"a\"")
        .await
        .unwrap();
    short.flush().await.unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(3), short.read_to_end(&mut answer)).await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    running.shutdown().await;
}

/// Reads one HTTP/1.1 response with a Content-Length from `stream`: its status code and body.
async fn read_response<S: tokio::io::AsyncRead + Unpin>(
    stream: &mut S,
    buffer: &mut Vec<u8>,
) -> (u16, Vec<u8>) {
    use tokio::io::AsyncReadExt;
    let mut chunk = [0u8; 16 * 1024];
    loop {
        if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buffer[..end]).to_ascii_lowercase();
            let status = head[9..12].parse().unwrap();
            let length: usize = head
                .lines()
                .find_map(|line| line.strip_prefix("content-length:"))
                .map(|value| value.trim().parse().unwrap())
                .expect("a content-length");
            while buffer.len() < end + 4 + length {
                let read = stream.read(&mut chunk).await.unwrap();
                assert!(read > 0, "the connection closed in a response body");
                buffer.extend_from_slice(&chunk[..read]);
            }
            let body = buffer[end + 4..end + 4 + length].to_vec();
            buffer.drain(..end + 4 + length);
            return (status, body);
        }
        let read = stream.read(&mut chunk).await.unwrap();
        assert!(read > 0, "the connection closed before a response");
        buffer.extend_from_slice(&chunk[..read]);
    }
}

/// Issue 15: with Nagle's algorithm on, a response written while an earlier small write is
/// still unacknowledged waits for that ACK, which the client delays (40 ms on Linux). The first
/// response on every connection is such a write: the server has just sent its TLS 1.3 session
/// tickets, and the client, having sent its request, has nothing to piggyback the ACK on. Over
/// loopback a request takes a few milliseconds and a stalled one at least 40, so counting those
/// over 20 ms separates the two clearly, even on a busy machine where a few requests may be slow
/// for other reasons: without TCP_NODELAY on accepted connections, about every first request
/// stalls (a quarter of these).
#[tokio::test]
async fn requests_on_fresh_keep_alive_connections_never_wait_for_a_delayed_ack() {
    use tokio::io::AsyncWriteExt;

    let dir = tempfile::tempdir().unwrap();
    let pair = generate_self_signed(&[]).unwrap();
    let running = server(dir.path(), &pair, Duration::ZERO).await;
    let connector = tokio_rustls::TlsConnector::from(Arc::new(client_tls(&pair.ca_pem)));
    let body = std::fs::read("tests/fixtures/load/job-7k-review.json").unwrap();
    let mut request = format!(
        "POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    request.extend_from_slice(&body);

    let mut took = Vec::new();
    for _ in 0..12 {
        let tcp = tokio::net::TcpStream::connect(running.addr).await.unwrap();
        // Each request goes in one write without Nagle: only the server's writes can stall.
        tcp.set_nodelay(true).unwrap();
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let mut tls = connector.connect(name, tcp).await.unwrap();
        let mut buffer = Vec::new();
        for _ in 0..4 {
            let started = std::time::Instant::now();
            tls.write_all(&request).await.unwrap();
            tls.flush().await.unwrap();
            let (status, answer) = read_response(&mut tls, &mut buffer).await;
            took.push(started.elapsed());
            assert_eq!(status, 200, "{}", String::from_utf8_lossy(&answer));
            // A low rate, as the API server's: the client's delayed-ACK timer is armed.
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    let stalled: Vec<_> = took
        .iter()
        .filter(|took| **took > Duration::from_millis(20))
        .collect();
    assert!(
        // Without the fix, 12 stall (every first request); allow a few slow ones on a busy
        // machine.
        stalled.len() <= 4,
        "{} of {} requests took over 20 ms (a Nagle and delayed-ACK stall is ~40 ms): {stalled:?}",
        stalled.len(),
        took.len()
    );
    running.shutdown().await;
}

#[tokio::test]
async fn shutdown_does_not_wait_for_ever_on_a_stalled_request() {
    use tokio::io::AsyncWriteExt;

    let dir = tempfile::tempdir().unwrap();
    let pair = generate_self_signed(&[]).unwrap();
    let _ = rustls::crypto::ring::default_provider().install_default();
    write_pair(dir.path(), &pair);
    let localhost: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let running = start(
        ServerConfig {
            listen: localhost,
            admin_listen: localhost,
            certificate: CertificateSource::Files {
                files: CertificateFiles {
                    cert: dir.path().join("tls.crt"),
                    key: dir.path().join("tls.key"),
                },
                poll: Duration::from_secs(5),
            },
            drain_delay: Duration::ZERO,
            timeouts: Timeouts {
                body: Duration::from_secs(60),
                shutdown: Duration::from_millis(500),
                ..Timeouts::default()
            },
        },
        Policy::embedded(),
        offline_view(),
    )
    .await
    .unwrap();
    let mut stalled = raw_tls(&running, &pair).await;
    stalled
        .write_all(b"POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
        .await
        .unwrap();
    stalled.flush().await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = std::time::Instant::now();
    tokio::time::timeout(Duration::from_secs(5), running.shutdown())
        .await
        .expect("shutdown ends at its timeout despite the stalled request");
    assert!(
        started.elapsed() >= Duration::from_millis(400),
        "it did wait for the request first"
    );
    // And the stalled connection is closed, not left running.
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(
        Duration::from_secs(2),
        tokio::io::AsyncReadExt::read_to_end(&mut stalled, &mut rest),
    )
    .await;
    assert!(
        closed.is_ok(),
        "the stalled connection was closed at the shutdown timeout"
    );
}

#[tokio::test]
async fn a_key_that_does_not_match_the_certificate_is_refused_at_start() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().unwrap();
    let one = generate_self_signed(&[]).unwrap();
    let other = generate_self_signed(&[]).unwrap();
    std::fs::write(
        dir.path().join("tls.crt"),
        format!("{}{}", one.cert_pem, one.ca_pem),
    )
    .unwrap();
    std::fs::write(dir.path().join("tls.key"), &other.key_pem).unwrap();
    let localhost: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let config = |key: &str| ServerConfig {
        listen: localhost,
        admin_listen: localhost,
        certificate: CertificateSource::Files {
            files: CertificateFiles {
                cert: dir.path().join("tls.crt"),
                key: dir.path().join(key),
            },
            poll: Duration::from_secs(5),
        },
        drain_delay: Duration::ZERO,
        timeouts: Timeouts::default(),
    };
    let Err(error) = start(config("tls.key"), Policy::embedded(), offline_view()).await else {
        panic!("a mismatched pair must be refused");
    };
    assert!(
        error
            .to_string()
            .contains("does not belong to the certificate"),
        "{error}"
    );

    // The same chain (leaf and CA) with its own key starts.
    std::fs::write(dir.path().join("own.key"), &one.key_pem).unwrap();
    let running = start(config("own.key"), Policy::embedded(), offline_view())
        .await
        .unwrap();
    running.shutdown().await;
}

/// The Pod fixture without priority, made to tolerate the GPU taint.
fn tolerating_pod() -> Value {
    let mut body: Value = serde_json::from_slice(
        &std::fs::read("tests/fixtures/admission/016-Pod-CREATE-validate.json").unwrap(),
    )
    .unwrap();
    body["request"]["object"]["spec"]["tolerations"]
        .as_array_mut()
        .unwrap()
        .push(json!({"key": "nvidia.com/gpu", "operator": "Exists"}));
    body
}

pub(crate) async fn admin_get(running: &RunningServer, path: &str) -> (u16, String) {
    let response = reqwest::Client::new()
        .get(format!("http://{}{path}", running.admin_addr))
        .send()
        .await
        .unwrap();
    (response.status().as_u16(), response.text().await.unwrap())
}

#[tokio::test]
async fn a_low_priority_pod_on_gpu_nodes_is_denied_over_https_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let pair = generate_self_signed(&[]).unwrap();
    let running = server(dir.path(), &pair, Duration::ZERO).await;
    let client = client(&pair.ca_pem);
    let body = tolerating_pod();
    let (status, text) = post(
        &client,
        &url(&running, "/validate"),
        body.to_string().into_bytes(),
    )
    .await;
    assert_eq!(status, 200, "a denial is an answer, not an HTTP error");
    let response: Value = serde_json::from_str(&text).unwrap();
    check_response("validate", &body, &response);
    let answer = &response["response"];
    assert_eq!(answer["allowed"], false);
    assert_eq!(answer["status"]["code"], 403);
    let message = answer["status"]["message"].as_str().unwrap();
    assert!(
        message.contains("spec.tolerations[2] tolerates the GPU node taint nvidia.com/gpu"),
        "{message}"
    );
    let (_, metrics) = admin_get(&running, "/metrics").await;
    assert!(
        metrics.contains("gpu_guard_guard_decisions_total{mode=\"Enforce\",outcome=\"denied\"} 1"),
        "{metrics}"
    );
    assert!(metrics.contains(
        "gpu_guard_admission_requests_total{webhook=\"validate\",kind=\"Pod\",operation=\"CREATE\",outcome=\"denied\"} 1"
    ));
    // No cluster: no cache metrics.
    assert!(!metrics.contains("gpu_guard_cluster_cache_synced{"));
    running.shutdown().await;
}

#[tokio::test]
async fn readiness_waits_for_the_cluster_caches_and_lookups_meanwhile_are_500() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    // An API server that refuses connections: the caches never sync.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = closed.local_addr().unwrap();
    drop(closed);
    let config = kube::Config::new(format!("http://{address}").parse().unwrap());
    let cache =
        gpu_guard_runtime::cluster::ClusterCache::start(kube::Client::try_from(config).unwrap());
    let dir = tempfile::tempdir().unwrap();
    let pair = generate_self_signed(&[]).unwrap();
    let running = server_with(
        dir.path(),
        &pair,
        Duration::ZERO,
        ClusterSource::Cache(cache),
        Policy::embedded(),
    )
    .await;
    let (status, text) = admin_get(&running, "/readyz").await;
    assert_eq!(
        (status, text.as_str()),
        (
            503,
            "waiting for the cluster caches to sync (PriorityClasses, Nodes, the DRA objects, and the \
             Jobs and JobSets with device failures on record)\n"
        )
    );
    let (_, metrics) = admin_get(&running, "/metrics").await;
    assert!(
        metrics.contains("gpu_guard_cluster_cache_synced{resource=\"nodes\"} 0"),
        "{metrics}"
    );
    assert!(metrics.contains("gpu_guard_cluster_cache_synced{resource=\"priorityclasses\"} 0"));

    let client = client(&pair.ca_pem);
    // A Pod carries its priority: judged without the caches.
    let (status, _) = post(
        &client,
        &url(&running, "/validate"),
        tolerating_pod().to_string().into_bytes(),
    )
    .await;
    assert_eq!(status, 200);
    // A template needs the PriorityClass cache: 500, so the failurePolicy applies.
    let mut deployment = tolerating_pod();
    let request = &mut deployment["request"];
    request["kind"] = json!({"group": "apps", "version": "v1", "kind": "Deployment"});
    request["object"] = json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "gpu-lab"},
        "spec": {"template": {"spec": {"priorityClassName": "high",
            "tolerations": [{"operator": "Exists"}], "containers": [{"name": "web", "image": "nginx"}]}}}});
    let (status, text) = post(
        &client,
        &url(&running, "/validate"),
        deployment.to_string().into_bytes(),
    )
    .await;
    assert_eq!(status, 500, "{text}");
    assert!(text.contains("has not synced yet"), "{text}");
    running.shutdown().await;
}

/// `gpu-guard serve --no-cluster --log-format json` as a child process with `args` added,
/// read up to its "serving" line: the child, the rest of its stderr, and the webhook address.
fn spawn_serve(
    dir: &Path,
    args: &[&str],
) -> (
    std::process::Child,
    std::io::BufReader<std::process::ChildStderr>,
    String,
) {
    use std::io::BufRead;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_gpu-guard"))
        .env_remove("GPU_GUARD_POLICY")
        .env_remove("GPU_GUARD_LOG_LEVEL")
        .env_remove("KUBECONFIG")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env("HOME", dir)
        .args(["serve", "--no-cluster", "--log-format", "json"])
        .args(["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"])
        .arg("--ca-bundle-file")
        .arg(dir.join("ca.pem"))
        .args(args)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(child.stderr.take().unwrap());
    let webhook = loop {
        let mut line = String::new();
        assert!(lines.read_line(&mut line).unwrap() > 0, "serve exited");
        let entry: Value = serde_json::from_str(&line).unwrap();
        if entry["message"] == "serving" {
            break entry["webhook"].as_str().unwrap().to_owned();
        }
    };
    (child, lines, webhook)
}

fn child_client(dir: &Path) -> reqwest::Client {
    reqwest::Client::builder()
        .tls_backend_preconfigured(client_tls(
            &std::fs::read_to_string(dir.join("ca.pem")).unwrap(),
        ))
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap()
}

/// A webhook whose stderr nobody reads (a stalled log collector, a full pipe) still answers:
/// log lines go through a queue to a writer thread and are dropped, counted, when it is full.
/// With writes on the request path, the server stopped answering after about 140 requests,
/// when the 64 KB pipe filled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stderr_nobody_reads_never_stops_the_webhook() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    // Every review logs a line (at plain info only denials and guard findings do).
    let (mut child, lines, webhook) = spawn_serve(
        dir.path(),
        &["--log-level", "info,gpu_guard::admission=debug"],
    );
    // From here on nobody reads: the pipe fills and stays full.
    let client = child_client(dir.path());
    let body = std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/admission/001-Job-CREATE-mutate.json"),
    )
    .unwrap();
    let url = format!("https://{webhook}/mutate");
    for request in 0..600 {
        let sent = client
            .post(&url)
            .header("content-type", "application/json")
            .body(body.clone())
            .send()
            .await;
        let status = sent
            .unwrap_or_else(|error| panic!("request {request} got no answer: {error}"))
            .status();
        assert_eq!(status, 200, "request {request}");
    }
    // Reading again, the queued lines arrive: nothing was lost while the queue had room.
    let _ = child.kill();
    let logged = tokio::task::spawn_blocking(move || {
        lines
            .lines()
            .map_while(Result::ok)
            .filter(|line| line.contains("admission review"))
            .count()
    })
    .await
    .unwrap();
    let _ = child.wait();
    assert!(logged > 140, "only {logged} review lines reached stderr");
}

/// At the default level a routine review (a Job patched, its warnings noting the changes) logs
/// nothing, and a Job left unchanged with a warning (its own podFailurePolicy breaks an API
/// rule) or a denial logs its line; `gpu_guard::admission=debug` brings every line back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_info_only_denials_guard_findings_and_unprotected_jobs_log_a_line_per_review() {
    use std::io::BufRead;
    let job = std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/admission/001-Job-CREATE-mutate.json"),
    )
    .unwrap();
    let mut unchanged: Value = serde_json::from_slice(&job).unwrap();
    unchanged["request"]["object"]["spec"]["podFailurePolicy"] = json!({"rules": [
        {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [0]}}]});
    let unchanged = unchanged.to_string().into_bytes();
    let denied_pod = tolerating_pod().to_string().into_bytes();
    for (args, want) in [
        (&[][..], vec!["allowed, 1 warning", "denied"]),
        (
            &["--log-level", "info,gpu_guard::admission=debug"][..],
            vec!["patched, 1 warning", "allowed, 1 warning", "denied"],
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let (mut child, lines, webhook) = spawn_serve(dir.path(), args);
        let client = child_client(dir.path());
        for (path, body) in [
            ("mutate", &job),
            ("mutate", &unchanged),
            ("validate", &denied_pod),
        ] {
            let answer = client
                .post(format!("https://{webhook}/{path}"))
                .header("content-type", "application/json")
                .body(body.clone())
                .send()
                .await
                .unwrap();
            assert_eq!(answer.status(), 200, "{path}");
        }
        // Lines leave the queue in order: the Job's line, had it been logged, comes before the
        // denial's. Read up to the denial's (written within the writer's 100 ms batch).
        let outcomes = tokio::time::timeout(
            Duration::from_secs(10),
            tokio::task::spawn_blocking(move || {
                let mut outcomes = Vec::new();
                for line in lines.lines().map_while(Result::ok) {
                    let entry: Value = serde_json::from_str(&line).unwrap();
                    if entry["message"] == "admission review" {
                        assert_eq!(entry["target"], "gpu_guard::admission", "{line}");
                        let outcome = entry["outcome"].as_str().unwrap();
                        outcomes.push(match entry["warnings"].as_u64().unwrap() {
                            0 => outcome.to_owned(),
                            1 => format!("{outcome}, 1 warning"),
                            n => format!("{outcome}, {n} warnings"),
                        });
                        if entry["outcome"] == "denied" {
                            break;
                        }
                    }
                }
                outcomes
            }),
        )
        .await;
        let _ = child.kill();
        let _ = child.wait();
        let outcomes = outcomes.expect("the denial's line within 10 s").unwrap();
        assert_eq!(outcomes, want, "serve {args:?}");
    }
}
