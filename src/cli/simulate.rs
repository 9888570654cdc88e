//! `gpu-guard simulate`: what each Job, CronJob, JobSet and Trainer runtime of the input does
//! when one of its pods fails as the flags describe, by the Job and JobSet controllers' rules
//! ([`gpu_guard_core::simulate`]).

use std::io::Write;

use clap::{Args, ValueEnum};
use serde_json::Value;

use super::inputs::{InputArgs, Inputs};
use super::{Log, exit};
use gpu_guard_core::devices::NoDraFacts;
use gpu_guard_core::mutate::object::mutate_object;
use gpu_guard_core::mutate::patch;
use gpu_guard_core::policy::Policy;
use gpu_guard_core::simulate::object::{Failure, Simulation, simulate};
use gpu_guard_manifest as manifest;

#[derive(Debug, Args)]
pub struct SimulateArgs {
    #[command(flatten)]
    pub input: InputArgs,
    /// A container (or init container) of the failing pod that terminated; give its exit code
    /// with --exit-code. Repeat the pair for several containers.
    #[arg(long = "container", value_name = "NAME")]
    pub containers: Vec<String>,
    /// The exit code of the --container at the same position.
    #[arg(long = "exit-code", value_name = "N", allow_negative_numbers = true)]
    pub exit_codes: Vec<i32>,
    /// A condition of the failing pod with status True (DisruptionTarget,
    /// gpu-guard.io/DeviceFailure, ...). Repeat for several.
    #[arg(long = "condition", value_name = "TYPE")]
    pub conditions: Vec<String>,
    /// For a JobSet or a Trainer runtime: the replicated Job whose pod fails (default: the
    /// first).
    #[arg(long, value_name = "NAME")]
    pub replicated_job: Option<String>,
    /// For an Indexed Job: the completion index of the failing pod (default 0).
    #[arg(long, value_name = "I")]
    pub index: Option<i32>,
    /// Pod failures the Job has already counted (with backoffLimitPerIndex: of this index).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub failed_so_far: i32,
    /// JobSet restarts already done that count against maxRestarts.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub restarts_so_far: i32,
    /// Take JobSet's RestartJob feature gate as enabled (alpha and off by default in JobSet
    /// v0.12.0): the RestartJob actions then recreate the failed child Job alone.
    #[arg(long)]
    pub jobset_restart_job_gate: bool,
    /// Simulate each object as gpu-guard would admit it (the mutation applied first); by
    /// default, as written.
    #[arg(long)]
    pub as_mutated: bool,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value = "text")]
    pub output: SimulateFormat,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum SimulateFormat {
    /// A short story per workload, a line a step.
    Text,
    /// A JSON list, one object per workload.
    Json,
}

pub(super) fn run(args: &SimulateArgs, policy: &Policy, out: &mut dyn Write, log: &mut Log) -> i32 {
    if args.containers.len() != args.exit_codes.len() {
        log.error(&format!(
            "--container and --exit-code go in pairs: {} --container and {} --exit-code given",
            args.containers.len(),
            args.exit_codes.len()
        ));
        return exit::INPUT;
    }
    let failure = Failure {
        exits: args
            .containers
            .iter()
            .cloned()
            .zip(args.exit_codes.iter().copied())
            .collect(),
        conditions: args.conditions.clone(),
        replicated_job: args.replicated_job.clone(),
        index: args.index,
        failed_so_far: args.failed_so_far,
        restarts_so_far: args.restarts_so_far,
        restart_job_gate: args.jobset_restart_job_gate,
    };
    let (inputs, errors) = Inputs::open(&args.input);
    for error in errors {
        log.error(&error.to_string());
    }
    let mut simulations = Vec::new();
    for documents in inputs.each() {
        let documents = match documents {
            Ok(documents) => documents,
            Err(error) => {
                log.error(&error.to_string());
                continue;
            }
        };
        for item in documents {
            let mut document = match item {
                Ok(document) => document,
                Err(unreadable) => {
                    log.error(&unreadable.error.to_string());
                    continue;
                }
            };
            let mut value = std::mem::take(&mut document.value);
            manifest::visit_objects_mut(&mut value, &mut |item, object| {
                let location = manifest::location(&document, item);
                let object = if args.as_mutated {
                    admitted(object, policy)
                } else {
                    object.clone()
                };
                match simulate(&object, &failure) {
                    None => {}
                    Some(Ok(simulation)) => simulations.push(simulation),
                    Some(Err(error)) => log.error(&format!("{location}: {error}")),
                }
            });
        }
    }
    if simulations.is_empty() && log.errors == 0 {
        log.error("no Job, CronJob, JobSet or Trainer runtime in the input");
    }
    let written = match args.output {
        SimulateFormat::Text => simulations
            .iter()
            .try_for_each(|simulation| write_story(out, simulation)),
        SimulateFormat::Json => {
            let mut text =
                serde_json::to_string_pretty(&simulations).expect("simulations serialize");
            text.push('\n');
            out.write_all(text.as_bytes())
        }
    };
    if let Err(error) = written
        && error.kind() != std::io::ErrorKind::BrokenPipe
    {
        log.error(&format!("cannot write the output: {error}"));
    }
    if log.errors > 0 {
        exit::INPUT
    } else {
        exit::OK
    }
}

/// The object as the webhook would admit it (DRA claims unresolved: only the extended
/// resources and the DeviceClasses the policy names make a device workload here).
fn admitted(object: &Value, policy: &Policy) -> Value {
    match mutate_object(object, policy, &NoDraFacts) {
        Some(Ok(mutation)) => {
            patch::apply(object, &mutation.patch).unwrap_or_else(|_| object.clone())
        }
        _ => object.clone(),
    }
}

fn write_story(out: &mut dyn Write, simulation: &Simulation) -> std::io::Result<()> {
    let name = match &simulation.namespace {
        Some(namespace) => format!("{namespace}/{}", simulation.name),
        None => simulation.name.clone(),
    };
    writeln!(out, "{} {name}:", simulation.kind)?;
    for line in &simulation.story {
        writeln!(out, "  {line}")?;
    }
    Ok(())
}
