//! Crash detection on one host: an OS lock (`flock`) per election.
//!
//! A candidate that wins an election while holding the election's lock
//! file exclusively keeps it for its whole term, and marks its lease
//! `locked`. It lets go only once it stopped leading (its release, or its
//! term lapsed: see [`Locks::sweep`]), and the kernel lets go for it the
//! instant its process dies. So a candidate that holds the lock and finds
//! a `locked` lease knows its holder no longer leads, and takes over at
//! once, with no wait for the lease to expire.
//!
//! Followers wait for the lock in a thread of their own, shared, which
//! costs no polling: the kernel wakes them all when the holder lets go,
//! they let go at once and announce a release, and their campaigns try
//! the lock (exclusively) and the lease. A paused or wedged holder keeps
//! its lock; its lease expires by the clock, a follower takes over then
//! (without the lock: its lease is not `locked`, so its crash is detected
//! only by its expiry), and fencing covers the paused holder.
//!
//! Lock files live in a directory beside the database (`FILE.locks/`), one
//! per election, and are never deleted: a file deleted and made anew
//! would be a second lock.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rustix::fs::{flock, FlockOperation};
use tokio::sync::watch;

use crate::backend::op::Notices;
use crate::backend::Address;
use crate::{Error, Result};

/// An election, as the locks know it.
pub(super) type Key = (String, String);

pub(super) fn key(at: Address<'_>) -> Key {
    (at.prefix.to_string(), at.name.to_string())
}

/// A term's exclusive lock, kept while the term may lead.
struct Held {
    id: String,
    attempt: String,
    /// The term's token, once it won.
    token: Option<u64>,
    ttl: Duration,
    /// When its last acquire or renewal committed.
    renewed: Instant,
    /// Locked (`flock`, exclusive). Closed, never unlocked: a duplicate
    /// handed to another process ([`Locks::duplicate`]) keeps the lock
    /// held until that process closes it too.
    /// Shared with an acquire under way that holds it ([`Taken::Kept`]),
    /// so that the lock outlives this entry until that acquire is done.
    file: Arc<File>,
    /// Its inode.
    inode: i64,
}

/// The followers one watcher wakes: each with its id.
type Followers = Arc<Mutex<Vec<(u64, watch::Sender<Notices>)>>>;

/// An election's watcher (one thread per election a process ever
/// followed, kept for as long as the store: a thread blocked in `flock`
/// cannot be stopped, so one per follower would pile up behind a long
/// term), and the followers it wakes.
struct Watcher {
    /// Tells it the election is held under its lock: wait for it.
    arm: mpsc::Sender<()>,
    followers: Followers,
}

/// The locks of one store (one process's view of one database file).
pub(super) struct Locks {
    dir: PathBuf,
    held: Mutex<HashMap<Key, Held>>,
    /// The watcher of each election this process followed.
    watchers: Mutex<HashMap<Key, Watcher>>,
    /// The id of the next follower.
    next: std::sync::atomic::AtomicU64,
    /// Watcher threads started.
    started: std::sync::atomic::AtomicU64,
}

fn guard<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// How a lock file's name spells an election: bytes other than ASCII
/// letters, digits, `-`, `_` and `.` as `%XX`, so names never collide or
/// leave the directory.
fn file_name(key: &Key) -> String {
    let mut name = String::new();
    for (part, text) in [key.0.as_str(), key.1.as_str()].iter().enumerate() {
        if part == 1 {
            name.push('+');
        }
        for byte in text.bytes() {
            if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.') {
                name.push(char::from(byte));
            } else {
                name.push_str(&format!("%{byte:02X}"));
            }
        }
    }
    // Within every file system's limit of 255 bytes a name: a longer one
    // keeps its start and ends with a hash of the whole. Two elections
    // whose names collide share a lock file, which only costs them the
    // early takeover (the lease records the holder's lock, not the name).
    if name.len() > 200 {
        let hash = name.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
        name.truncate(180);
        name.push_str(&format!("-{hash:016x}"));
    }
    name.push_str(".lock");
    name
}

