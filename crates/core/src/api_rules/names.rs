//! Kubernetes name syntax (apimachinery `validation.IsQualifiedName` and friends), shared by the
//! policy file's validation and the API-rules checker.

/// Checks a qualified name (`[prefix/]name`, as used for condition types, label keys and
/// extended resource names). Returns the reasons it is not one, empty when it is.
pub fn qualified_name_errors(value: &str) -> Vec<String> {
    let mut errors = Vec::new();
    let (prefix, name) = match value.split_once('/') {
        None => (None, value),
        Some((prefix, name)) if !name.contains('/') => (Some(prefix), name),
        Some(_) => {
            errors.push(
                "a qualified name must consist of alphanumeric characters, '-', '_' or '.', \
                 with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
                    .to_owned(),
            );
            return errors;
        }
    };
    if let Some(prefix) = prefix {
        if prefix.is_empty() {
            errors.push("prefix part must be non-empty".to_owned());
        } else {
            errors.extend(
                dns_subdomain_errors(prefix)
                    .into_iter()
                    .map(|e| format!("prefix part {e}")),
            );
        }
    }
    if name.is_empty() {
        errors.push("name part must be non-empty".to_owned());
    } else if name.len() > 63 {
        errors.push("name part must be no more than 63 characters".to_owned());
    } else if !is_qualified_name_part(name) {
        errors.push(
            "name part must consist of alphanumeric characters, '-', '_' or '.', and must start \
             and end with an alphanumeric character (e.g. 'MyName', 'my.name' or '123-abc')"
                .to_owned(),
        );
    }
    errors
}

fn is_qualified_name_part(name: &str) -> bool {
    let bytes = name.as_bytes();
    let alnum = |b: &u8| b.is_ascii_alphanumeric();
    bytes.first().is_some_and(alnum)
        && bytes.last().is_some_and(alnum)
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// Checks a DNS-1123 subdomain (lower case, dots between labels, at most 253 characters).
pub fn dns_subdomain_errors(value: &str) -> Vec<String> {
    let mut errors = Vec::new();
    if value.len() > 253 {
        errors.push("must be no more than 253 characters".to_owned());
    }
    let valid_label = |label: &str| {
        let bytes = label.as_bytes();
        let edge = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
        bytes.first().is_some_and(edge)
            && bytes.last().is_some_and(edge)
            && bytes
                .iter()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
    };
    if !value.split('.').all(valid_label) {
        errors.push(
            "must be a lowercase RFC 1123 subdomain: lower case alphanumeric characters, '-' or \
             '.', starting and ending with an alphanumeric character (e.g. 'example.com')"
                .to_owned(),
        );
    }
    errors
}

/// Checks a DNS-1123 label (a namespace name): lower case alphanumerics and '-', at most 63.
pub fn dns_label_errors(value: &str) -> Vec<String> {
    if value.len() > 63 || value.contains('.') || !dns_subdomain_errors(value).is_empty() {
        vec![
            "must be a lowercase RFC 1123 label: at most 63 lower case alphanumeric characters \
             or '-', starting and ending with an alphanumeric character (e.g. 'my-name')"
                .to_owned(),
        ]
    } else {
        Vec::new()
    }
}

/// Checks a DNS-1035 label (apimachinery `IsDNS1035Label`: a Service name, a JobSet's child
/// Job names): at most 63 lower case alphanumerics or '-', starting with a letter and ending
/// with an alphanumeric character. The length and the form are reported apart, as
/// apimachinery does, so a caller can tell them apart.
pub fn dns1035_label_errors(value: &str) -> Vec<String> {
    let mut errors = Vec::new();
    if value.len() > 63 {
        errors.push(DNS1035_TOO_LONG.to_owned());
    }
    let bytes = value.as_bytes();
    let valid = bytes.first().is_some_and(u8::is_ascii_lowercase)
        && bytes
            .last()
            .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-');
    if !valid {
        errors.push(
            "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start \
             with an alphabetic character, and end with an alphanumeric character (e.g. \
             'my-name' or 'abc-123')"
                .to_owned(),
        );
    }
    errors
}

/// [`dns1035_label_errors`]'s message for a label over 63 characters (apimachinery's).
pub const DNS1035_TOO_LONG: &str = "must be no more than 63 characters";

/// Checks a label value: empty, or at most 63 alphanumerics, '-', '_' or '.', starting and
/// ending with an alphanumeric character.
pub fn label_value_errors(value: &str) -> Vec<String> {
    if value.is_empty() || (value.len() <= 63 && is_qualified_name_part(value)) {
        Vec::new()
    } else {
        vec![
            "a label value must be at most 63 alphanumeric characters, '-', '_' or '.', \
             starting and ending with an alphanumeric character (e.g. 'true', 'A100')"
                .to_owned(),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns1035_labels() {
        for good in ["a", "worker", "leader-0", "a1-b2"] {
            assert!(dns1035_label_errors(good).is_empty(), "{good}");
        }
        for bad in ["", "0worker", "Worker", "work_er", "worker-", "a.b"] {
            assert_eq!(dns1035_label_errors(bad).len(), 1, "{bad}");
        }
        assert!(dns1035_label_errors(&"a".repeat(63)).is_empty());
        assert_eq!(
            dns1035_label_errors(&"a".repeat(64)),
            [DNS1035_TOO_LONG.to_owned()]
        );
    }

    #[test]
    fn qualified_names() {
        for good in [
            "DisruptionTarget",
            "gpu-guard.io/DeviceFailure",
            "nvidia.com/gpu",
            "nvidia.com/mig-1g.5gb",
            "a",
        ] {
            assert!(
                qualified_name_errors(good).is_empty(),
                "{good} should be valid"
            );
        }
        for bad in [
            "",
            "/x",
            "Example.com/x",
            "a/b/c",
            "-x",
            "x-",
            "example.com/",
            "has space",
        ] {
            assert!(
                !qualified_name_errors(bad).is_empty(),
                "{bad:?} should be invalid"
            );
        }
        assert!(!qualified_name_errors(&"x".repeat(64)).is_empty());
    }

    #[test]
    fn labels_and_label_values() {
        assert!(dns_label_errors("team-a").is_empty());
        for bad in ["", "Team", "a.b", "-a", &"a".repeat(64)] {
            assert!(!dns_label_errors(bad).is_empty(), "{bad:?}");
        }
        for good in ["", "true", "A100", "p4d.24xlarge", "NVIDIA-A100-SXM4-80GB"] {
            assert!(label_value_errors(good).is_empty(), "{good:?}");
        }
        for bad in ["has space", "-x", "x.", &"a".repeat(64)] {
            assert!(!label_value_errors(bad).is_empty(), "{bad:?}");
        }
    }
}
