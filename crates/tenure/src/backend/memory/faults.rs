//! Simulated outages of one client: the [`Fault`] its calls suffer and
//! how its [`Announcements`] arrive (passed on, delayed or dropped by a
//! relay task). Apart from the store's data, which they never change.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::state::StoreState;
use super::MemoryStore;
use crate::backend::op::Notices;
#[cfg(doc)]
use crate::Error;

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
#[cfg_attr(not(feature = "testing"), allow(dead_code))]
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
    /// A saturated server: each lease a call touches costs this long (a
    /// renewal of many terms costs one each), and the server serves one
    /// round trip at a time, so a round trip's replies arrive once it has
    /// worked through every round trip sent before it and this one. Calls
    /// are carried out when sent; a reply later than the call timeout is a
    /// timeout, and the work it cost stays queued, as on Redis.
    Busy(Duration),
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
#[cfg_attr(not(feature = "testing"), allow(dead_code))]
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

/// One client's connection to a shared [`MemoryStore`].
#[derive(Debug, Default)]
pub(super) struct View {
    pub(super) fault: Fault,
    pub(super) announcements: Announcements,
}

impl MemoryStore {
    /// The fault that applies to this handle's calls now: the whole
    /// store's, else the view's own. A saturated store ([`Fault::Busy`])
    /// still never hears a call that its view stalls or refuses, nor
    /// answers one whose replies the view loses: a paused client stays
    /// paused while the server is busy. (Such a call costs the busy server
    /// nothing, and a view's own [`Fault::Slow`] gives way to the store's
    /// [`Fault::Busy`]: simplifications, both.)
    pub(super) fn fault(&self, state: &StoreState) -> Fault {
        let view = self
            .view
            .as_ref()
            .map_or(Fault::None, |view| lock(view).fault);
        match (state.fault, view) {
            (Fault::None, view) => view,
            (Fault::Busy(_), view @ (Fault::Stall | Fault::Fail | Fault::LoseReplies)) => view,
            (fault, _) => fault,
        }
    }
}

pub(super) fn lock(view: &Mutex<View>) -> MutexGuard<'_, View> {
    view.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The announcements of `source` as a view receives them: passed on,
/// delayed or dropped as the view's [`Announcements`] say when each is
/// sent, always in the order they were sent. The relay ends when the
/// election stops listening.
pub(super) fn relay(
    mut source: watch::Receiver<Notices>,
    view: Arc<Mutex<View>>,
) -> watch::Receiver<Notices> {
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

    #[tokio::test(start_paused = true)]
    async fn a_busy_store_never_hears_a_stalled_view_and_its_backlog_ends_with_it() {
        use crate::Fault;
        let store = MemoryStore::new();
        let view = store.view();
        let a = Election::builder("jobs").memory(&view).id("a").build();
        let a = a.await.expect("builds");
        // A paused client stays paused on a saturated server.
        store.set_fault(Fault::Busy(Duration::from_millis(100)));
        view.set_fault(Fault::Stall);
        assert!(
            a.leader().await.is_err(),
            "a stalled view's call was answered"
        );
        view.set_fault(Fault::None);
        // Two seconds of queued work, then the saturation ends and another
        // begins: the new one starts without the old one's backlog.
        let queued: Vec<_> = (0..20)
            .map(|_| {
                let a = a.clone();
                tokio::spawn(async move { a.leader().await })
            })
            .collect();
        tokio::task::yield_now().await;
        store.set_fault(Fault::None);
        store.set_fault(Fault::Busy(Duration::from_millis(1)));
        let asked = Instant::now();
        assert!(a.leader().await.is_ok());
        let waited = asked.elapsed();
        assert!(
            waited < Duration::from_millis(50),
            "served after {waited:?}"
        );
        for call in queued {
            let _ = call.await;
        }
    }
}
