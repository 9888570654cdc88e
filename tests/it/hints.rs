//! Every flag a message names is a flag of the command that prints it.
//!
//! Each string literal of the crate's non-test code that names a `--flag` is found, and the flag
//! must be an argument of every command that can print that literal, by the clap definition
//! (`Cli::command()`). Which commands can print a file's text is the table below, by where the
//! file is: the modules each command runs. A shared module whose texts are worded per command
//! (the guard's explanation of an unjudged workload) says which flag belongs to which command in
//! `PER_COMMAND`; `tests/cli.rs` and the admission tests check that each command prints its own.
//! A literal that names the command itself (`gpu-guard generate webhook-config --out-dir ...`)
//! is checked against that command. A `kubectl ...` span in backquotes is another program's.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use clap::CommandFactory;
use gpu_guard::cli::Cli;

use crate::source;
use source::{is_test_file, non_test_code, rust_files, sources};

/// The commands that run each part of the crate, longest prefix first wins.
const PRINTED_BY: &[(&str, &[&str])] = &[
    ("src/main.rs", ALL),
    ("crates/core/src/", ALL),
    ("crates/core/src/api_rules/", ENGINE),
    ("crates/core/src/mutate/", ENGINE),
    ("crates/core/src/guard/", &["serve", "check"]),
    ("crates/core/src/health/", &["controller"]),
    ("crates/core/src/simulate/", &["simulate"]),
    ("crates/manifest/src/", &["mutate", "check"]),
    // Every command that makes a Kubernetes client.
    (
        "crates/runtime/src/cluster/",
        &["serve", "controller", "check"],
    ),
    ("crates/runtime/src/process.rs", &["serve", "controller"]),
    ("crates/webhook/src/", &["serve"]),
    ("crates/controller/src/", &["controller"]),
    ("src/install/", &["generate webhook-config"]),
    ("src/cli/mod.rs", ALL),
    ("src/cli/serve.rs", &["serve"]),
    ("src/cli/controller.rs", &["controller"]),
    ("src/cli/mutate.rs", &["mutate"]),
    ("src/cli/simulate.rs", &["simulate"]),
    ("src/cli/check/", &["check"]),
    (
        "src/cli/generate.rs",
        &["generate failure-policy", "generate webhook-config"],
    ),
    ("src/cli/certs.rs", &["certs"]),
    ("src/cli/reference.rs", &[]),
];

const ALL: &[&str] = &[
    "serve",
    "controller",
    "mutate",
    "check",
    "simulate",
    "generate failure-policy",
    "generate webhook-config",
    "policy check",
    "policy show",
    "policy schema",
    "certs",
];

/// What runs the mutation engine (and the API rules it checks its result with).
const ENGINE: &[&str] = &["serve", "mutate", "check", "generate failure-policy"];

/// Flags of a shared file's texts that only some of its commands print: (file, flag, commands).
const PER_COMMAND: &[(&str, &str, &[&str])] = &[
    // The arguments `-o json` is recognised by in a refused command line: mutate and check.
    ("src/cli/mod.rs", "output", &["mutate", "check"]),
    // `Unjudged::message` (check) and `Unjudged::webhook_message` (serve).
    (
        "crates/core/src/guard/messages.rs",
        "priority-class",
        &["check"],
    ),
    (
        "crates/core/src/guard/messages.rs",
        "kubeconfig",
        &["check"],
    ),
    (
        "crates/core/src/guard/messages.rs",
        "no-cluster",
        &["serve"],
    ),
    // The note printed without --container, by failure-policy only.
    (
        "src/cli/generate.rs",
        "container",
        &["generate failure-policy"],
    ),
    // The container args of the generated Deployments, for `serve` and `controller` (which
    // tests/install.rs also parses).
    ("src/install/server.rs", "listen", &["serve"]),
    ("src/install/server.rs", "admin-listen", &["serve"]),
    ("src/install/server.rs", "tls-cert-file", &["serve"]),
    ("src/install/server.rs", "tls-key-file", &["serve"]),
    ("src/install/server.rs", "log-format", &["serve"]),
    ("src/install/server.rs", "drain-delay-seconds", &["serve"]),
    ("src/install/controller.rs", "admin-listen", &["controller"]),
    ("src/install/controller.rs", "log-format", &["controller"]),
];

/// Programs other than gpu-guard whose command lines a message may quote.
const OTHER_PROGRAMS: &[&str] = &["kubectl", "helm", "cargo", "curl", "openssl"];

