//! PostgreSQL: a lease row per election, in tables tenure owns.
//!
//! # Why functions, one call per operation
//!
//! Every operation of the seam is one call of a PL/pgSQL function that
//! tenure installs (`schema.sql`), as on Redis every operation is one Lua
//! script: the function reads and writes an election's rows atomically,
//! under their row locks, and reads the **server's** clock
//! (`clock_timestamp()`) after taking them, so the operations on one
//! election run one after the other, each at a later instant. A call is an
//! autocommit statement sent as an unnamed statement: nothing lives in the
//! session (no session advisory lock, no prepared statement, no open
//! transaction), so it works through a pooler in transaction mode.
//!
//! # What a restart, a restore and a failover do
//!
//! A lease row is durable, but a server may still lose leases: a restore
//! from an older copy, a failover to a replica that had not received the
//! latest commits, the tables emptied or made anew. Each of them changes
//! the **epoch** (`tenure_epoch()`): the system identifier, the
//! postmaster's start time and the files of the lease tables. An epoch
//! new to an election grants no new term there until the largest ttl in
//! use has passed since it first answered a call, as a restarted Redis
//! does (see `acquire.lua`). A crash restart keeps the postmaster (and the
//! epoch), so tenure's writes never commit with `synchronous_commit = off`.
//!
//! # Hints
//!
//! The functions announce acquisitions, releases and renewals with
//! `pg_notify` on the channel `tenure`; one session connection per store
//! listens (`LISTEN tenure`) and turns them into each election's
//! [`Notices`]. Through a pooler in transaction mode a `LISTEN` hears
//! nothing; followers then wake at the lease's expiry, as with any lost
//! hint.

mod listen;

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures_util::future::join_all;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, Row};

use super::address::Address;
use super::op::{Hints, Op, Reply, RunRecord};
use super::options::{PostgresBugs, TlsFiles};
use crate::error::{copy_error, one_line};
use crate::machine::{AcquireReply, RenewReply};
use crate::term::Holder;
use crate::{Error, Result};

/// The schema this version of tenure writes and reads (the `schema` row of
/// `tenure_meta`).
const SCHEMA_VERSION: &str = "1";

/// tenure's tables and functions on PostgreSQL, as SQL: what tenure runs
/// itself when they are missing and its role may create tables. For a
/// least-privilege role, an owner runs it first (a migration), then grants
/// the role [`POSTGRES_GRANTS`].
///
/// ```
/// // A migration, run by the owner of the schema (psql, a migration tool).
/// assert!(tenure::POSTGRES_SCHEMA.contains("CREATE TABLE IF NOT EXISTS tenure_leases"));
/// assert!(tenure::POSTGRES_SCHEMA.contains("FUNCTION tenure_acquire("));
/// ```
pub const POSTGRES_SCHEMA: &str = include_str!("schema.sql");

/// The least a PostgreSQL role needs on tenure's tables, once they exist
/// ([`POSTGRES_SCHEMA`]): elections, partition sets, `tenure status` and
/// `watch`, and the `--at-most-every` marker. The functions are
/// executable by every role, as PostgreSQL's functions are by default.
///
/// ```
/// let grant = format!("GRANT {} TO app", tenure::POSTGRES_GRANTS);
/// assert!(grant.starts_with("GRANT SELECT, INSERT, UPDATE, DELETE ON tenure_meta"));
/// ```
pub const POSTGRES_GRANTS: &str = "SELECT, INSERT, UPDATE, DELETE ON tenure_meta, \
     tenure_elections, tenure_leases, tenure_witnesses, tenure_members, tenure_runs";

/// How a connection is made: plain TCP, or TLS verified by rustls.
#[derive(Clone)]
enum Tls {
    Plain,
    Rustls(tokio_postgres_rustls::MakeRustlsConnect),
}

/// How to reach the server, shared by the calls' connection and the
/// listener's.
pub(crate) struct Target {
    config: tokio_postgres::Config,
    tls: Tls,
    /// The URL without its password, for messages.
    url: String,
    call_timeout: Duration,
}

