//! Rollback detection: a high-water mark kept beside the database.
//!
//! A file restored from an older copy (rows rolled back in place, or an
//! older file put in the path's place) has lost the leases granted since
//! the copy, while their holders still lead: a candidate would find the
//! election free and lead beside them. The file cannot tell by itself that
//! it went back, so every batch counts itself in it (`generation` in
//! `tenure_meta`, see `ops.rs`) and, once committed, raises a mark kept
//! outside it, in the lock directory (`FILE.locks/horizon`): the largest
//! generation committed, and the latest expiry any lease was given (on
//! the boot clock of the boot named beside it). A batch that finds the
//! file's generation below the mark knows the file went back, and the file
//! grants no new term until that expiry has passed: every holder of a
//! lease it lost has surely stopped by then. A restore of the lock
//! directory along with the file takes the mark back too, and is not
//! detected (the book says so).
//!
//! The mark's expiry is raised before the commit (a batch's leases are
//! covered before anyone can see them) and its generation after (it never
//! runs ahead of what the file holds: a process that dies in between
//! leaves it behind, which only makes the next rollback harder to see,
//! never a false alarm).

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rustix::fs::{flock, FlockOperation};

use crate::{Error, Result};

/// The size of the mark's record: a boot id (36 bytes) and two numbers of
/// at most 20 digits fit with room to spare.
const RECORD: usize = 128;

/// What the mark says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Mark {
    /// The boot of `until`.
    pub boot: String,
    /// The largest generation a batch committed.
    pub generation: i64,
    /// The latest expiry any lease was given, on `boot`'s boot clock (ms).
    pub until: i64,
}

impl Mark {
    fn parse(text: &str) -> Option<Mark> {
        let mut words = text.split_whitespace();
        let boot = words.next()?.to_string();
        let generation = words.next()?.parse().ok()?;
        let until = words.next()?.parse().ok()?;
        Some(Mark {
            boot,
            generation,
            until,
        })
    }

    /// The mark as the file keeps it: padded to [`RECORD`] bytes, so that
    /// each write overwrites the last in place (no truncation, no block
    /// freed and allocated again on every batch).
    fn text(&self) -> String {
        let text = format!("{} {} {}", self.boot, self.generation, self.until);
        format!("{text:<width$}\n", width = RECORD - 1)
    }

    /// This mark raised by a batch of generation `generation` at boot
    /// `boot` whose leases run until `until` (if it wrote any).
    fn raised(self, boot: &str, generation: i64, until: Option<i64>) -> Mark {
        let generation = self.generation.max(generation);
        match until {
            // A mark of an earlier boot covers no live lease.
            Some(until) if self.boot != boot => Mark {
                boot: boot.to_string(),
                generation,
                until,
            },
            Some(until) => Mark {
                until: self.until.max(until),
                generation,
                boot: self.boot,
            },
            None => Mark { generation, ..self },
        }
    }
}

/// The mark of one database file.
pub(super) struct Horizon {
    path: PathBuf,
    /// The longest wait for the mark's lock: a process stopped while it
    /// holds it (SIGSTOP between two system calls) costs calls that fail
    /// and are retried, never a stall.
    patience: Duration,
}

impl Horizon {
    /// The mark in the lock directory `dir`, waited for at most
    /// `patience`.
    pub fn within(dir: &Path, patience: Duration) -> Horizon {
        Horizon {
            path: dir.join("horizon"),
            patience,
        }
    }

