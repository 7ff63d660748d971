//! The seats of `tenure serve` ([`crate::serve`]): one per election.
//!
//! Each election has one *seat*: a task that campaigns, holds the term,
//! resigns on request and on shutdown, and campaigns again after every loss.
//! It publishes a [`View`] on a watch channel; the HTTP side only reads views
//! and sends the seat resign requests, so there is one place where a term
//! starts and ends, as in the library's keeper.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use tenure::{Election, LeaderInfo, Leadership};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::contest::Contest;
use crate::exit::Failure;

/// What a seat publishes: its own term, if any, and the holder it last saw.
#[derive(Debug, Clone, Default)]
pub struct View {
    /// This instance's current term. Whether it may still act is read from
    /// the term itself at the moment of each answer, not from here.
    pub term: Option<Leadership>,
    /// The holder (id, token) this instance last saw, itself included.
    pub holder: Option<(String, u64)>,
    /// Whether the election's store was reached and the seat campaigns.
    pub ready: bool,
}

/// When a seat campaigns again after a resign.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejoin {
    /// After one ttl, so that another instance takes over.
    AfterTtl,
    /// At once (`?rejoin=now`).
    Now,
}

/// The answer to a resign request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resigned {
    /// The term with this token was given up.
    Term(u64),
    /// This instance did not lead.
    NotLeading,
    /// The lease could not be released (the term ended all the same: it
    /// lapses at its ttl).
    Failed(String),
}

/// The seat task's ends of its channels.
struct SeatChannels {
    publish: watch::Sender<View>,
    requests: mpsc::Receiver<ResignRequest>,
    grants: Arc<Mutex<Grants>>,
}

struct ResignRequest {
    rejoin: Rejoin,
    reply: oneshot::Sender<Resigned>,
}

/// One election served: its name, its id, and the seat's channels.
#[derive(Debug, Clone)]
pub struct Seat {
    pub name: String,
    pub id: String,
    pub view: watch::Receiver<View>,
    /// The deadlines handed to clients in this term.
    pub grants: Arc<Mutex<Grants>>,
    /// The longest deadline one answer hands out (`--max-deadline`).
    pub max_deadline: Duration,
    resigns: mpsc::Sender<ResignRequest>,
}

/// What this instance has told clients about its current term: the one
/// promise a sidecar must keep on their behalf.
///
/// A client acts until the deadline it was given, and nothing can take
/// that back. So a resign (a request, or shutdown) first closes the term to
/// new grants, then waits until the latest deadline handed out has passed,
/// and only then releases the lease; the next leader cannot begin before
/// every client of this one has stopped. (A term that ends by itself needs
/// no wait: every deadline handed out is capped by the term's own, which
/// ends before the lease can pass to anyone else.)
#[derive(Debug, Default)]
pub struct Grants {
    /// The term these grants are for: (its election, its token). A
    /// semaphore's permits count tokens each on their own.
    term: Option<(String, u64)>,
    /// No more grants: the term is being given up.
    closed: bool,
    /// The latest deadline handed out.
    until: Option<Instant>,
}

impl Grants {
    /// Whether these grants are for `term`.
    fn for_term(&self, term: &Leadership) -> bool {
        self.term
            .as_ref()
            .is_some_and(|(election, token)| election == term.election() && *token == term.token())
    }
}

impl Seat {
    /// Whether answers may hand out time in `term` now (no I/O, no grant).
    pub fn granting(&self, term: &Leadership) -> bool {
        let grants = self.grants.lock().unwrap_or_else(|p| p.into_inner());
        !grants.closed && grants.for_term(term) && term.is_leader()
    }

    /// The time this instance may still act in `term`, as an answer hands
    /// it out now: zero if the term may not act or is being given up, else
    /// the term's time left, capped by `max_deadline`, rounded down to the
    /// millisecond and recorded as handed out.
    pub fn grant(&self, term: &Leadership) -> Duration {
        let mut grants = self.grants.lock().unwrap_or_else(|p| p.into_inner());
        if grants.closed || !grants.for_term(term) || !term.is_leader() {
            return Duration::ZERO;
        }
        let left = term.remaining().min(self.max_deadline);
        let left = Duration::from_millis(left.as_millis() as u64);
        if !left.is_zero() {
            let until = Instant::now() + left;
            grants.until = Some(grants.until.map_or(until, |was| was.max(until)));
        }
        left
    }
}

/// Begin granting for `term`.
fn open_grants(grants: &Mutex<Grants>, term: &Leadership) {
    *grants.lock().unwrap_or_else(|p| p.into_inner()) = Grants {
        term: Some((term.election().to_string(), term.token())),
        closed: false,
        until: None,
    };
}

/// Stop granting; the latest deadline handed out, if any.
fn close_grants(grants: &Mutex<Grants>) -> Option<Instant> {
    let mut grants = grants.lock().unwrap_or_else(|p| p.into_inner());
    grants.closed = true;
    grants.until
}

