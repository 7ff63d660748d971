//! Connections to one Redis server, plain or TLS.
//!
//! Plain `redis://` connections are the redis crate's [`ConnectionManager`].
//! TLS (`rediss://`) connections are opened by tenure itself, with
//! tokio-rustls and an explicit rustls crypto provider (ring), and handed
//! to the redis crate's [`MultiplexedConnection`] and [`PubSub`], which
//! accept any stream.
//!
//! Why not the redis crate's own TLS: it builds its rustls configuration
//! from the *process-wide* default `CryptoProvider`, and installs one when
//! there is none. Which provider a process uses (ring, aws-lc-rs, a FIPS
//! build) is the application's choice; a library that installs one takes
//! that choice away, or loses a race with the application's own
//! `install_default` and makes it fail. With an explicit provider, tenure
//! never touches the process default.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig, PubSub};
use redis::{Client, Cmd, Pipeline, RedisError, RedisFuture, RedisResult, Value};

use super::target::RedisTarget;
use crate::{Error, Result};

/// How to reach a server: parsed once from the URL (and CA file), then
/// used for every connection to it.
#[derive(Clone)]
pub(crate) enum Endpoint {
    /// Boxed: a `Client` is large (hundreds of bytes once the redis
    /// crate's own TLS is built in, as another crate of a workspace may
    /// ask), and an endpoint is cloned for every connection.
    Plain(Box<Client>),
    #[cfg(feature = "tls")]
    Tls(Arc<tls::TlsEndpoint>),
}

impl Endpoint {
    /// Parse the target's URL and read its CA file (no I/O on the network).
    pub fn new(target: &RedisTarget) -> Result<Self> {
        let url = target.url.as_str();
        let invalid = |detail: String| {
            Error::Config(format!(
                "invalid Redis URL {}: {detail} (expected redis://[user:password@]host[:port][/db] \
                 or rediss:// for TLS)",
                target.redacted()
            ))
        };
        let parse = |url: &str| {
            Client::open(url).map_err(|e| invalid(e.detail().unwrap_or(&e.to_string()).to_string()))
        };
        #[cfg(not(feature = "tls"))]
        if target.tls_ca.is_some() {
            return Err(Error::Config(
                "a TLS CA file needs tenure's `tls` feature, which this build lacks".into(),
            ));
        }
        match tls_scheme(url) {
            None => parse(url).map(|client| Endpoint::Plain(Box::new(client))),
            #[cfg(feature = "tls")]
            Some(plain) => {
                if url.ends_with("#insecure") {
                    return Err(invalid(
                        "#insecure (no certificate check) is not supported; give the server's CA \
                         file instead"
                            .into(),
                    ));
                }
                let info = parse(&plain)?.get_connection_info().clone();
                tls::TlsEndpoint::new(target, info).map(|tls| Endpoint::Tls(Arc::new(tls)))
            }
            #[cfg(not(feature = "tls"))]
            Some(_) => Err(Error::Config(format!(
                "{} asks for TLS, which needs tenure's `tls` feature; this build lacks it",
                target.redacted()
            ))),
        }
    }

    /// A connection whose calls time out after `call_timeout` (unless
    /// [`Connection::within`] says otherwise); it connects at its first
    /// call, and again after the connection drops.
    pub fn connection(&self, call_timeout: Duration) -> Result<Connection> {
        let connect_timeout = call_timeout.max(Duration::from_secs(1));
        let inner = match self {
            Endpoint::Plain(client) => {
                // No response timeout of the client's own: the limit is
                // each call's (see `Connection::within`).
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(connect_timeout))
                    .set_response_timeout(None)
                    .set_number_of_retries(1);
                Inner::Plain(
                    ConnectionManager::new_lazy_with_config(Client::clone(client), config)
                        .map_err(Error::from_redis)?,
                    Arc::new(AtomicBool::new(false)),
                )
            }
            #[cfg(feature = "tls")]
            Endpoint::Tls(endpoint) => Inner::Tls(Arc::new(tls::TlsConnection::new(
                endpoint.clone(),
                connect_timeout,
            ))),
        };
        Ok(Connection {
            inner,
            limit: call_timeout,
            connect_timeout,
        })
    }

    /// A pub/sub connection, opened within `limit`.
    pub async fn pubsub(&self, limit: Duration) -> redis::RedisResult<PubSub> {
        match self {
            Endpoint::Plain(client) => tokio::time::timeout(limit, client.get_async_pubsub())
                .await
                .map_err(|_| {
                    redis::RedisError::from(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!("opening a pub/sub connection timed out after {limit:?}"),
                    ))
                })?,
            #[cfg(feature = "tls")]
            Endpoint::Tls(endpoint) => endpoint.pubsub(limit).await,
        }
    }
}

