//! What the webhook server and the controller share as running processes: logging, signals and
//! the admin port ([`process`]); the Kubernetes client, the reflector helper and the webhook's
//! caches ([`cluster`]).

pub mod cluster;
pub mod process;
