//! Where a Redis store is (its URL and TLS), and what its errors mean in
//! tenure's terms: the one place a Redis client error becomes an
//! [`Error`] a user can act on.

use std::time::Duration;

use redis::{ErrorKind, RedisError};

use super::connection::Endpoint;
use crate::{redact_url, Error, Result};

/// How to reach Redis.
#[derive(Debug, Clone)]
pub(crate) struct RedisTarget {
    pub url: String,
    pub tls_ca: Option<std::path::PathBuf>,
}

impl RedisTarget {
    pub fn redacted(&self) -> String {
        redact_url(&self.url)
    }

    /// Parse the URL and read the CA file (no network I/O yet). TLS uses
    /// the system's roots unless a CA file is given.
    pub fn endpoint(&self) -> Result<Endpoint> {
        Endpoint::new(self)
    }

    /// [`RedisTarget::classify`] for the first exchange with a server, with a
    /// hint where a TLS mismatch is the likely cause: a plain Redis never
    /// answers a TLS handshake (the client times out), and a TLS port resets
    /// a client that sends plain commands.
    pub(crate) fn classify_first(&self, err: RedisError) -> Error {
        let tls = self.url.starts_with("rediss:");
        // The server took the connection and closed it (not a refusal);
        // the client reports that in several shapes.
        let text = err.to_string();
        let refused = text.contains("refused");
        let dropped = !refused && err.is_connection_dropped()
            || text.contains("reset by peer")
            || text.contains("closed");
        match self.classify(err) {
            Error::Timeout(_) if tls => Error::Tls {
                url: self.redacted(),
                detail: "no answer to the TLS handshake (if the server does not use TLS on \
                         this port, use redis://)"
                    .into(),
            },
            Error::Unreachable { url, detail } if !tls && dropped => Error::Unreachable {
                url,
                detail: format!(
                    "{detail} (the server closed the connection at once; if it expects TLS, \
                     use rediss://)"
                ),
            },
            other => other,
        }
    }

    /// Turn a client error into the crate's error, naming the URL without
    /// its password.
    pub fn classify(&self, err: RedisError) -> Error {
        classify(err, &self.redacted())
    }
}

/// Map a client error to the crate's error.
pub(crate) fn classify(err: RedisError, url: &str) -> Error {
    let code = err.code().unwrap_or_default();
    let detail = err.detail().unwrap_or_default().to_string();
    if code == "TENUREFOREIGN" {
        let (key, what) = detail.split_once(' ').unwrap_or((detail.as_str(), ""));
        return Error::ForeignData {
            key: key.to_string(),
            detail: what.to_string(),
        };
    }
    if code == "TENURECMD" {
        return classify_command_error(&detail);
    }
    if err.kind() == ErrorKind::Parse && detail.starts_with("Parse error") {
        // The reply was not RESP at all: an HTTP or SSH server, say. The
        // client's message spans lines and quotes bytes.
        return Error::NotTheStore {
            url: url.to_string(),
        };
    }
    let text = crate::error::one_line(&err.to_string());
    if err.kind() == ErrorKind::AuthenticationFailed || matches!(code, "NOAUTH" | "WRONGPASS") {
        return Error::Auth {
            url: url.to_string(),
            detail: text,
        };
    }
    if code == "NOPERM" {
        // "this user has no permissions to run the 'eval' command", or to
        // access a key or channel.
        let command = detail
            .split('\'')
            .nth(1)
            .map_or_else(|| "this operation".to_string(), str::to_uppercase);
        return Error::NoPermission {
            command,
            detail: text,
        };
    }
    let lower = text.to_ascii_lowercase();
    if lower.contains("certificate") || lower.contains("tls") || lower.contains("handshake") {
        return Error::Tls {
            url: url.to_string(),
            detail: text,
        };
    }
    if err.is_timeout() {
        return Error::Timeout(Duration::ZERO);
    }
    if err.is_io_error() || err.is_connection_refusal() || err.is_connection_dropped() {
        return Error::Unreachable {
            url: url.to_string(),
            detail: text,
        };
    }
    Error::from_redis(err)
}

/// A command inside a tenure script failed: `detail` is "COMMAND error",
/// from the prelude's `call`. Missing permissions and renamed commands need
/// a person; anything else (a read-only replica, out of memory) may pass.
fn classify_command_error(detail: &str) -> Error {
    let (command, error) = detail.split_once(' ').unwrap_or((detail, ""));
    // Redis appends " script: SHA, on @user_script:LINE." to script errors.
    let error = error.split(" script: ").next().unwrap_or(error).trim();
    let refused = [
        "can't run this command",
        "can't publish",
        "no permissions",
        "NOPERM",
    ]
    .iter()
    .any(|sign| error.contains(sign));
    if refused {
        return Error::NoPermission {
            command: command.to_string(),
            detail: error.to_string(),
        };
    }
    if error.contains("Unknown Redis command") {
        return Error::NoPermission {
            command: command.to_string(),
            detail: format!(
                "{error} (the command is renamed or disabled in the server's configuration)"
            ),
        };
    }
    Error::redis(format!("{command} failed: {error}"))
}

/// Whether a write was refused because the server is a replica. Only the
/// check when connecting treats this as final: later, a primary demoted by a
/// failover may be promoted back, so lease operations keep retrying.
pub(crate) fn is_read_only(err: &RedisError) -> bool {
    refused_with(err, "READONLY")
}

/// Whether a write was refused because the server is no primary that may
/// take it: a replica (`READONLY`), or a Sentinel primary that lost the
/// replicas `min-replicas-to-write` asks for (`NOREPLICAS`), as a primary
/// just failed over from does.
pub(crate) fn is_not_writable(err: &RedisError) -> bool {
    refused_with(err, "READONLY") || refused_with(err, "NOREPLICAS")
}

/// Whether `err` is the error `code`, from Redis or from a command inside
/// a tenure script.
fn refused_with(err: &RedisError, code: &str) -> bool {
    let detail = err.detail().unwrap_or_default();
    match err.code() {
        Some(c) if c == code => true,
        Some("TENURECMD") => detail
            .split_once(' ')
            .is_some_and(|(_, error)| error.starts_with(code)),
        _ => false,
    }
}
