//! The etcd backend: the same operations as Redis, on consensus.
//!
//! etcd replicates every write through Raft before it answers, so an
//! acknowledged lease survives the loss of any minority of members, a
//! leader change and a restart of the whole cluster: the store never "forgets"
//! a lease the way a Redis primary without its replica's last writes does.
//! That is what makes it the backend for work that must never see two
//! leaders at once (and why no start-up hold-off is needed here), with one
//! exception in etcd itself: before the fix of etcd issue #15247
//! (backported to 3.4 and 3.5 in February 2024), a raft leader that stalls
//! and resumes may revoke a lease its successor has just renewed. The
//! fault-injection suite finds it on Debian's 3.4.23 by pausing members;
//! fencing tokens make it harmless.
//!
//! **Layout.** Election `NAME` under prefix `PREFIX` is the key
//! `PREFIX/NAME`, created in a transaction only if it does not exist
//! (`create_revision == 0`) and attached to an etcd lease. Its value is
//! `tenure/1`, the ttl (ms), the start (ms since the epoch, the
//! candidate's clock), the attempt nonce, the owner's id and the token,
//! one per line.
//! A partition set `GROUP` keeps its members under
//! `PREFIX/{GROUP}/members/ID`, and an election's last-run marker is
//! `PREFIX/{NAME}/last-run` (names cannot contain braces, so neither ever
//! clashes with an election's key, nor is listed as one).
//!
//! **The last-run marker** ([`Op::RecordRun`]) has no server clock to
//! read: etcd has none that clients can see. So the marker is put on an
//! etcd lease of its own, granted for its keep time (whole seconds, rounded
//! up), and its age is the lease's granted ttl minus its remaining ttl, as
//! etcd's leader counts them: in whole seconds, and counted one second
//! short (etcd rounds the remaining ttl down), so a run is never taken for
//! older than it is. An etcd leader change renews every lease, which makes
//! a marker look younger than it is, which would skip a period; so the
//! marker also names the recorder's clock (ms) at the record, and its age
//! is the larger of the two, the clock's less one second
//! (`CLOCK_SLACK`: hosts whose clocks agree that closely never see a
//! marker older than it is, so a run is never repeated early). The marker
//! is written in one transaction with a check that the election's key is
//! still the recording term's.
//!
//! **The fencing token is counted, not the revision.** A term's token is
//! max(the election's last token + 1, the candidate's clock in ms), kept
//! in a counter key `PREFIX/{NAME}/token` (no lease) that the transaction
//! creating the term writes too, only if the counter is still as the
//! candidate last read it. etcd's revision would rise too, but a restore
//! from an older snapshot rolls it back (and etcd 3.4 cannot bump it), so
//! new terms would repeat the tokens of earlier ones and a fenced
//! resource could not tell them apart. The clock keeps new tokens above
//! every earlier one across such a rollback, as on Redis (with the
//! candidates' clocks, not a server's: etcd shows clients none, so a
//! restore must take longer than the clocks are apart, which it does).
//! The key's value names the token; keys written before it did count
//! their creating revision.
//!
//! **Leases.** Each instance id keeps one etcd lease per ttl (a *session*,
//! like etcd's own `concurrency.Session`): every term of that instance, every
//! partition of a set and the set's membership key hang on it, so one
//! keep-alive renews them all. The local deadline follows the same rule as
//! on Redis: the caller notes the instant *before* it hands an operation to
//! this module, and every grant or keep-alive of the operation is sent after
//! it; a lease that a keep-alive found alive cannot expire on the etcd
//! leader before that keep-alive was received plus the ttl.
//!
//! A term that ends without its release reaching etcd (the release timed
//! out, the deadline passed while etcd was away) would stay: its key hangs
//! on the session lease that the instance's other terms keep alive. So the
//! store remembers the terms it began and deletes the key of any that
//! nobody renewed for a whole ttl ([`EtcdStore::sweep`]).
//!
//! **Only the holder's release lets a candidate in early.** A key can also
//! vanish by hand (`etcdctl del`, `etcdctl lease revoke`), and its holder
//! would act on until it noticed. So every term also writes a *witness*,
//! `PREFIX/{NAME}/witness`, in the transaction that creates its key (so
//! both have the token as their creating revision), on a second session
//! lease of the instance that is kept alive beside the first. A candidate
//! that finds the key gone but the witness there is held off until the
//! witness goes: the holder deletes it in its release, after it stopped
//! (a renewal finds the key gone, and the holder's watch on its own key
//! makes it renew at once); a holder that is cut off or dead stops keeping
//! the witness lease alive, so it runs out no earlier than the holder's
//! deadline. A term holds only while its key and witness both live. A
//! crash costs nothing more: both leases run out together.
//!
//! **Announcements** are an etcd watch on the election's key and witness: a delete
//! (resign, or the lease expiring) wakes followers at once. Like Redis'
//! pub/sub they are hints: the key and its lease are the truth.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, KeyValue, PutOptions, Txn,
    TxnOp, TxnOpResponse, WatchOptions,
};
use futures_util::future::{join_all, FutureExt};
use futures_util::StreamExt;
use tokio::sync::watch;

use super::{Address, Backend, EtcdBugs, Notices, Op, Reply, Store};
mod layout;

use crate::error::one_line;
use crate::machine::{AcquireReply, AcquireRequest, RenewReply};
use crate::term::Holder;
use crate::{redact_url, Error, Result};
use layout::{counter_key, key_dir, last_run_key, lease_key, members_prefix, witness_key};

/// The first line of every value tenure writes.
const MAGIC: &str = "tenure/1";

/// The most terms one transaction of a [`Op::RenewMany`] checks (four
/// compares per term: the key's revision and lease, the witness's revision
/// and lease): etcd refuses transactions of more than 128 operations by
/// default (`--max-txn-ops`).
const TERMS_PER_CHECK: usize = 32;

/// How far apart the hosts' clocks may be for a last-run marker's age by
/// the recorder's clock to be trusted (see [`EtcdStore::last_run`]).
const CLOCK_SLACK: Duration = Duration::from_secs(1);

/// How many times [`EtcdStore::call`] sends a call that could not connect.
const SENDS: u32 = 4;

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
struct EtcdUrl {
    endpoints: Vec<String>,
    user: Option<(String, String)>,
    tls: bool,
}

impl EtcdTarget {
    pub fn redacted(&self) -> String {
        redact_url(&self.url)
    }

    fn parse(&self) -> Result<EtcdUrl> {
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

    fn tls_options(&self, parsed: &EtcdUrl) -> Result<Option<etcd_tls::Options>> {
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
        etcd_tls::options(self).map(Some).map_err(tls_error)
    }
}

#[cfg(feature = "tls")]
mod etcd_tls {
    pub type Options = etcd_client::TlsOptions;

    /// TLS settings of an `etcds://` store: the CA file (else the system's
    /// roots) and the client certificate, if any.
    pub fn options(target: &super::EtcdTarget) -> Result<Options, String> {
        let read = |path: &std::path::Path, what: &str| {
            std::fs::read(path)
                .map_err(|e| format!("cannot read the {what} {}: {e}", path.display()))
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
            _ => {
                return Err("a client certificate needs its key, and a key its certificate".into())
            }
        }
        Ok(options)
    }
}

#[cfg(not(feature = "tls"))]
mod etcd_tls {
    pub type Options = ();

