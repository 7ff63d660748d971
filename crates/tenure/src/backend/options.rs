//! What a store is told when it is connected and when an election is built
//! on it: its URL, TLS files and call timeout ([`Connect`]), what the
//! election needs of it ([`Needs`]), and the failing-mode switches of the
//! backends. A leaf of the backend module, shared by the backends.

use crate::{Error, Result};

/// How to reach a store, as a builder was told: every store of every kind
/// is connected by [`Store::connect`] from one of these.
#[derive(Debug)]
pub(crate) struct Connect {
    pub url: String,
    pub tls: TlsFiles,
    /// The bound of one round trip.
    pub call_timeout: std::time::Duration,
    pub bugs: StoreBugs,
}

/// Fixed bugs of the stores that hidden, **unsafe** builder switches turn
/// back on, so that tenure-chaos's failing-mode tests can show its checker
/// catches them. All off by default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct StoreBugs {
    pub etcd: EtcdBugs,
    pub zk: ZkBugs,
    pub sqlite: SqliteBugs,
    pub postgres: PostgresBugs,
    /// Sentinel: only the first sentinel of the URL is listened to and
    /// asked for the primary (issue 22).
    pub first_sentinel_only: bool,
}

/// What an election or a partition set needs of its store, checked once
/// when it is built.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Needs {
    /// A partition set: the group's member set too.
    pub partitions: bool,
    /// Accept a store that may evict leases (Redis' eviction policies).
    pub allow_eviction: bool,
    /// The ttl the leases will have (etcd counts whole seconds).
    #[cfg_attr(not(any(feature = "etcd", feature = "zookeeper")), allow(dead_code))]
    pub ttl: std::time::Duration,
}

/// TLS files a builder was given: a CA certificate to verify the store
/// against, and (etcd only) a client certificate and its key.
#[derive(Debug, Clone, Default)]
pub(crate) struct TlsFiles {
    pub ca: Option<std::path::PathBuf>,
    pub cert: Option<std::path::PathBuf>,
    pub key: Option<std::path::PathBuf>,
}

impl TlsFiles {
    /// The CA file for a Redis URL, which takes no client certificate
    /// (Redis authenticates with a password or an ACL user).
    pub fn for_redis(self, url: &str) -> Result<Option<std::path::PathBuf>> {
        if self.cert.is_some() || self.key.is_some() {
            return Err(Error::Config(format!(
                "a client certificate is for etcds:// clusters only; {} is a Redis URL",
                crate::redact_url(url)
            )));
        }
        Ok(self.ca)
    }
}

/// Fixed bugs of the ZooKeeper backend that hidden, **unsafe** builder
/// switches turn back on (`unsafe_zk_ignore_witness`,
/// `unsafe_zk_tokens_without_clock`), so that tenure-chaos's failing-mode
/// tests can show its checker catches them. All off by default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct ZkBugs {
    /// A candidate that finds the lease gone takes the election at once,
    /// even while the witness of the term whose lease was deleted by hand
    /// is there: its holder acts on until its next renewal.
    pub ignore_witness: bool,
    /// A term's token is the counter plus one, without the candidate's
    /// clock: a restore from an older copy of the data issues earlier
    /// tokens again.
    pub tokens_without_clock: bool,
}

/// Fixed bugs of the SQLite backend that a hidden, **unsafe** builder
/// switch turns back on (`unsafe_sqlite_ignore_rollback`), so that
/// tenure-chaos's failing-mode tests can show its checker catches them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct SqliteBugs {
    /// A file that went back to an older copy grants new terms at once,
    /// while the holders of the leases it lost still lead.
    #[cfg_attr(not(all(feature = "sqlite", target_os = "linux")), allow(dead_code))]
    pub ignore_rollback: bool,
}

/// Fixed bugs of the PostgreSQL backend that a hidden, **unsafe** builder
/// switch turns back on (`unsafe_postgres_ignore_epoch`), so that
/// tenure-chaos's failing-mode tests can show its checker catches them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct PostgresBugs {
    /// A server process new to an election (restarted, restored from an
    /// older copy, a promoted replica) grants new terms at once, while the
    /// holders of the leases it lost still lead.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub ignore_epoch: bool,
}

/// Fixed bugs of the etcd backend that hidden, **unsafe** builder switches
/// turn back on (see `ElectionBuilder::unsafe_etcd_tokens_without_clock` and
/// `unsafe_etcd_no_hedges`), so that tenure-chaos's failing-mode tests can
/// show its checker catches them. All off by default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct EtcdBugs {
    /// A term's token is the counter's last value plus one, without the
    /// candidate's clock: a restore from an older backup rolls the counter
    /// back and the tokens of earlier terms are issued again, as the
    /// revision tokens before issue 22 were.
    pub tokens_without_clock: bool,
    /// A call is sent once and waits for its answer, never hedged to
    /// another member: a paused minority member holds the calls the
    /// balanced client gives it, and costs leaders their terms.
    pub no_hedges: bool,
}

/// The CA certificates in the PEM file at `path`, for verifying a store's
/// TLS certificate; the one-line reason when there are none.
#[cfg(feature = "tls")]
pub(crate) fn ca_file_roots(
    path: &std::path::Path,
) -> std::result::Result<rustls::RootCertStore, String> {
    use rustls::pki_types::pem::PemObject;
    let pem =
        std::fs::read(path).map_err(|e| format!("cannot read CA file {}: {e}", path.display()))?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls::pki_types::CertificateDer::pem_slice_iter(&pem) {
        let cert = cert.map_err(|e| format!("CA file {}: {e}", path.display()))?;
        roots
            .add(cert)
            .map_err(|e| format!("CA file {}: {e}", path.display()))?;
    }
    if roots.is_empty() {
        use rustls::pki_types::PrivateKeyDer;
        let holds = if PrivateKeyDer::from_pem_slice(&pem).is_ok() {
            "a private key, not a CA certificate"
        } else {
            "no PEM certificate (-----BEGIN CERTIFICATE-----)"
        };
        return Err(format!("CA file {} holds {holds}", path.display()));
    }
    Ok(roots)
}

/// The system's CA certificates (when no CA file was given).
#[cfg(feature = "tls")]
pub(crate) fn native_roots() -> std::result::Result<rustls::RootCertStore, String> {
    let found = rustls_native_certs::load_native_certs();
    let mut roots = rustls::RootCertStore::empty();
    let (added, _ignored) = roots.add_parsable_certificates(found.certs);
    if added == 0 {
        let why = found
            .errors
            .first()
            .map_or_else(|| "none found".to_string(), ToString::to_string);
        return Err(format!(
            "no usable system CA certificates ({why}); give the server's CA file"
        ));
    }
    Ok(roots)
}
