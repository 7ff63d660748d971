//! A deterministic in-process backend, for tests.
//!
//! [`MemoryStore`] keeps leases in a map and measures their TTLs with
//! tokio's clock, so tests that pause time (`#[tokio::test(start_paused =
//! true)]`) run the whole election protocol instantly and identically on
//! every run. It also lets a test do what is hard to arrange against a real
//! server: revoke or delete a lease now (its witness stays, as on every
//! store), hand it to another owner, lose all data, or make every call
//! fail or hang. A [`MemoryStore::view`] is one client's
//! connection to the same data, with faults and announcements of its own,
//! so one instance can be cut off, slowed or deafened while others work.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::{Address, Backend, Notices, Op, Reply, Store};
use crate::machine::{AcquireReply, AcquireRequest, RenewReply};
use crate::term::Holder;
use crate::term::LeaderInfo;
use crate::{Error, Result};

/// How calls to a [`MemoryStore`] behave, to simulate outages.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
/// use std::time::Duration;
/// let store = tenure::MemoryStore::new();
/// let election = tenure::Election::builder("jobs")
///     .memory(&store)
///     .ttl(Duration::from_millis(300))
///     .build()
///     .await?;
/// let term = election.campaign().await?;
/// store.set_fault(tenure::Fault::Stall); // Redis stops answering
/// let reason = term.lost().await; // at the local deadline, without any reply
/// assert_eq!(reason, tenure::LostReason::DeadlinePassed);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Fault {
    /// Calls work.
    #[default]
    None,
    /// Calls fail at once with [`Error::Unavailable`] (a refused connection).
    Fail,
    /// Calls never answer (a paused server or a black-holed network); the
    /// election's per-call timeout ends them.
    Stall,
    /// Calls are carried out, but their replies are lost: each fails with
    /// [`Error::Unavailable`] after changing the store, as a request whose
    /// connection dropped after the server ran it.
    LoseReplies,
    /// Calls are carried out at once, and each reply arrives after this
    /// long (a slow link or a busy server); a reply later than the call
    /// timeout is a timeout, as on Redis.
    Slow(Duration),
}

/// How a view's announcements (the hints that a lease was released, taken
/// or renewed) reach the elections built on it; see [`MemoryStore::view`].
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use std::time::Duration;
/// let store = tenure::MemoryStore::new();
/// let view = store.view();
/// view.set_announcements(tenure::Announcements::Delayed(Duration::from_millis(50)));
/// view.set_announcements(tenure::Announcements::Lost); // until set back
/// view.set_announcements(tenure::Announcements::Delivered);
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Announcements {
    /// Each arrives at once.
    #[default]
    Delivered,
    /// Each arrives this long after it was sent.
    Delayed(Duration),
    /// They are dropped (a later one still carries every change, as the
    /// counters it holds have moved on).
    Lost,
}

/// An in-memory lease store shared by any number of elections, for tests.
///
/// Clones share the same store (and, for a [`MemoryStore::view`], the same
/// view).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
/// use std::time::Duration;
/// let store = tenure::MemoryStore::new();
/// let election = tenure::Election::builder("jobs")
///     .memory(&store)
///     .ttl(Duration::from_secs(3))
///     .build()
///     .await?;
/// let term = election.campaign().await?;
/// assert!(term.is_leader());
///
/// store.revoke("jobs"); // simulate losing the lease right now
/// let reason = term.lost().await;
/// assert!(!term.is_leader());
/// println!("lost: {reason}");
/// # Ok(()) }
/// ```
#[derive(Clone, Default)]
pub struct MemoryStore {
    state: Arc<Mutex<StoreState>>,
    /// Set on a [`MemoryStore::view`]: that client's own behaviour.
    view: Option<Arc<Mutex<View>>>,
}

/// One client's connection to a shared [`MemoryStore`].
#[derive(Debug, Default)]
struct View {
    fault: Fault,
    announcements: Announcements,
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore").finish_non_exhaustive()
    }
}

