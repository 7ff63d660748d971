//! The ZooKeeper backend: the same operations as etcd, on ZooKeeper's
//! sessions and ephemeral znodes.
//!
//! ZooKeeper replicates every write through its atomic broadcast (Zab)
//! before it answers, so an acknowledged lease survives the loss of any
//! minority of members, a leader change and a restart of the whole
//! ensemble, as on etcd; no start-up hold-off is needed.
//!
//! **Sessions are the leases.** The store keeps one ZooKeeper session per
//! ttl, whose session timeout *is* the ttl (a ttl the ensemble will not
//! grant, outside its `minSessionTimeout`..`maxSessionTimeout`, is a
//! configuration error, never silently shortened). Every term of that
//! ttl, and a partition set's membership, is an ephemeral znode of it, so
//! the client's own traffic keeps them all. The local deadline follows the
//! rule of every backend: the caller notes the instant *before* it hands
//! an operation to this module, and a renewal is a request on the term's
//! session sent after it; ZooKeeper expires a session no earlier than its
//! timeout after the last request it received. A renewal is a `multi` of
//! version checks of the lease and its witness: a write, so it passes
//! through the ensemble's leader, and a member cut off from the quorum
//! cannot answer it (a read would be answered from a stale view). What the
//! client library says about its connection plays no part: a suspended
//! connection answers nothing, and so renews nothing.
//!
//! **Layout** (`layout.rs`): the lease `/PREFIX/NAME` is created, only if
//! absent, in one `multi` with the term's witness `/PREFIX/{NAME}/w-TOKEN`
//! and with the token counter (the data of `/PREFIX/{NAME}`), only if the
//! counter's version is still as read.
//!
//! **The fencing token is counted**: max(the counter + 1, the candidate's
//! clock in ms), as on etcd. A znode's creation zxid would rise too, but a
//! restore from an older snapshot rolls zxids back, and new terms would
//! repeat the tokens of earlier ones; the clock keeps them above every
//! earlier token across such a restore.
//!
//! **Only the holder's release lets a candidate in early.** A lease can
//! also vanish by hand (`deleteall`, `delete`); then the witness is still
//! there, and a candidate that finds the lease gone but a witness there is
//! held off until the witness goes: its holder deletes it in its release,
//! after it stopped, and it goes with its session (no earlier than the
//! holder's deadline) when the holder is cut off or dead. A renewal checks
//! both, so a term holds only while both live.
//!
//! **A term that ends without its release** (the release timed out, the
//! deadline passed while the ensemble was away) would keep its znodes on a
//! session that the instance's other terms keep alive: the store
//! remembers the terms it began and deletes the znodes of any that nobody
//! renewed for a whole ttl (`sweep.rs`), and the members that nobody
//! heartbeat for one.
//!
//! **Announcements** are a watch on the lease znode (`watch.rs`): its
//! deletion wakes followers at once. A watch is a hint; the lease is the
//! truth.
//!
//! **Files**: this one holds the store, its sessions and the dispatch of
//! a batch; `election.rs` acquire, resign and inspect; `renew.rs`
//! renewals; `members.rs` a partition set's members; `last_run.rs` the
//! marker; `sweep.rs` the terms begun here; `watch.rs` the announcements;
//! `codec.rs` the values, `layout.rs` the paths and `target.rs` the URL.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use futures_util::future::join_all;
use zookeeper_client as zk;

use super::address::Address;
use super::op::{Op, Reply};
use super::options::ZkBugs;
use crate::error::one_line;
use crate::{Error, Result};
use layout::Paths;
pub(crate) use sweep::start as start_sweep;
use target::ZkUrl;

mod codec;
mod election;
mod ensemble;
mod last_run;
mod layout;
mod members;
mod renew;
mod sweep;
mod target;
mod watch;

#[cfg(test)]
mod tests;

/// The session timeout asked for the session that serves operations with
/// no ttl of their own (inspect, listing, the last-run marker) while no
/// session of a ttl is open.
const READER_TIMEOUT: Duration = Duration::from_secs(10);

/// A ZooKeeper ensemble: one session per ttl, and what this store began.
pub(crate) struct ZkStore {
    url: ZkUrl,
    call_timeout: Duration,
    /// The session of each ttl (ms); 0 is the reader's.
    sessions: tokio::sync::Mutex<HashMap<u64, zk::Client>>,
    /// The terms this store began and has not seen end, by lease path.
    terms: Mutex<HashMap<String, sweep::Kept>>,
    /// The partition-set members this store keeps, by member path.
    members: Mutex<HashMap<String, sweep::Kept>>,
    /// Requests sent.
    requests: AtomicU64,
    /// The ensemble's mark, once read (URLs of two or more hosts; see
    /// `ensemble.rs`): every new session must find the same.
    mark: Mutex<Option<String>>,
    bugs: ZkBugs,
}