impl Target {
    /// Open a connection, its driver spawned; one line of error naming
    /// what went wrong (unreachable, credentials, TLS, database).
    async fn open(&self) -> Result<Client> {
        let connected = match &self.tls {
            Tls::Plain => {
                self.config
                    .connect(tokio_postgres::NoTls)
                    .await
                    .map(|(client, connection)| {
                        tokio::spawn(connection);
                        client
                    })
            }
            Tls::Rustls(tls) => {
                self.config
                    .connect(tls.clone())
                    .await
                    .map(|(client, connection)| {
                        tokio::spawn(connection);
                        client
                    })
            }
        };
        connected.map_err(|err| self.connect_error(err))
    }

    /// [`Target::open`] within the call timeout.
    async fn open_within(&self) -> Result<Client> {
        match tokio::time::timeout(self.call_timeout, self.open()).await {
            Ok(opened) => opened,
            Err(_) => Err(Error::Unreachable {
                url: self.url.clone(),
                detail: format!("no connection within {:?}", self.call_timeout),
            }),
        }
    }

    fn connect_error(&self, err: tokio_postgres::Error) -> Error {
        let url = self.url.clone();
        if let Some(db) = err.as_db_error() {
            let detail = one_line(db.message());
            let code = db.code();
            if *code == SqlState::INVALID_PASSWORD
                || *code == SqlState::INVALID_AUTHORIZATION_SPECIFICATION
            {
                return Error::Auth { url, detail };
            }
            if *code == SqlState::INVALID_CATALOG_NAME {
                return Error::Config(format!("{url}: {detail}"));
            }
            return self.error(err);
        }
        let text = error_text(&err);
        if text.contains("TLS") || text.contains("tls") || text.contains("certificate") {
            return Error::Tls { url, detail: text };
        }
        if text.contains("password missing") {
            return Error::Auth {
                url,
                detail: "the server asks for a password and the URL has none (or use \
                         --password-file)"
                    .into(),
            };
        }
        if text.contains("unexpected message") || text.contains("invalid message") {
            return Error::NotTheStore { url };
        }
        Error::Unreachable { url, detail: text }
    }

    /// The error of a call: one line, classified.
    fn error(&self, err: tokio_postgres::Error) -> Error {
        if let Some(db) = err.as_db_error() {
            let code = db.code();
            let detail = one_line(db.message());
            if *code == SqlState::INSUFFICIENT_PRIVILEGE {
                return Error::Auth {
                    url: self.url.clone(),
                    detail: format!(
                        "{detail} (the role needs tenure's grants: the book's PostgreSQL page)"
                    ),
                };
            }
            if *code == SqlState::READ_ONLY_SQL_TRANSACTION {
                return Error::Postgres {
                    detail: format!("{detail} (the server is a read-only standby)"),
                };
            }
            if *code == SqlState::UNDEFINED_TABLE || *code == SqlState::UNDEFINED_FUNCTION {
                return Error::Postgres {
                    detail: format!(
                        "{detail} (tenure's tables or functions were dropped: a new connection \
                         installs them again, or an owner runs `tenure schema postgres`)"
                    ),
                };
            }
            return Error::Postgres {
                detail: format!("{} ({})", detail, code.code()),
            };
        }
        Error::Postgres {
            detail: error_text(&err),
        }
    }
}

/// A client error with its causes, on one line.
fn error_text(err: &tokio_postgres::Error) -> String {
    let mut text = err.to_string();
    let mut source = std::error::Error::source(err);
    while let Some(cause) = source {
        let cause = cause.to_string();
        if !text.contains(&cause) {
            text = format!("{text}: {cause}");
        }
        source = cause_of(source);
    }
    one_line(&text)
}

fn cause_of<'a>(
    err: Option<&'a (dyn std::error::Error + 'static)>,
) -> Option<&'a (dyn std::error::Error + 'static)> {
    err.and_then(std::error::Error::source)
}

/// A PostgreSQL server that keeps elections (see the module docs).
pub(crate) struct PostgresStore {
    target: Arc<Target>,
    bugs: PostgresBugs,
    /// The calls' connections ([`LANES`]), each pipelined, opened when
    /// first needed and again after it broke or a call timed out. A batch
    /// goes to the first; a large one (a partition set's acquisitions) is
    /// split over all, so that the server runs its parts on several
    /// cores.
    lanes: [Lane; LANES],
    hints: Arc<listen::Registry>,
    stop: tokio_util::sync::CancellationToken,
}