impl Seat {
    /// Start the seat of election `name` in `tasks`: it opens the election
    /// with `open` (again and again while the store cannot be reached),
    /// then campaigns; it ends on `shutdown`, or with an error that needs a
    /// person.
    pub fn start(
        name: &str,
        id: &str,
        max_deadline: Duration,
        open: Open,
        shutdown: &CancellationToken,
        tasks: &mut JoinSet<Result<(), Failure>>,
    ) -> Seat {
        let (publish, view) = watch::channel(View::default());
        let (resigns, requests) = mpsc::channel(8);
        let grants = Arc::new(Mutex::new(Grants::default()));
        let seat = Seat {
            name: name.to_string(),
            id: id.to_string(),
            view,
            grants: grants.clone(),
            max_deadline,
            resigns,
        };
        let channels = SeatChannels {
            publish,
            requests,
            grants,
        };
        tasks.spawn(keep_seat(
            name.to_string(),
            open,
            channels,
            shutdown.clone(),
        ));
        seat
    }

    /// Ask the seat to give up its term.
    pub async fn resign(&self, rejoin: Rejoin) -> Resigned {
        let (reply, answer) = oneshot::channel();
        let request = ResignRequest { rejoin, reply };
        if self.resigns.send(request).await.is_err() {
            return Resigned::NotLeading;
        }
        answer.await.unwrap_or(Resigned::NotLeading)
    }
}

/// Every seat of this process, by election name.
pub type Seats = Arc<BTreeMap<String, Seat>>;

/// How a seat gets its election (or semaphore, with `--slots`): connect
/// (once, shared by every seat) and build it. Called again after a
/// transient failure.
pub type Open = Arc<
    dyn Fn() -> std::pin::Pin<Box<dyn std::future::Future<Output = tenure::Result<Contest>> + Send>>
        + Send
        + Sync,
>;

/// Keep `holder` up to date from the election's announcements and lease
/// reads (the library's [`Election::watch`]). Never ends.
async fn follow_holder(election: Election, publish: watch::Sender<View>) {
    let mut changes = Box::pin(election.watch());
    while let Some(change) = changes.next().await {
        match change {
            Ok(leader) => {
                let holder = leader.map(|LeaderInfo { id, token, .. }| (id, token));
                publish.send_if_modified(|view| {
                    // While this instance leads, its own term is the truth.
                    let leading = view.term.as_ref().is_some_and(Leadership::is_leader);
                    if leading || view.holder == holder {
                        return false;
                    }
                    view.holder = holder;
                    true
                });
            }
            Err(err) => {
                tracing::debug!(election = %election.name(), error = %err, "cannot read the election's holder");
            }
        }
    }
}

/// The seat of one election: campaign, lead until the term ends, campaign
/// again; resign on request or shutdown. Returns on shutdown, or with an
/// error that needs a person.
async fn keep_seat(
    name: String,
    open: Open,
    channels: SeatChannels,
    shutdown: CancellationToken,
) -> Result<(), Failure> {
    let SeatChannels {
        publish,
        mut requests,
        grants,
    } = channels;
    let Some(contest) = open_election(&name, &open, &mut requests, &shutdown).await? else {
        return Ok(());
    };
    publish.send_modify(|view| view.ready = true);
    // Who holds the lease, for the `leader` field; it ends with the seat. A
    // semaphore's N holders have no one name: `leader` is this instance
    // while it holds a permit, else null.
    let _follower = match &contest {
        Contest::Election(election) => Some(AbortOnDrop(tokio::spawn(follow_holder(
            election.clone(),
            publish.clone(),
        )))),
        Contest::Slots(_) => None,
    };
    loop {
        let Some(term) = win(&contest, &mut requests, &shutdown).await? else {
            return Ok(());
        };
        let token = term.token();
        let Some(rejoin) = lead(&term, &name, &mut requests, &grants, &publish, &shutdown).await
        else {
            return Ok(());
        };
        end_term(&publish, token);
        let ttl = contest.first().ttl();
        if rejoin == Rejoin::AfterTtl && !stand_aside(ttl, &mut requests, &shutdown).await {
            return Ok(());
        }
    }
}

/// Campaign until elected (answering resign requests meanwhile: not
/// leading); `None` on shutdown, after giving back any lease the abandoned
/// campaign won.
async fn win(
    contest: &Contest,
    requests: &mut mpsc::Receiver<ResignRequest>,
    shutdown: &CancellationToken,
) -> Result<Option<Leadership>, Failure> {
    let mut campaign = Box::pin(contest.campaign());
    let term = loop {
        tokio::select! {
            term = &mut campaign => break Some(term?),
            Some(request) = requests.recv() => {
                let _ = request.reply.send(Resigned::NotLeading);
            }
            _ = shutdown.cancelled() => break None,
        }
    };
    let Some(term) = term else {
        // The campaign may have won a lease whose reply it never read:
        // abandon it (it no longer counts as running), then give that
        // lease back rather than leave it to lapse.
        drop(campaign);
        contest.release_if_held().await;
        return Ok(None);
    };
    drop(campaign);
    Ok(Some(term))
}