#[derive(Default)]
struct StoreState {
    leases: HashMap<String, Lease>,
    last_tokens: HashMap<String, u64>,
    /// Survives [`MemoryStore::wipe`], standing in for the server clock
    /// that keeps Redis tokens rising across a restart.
    token_floor: u64,
    notices: HashMap<String, watch::Sender<Notices>>,
    fault: Fault,
    /// Set by [`MemoryStore::wipe`]: elections first asked for a lease
    /// after it wait one ttl from then (the start-up hold-off).
    wiped: bool,
    hold_off_since: HashMap<String, Instant>,
    calls: HashMap<String, Calls>,
    /// Partition-set members by group: heartbeat expiry by member id.
    members: HashMap<String, BTreeMap<String, Instant>>,
    /// Last-run markers by election.
    runs: HashMap<String, Run>,
    /// Each term's witness, by election: as on Redis and etcd, it lives as
    /// long as the lease would and is removed only by its holder's
    /// release, so a lease that vanishes any other way
    /// ([`MemoryStore::revoke`], [`MemoryStore::delete`]) holds the
    /// election off until its holder has surely stopped.
    witnesses: HashMap<String, Witness>,
    /// See [`MemoryStore::unsafe_ignore_witness`].
    ignore_witness: bool,
}

/// A term's witness (see [`StoreState::witnesses`]).
#[derive(Debug, Clone)]
struct Witness {
    owner: String,
    token: u64,
    expires: Instant,
}

/// A recorded successful run ([`Op::RecordRun`]).
#[derive(Debug, Clone, Copy)]
struct Run {
    at: Instant,
    token: u64,
    expires: Instant,
}

/// How many requests an election's members made of a [`MemoryStore`]:
/// what they would have cost a Redis server.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
/// let store = tenure::MemoryStore::new();
/// let election = tenure::Election::builder("jobs").memory(&store).build().await?;
/// let term = election.campaign().await?;
/// term.resign().await?;
/// let calls: tenure::Calls = store.calls("jobs");
/// assert_eq!((calls.acquire, calls.resign), (1, 1));
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Calls {
    /// Acquire attempts (won or not).
    pub acquire: u64,
    /// Renewals.
    pub renew: u64,
    /// Resignations.
    pub resign: u64,
    /// Leader look-ups.
    pub inspect: u64,
    /// Partition-set heartbeats (counted under the group's name).
    pub heartbeat: u64,
    /// Reads of the last-run marker ([`crate::Election::since_last_run`]).
    pub last_run: u64,
    /// Records of a run ([`crate::Leadership::record_run`]), accepted or not.
    pub record_run: u64,
}

#[derive(Debug, Clone)]
struct Lease {
    owner: String,
    token: u64,
    expires: Instant,
    since_ms: u64,
    attempt: String,
    ttl: Duration,
}

/// The leases and token counters of a [`MemoryStore`] at one instant, for
/// [`MemoryStore::restore`]: what a Redis snapshot (RDB) holds.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
/// let store = tenure::MemoryStore::new();
/// let snapshot = store.snapshot();
/// store.restore(&snapshot); // as a Redis restart that loads an old RDB file
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Snapshot {
    leases: HashMap<String, Lease>,
    last_tokens: HashMap<String, u64>,
    runs: HashMap<String, Run>,
    witnesses: HashMap<String, Witness>,
}

impl StoreState {
    /// The live lease of an election, dropping it if it has expired.
    fn live_lease(&mut self, election: &str, now: Instant) -> Option<&mut Lease> {
        if self
            .leases
            .get(election)
            .is_some_and(|lease| lease.expires <= now)
        {
            self.leases.remove(election);
        }
        self.leases.get_mut(election)
    }

    fn next_token(&mut self, election: &str) -> u64 {
        let last = self.last_tokens.get(election).copied().unwrap_or(0);
        let token = (last + 1).max(self.token_floor + 1);
        self.last_tokens.insert(election.to_string(), token);
        self.token_floor = self.token_floor.max(token);
        token
    }

    fn notify(&mut self, election: &str, change: impl FnOnce(&mut Notices)) {
        self.notices
            .entry(election.to_string())
            .or_insert_with(|| watch::channel(Notices::default()).0)
            .send_modify(change);
    }
}