impl Endpoint {
    /// A RESP3 connection whose push messages (sharded pub/sub) go to
    /// `sender`, opened within `limit`. The URL must ask for RESP3
    /// (`?protocol=resp3`).
    pub async fn push_connection(
        &self,
        limit: Duration,
        sender: impl redis::aio::AsyncPushSender,
    ) -> redis::RedisResult<redis::aio::MultiplexedConnection> {
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(limit))
            .set_response_timeout(Some(limit))
            .set_push_sender(sender);
        match self {
            Endpoint::Plain(client) => {
                client
                    .get_multiplexed_async_connection_with_config(&config)
                    .await
            }
            #[cfg(feature = "tls")]
            Endpoint::Tls(endpoint) => endpoint.multiplexed(limit, config).await,
        }
    }
}

/// The URL with its TLS scheme replaced by the plain one, for the redis
/// crate's parser; `None` for a URL without TLS.
fn tls_scheme(url: &str) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    let plain = match scheme.to_ascii_lowercase().as_str() {
        "rediss" => "redis",
        "valkeys" => "valkey",
        _ => return None,
    };
    Some(format!("{plain}://{rest}"))
}

/// A connection to one Redis node: every call bounded by a timeout, and a
/// new connection after the old one drops. Cheap to clone (clones share
/// the connection). [`super::routed::Connection`] routes over these.
///
/// The timeout is the connection's, not the client's response timeout,
/// so that one call may wait longer than the others on the same
/// connection ([`Connection::within`]): a partition set's renewal of
/// 100,000 terms is one pipeline that a busy server may take more than the
/// call timeout to answer, while every other call on it keeps the call
/// timeout. A call that must connect first has the connect timeout on top,
/// as when the client's own timeouts applied.
#[derive(Clone)]
pub(crate) struct Connection {
    inner: Inner,
    /// How long a call waits for its reply.
    limit: Duration,
    /// How long connecting may take, before a call is sent.
    connect_timeout: Duration,
}

impl Connection {
    /// This connection (shared, not a new one), each of its calls done
    /// within `limit`, connecting first included: a caller that asks for
    /// a limit has one deadline for the whole call.
    pub fn within(&self, limit: Duration) -> Connection {
        Connection {
            limit,
            connect_timeout: Duration::ZERO,
            ..self.clone()
        }
    }
}

/// How long a call on a [`ConnectionManager`] may take: `limit` on a
/// connection that is up, plus `connect_timeout` on one that may have to
/// connect first (the manager connects inside the call, out of sight).
fn plain_limit(connected: &AtomicBool, limit: Duration, connect_timeout: Duration) -> Duration {
    if connected.load(Ordering::Relaxed) {
        limit
    } else {
        limit.saturating_add(connect_timeout)
    }
}

/// Note what a call's `result` says of the connection: up after a reply
/// (an error reply of the server's included); maybe down after anything
/// else but a timeout (the manager may be connecting again).
fn note_connection<T>(connected: &AtomicBool, result: &RedisResult<T>) {
    match result {
        Ok(_) => connected.store(true, Ordering::Relaxed),
        Err(err) if err.is_timeout() => {}
        Err(err) if matches!(err.kind(), redis::ErrorKind::Server(_)) => {
            connected.store(true, Ordering::Relaxed)
        }
        Err(_) => connected.store(false, Ordering::Relaxed),
    }
}

/// How long a TLS call may take in all: connecting (a TCP connect, the
/// handshake and the connection's setup, each within the connect
/// timeout) on top of `limit`; none under [`Connection::within`].
#[cfg(feature = "tls")]
fn tls_limit(limit: Duration, connect_timeout: Duration) -> Duration {
    limit.saturating_add(connect_timeout.saturating_mul(3))
}

/// `call`, failed as the client fails a call without a reply in time (an
/// I/O error of kind `TimedOut`, which [`RedisError::is_timeout`] knows)
/// if it has none within `limit`. Dropping the call is safe on a
/// multiplexed connection: a reply that comes later is thrown away.
async fn bounded<T>(
    limit: Duration,
    call: impl std::future::Future<Output = RedisResult<T>>,
) -> RedisResult<T> {
    match tokio::time::timeout(limit, call).await {
        Ok(result) => result,
        Err(_) => Err(RedisError::from(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("no reply within {limit:?}"),
        ))),
    }
}

