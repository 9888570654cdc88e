//! `gpu-guard controller`: the flags of the node health controller, resolved into
//! [`ControllerSettings`](gpu_guard_controller::run::ControllerSettings).

use std::time::Duration;

use clap::Args;

use super::{KubeconfigArgs, LogArgs, Report, finished};
use gpu_guard_controller::run::{self, ControllerSettings, LeaseSettings};
use gpu_guard_core::policy::Policy;

#[derive(Debug, Args)]
pub struct ControllerArgs {
    #[command(flatten)]
    pub kube: KubeconfigArgs,
    /// Change nothing: taints, pod conditions and evictions are sent with dryRun=All (checked,
    /// not stored); log, count and emit Events. Overrides the policy's controller.dryRun when
    /// set.
    #[arg(long, env = "GPU_GUARD_DRY_RUN")]
    pub dry_run: bool,
    /// Address of the plain-HTTP admin listener (/healthz, /readyz, /metrics).
    #[arg(long, env = "GPU_GUARD_ADMIN_LISTEN", default_value_t = std::net::SocketAddr::from(([0, 0, 0, 0], gpu_guard_core::wellknown::CONTROLLER_ADMIN_PORT)))]
    pub admin_listen: std::net::SocketAddr,
    /// Namespace of the leader-election Lease.
    #[arg(long, env = "POD_NAMESPACE", default_value = "gpu-guard")]
    pub lease_namespace: String,
    /// Name of the leader-election Lease.
    #[arg(long, env = "GPU_GUARD_LEASE_NAME", default_value = gpu_guard_core::wellknown::LEASE_NAME)]
    pub lease_name: String,
    /// Seconds a Lease lasts without renewal (renewed every 2 s, or a fifth of two thirds of it
    /// when shorter than 15 s), 3 to 3600.
    #[arg(long, env = "GPU_GUARD_LEASE_DURATION_SECONDS", default_value_t = 15,
          value_parser = clap::value_parser!(u64).range(3..=3600))]
    pub lease_duration_seconds: u64,
    /// This replica's identity in the Lease and in Events (default: the host name).
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
    /// Act without leader election (one replica only, or local testing).
    #[arg(long)]
    pub no_leader_election: bool,
    #[command(flatten)]
    pub log: LogArgs,
}

/// Runs the controller until a signal stops it.
pub(super) fn run(args: &ControllerArgs, policy: Policy) -> Report {
    let _log = args.log.init();
    let settings = ControllerSettings {
        kubeconfig: args.kube.kubeconfig.clone(),
        admin_listen: args.admin_listen,
        identity: args.identity.clone(),
        lease: (!args.no_leader_election).then(|| LeaseSettings {
            namespace: args.lease_namespace.clone(),
            name: args.lease_name.clone(),
            duration: Duration::from_secs(args.lease_duration_seconds),
        }),
    };
    finished(run::run(&settings, effective_policy(args, policy)))
}

/// The policy with the command line's overrides: `--dry-run` turns dry run on (it never turns
/// a policy's `dryRun: true` off).
fn effective_policy(args: &ControllerArgs, mut policy: Policy) -> Policy {
    if args.dry_run {
        policy.controller.dry_run = true;
    }
    policy
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cli, Command};
    use crate::install::controller_container_args;
    use clap::Parser;
    use gpu_guard_core::wellknown::{CONTROLLER_ADMIN_PORT, LEASE_NAME};

    fn args(flags: &[&str]) -> ControllerArgs {
        let cli =
            Cli::try_parse_from(["gpu-guard", "controller"].iter().chain(flags)).expect("parses");
        match cli.command {
            Command::Controller(args) => args,
            _ => panic!("not the controller command"),
        }
    }

    #[test]
    fn dry_run_flag_overrides_the_policy() {
        let mut policy = Policy::default();
        assert!(
            !effective_policy(&args(&[]), policy.clone())
                .controller
                .dry_run
        );
        assert!(
            effective_policy(&args(&["--dry-run"]), policy.clone())
                .controller
                .dry_run
        );
        policy.controller.dry_run = true;
        assert!(effective_policy(&args(&[]), policy).controller.dry_run);
    }

    #[test]
    fn defaults() {
        let args = args(&["--identity", "replica-a"]);
        assert_eq!(args.admin_listen.to_string(), "0.0.0.0:8081");
        assert_eq!(args.lease_name, "gpu-guard-controller");
        assert_eq!(args.lease_duration_seconds, 15);
        assert_eq!(args.identity.as_deref(), Some("replica-a"));
        assert!(!args.no_leader_election);
    }

    #[test]
    fn a_lease_duration_out_of_range_is_refused() {
        for duration in ["2", "3601"] {
            let error = Cli::try_parse_from([
                "gpu-guard",
                "controller",
                "--lease-duration-seconds",
                duration,
            ])
            .expect_err("out of range");
            assert!(error.to_string().contains("3..=3600"), "{error}");
        }
    }

    #[test]
    fn the_deployment_args_parse() {
        let args = std::iter::once("gpu-guard".to_owned()).chain(controller_container_args());
        let cli = Cli::try_parse_from(args).expect("the container args parse");
        let Command::Controller(args) = cli.command else {
            panic!("not the controller command");
        };
        assert_eq!(args.admin_listen.port(), CONTROLLER_ADMIN_PORT);
        assert_eq!(args.lease_name, LEASE_NAME);
        assert!(!args.dry_run);
    }
}