    pub fn options(_: &super::EtcdTarget) -> Result<Options, String> {
        Err("etcds:// needs tenure built with its `tls` feature".into())
    }
}

/// An etcd cluster: the client (one HTTP/2 connection per member, requests
/// balanced over them) and the sessions' leases.
pub(crate) struct EtcdStore {
    client: Client,
    /// The clients that hedged sends use (see [`send`]).
    clients: Clients,
    url: String,
    call_timeout: Duration,
    /// The session lease of each (instance id, ttl in ms).
    sessions: Mutex<HashMap<(String, u64), i64>>,
    /// Held while a session lease is granted: two operations of one
    /// instance that find no session must not grant two (the terms on the
    /// one not kept would block their elections for a ttl).
    granting: tokio::sync::Mutex<()>,
    /// When each session lease was last granted or found alive by a
    /// keep-alive (about when it was sent): a lease that has lapsed by this
    /// clock is not kept alive but replaced, since etcd holds a keep-alive
    /// of an expired lease until it removes it (up to 500 ms later).
    refreshed: Mutex<HashMap<i64, tokio::time::Instant>>,
    /// The terms this store began and has not seen released, by key: see
    /// [`EtcdStore::sweep`].
    terms: Mutex<HashMap<String, Kept>>,
    /// The token counter of each election as last seen, by counter key:
    /// its mod revision and value (see [`EtcdStore::acquire`]).
    counters: Mutex<HashMap<String, (i64, u64)>>,
    /// Requests sent (every gRPC call, keep-alives included).
    requests: Arc<AtomicU64>,
    /// The cluster every answer must come from: an endpoint list that
    /// spans two clusters would let two terms be granted at once.
    cluster_id: u64,
    bugs: EtcdBugs,
}

/// A term this store began, for [`EtcdStore::sweep`].
#[derive(Debug, Clone, Copy)]
struct Kept {
    token: u64,
    /// The revision that created the term's key (and witness).
    revision: i64,
    lease: i64,
    ttl: Duration,
    /// When the last acquire or renewal of it began: its local deadline is
    /// at most this plus the ttl (minus the margin).
    last: tokio::time::Instant,
}

tokio::task_local! {
    /// The keep-alives sent by the batch being carried out, by lease.
    static KEEP_ALIVES: KeepAlives;
}

/// See [`KEEP_ALIVES`].
#[derive(Default)]
struct KeepAlives(Mutex<HashMap<i64, KeepAliveAnswer>>);

type KeepAliveAnswer = futures_util::future::Shared<
    futures_util::future::BoxFuture<'static, std::result::Result<KeptAlive, Arc<Error>>>,
>;

/// What [`EtcdStore::on_session`] found.
struct Attached {
    lease: i64,
    /// Whether the keep-alive found the lease alive: a key the transaction
    /// attached to it lasts a ttl from then.
    alive: bool,
    answer: etcd_client::TxnResponse,
}

/// The outcome of one keep-alive: positive when the lease lives on (for
/// its granted ttl from when etcd's leader received it), zero when it is
/// gone.
#[derive(Debug, Clone, Copy)]
struct KeptAlive(i64);

impl EtcdStore {
    /// Connect to `target` and check that the cluster answers and accepts
    /// the credentials.
    pub async fn connect(target: EtcdTarget, call_timeout: Duration) -> Result<EtcdStore> {
        let parsed = target.parse()?;
        let url = target.redacted();
        let mut options = ConnectOptions::new()
            .with_connect_timeout(call_timeout)
            .with_timeout(call_timeout)
            // HTTP/2 pings find a dead connection; etcd closes the
            // connection of a client that pings more often than every 5 s
            // (--grpc-keepalive-min-time), breaking its watches.
            .with_keep_alive(Duration::from_secs(10), call_timeout)
            // A member cut off from the quorum refuses at once instead of
            // answering from a stale view.
            .with_require_leader(true)
            // etcd's auth tokens expire (simple tokens after 5 idle
            // minutes): a follower with a long ttl must not be locked out.
            .with_auto_token_refresh(true);
        #[cfg(feature = "tls")]
        if let Some(tls) = target.tls_options(&parsed)? {
            options = options.with_tls(tls);
        }
        #[cfg(not(feature = "tls"))]
        target.tls_options(&parsed)?;
        if let Some((name, password)) = &parsed.user {
            options = options.with_user(name.clone(), password.clone());
        }
        let connected = tokio::time::timeout(
            call_timeout.saturating_mul(2),
            Client::connect(parsed.endpoints.clone(), Some(options.clone())),
        )
        .await;
        let client = match connected {
            Ok(Ok(client)) => client,
            Ok(Err(err)) => return Err(classify_connect(err, &url)),
            Err(_) => {
                return Err(Error::Unreachable {
                    url,
                    detail: format!("no answer within {:?}", call_timeout.saturating_mul(2)),
                })
            }
        };
        // The first call proves the cluster answers (and has a leader).
        let requests = AtomicU64::new(0);
        let patience = call_timeout / 3;
        let alone = Clients::of(&client, target.bugs.no_hedges);
        let status = send(&alone, &requests, patience, |mut c| async move {
            c.status().await
        });
        let status = tokio::time::timeout(call_timeout, status).await;
        let cluster_id = match status {
            Ok(Ok(status)) => status.header().map_or(0, |h| h.cluster_id()),
            Ok(Err(err)) => return Err(classify_connect(err, &url)),
            Err(_) => {
                return Err(Error::Unreachable {
                    url,
                    detail: format!("no answer within {call_timeout:?}"),
                })
            }
        };
        let members = if parsed.endpoints.len() > 1 {
            one_cluster(&parsed.endpoints, &options, call_timeout, &url).await?
        } else {
            Vec::new()
        };
        Ok(EtcdStore {
            clients: Clients {
                members: Arc::new(members),
                ..Clients::of(&client, target.bugs.no_hedges)
            },
            bugs: target.bugs,
            client,
            url,
            call_timeout,
            sessions: Mutex::new(HashMap::new()),
            granting: tokio::sync::Mutex::new(()),
            refreshed: Mutex::new(HashMap::new()),
            terms: Mutex::new(HashMap::new()),
            counters: Mutex::new(HashMap::new()),
            requests: Arc::new(AtomicU64::new(0)),
            cluster_id,
        })
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// Check that `ttl` suits etcd's leases (whole seconds, at least the
    /// cluster's minimum: a lease is granted and revoked to find out), and
    /// that the user may read and write an election's key (or a partition
    /// set's members), without writing anything: etcd checks the
    /// permissions of both branches of a transaction whichever runs.
    pub async fn check(&self, at: Address<'_>, partitions: bool, ttl: Duration) -> Result<()> {
        if ttl.subsec_nanos() != 0 {
            return Err(Error::Config(format!(
                "ttl must be a whole number of seconds on etcd, whose leases count seconds \
                 (got {ttl:?})"
            )));
        }
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        let probe = self.grant(ttl_ms).await?;
        let _ = self
            .call(|mut c| async move { c.lease_revoke(probe).await })
            .await;
        let probed = if partitions {
            vec![members_prefix(at)?]
        } else {
            vec![lease_key(at)?, witness_key(at)?, counter_key(at)?]
        };
        for key in probed {
            let txn = Txn::new()
                .when([Compare::create_revision(key.clone(), CompareOp::Less, 0)])
                // Deleting needs the same (write) permission as putting.
                .and_then([TxnOp::put(key.clone(), "", None)])
                .or_else([TxnOp::get(
                    key.clone(),
                    Some(GetOptions::new().with_count_only()),
                )]);
            self.txn(txn).await?;
        }
        Ok(())
    }

    /// An election's storage on this cluster: its key and a watch on it.
    pub async fn election(self: &Arc<Self>, at: Address<'_>, ttl: Duration) -> Result<Backend> {
        self.check(at, false, ttl).await?;
        let (notices, watcher) = self.watch(vec![lease_key(at)?, witness_key(at)?]);
        Ok(Backend::new(
            Store::Etcd(self.clone()),
            at,
            notices,
            Some(Box::new(watcher)),
        ))
    }

    /// Carry out `ops`, all at once; each has its own outcome (there is no
    /// round trip shared by all of them to fail as a whole).
    pub async fn batch(
        &self,
        ops: &[Op<'_>],
        round_trips: &AtomicU64,
    ) -> Result<Vec<Result<Reply>>> {
        let before = self.requests.load(Ordering::Relaxed);
        // Every operation of the batch that keeps a session lease alive
        // shares one keep-alive of it: all of them began after the
        // caller's send instant, and so did that keep-alive.
        let replies = KEEP_ALIVES
            .scope(
                KeepAlives::default(),
                join_all(ops.iter().map(|op| self.apply(op))),
            )
            .await;
        round_trips.fetch_add(
            self.requests.load(Ordering::Relaxed).saturating_sub(before),
            Ordering::Relaxed,
        );
        Ok(replies)
    }

    async fn apply(&self, op: &Op<'_>) -> Result<Reply> {
        let bounded = tokio::time::timeout(self.call_timeout, async {
            match *op {
                Op::Heartbeat {
                    group,
                    member,
                    ttl_ms,
                    join,
                } => self.heartbeat(group, member, ttl_ms, join).await,
                Op::Acquire { at, request } => self.acquire(at, &request).await.map(Reply::Acquire),
                Op::Renew {
                    at,
                    id,
                    token,
                    ttl_ms,
                    ..
                } => self.renew(at, id, token, ttl_ms).await.map(Reply::Renew),
                Op::RenewMany {
                    prefix,
                    id,
                    ttl_ms,
                    terms,
                } => Ok(Reply::RenewMany(
                    self.renew_many(prefix, id, ttl_ms, terms).await,
                )),
                Op::Resign { at, id, token } => self.resign(at, id, token).await.map(Reply::Resign),
                Op::Inspect { at } => self.inspect(at).await.map(Reply::Inspect),
                Op::LastRun { at } => self.last_run(at).await.map(Reply::LastRun),
                Op::RecordRun {
                    at,
                    id,
                    token,
                    keep_ms,
                } => self
                    .record_run(at, id, token, keep_ms)
                    .await
                    .map(Reply::RecordRun),
            }
        })
        .await;
        bounded.unwrap_or(Err(Error::Timeout(self.call_timeout)))
    }

    /// One gRPC call, counted, with its error in tenure's terms. A call
    /// that could not even connect (the client balances over the members
    /// and may pick one that is down) never reached etcd, so it is sent
    /// again, up to [`SENDS`] times in all: with one member of three down,
    /// an operation should not fail on the draw.
    async fn call<T, F>(&self, call: impl Fn(Client) -> F) -> Result<T>
    where
        F: std::future::Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        send(&self.clients, &self.requests, self.call_timeout / 3, call)
            .await
            .map_err(|e| classify(e, &self.url))
    }

    /// One transaction.
    async fn txn(&self, txn: Txn) -> Result<etcd_client::TxnResponse> {
        let answer = self
            .call(|mut c| {
                let txn = txn.clone();
                async move { c.txn(txn).await }
            })
            .await?;
        self.same_cluster(answer.header().map(|h| h.cluster_id()))?;
        Ok(answer)
    }

    /// The entry of `key`, if any.
    async fn get(&self, key: &str) -> Result<Option<KeyValue>> {
        let got = self
            .call(|mut c| async move { c.get(key, None).await })
            .await?;
        self.same_cluster(got.header().map(|h| h.cluster_id()))?;
        Ok(got.kvs().first().cloned())
    }

    /// Refuse an answer from another cluster than the one first reached:
    /// the client balances calls over every endpoint, and one that belongs
    /// to another cluster (a member replaced, an address reused) would
    /// grant a second term beside the first.
    fn same_cluster(&self, answered: Option<u64>) -> Result<()> {
        from_cluster(self.cluster_id, answered, &self.url)
    }

    /// Every key under `prefix`, without values.
    async fn keys_under(&self, prefix: &str) -> Result<Vec<KeyValue>> {
        let got = self
            .call(|mut c| async move {
                c.get(
                    prefix,
                    Some(GetOptions::new().with_prefix().with_keys_only()),
                )
                .await
            })
            .await?;
        self.same_cluster(got.header().map(|h| h.cluster_id()))?;
        Ok(got.kvs().to_vec())
    }

    /// What etcd says of `lease`: its granted ttl and the time it has left
    /// (-1 when it is gone), from this store's cluster: another cluster's
    /// word that it is gone would let a run be repeated early (the
    /// last-run marker), or a candidate try again at once.
    async fn time_to_live(&self, lease: i64) -> Result<etcd_client::LeaseTimeToLiveResponse> {
        let answer = self
            .call(|mut c| async move { c.lease_time_to_live(lease, None).await })
            .await?;
        self.same_cluster(answer.header().map(|h| h.cluster_id()))?;
        Ok(answer)
    }

    /// The session lease of (`id`, `ttl_ms`), granted now if there is none.
    /// Returns it and whether it was granted by this call (a grant is as
    /// good as a keep-alive sent now).
    async fn session(&self, id: &str, ttl_ms: u64) -> Result<(i64, bool)> {
        let ttl = Duration::from_millis(ttl_ms);
        let known = || {
            let lease = self
                .sessions_lock()
                .get(&(id.to_string(), ttl_ms))
                .copied()?;
            let refreshed = self.refreshed_lock().get(&lease).copied();
            // With a tenth of the ttl to spare for the keep-alive's trip.
            let lapsing =
                refreshed.is_none_or(|at| tokio::time::Instant::now() + ttl / 10 >= at + ttl);
            if lapsing {
                self.forget(id, ttl_ms, lease);
                return None;
            }
            Some(lease)
        };
        if let Some(lease) = known() {
            return Ok((lease, false));
        }
        let _granting = self.granting.lock().await;
        if let Some(lease) = known() {
            // Granted by another operation meanwhile: not fresh for us.
            return Ok((lease, false));
        }
        let asked = tokio::time::Instant::now();
        let lease = self.grant(ttl_ms).await?;
        self.refreshed_lock().insert(lease, asked);
        self.sessions_lock().insert((id.to_string(), ttl_ms), lease);
        Ok((lease, true))
    }

    fn refreshed_lock(&self) -> std::sync::MutexGuard<'_, HashMap<i64, tokio::time::Instant>> {
        self.refreshed.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn sessions_lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, u64), i64>> {
        self.sessions.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Forget a session lease that is gone, so that the next operation
    /// grants a new one.
    fn forget(&self, id: &str, ttl_ms: u64, lease: i64) {
        let mut sessions = self.sessions_lock();
        let key = (id.to_string(), ttl_ms);
        if sessions.get(&key) == Some(&lease) {
            sessions.remove(&key);
            self.refreshed_lock().remove(&lease);
        }
    }

    /// A new lease of `ttl_ms`, which must be whole seconds (checked when
    /// the election is built). A cluster whose minimum lease ttl (1.5
    /// election timeouts) is longer grants more than asked: that lease is
    /// revoked and the ttl refused, since our deadlines would be wrong.
    async fn grant(&self, ttl_ms: u64) -> Result<i64> {
        let seconds = i64::try_from(ttl_ms / 1000).unwrap_or(i64::MAX);
        let granted = self.lease_grant(seconds).await?;
        if granted.ttl() != seconds {
            let lease = granted.id();
            let _ = self
                .call(|mut c| async move { c.lease_revoke(lease).await })
                .await;
            return Err(Error::Config(format!(
                "ttl {seconds} s is shorter than the smallest lease {} grants ({} s, 1.5 times \
                 its election timeout): use a ttl of at least {} s",
                self.url,
                granted.ttl(),
                granted.ttl()
            )));
        }
        Ok(granted.id())
    }

    /// One lease of `seconds`, as etcd granted it (which may be longer).
    async fn lease_grant(&self, seconds: i64) -> Result<etcd_client::LeaseGrantResponse> {
        let granted = self
            .call(|mut c| async move { c.lease_grant(seconds, None).await })
            .await?;
        // A grant counts as a keep-alive of the new lease: it must be one
        // of this cluster's leases.
        self.same_cluster(granted.header().map(|h| h.cluster_id()))?;
        if !granted.error().is_empty() {
            return Err(Error::Etcd {
                detail: one_line(granted.error()),
            });
        }
        Ok(granted)
    }

    /// Send one keep-alive of `lease` (on a stream of its own, so that a
    /// late answer can never be taken for another's) and wait for its
    /// answer: the client reads it and reports a lease that is gone as an
    /// error of its own, which is no error here.
    ///
    /// Within a [`EtcdStore::batch`], one keep-alive per lease is sent and
    /// its answer shared.
    async fn keep_alive(&self, lease: i64) -> Result<KeptAlive> {
        let shared = KEEP_ALIVES.try_with(|batch| {
            batch
                .0
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .entry(lease)
                .or_insert_with(|| self.send_keep_alive(lease).boxed().shared())
                .clone()
        });
        let asked = tokio::time::Instant::now();
        let answer = match shared {
            Ok(shared) => shared.await,
            Err(_) => self.send_keep_alive(lease).await,
        };
        if let Ok(KeptAlive(ttl)) = answer {
            if ttl > 0 {
                if let Some(at) = self.refreshed_lock().get_mut(&lease) {
                    *at = (*at).max(asked);
                }
            }
        }
        answer.map_err(|err| copy_error(&err))
    }

    /// One keep-alive of `lease`, sent now.
    ///
    /// The client reads the first answer of a keep-alive stream itself and
    /// shows only whether the lease lives, not which cluster answered; so a
    /// second keep-alive follows on the same stream (to the same member),
    /// and its answer's cluster is checked. Another cluster can have a
    /// lease of the same id (a restore of this cluster's snapshot under a
    /// new cluster token keeps the leases): its keep-alive renews nothing
    /// here and must not count as a renewal. A lease the first answer finds
    /// gone counts as gone, whichever cluster said so: that only ends a term.
    fn send_keep_alive(
        &self,
        lease: i64,
    ) -> impl std::future::Future<Output = std::result::Result<KeptAlive, Arc<Error>>> + Send + 'static
    {
        let (clients, requests, url, cluster_id) = (
            self.clients.clone(),
            self.requests.clone(),
            self.url.clone(),
            self.cluster_id,
        );
        let patience = self.call_timeout / 3;
        async move {
            let sent = send(&clients, &requests, patience, |mut c| async move {
                let (mut keeper, mut answers) = c.lease_keep_alive(lease).await?;
                keeper.keep_alive().await?;
                answers.message().await
            });
            match sent.await {
                Ok(Some(answer)) => {
                    let answered = answer.header().map(|h| h.cluster_id());
                    from_cluster(cluster_id, answered, &url).map_err(Arc::new)?;
                    Ok(KeptAlive(answer.ttl().max(0)))
                }
                Ok(None) => Err(Arc::new(Error::Etcd {
                    detail: "the keep-alive stream ended before its second answer".into(),
                })),
                Err(etcd_client::Error::LeaseKeepAliveError(why)) if why.contains("not found") => {
                    Ok(KeptAlive(0))
                }
                Err(err) => Err(Arc::new(classify(err, &url))),
            }
        }
    }

    /// At most how long `lease` has left, `None` when it is gone. etcd
    /// answers in whole seconds, rounded down (0 for the last second, and
    /// for an expired lease its leader has not removed yet: it does so on a
    /// 500 ms tick), so one second is added: a follower that slept on the
    /// time rounded down would ask again and again in the last second. The
    /// watch on the key wakes it as soon as the key is gone anyway.
    async fn ttl_left(&self, lease: i64) -> Result<Option<Duration>> {
        let answer = self.time_to_live(lease).await?;
        Ok(u64::try_from(answer.ttl())
            .ok()
            .map(|secs| Duration::from_secs(secs.saturating_add(1))))
    }

    async fn acquire(&self, at: Address<'_>, request: &AcquireRequest<'_>) -> Result<AcquireReply> {
        let began = tokio::time::Instant::now();
        let key = lease_key(at)?;
        let witness_key = witness_key(at)?;
        let counter_key = counter_key(at)?;
        // A session lease may have expired since it was last used: then the
        // put fails (or its key goes with the lease) and one more try with
        // a new lease follows; so does a try that found the token counter
        // moved on since this store last saw it.
        for _ in 0..3 {
            let (seen, last) = self.counter(&counter_key);
            let token = if self.bugs.tokens_without_clock {
                last.saturating_add(1)
            } else {
                new_token(last)
            };
            let value = encode(request, token);
            let witness_value = witness_value(request.id, token);
            // The key, its witness and the counter are written together,
            // only if the counter is still as this store last saw it.
            let attach = |lease, witness| {
                Txn::new()
                    .when([
                        Compare::create_revision(key.clone(), CompareOp::Equal, 0),
                        Compare::create_revision(witness_key.clone(), CompareOp::Equal, 0),
                        Compare::mod_revision(counter_key.clone(), CompareOp::Equal, seen),
                    ])
                    .and_then([
                        TxnOp::put(
                            key.clone(),
                            value.clone(),
                            Some(PutOptions::new().with_lease(lease)),
                        ),
                        TxnOp::put(
                            witness_key.clone(),
                            witness_value.clone(),
                            Some(PutOptions::new().with_lease(witness)),
                        ),
                        TxnOp::put(counter_key.clone(), token.to_string(), None),
                    ])
                    .or_else([
                        TxnOp::get(key.clone(), None),
                        TxnOp::get(witness_key.clone(), None),
                        TxnOp::get(counter_key.clone(), None),
                    ])
            };
            let Some(Attached {
                lease,
                alive,
                answer: txn,
            }) = self.on_sessions(request.id, request.ttl_ms, attach).await?
            else {
                continue;
            };
            if txn.succeeded() {
                let revision = txn.header().map_or(0, |h| h.revision());
                token_of(revision, &key)?;
                self.saw_counter(&counter_key, revision, token);
                if !alive {
                    // Put on a lease expiring meanwhile: the key goes with it.
                    continue;
                }
                self.kept(&key, token, revision, lease, request.ttl_ms, began);
                return Ok(AcquireReply::Won { token });
            }
            let (found, witness) = (nth_kv(&txn, 0), nth_kv(&txn, 1));
            match nth_kv(&txn, 2) {
                Some(counter) => {
                    let value = decode_counter(&counter_key, &counter)?;
                    self.saw_counter(&counter_key, counter.mod_revision(), value);
                }
                None => self.saw_counter(&counter_key, 0, last),
            }
            let Some(kv) = found else {
                let Some(witness) = witness else {
                    // Free, but the counter had moved on (or the key was
                    // deleted between the compare and the gets, which are
                    // one transaction): try again with what was read.
                    continue;
                };
                // The key vanished without its holder's release (deleted
                // or revoked by hand): its holder may still be acting
                // until its witness runs out, or until it releases the
                // witness, having stopped (announced by the watch).
                decode_witness(&witness_key, &witness)?;
                let Some(wait) = self.ttl_left(witness.lease()).await? else {
                    continue;
                };
                let ttl = Duration::from_millis(request.ttl_ms.max(request.hold_off_ms));
                return Ok(AcquireReply::HoldOff {
                    wait: wait.min(ttl + Duration::from_secs(1)),
                });
            };
            let holder = self.holder(&key, &kv).await?;
            // (A follower whose session lapsed finds the key held all the
            // same, and needs no new lease until it is free.)
            let ours = holder.as_ref().is_some_and(|h| {
                h.owner == request.id
                    && h.attempt == request.attempt
                    && kv.lease() == lease
                    && alive
            });
            return match holder {
                // Our own attempt wrote it before its answer was lost: the
                // keep-alive above has just renewed it.
                Some(h) if ours => {
                    self.kept(
                        &key,
                        h.token,
                        kv.create_revision(),
                        lease,
                        request.ttl_ms,
                        began,
                    );
                    Ok(AcquireReply::Won { token: h.token })
                }
                Some(h) => Ok(AcquireReply::Held(h)),
                None => continue,
            };
        }
        Err(Error::Etcd {
            detail: "the lease changed hands twice while acquiring; trying again".into(),
        })
    }

    /// Run the transaction `txn(lease)` that attaches a key to the
    /// session lease of (`id`, `ttl_ms`), beside a keep-alive of that lease
    /// (or right after granting it). `None` when the transaction found the
    /// lease gone; a lease the keep-alive found gone is reported as not
    /// `alive`. Either way it is forgotten: the next try grants a new one.
    ///
    /// If the keep-alive finds the lease alive, the lease was alive when
    /// the key was attached (an expired lease never comes back), and lasts
    /// a ttl from when the keep-alive reached etcd, after the caller's
    /// send instant.
    async fn on_session(
        &self,
        id: &str,
        ttl_ms: u64,
        txn: impl Fn(i64) -> Txn,
    ) -> Result<Option<Attached>> {
        let (lease, fresh) = self.session(id, ttl_ms).await?;
        let sent = self.txn(txn(lease));
        let (alive, sent) = if fresh {
            (Ok(KeptAlive(1)), sent.await)
        } else {
            tokio::join!(self.keep_alive(lease), sent)
        };
        let answer = match sent {
            Err(err) if lease_not_found(&err) => {
                self.forget(id, ttl_ms, lease);
                return Ok(None);
            }
            other => other?,
        };
        let alive = alive?.0 > 0;
        if !alive {
            // Granted anew by the next operation that needs it.
            self.forget(id, ttl_ms, lease);
        }
        Ok(Some(Attached {
            lease,
            alive,
            answer,
        }))
    }

    /// [`EtcdStore::on_session`] for a transaction `txn(lease, witness)`
    /// that also puts a term's witness on `id`'s witness session lease: a
    /// second lease, kept alive with the first, so that a revoke of the
    /// first (by hand) leaves the witness behind. `alive` only when both
    /// keep-alives found their lease alive.
    async fn on_sessions(
        &self,
        id: &str,
        ttl_ms: u64,
        txn: impl Fn(i64, i64) -> Txn,
    ) -> Result<Option<Attached>> {
        let witness_id = witness_session(id);
        let (lease, fresh) = self.session(id, ttl_ms).await?;
        let (witness, witness_fresh) = self.session(&witness_id, ttl_ms).await?;
        let kept = |lease, fresh| async move {
            if fresh {
                Ok(KeptAlive(1))
            } else {
                self.keep_alive(lease).await
            }
        };
        let (alive, witness_alive, sent) = tokio::join!(
            kept(lease, fresh),
            kept(witness, witness_fresh),
            self.txn(txn(lease, witness))
        );
        let (alive, witness_alive) = (alive?.0 > 0, witness_alive?.0 > 0);
        // Granted anew by the next operation that needs them.
        if !alive {
            self.forget(id, ttl_ms, lease);
        }
        if !witness_alive {
            self.forget(&witness_id, ttl_ms, witness);
        }
        let answer = match sent {
            // One of the two leases is gone: the one a keep-alive found
            // gone is forgotten; if neither did, it expired in between,
            // and the next try's keep-alive finds it.
            Err(err) if lease_not_found(&err) => return Ok(None),
            other => other?,
        };
        Ok(Some(Attached {
            lease,
            alive: alive && witness_alive,
            answer,
        }))
    }

    /// Who holds `key`, from its entry and its lease's ttl (`None` when the
    /// lease has just expired).
    async fn holder(&self, key: &str, kv: &KeyValue) -> Result<Option<Holder>> {
        let decoded = decode(key, kv)?;
        let Some(ttl_left) = self.ttl_left(kv.lease()).await? else {
            return Ok(None);
        };
        Ok(Some(Holder {
            ttl_left,
            ..decoded
        }))
    }

    async fn renew(
        &self,
        at: Address<'_>,
        id: &str,
        token: u64,
        ttl_ms: u64,
    ) -> Result<RenewReply> {
        let key = lease_key(at)?;
        let witness_key = witness_key(at)?;
        self.renewing(&key, token);
        let witness_id = witness_session(id);
        let lease = self.sessions_lock().get(&(id.to_string(), ttl_ms)).copied();
        let witness = self
            .sessions_lock()
            .get(&(witness_id.clone(), ttl_ms))
            .copied();
        let (Some(lease), Some(witness)) = (lease, witness) else {
            // No session: this store never granted the term.
            return Ok(RenewReply::NotOwner(self.inspect(at).await?));
        };
        let both = Txn::new().and_then([
            TxnOp::get(key.clone(), None),
            TxnOp::get(witness_key.clone(), None),
        ]);
        let (alive, witness_alive, got) = tokio::join!(
            self.keep_alive(lease),
            self.keep_alive(witness),
            self.txn(both)
        );
        let got = got?;
        let (alive, witness_alive) = (alive?.0 > 0, witness_alive?.0 > 0);
        if !alive {
            self.forget(id, ttl_ms, lease);
        }
        if !witness_alive {
            self.forget(&witness_id, ttl_ms, witness);
        }
        // A term holds while its key and its witness both live: a witness
        // deleted or revoked by hand ends the term (its release then
        // deletes the key), so that a later delete of the key by hand
        // could never let a candidate in early.
        let witnessed =
            witness_alive && nth_kv(&got, 1).is_some_and(|w| is_witness_of(&w, token, witness));
        match nth_kv(&got, 0) {
            Some(kv) if is_term(&kv, token, lease) && alive && !witnessed => {
                Ok(RenewReply::NotOwner(None))
            }
            Some(kv) if is_term(&kv, token, lease) && alive => {
                let holder = decode(&key, &kv)?;
                if holder.owner == id {
                    Ok(RenewReply::Renewed)
                } else {
                    Ok(RenewReply::NotOwner(Some(holder)))
                }
            }
            Some(kv) if alive || !is_term(&kv, token, lease) => {
                Ok(RenewReply::NotOwner(self.holder(&key, &kv).await?))
            }
            _ => Ok(RenewReply::NotOwner(None)),
        }
    }

    /// Renew many terms of `id`: one keep-alive of its session lease, and
    /// transactions of compares only (nothing written) that check each key
    /// is still the one its term created, on that lease.
    async fn renew_many(
        &self,
        prefix: &str,
        id: &str,
        ttl_ms: u64,
        terms: &[(&str, u64)],
    ) -> Vec<Result<RenewReply>> {
        let witness_id = witness_session(id);
        let lease = self.sessions_lock().get(&(id.to_string(), ttl_ms)).copied();
        let witness = self
            .sessions_lock()
            .get(&(witness_id.clone(), ttl_ms))
            .copied();
        let (Some(lease), Some(witness)) = (lease, witness) else {
            return terms
                .iter()
                .map(|_| Ok(RenewReply::NotOwner(None)))
                .collect();
        };
        let keys: Vec<Result<(String, String)>> = terms
            .iter()
            .map(|(name, _)| {
                let at = Address::new(prefix, name);
                Ok((lease_key(at)?, witness_key(at)?))
            })
            .collect();
        for ((_, token), key) in terms.iter().zip(&keys) {
            if let Ok((key, _)) = key {
                self.renewing(key, *token);
            }
        }
        let checks = terms
            .chunks(TERMS_PER_CHECK)
            .zip(keys.chunks(TERMS_PER_CHECK))
            .map(|(chunk, keys)| async move {
                let mut compares = Vec::with_capacity(chunk.len() * 4);
                for ((_, token), key) in chunk.iter().zip(keys) {
                    let Ok((key, witness_key)) = key else {
                        continue;
                    };
                    // A term this store did not begin is checked key by key.
                    let revision = self.revision_of(key, *token).unwrap_or(-1);
                    compares.push(Compare::mod_revision(
                        key.clone(),
                        CompareOp::Equal,
                        revision,
                    ));
                    compares.push(Compare::lease(key.clone(), CompareOp::Equal, lease));
                    compares.push(Compare::value(
                        witness_key.clone(),
                        CompareOp::Equal,
                        witness_value(id, *token),
                    ));
                    compares.push(Compare::lease(
                        witness_key.clone(),
                        CompareOp::Equal,
                        witness,
                    ));
                }
                let txn = Txn::new().when(compares);
                let all_ours = self.txn(txn).await.map(|t| t.succeeded());
                match all_ours {
                    Ok(true) => Ok(vec![true; chunk.len()]),
                    Ok(false) => self.which_are_ours(chunk, keys, lease, witness).await,
                    Err(err) => Err(err),
                }
            });
        let (alive, witness_alive, checked) = tokio::join!(
            self.keep_alive(lease),
            self.keep_alive(witness),
            join_all(checks)
        );
        let alive = match (alive, witness_alive) {
            (Ok(KeptAlive(ttl)), Ok(KeptAlive(witness_ttl))) => {
                if ttl <= 0 {
                    self.forget(id, ttl_ms, lease);
                }
                if witness_ttl <= 0 {
                    self.forget(&witness_id, ttl_ms, witness);
                }
                ttl > 0 && witness_ttl > 0
            }
            (Err(err), _) | (_, Err(err)) => {
                return terms.iter().map(|_| Err(copy_error(&err))).collect();
            }
        };
        let mut replies = Vec::with_capacity(terms.len());
        for (chunk, checked) in terms.chunks(TERMS_PER_CHECK).zip(checked) {
            match checked {
                Ok(ours) => replies.extend(ours.into_iter().map(|ours| {
                    Ok(if ours && alive {
                        RenewReply::Renewed
                    } else {
                        RenewReply::NotOwner(None)
                    })
                })),
                Err(err) => replies.extend(chunk.iter().map(|_| Err(copy_error(&err)))),
            }
        }
        for (reply, key) in replies.iter_mut().zip(&keys) {
            if let Err(err) = key {
                *reply = Err(copy_error(err));
            }
        }
        replies
    }

    /// The revision that created term (`key`, `token`), if this store
    /// began it.
    fn revision_of(&self, key: &str, token: u64) -> Option<i64> {
        let terms = self.terms_lock();
        terms
            .get(key)
            .filter(|kept| kept.token == token)
            .map(|kept| kept.revision)
    }

    /// After a check of a chunk failed: which of its terms are still ours,
    /// key by key.
    async fn which_are_ours(
        &self,
        chunk: &[(&str, u64)],
        keys: &[Result<(String, String)>],
        lease: i64,
        witness: i64,
    ) -> Result<Vec<bool>> {
        let gets = chunk.iter().zip(keys).map(|((_, token), key)| async move {
            let Ok((key, witness_key)) = key else {
                return Ok(false);
            };
            let both = Txn::new().and_then([
                TxnOp::get(key.clone(), None),
                TxnOp::get(witness_key.clone(), None),
            ]);
            let got = self.txn(both).await?;
            Ok(
                nth_kv(&got, 0).is_some_and(|kv| is_term(&kv, *token, lease))
                    && nth_kv(&got, 1).is_some_and(|w| is_witness_of(&w, *token, witness)),
            )
        });
        join_all(gets).await.into_iter().collect()
    }

    /// Delete the key if it is still the term (`id`, `token`): the owner
    /// is read first, and the delete goes ahead only if the key has not
    /// changed since (its `mod_revision` is still the term's). The term's
    /// witness goes with it; and when the key is gone already (deleted or
    /// revoked by hand), the witness is deleted on its own: this is the
    /// holder's release, made after it stopped, which lets the next
    /// candidate in without waiting for the witness to run out.
    async fn resign(&self, at: Address<'_>, id: &str, token: u64) -> Result<bool> {
        let key = lease_key(at)?;
        let witness_key = witness_key(at)?;
        let released = self.delete_term(&key, &witness_key, id, token).await;
        self.released(&key, token);
        let released = released?;
        if !released {
            self.delete_witness(&witness_key, id, token).await?;
        }
        Ok(released)
    }

    /// Delete the key and witness of term (`id`, `token`) if the key is
    /// still that term's.
    async fn delete_term(
        &self,
        key: &str,
        witness_key: &str,
        id: &str,
        token: u64,
    ) -> Result<bool> {
        let delete = |compares: Vec<Compare>| {
            Txn::new()
                .when(compares)
                .and_then([TxnOp::delete(key, None), TxnOp::delete(witness_key, None)])
        };
        // A term this store began for `id` is on `id`'s session lease: one
        // transaction checks both halves of the term, (id by its lease,
        // token by the revision), and deletes.
        let kept = self.terms_lock().get(key).copied();
        let session = |ttl: Duration| {
            let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
            self.sessions_lock().get(&(id.to_string(), ttl_ms)).copied()
        };
        if let Some(kept) = kept.filter(|k| k.token == token && session(k.ttl) == Some(k.lease)) {
            let txn = delete(vec![
                Compare::mod_revision(key, CompareOp::Equal, kept.revision),
                Compare::lease(key, CompareOp::Equal, kept.lease),
            ]);
            return Ok(self.txn(txn).await?.succeeded());
        }
        let Some(kv) = self.get(key).await? else {
            return Ok(false);
        };
        let holder = decode(key, &kv)?;
        if holder.token != token || holder.owner != id || kv.mod_revision() != kv.create_revision()
        {
            return Ok(false);
        }
        let txn = delete(vec![Compare::mod_revision(
            key,
            CompareOp::Equal,
            kv.mod_revision(),
        )]);
        Ok(self.txn(txn).await?.succeeded())
    }

    /// Delete the witness of the term (`id`, `token`) if it is still
    /// there (its key is gone): its value names the term's owner and
    /// token, so no other term's witness is touched, nor this one by
    /// anyone but its owner.
    async fn delete_witness(&self, witness_key: &str, id: &str, token: u64) -> Result<()> {
        let txn = Txn::new()
            .when([Compare::value(
                witness_key,
                CompareOp::Equal,
                witness_value(id, token),
            )])
            .and_then([TxnOp::delete(witness_key, None)]);
        self.txn(txn).await?;
        Ok(())
    }

    /// The token counter at `counter_key` as last seen: (its mod
    /// revision, 0 when it was missing; its value).
    fn counter(&self, counter_key: &str) -> (i64, u64) {
        let counters = self.counters.lock().unwrap_or_else(|p| p.into_inner());
        counters.get(counter_key).copied().unwrap_or((0, 0))
    }

    /// Remember the token counter as read or written at `revision`.
    fn saw_counter(&self, counter_key: &str, revision: i64, value: u64) {
        let mut counters = self.counters.lock().unwrap_or_else(|p| p.into_inner());
        counters.insert(counter_key.to_string(), (revision, value));
    }

    /// Note a term this store has just begun (or adopted).
    fn kept(
        &self,
        key: &str,
        token: u64,
        revision: i64,
        lease: i64,
        ttl_ms: u64,
        began: tokio::time::Instant,
    ) {
        let kept = Kept {
            token,
            revision,
            lease,
            ttl: Duration::from_millis(ttl_ms),
            last: began,
        };
        self.terms_lock().insert(key.to_string(), kept);
    }

    /// Note that a renewal of term (`key`, `token`) begins now.
    fn renewing(&self, key: &str, token: u64) {
        if let Some(kept) = self.terms_lock().get_mut(key) {
            if kept.token == token {
                kept.last = tokio::time::Instant::now();
            }
        }
    }

    /// Forget term (`key`, `token`): released, or found gone.
    fn released(&self, key: &str, token: u64) {
        let mut terms = self.terms_lock();
        if terms.get(key).is_some_and(|kept| kept.token == token) {
            terms.remove(key);
        }
    }

    fn terms_lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Kept>> {
        self.terms.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Delete the keys of terms nobody renews any more.
    ///
    /// On Redis, a term that ended without its lease being released (the
    /// release failed, the deadline passed, the handles were dropped while
    /// the store was away) lapses one ttl later. Here its key hangs on the
    /// instance's session lease, which the instance's other terms keep
    /// alive: it would block the election (for this instance too) for as
    /// long as the process runs. So the store remembers the terms it began,
    /// and a term not renewed for a whole ttl, whose local deadline has
    /// therefore passed (no handle of it may act any more), has its key
    /// deleted if it is still that term's on that lease.
    pub async fn sweep(&self) {
        let now = tokio::time::Instant::now();
        let stale: Vec<(String, Kept)> = self
            .terms_lock()
            .iter()
            .filter(|(_, kept)| now > kept.last + kept.ttl)
            .map(|(key, kept)| (key.clone(), *kept))
            .collect();
        for (key, kept) in stale {
            let revision = kept.revision;
            let witness_key = format!("{}/witness", key_dir(&key));
            // The key and witness if the key is still the term's on its
            // lease, else the witness alone if it is still the term's (its
            // key vanished by hand: the term's deadline has passed now).
            let txn = Txn::new()
                .when([
                    Compare::mod_revision(key.clone(), CompareOp::Equal, revision),
                    Compare::lease(key.clone(), CompareOp::Equal, kept.lease),
                ])
                .and_then([
                    TxnOp::delete(key.clone(), None),
                    TxnOp::delete(witness_key.clone(), None),
                ])
                .or_else([TxnOp::txn(
                    Txn::new()
                        .when([
                            Compare::create_revision(
                                witness_key.clone(),
                                CompareOp::Equal,
                                revision,
                            ),
                            Compare::lease(witness_key.clone(), CompareOp::NotEqual, 0),
                        ])
                        .and_then([TxnOp::delete(witness_key.clone(), None)]),
                )]);
            let swept = self.txn(txn).await;
            match swept {
                Ok(txn) => {
                    if txn.succeeded() {
                        tracing::info!(key = %key, token = kept.token, "deleted the key of a term that ended without releasing it");
                    }
                    self.released(&key, kept.token);
                }
                // Tried again at the next sweep.
                Err(err) => {
                    tracing::debug!(key = %key, error = %err, "cannot delete an ended term's key yet")
                }
            }
        }
    }

    async fn inspect(&self, at: Address<'_>) -> Result<Option<Holder>> {
        let key = lease_key(at)?;
        match self.get(&key).await? {
            Some(kv) => self.holder(&key, &kv).await,
            None => Ok(None),
        }
    }

    /// The age of the last-run marker (see the module docs), `None` when
    /// there is none or its lease has run out.
    async fn last_run(&self, at: Address<'_>) -> Result<Option<Duration>> {
        let key = last_run_key(at)?;
        let Some(kv) = self.get(&key).await? else {
            return Ok(None);
        };
        let recorded_ms = decode_marker(&key, &kv)?;
        let answer = self.time_to_live(kv.lease()).await?;
        let (Ok(left), Ok(granted)) = (
            u64::try_from(answer.ttl()),
            u64::try_from(answer.granted_ttl()),
        ) else {
            // -1: the lease has expired.
            return Ok(None);
        };
        let by_lease = Duration::from_secs(granted.saturating_sub(left).saturating_sub(1));
        // An etcd leader change renews every lease, so the lease alone can
        // make a marker look younger than it is, and a period be skipped.
        // The recorder's clock says how old it is across that, less
        // CLOCK_SLACK for hosts whose clocks disagree: never older than it
        // is while they agree that closely.
        let by_clock = recorded_ms.map_or(Duration::ZERO, |at| {
            Duration::from_millis(wall_ms().saturating_sub(at)).saturating_sub(CLOCK_SLACK)
        });
        Ok(Some(
            by_lease.max(by_clock).min(Duration::from_secs(granted)),
        ))
    }

    /// Put the last-run marker on a new lease of `keep_ms` (rounded up to
    /// whole seconds), in a transaction that checks the election's key is
    /// still term (`id`, `token`)'s; the previous marker's lease is revoked.
    async fn record_run(
        &self,
        at: Address<'_>,
        id: &str,
        token: u64,
        keep_ms: u64,
    ) -> Result<bool> {
        let key = lease_key(at)?;
        let marker = last_run_key(at)?;
        // The owner is read first; the transaction goes ahead only if the
        // key has not changed since (its mod_revision is still the one that
        // created the term).
        let Some(kv) = self.get(&key).await? else {
            return Ok(false);
        };
        let holder = decode(&key, &kv)?;
        if holder.token != token || holder.owner != id || kv.mod_revision() != kv.create_revision()
        {
            return Ok(false);
        }
        let revision = kv.mod_revision();
        let seconds = i64::try_from(keep_ms.div_ceil(1000).max(1)).unwrap_or(i64::MAX);
        // A cluster whose minimum lease ttl is longer grants more: the
        // marker is then kept longer, and its age still counts right.
        let granted = self.lease_grant(seconds).await?;
        let lease = granted.id();
        let value = format!("{MAGIC}\nlast-run\n{token}\n{id}\n{}", wall_ms());
        let txn = Txn::new()
            .when([Compare::mod_revision(
                key.clone(),
                CompareOp::Equal,
                revision,
            )])
            .and_then([
                TxnOp::get(marker.clone(), None),
                TxnOp::put(
                    marker.clone(),
                    value,
                    Some(PutOptions::new().with_lease(lease)),
                ),
            ]);
        let revoke = |lease: i64| async move {
            let revoked = self
                .call(|mut c| async move { c.lease_revoke(lease).await })
                .await;
            if let Err(err) = revoked {
                tracing::debug!(lease, error = %err, "cannot revoke a last-run marker's lease; it runs out by itself");
            }
        };
        let txn = match self.txn(txn).await {
            Ok(txn) => txn,
            Err(err) => {
                revoke(lease).await;
                return Err(err);
            }
        };
        if !txn.succeeded() {
            revoke(lease).await;
            return Ok(false);
        }
        if let Some(previous) = first_kv(&txn).filter(|kv| kv.lease() != 0 && kv.lease() != lease) {
            revoke(previous.lease()).await;
        }
        Ok(true)
    }

    async fn heartbeat(
        &self,
        group: Address<'_>,
        member: &str,
        ttl_ms: u64,
        join: bool,
    ) -> Result<Reply> {
        let prefix = members_prefix(group)?;
        let key = format!("{prefix}{member}");
        if join {
            // Written when missing or on another lease (one of an earlier
            // process with this id, or a lease gone since).
            let join = |lease| {
                Txn::new()
                    .when([Compare::lease(key.clone(), CompareOp::Equal, lease)])
                    .or_else([TxnOp::put(
                        key.clone(),
                        "",
                        Some(PutOptions::new().with_lease(lease)),
                    )])
            };
            for _ in 0..2 {
                if let Some(Attached { alive: true, .. }) =
                    self.on_session(member, ttl_ms, join).await?
                {
                    return self.members(&prefix).await;
                }
            }
            Err(Error::Etcd {
                detail: "the session lease kept expiring while joining".into(),
            })
        } else {
            let key = key.as_str();
            self.call(|mut c| async move { c.delete(key, None).await })
                .await?;
            self.members(&prefix).await
        }
    }

    /// The live members under `prefix`: keys on a lease (ours all are);
    /// keys without one were not written by tenure and are not counted.
    async fn members(&self, prefix: &str) -> Result<Reply> {
        let mut members = Vec::new();
        let mut phantoms = 0;
        for kv in self.keys_under(prefix).await? {
            match (
                kv.lease(),
                kv.key_str().ok().and_then(|k| k.strip_prefix(prefix)),
            ) {
                (lease, Some(member)) if lease != 0 && !member.is_empty() => {
                    members.push(member.to_string())
                }
                _ => phantoms += 1,
            }
        }
        Ok(Reply::Members { members, phantoms })
    }

    /// Names of the elections with a key under `prefix`, sorted.
    pub async fn list_elections(&self, prefix: &str) -> Result<Vec<String>> {
        let start = format!("{prefix}/");
        let mut names: Vec<String> = self
            .keys_under(&start)
            .await?
            .iter()
            .filter_map(|kv| kv.key_str().ok()?.strip_prefix(&start).map(str::to_string))
            .filter(|name| !name.starts_with('{') && !name.is_empty())
            .collect();
        names.sort();
        Ok(names)
    }

    /// A watch on `key` feeding [`Notices`]: a delete counts as a release,
    /// a creation as a new term. The watch is opened again after any
    /// failure, and each (re)opening counts as a possible missed release.
    /// Dropping the returned guard ends it.
    fn watch(self: &Arc<Self>, keys: Vec<String>) -> (watch::Receiver<Notices>, WatchGuard) {
        let (sender, receiver) = watch::channel(Notices::default());
        let sender = Arc::new(sender);
        let tasks = keys
            .into_iter()
            .map(|key| self.watch_one(key, sender.clone()))
            .collect();
        (receiver, WatchGuard(tasks))
    }

    /// The task of one key's watch for [`EtcdStore::watch`].
    fn watch_one(
        self: &Arc<Self>,
        key: String,
        sender: Arc<watch::Sender<Notices>>,
    ) -> tokio::task::JoinHandle<()> {
        let client = self.client.clone();
        let url = self.url.clone();
        tokio::spawn(async move {
            let mut failures: u32 = 0;
            loop {
                let opened = client
                    .clone()
                    .watch(key.clone(), Some(WatchOptions::new()))
                    .await;
                match opened {
                    Ok(mut stream) => {
                        loop {
                            match stream.message().await {
                                Ok(Some(answer)) => {
                                    if answer.canceled() {
                                        break;
                                    }
                                    if answer.created() {
                                        // A release may have been missed
                                        // while no watch was open.
                                        failures = 0;
                                        sender.send_modify(|n| n.released += 1);
                                    }
                                    for event in answer.events() {
                                        match event.event_type() {
                                            EventType::Delete => {
                                                sender.send_modify(|n| n.released += 1)
                                            }
                                            EventType::Put => {
                                                if event.kv().is_some_and(|kv| kv.version() == 1) {
                                                    sender.send_modify(|n| n.acquired += 1)
                                                }
                                            }
                                        }
                                    }
                                }
                                Ok(None) => break,
                                Err(err) => {
                                    tracing::debug!(url = %url, error = %one_line(&err.to_string()), "etcd watch ended; opening it again");
                                    break;
                                }
                            }
                        }
                    }
                    Err(err) => {
                        if failures == 0 {
                            tracing::debug!(url = %url, error = %one_line(&err.to_string()), "cannot open the etcd watch; retrying");
                        }
                    }
                }
                failures = failures.saturating_add(1);
                let backoff = Duration::from_millis(50u64.saturating_mul(1 << failures.min(5)));
                tokio::time::sleep(backoff.min(Duration::from_secs(1))).await;
            }
        })
    }
}

/// Ends its watch tasks when dropped.
struct WatchGuard(Vec<tokio::task::JoinHandle<()>>);

impl Drop for WatchGuard {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

/// Whether `kv` is the key created by term `token`, unchanged since, on
/// `lease`.
/// Whether `kv` is the key of the term `token`, unchanged since it was
/// created, on `lease`.
fn is_term(kv: &KeyValue, token: u64, lease: i64) -> bool {
    kv.mod_revision() == kv.create_revision() && kv.lease() == lease && token_in(kv) == Some(token)
}

/// The token an election key names: its last line, or (keys written
/// before tokens were counted apart from revisions) its creating revision.
fn token_in(kv: &KeyValue) -> Option<u64> {
    let text = std::str::from_utf8(kv.value()).ok()?;
    match text.split('\n').nth(5) {
        Some(token) => token.parse().ok(),
        None => u64::try_from(kv.create_revision()).ok(),
    }
}

/// Whether `kv` is the witness of the term `token` on the witness session
/// lease `witness` (created with the term's key, never modified).
fn is_witness_of(kv: &KeyValue, token: u64, witness: i64) -> bool {
    kv.lease() == witness
        && std::str::from_utf8(kv.value())
            .ok()
            .and_then(|text| text.split('\n').nth(3))
            .and_then(|t| t.parse().ok())
            == Some(token)
}

/// The entry the `n`th operation of a transaction (a get) found.
fn nth_kv(txn: &etcd_client::TxnResponse, n: usize) -> Option<KeyValue> {
    match txn.op_responses().into_iter().nth(n)? {
        TxnOpResponse::Get(got) => got.kvs().first().cloned(),
        _ => None,
    }
}

/// The value of a witness: it names its owner and its term's token.
fn witness_value(id: &str, token: u64) -> String {
    format!("{MAGIC}\nwitness\n{id}\n{token}")
}

/// The token of a new term: above the last one counted, and at least the
/// candidate's clock in ms, so that tokens keep rising when the counter
/// is rolled back (a restore from an older snapshot) or deleted.
fn new_token(last: u64) -> u64 {
    last.saturating_add(1).max(wall_ms())
}

/// The value of an election's token counter.
fn decode_counter(key: &str, kv: &KeyValue) -> Result<u64> {
    std::str::from_utf8(kv.value())
        .ok()
        .and_then(|text| text.parse().ok())
        .ok_or_else(|| Error::ForeignData {
            key: key.to_string(),
            detail: "it is not a token counter (a decimal number)".into(),
        })
}

/// The session key of an instance's witness lease: a second session of
/// the instance, beside its own (ids contain no control characters).
fn witness_session(id: &str) -> String {
    format!("{id}\u{1}witness")
}

fn first_kv(txn: &etcd_client::TxnResponse) -> Option<KeyValue> {
    txn.op_responses().into_iter().find_map(|r| match r {
        TxnOpResponse::Get(got) => got.kvs().first().cloned(),
        _ => None,
    })
}

fn token_of(revision: i64, key: &str) -> Result<u64> {
    u64::try_from(revision)
        .ok()
        .filter(|r| *r > 0)
        .ok_or_else(|| Error::Etcd {
            detail: format!("the transaction on {key} answered without a revision"),
        })
}

/// The lines of `kv` after its first two, if it is a value tenure wrote
/// of the kind `tag` (`witness`, `last-run`) on a lease; else an error
/// naming the key.
fn tagged<'a>(key: &str, kv: &'a KeyValue, tag: &str) -> Result<std::str::Lines<'a>> {
    let foreign = |detail: &str| Error::ForeignData {
        key: key.to_string(),
        detail: detail.to_string(),
    };
    let text = std::str::from_utf8(kv.value()).map_err(|_| foreign("not UTF-8"))?;
    let mut lines = text.lines();
    if lines.next() != Some(MAGIC) || lines.next() != Some(tag) {
        return Err(foreign(&format!(
            "it does not start with {MAGIC:?} and {tag:?}"
        )));
    }
    if kv.lease() == 0 {
        return Err(foreign("it has no lease"));
    }
    Ok(lines)
}

/// Check that `kv` is a witness tenure wrote (on a lease).
fn decode_witness(key: &str, kv: &KeyValue) -> Result<()> {
    tagged(key, kv, "witness").map(|_| ())
}

/// Check that `kv` is a last-run marker tenure wrote (on a lease), and
/// return the recorder's clock (ms) at the record, if it says (markers
/// written before it did, do not).
fn decode_marker(key: &str, kv: &KeyValue) -> Result<Option<u64>> {
    let mut lines = tagged(key, kv, "last-run")?;
    let (_token, _owner) = (lines.next(), lines.next());
    match lines.next() {
        None => Ok(None),
        Some(at) => at.parse().map(Some).map_err(|_| Error::ForeignData {
            key: key.to_string(),
            detail: "a record time that is not a number".into(),
        }),
    }
}

/// The host's clock in ms since the epoch (0 before it).
fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn encode(request: &AcquireRequest<'_>, token: u64) -> String {
    let since_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    format!(
        "{MAGIC}\n{}\n{since_ms}\n{}\n{}\n{token}",
        request.ttl_ms, request.attempt, request.id
    )
}

/// The holder described by `kv` (its ttl left still to be asked), or an
/// error naming the key when tenure did not write it.
fn decode(key: &str, kv: &KeyValue) -> Result<Holder> {
    let foreign = |detail: &str| Error::ForeignData {
        key: key.to_string(),
        detail: detail.to_string(),
    };
    let text = std::str::from_utf8(kv.value()).map_err(|_| foreign("not UTF-8"))?;
    let mut lines = text.splitn(6, '\n');
    if lines.next() != Some(MAGIC) {
        return Err(foreign(&format!("it does not start with {MAGIC:?}")));
    }
    let ttl_ms: u64 = lines
        .next()
        .and_then(|l| l.parse().ok())
        .ok_or_else(|| foreign("no ttl"))?;
    let since_ms: u64 = lines
        .next()
        .and_then(|l| l.parse().ok())
        .ok_or_else(|| foreign("no start time"))?;
    let attempt = lines.next().ok_or_else(|| foreign("no attempt"))?;
    let owner = lines.next().ok_or_else(|| foreign("no owner"))?;
    if kv.lease() == 0 {
        return Err(foreign("it has no lease"));
    }
    // Keys written before tokens were counted apart from revisions have
    // no token line: their token is their creating revision.
    let token = match lines.next() {
        Some(line) => line
            .parse()
            .map_err(|_| foreign("a token that is not a number"))?,
        None => u64::try_from(kv.create_revision()).map_err(|_| foreign("bad revision"))?,
    };
    Ok(Holder {
        owner: owner.to_string(),
        token,
        ttl_left: Duration::ZERO,
        since_ms,
        attempt: attempt.to_string(),
        ttl: Duration::from_millis(ttl_ms),
    })
}

fn lease_not_found(err: &Error) -> bool {
    matches!(err, Error::Etcd { detail } if detail.contains("requested lease not found"))
}

fn copy_error(err: &Error) -> Error {
    crate::error::copy_error(err)
}

/// [`EtcdStore::same_cluster`] for a store first reached on cluster
/// `expected` at `url`.
fn from_cluster(expected: u64, answered: Option<u64>, url: &str) -> Result<()> {
    match answered {
        Some(id) if expected != 0 && id != 0 && id != expected => Err(Error::Unsafe {
            url: url.to_string(),
            detail: format!(
                "an endpoint answered for etcd cluster {id:x}, not {expected:x}, the cluster \
                 first reached: list the members of one cluster only"
            ),
        }),
        _ => Ok(()),
    }
}

/// Ask every endpoint on its own which cluster it belongs to, and refuse a
/// list that spans two, naming them. An endpoint that does not answer now
/// is not counted (every later answer is checked: `same_cluster`). Returns
/// a client of each endpoint that answered, for hedged sends.
async fn one_cluster(
    endpoints: &[String],
    options: &ConnectOptions,
    call_timeout: Duration,
    url: &str,
) -> Result<Vec<Client>> {
    let asks = endpoints.iter().map(|endpoint| async move {
        let ask = async {
            let mut client = Client::connect([endpoint.as_str()], Some(options.clone())).await?;
            let status = client.status().await?;
            Ok::<_, etcd_client::Error>((client, status))
        };
        match tokio::time::timeout(call_timeout, ask).await {
            Ok(Ok((client, status))) => (
                endpoint,
                Some(client),
                status.header().map(|h| h.cluster_id()),
            ),
            _ => (endpoint, None, None),
        }
    });
    let mut clusters: Vec<(u64, Vec<&str>)> = Vec::new();
    let mut clients = Vec::new();
    for (endpoint, client, id) in join_all(asks).await {
        clients.extend(client);
        let Some(id) = id else { continue };
        match clusters.iter_mut().find(|(known, _)| *known == id) {
            Some((_, members)) => members.push(endpoint),
            None => clusters.push((id, vec![endpoint])),
        }
    }
    if clusters.len() < 2 {
        return Ok(clients);
    }
    let named: Vec<String> = clusters
        .iter()
        .map(|(id, members)| format!("{} (cluster {id:x})", members.join(", ")))
        .collect();
    Err(Error::Unsafe {
        url: url.to_string(),
        detail: format!(
            "the endpoints belong to different etcd clusters: {}; list the members of one \
             cluster only",
            named.join(" and ")
        ),
    })
}

/// The clients of one store: one balanced over every endpoint, and one
/// per endpoint that answered at connect.
#[derive(Clone)]
struct Clients {
    balanced: Client,
    members: Arc<Vec<Client>>,
    /// Which member the next hedged send goes to.
    next: Arc<AtomicUsize>,
    /// [`EtcdBugs::no_hedges`].
    no_hedges: bool,
}

impl Clients {
    /// The balanced client alone (at connect, before the members are known).
    fn of(client: &Client, no_hedges: bool) -> Clients {
        Clients {
            balanced: client.clone(),
            members: Arc::new(Vec::new()),
            next: Arc::new(AtomicUsize::new(0)),
            no_hedges,
        }
    }

