//! Serving certificates: PEM files re-read when they change, or a self-signed pair made in
//! memory.
//!
//! Files are polled (read and compared byte for byte every few seconds) rather than watched with
//! inotify: a Kubernetes Secret volume replaces them by swapping a `..data` symlink, which a
//! watch on the files misses, and cert-manager renews them in place. A new pair is used for new
//! connections only; open connections keep theirs. A pair that does not load (half written, key
//! and certificate that do not match) is refused, counted, and the last good pair stays.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

/// Why a certificate pair could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: a PEM section of the certificate chain does not parse: {message}")]
    Chain { path: String, message: String },
    #[error("{path}: no PEM certificate found")]
    NoCertificate { path: String },
    #[error("{path}: cannot parse the PEM private key: {message}")]
    Key { path: String, message: String },
    #[error("the private key does not belong to the certificate (or is unsupported): {0}")]
    Mismatch(rustls::Error),
    #[error("cannot generate a self-signed certificate: {0}")]
    Generate(#[from] rcgen::Error),
}

/// Builds a rustls key from PEM bytes: a full chain (leaf first) and its private key.
pub fn certified_key(
    cert_pem: &[u8],
    key_pem: &[u8],
    cert_path: &str,
    key_path: &str,
) -> Result<CertifiedKey, TlsError> {
    // Every section must parse: a chain cut off in the middle of an intermediate (a file
    // being rewritten) is refused, not served short.
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<_, _>>()
        .map_err(|error| TlsError::Chain {
            path: cert_path.to_owned(),
            message: error.to_string(),
        })?;
    if chain.is_empty() {
        return Err(TlsError::NoCertificate {
            path: cert_path.to_owned(),
        });
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|error| TlsError::Key {
        path: key_path.to_owned(),
        message: error.to_string(),
    })?;
    let provider = CryptoProvider::get_default()
        .cloned()
        .unwrap_or_else(|| Arc::new(rustls::crypto::ring::default_provider()));
    CertifiedKey::from_der(chain, key, &provider).map_err(TlsError::Mismatch)
}

/// The metrics a [`CertificateStore`] keeps up to date (registered by the server's metrics).
#[derive(Clone, Debug, Default)]
pub struct CertificateMetrics {
    pub reloads: Counter,
    pub reload_errors: Counter,
    /// notAfter of the leaf certificate in use, as Unix seconds.
    pub not_after: Gauge<f64, AtomicU64>,
}

/// The certificate the server presents, swappable while it runs.
#[derive(Debug)]
pub struct CertificateStore {
    current: RwLock<Arc<CertifiedKey>>,
    metrics: CertificateMetrics,
}

impl CertificateStore {
    pub fn new(key: CertifiedKey, metrics: CertificateMetrics) -> Arc<Self> {
        if let Some(not_after) = not_after(&key) {
            metrics.not_after.set(not_after);
        }
        Arc::new(Self {
            current: RwLock::new(Arc::new(key)),
            metrics,
        })
    }

    fn replace(&self, key: CertifiedKey) {
        if let Some(not_after) = not_after(&key) {
            self.metrics.not_after.set(not_after);
        }
        let mut current = self.current.write().unwrap_or_else(|p| p.into_inner());
        *current = Arc::new(key);
        self.metrics.reloads.inc();
    }

    fn refused(&self) {
        self.metrics.reload_errors.inc();
    }
}

/// The notAfter of the leaf certificate, as Unix seconds.
pub fn not_after(key: &CertifiedKey) -> Option<f64> {
    let leaf = key.cert.first()?;
    let (_, parsed) = x509_parser::parse_x509_certificate(leaf.as_ref()).ok()?;
    Some(parsed.validity().not_after.timestamp() as f64)
}

impl ResolvesServerCert for CertificateStore {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(
            self.current
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
        )
    }
}

/// Certificate and key files, polled for changes.
#[derive(Clone, Debug)]
pub struct CertificateFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// The bytes of a certificate file and a key file.
pub type PairBytes = (Vec<u8>, Vec<u8>);

