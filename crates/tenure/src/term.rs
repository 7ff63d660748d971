//! The vocabulary of terms, shared by the pure core, the backends and the
//! handles: how a term ends ([`LostReason`]) and who holds a lease
//! ([`LeaderInfo`], from the backends' [`Holder`]). It depends on nothing
//! else in the crate, so that everything can depend on it.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// What the holder of a lease looks like, as reported by the backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Holder {
    pub id: String,
    pub token: u64,
    pub ttl_left: Duration,
    pub since_ms: u64,
    /// The campaign attempt that wrote the lease (empty when unknown).
    pub attempt: String,
    /// The ttl the lease was granted with (zero when unknown).
    pub ttl: Duration,
}

/// Why a term ended.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
/// let store = tenure::MemoryStore::new();
/// let election = tenure::Election::builder("reports").memory(&store).build().await?;
/// let term = election.campaign().await?;
/// term.resign().await?;
/// let reason = term.lost().await;
/// assert_eq!(reason, tenure::LostReason::Resigned);
/// assert_eq!(reason.label(), "resigned"); // the `reason` label of leader_election_lost_total
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LostReason {
    /// Another instance holds the lease now.
    Taken {
        /// That instance's id.
        by: String,
        /// Its term's fencing token.
        token: u64,
    },
    /// The lease is gone from the store (it expired, or the store lost its data).
    Expired,
    /// The local deadline passed without a successful renewal: this instance
    /// cannot know that it still holds the lease, so it must stop.
    DeadlinePassed,
    /// [`crate::Leadership::resign`] was called (or every handle was dropped).
    Resigned,
    /// The process is shutting down; the lease is released once the work stopped.
    Shutdown,
}

impl LostReason {
    /// A short stable label, used in metrics (`reason="taken"`).
    ///
    /// ```
    /// assert_eq!(tenure::LostReason::DeadlinePassed.label(), "deadline");
    /// ```
    pub fn label(&self) -> &'static str {
        match self {
            LostReason::Taken { .. } => "taken",
            LostReason::Expired => "expired",
            LostReason::DeadlinePassed => "deadline",
            LostReason::Resigned => "resigned",
            LostReason::Shutdown => "shutdown",
        }
    }
}

impl fmt::Display for LostReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LostReason::Taken { by, token } => {
                // The id comes from the store: escape anything that could
                // forge a log line.
                write!(f, "lease taken by {} (token {token})", by.escape_debug())
            }
            LostReason::Expired => write!(f, "lease expired or was lost by the store"),
            LostReason::DeadlinePassed => {
                write!(f, "local deadline passed without a successful renewal")
            }
            LostReason::Resigned => write!(f, "resigned"),
            LostReason::Shutdown => write!(f, "shutting down"),
        }
    }
}

/// Who leads an election, as read from the store.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
/// let store = tenure::MemoryStore::new();
/// let election = tenure::Election::builder("reports").memory(&store).id("a").build().await?;
/// let term = election.campaign().await?;
/// let leader: tenure::LeaderInfo = election.leader().await?.expect("a leads");
/// assert_eq!((leader.id.as_str(), leader.token), ("a", term.token()));
/// assert!(leader.ttl_left > std::time::Duration::ZERO);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaderInfo {
    /// The leader's instance id.
    pub id: String,
    /// Its term's fencing token.
    pub token: u64,
    /// Time until its lease expires unless renewed.
    pub ttl_left: Duration,
    /// When the term began, by the store's clock (`None` for the in-memory store).
    pub held_since: Option<SystemTime>,
}

impl From<Holder> for LeaderInfo {
    fn from(holder: Holder) -> Self {
        LeaderInfo {
            id: holder.id,
            token: holder.token,
            ttl_left: holder.ttl_left,
            held_since: (holder.since_ms > 0)
                .then(|| UNIX_EPOCH + Duration::from_millis(holder.since_ms)),
        }
    }
}