/// Lead in `term`: grant time and publish it, until the term is lost or a
/// resign request gives it up; when to campaign again, or `None` on
/// shutdown (the term given up first).
async fn lead(
    term: &Leadership,
    name: &str,
    requests: &mut mpsc::Receiver<ResignRequest>,
    grants: &Mutex<Grants>,
    publish: &watch::Sender<View>,
    shutdown: &CancellationToken,
) -> Option<Rejoin> {
    let token = term.token();
    open_grants(grants, term);
    tracing::info!(election = %name, token, permit = %term.election(), "leading");
    publish.send_modify(|view| {
        view.term = Some(term.clone());
        view.holder = Some((term.id().to_string(), token));
    });
    let rejoin = tokio::select! {
        reason = term.lost() => {
            close_grants(grants);
            tracing::warn!(election = %name, token, %reason, "no longer leading");
            Rejoin::Now
        }
        Some(request) = requests.recv() => {
            let answer = match give_up(name, term, grants, publish).await {
                Ok(()) => Resigned::Term(token),
                Err(err) => Resigned::Failed(err.to_string()),
            };
            tracing::info!(election = %name, token, "resigned on request");
            let _ = request.reply.send(answer);
            request.rejoin
        }
        _ = shutdown.cancelled() => {
            if let Err(err) = give_up(name, term, grants, publish).await {
                tracing::warn!(election = %name, token, error = %err, "could not release the lease; it lapses at its ttl");
            }
            return None;
        }
    };
    Some(rejoin)
}

/// Stand aside for one `ttl`, so another instance takes over; requests
/// meanwhile are answered, shutdown ends it (`false`).
async fn stand_aside(
    ttl: Duration,
    requests: &mut mpsc::Receiver<ResignRequest>,
    shutdown: &CancellationToken,
) -> bool {
    let stand_aside = tokio::time::sleep(ttl);
    tokio::pin!(stand_aside);
    loop {
        tokio::select! {
            _ = &mut stand_aside => return true,
            Some(request) = requests.recv() => {
                let _ = request.reply.send(Resigned::NotLeading);
            }
            _ = shutdown.cancelled() => return false,
        }
    }
}

/// Resign `term` the safe way for a sidecar: no more grants, tell the
/// clients (streams say the term ended), wait until the last deadline
/// handed out has passed, and only then release the lease.
async fn give_up(
    name: &str,
    term: &Leadership,
    grants: &Mutex<Grants>,
    publish: &watch::Sender<View>,
) -> tenure::Result<()> {
    let until = close_grants(grants);
    end_term(publish, term.token());
    if let Some(until) = until.filter(|until| *until > Instant::now()) {
        tracing::info!(election = %name, token = term.token(), wait = ?(until - Instant::now()), "waiting for the deadline handed to clients before releasing the lease");
        tokio::select! {
            _ = tokio::time::sleep_until(until) => {}
            // The term ended meanwhile (taken, or its own deadline): the
            // lease is no longer this instance's to hold back.
            _ = term.lost() => {}
        }
    }
    term.resign().await
}

/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Open the seat's election, trying again (with backoff) while the store
/// cannot be reached; `None` on shutdown. Errors that need a person
/// (credentials, ACL, configuration) are returned at once.
async fn open_election(
    name: &str,
    open: &Open,
    requests: &mut mpsc::Receiver<ResignRequest>,
    shutdown: &CancellationToken,
) -> Result<Option<Contest>, Failure> {
    let mut backoff = Duration::from_millis(100);
    loop {
        let attempt = open();
        tokio::pin!(attempt);
        let opened = loop {
            tokio::select! {
                opened = &mut attempt => break opened,
                Some(request) = requests.recv() => {
                    let _ = request.reply.send(Resigned::NotLeading);
                }
                _ = shutdown.cancelled() => return Ok(None),
            }
        };
        match opened {
            Ok(contest) => return Ok(Some(contest)),
            Err(err) if err.is_transient() => {
                tracing::warn!(election = %name, error = %err, retry_in = ?backoff, "cannot reach the store yet; answering as a follower meanwhile");
            }
            Err(err) => return Err(err.into()),
        }
        let wait = tokio::time::sleep(backoff);
        tokio::pin!(wait);
        loop {
            tokio::select! {
                _ = &mut wait => break,
                Some(request) = requests.recv() => {
                    let _ = request.reply.send(Resigned::NotLeading);
                }
                _ = shutdown.cancelled() => return Ok(None),
            }
        }
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

/// Publish that the term `token` is over (if it is the one published).
fn end_term(publish: &watch::Sender<View>, token: u64) {
    publish.send_if_modified(|view| {
        if view.term.as_ref().map(Leadership::token) != Some(token) {
            return false;
        }
        view.term = None;
        if view.holder.as_ref().is_some_and(|(_, held)| *held == token) {
            view.holder = None;
        }
        true
    });
}