impl MemoryStore {
    /// An empty store.
    ///
    /// ```
    /// let store = tenure::MemoryStore::new();
    /// assert!(store.holder("jobs").is_none());
    /// assert_eq!(store.calls("jobs"), tenure::Calls::default());
    /// ```
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, StoreState> {
        // A panic while holding this lock can only come from a bug in this
        // file; the state is still consistent, so keep going.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Make every later call fail, hang, or work again. On a
    /// [`MemoryStore::view`] this is the view's own fault: only calls made
    /// through it are affected (a fault of the whole store, set on the
    /// store itself, applies to views too and takes precedence).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// let store = tenure::MemoryStore::new();
    /// let election = tenure::Election::builder("jobs").memory(&store).build().await?;
    /// store.set_fault(tenure::Fault::Fail); // as if Redis refused connections
    /// assert!(matches!(election.leader().await, Err(tenure::Error::Unavailable)));
    /// store.set_fault(tenure::Fault::None);
    /// assert!(election.leader().await?.is_none());
    /// # Ok(()) }
    /// ```
    pub fn set_fault(&self, fault: Fault) {
        match &self.view {
            Some(view) => lock(view).fault = fault,
            None => self.lock().fault = fault,
        }
    }

    /// Another client's connection to this store: the same leases, tokens
    /// and members, but its own [`Fault`] and [`Announcements`], so that
    /// one instance's calls can fail, stall or lose their replies, and its
    /// announcements arrive late or not at all, while other instances work.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// use std::time::Duration;
    /// let store = tenure::MemoryStore::new();
    /// let (view_a, view_b) = (store.view(), store.view());
    /// let ttl = Duration::from_millis(300);
    /// let a = tenure::Election::builder("jobs").memory(&view_a).id("a").ttl(ttl).build().await?;
    /// let b = tenure::Election::builder("jobs").memory(&view_b).id("b").ttl(ttl).build().await?;
    /// let term = a.campaign().await?;
    /// view_a.set_fault(tenure::Fault::Stall); // only a is cut off
    /// assert_eq!(term.lost().await, tenure::LostReason::DeadlinePassed);
    /// let next = b.campaign().await?; // b still reaches the store
    /// assert!(next.token() > term.token());
    /// # Ok(()) }
    /// ```
    pub fn view(&self) -> MemoryStore {
        MemoryStore {
            state: self.state.clone(),
            view: Some(Arc::new(Mutex::new(View::default()))),
        }
    }

    /// How announcements reach the elections built on this view from now
    /// on. Only views have their own: on the store itself this does nothing.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// # use std::time::Duration;
    /// let store = tenure::MemoryStore::new();
    /// let view_b = store.view();
    /// view_b.set_announcements(tenure::Announcements::Lost); // b hears of no change
    /// let a = tenure::Election::builder("jobs").memory(&store).id("a").build().await?;
    /// let b = tenure::Election::builder("jobs").memory(&view_b).id("b").ttl(Duration::from_millis(300)).build().await?;
    /// let term = a.campaign().await?;
    /// let first = term.token();
    /// let b_campaigns = tokio::spawn(async move { b.campaign().await });
    /// term.resign().await?;
    /// let next = b_campaigns.await.unwrap()?; // b found the lease free by polling
    /// assert!(next.token() > first);
    /// # Ok(()) }
    /// ```
    pub fn set_announcements(&self, announcements: Announcements) {
        if let Some(view) = &self.view {
            lock(view).announcements = announcements;
        }
    }

    /// Delete an election's lease without announcing it, as if it expired
    /// or Redis evicted it. The holder learns at its next renewal. As on
    /// every store, the lease's witness stays: no other candidate is
    /// granted the election until the holder has released it (after it
    /// stopped) or it has run out.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// # use std::time::Duration;
    /// let store = tenure::MemoryStore::new();
    /// let a = tenure::Election::builder("jobs").memory(&store).ttl(Duration::from_millis(300)).build().await?;
    /// let term = a.campaign().await?;
    /// store.revoke("jobs");
    /// assert!(store.holder("jobs").is_none());
    /// assert_eq!(term.lost().await, tenure::LostReason::Expired); // at its next renewal
    /// # Ok(()) }
    /// ```
    pub fn revoke(&self, election: &str) {
        self.lock().leases.remove(election);
    }

    /// Delete an election's lease by hand, as an operator forcing a
    /// re-election would (`DEL`, `etcdctl del`), and announce it, as
    /// etcd's watch does: the holder renews at once and stops, and only
    /// then releases the witness that holds the candidates off.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// let store = tenure::MemoryStore::new();
    /// let a = tenure::Election::builder("jobs").memory(&store).id("a").build().await?;
    /// let b = tenure::Election::builder("jobs").memory(&store).id("b").build().await?;
    /// let term = a.campaign().await?;
    /// store.delete("jobs");
    /// let next = b.campaign().await?;
    /// assert!(!term.is_leader(), "a stopped before b was elected");
    /// assert!(next.token() > term.token());
    /// # Ok(()) }
    /// ```
    pub fn delete(&self, election: &str) {
        let mut state = self.lock();
        state.leases.remove(election);
        state.notify(election, |n| n.released += 1);
    }

    /// **Unsafe; for failing-mode tests only.** Grant an election whose
    /// lease vanished without waiting for its witness, as before tenure
    /// kept one: a lease deleted by hand then lets a candidate in while
    /// its holder still acts.
    #[doc(hidden)]
    pub fn unsafe_ignore_witness(&self, on: bool) {
        self.lock().ignore_witness = on;
    }

    /// Give an election's lease to `owner` with a new token, as if another
    /// instance took over; returns that token.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// use std::time::Duration;
    /// let store = tenure::MemoryStore::new();
    /// let a = tenure::Election::builder("jobs").memory(&store).ttl(Duration::from_millis(300)).build().await?;
    /// let term = a.campaign().await?;
    /// let stolen = store.steal("jobs", "intruder", Duration::from_secs(10));
    /// assert!(stolen > term.token());
    /// let lost = term.lost().await;
    /// assert_eq!(lost, tenure::LostReason::Taken { by: "intruder".into(), token: stolen });
    /// # Ok(()) }
    /// ```
    pub fn steal(&self, election: &str, owner: &str, ttl: Duration) -> u64 {
        let mut state = self.lock();
        let token = state.next_token(election);
        let now = Instant::now();
        state.leases.insert(
            election.to_string(),
            Lease {
                owner: owner.to_string(),
                token,
                expires: now + ttl,
                since_ms: 0,
                attempt: String::new(),
                ttl,
            },
        );
        state.witness(election, owner.to_string(), token, now + ttl);
        state.notify(election, |n| n.acquired += 1);
        token
    }

    /// The leases and token counters as they are now.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// let store = tenure::MemoryStore::new();
    /// let election = tenure::Election::builder("jobs").memory(&store).id("a").build().await?;
    /// let term = election.campaign().await?;
    /// let snapshot = store.snapshot(); // a's lease, as a replica saw it
    /// term.resign().await?;
    /// store.restore(&snapshot); // a failover to that replica: the lease is back
    /// assert_eq!(store.holder("jobs").map(|h| h.id), Some("a".to_string()));
    /// # Ok(()) }
    /// ```
    pub fn snapshot(&self) -> Snapshot {
        let state = self.lock();
        Snapshot {
            leases: state.leases.clone(),
            last_tokens: state.last_tokens.clone(),
            runs: state.runs.clone(),
            witnesses: state.witnesses.clone(),
        }
    }

    /// Replace every lease and token counter with a snapshot's, as a Redis
    /// restart that loads an older RDB file (or a failover to a lagging
    /// replica) does: leases expired since are gone, leases granted since
    /// are lost, and, as after [`MemoryStore::wipe`], the start-up hold-off
    /// period applies. Later tokens still rise above all earlier ones.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// # use std::time::Duration;
    /// let store = tenure::MemoryStore::new();
    /// let ttl = Duration::from_millis(300);
    /// let a = tenure::Election::builder("jobs").memory(&store).id("a").ttl(ttl).build().await?;
    /// let b = tenure::Election::builder("jobs").memory(&store).id("b").ttl(ttl).build().await?;
    /// let before = store.snapshot(); // nobody leads
    /// let term = a.campaign().await?;
    /// store.restore(&before); // the store rolls back: a's lease is lost
    /// assert!(store.holder("jobs").is_none());
    /// let next = b.campaign().await?; // after the hold-off
    /// assert!(next.token() > term.token(), "tokens still rise");
    /// # Ok(()) }
    /// ```
    pub fn restore(&self, snapshot: &Snapshot) {
        let mut state = self.lock();
        state.leases = snapshot.leases.clone();
        state.last_tokens = snapshot.last_tokens.clone();
        state.runs = snapshot.runs.clone();
        state.witnesses = snapshot.witnesses.clone();
        state.hold_off_since.clear();
        state.wiped = true;
    }

    /// Lose every lease, token counter and last-run marker, as a Redis
    /// restart without persistence does. Later tokens still rise above earlier ones, and,
    /// as with Redis, no lease is granted until one ttl after an election
    /// is next asked for one (a leader from before may still believe).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// # use std::time::Duration;
    /// let store = tenure::MemoryStore::new();
    /// let ttl = Duration::from_millis(300);
    /// let a = tenure::Election::builder("jobs").memory(&store).id("a").ttl(ttl).build().await?;
    /// let b = tenure::Election::builder("jobs").memory(&store).id("b").ttl(ttl).build().await?;
    /// let term = a.campaign().await?;
    /// store.wipe(); // Redis restarted without persistence
    /// assert!(store.holder("jobs").is_none());
    /// let next = b.campaign().await?; // after the hold-off
    /// assert!(next.token() > term.token(), "tokens still rise");
    /// # Ok(()) }
    /// ```
    pub fn wipe(&self) {
        let mut state = self.lock();
        state.leases.clear();
        state.last_tokens.clear();
        state.runs.clear();
        state.witnesses.clear();
        state.hold_off_since.clear();
        state.wiped = true;
    }

    /// Requests made so far for `election`.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// let store = tenure::MemoryStore::new();
    /// let election = tenure::Election::builder("jobs").memory(&store).build().await?;
    /// let _term = election.campaign().await?;
    /// assert_eq!(store.calls("jobs").acquire, 1);
    /// # Ok(()) }
    /// ```
    pub fn calls(&self, election: &str) -> Calls {
        self.lock().calls.get(election).copied().unwrap_or_default()
    }

    /// Who holds an election's lease now.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// let store = tenure::MemoryStore::new();
    /// let election = tenure::Election::builder("jobs").memory(&store).id("a").build().await?;
    /// let term = election.campaign().await?;
    /// assert_eq!(store.holder("jobs").map(|h| h.id), Some("a".to_string()));
    /// term.resign().await?;
    /// assert!(store.holder("jobs").is_none());
    /// # Ok(()) }
    /// ```
    pub fn holder(&self, election: &str) -> Option<LeaderInfo> {
        let mut state = self.lock();
        let now = Instant::now();
        state
            .live_lease(election, now)
            .map(|lease| LeaderInfo::from(holder_of(lease, now)))
    }

    /// Names of the elections with a live lease, sorted (the memory store
    /// has no prefixes).
    pub(crate) fn elections(&self) -> Vec<String> {
        let mut state = self.lock();
        let now = Instant::now();
        let names: Vec<String> = state.leases.keys().cloned().collect();
        let mut live: Vec<String> = names
            .into_iter()
            .filter(|name| state.live_lease(name, now).is_some())
            .collect();
        live.sort();
        live
    }

    /// One election's view of this store, as the election's backend.
    pub(crate) fn backend(&self, at: Address<'_>) -> Backend {
        let election = at.name;
        let mut notices = self
            .lock()
            .notices
            .entry(election.to_string())
            .or_insert_with(|| watch::channel(Notices::default()).0)
            .subscribe();
        if let Some(view) = &self.view {
            notices = relay(notices, view.clone());
        }
        Backend::new(Store::Memory(self.clone()), at, notices, None)
    }

    /// Carry out `ops` under one lock, as one round trip: each is counted,
    /// then the configured fault applies to the batch as a whole.
    pub(crate) async fn batch(&self, ops: &[Op<'_>]) -> Result<Vec<Result<Reply>>> {
        let fault = {
            let mut state = self.lock();
            for op in ops {
                state.count(op);
            }
            self.fault(&state)
        };
        match fault {
            Fault::None | Fault::LoseReplies | Fault::Slow(_) => {}
            Fault::Fail => return Err(Error::Unavailable),
            Fault::Stall => std::future::pending().await,
        }
        let now = Instant::now();
        let replies = {
            let mut state = self.lock();
            let replies: Vec<Result<Reply>> =
                ops.iter().map(|op| Ok(state.apply(op, now))).collect();
            if self.fault(&state) == Fault::LoseReplies {
                return Err(Error::Unavailable);
            }
            replies
        };
        if let Fault::Slow(delay) = fault {
            tokio::time::sleep(delay).await;
        }
        Ok(replies)
    }
}

impl MemoryStore {
    /// The fault that applies to this handle's calls now: the whole
    /// store's, else the view's own.
    fn fault(&self, state: &StoreState) -> Fault {
        match (state.fault, &self.view) {
            (Fault::None, Some(view)) => lock(view).fault,
            (fault, _) => fault,
        }
    }
}

fn lock(view: &Mutex<View>) -> MutexGuard<'_, View> {
    view.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The announcements of `source` as a view receives them: passed on,
/// delayed or dropped as the view's [`Announcements`] say when each is
/// sent, always in the order they were sent. The relay ends when the
/// election stops listening.
fn relay(mut source: watch::Receiver<Notices>, view: Arc<Mutex<View>>) -> watch::Receiver<Notices> {
    let (tx, rx) = watch::channel(*source.borrow_and_update());
    tokio::spawn(async move {
        // Announcements on their way: when each arrives, and what it says.
        let mut on_the_way: VecDeque<(Instant, Notices)> = VecDeque::new();
        loop {
            let next = on_the_way.front().map(|(due, _)| *due);
            tokio::select! {
                changed = source.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    let notices = *source.borrow_and_update();
                    let announcements = lock(&view).announcements;
                    match announcements {
                        Announcements::Lost => {}
                        Announcements::Delivered if on_the_way.is_empty() => {
                            if tx.send(notices).is_err() {
                                return;
                            }
                        }
                        Announcements::Delivered => on_the_way.push_back((Instant::now(), notices)),
                        Announcements::Delayed(delay) => {
                            on_the_way.push_back((Instant::now() + delay, notices));
                        }
                    }
                }
                () = tokio::time::sleep_until(next.unwrap_or_else(Instant::now)), if next.is_some() => {
                    if let Some((_, notices)) = on_the_way.pop_front() {
                        if tx.send(notices).is_err() {
                            return;
                        }
                    }
                }
                () = tx.closed() => return,
            }
        }
    });
    rx
}

fn holder_of(lease: &Lease, now: Instant) -> Holder {
    Holder {
        owner: lease.owner.clone(),
        token: lease.token,
        ttl_left: lease.expires.saturating_duration_since(now),
        since_ms: lease.since_ms,
        attempt: lease.attempt.clone(),
        ttl: lease.ttl,
    }
}

impl StoreState {
    fn count(&mut self, op: &Op<'_>) {
        let (name, count): (&str, fn(&mut Calls)) = match op {
            Op::Heartbeat { group, .. } => (group.name, |c| c.heartbeat += 1),
            Op::Acquire { at, .. } => (at.name, |c| c.acquire += 1),
            Op::Renew { at, .. } => (at.name, |c| c.renew += 1),
            Op::RenewMany { terms, .. } => {
                for (name, _) in terms.iter() {
                    self.calls.entry(name.to_string()).or_default().renew += 1;
                }
                return;
            }
            Op::Resign { at, .. } => (at.name, |c| c.resign += 1),
            Op::Inspect { at, .. } => (at.name, |c| c.inspect += 1),
            Op::LastRun { at, .. } => (at.name, |c| c.last_run += 1),
            Op::RecordRun { at, .. } => (at.name, |c| c.record_run += 1),
        };
        count(self.calls.entry(name.to_string()).or_default());
    }