    /// The client of the `n`th send of one call: the balanced one first,
    /// then the members in turn, so that the hedges of one call go to
    /// different members.
    fn for_send(&self, n: u32) -> Client {
        if n <= 1 || self.members.is_empty() {
            return self.balanced.clone();
        }
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.members.len();
        self.members[i].clone()
    }
}

/// [`EtcdStore::call`] without the translation of its error.
///
/// A call that has no answer after `patience` is hedged: sent again while
/// the first stays in flight, and the first answer wins. A member that is
/// stopped (paused, swapping, partitioned without a reset) holds a call
/// forever, which would cost a leader its term although two members answer
/// at once, and the balanced client may well choose it again: so the
/// hedges go to the members in turn, each through a client of its own. Every operation
/// is safe to send twice: reads and keep-alives change nothing, deletes
/// compare the revision, and a create that ran twice is found under this
/// same attempt and adopted. At most [`SENDS`] are sent.
async fn send<T, F>(
    clients: &Clients,
    requests: &AtomicU64,
    patience: Duration,
    call: impl Fn(Client) -> F,
) -> std::result::Result<T, etcd_client::Error>
where
    F: std::future::Future<Output = std::result::Result<T, etcd_client::Error>>,
{
    let client = &clients.balanced;
    let mut in_flight = futures_util::stream::FuturesUnordered::new();
    let mut sends = 0;
    let mut start = |in_flight: &mut futures_util::stream::FuturesUnordered<F>| {
        sends += 1;
        requests.fetch_add(1, Ordering::Relaxed);
        in_flight.push(call(clients.for_send(sends)));
        sends
    };
    let mut sent = start(&mut in_flight);
    loop {
        let hedge = tokio::time::sleep(patience);
        let answer = tokio::select! {
            answer = in_flight.next() => answer,
            _ = hedge, if sent < SENDS && !clients.no_hedges => {
                sent = start(&mut in_flight);
                continue;
            }
        };
        let Some(answer) = answer else {
            // Nothing in flight (every send failed and was not resent).
            sent = start(&mut in_flight);
            continue;
        };
        match answer {
            Err(err) if never_sent(&err) && sent < SENDS => {
                sent = start(&mut in_flight);
            }
            Err(err) if old_auth_revision(&err) && sent < SENDS => {
                // Every change to users or roles makes the tokens issued
                // before it stale on each member that has applied it (as
                // does a token from a member that had not applied the last
                // one yet); etcd's own client authenticates again and
                // retries. A failed refresh shows in the retry's answer.
                let _ = client.refresh_token().await;
                sent = start(&mut in_flight);
            }
            // Another send may still answer.
            Err(_) if !in_flight.is_empty() => {}
            other => return other,
        }
    }
}

/// Whether etcd refused a call for a token older than its users and roles.
fn old_auth_revision(err: &etcd_client::Error) -> bool {
    matches!(err, etcd_client::Error::GRpcStatus(status)
        if status.message().contains("revision of auth store is old"))
}

/// Whether a call failed before anything reached etcd: the connection to
/// the member it was sent to could not be made.
fn never_sent(err: &etcd_client::Error) -> bool {
    let text = match err {
        etcd_client::Error::GRpcStatus(status) if status.code() == tonic::Code::Unavailable => {
            format!(
                "{} {:?}",
                status.message(),
                std::error::Error::source(status)
            )
        }
        etcd_client::Error::TransportError(err) => format!("{err} {err:?}"),
        _ => return false,
    };
    text.contains("tcp connect error") || text.contains("Connection refused")
}

/// An etcd client error in tenure's terms.
fn classify(err: etcd_client::Error, url: &str) -> Error {
    use tonic::Code;
    match &err {
        etcd_client::Error::GRpcStatus(status) => {
            let detail = one_line(status.message());
            match status.code() {
                // etcd answers a wrong user or password with an invalid
                // argument.
                _ if detail.contains("authentication failed") => Error::Auth {
                    url: url.to_string(),
                    detail,
                },
                // Authentication was enabled while this client runs
                // without a user: no retry can pass.
                _ if detail.contains("user name is empty") => Error::Auth {
                    url: url.to_string(),
                    detail: format!(
                        "{detail} (the cluster requires authentication: give the URL a user, \
                         etcd://USER:PASSWORD@HOST:PORT)"
                    ),
                },
                Code::Unauthenticated => Error::Auth {
                    url: url.to_string(),
                    detail,
                },
                Code::PermissionDenied => Error::Auth {
                    url: url.to_string(),
                    detail: format!(
                        "{detail} (the user's role needs read and write on the key prefix)"
                    ),
                },
                Code::DeadlineExceeded => Error::Timeout(Duration::ZERO),
                _ => Error::Etcd { detail },
            }
        }
        etcd_client::Error::TransportError(_) | etcd_client::Error::IoError(_) => {
            Error::Unreachable {
                url: url.to_string(),
                detail: one_line(&with_sources(&err)),
            }
        }
        _ => Error::Etcd {
            detail: one_line(&err.to_string()),
        },
    }
}

/// An error and its sources, `: `-separated (a transport error's own text
/// is only "transport error").
fn with_sources(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let more = cause.to_string();
        if !text.contains(&more) {
            text = format!("{text}: {more}");
        }
        source = cause.source();
    }
    text
}

/// [`classify`] for the first exchange, where a failure to talk at all
/// means the cluster is unreachable (or speaks TLS, or is not etcd).
fn classify_connect(err: etcd_client::Error, url: &str) -> Error {
    let tls = url.starts_with("etcds://");
    match classify(err, url) {
        Error::Etcd { detail } | Error::Unreachable { detail, .. }
            if tls && detail.contains("certificate") =>
        {
            Error::Tls {
                url: url.to_string(),
                detail: format!("{detail} (verify the cluster with its CA: --tls-ca, tls_ca_file)"),
            }
        }
        // A cluster that requires a client certificate ends the handshake
        // of a client without one; the client sees it cancelled, or the
        // connection fail.
        Error::Etcd { detail } | Error::Unreachable { detail, .. }
            if tls
                && !detail.contains("tcp connect error")
                && ["canceled", "transport error", "handshake", "alert"]
                    .iter()
                    .any(|word| detail.contains(word)) =>
        {
            Error::Tls {
                url: url.to_string(),
                detail: format!(
                    "{detail} (does the cluster require a client certificate? --tls-cert and \
                     --tls-key, tls_client_cert_file)"
                ),
            }
        }
        Error::Etcd { detail }
            if url.starts_with("etcd://") && !detail.contains("tcp connect error") =>
        {
            Error::Unreachable {
                url: url.to_string(),
                detail: format!("{detail} (is it an etcd cluster without TLS at that address?)"),
            }
        }
        Error::Etcd { detail } => Error::Unreachable {
            url: url.to_string(),
            detail,
        },
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(url: &str) -> EtcdTarget {
        EtcdTarget {
            url: url.to_string(),
            tls_ca: None,
            tls_cert: None,
            tls_key: None,
            bugs: EtcdBugs::default(),
        }
    }

    #[test]
    fn urls_name_every_member_and_the_credentials() {
        let parsed = target("etcd://app:p%40ss@10.0.0.1:2379,10.0.0.2:2379/")
            .parse()
            .expect("valid");
        assert_eq!(
            parsed.endpoints,
            ["http://10.0.0.1:2379", "http://10.0.0.2:2379"]
        );
        assert_eq!(parsed.user, Some(("app".into(), "p@ss".into())));
        assert!(!parsed.tls);
        assert_eq!(
            target("etcds://h:1").parse().expect("valid").endpoints,
            ["https://h:1"]
        );
    }

    #[test]
    fn bad_urls_get_one_line_without_the_password() {
        for bad in [
            "etcd://u:secret@h",
            "etcd://u:secret@h:0",
            "etcd://u:secret@h:1/path",
            "etcd://u:secret@:1",
            "etcd://:secret@h:1",
        ] {
            let err = target(bad).parse().expect_err(bad).to_string();
            assert!(!err.contains("secret"), "{err}");
            assert!(!err.contains('\n'), "{err}");
            assert!(err.contains("etcd://"), "{err}");
        }
    }

    /// A one-member cluster (stopped when dropped) and a store on it.
    async fn one_member() -> (etcd_process::EtcdCluster, EtcdStore) {
        let cluster = etcd_process::EtcdCluster::builder()
            .members(1)
            .election_timeout(Duration::from_millis(500))
            .start()
            .expect("an etcd member");
        let store = EtcdStore::connect(target(&cluster.url()), Duration::from_secs(2))
            .await
            .expect("connected");
        (cluster, store)
    }

    /// A store on one cluster whose only endpoint (a proxy) is then
    /// pointed at another one-member cluster that has a lease of the same
    /// id as the store's session lease, as a restore of the first
    /// cluster's snapshot under a new cluster token does (it keeps the
    /// leases, and the cluster id changes); and that lease.
    async fn lease_known_elsewhere() -> (
        [etcd_process::EtcdCluster; 2],
        etcd_process::Proxy,
        EtcdStore,
        i64,
    ) {
        let start = || {
            etcd_process::EtcdCluster::builder()
                .members(1)
                .election_timeout(Duration::from_millis(500))
                .start()
                .expect("an etcd member")
        };
        let (first, other) = (start(), start());
        let proxy = etcd_process::Proxy::start(first.client_port(0)).expect("a proxy");
        let url = format!("etcd://127.0.0.1:{}", proxy.port());
        let store = EtcdStore::connect(target(&url), Duration::from_secs(2))
            .await
            .expect("connected");
        let (lease, _) = store.session("me", 2_000).await.expect("a session lease");
        let grant = format!(r#"{{"TTL":"60","ID":"{lease}"}}"#);
        other
            .post(0, "/v3/lease/grant", &grant)
            .expect("the same lease id on the other cluster");
        proxy.retarget(other.client_port(0));
        ([first, other], proxy, store, lease)
    }

    /// `call` until it has an answer that is not a transient error: a call
    /// in flight when the proxy closed its connection fails.
    async fn answered<T>(
        call: impl Fn() -> futures_util::future::BoxFuture<'static, Result<T>>,
    ) -> Result<T> {
        tokio::time::timeout(Duration::from_secs(30), async {
            loop {
                match call().await {
                    Err(err) if err.is_transient() => {
                        tokio::time::sleep(Duration::from_millis(20)).await
                    }
                    other => return other,
                }
            }
        })
        .await
        .expect("an answer")
    }

    /// A keep-alive answered by another cluster that has a lease of the
    /// same id renews nothing here: it is refused, never taken for a
    /// renewal of this cluster's lease.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_keep_alive_answered_by_another_cluster_is_refused() {
        let (_clusters, _proxy, store, lease) = lease_known_elsewhere().await;
        let store = Arc::new(store);
        let kept = answered(|| {
            let store = store.clone();
            async move { store.keep_alive(lease).await }.boxed()
        })
        .await;
        assert!(matches!(kept, Err(Error::Unsafe { .. })), "{kept:?}");
    }

    /// Another cluster's lease lookups, grants and key listings are
    /// refused too: its word that a lease is gone would let a run be
    /// repeated early (the last-run marker's age), and a lease it granted
    /// is none of this cluster's.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn lease_answers_and_listings_from_another_cluster_are_refused() {
        let (_clusters, _proxy, store, lease) = lease_known_elsewhere().await;
        let store = Arc::new(store);
        let left = answered(|| {
            let store = store.clone();
            async move { store.ttl_left(lease).await }.boxed()
        })
        .await;
        assert!(matches!(left, Err(Error::Unsafe { .. })), "{left:?}");
        let granted = store.grant(2_000).await;
        assert!(matches!(granted, Err(Error::Unsafe { .. })), "{granted:?}");
        let listed = store.list_elections("tenure").await;
        assert!(matches!(listed, Err(Error::Unsafe { .. })), "{listed:?}");
    }

    /// Against a real cluster: a renewal or resignation that names another
    /// owner's term, or an older term, changes nothing.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_non_owner_can_neither_renew_nor_resign() {
        let (_cluster, store) = one_member().await;
        let at = Address::new("tenure", "owned");
        let request = AcquireRequest {
            id: "owner",
            attempt: "1",
            ttl_ms: 2_000,
            hold_off_ms: 2_000,
        };
        let AcquireReply::Won { token } = store.acquire(at, &request).await.expect("acquire")
        else {
            panic!("the first candidate wins");
        };
        let holder = || async { store.inspect(at).await.expect("inspect") };
        let before = holder().await.expect("held");
        for (id, token) in [
            ("intruder", token),
            ("owner", token - 1),
            ("owner", token + 1),
        ] {
            let renewed = store.renew(at, id, token, 2_000).await.expect("renew");
            assert!(matches!(renewed, RenewReply::NotOwner(_)), "{id} {token}");
            assert!(
                !store.resign(at, id, token).await.expect("resign"),
                "{id} {token}"
            );
            let many = store
                .renew_many("tenure", id, 2_000, &[("owned", token)])
                .await;
            assert!(
                matches!(many[..], [Ok(RenewReply::NotOwner(_))]),
                "{id} {token}: {many:?}"
            );
        }
        let after = holder().await.expect("still held");
        assert_eq!((after.owner.as_str(), after.token), ("owner", before.token));
        assert_eq!(
            store.renew(at, "owner", token, 2_000).await.expect("renew"),
            RenewReply::Renewed
        );
        assert!(store.resign(at, "owner", token).await.expect("resign"));
        assert!(holder().await.is_none());
        // With the key gone by hand, only the owner's release deletes the
        // witness that holds the candidates off.
        let AcquireReply::Won { token } = store.acquire(at, &request).await.expect("acquire")
        else {
            panic!("free again");
        };
        let key = lease_key(at).expect("a key");
        store
            .call(|mut c| {
                let key = key.clone();
                async move { c.delete(key, None).await }
            })
            .await
            .expect("deleted");
        let other = AcquireRequest {
            id: "other",
            ..request
        };
        assert!(!store.resign(at, "intruder", token).await.expect("resign"));
        assert!(matches!(
            store.acquire(at, &other).await.expect("acquire"),
            AcquireReply::HoldOff { .. }
        ));
        assert!(!store.resign(at, "owner", token).await.expect("resign"));
        assert!(matches!(
            store.acquire(at, &other).await.expect("acquire"),
            AcquireReply::Won { .. }
        ));
    }

