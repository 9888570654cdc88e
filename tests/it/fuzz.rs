//! Fuzzing the two places untrusted input enters: the manifest reader (`mutate`, `check`) and
//! the AdmissionReview path (`/mutate`, `/validate`), with proptest.
//!
//! - arbitrary bytes, and arbitrary lines of YAML-ish tokens, through the manifest reader and
//!   both commands' engines: no panic, every error names its document and line, and a broken
//!   document never costs another;
//! - arbitrary JSON trees, written as YAML and read back: the same value (the writer and the
//!   reader agree on every scalar);
//! - the real AdmissionReview fixtures, with bytes flipped, cut and inserted: a response or a
//!   4xx-class error, never a panic.
//!
//! Each property runs 256 cases in `cargo test` (a few seconds); a longer run is
//! `PROPTEST_CASES=100000 cargo test --release --test it fuzz` (docs/DEVELOPMENT.md). Inputs that
//! once failed are kept in `tests/fuzz.proptest-regressions` and replayed first.

use std::path::Path;
use std::sync::LazyLock;

use gpu_guard_core::devices::NoDraFacts;
use gpu_guard_core::guard::StaticView;
use gpu_guard_core::mutate::object;
use gpu_guard_core::policy::Policy;
use gpu_guard_manifest::{self as manifest, Format, InputError};
use gpu_guard_webhook::admission::{self, Webhook};
use proptest::prelude::*;
use serde_json::{Map, Number, Value};

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|cases| cases.parse().ok())
        .unwrap_or(256)
}

static POLICY: LazyLock<Policy> = LazyLock::new(Policy::embedded);

/// Runs what `mutate` and `check` run on each document that was read; none may panic.
fn process(documents: &[manifest::Document]) {
    let view = StaticView::default();
    for object in manifest::objects(documents) {
        if let Some(Ok(mutation)) = object::mutate_object(&object.value, &POLICY, &NoDraFacts) {
            let _ = gpu_guard_core::mutate::patch::apply(&object.value, &mutation.patch);
        }
        let _ = manifest::render(std::slice::from_ref(&object.value), Format::Yaml);
        let kind = object.value.get("kind").and_then(Value::as_str);
        let api_version = object.value.get("apiVersion").and_then(Value::as_str);
        if let Some(guarded) = api_version
            .zip(kind)
            .and_then(|(a, k)| gpu_guard_core::guard::GuardedKind::from_api_version(a, k))
            && let Ok(workload) =
                gpu_guard_core::guard::Workload::from_value(guarded, &object.value)
        {
            let _ = gpu_guard_core::guard::judge(
                guarded,
                "default",
                &workload,
                &POLICY.guard,
                &POLICY.devices,
                &view,
            );
        }
    }
}

/// Every error of a parse names its document and a line within the text.
fn assert_errors_are_located(text: &str, errors: &[InputError]) -> Result<(), TestCaseError> {
    let lines = text.lines().count().max(1);
    for error in errors {
        match error {
            InputError::Parse {
                line: Some(line), ..
            } => prop_assert!(
                (1..=lines + 1).contains(line),
                "line {line} outside 1..={lines}: {error}"
            ),
            other => prop_assert!(false, "an error without a line: {other}"),
        }
    }
    Ok(())
}

/// Lines that look like YAML and hit its corners: indentation, anchors, aliases, merge keys,
/// tags, flow collections, block scalars, separators, tabs and stray bytes.
fn yaml_line() -> impl Strategy<Value = String> {
    let token = prop_oneof![
        Just("- ".to_owned()),
        Just("a: ".to_owned()),
        Just("kind: Job".to_owned()),
        Just("apiVersion: batch/v1".to_owned()),
        Just("containers:".to_owned()),
        Just("&x ".to_owned()),
        Just("*x".to_owned()),
        Just("<<: ".to_owned()),
        Just("!!str ".to_owned()),
        Just("[".to_owned()),
        Just("]".to_owned()),
        Just("{".to_owned()),
        Just("}".to_owned()),
        Just(", ".to_owned()),
        Just("|".to_owned()),
        Just("\"q\\\"".to_owned()),
        Just("'s'".to_owned()),
        Just("0755".to_owned()),
        Just("yes".to_owned()),
        Just("~".to_owned()),
        Just("\t".to_owned()),
        Just("# c".to_owned()),
        Just("nvidia.com/gpu: 1".to_owned()),
        "[a-z]{1,6}".prop_map(|s| s),
    ];
    let line = (0usize..6, prop::collection::vec(token, 0..6))
        .prop_map(|(indent, tokens)| format!("{}{}", " ".repeat(indent * 2), tokens.concat()));
    prop_oneof![
        8 => line,
        1 => Just("---".to_owned()),
        1 => Just("...".to_owned()),
    ]
}