impl Locks {
    /// The locks beside the database at `db`; their directory is made now.
    pub fn beside(url: &str, db: &Path) -> Result<Locks> {
        let mut dir = db.as_os_str().to_owned();
        dir.push(".locks");
        let dir = PathBuf::from(dir);
        std::fs::create_dir_all(&dir).map_err(|err| Error::Unreachable {
            url: url.to_string(),
            detail: format!("cannot make the lock directory {}: {err}", dir.display()),
        })?;
        Ok(Locks {
            dir,
            held: Mutex::new(HashMap::new()),
            watchers: Mutex::new(HashMap::new()),
            next: std::sync::atomic::AtomicU64::new(0),
            started: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// The lock directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn open(&self, key: &Key) -> Result<File> {
        let path = self.dir.join(file_name(key));
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|err| Error::Sqlite {
                detail: format!("cannot open the lock file {}: {err}", path.display()),
            })
    }

    /// Whether anyone in this process watches `key`: only elections are,
    /// so a partition set's many terms take no lock (and no file
    /// descriptor) each.
    pub fn watched(&self, key: &Key) -> bool {
        guard(&self.watchers)
            .get(key)
            .is_some_and(|w| !guard(&w.followers).is_empty())
    }

    /// Before an acquire by attempt (`id`, `attempt`): whether it holds
    /// the election's lock, taking it if it is free. A lock taken now is
    /// kept only if the acquire wins ([`Locks::after_acquire`]).
    pub fn before_acquire(&self, key: &Key, id: &str, attempt: &str) -> Option<Taken> {
        if let Some(held) = guard(&self.held).get(key) {
            let ours = held.id == id && held.attempt == attempt;
            return ours.then(|| Taken::Kept(Arc::clone(&held.file), held.inode));
        }
        let file = self.open(key).ok()?;
        let inode = inode(&file)?;
        // Followers' watchers hold it shared for an instant each: a few
        // short tries get past them.
        for _ in 0..20 {
            if flock(&file, FlockOperation::NonBlockingLockExclusive).is_ok() {
                return Some(Taken::Now(file, inode));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        None
    }

    /// After an acquire: a term that won keeps the lock it holds.
    pub fn after_acquire(
        &self,
        key: &Key,
        id: &str,
        attempt: &str,
        ttl: Duration,
        won: Option<u64>,
        taken: Option<Taken>,
    ) {
        let mut held = guard(&self.held);
        let (Some(taken), Some(token)) = (taken, won) else {
            // Lost: a lock taken for this try is let go as it drops.
            return;
        };
        let (file, inode) = match taken {
            Taken::Now(file, inode) => (Arc::new(file), inode),
            // The lock this attempt held when it began: still held, though
            // its entry may have gone meanwhile (a release of the
            // attempt's earlier term, a sweep), since the acquire kept a
            // share of it.
            Taken::Kept(file, inode) => (file, inode),
        };
        match held.get_mut(key) {
            Some(kept) if kept.id == id && kept.attempt == attempt && kept.inode == inode => {
                kept.token = Some(token);
                kept.ttl = ttl;
                kept.renewed = Instant::now();
            }
            // Another term's lock would have kept this one from being
            // taken; none is there to be overwritten.
            Some(_) => {}
            None => {
                held.insert(
                    key.clone(),
                    Held {
                        id: id.to_string(),
                        attempt: attempt.to_string(),
                        token: Some(token),
                        ttl,
                        renewed: Instant::now(),
                        file,
                        inode,
                    },
                );
            }
        }
    }

    /// After a renewal of term (`id`, `token`) committed.
    pub fn renewed(&self, key: &Key, id: &str, token: u64, ttl: Duration) {
        if let Some(kept) = guard(&self.held).get_mut(key) {
            if kept.id == id && kept.token == Some(token) {
                kept.ttl = ttl;
                kept.renewed = Instant::now();
            }
        }
    }

    /// After term (`id`, `token`) resigned (its release committed): its
    /// lock goes, and followers wake.
    pub fn released(&self, key: &Key, id: &str, token: u64) {
        let mut held = guard(&self.held);
        if held
            .get(key)
            .is_some_and(|k| k.id == id && k.token == Some(token))
        {
            held.remove(key);
        }
    }

    /// A duplicate of the lock term (`id`, `token`) holds, while it holds
    /// one: the lock stays held until every duplicate is closed.
    pub fn duplicate(&self, key: &Key, id: &str, token: u64) -> Option<std::os::fd::OwnedFd> {
        let held = guard(&self.held);
        let kept = held
            .get(key)
            .filter(|k| k.id == id && k.token == Some(token))?;
        kept.file.try_clone().ok().map(std::os::fd::OwnedFd::from)
    }

    /// How many hold the lock of `key`'s term: its entry, and each acquire
    /// under way with a share of it.
    #[cfg(test)]
    pub fn shares(&self, key: &Key) -> usize {
        guard(&self.held)
            .get(key)
            .map_or(0, |held| Arc::strong_count(&held.file))
    }

    /// The lock file of `key`, opened anew (for tests to try its lock).
    #[cfg(test)]
    pub fn file_of(&self, key: &Key) -> File {
        self.open(key).expect("the lock file opens")
    }

    /// Let go of the locks of terms nobody renewed for a whole ttl: their
    /// deadlines have passed, so their keepers no longer lead.
    pub fn sweep(&self) {
        let now = Instant::now();
        guard(&self.held).retain(|_, kept| now < kept.renewed + kept.ttl);
    }

    /// Wake the watchers of `key`: the election is held under its lock.
    pub fn arm(&self, key: &Key) {
        if let Some(watcher) = guard(&self.watchers).get(key) {
            let _ = watcher.arm.send(());
        }
    }

    /// Watch `key` for as long as the returned guard lives: each time
    /// the lock it waits for is let go, `notices` counts a release.
    pub fn watch(self: &Arc<Self>, key: Key, notices: watch::Sender<Notices>) -> Result<Watching> {
        let id = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut watchers = guard(&self.watchers);
        if let Some(watcher) = watchers.get(&key) {
            guard(&watcher.followers).push((id, notices));
        } else {
            let file = self.open(&key)?;
            let (arm, armed) = mpsc::channel();
            let followers: Followers = Arc::new(Mutex::new(vec![(id, notices)]));
            let woken = Arc::clone(&followers);
            std::thread::Builder::new()
                .name("tenure-sqlite-watch".into())
                .spawn(move || wait_for_releases(file, &armed, &woken))
                .map_err(|err| Error::internal(format!("cannot start a lock watcher: {err}")))?;
            self.started
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            watchers.insert(key.clone(), Watcher { arm, followers });
        }
        Ok(Watching {
            locks: Arc::downgrade(self),
            key,
            id,
        })
    }
}

/// How an acquire holds the election's lock.
pub(super) enum Taken {
    /// Its attempt held it already (a retry): a share of it, kept until
    /// the acquire is done, and the lock file's inode.
    Kept(Arc<File>, i64),
    /// Taken for this try (locked), and its inode.
    Now(File, i64),
}

impl Taken {
    /// The inode of the lock file held.
    pub fn inode(&self) -> i64 {
        match self {
            Taken::Kept(_, inode) | Taken::Now(_, inode) => *inode,
        }
    }
}

/// A lock file's inode, as the lease records it (never 0).
fn inode(file: &File) -> Option<i64> {
    use std::os::unix::fs::MetadataExt;
    let inode = i64::try_from(file.metadata().ok()?.ino()).ok()?;
    (inode != 0).then_some(inode)
}

/// An election's watcher: waits (in its own thread: a blocked `flock`
/// cannot be cancelled, and must not hold up the runtime's shutdown) for
/// the lock each time it is armed, and announces each release to every
/// follower. It ends with the store (its arming channel closes).
fn wait_for_releases(file: File, armed: &mpsc::Receiver<()>, followers: &Followers) {
    loop {
        if armed.recv().is_err() {
            return;
        }
        // Arms sent meanwhile are all answered by this one wait.
        loop {
            match armed.try_recv() {
                Ok(()) => {}
                Err(mpsc::TryRecvError::Disconnected) => return,
                Err(mpsc::TryRecvError::Empty) => break,
            }
        }
        loop {
            match flock(&file, FlockOperation::LockShared) {
                Ok(()) => break,
                // Interrupted: wait again.
                Err(rustix::io::Errno::INTR) => continue,
                // Anything else: the lock cannot be waited for; followers
                // fall back on the lease's expiry.
                Err(_) => return,
            }
        }
        if flock(&file, FlockOperation::Unlock).is_err() {
            return;
        }
        for (_, notices) in guard(followers).iter() {
            notices.send_modify(|n| n.released += 1);
        }
    }
}

/// Keeps a follower on its election's watcher; dropping it takes the
/// follower off (the watcher stays, for the next follower).
pub(super) struct Watching {
    locks: std::sync::Weak<Locks>,
    key: Key,
    id: u64,
}

impl Drop for Watching {
    fn drop(&mut self) {
        if let Some(locks) = self.locks.upgrade() {
            if let Some(watcher) = guard(&locks.watchers).get(&self.key) {
                guard(&watcher.followers).retain(|(id, _)| *id != self.id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Followers that come and go while a holder keeps its lock (an
    /// election built per request, say) share one watcher thread, and the
    /// one still there hears the release.
    #[test]
    fn followers_of_one_election_share_one_watcher() {
        let dir = std::env::temp_dir().join(format!(
            "tenure-unit-locks-{}-{:x}",
            std::process::id(),
            rand::random::<u64>()
        ));
        std::fs::create_dir_all(&dir).expect("a directory");
        let locks = Arc::new(Locks::beside("sqlite://test", &dir.join("t.db")).expect("locks"));
        let key: Key = ("p".into(), "e".into());
        let holder = locks.file_of(&key);
        flock(&holder, FlockOperation::NonBlockingLockExclusive).expect("the holder's lock");
        for _ in 0..30 {
            let (sender, _notices) = watch::channel(Notices::default());
            let watching = locks.watch(key.clone(), sender).expect("a follower");
            locks.arm(&key);
            drop(watching);
        }
        let (sender, notices) = watch::channel(Notices::default());
        let _watching = locks.watch(key.clone(), sender).expect("the last follower");
        let started = locks.started.load(std::sync::atomic::Ordering::Relaxed);
        assert_eq!(started, 1, "one watcher thread");
        assert!(locks.watched(&key));
        locks.arm(&key);
        drop(holder);
        let limit = std::time::Instant::now() + Duration::from_secs(30);
        while notices.borrow().released == 0 {
            assert!(
                std::time::Instant::now() < limit,
                "the release was never heard"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn lock_file_names_never_collide_or_leave_the_directory() {
        let name = |p: &str, n: &str| file_name(&(p.to_string(), n.to_string()));
        assert_eq!(name("tenure:", "jobs"), "tenure%3A+jobs.lock");
        assert_ne!(name("a+", "b"), name("a", "+b"));
        assert!(!name("../", "x/y").contains('/'));
        let long = "é".repeat(100);
        assert!(name(&long, &long).len() <= 255);
        assert_ne!(name(&long, "a"), name(&long, "b"));
    }
}