/// How many connections a store's calls may use.
const LANES: usize = 3;

/// A batch of more operations than this is split over the lanes but the
/// first.
const SPLIT_ABOVE: usize = 64;

/// One connection of a store's calls.
#[derive(Default)]
struct Lane {
    client: Mutex<Option<Arc<Client>>>,
    opening: tokio::sync::Mutex<()>,
}

impl Drop for PostgresStore {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

fn int(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

fn uint(value: i64) -> u64 {
    u64::try_from(value).unwrap_or(0)
}

fn millis(value: i64) -> Duration {
    Duration::from_millis(uint(value))
}

/// The URL as tokio-postgres reads it: `sslmode` `verify-full` and
/// `verify-ca` become `require` (rustls always verifies the certificate
/// and the host name); `prefer` and `allow`, which fall back to plain text
/// silently, are refused. The TLS asked for, and the URL to parse.
fn tls_of_url(url: &str, redacted: &str) -> Result<(bool, String)> {
    let Some((base, query)) = url.split_once('?') else {
        return Ok((false, url.to_string()));
    };
    let mut tls = false;
    let mut kept = Vec::new();
    for pair in query.split('&') {
        match pair.split_once('=') {
            Some(("sslmode", mode)) => match mode {
                "disable" => tls = false,
                "require" | "verify-ca" | "verify-full" => tls = true,
                other => {
                    return Err(Error::Config(format!(
                        "{redacted}: sslmode={other} is not supported: say sslmode=require \
                         (TLS, the certificate and host name verified) or sslmode=disable \
                         (plain TCP); `prefer` would fall back to plain text unnoticed"
                    )))
                }
            },
            _ => kept.push(pair),
        }
    }
    let url = if kept.is_empty() {
        base.to_string()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    Ok((tls, url))
}

impl PostgresStore {
    /// Connect to the server at `url`, install tenure's schema if it is
    /// missing, and start listening for announcements.
    pub async fn connect(
        url: &str,
        files: TlsFiles,
        call_timeout: Duration,
        bugs: PostgresBugs,
    ) -> Result<PostgresStore> {
        let redacted = crate::redact_url(url);
        let (tls, parsed) = tls_of_url(url, &redacted)?;
        let mut config = tokio_postgres::Config::from_str(&parsed).map_err(|err| {
            Error::Config(format!(
                "{redacted} is not a valid PostgreSQL URL: {}",
                one_line(&err.to_string())
            ))
        })?;
        if config.get_hosts().len() != 1 {
            return Err(Error::Config(format!(
                "{redacted} must name exactly one host: with several, two processes may \
                 reach two servers that are not one store (name the primary, or an address \
                 that follows it)"
            )));
        }
        if files.cert.is_some() || files.key.is_some() {
            return Err(Error::Config(format!(
                "a client certificate is for etcds:// clusters only; {redacted} is a \
                 PostgreSQL URL (it authenticates with a password)"
            )));
        }
        let tls = if tls {
            let roots = match &files.ca {
                Some(path) => super::options::ca_file_roots(path),
                None => super::options::native_roots(),
            }
            .map_err(|detail| Error::Tls {
                url: redacted.clone(),
                detail,
            })?;
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let tls_config = rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .map_err(|err| Error::Tls {
                    url: redacted.clone(),
                    detail: err.to_string(),
                })?
                .with_root_certificates(roots)
                .with_no_client_auth();
            config.ssl_mode(tokio_postgres::config::SslMode::Require);
            Tls::Rustls(tokio_postgres_rustls::MakeRustlsConnect::new(tls_config))
        } else {
            if files.ca.is_some() {
                return Err(Error::Config(format!(
                    "a CA file was given, but {redacted} does not ask for TLS (add \
                     ?sslmode=require)"
                )));
            }
            config.ssl_mode(tokio_postgres::config::SslMode::Disable);
            Tls::Plain
        };
        if config.get_application_name().is_none() {
            config.application_name("tenure");
        }
        config.connect_timeout(call_timeout);
        config.keepalives_idle(Duration::from_secs(10));
        let target = Arc::new(Target {
            config,
            tls,
            url: redacted,
            call_timeout,
        });
        let client = target.open_within().await?;
        // A lock on tenure's tables, or a stuck installer, must not hang
        // the builder.
        let checks = async {
            install(&target, &client).await?;
            one_copy(&target, &client).await?;
            // Unnamed statements only (`query_typed`): a named one is
            // prepared on one server connection of a pooler in
            // transaction mode and run on another.
            client
                .query_typed_one("SELECT pg_is_in_recovery()", &[])
                .await
                .map_err(|err| target.error(err))
        };
        let limit = (call_timeout * 10).max(Duration::from_secs(10));
        let standby = tokio::time::timeout(limit, checks)
            .await
            .map_err(|_| Error::Timeout(limit))??;
        if standby.try_get::<_, bool>(0).unwrap_or(false) {
            return Err(Error::Unsafe {
                url: target.url.clone(),
                detail: "the server is a read-only standby; name the primary".into(),
            });
        }
        warm_up(&client, call_timeout).await;
        let stop = tokio_util::sync::CancellationToken::new();
        let hints = Arc::new(listen::Registry::default());
        tokio::spawn(listen::run(
            target.clone(),
            hints.clone(),
            stop.child_token(),
        ));
        Ok(PostgresStore {
            target,
            bugs,
            lanes: {
                let lanes: [Lane; LANES] = Default::default();
                *lanes[0]
                    .client
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner) = Some(Arc::new(client));
                lanes
            },
            hints,
            stop,
        })
    }

    /// The URL, without its password.
    pub fn url(&self) -> &str {
        &self.target.url
    }

    /// The election at `at`: its announcements.
    pub fn election(&self, at: Address<'_>) -> Hints {
        self.hints.subscribe(at.prefix, at.name)
    }

    /// Drop the calls' connection (after a timeout): the next call opens
    /// another. What it still runs in the server is cancelled: a call
    /// waiting behind a lock would otherwise run on (a backend does not
    /// see its client gone until it next reads), and commit for nobody.
    pub fn reset(&self) {
        for lane in 0..LANES {
            self.reset_lane(lane);
        }
    }

    fn reset_lane(&self, lane: usize) {
        let dropped = self.lanes[lane]
            .client
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        let (Some(client), Ok(runtime)) = (dropped, tokio::runtime::Handle::try_current()) else {
            return;
        };
        let cancel = client.cancel_token();
        let (tls, limit) = (self.target.tls.clone(), self.target.call_timeout);
        runtime.spawn(async move {
            let cancelled = async {
                match tls {
                    Tls::Plain => cancel.cancel_query(tokio_postgres::NoTls).await,
                    Tls::Rustls(tls) => cancel.cancel_query(tls).await,
                }
            };
            // Best effort: without it, the call runs once the lock is
            // free, and its outcome was unknown to the caller anyway.
            let _ = tokio::time::timeout(limit, cancelled).await;
        });
    }

    /// The first lane's connection.
    async fn client(&self) -> Result<Arc<Client>> {
        self.client_of(0).await
    }

    async fn client_of(&self, lane: usize) -> Result<Arc<Client>> {
        let lane = &self.lanes[lane];
        let current = lane
            .client
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        if let Some(client) = current.filter(|c| !c.is_closed()) {
            return Ok(client);
        }
        let _opening = lane.opening.lock().await;
        if let Some(client) = lane
            .client
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
            .filter(|c| !c.is_closed())
        {
            return Ok(client);
        }
        let client = Arc::new(self.target.open_within().await?);
        warm_up(&client, self.target.call_timeout).await;
        *lane.client.lock().unwrap_or_else(PoisonError::into_inner) = Some(client.clone());
        Ok(client)
    }

    /// Names of the elections under `prefix` with a live lease, sorted.
    pub async fn list_elections(&self, prefix: &str) -> Result<Vec<String>> {
        let client = self.client().await?;
        let params: [(&(dyn ToSql + Sync), Type); 1] = [(&prefix, Type::TEXT)];
        let rows = self
            .within(client.query_typed("SELECT tenure_elections_of($1)", &params))
            .await?;
        rows.iter()
            .map(|row| {
                row.try_get::<_, String>(0)
                    .map_err(|err| self.target.error(err))
            })
            .collect()
    }

    /// A call within the call timeout; a timeout drops the connection.
    async fn within<T>(
        &self,
        call: impl std::future::Future<Output = std::result::Result<T, tokio_postgres::Error>>,
    ) -> Result<T> {
        match tokio::time::timeout(self.target.call_timeout, call).await {
            Ok(done) => done.map_err(|err| self.target.error(err)),
            Err(_) => {
                self.reset();
                Err(Error::Timeout(self.target.call_timeout))
            }
        }
    }

    /// Carry out `ops`, each an autocommit call, pipelined on one
    /// connection: the first lane for a small batch (renewals, a single
    /// operation), the others, in parts, for a large one (a partition
    /// set's acquisitions), so that bulk work neither waits behind nor
    /// delays a renewal and runs on several of the server's cores.
    ///
    /// Every operation has the call timeout from the batch's start: one
    /// that did not answer by then is a timeout of its own (its outcome
    /// unknown, its connection dropped and its statement cancelled), and
    /// those that answered keep their replies, so a large batch on a slow
    /// server still makes progress. The batch fails as a whole only when
    /// no connection could be had.
    pub async fn batch(
        &self,
        ops: &[Op<'_>],
        round_trips: &AtomicU64,
    ) -> Result<Vec<Result<Reply>>> {
        let limit = self.target.call_timeout;
        let deadline = tokio::time::Instant::now() + limit;
        let parts: Vec<(usize, &[Op<'_>])> = if ops.len() > SPLIT_ABOVE {
            ops.chunks(ops.len().div_ceil(LANES - 1))
                .enumerate()
                .map(|(i, part)| (i + 1, part))
                .collect()
        } else {
            vec![(0, ops)]
        };
        let runs = parts.iter().map(|&(lane, part)| async move {
            let client = match tokio::time::timeout_at(deadline, self.client_of(lane)).await {
                Ok(Ok(client)) => client,
                Ok(Err(err)) => return Err(err),
                Err(_) => return Err(Error::Timeout(limit)),
            };
            round_trips.fetch_add(1, Ordering::Relaxed);
            let replies = join_all(part.iter().map(|op| {
                let client = &client;
                async move {
                    match tokio::time::timeout_at(deadline, self.apply(client, op)).await {
                        Ok(reply) => reply,
                        Err(_) => Err(Error::Timeout(limit)),
                    }
                }
            }))
            .await;
            let timed_out = replies
                .iter()
                .any(|reply| matches!(reply, Err(Error::Timeout(_))));
            if timed_out || client.is_closed() {
                self.reset_lane(lane);
            }
            Ok(replies)
        });
        let outcomes = join_all(runs).await;
        if outcomes.iter().all(Result::is_err) {
            if let Some(Err(err)) = outcomes.into_iter().next() {
                return Err(err);
            }
            return Err(Error::internal("a batch of no operations"));
        }
        let mut replies = Vec::with_capacity(ops.len());
        for (outcome, (_, part)) in outcomes.into_iter().zip(&parts) {
            match outcome {
                Ok(part_replies) => replies.extend(part_replies),
                Err(err) => replies.extend(part.iter().map(|_| Err(copy_error(&err)))),
            }
        }
        Ok(replies)
    }

    async fn apply(&self, client: &Client, op: &Op<'_>) -> Result<Reply> {
        let err = |err| self.target.error(err);
        match *op {
            Op::Heartbeat {
                group,
                member,
                ttl_ms,
                join,
            } => {
                let ttl = int(ttl_ms);
                let row = client
                    .query_typed_one(
                        "SELECT tenure_heartbeat($1, $2, $3, $4, $5)",
                        &[
                            (&group.prefix, Type::TEXT),
                            (&group.name, Type::TEXT),
                            (&member, Type::TEXT),
                            (&ttl, Type::INT8),
                            (&join, Type::BOOL),
                        ],
                    )
                    .await
                    .map_err(err)?;
                let members: Vec<String> = row.try_get(0).map_err(err)?;
                Ok(Reply::Members {
                    members,
                    phantoms: 0,
                })
            }
            Op::Acquire { at, request } => {
                let (ttl, hold_off) = (int(request.ttl_ms), int(request.hold_off_ms));
                let ignore = self.bugs.ignore_epoch;
                let row = client
                    .query_typed_one(
                        "SELECT * FROM tenure_acquire($1, $2, $3, $4, $5, $6, $7)",
                        &[
                            (&at.prefix, Type::TEXT),
                            (&at.name, Type::TEXT),
                            (&request.id, Type::TEXT),
                            (&request.attempt, Type::TEXT),
                            (&ttl, Type::INT8),
                            (&hold_off, Type::INT8),
                            (&ignore, Type::BOOL),
                        ],
                    )
                    .await
                    .map_err(err)?;
                let outcome: i32 = row.try_get(0).map_err(err)?;
                let reply = match outcome {
                    1 => AcquireReply::Won {
                        token: uint(row.try_get(1).map_err(err)?),
                    },
                    2 => AcquireReply::HoldOff {
                        wait: millis(row.try_get(3).map_err(err)?),
                    },
                    _ => AcquireReply::Held(self.holder(&row, 1)?),
                };
                Ok(Reply::Acquire(reply))
            }
            Op::Renew {
                at,
                id,
                token,
                ttl_ms,
                announce,
            } => Ok(Reply::Renew(
                self.renew(client, at, id, token, ttl_ms, announce).await?,
            )),
            Op::RenewMany {
                prefix,
                id,
                ttl_ms,
                terms,
            } => {
                let names: Vec<&str> = terms.iter().map(|(name, _)| *name).collect();
                let tokens: Vec<i64> = terms.iter().map(|(_, token)| int(*token)).collect();
                let ttl = int(ttl_ms);
                let rows = client
                    .query_typed(
                        "SELECT renewed_name FROM tenure_renew_many($1, $2, $3, $4, $5)",
                        &[
                            (&prefix, Type::TEXT),
                            (&id, Type::TEXT),
                            (&ttl, Type::INT8),
                            (&names, Type::TEXT_ARRAY),
                            (&tokens, Type::INT8_ARRAY),
                        ],
                    )
                    .await
                    .map_err(err)?;
                let mut renewed = HashMap::with_capacity(rows.len());
                for row in &rows {
                    renewed.insert(row.try_get::<_, String>(0).map_err(err)?, ());
                }
                // Those not renewed (lost, taken, expired: rare, but many at
                // once after a failover) are told apart one by one, the
                // calls pipelined.
                let replies = join_all(terms.iter().map(|(name, token)| {
                    let renewed = renewed.contains_key(*name);
                    async move {
                        if renewed {
                            Ok(RenewReply::Renewed)
                        } else {
                            let at = Address::new(prefix, name);
                            self.renew(client, at, id, *token, ttl_ms, false).await
                        }
                    }
                }))
                .await;
                Ok(Reply::RenewMany(replies))
            }
            Op::Resign { at, id, token } => {
                let token = int(token);
                let row = client
                    .query_typed_one(
                        "SELECT tenure_resign($1, $2, $3, $4)",
                        &[
                            (&at.prefix, Type::TEXT),
                            (&at.name, Type::TEXT),
                            (&id, Type::TEXT),
                            (&token, Type::INT8),
                        ],
                    )
                    .await
                    .map_err(err)?;
                Ok(Reply::Resign(row.try_get(0).map_err(err)?))
            }
            Op::Inspect { at } => {
                let row = client
                    .query_typed_opt(
                        "SELECT * FROM tenure_inspect($1, $2)",
                        &[(&at.prefix, Type::TEXT), (&at.name, Type::TEXT)],
                    )
                    .await
                    .map_err(err)?;
                Ok(Reply::Inspect(match row {
                    Some(row) => Some(self.holder(&row, 0)?),
                    None => None,
                }))
            }
            Op::LastRun { at } => {
                let row = client
                    .query_typed_opt(
                        "SELECT age_ms, slot FROM tenure_run_marker($1, $2)",
                        &[(&at.prefix, Type::TEXT), (&at.name, Type::TEXT)],
                    )
                    .await
                    .map_err(err)?;
                let record = match row {
                    None => None,
                    Some(row) => {
                        let age: i64 = row.try_get(0).map_err(err)?;
                        let slot: Option<i64> = row.try_get(1).map_err(err)?;
                        let slot = slot
                            .map(|slot| {
                                u64::try_from(slot).map_err(|_| Error::ForeignData {
                                    key: format!("tenure_runs row {}/{}", at.prefix, at.name),
                                    detail: format!("a slot before 1970 ({slot} ms)"),
                                })
                            })
                            .transpose()?;
                        Some(RunRecord {
                            age: millis(age),
                            slot,
                        })
                    }
                };
                Ok(Reply::LastRun(record))
            }
            Op::RecordRun {
                at,
                id,
                token,
                keep_ms,
                slot,
            } => {
                let (token, keep) = (int(token), int(keep_ms));
                let slot = slot.map(int);
                let row = client
                    .query_typed_one(
                        "SELECT tenure_record_run($1, $2, $3, $4, $5, $6)",
                        &[
                            (&at.prefix, Type::TEXT),
                            (&at.name, Type::TEXT),
                            (&id, Type::TEXT),
                            (&token, Type::INT8),
                            (&keep, Type::INT8),
                            (&slot, Type::INT8),
                        ],
                    )
                    .await
                    .map_err(err)?;
                Ok(Reply::RecordRun(row.try_get(0).map_err(err)?))
            }
        }
    }

    async fn renew(
        &self,
        client: &Client,
        at: Address<'_>,
        id: &str,
        token: u64,
        ttl_ms: u64,
        announce: bool,
    ) -> Result<RenewReply> {
        let err = |err| self.target.error(err);
        let (token, ttl) = (int(token), int(ttl_ms));
        let row = client
            .query_typed_one(
                "SELECT * FROM tenure_renew($1, $2, $3, $4, $5, $6)",
                &[
                    (&at.prefix, Type::TEXT),
                    (&at.name, Type::TEXT),
                    (&id, Type::TEXT),
                    (&token, Type::INT8),
                    (&ttl, Type::INT8),
                    (&announce, Type::BOOL),
                ],
            )
            .await
            .map_err(err)?;
        let outcome: i32 = row.try_get(0).map_err(err)?;
        if outcome == 1 {
            return Ok(RenewReply::Renewed);
        }
        let owner: Option<String> = row.try_get(2).map_err(err)?;
        Ok(RenewReply::NotOwner(match owner {
            Some(_) => Some(self.holder(&row, 1)?),
            None => None,
        }))
    }

    /// A holder from columns token, owner, ttl_left, since_ms, attempt,
    /// lease_ttl, starting at column `first`.
    fn holder(&self, row: &Row, first: usize) -> Result<Holder> {
        let err = |err| self.target.error(err);
        Ok(Holder {
            token: uint(row.try_get(first).map_err(err)?),
            id: row.try_get(first + 1).map_err(err)?,
            ttl_left: millis(row.try_get(first + 2).map_err(err)?),
            since_ms: uint(row.try_get(first + 3).map_err(err)?),
            attempt: row.try_get(first + 4).map_err(err)?,
            ttl: millis(row.try_get(first + 5).map_err(err)?),
        })
    }
}

/// Compile, in a new session, the functions a hand-over runs and that can
/// be called to no effect (a resign and a renewal of a term that does not
/// exist): PL/pgSQL compiles a function at its first call in a session,
/// which took 1–6 ms, and a leader resigns once per session at most.
/// Errors are left to the real calls to report.
async fn warm_up(client: &Client, limit: Duration) {
    let calls = client.batch_execute(
        "SELECT tenure_resign('', '', '', 0); SELECT * FROM tenure_renew('', '', '', 0, 0, false)",
    );
    let _ = tokio::time::timeout(limit, calls).await;
}

/// Install tenure's schema when it is missing, and check the one found:
/// its version, and that `tenure_meta` is tenure's.
async fn install(target: &Target, client: &Client) -> Result<()> {
    let found = client
        .query_typed_opt("SELECT value FROM tenure_meta WHERE key = 'schema'", &[])
        .await;
    let version: Option<String> = match found {
        Ok(row) => row.and_then(|row| row.try_get(0).ok()),
        Err(err) if err.code() == Some(&SqlState::UNDEFINED_TABLE) => None,
        Err(err) if err.code() == Some(&SqlState::UNDEFINED_COLUMN) => {
            return Err(Error::ForeignData {
                key: "table tenure_meta".into(),
                detail: "a table tenure did not create (no key and value columns)".into(),
            })
        }
        Err(err) => return Err(target.error(err)),
    };
    let complete = client
        .query_typed_one(
            "SELECT to_regprocedure('tenure_acquire(text,text,text,text,bigint,bigint,boolean)') \
             IS NOT NULL AND to_regprocedure('tenure_served(text,bigint)') IS NOT NULL \
             AND to_regprocedure('tenure_record_run(text,text,text,bigint,bigint,bigint)') \
             IS NOT NULL AND to_regprocedure('tenure_run_marker(text,text)') IS NOT NULL",
            &[],
        )
        .await
        .map_err(|err| target.error(err))?
        .try_get::<_, bool>(0)
        .unwrap_or(false);
    match version.as_deref() {
        Some(SCHEMA_VERSION) if complete => Ok(()),
        Some(SCHEMA_VERSION) => create(target, client).await,
        Some(other) => Err(Error::ForeignData {
            key: "table tenure_meta".into(),
            detail: format!(
                "schema version {other:?}, not {SCHEMA_VERSION:?}: written by another version \
                 of tenure"
            ),
        }),
        None => create(target, client).await,
    }
}

/// Create tenure's tables and functions (again, for functions dropped),
/// one installer at a time.
async fn create(target: &Target, client: &Client) -> Result<()> {
    // One installer at a time (CREATE OR REPLACE FUNCTION races
    // itself); the lock ends with the transaction.
    let script =
        format!("BEGIN; SELECT pg_advisory_xact_lock(7365211437); {POSTGRES_SCHEMA}\nCOMMIT;");
    match client.batch_execute(&script).await {
        Ok(()) => {
            tracing::info!(url = %target.url, "installed tenure's tables and functions");
            Ok(())
        }
        Err(err) if err.code() == Some(&SqlState::INSUFFICIENT_PRIVILEGE) => Err(Error::Auth {
            url: target.url.clone(),
            detail: format!(
                "tenure's tables are missing and this role may not create them \
                     ({}): have an owner run tenure's schema and grant the role \
                     tenure's privileges (the book's PostgreSQL page)",
                err.as_db_error()
                    .map_or_else(|| err.to_string(), |db| one_line(db.message()))
            ),
        }),
        Err(err)
            if err.code().is_some_and(|code| {
                *code == SqlState::UNDEFINED_COLUMN
                    || *code == SqlState::DATATYPE_MISMATCH
                    || *code == SqlState::INVALID_COLUMN_REFERENCE
                    || *code == SqlState::WRONG_OBJECT_TYPE
            }) =>
        {
            Err(Error::ForeignData {
                key: "tenure's tables".into(),
                detail: format!(
                    "a table of one of tenure's names that tenure did not create: {}",
                    err.as_db_error()
                        .map_or_else(|| err.to_string(), |db| one_line(db.message()))
                ),
            })
        }
        Err(err) => Err(target.error(err)),
    }
}

/// Refuse a database with tenure's tables in several schemas: roles with
/// different search paths would each keep elections in their own copy,
/// two stores that elect two leaders.
async fn one_copy(target: &Target, client: &Client) -> Result<()> {
    let row = client
        .query_typed_one(
            "SELECT count(*), coalesce(string_agg(n.nspname, ', ' ORDER BY n.nspname), '') \
             FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace \
             WHERE c.relname = 'tenure_leases' AND c.relkind IN ('r', 'p')",
            &[],
        )
        .await
        .map_err(|err| target.error(err))?;
    let copies: i64 = row.try_get(0).map_err(|err| target.error(err))?;
    if copies > 1 {
        let schemas: String = row.try_get(1).map_err(|err| target.error(err))?;
        return Err(Error::Unsafe {
            url: target.url.clone(),
            detail: format!(
                "tenure's tables exist in {copies} schemas of this database ({schemas}): roles \
                 with different search paths would keep two stores and elect two leaders; \
                 keep one copy"
            ),
        });
    }
    Ok(())
}
