//! Elections: configuration, campaigning, and the keeper of a term.
//!
//! This is the I/O driver around [`crate::machine`]: it sends requests to
//! the backend with per-call timeouts, notes when each was sent, and lets
//! the state machine decide. Followers sleep until the holder's lease would
//! expire or a release is announced, whichever comes first, so an idle
//! follower costs about one store call per term.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::Stream;
use rand::rngs::StdRng;
use tokio::sync::watch;
use tokio::time::timeout;

use crate::backend::{Backend, Notices};
use crate::machine::{after_acquire, CandidateStep, Reading, Timing};
use crate::term::LeaderInfo;
use crate::testing::Bugs;
use crate::{Error, Leadership, Result};

mod attempts;
mod builder;
mod campaign;
mod keep;

use attempts::Attempts;
pub use builder::{ElectionBuilder, DEFAULT_PREFIX, DEFAULT_TTL};
pub(crate) use builder::{Settings, StoreSpec};

struct Inner {
    name: String,
    id: String,
    timing: Timing,
    backend: Backend,
    attempts: Attempts,
    /// The start-up hold-off this instance asks for: the largest of its
    /// ttl, its max_ttl setting and every lease ttl it has seen.
    hold_off_ms: AtomicU64,
    /// Bugs switched back on for failing-mode tests (all off normally).
    bugs: Bugs,
    /// The jitter's RNG when seeded ([`ElectionBuilder::jitter_seed`]).
    jitter: Option<Mutex<StdRng>>,
}

impl Inner {
    /// One backend call bounded by `limit`. A timeout also replaces the
    /// connection: the call may have run, and the connection may be dead.
    async fn call<T>(
        &self,
        limit: Duration,
        call: impl std::future::Future<Output = Result<T>>,
    ) -> Result<T> {
        let result = match timeout(limit, call).await {
            Ok(result) => result,
            Err(_) => Err(Error::Timeout(limit)),
        };
        if let Err(Error::Timeout(_)) = result {
            self.backend.reset();
        }
        result
    }
}

/// One named election, seen from this instance. Cheap to clone.
///
/// ```no_run
/// # #[tokio::main] async fn main() -> tenure::Result<()> {
/// let election = tenure::Election::builder("report-mailer")
///     .redis("redis://127.0.0.1:6379")
///     .build()
///     .await?;
/// loop {
///     let term = election.campaign().await?;
///     tokio::select! {
///         reason = term.lost() => eprintln!("no longer leader: {reason}"),
///         _ = send_reports(term.token()) => { term.resign().await?; break }
///     }
/// }
/// # Ok(()) }
/// # async fn send_reports(_token: u64) {}
/// ```
#[derive(Clone)]
pub struct Election {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Election {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Election")
            .field("name", &self.inner.name)
            .field("id", &self.inner.id)
            .field("ttl", &self.inner.timing.ttl)
            .finish_non_exhaustive()
    }
}

impl Election {
    /// Start configuring the election `name`.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// let store = tenure::MemoryStore::new();
    /// let election = tenure::Election::builder("jobs").memory(&store).build().await?;
    /// assert_eq!(election.name(), "jobs");
    /// # Ok(()) }
    /// ```
    pub fn builder(name: impl Into<String>) -> ElectionBuilder {
        ElectionBuilder {
            name: name.into(),
            store: None,
            settings: Settings::default(),
        }
    }

    /// The election's name.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// let store = tenure::MemoryStore::new();
    /// let election = tenure::Election::builder("nightly-backup").memory(&store).build().await?;
    /// assert_eq!(election.name(), "nightly-backup");
    /// assert_eq!(election.campaign().await?.election(), "nightly-backup");
    /// # Ok(()) }
    /// ```
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// This instance's id.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// let store = tenure::MemoryStore::new();
    /// let a = tenure::Election::builder("jobs").memory(&store).build().await?;
    /// let b = tenure::Election::builder("jobs").memory(&store).build().await?;
    /// assert_ne!(a.id(), b.id(), "each instance gets its own id");
    /// # Ok(()) }
    /// ```
    pub fn id(&self) -> &str {
        &self.inner.id
    }