/// A session in a state that may still answer (a disconnected one
/// reconnects by itself; an expired, closed or refused one never will).
fn usable(client: &zk::Client) -> bool {
    !matches!(
        client.state(),
        zk::SessionState::Expired | zk::SessionState::Closed | zk::SessionState::AuthFailed
    )
}

impl ZkStore {
    /// Connect to the ensemble `url` names: the first session proves it
    /// answers and takes the credentials.
    pub async fn connect(url: &str, call_timeout: Duration, bugs: ZkBugs) -> Result<ZkStore> {
        let store = ZkStore {
            url: ZkUrl::parse(url)?,
            call_timeout,
            sessions: tokio::sync::Mutex::new(HashMap::new()),
            terms: Mutex::new(HashMap::new()),
            members: Mutex::new(HashMap::new()),
            requests: AtomicU64::new(0),
            mark: Mutex::new(None),
            bugs,
        };
        let reader = store.session(0).await?;
        // An unknown chroot or a refused user shows now, not mid-term.
        store.call("/", reader.check_stat("/")).await?;
        store.one_ensemble(&reader).await?;
        Ok(store)
    }

    pub fn url(&self) -> &str {
        &self.url.redacted
    }

    fn paths(&self, at: Address<'_>) -> Result<Paths> {
        Paths::of(&self.url.chroot, at)
    }