fn crate_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The string literals of Rust code, with their line, comments and char literals skipped.
/// A `\` line continuation joins the lines as Rust does.
fn string_literals(code: &str) -> Vec<(usize, String)> {
    let chars: Vec<char> = code.chars().collect();
    let mut found = Vec::new();
    let mut at = 0;
    let mut line = 1;
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    while at < chars.len() {
        let c = chars[at];
        let next = chars.get(at + 1).copied();
        match c {
            '\n' => {
                line += 1;
                at += 1;
            }
            '/' if next == Some('/') => {
                while at < chars.len() && chars[at] != '\n' {
                    at += 1;
                }
            }
            '/' if next == Some('*') => {
                at += 2;
                while at + 1 < chars.len() && !(chars[at] == '*' && chars[at + 1] == '/') {
                    line += usize::from(chars[at] == '\n');
                    at += 1;
                }
                at += 2;
            }
            // r"..", r#".."#, br"..".
            'r' if (at == 0
                || !ident(chars[at - 1])
                || (chars[at - 1] == 'b' && (at == 1 || !ident(chars[at - 2]))))
                && matches!(next, Some('"' | '#'))
                && chars[at + 1..]
                    .iter()
                    .find(|c| **c != '#')
                    .is_some_and(|c| *c == '"') =>
            {
                let hashes = chars[at + 1..].iter().take_while(|c| **c == '#').count();
                let start_line = line;
                at += 2 + hashes;
                let mut text = String::new();
                loop {
                    let closing = chars[at] == '"'
                        && chars[at + 1..].iter().take(hashes).all(|c| *c == '#')
                        && chars.len() > at + hashes;
                    if closing {
                        at += 1 + hashes;
                        break;
                    }
                    line += usize::from(chars[at] == '\n');
                    text.push(chars[at]);
                    at += 1;
                }
                found.push((start_line, text));
            }
            '"' => {
                let start_line = line;
                at += 1;
                let mut text = String::new();
                while chars[at] != '"' {
                    if chars[at] == '\\' {
                        at += 1;
                        match chars[at] {
                            '\n' => {
                                line += 1;
                                at += 1;
                                while chars[at].is_whitespace() {
                                    line += usize::from(chars[at] == '\n');
                                    at += 1;
                                }
                                continue;
                            }
                            'n' => text.push('\n'),
                            't' => text.push('\t'),
                            other => text.push(other),
                        }
                        at += 1;
                        continue;
                    }
                    line += usize::from(chars[at] == '\n');
                    text.push(chars[at]);
                    at += 1;
                }
                at += 1;
                found.push((start_line, text));
            }
            // A char literal ('"', '\'', 'x'); a lifetime ('a) is left as it is.
            '\'' if next == Some('\\') => {
                at += 2;
                while chars[at] != '\'' {
                    at += 1;
                }
                at += 1;
            }
            '\'' if chars.get(at + 2) == Some(&'\'') => at += 3,
            _ => at += 1,
        }
    }
    found
}

/// The flags a text names (`--kubeconfig`, `--priority-class`), outside quoted command lines
/// of other programs.
fn flags_named(text: &str) -> Vec<String> {
    let mut own = String::new();
    for (index, span) in text.split('`').enumerate() {
        let quoted = index % 2 == 1;
        let other_program = span
            .split_whitespace()
            .next()
            .is_some_and(|program| OTHER_PROGRAMS.contains(&program));
        if !(quoted && other_program) {
            own.push_str(span);
            own.push(' ');
        }
    }
    let bytes = own.as_bytes();
    let mut flags = Vec::new();
    for (at, _) in own.match_indices("--") {
        let before = at.checked_sub(1).map(|i| bytes[i]);
        if before.is_some_and(|b| b.is_ascii_alphanumeric() || b == b'-') {
            continue;
        }
        let name: String = own[at + 2..]
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-')
            .collect();
        let name = name.trim_end_matches('-');
        if name.starts_with(|c: char| c.is_ascii_lowercase()) {
            flags.push(name.to_owned());
        }
    }
    flags
}

/// The long flags of each command (`"generate failure-policy"`), with the global ones and
/// clap's own `--help` and `--version`.
fn flags_by_command() -> BTreeMap<String, BTreeSet<String>> {
    let root = Cli::command();
    let global: BTreeSet<String> = root
        .get_arguments()
        .filter(|arg| arg.is_global_set())
        .filter_map(|arg| arg.get_long().map(str::to_owned))
        .chain(["help".to_owned(), "version".to_owned()])
        .collect();
    let mut flags = BTreeMap::new();
    let mut pending: Vec<(String, &clap::Command)> = root
        .get_subcommands()
        .map(|command| (command.get_name().to_owned(), command))
        .collect();
    while let Some((name, command)) = pending.pop() {
        let own: BTreeSet<String> = command
            .get_arguments()
            .filter_map(|arg| arg.get_long().map(str::to_owned))
            .chain(global.iter().cloned())
            .collect();
        flags.insert(name.clone(), own);
        for sub in command.get_subcommands() {
            pending.push((format!("{name} {}", sub.get_name()), sub));
        }
    }
    flags
}

/// The command a text names itself (`gpu-guard generate webhook-config --out-dir ...`).
fn command_in(text: &str, commands: &BTreeMap<String, BTreeSet<String>>) -> Option<String> {
    let (_, rest) = text.split_once("gpu-guard ")?;
    let mut command: Option<String> = None;
    for word in rest.split_whitespace() {
        let longer = match &command {
            None => word.to_owned(),
            Some(command) => format!("{command} {word}"),
        };
        if commands.contains_key(&longer) {
            command = Some(longer);
        } else {
            break;
        }
    }
    command
}

