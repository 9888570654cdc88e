//! `gpu-guard certs`: a development CA and serving certificate for the webhook Service.

use std::path::PathBuf;

use clap::Args;

use super::{Report, failure};

#[derive(Debug, Args)]
pub struct CertsArgs {
    /// Directory to write ca.crt, tls.crt and tls.key into (created if missing).
    #[arg(long, value_name = "DIR")]
    pub out_dir: PathBuf,
    /// The namespace of the webhook Service.
    #[arg(long, default_value = "gpu-guard")]
    pub namespace: String,
    /// The name of the webhook Service.
    #[arg(long, default_value = "gpu-guard")]
    pub service_name: String,
    /// Replace existing files.
    #[arg(long)]
    pub force: bool,
}

pub(super) fn run(args: &CertsArgs) -> Report {
    let service = format!("{}.{}.svc", args.service_name, args.namespace);
    let names = vec![service.clone(), format!("{service}.cluster.local")];
    let pair = match gpu_guard_webhook::server::tls::generate_self_signed(&names) {
        Ok(pair) => pair,
        Err(error) => return failure(format!("cannot make the certificates: {error}\n")),
    };
    if let Err(error) = std::fs::create_dir_all(&args.out_dir) {
        return failure(format!(
            "{}: cannot create: {error}\n",
            args.out_dir.display()
        ));
    }
    let files = [
        ("ca.crt", &pair.ca_pem, 0o644),
        ("tls.crt", &pair.cert_pem, 0o644),
        ("tls.key", &pair.key_pem, 0o600),
    ];
    if !args.force
        && let Some((name, _, _)) = files
            .iter()
            .find(|(name, _, _)| args.out_dir.join(name).exists())
    {
        return failure(format!(
            "{}: exists; pass --force to replace the certificates\n",
            args.out_dir.join(name).display()
        ));
    }
    let mut written = String::new();
    for (name, pem, mode) in files {
        let path = args.out_dir.join(name);
        if let Err(error) = write_private(&path, pem.as_bytes(), mode) {
            return failure(format!("{}: cannot write: {error}\n", path.display()));
        }
        written.push_str(&format!("wrote {}\n", path.display()));
    }
    written.push_str(&format!(
        "serving certificate for {service}, {service}.cluster.local, localhost and 127.0.0.1, \
         signed by ca.crt; for development only\n"
    ));
    Report {
        stderr: written,
        ..Report::default()
    }
}

/// Writes a file with `mode` (a key must never be readable by others, not even for a moment).
fn write_private(path: &std::path::Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    use std::io::Write as _;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
        options.mode(mode);
        let mut file = options.open(path)?;
        file.set_permissions(std::fs::Permissions::from_mode(mode))?;
        file.write_all(bytes)
    }
    #[cfg(not(unix))]
    {
        let _ = mode;
        options.open(path)?.write_all(bytes)
    }
}
