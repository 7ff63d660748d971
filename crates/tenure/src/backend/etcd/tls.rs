//! The TLS settings of an `etcds://` store, apart because they exist only
//! with tenure's `tls` feature: without it, `etcds://` is refused with a
//! message saying so.

#[cfg(feature = "tls")]
pub type Options = etcd_client::TlsOptions;

/// TLS settings of an `etcds://` store: the CA file (else the system's
/// roots) and the client certificate, if any.
#[cfg(feature = "tls")]
pub fn options(target: &super::EtcdTarget) -> Result<Options, String> {
    let read = |path: &std::path::Path, what: &str| {
        std::fs::read(path).map_err(|e| format!("cannot read the {what} {}: {e}", path.display()))
    };
    let mut options = Options::new();
    match &target.tls_ca {
        Some(ca) => {
            options = options.ca_certificate(etcd_client::Certificate::from_pem(read(
                ca,
                "CA certificate",
            )?));
        }
        None => options = options.with_native_roots(),
    }
    match (&target.tls_cert, &target.tls_key) {
        (Some(cert), Some(key)) => {
            options = options.identity(etcd_client::Identity::from_pem(
                read(cert, "client certificate")?,
                read(key, "client key")?,
            ));
        }
        (None, None) => {}
        _ => return Err("a client certificate needs its key, and a key its certificate".into()),
    }
    Ok(options)
}

#[cfg(not(feature = "tls"))]
pub type Options = ();

#[cfg(not(feature = "tls"))]
pub fn options(_: &super::EtcdTarget) -> Result<Options, String> {
    Err("etcds:// needs tenure built with its `tls` feature".into())
}
