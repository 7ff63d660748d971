//! The one error type of the crate.
//!
//! Variants name what went wrong in terms a user can act on (fix the
//! configuration, the URL, the credentials, the ACL, a foreign key) rather
//! than echoing the Redis client's internals. URLs in messages never carry
//! passwords.

use std::time::Duration;

use crate::term::LostReason;

/// Everything that can go wrong in tenure.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let err = tenure::Election::builder("jobs")
///     .memory(&tenure::MemoryStore::new())
///     .ttl(std::time::Duration::ZERO)
///     .build()
///     .await
///     .unwrap_err();
/// assert!(matches!(err, tenure::Error::Config(_)));
/// assert!(!err.is_transient(), "a person must fix the setting");
/// println!("{err}"); // one line, naming the setting
/// # }
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The election's configuration is invalid; the message says which setting.
    #[error("invalid configuration: {0}")]
    Config(String),

    /// The store (Redis, etcd or ZooKeeper) could not be reached (refused, DNS, network).
    #[error("cannot reach {} at {url}: {detail}", store_of(.url))]
    Unreachable {
        /// The URL, with any password replaced by `***`.
        url: String,
        /// What the connection attempt reported.
        detail: String,
    },

    /// The server at the URL is not the store the URL names (an HTTP or
    /// SSH server on that port, say): retrying cannot help.
    #[error("the server at {url} does not speak the {} protocol (check the host and port)", store_of(.url))]
    NotTheStore {
        /// The URL, with any password replaced by `***`.
        url: String,
    },

    /// The store rejected the username or password (or, on etcd, the
    /// user's role does not cover tenure's keys).
    #[error("{} at {url} rejected the credentials: {detail}", store_of(.url))]
    Auth {
        /// The URL, with any password replaced by `***`.
        url: String,
        /// The server's reply.
        detail: String,
    },

    /// The TLS handshake failed or TLS settings were unusable.
    #[error("TLS to {} at {url} failed: {detail}", store_of(.url))]
    Tls {
        /// The URL, with any password replaced by `***`.
        url: String,
        /// What failed (certificate, handshake, file).
        detail: String,
    },

    /// The Redis user may not run a command tenure needs (a missing ACL
    /// permission, or a command renamed or disabled in the server's
    /// configuration).
    #[error(
        "the Redis user may not run {command}: {detail} (grant the least-privilege ACL of the \
         book's operator's guide, Credentials and TLS: {MIN_ACL})"
    )]
    NoPermission {
        /// The command refused, as far as the server said (e.g. `PEXPIRE`).
        command: String,
        /// The server's reply.
        detail: String,
    },

    /// The store is configured in a way that breaks the lease guarantee,
    /// for example an eviction policy that can delete leases.
    #[error("{url} is not safe for leases: {detail}")]
    Unsafe {
        /// The URL, with any password replaced by `***`.
        url: String,
        /// What is wrong and how to fix it.
        detail: String,
    },

    /// A key tenure owns holds data tenure did not write.
    #[error(
        "key {key} holds data tenure did not write ({detail}); tenure will not touch it: \
         delete it or choose another key prefix"
    )]
    ForeignData {
        /// The offending key.
        key: String,
        /// What was found there.
        detail: String,
    },

    /// A store call did not answer within its timeout (zero when the
    /// client's own timeout fired). Its outcome is unknown: it may still have
    /// run on the server.
    #[error("the store did not answer in time{}", within(.0))]
    Timeout(Duration),

    /// Any other Redis error (transient connection drops, server errors).
    #[error("Redis error: {detail}")]
    #[non_exhaustive]
    Redis {
        /// What failed, on one line.
        detail: String,
        /// The Redis client's error, when there was one (its kind and server
        /// error code are there). Its text is already in `detail`.
        #[source]
        source: Option<redis::RedisError>,
    },

    /// An etcd call failed (no leader, a member unavailable, a dropped
    /// connection): transient.
    #[error("etcd error: {detail}")]
    Etcd {
        /// What failed, on one line.
        detail: String,
    },

    /// A ZooKeeper request failed (connection loss, no quorum, a session
    /// moved or expired): transient.
    #[error("ZooKeeper error: {detail}")]
    ZooKeeper {
        /// What failed, on one line.
        detail: String,
    },

    /// A SQLite transaction failed (the file busy past the call timeout,
    /// a disk error): transient.
    #[error("SQLite error: {detail}")]
    Sqlite {
        /// What failed, on one line.
        detail: String,
    },

    /// A PostgreSQL call failed (the connection broke, a serialization
    /// failure or deadlock, a read-only standby): transient.
    #[error("PostgreSQL error: {detail}")]
    Postgres {
        /// What failed, on one line.
        detail: String,
    },

    /// The simulated outage of an in-memory store ([`crate::MemoryStore::set_fault`]).
    #[error("in-memory store unavailable (simulated fault)")]
    Unavailable,

    /// A bug in tenure: a store answered an operation with a reply of
    /// another kind, or not at all. Retried as a transient error; please
    /// report it.
    #[error("internal error (a bug in tenure; please report it): {0}")]
    Internal(String),

    /// The term is over; the operation needs a current leader.
    #[error("not leader any more: {0}")]
    NotLeader(LostReason),
}