    /// Opened anew each time, so a lock directory deleted and made again
    /// is followed; one deleted is made again.
    fn open(&self) -> Result<File> {
        let open = || {
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&self.path)
        };
        match open() {
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
                if let Some(dir) = self.path.parent() {
                    std::fs::create_dir_all(dir).map_err(|err| self.failed("make", &err))?;
                }
                open()
            }
            opened => opened,
        }
        .map_err(|err| self.failed("open", &err))
    }

    /// Lock `file` (`how`: shared or exclusive), waiting at most the
    /// patience: the lock is held for a read or a write, so it is free
    /// again at once unless its holder was stopped.
    fn lock(&self, file: &File, how: FlockOperation) -> Result<()> {
        let limit = Instant::now() + self.patience;
        loop {
            match flock(file, how) {
                Ok(()) => return Ok(()),
                Err(rustix::io::Errno::WOULDBLOCK | rustix::io::Errno::INTR)
                    if Instant::now() < limit =>
                {
                    std::thread::sleep(Duration::from_micros(200));
                }
                Err(err) => return Err(self.failed("lock", &err)),
            }
        }
    }

    fn failed(&self, what: &str, err: &dyn std::fmt::Display) -> Error {
        Error::Sqlite {
            detail: format!("cannot {what} {}: {err}", self.path.display()),
        }
    }

    fn read_locked(&self, file: &mut File) -> Result<Option<Mark>> {
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)
            .map_err(|err| self.failed("read", &err))?;
        // Empty when new; anything else unreadable (not even UTF-8) is no
        // mark at all, and is written over by the next batch.
        Ok(Mark::parse(&String::from_utf8_lossy(&bytes)))
    }

    /// The mark now (none if there is none yet).
    pub fn read(&self) -> Result<Option<Mark>> {
        let mut file = self.open()?;
        self.lock(&file, FlockOperation::NonBlockingLockShared)?;
        self.read_locked(&mut file)
    }

    /// Raise the mark to `generation` (a committed batch's, or 0), and to
    /// `until` (the latest expiry a batch is about to give, or `None`).
    pub fn raise(&self, boot: &str, generation: i64, until: Option<i64>) -> Result<()> {
        let mut file = self.open()?;
        self.lock(&file, FlockOperation::NonBlockingLockExclusive)?;
        let mark = match self.read_locked(&mut file)? {
            Some(mark) => mark.raised(boot, generation, until),
            None => Mark {
                boot: boot.to_string(),
                generation,
                until: until.unwrap_or(0),
            },
        };
        file.write_all_at(mark.text().as_bytes(), 0)
            .map_err(|err| self.failed("write", &err))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mark_only_rises_within_a_boot_and_starts_again_in_a_new_one() {
        let mark = Mark {
            boot: "b1".into(),
            generation: 7,
            until: 5_000,
        };
        assert_eq!(Mark::parse(&mark.text()), Some(mark.clone()));
        let later = mark.clone().raised("b1", 8, Some(4_000));
        assert_eq!((later.generation, later.until), (8, 5_000));
        let same = mark.clone().raised("b1", 3, None);
        assert_eq!((same.generation, same.until), (7, 5_000));
        let rebooted = mark.raised("b2", 9, Some(100));
        assert_eq!(rebooted.boot, "b2");
        assert_eq!((rebooted.generation, rebooted.until), (9, 100));
        assert_eq!(Mark::parse("garbage"), None);
    }

    #[test]
    fn the_mark_is_kept_in_its_file() {
        let dir = std::env::temp_dir().join(format!(
            "tenure-horizon-{}-{:x}",
            std::process::id(),
            rand::random::<u64>()
        ));
        std::fs::create_dir_all(&dir).expect("a directory");
        let horizon = Horizon::within(&dir, Duration::from_secs(5));
        assert_eq!(horizon.read().ok().flatten(), None);
        horizon.raise("b", 2, Some(900)).expect("raised");
        horizon.raise("b", 1, None).expect("raised");
        let mark = horizon.read().ok().flatten().expect("a mark");
        assert_eq!((mark.generation, mark.until), (2, 900));
        // Garbage that is not even UTF-8 is no mark, written over.
        std::fs::write(dir.join("horizon"), [0xff, 0xfe, b'x', 0x80]).expect("garbage");
        assert_eq!(horizon.read().ok().flatten(), None);
        horizon.raise("b", 3, None).expect("raised over garbage");
        assert_eq!(horizon.read().ok().flatten().map(|m| m.generation), Some(3));
        // A holder of the mark's lock stopped (SIGSTOP) costs a failed
        // call, not a stall.
        let impatient = Horizon::within(&dir, Duration::from_millis(50));
        let stopped = File::open(dir.join("horizon")).expect("the mark's file");
        flock(&stopped, FlockOperation::LockExclusive).expect("locked");
        assert!(impatient.read().is_err());
        assert!(impatient.raise("b", 9, None).is_err());
        drop(stopped);
        // A lock directory deleted is made again.
        std::fs::remove_dir_all(&dir).expect("deleted");
        assert_eq!(horizon.read().ok().flatten(), None);
        horizon
            .raise("b", 4, Some(1))
            .expect("raised in a new directory");
        assert_eq!(horizon.read().ok().flatten().map(|m| m.generation), Some(4));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