/// JSON trees of the shapes manifests have, with scalars a YAML 1.1 reader might misread.
fn json_tree() -> impl Strategy<Value = Value> {
    let scalar = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| Value::Number(n.into())),
        any::<u64>().prop_map(|n| Value::Number(n.into())),
        (-1.0e9f64..1.0e9).prop_map(|f| Number::from_f64(f).map_or(Value::Null, Value::Number)),
        prop_oneof![
            Just("yes".to_owned()),
            Just("0755".to_owned()),
            Just("1_000".to_owned()),
            Just("~".to_owned()),
            Just("".to_owned()),
            Just("- x".to_owned()),
            Just("a: b".to_owned()),
            Just("#x".to_owned()),
            Just("---".to_owned()),
            Just("line\nbreak".to_owned()),
            Just(" lead".to_owned()),
            Just("1e3".to_owned()),
            Just(".5".to_owned()),
            Just("0x1F".to_owned()),
            any::<String>(),
        ]
        .prop_map(Value::String),
    ];
    scalar.prop_recursive(6, 64, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec(("[a-zA-Z0-9./_-]{0,12}", inner), 0..6)
                .prop_map(|entries| Value::Object(entries.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

fn admission_fixtures() -> Vec<(Webhook, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/admission");
    let mut fixtures: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == "json"))
        .collect();
    fixtures.sort();
    fixtures
        .into_iter()
        .map(|path| {
            let webhook = if path.to_string_lossy().contains("validate") {
                Webhook::Validate
            } else {
                Webhook::Mutate
            };
            (webhook, std::fs::read(&path).unwrap())
        })
        .collect()
}

static FIXTURES: LazyLock<Vec<(Webhook, Vec<u8>)>> = LazyLock::new(admission_fixtures);

/// One change to a body: flip a byte, cut the body, insert bytes, or nest it deeper.
#[derive(Clone, Debug)]
enum Damage {
    Flip(prop::sample::Index, u8),
    Cut(prop::sample::Index),
    Insert(prop::sample::Index, Vec<u8>),
    Wrap(usize),
}

fn damage() -> impl Strategy<Value = Damage> {
    prop_oneof![
        (any::<prop::sample::Index>(), any::<u8>()).prop_map(|(at, byte)| Damage::Flip(at, byte)),
        any::<prop::sample::Index>().prop_map(Damage::Cut),
        (
            any::<prop::sample::Index>(),
            prop_oneof![
                Just(b"{".to_vec()),
                Just(b"[".to_vec()),
                Just(b"\"".to_vec()),
                Just(b"\\u0000".to_vec()),
                Just(b",null".to_vec()),
                Just(b"\xff\xfe".to_vec()),
                Just(b"9999999999999999999999".to_vec()),
            ]
        )
            .prop_map(|(at, bytes)| Damage::Insert(at, bytes)),
        (1usize..300).prop_map(Damage::Wrap),
    ]
}

fn apply(body: &[u8], damage: &Damage) -> Vec<u8> {
    let mut body = body.to_vec();
    match damage {
        // An earlier cut may have left nothing: an empty body is a case too.
        Damage::Flip(at, byte) => {
            if !body.is_empty() {
                let at = at.index(body.len());
                body[at] = *byte;
            }
        }
        Damage::Cut(at) => body.truncate(at.index(body.len() + 1)),
        Damage::Insert(at, bytes) => {
            let at = at.index(body.len() + 1);
            body.splice(at..at, bytes.iter().copied());
        }
        Damage::Wrap(levels) => {
            let mut wrapped = b"[".repeat(*levels);
            wrapped.extend(&body);
            wrapped.extend(b"]".repeat(*levels));
            body = wrapped;
        }
    }
    body
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: cases(),
        failure_persistence: Some(Box::new(
            proptest::test_runner::FileFailurePersistence::WithSource("proptest-regressions"),
        )),
        ..ProptestConfig::default()
    })]

    #[test]
    fn arbitrary_bytes_never_panic_the_manifest_reader(bytes in prop::collection::vec(any::<u8>(), 0..2048)) {
        let text = String::from_utf8_lossy(&bytes);
        let (documents, errors) = manifest::parse(&text, "fuzz.yaml");
        assert_errors_are_located(&text, &errors)?;
        process(&documents);
    }

    #[test]
    fn yaml_like_lines_never_panic_and_documents_stay_independent(
        lines in prop::collection::vec(yaml_line(), 0..40),
        good in json_tree(),
    ) {
        let text = lines.join("\n");
        let (documents, errors) = manifest::parse(&text, "fuzz.yaml");
        assert_errors_are_located(&text, &errors)?;
        process(&documents);
        // Whatever comes before it, a well-formed document after a separator is read as is.
        let good = serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap", "data": good});
        let appended = format!("{text}\n---\n{}", manifest::to_yaml(&good));
        let (documents, _) = manifest::parse(&appended, "fuzz.yaml");
        prop_assert_eq!(documents.last().map(|d| &d.value), Some(&good));
    }

    #[test]
    fn any_tree_written_as_yaml_reads_back_the_same(tree in json_tree()) {
        let document = serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap", "data": tree});
        let text = manifest::to_yaml(&document);
        let (documents, errors) = manifest::parse(&text, "tree.yaml");
        prop_assert!(errors.is_empty(), "{:?}\n{}", errors, text);
        prop_assert_eq!(documents.len(), 1);
        prop_assert_eq!(&documents[0].value, &document, "{}", text);
    }

    #[test]
    fn damaged_admission_reviews_get_an_answer_or_an_error_never_a_panic(
        which in any::<prop::sample::Index>(),
        damages in prop::collection::vec(damage(), 1..4),
    ) {
        let (webhook, body) = &FIXTURES[which.index(FIXTURES.len())];
        let mut body = body.clone();
        for damage in &damages {
            body = apply(&body, damage);
        }
        let view = StaticView::default();
        let _ = admission::review(*webhook, &body, &POLICY, &view);
    }
}
