//! Where an etcd store is and how to reach it: its URL taken apart
//! (members, user, TLS) and checked before anything is sent, apart from
//! the connection itself so that a bad URL is refused with one line that
//! never shows the password.

use std::path::PathBuf;

use super::tls;
use super::EtcdBugs;
use crate::{redact_url, Error, Result};

/// The form of an etcd URL, for messages.
const FORM: &str = "etcd://[USER:PASSWORD@]HOST:PORT[,HOST:PORT...] (etcds:// for TLS)";

/// Where an etcd store is and how to reach it.
#[derive(Debug, Clone)]
pub(crate) struct EtcdTarget {
    pub url: String,
    pub tls_ca: Option<PathBuf>,
    /// A client certificate and its key (PEM), both or neither.
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    /// Fixed bugs switched back on, for failing-mode tests only.
    pub bugs: EtcdBugs,
}

/// An etcd URL taken apart.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct EtcdUrl {
    pub(super) endpoints: Vec<String>,
    pub(super) user: Option<(String, String)>,
    pub(super) tls: bool,
}

impl EtcdTarget {
    pub fn redacted(&self) -> String {
        redact_url(&self.url)
    }

    pub(super) fn parse(&self) -> Result<EtcdUrl> {
        let bad = |why: &str| {
            Error::Config(format!(
                "invalid etcd URL {}: {why} (expected {FORM})",
                self.redacted()
            ))
        };
        let (tls, rest) = if let Some(rest) = self.url.strip_prefix("etcd://") {
            (false, rest)
        } else if let Some(rest) = self.url.strip_prefix("etcds://") {
            (true, rest)
        } else {
            return Err(bad("the scheme must be etcd or etcds"));
        };
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        if rest.contains(['/', '?', '#']) {
            return Err(bad("etcd URLs have no path or query"));
        }
        let (user, hosts) = match rest.rsplit_once('@') {
            Some((userinfo, hosts)) => {
                let (name, password) = userinfo.split_once(':').unwrap_or((userinfo, ""));
                let decode = |part: &str| {
                    percent_encoding::percent_decode_str(part)
                        .decode_utf8()
                        .map(|s| s.into_owned())
                        .map_err(|_| bad("the user information is not valid UTF-8"))
                };
                let name = decode(name)?;
                if name.is_empty() {
                    return Err(bad("the user name is empty"));
                }
                (Some((name, decode(password)?)), hosts)
            }
            None => (None, rest),
        };
        let mut endpoints = Vec::new();
        for host in hosts.split(',') {
            let Some((name, port)) = host.rsplit_once(':') else {
                return Err(bad(&format!("{host:?} has no port")));
            };
            if name.is_empty() || port.parse::<u16>().map_or(true, |p| p == 0) {
                return Err(bad(&format!("{host:?} is not HOST:PORT")));
            }
            let scheme = if tls { "https" } else { "http" };
            endpoints.push(format!("{scheme}://{host}"));
        }
        Ok(EtcdUrl {
            endpoints,
            user,
            tls,
        })
    }

    pub(super) fn tls_options(&self, parsed: &EtcdUrl) -> Result<Option<tls::Options>> {
        let tls_error = |detail: String| Error::Tls {
            url: self.redacted(),
            detail,
        };
        if !parsed.tls {
            if self.tls_cert.is_some() || self.tls_key.is_some() {
                return Err(Error::Config(format!(
                    "a client certificate is given, but {} is not an etcds:// URL",
                    self.redacted()
                )));
            }
            return Ok(None);
        }
        tls::options(self).map(Some).map_err(tls_error)
    }
}