    /// A term that ended without a release (nobody renews it) must not be
    /// kept alive by the instance's other terms on the same session lease:
    /// once a ttl has passed without a renewal, its key is deleted; a term
    /// that is renewed stays.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_term_nobody_renews_is_swept_while_its_session_lives_on() {
        let (_cluster, store) = one_member().await;
        let request = AcquireRequest {
            id: "me",
            attempt: "1",
            ttl_ms: 1_000,
            hold_off_ms: 1_000,
        };
        let (dead, live) = (
            Address::new("tenure", "dead"),
            Address::new("tenure", "live"),
        );
        let won = |reply| match reply {
            Ok(AcquireReply::Won { token }) => token,
            other => panic!("{other:?}"),
        };
        let began = tokio::time::Instant::now();
        let _dead_token = won(store.acquire(dead, &request).await);
        let live_token = won(store.acquire(live, &request).await);
        // Not before a ttl: the term may still be running.
        store.sweep().await;
        assert!(store.inspect(dead).await.expect("inspect").is_some());
        let swept_at = tokio::time::timeout(Duration::from_secs(30), async {
            loop {
                let renewed = store.renew(live, "me", live_token, 1_000).await;
                assert_eq!(renewed.expect("renew"), RenewReply::Renewed);
                store.sweep().await;
                if store.inspect(dead).await.expect("inspect").is_none() {
                    return tokio::time::Instant::now();
                }
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        })
        .await
        .expect("the ended term's key is deleted while the session lives on");
        assert!(swept_at - began >= Duration::from_secs(1));
        let live = store.inspect(live).await.expect("inspect").expect("held");
        assert_eq!(live.token, live_token);
    }

    /// Many terms of one instance begun at once, before it has a session
    /// lease: one lease is granted, and every term is on it (renewable).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn terms_begun_at_once_share_one_session_lease() {
        let (_cluster, store) = one_member().await;
        let names: Vec<String> = (0..8).map(|i| format!("p{i}")).collect();
        let keys: Vec<Address<'_>> = names.iter().map(|n| Address::new("tenure", n)).collect();
        let request = AcquireRequest {
            id: "me",
            attempt: "1",
            ttl_ms: 2_000,
            hold_off_ms: 2_000,
        };
        let won = join_all(keys.iter().map(|k| store.acquire(*k, &request))).await;
        for (keys, reply) in keys.iter().zip(won) {
            let Ok(AcquireReply::Won { token }) = reply else {
                panic!("{reply:?}");
            };
            let renewed = store.renew(*keys, "me", token, 2_000).await.expect("renew");
            assert_eq!(renewed, RenewReply::Renewed, "{}", keys.name);
        }
        // One session lease and one witness lease.
        assert_eq!(store.sessions_lock().len(), 2);
    }
}
