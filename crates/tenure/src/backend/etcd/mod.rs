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
//!
//! **Files**, one purpose each, after etcd's own client package: this one
//! holds the store and dispatches a batch's operations; `session.rs` the
//! session leases and their keep-alives; `election.rs` acquire, resign
//! and inspect; `renew.rs` renewals; `sweep.rs` the terms this store
//! began and their sweep; `last_run.rs` the last-run marker; `members.rs`
//! a partition set's members; `watch.rs` the announcements; `codec.rs`
//! the values and `layout.rs` the keys; `calls.rs` every gRPC call
//! (hedging, cluster checks, errors); `target.rs` and `tls.rs` the URL and
//! the TLS settings.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{Client, Compare, CompareOp, ConnectOptions, GetOptions, Txn, TxnOp};
use futures_util::future::join_all;

use super::address::Address;
use super::op::{Hints, Op, Reply};
use super::options::EtcdBugs;
use crate::{Error, Result};
use calls::{classify_connect, one_cluster, send, Clients};
use layout::{counter_key, lease_key, members_prefix, witness_key};
use session::{KeepAlives, KEEP_ALIVES};
use sweep::{Kept, Pending};
use target::EtcdUrl;

mod calls;
mod codec;
mod election;
mod last_run;
mod layout;
mod members;
mod renew;
mod session;
mod sweep;
mod target;
mod tls;
mod watch;

#[cfg(test)]
mod tests;

pub(crate) use target::EtcdTarget;

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
    /// Each session lease's keep-alive stream, kept open between renewals
    /// with every answer read (see [`EtcdStore::keep_alive`]).
    streams: session::Streams,
    /// The terms this store began and has not seen released, by key: see
    /// [`EtcdStore::sweep`].
    terms: Mutex<HashMap<String, Kept>>,
    /// The acquires sent whose answers were not read yet, by the number
    /// [`EtcdStore::pend`] gave them: see [`EtcdStore::sweep`].
    pending: Mutex<HashMap<u64, Pending>>,
    pended: AtomicU64,
    /// Tests: the next acquire whose transaction is answered waits until
    /// this is notified before it reads its answer, as one whose answer is
    /// late does (for ever, if it is never notified).
    #[cfg(test)]
    stall_next_answer: Mutex<Option<Arc<tokio::sync::Notify>>>,
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

impl EtcdStore {
    /// Connect to `target` and check that the cluster answers and accepts
    /// the credentials.
    pub async fn connect(target: EtcdTarget, call_timeout: Duration) -> Result<EtcdStore> {
        let parsed = target.parse()?;
        let url = target.redacted();
        let options = connect_options(&target, &parsed, call_timeout)?;
        let client = open(&parsed, &options, call_timeout, &url).await?;
        let cluster_id = first_status(&client, target.bugs.no_hedges, call_timeout, &url).await?;
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
            streams: session::Streams::default(),
            terms: Mutex::new(HashMap::new()),
            pending: Mutex::new(HashMap::new()),
            pended: AtomicU64::new(0),
            #[cfg(test)]
            stall_next_answer: Mutex::new(None),
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

    /// An election on this cluster: checked, and a watch on its key and
    /// witness.
    pub async fn election(self: &Arc<Self>, at: Address<'_>, ttl: Duration) -> Result<Hints> {
        self.check(at, false, ttl).await?;
        let (notices, watcher) = self.watch(vec![lease_key(at)?, witness_key(at)?]);
        Ok(Hints {
            notices,
            guard: Some(Box::new(watcher)),
        })
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
                    slot,
                } => self
                    .record_run(at, id, token, keep_ms, slot)
                    .await
                    .map(Reply::RecordRun),
            }
        })
        .await;
        bounded.unwrap_or(Err(Error::Timeout(self.call_timeout)))
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
}

/// The client settings of [`EtcdStore::connect`]: timeouts, keep-alive
/// pings, TLS and the user.
fn connect_options(
    target: &EtcdTarget,
    parsed: &EtcdUrl,
    call_timeout: Duration,
) -> Result<ConnectOptions> {
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
    if let Some(tls) = target.tls_options(parsed)? {
        options = options.with_tls(tls);
    }
    #[cfg(not(feature = "tls"))]
    target.tls_options(parsed)?;
    if let Some((name, password)) = &parsed.user {
        options = options.with_user(name.clone(), password.clone());
    }
    Ok(options)
}

/// The client of [`EtcdStore::connect`], balanced over every endpoint.
async fn open(
    parsed: &EtcdUrl,
    options: &ConnectOptions,
    call_timeout: Duration,
    url: &str,
) -> Result<Client> {
    let connected = tokio::time::timeout(
        call_timeout.saturating_mul(2),
        Client::connect(parsed.endpoints.clone(), Some(options.clone())),
    )
    .await;
    match connected {
        Ok(Ok(client)) => Ok(client),
        Ok(Err(err)) => Err(classify_connect(err, url)),
        Err(_) => Err(Error::Unreachable {
            url: url.to_string(),
            detail: format!("no answer within {:?}", call_timeout.saturating_mul(2)),
        }),
    }
}

/// The id of the cluster `client` reached, from its first call.
async fn first_status(
    client: &Client,
    no_hedges: bool,
    call_timeout: Duration,
    url: &str,
) -> Result<u64> {
    // The first call proves the cluster answers (and has a leader).
    let requests = AtomicU64::new(0);
    let patience = call_timeout / 3;
    let alone = Clients::of(client, no_hedges);
    let status = send(&alone, &requests, patience, |mut c| async move {
        c.status().await
    });
    let status = tokio::time::timeout(call_timeout, status).await;
    match status {
        Ok(Ok(status)) => Ok(status.header().map_or(0, |h| h.cluster_id())),
        Ok(Err(err)) => Err(classify_connect(err, url)),
        Err(_) => Err(Error::Unreachable {
            url: url.to_string(),
            detail: format!("no answer within {call_timeout:?}"),
        }),
    }
}

#[cfg(test)]
impl EtcdStore {
    /// Tests: the next acquire whose transaction is answered waits, before
    /// it reads its answer, until the gate returned is notified.
    fn stall_next_answer(&self) -> Arc<tokio::sync::Notify> {
        let gate = Arc::new(tokio::sync::Notify::new());
        *self
            .stall_next_answer
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(gate.clone());
        gate
    }

    /// See [`EtcdStore::stall_next_answer`].
    async fn stall_answer(&self) {
        let gate = self
            .stall_next_answer
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(gate) = gate {
            gate.notified().await;
        }
    }
}