    /// The lease TTL.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// use std::time::Duration;
    /// let store = tenure::MemoryStore::new();
    /// let election = tenure::Election::builder("jobs").memory(&store).ttl(Duration::from_secs(9)).build().await?;
    /// assert_eq!(election.ttl(), Duration::from_secs(9));
    /// # Ok(()) }
    /// ```
    pub fn ttl(&self) -> Duration {
        self.inner.timing.ttl
    }

    /// The renew interval.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// let store = tenure::MemoryStore::new();
    /// let election = tenure::Election::builder("jobs").memory(&store).build().await?;
    /// assert_eq!(election.renew_every(), election.ttl() / 3);
    /// # Ok(()) }
    /// ```
    pub fn renew_every(&self) -> Duration {
        self.inner.timing.renew_every
    }
    /// Who leads now, read from the store (`None` when nobody does).
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// let store = tenure::MemoryStore::new();
    /// let a = tenure::Election::builder("jobs").memory(&store).id("a").build().await?;
    /// assert!(a.leader().await?.is_none());
    /// let term = a.campaign().await?;
    /// let leader = a.leader().await?.expect("a leads");
    /// assert_eq!((leader.id.as_str(), leader.token), ("a", term.token()));
    /// # Ok(()) }
    /// ```
    pub async fn leader(&self) -> Result<Option<LeaderInfo>> {
        let inspect = self.inner.backend.inspect();
        let holder = self
            .inner
            .call(self.inner.timing.call_timeout, inspect)
            .await?;
        Ok(holder.map(LeaderInfo::from))
    }

    /// A stream of leadership changes: the current leader first, then one
    /// item each time the leader (or its term) changes, `None` while nobody
    /// leads. Driven by lease announcements, with the holder's TTL as a
    /// fallback, so a crash is reported when its lease expires. Errors are
    /// yielded and the stream keeps going.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// use futures_util::StreamExt;
    /// let store = tenure::MemoryStore::new();
    /// let election = tenure::Election::builder("jobs").memory(&store).build().await?;
    /// let mut changes = Box::pin(election.watch());
    /// assert_eq!(changes.next().await.unwrap()?, None);
    /// let term = election.campaign().await?;
    /// let leader = changes.next().await.unwrap()?.unwrap();
    /// assert_eq!(leader.token, term.token());
    /// # Ok(()) }
    /// ```
    pub fn watch(&self) -> impl Stream<Item = Result<Option<LeaderInfo>>> + Send + 'static {
        struct State {
            election: Election,
            notices: watch::Receiver<Notices>,
            /// The announcements seen when the lease was last read.
            seen: Notices,
            last: Option<Option<(String, u64)>>,
            wait: Option<Duration>,
        }
        let state = State {
            notices: self.inner.backend.notices(),
            election: self.clone(),
            seen: Notices::default(),
            last: None,
            wait: None,
        };
        futures_util::stream::unfold(state, |mut state| async move {
            loop {
                if let Some(wait) = state.wait.take() {
                    // Renewals do not change the leader; terms and releases
                    // do. Compared with what was seen at the last read, so a
                    // change announced while the caller was busy is not missed.
                    let seen = state.seen;
                    let notices = &mut state.notices;
                    let term_changed = async {
                        loop {
                            let now = *notices.borrow_and_update();
                            if now.released != seen.released || now.acquired != seen.acquired {
                                return;
                            }
                            if notices.changed().await.is_err() {
                                std::future::pending::<()>().await;
                            }
                        }
                    };
                    tokio::select! {
                        _ = tokio::time::sleep(wait) => {}
                        _ = term_changed => {}
                    }
                }
                state.seen = *state.notices.borrow_and_update();
                let timing = state.election.inner.timing;
                match state.election.leader().await {
                    Ok(leader) => {
                        // Re-read when the lease would expire; 1 ms past it
                        // so the store has dropped it.
                        state.wait = Some(
                            leader
                                .as_ref()
                                .map_or(timing.ttl, |l| l.ttl_left + Duration::from_millis(1)),
                        );
                        let key = leader.as_ref().map(|l| (l.id.clone(), l.token));
                        if state.last.as_ref() != Some(&key) {
                            state.last = Some(key);
                            return Some((Ok(leader), state));
                        }
                    }
                    Err(err) => {
                        state.wait = Some(timing.renew_every);
                        return Some((Err(err), state));
                    }
                }
            }
        })
    }
}