    /// The ACL of every znode tenure creates: the digest user's alone when
    /// the URL names one, else open (as ZooKeeper's own default).
    fn acls(&self) -> zk::Acls<'static> {
        if self.url.user.is_some() {
            zk::Acls::creator_all()
        } else {
            zk::Acls::anyone_all()
        }
    }

    /// The session of `ttl_ms`, opened now if there is none or it
    /// expired; for 0, any open session, else the reader's.
    ///
    /// Operations with no ttl of their own create no ephemeral znode, so
    /// any session serves them: the reader opened at connect is closed as
    /// soon as a session of a ttl opens, and a process that campaigns on
    /// one ttl keeps one session, whose pings are its only idle traffic.
    async fn session(&self, ttl_ms: u64) -> Result<zk::Client> {
        let mut sessions = self.sessions.lock().await;
        if let Some(client) = sessions.get(&ttl_ms).filter(|c| usable(c)) {
            return Ok(client.clone());
        }
        if ttl_ms == 0 {
            if let Some(client) = sessions.values().find(|c| usable(c)) {
                return Ok(client.clone());
            }
        }
        let client = match ttl_ms {
            // Not detached: it holds no lease, so when its last clone
            // goes, its session is closed at once rather than left to
            // expire.
            0 => self.open_on(&self.url.hosts, READER_TIMEOUT, false).await?,
            ms => self.open(Duration::from_millis(ms)).await?,
        };
        let timeout = Duration::from_millis(ttl_ms);
        if ttl_ms != 0 && client.session_timeout() != timeout {
            return Err(Error::Config(format!(
                "{} gives sessions a timeout of {:?}, not the ttl {timeout:?}: on ZooKeeper \
                 the session timeout is the ttl, so choose a ttl within the ensemble's \
                 minSessionTimeout and maxSessionTimeout (by default 2 and 20 ticks)",
                self.url.redacted,
                client.session_timeout()
            )));
        }
        self.same_ensemble(&client).await?;
        if ttl_ms != 0 {
            sessions.remove(&0);
        }
        sessions.insert(ttl_ms, client.clone());
        Ok(client)
    }

    /// The session a term of `ttl_ms` lives on, if it is open and usable.
    async fn session_if_open(&self, ttl_ms: u64) -> Option<zk::Client> {
        let sessions = self.sessions.lock().await;
        sessions.get(&ttl_ms).filter(|c| usable(c)).cloned()
    }

    /// A new session with `timeout`.
    async fn open(&self, timeout: Duration) -> Result<zk::Client> {
        self.open_on(&self.url.hosts, timeout, true).await
    }

    /// A new session with `timeout` on one of `hosts`; `detached`, it
    /// outlives its last client (see below).
    async fn open_on(&self, hosts: &str, timeout: Duration, detached: bool) -> Result<zk::Client> {
        let mut connector = zk::Client::connector()
            .with_session_timeout(timeout)
            .with_connection_timeout(self.call_timeout.min(timeout / 3))
            .with_fail_eagerly();
        if detached {
            // A store dropped without its terms' releases (a crash of the
            // code holding it) leaves its leases to expire with the
            // session, as on every store: only a release lets a candidate
            // in early.
            connector = connector.with_detached();
        }
        if let Some((user, password)) = &self.url.user {
            connector = connector.with_auth("digest", format!("{user}:{password}").as_bytes());
        }
        self.requests.fetch_add(1, Ordering::Relaxed);
        let limit = self
            .call_timeout
            .saturating_mul(2)
            .max(Duration::from_secs(2));
        let connected = tokio::time::timeout(limit, connector.connect(hosts)).await;
        match connected {
            Ok(Ok(client)) => Ok(client),
            Ok(Err(zk::Error::AuthFailed)) => Err(Error::Auth {
                url: self.url.redacted.clone(),
                detail: "the digest user or password was refused".into(),
            }),
            Ok(Err(err)) => Err(Error::Unreachable {
                url: self.url.redacted.clone(),
                detail: one_line(&err.to_string()),
            }),
            Err(_) => Err(Error::Unreachable {
                url: self.url.redacted.clone(),
                detail: format!("no session within {limit:?}"),
            }),
        }
    }

    /// One request, bounded by the call timeout and counted: the outer
    /// error is the timeout, the inner one ZooKeeper's answer.
    async fn call_raw<T>(
        &self,
        request: impl std::future::Future<Output = std::result::Result<T, zk::Error>>,
    ) -> Result<std::result::Result<T, zk::Error>> {
        self.requests.fetch_add(1, Ordering::Relaxed);
        tokio::time::timeout(self.call_timeout, request)
            .await
            .map_err(|_| Error::Timeout(self.call_timeout))
    }

    /// One request on `path`.
    async fn call<T>(
        &self,
        path: &str,
        request: impl std::future::Future<Output = std::result::Result<T, zk::Error>>,
    ) -> Result<T> {
        self.call_raw(request)
            .await?
            .map_err(|err| self.classify(path, err))
    }

    /// One request on `path`, which may not exist (`None`).
    async fn call_opt<T>(
        &self,
        path: &str,
        request: impl std::future::Future<Output = std::result::Result<T, zk::Error>>,
    ) -> Result<Option<T>> {
        match self.call_raw(request).await? {
            Ok(value) => Ok(Some(value)),
            Err(zk::Error::NoNode) => Ok(None),
            Err(err) => Err(self.classify(path, err)),
        }
    }

    /// tenure's error for a ZooKeeper error on `path`.
    fn classify(&self, path: &str, err: zk::Error) -> Error {
        match err {
            zk::Error::NoAuth => Error::Auth {
                url: self.url.redacted.clone(),
                detail: format!(
                    "the ACL of {path} (or its parent) does not let this user read, write, \
                     create and delete there"
                ),
            },
            zk::Error::AuthFailed => Error::Auth {
                url: self.url.redacted.clone(),
                detail: "the digest user or password was refused".into(),
            },
            zk::Error::NoChildrenForEphemerals => Error::ForeignData {
                key: path.to_string(),
                detail: "a parent of it is an ephemeral znode".into(),
            },
            other => Error::ZooKeeper {
                detail: one_line(&format!("{path}: {other}")),
            },
        }
    }

    /// Create `path` and its missing parents (persistent, empty).
    async fn make_path(&self, client: &zk::Client, path: &str) -> Result<()> {
        let acls = self.acls();
        let options = zk::CreateMode::Persistent.with_acls(acls);
        self.call(path, client.mkdir(path, &options)).await
    }

    /// Check that `ttl` is a session timeout the ensemble grants, that the
    /// election's znodes can be made, and that what is there is tenure's.
    pub async fn check(&self, at: Address<'_>, ttl: Duration) -> Result<()> {
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        let client = self.session(ttl_ms).await?;
        let paths = self.paths(at)?;
        self.make_path(&client, &paths.dir).await?;
        let (data, _) = self.call(&paths.dir, client.get_data(&paths.dir)).await?;
        codec::decode_counter(&paths.dir, &data)?;
        match self
            .call_opt(&paths.lease, client.get_data(&paths.lease))
            .await?
        {
            Some((data, stat)) => {
                codec::decode_lease(&paths.lease, &data, stat.ephemeral_owner).map(|_| ())
            }
            None => Ok(()),
        }
    }

    /// Carry out `ops`, all at once; each has its own outcome.
    pub async fn batch(
        &self,
        ops: &[Op<'_>],
        round_trips: &AtomicU64,
    ) -> Result<Vec<Result<Reply>>> {
        let before = self.requests.load(Ordering::Relaxed);
        let replies = join_all(ops.iter().map(|op| self.apply(op))).await;
        round_trips.fetch_add(
            self.requests.load(Ordering::Relaxed).saturating_sub(before),
            Ordering::Relaxed,
        );
        Ok(replies)
    }

    async fn apply(&self, op: &Op<'_>) -> Result<Reply> {
        let bounded = tokio::time::timeout(self.call_timeout.saturating_mul(2), async {
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

    /// Names of the elections held under `prefix` now, sorted.
    pub async fn list_elections(&self, prefix: &str) -> Result<Vec<String>> {
        let paths = self.paths(Address::new(prefix, "-"))?;
        let client = self.session(0).await?;
        let listed = self.call_opt(&paths.root, client.list_children(&paths.root));
        let Some(children) = listed.await? else {
            return Ok(Vec::new());
        };
        let mut names: Vec<String> = children
            .iter()
            .filter(|child| !child.starts_with('{'))
            .map(|child| layout::name_of(child))
            .collect();
        names.sort();
        Ok(names)
    }
}
