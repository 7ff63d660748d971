//! Fencing: making a stale leader's writes impossible, not just unlikely.
//!
//! A Redis lease cannot stop a leader that was paused (GC, VM migration,
//! `SIGSTOP`) right after checking [`Leadership::is_leader`] from acting
//! when it resumes, after someone else took over. What stops it is the
//! resource: every write carries the writer's fencing token, and the
//! resource refuses a token lower than one it has already accepted.
//! Tokens rise with every term, so the newest leader always wins.
//!
//! For data in Redis, [`FencedKey`] does this with one script per write.
//! For a SQL store, keep the highest token beside the data and make the
//! check part of the write itself:
//!
//! ```sql
//! UPDATE jobs SET last_run = $now, fence_token = $token
//!  WHERE name = $job AND fence_token <= $token;
//! -- 0 rows updated: a newer leader has written; stop acting.
//! ```
//!
//! Fenced writes go through any Redis connection; [`connect`] opens one
//! the way elections open theirs (Sentinel and Cluster routing included),
//! and [`crate::Store::redis_connection`] gives one on a store's own
//! connections. This module is Redis by design: the one place outside
//! `backend/redis/` that names it.
//!
//! [`Leadership::is_leader`]: crate::Leadership::is_leader

use redis::aio::ConnectionLike;
use redis::{Script, Value};

use crate::backend::redis::classify;
pub use crate::backend::redis::routed::{connect, Connection};
use crate::{Error, Result};

impl crate::Store {
    /// A connection for fenced writes (and any other command of the
    /// application's) on this store's own connections: the primary of a
    /// Sentinel group, each key's node of a Cluster. `None` when the store
    /// is not Redis.
    ///
    /// ```
    /// let store = tenure::Store::memory(&tenure::MemoryStore::new());
    /// assert!(store.redis_connection().is_none());
    /// ```
    pub fn redis_connection(&self) -> Option<Connection> {
        match &self.inner {
            crate::backend::Store::Redis(shared) => Some(shared.connection()),
            _ => None,
        }
    }
}

static FENCED_SET: &str = concat!(
    include_str!("backend/redis/scripts/prelude.lua"),
    include_str!("fence/fenced_set.lua")
);

/// The outcome of a fenced write ([`FencedKey::set`]). Outcomes may be
/// added; only [`FencedWrite::Accepted`] means the value was written.
///
/// ```
/// use tenure::FencedWrite;
/// assert!(FencedWrite::Accepted.is_accepted());
/// let refused = FencedWrite::Rejected { highest: 42 };
/// assert!(!refused.is_accepted());
/// if let FencedWrite::Rejected { highest } = refused {
///     println!("a leader with token {highest} wrote after us: stop");
/// }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FencedWrite {
    /// The write was applied.
    Accepted,
    /// A write with a newer token was already accepted; nothing changed.
    Rejected {
        /// The highest token the resource has accepted.
        highest: u64,
    },
}

impl FencedWrite {
    /// Whether the write was applied.
    ///
    /// ```
    /// use tenure::FencedWrite;
    /// assert!(FencedWrite::Accepted.is_accepted());
    /// assert!(!FencedWrite::Rejected { highest: 7 }.is_accepted());
    /// ```
    pub fn is_accepted(&self) -> bool {
        matches!(self, FencedWrite::Accepted)
    }
}

/// A Redis hash holding a value and the highest fencing token that wrote it
/// (fields `value` and `token`); writes with an older token are rejected.
///
/// ```no_run
/// # async fn demo(term: tenure::Leadership, mut conn: redis::aio::ConnectionManager) -> tenure::Result<()> {
/// let marker = tenure::FencedKey::new("cleanup:last-run");
/// match marker.set(&mut conn, term.token(), "2026-11-29").await? {
///     tenure::FencedWrite::Accepted => println!("recorded"),
///     tenure::FencedWrite::Rejected { highest } => {
///         println!("a newer leader (token {highest}) has written; stopping")
///     }
///     // Outcomes may be added; none of them is a success.
///     other => println!("not recorded: {other:?}"),
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct FencedKey {
    key: String,
    script: Script,
}

impl FencedKey {
    /// A fenced value stored at `key`.
    ///
    /// ```
    /// let marker = tenure::FencedKey::new("cleanup:last-run");
    /// assert_eq!(marker.key(), "cleanup:last-run");
    /// ```
    pub fn new(key: impl Into<String>) -> Self {
        FencedKey {
            key: key.into(),
            script: Script::new(FENCED_SET),
        }
    }

    /// The Redis key.
    ///
    /// ```
    /// let marker = tenure::FencedKey::new("reports:{daily}:marker");
    /// assert_eq!(marker.key(), "reports:{daily}:marker");
    /// ```
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Store `value` if `token` is at least the highest token accepted so far.
    ///
    /// ```no_run
    /// # async fn demo(conn: &mut redis::aio::ConnectionManager) -> tenure::Result<()> {
    /// let marker = tenure::FencedKey::new("cleanup:last-run");
    /// assert!(marker.set(conn, 8, "by token 8").await?.is_accepted());
    /// let late = marker.set(conn, 7, "by token 7").await?; // an older leader, too late
    /// assert_eq!(late, tenure::FencedWrite::Rejected { highest: 8 });
    /// # Ok(()) }
    /// ```
    pub async fn set<C: ConnectionLike + Send>(
        &self,
        conn: &mut C,
        token: u64,
        value: impl AsRef<[u8]>,
    ) -> Result<FencedWrite> {
        let reply: Value = self
            .script
            .key(&self.key)
            .arg(token)
            .arg(value.as_ref())
            .invoke_async(conn)
            .await
            .map_err(|e| classify(e, "the fenced resource's connection"))?;
        match reply {
            Value::Array(items) => match items.as_slice() {
                [Value::Int(1), ..] => Ok(FencedWrite::Accepted),
                [Value::Int(0), Value::Int(highest)] => Ok(FencedWrite::Rejected {
                    highest: u64::try_from(*highest).unwrap_or(0),
                }),
                other => Err(Error::redis(format!(
                    "unexpected fenced write reply {other:?}"
                ))),
            },
            other => Err(Error::redis(format!(
                "unexpected fenced write reply {other:?}"
            ))),
        }
    }

    /// Read the value and the token that wrote it (`None` if never written).
    ///
    /// ```no_run
    /// # async fn demo(conn: &mut redis::aio::ConnectionManager) -> tenure::Result<()> {
    /// let marker = tenure::FencedKey::new("cleanup:last-run");
    /// marker.set(conn, 8, "2026-11-29").await?;
    /// assert_eq!(marker.get(conn).await?, Some((8, b"2026-11-29".to_vec())));
    /// # Ok(()) }
    /// ```
    pub async fn get<C: ConnectionLike + Send>(
        &self,
        conn: &mut C,
    ) -> Result<Option<(u64, Vec<u8>)>> {
        let (token, value): (Option<u64>, Option<Vec<u8>>) = redis::cmd("HMGET")
            .arg(&self.key)
            .arg("token")
            .arg("value")
            .query_async(conn)
            .await
            .map_err(|e| match classify(e, "the fenced resource's connection") {
                Error::Redis { detail, .. } if detail.contains("WRONGTYPE") => Error::ForeignData {
                    key: self.key.clone(),
                    detail: "is not a fenced hash".into(),
                },
                other => other,
            })?;
        Ok(token.map(|token| (token, value.unwrap_or_default())))
    }
}