impl Election {
    /// How long one store call may take: a write sent by a campaign that
    /// was cancelled lands within it, or not at all.
    pub(crate) fn call_timeout(&self) -> std::time::Duration {
        self.inner.timing.call_timeout
    }

    /// Release the lease if this instance holds it without a live
    /// [`Leadership`] handle: call it after abandoning a [`Election::campaign`]
    /// (e.g. on shutdown), since its last acquire may have won. Returns
    /// whether a lease was released.
    ///
    /// A lease written by the attempt that began this `Election`'s latest
    /// term, or by a campaign of it that is still running, is left alone:
    /// that term's keeper (or that campaign) owns it. So a second campaign,
    /// or a second [`crate::Runner`], that gives up while another one leads
    /// or is being elected does not end that one's term.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// use std::time::Duration;
    /// let store = tenure::MemoryStore::new();
    /// let election = tenure::Election::builder("jobs").memory(&store).build().await?;
    /// store.set_fault(tenure::Fault::LoseReplies); // the acquire wins, unseen
    /// let abandoned = tokio::time::timeout(Duration::from_millis(200), election.campaign());
    /// assert!(abandoned.await.is_err(), "shut down while campaigning");
    /// store.set_fault(tenure::Fault::None);
    /// assert!(election.release_if_held().await?);
    /// assert!(store.holder("jobs").is_none());
    /// # Ok(()) }
    /// ```
    pub async fn release_if_held(&self) -> Result<bool> {
        let inner = &self.inner;
        let inspect = inner.backend.inspect();
        match inner.call(inner.timing.call_timeout, inspect).await? {
            // Only a lease one of our own campaigns wrote: another process
            // with the same id holds its own term.
            Some(holder)
                if holder.id == inner.id
                    && inner.attempts.is_ours(&holder.attempt)
                    && !inner.attempts.is_kept(&holder.attempt) =>
            {
                let resign = inner.backend.resign(&inner.id, holder.token);
                inner.call(inner.timing.call_timeout, resign).await
            }
            _ => Ok(false),
        }
    }

    /// One acquire attempt: the term if this instance won it, `None` if
    /// another instance leads. Unlike [`Election::campaign`], transient
    /// errors are returned, not retried.
    ///
    /// # Cancel safety
    /// As [`Election::campaign`]: a term won by a cancelled attempt lapses
    /// after one ttl, or is adopted by this instance's next attempt.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// let store = tenure::MemoryStore::new();
    /// let a = tenure::Election::builder("cron").memory(&store).id("a").build().await?;
    /// let b = tenure::Election::builder("cron").memory(&store).id("b").build().await?;
    /// let term = a.try_campaign().await?.expect("nobody led");
    /// assert!(b.try_campaign().await?.is_none());
    /// # drop(term); Ok(()) }
    /// ```
    pub async fn try_campaign(&self) -> Result<Option<Leadership>> {
        let timing = &self.inner.timing;
        let mut attempt = self.inner.attempts.begin();
        // Twice at most: a term won, but past its deadline by the time the
        // reply came (a host that slept through the call), may still hold
        // its lease, and a retry of the same attempt adopts it.
        for _ in 0..2 {
            let sent = Reading::take();
            let reply = self.acquire_once(&attempt.name).await?;
            let now = Reading::take();
            match after_acquire(timing, sent, now, Some(reply), Duration::ZERO, 0) {
                CandidateStep::Elected(state) => {
                    attempt.won();
                    return Ok(Some(self.start_term(state)));
                }
                CandidateStep::Follow { holder, .. } => {
                    self.note_holder(&holder);
                    return Ok(None);
                }
                CandidateStep::HoldOff { .. } => return Ok(None),
                CandidateStep::Retry { .. } => continue,
            }
        }
        // Won twice too late to act on: the lease lapses at its ttl.
        Err(Error::Timeout(timing.call_timeout))
    }