    fn apply(&mut self, op: &Op<'_>, now: Instant) -> Reply {
        match *op {
            Op::Heartbeat {
                group,
                member,
                ttl_ms,
                join,
            } => {
                let members = self.members.entry(group.name.to_string()).or_default();
                members.retain(|_, expires| *expires > now);
                if join {
                    members.insert(member.to_string(), now + Duration::from_millis(ttl_ms));
                } else {
                    members.remove(member);
                }
                Reply::Members {
                    members: members.keys().cloned().collect(),
                    phantoms: 0,
                }
            }
            Op::Acquire { at, request } => Reply::Acquire(self.acquire(at.name, &request, now)),
            Op::Renew {
                at,
                id,
                token,
                ttl_ms,
                announce,
            } => Reply::Renew(self.renew(at.name, id, token, ttl_ms, announce, now)),
            Op::RenewMany {
                id, ttl_ms, terms, ..
            } => Reply::RenewMany(
                terms
                    .iter()
                    .map(|(name, token)| Ok(self.renew(name, id, *token, ttl_ms, false, now)))
                    .collect(),
            ),
            Op::Resign { at, id, token } => Reply::Resign(self.resign(at.name, id, token, now)),
            Op::Inspect { at } => Reply::Inspect(
                self.live_lease(at.name, now)
                    .map(|lease| holder_of(lease, now)),
            ),
            Op::LastRun { at } => Reply::LastRun(
                self.runs
                    .get(at.name)
                    .filter(|run| run.expires > now)
                    .map(|run| now.saturating_duration_since(run.at)),
            ),
            Op::RecordRun {
                at,
                id,
                token,
                keep_ms,
            } => Reply::RecordRun(self.record_run(at.name, id, token, keep_ms, now)),
        }
    }