impl Error {
    /// Whether retrying later may succeed (network, timeouts, restarts), as
    /// opposed to errors that need a person (configuration, credentials, ACL,
    /// foreign data).
    ///
    /// ```
    /// use std::time::Duration;
    /// assert!(tenure::Error::Timeout(Duration::from_secs(1)).is_transient());
    /// assert!(!tenure::Error::Config("ttl is zero".into()).is_transient());
    /// ```
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            Error::Unreachable { .. }
                | Error::Timeout(_)
                | Error::Redis { .. }
                | Error::Etcd { .. }
                | Error::ZooKeeper { .. }
                | Error::Sqlite { .. }
                | Error::Postgres { .. }
                | Error::Unavailable
                | Error::Internal(_)
        )
    }

    /// [`Error::Internal`]: `detail` says what tenure did not expect.
    pub(crate) fn internal(detail: impl Into<String>) -> Error {
        Error::Internal(one_line(&detail.into()))
    }

    /// [`Error::Redis`] without a client error behind it.
    pub(crate) fn redis(detail: impl Into<String>) -> Error {
        Error::Redis {
            detail: one_line(&detail.into()),
            source: None,
        }
    }

    /// [`Error::Redis`] for a client error, keeping it as the source.
    pub(crate) fn from_redis(err: redis::RedisError) -> Error {
        Error::Redis {
            detail: one_line(&err.to_string()),
            source: Some(err),
        }
    }
}

/// The store a URL names, for messages: `etcd` for `etcd://`/`etcds://`,
/// else Redis.
fn store_of(url: &str) -> &'static str {
    if url.starts_with("etcd") {
        "etcd"
    } else if url.starts_with("zk://") || url.starts_with("zks://") {
        "ZooKeeper"
    } else if url.starts_with("sqlite:") {
        "SQLite"
    } else if url.starts_with("postgres") {
        "PostgreSQL"
    } else {
        "Redis"
    }
}

#[cfg(all(feature = "sqlite", target_os = "linux"))]
impl From<rusqlite::Error> for Error {
    fn from(err: rusqlite::Error) -> Self {
        Error::Sqlite {
            detail: one_line(&err.to_string()),
        }
    }
}

/// The same error again, for each of several operations that failed
/// together.
pub(crate) fn copy_error(err: &Error) -> Error {
    match err {
        Error::Config(text) => Error::Config(text.clone()),
        Error::Unreachable { url, detail } => Error::Unreachable {
            url: url.clone(),
            detail: detail.clone(),
        },
        Error::NotTheStore { url } => Error::NotTheStore { url: url.clone() },
        Error::Auth { url, detail } => Error::Auth {
            url: url.clone(),
            detail: detail.clone(),
        },
        Error::Tls { url, detail } => Error::Tls {
            url: url.clone(),
            detail: detail.clone(),
        },
        Error::NoPermission { command, detail } => Error::NoPermission {
            command: command.clone(),
            detail: detail.clone(),
        },
        Error::Unsafe { url, detail } => Error::Unsafe {
            url: url.clone(),
            detail: detail.clone(),
        },
        Error::ForeignData { key, detail } => Error::ForeignData {
            key: key.clone(),
            detail: detail.clone(),
        },
        Error::Timeout(limit) => Error::Timeout(*limit),
        Error::Unavailable => Error::Unavailable,
        Error::Internal(detail) => Error::Internal(detail.clone()),
        Error::Etcd { detail } => Error::Etcd {
            detail: detail.clone(),
        },
        Error::ZooKeeper { detail } => Error::ZooKeeper {
            detail: detail.clone(),
        },
        Error::Sqlite { detail } => Error::Sqlite {
            detail: detail.clone(),
        },
        Error::Postgres { detail } => Error::Postgres {
            detail: detail.clone(),
        },
        Error::NotLeader(reason) => Error::NotLeader(reason.clone()),
        Error::Redis { detail, .. } => Error::redis(detail.clone()),
    }
}

/// Messages are one line: the Redis client's multi-line errors are joined.
pub(crate) fn one_line(text: &str) -> String {
    text.lines()
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .collect::<Vec<_>>()
        .join("; ")
}

fn within(timeout: &Duration) -> String {
    if timeout.is_zero() {
        String::new()
    } else {
        format!(" ({timeout:?})")
    }
}