    /// [`Election::campaign`] for at most `wait`: the term if this
    /// instance was elected in time, `None` if not (another instance led
    /// all along, or the store could not be reached). A lease the
    /// abandoned campaign may have won meanwhile is released before `None`
    /// is returned (see [`Election::release_if_held`]), so it blocks nobody;
    /// if that release cannot be confirmed the lease lapses after one ttl.
    ///
    /// A term of this `Election` that is already running keeps its lease
    /// (see [`Election::release_if_held`]).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// use std::time::Duration;
    /// let store = tenure::MemoryStore::new();
    /// let a = tenure::Election::builder("cron").memory(&store).id("a").build().await?;
    /// let b = tenure::Election::builder("cron").memory(&store).id("b").build().await?;
    /// let term = a.campaign().await?;
    /// assert!(b.campaign_timeout(Duration::from_millis(100)).await?.is_none());
    /// term.resign().await?;
    /// assert!(b.campaign_timeout(Duration::from_millis(100)).await?.is_some());
    /// # Ok(()) }
    /// ```
    ///
    /// # Cancel safety
    /// As [`Election::campaign`].
    pub async fn campaign_timeout(&self, wait: Duration) -> Result<Option<Leadership>> {
        match timeout(wait, self.campaign()).await {
            Ok(term) => term.map(Some),
            Err(_elapsed) => {
                // The abandoned campaign's last acquire may have won.
                if let Err(err) = self.release_if_held().await {
                    tracing::warn!(election = %self.inner.name, error = %err, "could not check for a lease won by the abandoned campaign; it lapses at its ttl");
                }
                Ok(None)
            }
        }
    }

    /// How long ago the last successful run of this election's work was
    /// recorded ([`Leadership::record_run`], by any instance), measured by
    /// the store's own clock, so every host agrees; `None` when the store
    /// remembers none (never recorded, or kept for less than has passed
    /// since). On etcd, which has no clock clients can read, the age is
    /// whole seconds, counted short (never more than the true age).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() -> tenure::Result<()> {
    /// use std::time::Duration;
    /// let store = tenure::MemoryStore::new();
    /// let election = tenure::Election::builder("nightly").memory(&store).build().await?;
    /// assert_eq!(election.since_last_run().await?, None);
    /// let term = election.campaign().await?;
    /// term.record_run(Duration::from_secs(60)).await?;
    /// tokio::time::sleep(Duration::from_secs(5)).await;
    /// assert_eq!(election.since_last_run().await?, Some(Duration::from_secs(5)));
    /// # Ok(()) }
    /// ```
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn since_last_run(&self) -> Result<Option<Duration>> {
        let inner = &self.inner;
        let record = inner
            .call(inner.timing.call_timeout, inner.backend.last_run())
            .await?;
        Ok(record.map(|record| record.age))
    }

    /// The last scheduled slot claimed ([`Leadership::claim_slot`], by any
    /// instance), as the store remembers it; `None` when none was (or the
    /// record was kept for less than has passed since).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// use std::time::{Duration, SystemTime};
    /// let store = tenure::MemoryStore::new();
    /// let election = tenure::Election::builder("report").memory(&store).build().await?;
    /// assert_eq!(election.last_slot().await?, None);
    /// let term = election.campaign().await?;
    /// let slot = SystemTime::UNIX_EPOCH + Duration::from_secs(1_796_263_200);
    /// term.claim_slot(slot, Duration::from_secs(3600)).await?;
    /// assert_eq!(election.last_slot().await?, Some(slot));
    /// # Ok(()) }
    /// ```
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn last_slot(&self) -> Result<Option<std::time::SystemTime>> {
        let inner = &self.inner;
        let record = inner
            .call(inner.timing.call_timeout, inner.backend.last_run())
            .await?;
        let Some(ms) = record.and_then(|record| record.slot) else {
            return Ok(None);
        };
        match crate::runner::slot_time(ms) {
            Some(slot) => Ok(Some(slot)),
            None => Err(crate::Error::ForeignData {
                key: format!("the last-run marker of election {:?}", inner.name),
                detail: format!("a slot past what this host's clock can hold ({ms} ms)"),
            }),
        }
    }