impl CertificateFiles {
    fn read(&self) -> Result<PairBytes, TlsError> {
        let read = |path: &Path| {
            std::fs::read(path).map_err(|source| TlsError::Read {
                path: path.display().to_string(),
                source,
            })
        };
        Ok((read(&self.cert)?, read(&self.key)?))
    }

    /// Loads the pair once (at start: an error here stops the server).
    pub fn load(&self) -> Result<(CertifiedKey, PairBytes), TlsError> {
        let (cert, key) = self.read()?;
        let loaded = certified_key(
            &cert,
            &key,
            &self.cert.display().to_string(),
            &self.key.display().to_string(),
        )?;
        Ok((loaded, (cert, key)))
    }

    /// Polls the files every `interval` and swaps a changed, valid pair into `store`.
    pub async fn watch(
        self,
        store: Arc<CertificateStore>,
        mut last: PairBytes,
        interval: Duration,
    ) {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            let files = self.clone();
            let Ok(read) = tokio::task::spawn_blocking(move || files.read()).await else {
                continue;
            };
            let current = match read {
                Ok(current) => current,
                Err(error) => {
                    store.refused();
                    tracing::warn!(%error, "certificate reload failed; keeping the last good pair");
                    continue;
                }
            };
            if current == last {
                continue;
            }
            match certified_key(
                &current.0,
                &current.1,
                &self.cert.display().to_string(),
                &self.key.display().to_string(),
            ) {
                Ok(key) => {
                    store.replace(key);
                    tracing::info!(cert = %self.cert.display(), "serving certificate reloaded");
                    last = current;
                }
                Err(error) => {
                    store.refused();
                    tracing::warn!(%error, "certificate reload failed; keeping the last good pair");
                    // Try again at the next tick: a half-written pair becomes whole.
                }
            }
        }
    }
}

/// A CA and a serving certificate signed by it, as PEM.
#[derive(Clone, Debug)]
pub struct GeneratedPair {
    pub ca_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
}

/// Makes a throw-away CA and a serving certificate for `localhost`, `127.0.0.1` and
/// `dns_names`, valid for one year. For development and tests only.
pub fn generate_self_signed(dns_names: &[String]) -> Result<GeneratedPair, TlsError> {
    use rcgen::{
        BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair,
        KeyUsagePurpose,
    };
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    set_validity(&mut ca_params, 365);
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "gpu-guard self-signed CA");
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate()?)?;

    let mut names = vec!["localhost".to_owned(), "127.0.0.1".to_owned()];
    names.extend(dns_names.iter().cloned());
    let mut params = CertificateParams::new(names)?;
    set_validity(&mut params, 365);
    params
        .distinguished_name
        .push(DnType::CommonName, "gpu-guard");
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, &ca)?;
    Ok(GeneratedPair {
        ca_pem: ca.pem(),
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

/// Valid from yesterday (at day precision that covers clock skew) to `days` from now.
fn set_validity(params: &mut rcgen::CertificateParams, days: u64) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let date = |unix_days: u64| {
        let (year, month, day) = civil_from_days(i64::try_from(unix_days).unwrap_or(0));
        rcgen::date_time_ymd(year, month, day)
    };
    params.not_before = date(now / 86_400 - 1);
    params.not_after = date(now / 86_400 + days);
}

/// The proleptic Gregorian date of a day count since 1970-01-01 (H. Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i32, u8, u8) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (
        i32::try_from(year).unwrap_or(1970),
        u8::try_from(month).unwrap_or(1),
        u8::try_from(day).unwrap_or(1),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
        assert_eq!(civil_from_days(20_788), (2026, 12, 1));
    }

    #[test]
    fn a_chain_cut_off_in_its_middle_is_refused_and_a_whole_one_is_taken() {
        let pair = generate_self_signed(&[]).unwrap();
        let whole = format!("{}{}", pair.cert_pem, pair.ca_pem);
        let cut = &whole[..whole.len() - 40];
        let error = certified_key(cut.as_bytes(), pair.key_pem.as_bytes(), "c", "k").unwrap_err();
        assert!(matches!(error, TlsError::Chain { .. }), "{error}");
        let key = certified_key(whole.as_bytes(), pair.key_pem.as_bytes(), "c", "k").unwrap();
        assert_eq!(key.cert.len(), 2, "leaf and CA");
    }
}