/// The least a Redis ACL user needs for elections, partition sets,
/// `tenure status`/`watch` and the `--at-most-every` marker (key and
/// channel patterns for the default prefix `tenure`).
///
/// ```
/// // An ACL user for tenure (`redis-cli ACL SETUSER tenure on >secret ...`).
/// let setuser = format!("ACL SETUSER tenure on >secret {}", tenure::MIN_ACL);
/// assert!(setuser.contains("~tenure:*") && setuser.contains("+evalsha"));
/// ```
pub const MIN_ACL: &str = "~tenure:* &tenure:* +ping +evalsha +script|load +subscribe +publish \
     +type +hmget +hlen +hset +pexpire +pttl +get +set +del +time +info +zadd +zrem +zrangebyscore \
     +zremrangebyscore +zcount +scan";

/// The crate's result type.
///
/// ```
/// fn ttl_secs(raw: &str) -> tenure::Result<u64> {
///     raw.parse().map_err(|_| tenure::Error::Config(format!("bad ttl {raw:?}")))
/// }
/// assert_eq!(ttl_secs("15").ok(), Some(15));
/// assert!(matches!(ttl_secs("soon"), Err(tenure::Error::Config(_))));
/// ```
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Replace the password of a URL by `***`, for messages and logs: the one
/// place every URL goes through before it is printed or logged.
///
/// It does not need the URL to parse (a URL with a bad port or a missing
/// bracket is exactly the one that ends up in an error message): whatever
/// stands between `://` and the last `@` after it is the user information,
/// and everything in it after the first `:` is replaced. So are the values
/// of `password`/`pass` query parameters (`redis+unix:///path?pass=…`).
///
/// ```
/// assert_eq!(
///     tenure::redact_url("redis://app:s3cret@db:6379/2"),
///     "redis://app:***@db:6379/2"
/// );
/// assert_eq!(
///     tenure::redact_url("redis://u:Sekrit123@127.0.0.1:99999"),
///     "redis://u:***@127.0.0.1:99999"
/// );
/// assert_eq!(
///     tenure::redact_url("redis+unix:///run/redis.sock?db=1&pass=hunter2"),
///     "redis+unix:///run/redis.sock?db=1&pass=***"
/// );
/// assert_eq!(tenure::redact_url("not a url"), "not a url");
/// // A `?` or `/` in a password does not end the user information.
/// assert_eq!(
///     tenure::redact_url("postgres://app:ab?c/d@db/jobs?sslmode=require"),
///     "postgres://app:***@db/jobs?sslmode=require"
/// );
/// ```
pub fn redact_url(raw: &str) -> String {
    // The user information ends at the last `@` of the whole URL: a
    // password may hold `?`, `/` or `#` unencoded (some clients take it
    // so), and splitting off the query first would leave it in the clear.
    // An `@` in a query parameter makes this hide more than the password,
    // never less.
    let (prefix, rest) = match raw.split_once("://") {
        Some((scheme, rest)) => match rest.rsplit_once('@') {
            Some((userinfo, after)) => {
                let user = match userinfo.split_once(':') {
                    Some((user, _password)) => format!("{user}:***"),
                    None => userinfo.to_string(),
                };
                (format!("{scheme}://{user}@"), after)
            }
            None => (format!("{scheme}://"), rest),
        },
        None => (String::new(), raw),
    };
    let (head, query) = match rest.split_once('?') {
        Some((head, query)) => (head, Some(query)),
        None => (rest, None),
    };
    let mut out = format!("{prefix}{head}");
    if let Some(query) = query {
        let params: Vec<String> = query
            .split('&')
            .map(|param| match param.split_once('=') {
                Some((key, _)) if is_secret_parameter(key) => format!("{key}=***"),
                _ => param.to_string(),
            })
            .collect();
        out.push('?');
        out.push_str(&params.join("&"));
    }
    out
}

fn is_secret_parameter(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    ["pass", "password", "passwd", "secret", "token"]
        .iter()
        .any(|secret| key.ends_with(secret))
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;

    #[test]
    fn a_redis_error_keeps_its_source_and_prints_on_one_line() {
        let client_error = redis::RedisError::from((
            redis::ErrorKind::Parse,
            "Incompatible type",
            "Parse error\nat byte 0".to_string(),
        ));
        let err = Error::from_redis(client_error);
        let text = err.to_string();
        assert!(!text.contains('\n'), "{text:?}");
        assert!(text.starts_with("Redis error: "), "{text}");
        assert!(text.contains("at byte 0"), "{text}");
        let source = err.source().expect("the client error is the source");
        let source = source
            .downcast_ref::<redis::RedisError>()
            .expect("a redis::RedisError");
        assert_eq!(source.kind(), redis::ErrorKind::Parse);
        assert!(Error::redis("no client error").source().is_none());
    }
}