fn printed_by(file: &str) -> Option<&'static [&'static str]> {
    PRINTED_BY
        .iter()
        .filter(|(prefix, _)| file.starts_with(prefix))
        .max_by_key(|(prefix, _)| prefix.len())
        .map(|(_, commands)| *commands)
}

#[test]
fn every_flag_a_message_names_is_a_flag_of_the_command_that_prints_it() {
    let commands = flags_by_command();
    for command in ALL {
        assert!(commands.contains_key(*command), "no command {command:?}");
    }
    let mut wrong = Vec::new();
    let mut per_command_seen = BTreeSet::new();
    let mut checked = 0;
    for path in sources().iter().flat_map(|dir| rust_files(dir)) {
        let file = path
            .strip_prefix(crate_dir())
            .unwrap()
            .to_string_lossy()
            .into_owned();
        if is_test_file(&path) {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        for (line, literal) in string_literals(non_test_code(&text)) {
            let flags = flags_named(&literal);
            if flags.is_empty() {
                continue;
            }
            let named = command_in(&literal, &commands);
            for flag in flags {
                checked += 1;
                let printers: Vec<String> = match &named {
                    Some(command) => vec![command.clone()],
                    None => {
                        let own = PER_COMMAND
                            .iter()
                            .find(|(f, name, _)| *f == file && *name == flag);
                        if let Some((f, name, _)) = own {
                            per_command_seen.insert((*f, *name));
                        }
                        match own.map(|(_, _, commands)| *commands).or(printed_by(&file)) {
                            Some(commands) => commands.iter().map(|c| (*c).to_owned()).collect(),
                            None => {
                                wrong.push(format!(
                                    "{file}:{line}: --{flag}: which commands print this file's \
                                     texts? add it to PRINTED_BY"
                                ));
                                continue;
                            }
                        }
                    }
                };
                for command in printers {
                    if !commands[&command].contains(&flag) {
                        wrong.push(format!(
                            "{file}:{line}: --{flag} is not a flag of `gpu-guard {command}`: \
                             {literal:?}"
                        ));
                    }
                }
            }
        }
    }
    for (file, flag, _) in PER_COMMAND {
        assert!(
            per_command_seen.contains(&(*file, *flag)),
            "PER_COMMAND names --{flag} in {file}, which no longer says it"
        );
    }
    assert!(
        checked > 10,
        "only {checked} flags found: is the scan broken?"
    );
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn the_scan_reads_literals_as_rust_does() {
    let code = r###"
        // "--in-a-comment"
        let a = '"'; let b = '\''; fn f<'a>(x: &'a str) {}
        let c = "pass --kubeconfig \
                 or --no-cluster";
        let d = r#"raw "--raw-flag""#;
        /* "--in-a-block" */
        let e = "(`kubectl --kubeconfig x config view`) or --other-flag, not a--b nor ---x";
        let f = br"\";
    "###;
    let literals = string_literals(code);
    let texts: Vec<&str> = literals.iter().map(|(_, text)| text.as_str()).collect();
    assert_eq!(
        texts,
        vec![
            "pass --kubeconfig or --no-cluster",
            "raw \"--raw-flag\"",
            "(`kubectl --kubeconfig x config view`) or --other-flag, not a--b nor ---x",
            "\\",
        ]
    );
    assert_eq!(literals[0].0, 4);
    assert_eq!(flags_named(texts[0]), vec!["kubeconfig", "no-cluster"]);
    assert_eq!(flags_named(texts[2]), vec!["other-flag"]);
}

#[test]
fn each_command_explains_an_unjudged_workload_with_its_own_flags() {
    use gpu_guard_core::devices::UnresolvedClaim;
    use gpu_guard_core::guard::Unjudged;

    let commands = flags_by_command();
    let class = Unjudged::PriorityClass("batch-low".to_owned());
    let claims = Unjudged::Claims(vec![UnresolvedClaim {
        claim: "gpus".to_owned(),
        object: "ResourceClaimTemplate ml/a100".to_owned(),
        missing: false,
    }]);
    let check = class.message();
    let serve = class.webhook_message();
    assert!(
        check.contains("--priority-class batch-low=VALUE"),
        "{check}"
    );
    assert!(serve.contains("guard.offline.priorityClasses"), "{serve}");
    for (command, text) in [
        ("check", check),
        ("check", claims.message()),
        ("serve", serve),
        ("serve", claims.webhook_message()),
    ] {
        let flags = flags_named(&text);
        assert!(!flags.is_empty(), "{command}: {text}");
        for flag in flags {
            assert!(
                commands[command].contains(&flag),
                "`gpu-guard {command}` has no --{flag}: {text}"
            );
        }
    }
}