#[derive(Clone)]
enum Inner {
    /// The manager, and whether its connection is known to be up.
    Plain(ConnectionManager, Arc<AtomicBool>),
    #[cfg(feature = "tls")]
    Tls(Arc<tls::TlsConnection>),
}

impl fmt::Debug for Connection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match &self.inner {
            Inner::Plain(..) => "plain",
            #[cfg(feature = "tls")]
            Inner::Tls(_) => "tls",
        };
        f.debug_struct("Connection")
            .field("kind", &kind)
            .finish_non_exhaustive()
    }
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        let (limit, connect_timeout) = (self.limit, self.connect_timeout);
        match &mut self.inner {
            Inner::Plain(conn, connected) => Box::pin(async move {
                let limit = plain_limit(connected, limit, connect_timeout);
                let result = bounded(limit, conn.req_packed_command(cmd)).await;
                note_connection(connected, &result);
                result
            }),
            #[cfg(feature = "tls")]
            Inner::Tls(conn) => Box::pin(bounded(
                tls_limit(limit, connect_timeout),
                conn.command(cmd, limit),
            )),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        let (limit, connect_timeout) = (self.limit, self.connect_timeout);
        match &mut self.inner {
            Inner::Plain(conn, connected) => Box::pin(async move {
                let limit = plain_limit(connected, limit, connect_timeout);
                let call = conn.req_packed_commands(pipeline, offset, count);
                let result = bounded(limit, call).await;
                note_connection(connected, &result);
                result
            }),
            #[cfg(feature = "tls")]
            Inner::Tls(conn) => Box::pin(bounded(
                tls_limit(limit, connect_timeout),
                conn.commands(pipeline, offset, count, limit),
            )),
        }
    }

    fn get_db(&self) -> i64 {
        match &self.inner {
            Inner::Plain(conn, _) => conn.get_db(),
            #[cfg(feature = "tls")]
            Inner::Tls(conn) => conn.db(),
        }
    }
}

#[cfg(feature = "tls")]
mod tls {
    use std::io;
    use std::sync::Arc;
    use std::time::Duration;

    use redis::aio::{ConnectionLike, MultiplexedConnection, PubSub};
    use redis::{
        AsyncConnectionConfig, Cmd, ConnectionAddr, ConnectionInfo, Pipeline, RedisConnectionInfo,
        RedisError, RedisResult, Value,
    };
    use rustls::pki_types::ServerName;
    use rustls::ClientConfig;
    use tokio::net::TcpStream;
    use tokio_rustls::client::TlsStream;
    use tokio_rustls::TlsConnector;

    use super::super::target::RedisTarget;
    use crate::backend::options::{ca_file_roots, native_roots};
    use crate::{Error, Result};

    /// A TLS server: its address, the rustls configuration to reach it
    /// (with an explicit provider), and the Redis settings (user, password,
    /// db).
    pub(crate) struct TlsEndpoint {
        host: String,
        port: u16,
        server_name: ServerName<'static>,
        config: Arc<ClientConfig>,
        redis: RedisConnectionInfo,
    }

    impl TlsEndpoint {
        pub fn new(target: &RedisTarget, info: ConnectionInfo) -> Result<Self> {
            let tls_error = |detail: String| Error::Tls {
                url: target.redacted(),
                detail,
            };
            let (host, port) = match info.addr() {
                ConnectionAddr::Tcp(host, port) => (host.clone(), *port),
                other => return Err(tls_error(format!("TLS is not available for {other}"))),
            };
            // A bracketed IPv6 literal is a name to the URL but an address to TLS.
            let bare = host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string();
            let server_name = ServerName::try_from(bare.clone())
                .map_err(|e| tls_error(format!("{host} is not a valid TLS server name: {e}")))?;
            let roots = match &target.tls_ca {
                Some(path) => ca_file_roots(path).map_err(tls_error)?,
                None => native_roots().map_err(tls_error)?,
            };
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let config = ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .map_err(|e| tls_error(e.to_string()))?
                .with_root_certificates(roots)
                .with_no_client_auth();
            Ok(TlsEndpoint {
                host: bare,
                port,
                server_name,
                config: Arc::new(config),
                redis: info.redis_settings().clone(),
            })
        }