    /// As `record_run.lua`: only the term holding the lease records, and
    /// never over a newer term's record.
    fn record_run(
        &mut self,
        election: &str,
        id: &str,
        token: u64,
        keep_ms: u64,
        now: Instant,
    ) -> bool {
        let holds = self
            .live_lease(election, now)
            .is_some_and(|lease| lease.owner == id && lease.token == token);
        let newer = self
            .runs
            .get(election)
            .is_some_and(|run| run.expires > now && run.token > token);
        if !holds || newer {
            return false;
        }
        let run = Run {
            at: now,
            token,
            expires: now + Duration::from_millis(keep_ms),
        };
        self.runs.insert(election.to_string(), run);
        true
    }

    /// As `acquire.lua`: a lease of another term is reported; in the
    /// start-up hold-off nothing is granted or adopted; a lease written
    /// by this same attempt is adopted; else a new term begins.
    fn acquire(
        &mut self,
        election: &str,
        request: &AcquireRequest<'_>,
        now: Instant,
    ) -> AcquireReply {
        let ttl = Duration::from_millis(request.ttl_ms);
        let ours = match self.live_lease(election, now) {
            Some(lease) if lease.owner == request.id && lease.attempt == request.attempt => true,
            Some(lease) => return AcquireReply::Held(holder_of(lease, now)),
            None => false,
        };
        if self.wiped {
            let since = *self
                .hold_off_since
                .entry(election.to_string())
                .or_insert(now);
            let hold_off = ttl.max(Duration::from_millis(request.hold_off_ms));
            if now < since + hold_off {
                return AcquireReply::HoldOff {
                    wait: since + hold_off - now,
                };
            }
        }
        if ours {
            if let Some(lease) = self.live_lease(election, now) {
                lease.expires = now + ttl;
                let (owner, token) = (lease.owner.clone(), lease.token);
                self.witness(election, owner, token, now + ttl);
                return AcquireReply::Won { token };
            }
        }
        // As on Redis and etcd: a lease that vanished without its
        // holder's release leaves its witness, and nobody is granted the
        // election until it runs out.
        if let Some(witness) = self.witnesses.get(election) {
            if witness.expires > now && !self.ignore_witness {
                return AcquireReply::HoldOff {
                    wait: witness.expires - now,
                };
            }
        }
        let token = self.next_token(election);
        self.leases.insert(
            election.to_string(),
            Lease {
                owner: request.id.to_string(),
                token,
                expires: now + ttl,
                since_ms: 0,
                attempt: request.attempt.to_string(),
                ttl,
            },
        );
        self.witness(election, request.id.to_string(), token, now + ttl);
        self.notify(election, |n| n.acquired += 1);
        AcquireReply::Won { token }
    }