    /// The safety margin.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// use std::time::Duration;
    /// let store = tenure::MemoryStore::new();
    /// let election = tenure::Election::builder("jobs").memory(&store).ttl(Duration::from_secs(10)).build().await?;
    /// assert_eq!(election.margin(), Duration::from_secs(1)); // ttl/10
    /// # Ok(()) }
    /// ```
    pub fn margin(&self) -> Duration {
        self.inner.timing.margin
    }
}

impl Election {
    /// Start waiting for the next term of this election to be announced:
    /// take it before [`Leadership::resign`], then ask
    /// [`NextTerm::announced`] whether a successor was elected.
    ///
    /// `tenure run` does this when it exits after a release: it keeps its
    /// store sessions open until the successor is announced (at most a
    /// moment), so that closing them does not cost the server work while
    /// the successor is being elected, and it logs the hand-over.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// use std::time::Duration;
    /// let store = tenure::MemoryStore::new();
    /// let a = tenure::Election::builder("jobs").memory(&store).id("a").build().await?;
    /// let b = tenure::Election::builder("jobs").memory(&store).id("b").build().await?;
    /// let term = a.campaign().await?;
    /// let follower = tokio::spawn(async move { b.campaign().await });
    /// while store.calls("jobs").acquire < 2 {
    ///     tokio::task::yield_now().await; // until b has found a leading
    /// }
    /// let next = a.next_term();
    /// term.resign().await?;
    /// assert!(next.announced(Duration::from_secs(5)).await);
    /// assert_eq!(follower.await.unwrap()?.id(), "b");
    ///
    /// // Nobody else campaigns: nothing is announced.
    /// assert!(!a.next_term().announced(Duration::from_millis(10)).await);
    /// # Ok(()) }
    /// ```
    pub fn next_term(&self) -> NextTerm {
        let notices = self.inner.backend.notices();
        let seen = notices.borrow().acquired;
        NextTerm {
            notices,
            seen,
            announces: self.inner.backend.announces_terms(),
        }
    }
}

/// The next term of an election, as its store announces it
/// ([`Election::next_term`]).
///
/// An announcement is a hint, as everywhere in tenure: it can be missed
/// (a broken session, a pooler that drops `LISTEN`, a store that announces
/// no terms, such as SQLite) or sent by anyone allowed to publish on the
/// store's channel. Let it decide only what a hint may: when to exit after
/// handing over, what to log. Who leads is the lease's to say
/// ([`Election::leader`]).
#[derive(Debug)]
pub struct NextTerm {
    notices: watch::Receiver<Notices>,
    /// New terms announced when this began.
    seen: u64,
    announces: bool,
}

impl NextTerm {
    /// Whether a new term was announced since [`Election::next_term`],
    /// waiting up to `within` for one. `false` at once on a store that
    /// announces no terms.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// use std::time::Duration;
    /// let store = tenure::MemoryStore::new();
    /// let election = tenure::Election::builder("jobs").memory(&store).build().await?;
    /// let next = election.next_term();
    /// let term = election.campaign().await?; // a new term, this instance's own
    /// assert!(next.announced(Duration::ZERO).await);
    /// # drop(term); Ok(()) }
    /// ```
    pub async fn announced(mut self, within: Duration) -> bool {
        if !self.announces {
            return false;
        }
        let seen = self.seen;
        let notices = &mut self.notices;
        let new_term = async {
            loop {
                if notices.borrow_and_update().acquired != seen {
                    return true;
                }
                if notices.changed().await.is_err() {
                    return false;
                }
            }
        };
        // Polled once before the time is checked: `within` zero still
        // says whether one was announced already.
        timeout(within, new_term).await.unwrap_or(false)
    }
}