        /// A TCP connection with a completed TLS handshake, each step
        /// within `limit`.
        async fn stream(&self, limit: Duration) -> RedisResult<TlsStream<TcpStream>> {
            let tcp =
                tokio::time::timeout(limit, TcpStream::connect((self.host.as_str(), self.port)))
                    .await
                    .map_err(|_| {
                        timed_out(format!("connecting to {}:{}", self.host, self.port), limit)
                    })??;
            tcp.set_nodelay(true)?;
            let handshake =
                TlsConnector::from(self.config.clone()).connect(self.server_name.clone(), tcp);
            // Errors name TLS, so that a plain server behind a rediss://
            // URL is reported as a TLS failure. Such a server never answers
            // the handshake: it waits for the end of an inline command.
            match tokio::time::timeout(limit, handshake).await {
                Ok(Ok(stream)) => Ok(stream),
                Ok(Err(e)) => Err(RedisError::from(io::Error::new(
                    e.kind(),
                    format!("TLS handshake with {}:{} failed: {e}", self.host, self.port),
                ))),
                Err(_) => Err(RedisError::from(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "TLS handshake with {}:{} did not finish within {limit:?} (if the \
                         server does not use TLS on this port, use redis://)",
                        self.host, self.port
                    ),
                ))),
            }
        }

        /// A multiplexed connection with `config`, its driver spawned.
        pub async fn multiplexed(
            &self,
            limit: Duration,
            config: AsyncConnectionConfig,
        ) -> RedisResult<MultiplexedConnection> {
            let stream = self.stream(limit).await?;
            let setup = MultiplexedConnection::new_with_config(&self.redis, stream, config);
            let (conn, driver) = tokio::time::timeout(limit, setup)
                .await
                .map_err(|_| timed_out("setting up the connection".into(), limit))??;
            tokio::spawn(driver);
            Ok(conn)
        }

        pub async fn pubsub(&self, limit: Duration) -> RedisResult<PubSub> {
            let stream = self.stream(limit).await?;
            tokio::time::timeout(limit, PubSub::new(&self.redis, stream))
                .await
                .map_err(|_| timed_out("setting up a pub/sub connection".into(), limit))?
        }
    }

    fn timed_out(what: String, limit: Duration) -> RedisError {
        RedisError::from(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("{what} timed out after {limit:?}"),
        ))
    }

    /// One multiplexed connection over TLS, opened at the first call and
    /// again after it drops (a [`redis::aio::ConnectionManager`] of our
    /// own, without replaying anything).
    pub(crate) struct TlsConnection {
        endpoint: Arc<TlsEndpoint>,
        connect_timeout: Duration,
        current: tokio::sync::Mutex<Option<MultiplexedConnection>>,
    }

    impl TlsConnection {
        pub fn new(endpoint: Arc<TlsEndpoint>, connect_timeout: Duration) -> Self {
            TlsConnection {
                endpoint,
                connect_timeout,
                current: tokio::sync::Mutex::new(None),
            }
        }

        pub fn db(&self) -> i64 {
            self.endpoint.redis.db()
        }

        /// The open connection, or a new one. Callers that arrive while a
        /// connection is being opened wait for it instead of opening their own.
        async fn get(&self) -> RedisResult<MultiplexedConnection> {
            let mut current = self.current.lock().await;
            if let Some(conn) = current.as_ref() {
                return Ok(conn.clone());
            }
            let stream = self.endpoint.stream(self.connect_timeout).await?;
            // The limit is each call's (see `Connection::within`).
            let config = AsyncConnectionConfig::new().set_response_timeout(None);
            let setup =
                MultiplexedConnection::new_with_config(&self.endpoint.redis, stream, config);
            let (conn, driver) = tokio::time::timeout(self.connect_timeout, setup)
                .await
                .map_err(|_| {
                    timed_out("setting up the connection".into(), self.connect_timeout)
                })??;
            tokio::spawn(driver);
            *current = Some(conn.clone());
            Ok(conn)
        }

        /// Forget a connection that failed, so the next call opens a new one.
        async fn forget_if_broken(&self, err: &RedisError) {
            if err.is_unrecoverable_error() || err.is_connection_dropped() || err.is_io_error() {
                *self.current.lock().await = None;
            }
        }

        /// `cmd`, its reply awaited up to `limit` once connected
        /// (connecting has its own timeouts).
        pub async fn command(&self, cmd: &Cmd, limit: Duration) -> RedisResult<Value> {
            let mut conn = self.get().await?;
            let result = super::bounded(limit, conn.req_packed_command(cmd)).await;
            if let Err(err) = &result {
                self.forget_if_broken(err).await;
            }
            result
        }

        pub async fn commands(
            &self,
            pipeline: &Pipeline,
            offset: usize,
            count: usize,
            limit: Duration,
        ) -> RedisResult<Vec<Value>> {
            let mut conn = self.get().await?;
            let call = conn.req_packed_commands(pipeline, offset, count);
            let result = super::bounded(limit, call).await;
            if let Err(err) = &result {
                self.forget_if_broken(err).await;
            }
            result
        }
    }
}