    /// Set the witness of term (`owner`, `token`) to expire at `expires`.
    fn witness(&mut self, election: &str, owner: String, token: u64, expires: Instant) {
        self.witnesses.insert(
            election.to_string(),
            Witness {
                owner,
                token,
                expires,
            },
        );
    }

    fn renew(
        &mut self,
        election: &str,
        id: &str,
        token: u64,
        ttl_ms: u64,
        announce: bool,
        now: Instant,
    ) -> RenewReply {
        match self.live_lease(election, now) {
            Some(lease) if lease.owner == id && lease.token == token => {
                let expires = now + Duration::from_millis(ttl_ms);
                lease.expires = expires;
                self.witness(election, id.to_string(), token, expires);
                if announce {
                    self.notify(election, |n| {
                        n.renewed += 1;
                        n.renewed_ttl_ms = ttl_ms;
                    });
                }
                RenewReply::Renewed
            }
            Some(lease) => RenewReply::NotOwner(Some(holder_of(lease, now))),
            None => RenewReply::NotOwner(None),
        }
    }

    fn resign(&mut self, election: &str, id: &str, token: u64, now: Instant) -> bool {
        let ours = self
            .live_lease(election, now)
            .is_some_and(|lease| lease.owner == id && lease.token == token);
        let witnessed = self
            .witnesses
            .get(election)
            .is_some_and(|w| w.owner == id && w.token == token);
        if ours || witnessed {
            // The holder's release: of the lease, or, when the lease
            // vanished some other way, of its witness alone.
            if ours {
                self.leases.remove(election);
            }
            self.witnesses.remove(election);
            self.notify(election, |n| n.released += 1);
        }
        ours
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::time::{sleep, Instant};

    use crate::{Announcements, Election, MemoryStore};

    /// How long a follower on a view with `announcements` takes to lead
    /// after the leader resigns 100 ms into a 1 s lease.
    async fn takeover(announcements: Announcements) -> Duration {
        let store = MemoryStore::new();
        let (view_a, view_b) = (store.view(), store.view());
        let ttl = Duration::from_secs(1);
        let build = |view: &MemoryStore, id: &str| {
            Election::builder("jobs")
                .memory(view)
                .id(id)
                .ttl(ttl)
                .build()
        };
        let a = build(&view_a, "a").await.expect("builds");
        let b = build(&view_b, "b").await.expect("builds");
        let term = a.campaign().await.expect("a leads");
        view_b.set_announcements(announcements);
        let follower = tokio::spawn(async move { b.campaign().await });
        sleep(Duration::from_millis(100)).await;
        let resigned = Instant::now();
        term.resign().await.expect("resigns");
        follower.await.expect("joins").expect("b leads");
        resigned.elapsed()
    }

    #[tokio::test(start_paused = true)]
    async fn a_views_announcements_arrive_at_once_late_or_never() {
        assert!(takeover(Announcements::Delivered).await < Duration::from_millis(50));
        let late = takeover(Announcements::Delayed(Duration::from_millis(300))).await;
        assert!(late >= Duration::from_millis(300) && late < Duration::from_millis(400));
        // Deaf to the release, the follower waits for the lease to lapse.
        let never = takeover(Announcements::Lost).await;
        assert!(never >= Duration::from_millis(850), "{never:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_views_fault_is_its_own_and_the_stores_applies_to_all() {
        let store = MemoryStore::new();
        let (view_a, view_b) = (store.view(), store.view());
        let a = Election::builder("jobs").memory(&view_a).id("a").build();
        let b = Election::builder("jobs").memory(&view_b).id("b").build();
        let (a, b) = (a.await.expect("builds"), b.await.expect("builds"));
        view_a.set_fault(crate::Fault::Fail);
        assert!(a.leader().await.is_err());
        assert!(b.leader().await.is_ok());
        view_a.set_fault(crate::Fault::None);
        store.set_fault(crate::Fault::Fail);
        assert!(a.leader().await.is_err() && b.leader().await.is_err());
    }
}
