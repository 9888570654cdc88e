//! The CLI reference (`docs/reference/cli.md`), generated from the clap definitions so that it
//! cannot drift from the binary: `tests/it/reference_docs.rs` fails when the checked-in file is
//! stale (`GPU_GUARD_BLESS=1 cargo test --test it reference_docs` rewrites it).

use std::fmt::Write as _;

use clap::{Arg, ArgAction, Command, CommandFactory};

use super::Cli;
use gpu_guard_core::policy::reference::cell;

/// The whole reference, one section per command and subcommand.
pub fn markdown() -> String {
    let mut out = String::from(
        "# CLI reference\n\n<!-- Generated from the clap definitions in src/cli/ by \
         tests/it/reference_docs.rs; do not edit. -->\n\n",
    );
    let mut root = Cli::command();
    root.build();
    section(&mut out, &root, "gpu-guard");
    out
}

fn section(out: &mut String, command: &Command, path: &str) {
    let level = if path == "gpu-guard" { "##" } else { "###" };
    let _ = writeln!(out, "{level} `{path}`\n");
    if let Some(about) = command.get_long_about().or(command.get_about()) {
        let _ = writeln!(out, "{}\n", about.to_string().trim_end());
    }
    let args: Vec<&Arg> = command
        .get_arguments()
        .filter(|arg| !arg.is_hide_set() && !matches!(arg.get_id().as_str(), "help" | "version"))
        .collect();
    if !args.is_empty() {
        out.push_str("| flag | environment | default | description |\n|---|---|---|---|\n");
        for arg in args {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} |",
                flag(arg),
                arg.get_env()
                    .map(|env| format!("`{}`", env.to_string_lossy()))
                    .unwrap_or_default(),
                defaults(arg),
                cell(&description(arg)),
            );
        }
        out.push('\n');
    }
    for sub in command
        .get_subcommands()
        .filter(|sub| sub.get_name() != "help")
    {
        section(out, sub, &format!("{path} {}", sub.get_name()));
    }
}

fn flag(arg: &Arg) -> String {
    let value = arg
        .get_value_names()
        .and_then(|names| names.first())
        .map(|name| format!(" <{name}>"))
        .unwrap_or_default();
    let takes_value = !matches!(
        arg.get_action(),
        ArgAction::SetTrue | ArgAction::SetFalse | ArgAction::Count
    );
    let value = if takes_value { value } else { String::new() };
    match (arg.get_short(), arg.get_long()) {
        (Some(short), Some(long)) => format!("`-{short}`, `--{long}{value}`"),
        (None, Some(long)) => format!("`--{long}{value}`"),
        (Some(short), None) => format!("`-{short}{value}`"),
        (None, None) => format!("`{value}`").replace("` <", "`<"),
    }
}

fn defaults(arg: &Arg) -> String {
    arg.get_default_values()
        .iter()
        .map(|value| format!("`{}`", value.to_string_lossy()))
        .collect::<Vec<_>>()
        .join(", ")
}

fn description(arg: &Arg) -> String {
    let mut text = arg
        .get_long_help()
        .or(arg.get_help())
        .map(|help| help.to_string())
        .unwrap_or_default();
    let values: Vec<String> = arg
        .get_possible_values()
        .iter()
        .filter(|value| !value.is_hide_set())
        .map(|value| match value.get_help() {
            Some(help) => format!("`{}` ({help})", value.get_name()),
            None => format!("`{}`", value.get_name()),
        })
        .collect();
    let is_flag = matches!(arg.get_action(), ArgAction::SetTrue | ArgAction::SetFalse);
    if !values.is_empty() && !is_flag {
        let _ = write!(text, " One of: {}.", values.join(", "));
    }
    if arg.is_required_set() {
        text.push_str(" Required.");
    }
    if matches!(arg.get_action(), ArgAction::Append) {
        text.push_str(" Repeatable.");
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_command_and_flag_is_in_the_reference() {
        let reference = markdown();
        for heading in [
            "## `gpu-guard`",
            "### `gpu-guard serve`",
            "### `gpu-guard controller`",
            "### `gpu-guard generate webhook-config`",
            "### `gpu-guard policy check`",
        ] {
            assert!(reference.contains(heading), "missing {heading}");
        }
        assert!(reference.contains("| `--lease-duration-seconds <LEASE_DURATION_SECONDS>` | `GPU_GUARD_LEASE_DURATION_SECONDS` | `15` |"));
        assert!(reference.contains("`-o`, `--output <OUTPUT>`"));
        assert!(
            !reference.contains("`--help`"),
            "clap's own flags are left out"
        );
    }
}
