//! A cgroup v2 of `tenure run`'s own, to hold CMD's whole tree.
//!
//! Parent links (see the crate root) find every process CMD started as long
//! as a subreaper of ours is alive to hold on to them. A cgroup holds on to
//! them by itself: membership is inherited at fork and cannot be left
//! without write access to a cgroup above, so a process that escapes every
//! parent link is still in it. `cgroup.kill` (Linux 5.14) then SIGKILLs all
//! of them in one step, including processes forked while the kill is under
//! way, which a walk of `/proc` can only chase.
//!
//! **Where it is created.** Below the cgroup `tenure run` itself is in,
//! named `tenure-run-PID-RANDOM`. That needs a writable cgroup v2: root on a host
//! that gives processes the unified hierarchy, or a delegated subtree
//! (systemd's `Delegate=yes`). Under systemd a cgroup that was not delegated
//! belongs to systemd alone, so one that looks like a unit's (`*.service`,
//! `*.scope`) is used only when systemd marked it delegated.
//!
//! **Leftovers.** A `tenure-run-PID-…` whose `tenure run` is gone was left by a
//! tenure killed together with its guardian (nothing of ours could act).
//! Whatever still runs in it outlived its lease, so the next `tenure run`
//! below the same cgroup kills it and removes the cgroup.
//!
//! This module only reads and writes cgroupfs files; moving a process is
//! writing its PID to `cgroup.procs` (see [`Cgroup::enter`]).

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The name prefix of the cgroups `tenure run` creates.
const PREFIX: &str = "tenure-run-";

/// How long the removal of a leftover waits for its processes to die.
const LEFTOVER_WAIT: Duration = Duration::from_secs(2);

/// A cgroup v2 directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cgroup {
    dir: PathBuf,
}

/// What [`Cgroup::create`] found and did besides creating the cgroup.
#[derive(Debug, Default)]
pub struct Created {
    /// Leftover cgroups of dead `tenure run`s that still held processes,
    /// with how many: they were killed.
    pub killed_leftovers: Vec<(PathBuf, usize)>,
}

impl Cgroup {
    /// Create `tenure-run-PID-RANDOM` (PID: this process) below this process's own
    /// cgroup v2, after removing leftovers of dead `tenure run`s there.
    ///
    /// # Errors
    /// Why no usable cgroup could be made, as one line: no cgroup v2, not
    /// writable, not delegated by systemd, a kernel without `cgroup.kill`.
    pub fn create() -> Result<(Cgroup, Created), String> {
        let parent = dir_of("self")?;
        check_delegated(&parent)?;
        // Moving a process between two cgroups needs write access to the
        // cgroup.procs of their common ancestor: the parent.
        let procs = parent.join("cgroup.procs");
        if fs::OpenOptions::new().write(true).open(&procs).is_err() {
            return Err(format!(
                "{} is not writable (delegate the cgroup to tenure, e.g. systemd's Delegate=yes)",
                procs.display()
            ));
        }
        let mut created = Created::default();
        let mine = std::process::id();
        for (dir, pid) in leftovers(&parent) {
            // A run whose PID is alive here is left alone, this process's
            // own PID included: it may be a run in another PID namespace
            // (two containers' PID 1 under one parent cgroup). The random
            // part of the name keeps such runs' cgroups apart.
            if alive(pid) {
                continue;
            }
            let leftover = Cgroup { dir };
            if let (killed @ 1.., _) = leftover.kill_and_remove(LEFTOVER_WAIT) {
                created.killed_leftovers.push((leftover.dir, killed));
            }
        }
        let dir = parent.join(format!("{PREFIX}{mine}-{:08x}", random_u32()));
        if let Err(err) = fs::create_dir(&dir) {
            return Err(format!("cannot create {}: {err}", dir.display()));
        }
        let cgroup = Cgroup { dir };
        if !cgroup.dir.join("cgroup.kill").exists() {
            let _ = cgroup.remove();
            return Err("this kernel has no cgroup.kill (Linux 5.14 or later has)".into());
        }
        Ok((cgroup, created))
    }

    /// The cgroup v2 directory process `pid` is in.
    ///
    /// # Errors
    /// Why it cannot be told, as one line (no such process, no cgroup v2).
    pub fn of_process(pid: i32) -> Result<PathBuf, String> {
        dir_of(&pid.to_string())
    }

    /// The cgroup at `dir` (made by [`Cgroup::create`] in another process).
    pub fn at(dir: impl Into<PathBuf>) -> Cgroup {
        Cgroup { dir: dir.into() }
    }

    /// Its directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Move the calling process (all its threads) into this cgroup. Its
    /// children started from now on are born in it.
    ///
    /// # Errors
    /// The write to `cgroup.procs` failed (permissions, the cgroup is gone).
    pub fn enter(&self) -> std::io::Result<()> {
        write_pid(&self.dir, std::process::id())
    }

    /// Move the calling process back to the parent cgroup, the one
    /// [`Cgroup::create`] made this one in.
    ///
    /// # Errors
    /// The write to the parent's `cgroup.procs` failed.
    pub fn leave(&self) -> std::io::Result<()> {
        let parent = self
            .dir
            .parent()
            .ok_or_else(|| std::io::Error::other("a cgroup without a parent"))?;
        write_pid(parent, std::process::id())
    }

    /// SIGKILL every process in this cgroup and below it, in one step.
    ///
    /// # Errors
    /// The write to `cgroup.kill` failed.
    pub fn kill(&self) -> std::io::Result<()> {
        fs::OpenOptions::new()
            .write(true)
            .open(self.dir.join("cgroup.kill"))?
            .write_all(b"1")
    }

    /// Whether any process runs in this cgroup or below it. Exited
    /// processes leave their cgroup at once, before they are reaped. A
    /// cgroup that cannot be read (removed) holds nothing.
    pub fn populated(&self) -> bool {
        fs::read_to_string(self.dir.join("cgroup.events"))
            .map(|events| events.lines().any(|line| line == "populated 1"))
            .unwrap_or(false)
    }

    /// The processes in this cgroup itself (not in cgroups below it).
    pub fn pids(&self) -> Vec<i32> {
        fs::read_to_string(self.dir.join("cgroup.procs"))
            .map(|procs| procs.lines().filter_map(|l| l.parse().ok()).collect())
            .unwrap_or_default()
    }

    /// SIGKILL whatever runs in this cgroup, wait up to `wait` for it to be
    /// gone, and remove the cgroup. Returns how many processes were in it
    /// (the cgroup itself, not those below), and the outcome of the removal.
    pub fn kill_and_remove(&self, wait: Duration) -> (usize, std::io::Result<()>) {
        let mut killed = 0;
        if self.populated() {
            killed = self.pids().len();
            let _ = self.kill();
            let start = Instant::now();
            while self.populated() && start.elapsed() < wait {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        (killed, self.remove())
    }

    /// Remove this cgroup and any empty cgroups below it (a command may have
    /// made some).
    ///
    /// # Errors
    /// A cgroup still held processes, or could not be removed.
    pub fn remove(&self) -> std::io::Result<()> {
        remove_tree(&self.dir)
    }
}

fn write_pid(dir: &Path, pid: u32) -> std::io::Result<()> {
    fs::OpenOptions::new()
        .write(true)
        .open(dir.join("cgroup.procs"))?
        .write_all(pid.to_string().as_bytes())
}

fn remove_tree(dir: &Path) -> std::io::Result<()> {
    // Only directories below a cgroup are cgroups; its files cannot be
    // removed and go with it.
    if let Ok(entries) = fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                remove_tree(&entry.path())?;
            }
        }
    }
    fs::remove_dir(dir)
}

/// Bits that differ between processes started in the same instant (no
/// cryptographic quality needed: they only keep names apart).
fn random_u32() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u32(std::process::id());
    hasher.finish() as u32
}

/// `tenure-run-PID-RANDOM` cgroups directly below `parent`.
fn leftovers(parent: &Path) -> Vec<(PathBuf, u32)> {
    let Ok(entries) = fs::read_dir(parent) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name();
            let rest = name.to_str()?.strip_prefix(PREFIX)?;
            let pid = rest.split('-').next()?.parse().ok()?;
            Some((entry.path(), pid))
        })
        .collect()
}

/// Whether a process with this PID runs (any process: a reused PID keeps a
/// leftover alive, which errs on the side of leaving others' processes be).
/// A zombie does not: it is a tenure that died and was not reaped yet.
fn alive(pid: u32) -> bool {
    i32::try_from(pid).is_ok_and(crate::running)
}

/// A process's cgroup v2 directory, from `/proc/PROCESS/cgroup` (the path)
/// and `/proc/PROCESS/mountinfo` (where the hierarchy is mounted).
fn dir_of(process: &str) -> Result<PathBuf, String> {
    let read = |file: &str| {
        let path = format!("/proc/{process}/{file}");
        fs::read_to_string(&path).map_err(|err| format!("cannot read {path}: {err}"))
    };
    own_dir_from(&read("cgroup")?, &read("mountinfo")?)
}

fn own_dir_from(cgroups: &str, mountinfo: &str) -> Result<PathBuf, String> {
    let path = cgroups
        .lines()
        .find_map(|line| line.strip_prefix("0::"))
        .ok_or("this process is in no cgroup v2 (the unified hierarchy is not in use)")?;
    for line in mountinfo.lines() {
        // ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER
        let Some((fields, fs_fields)) = line.split_once(" - ") else {
            continue;
        };
        if fs_fields.split(' ').next() != Some("cgroup2") {
            continue;
        }
        let fields: Vec<&str> = fields.split(' ').collect();
        let (Some(root), Some(mount_point)) = (fields.get(3), fields.get(4)) else {
            continue;
        };
        let (root, mount_point) = (unescape(root), unescape(mount_point));
        // The mount shows the hierarchy from `root` down; our path must be
        // at or below it.
        let Some(below) = path.strip_prefix(root.trim_end_matches('/')) else {
            continue;
        };
        if !(below.is_empty() || below.starts_with('/')) {
            continue;
        }
        return Ok(Path::new(&mount_point).join(below.trim_start_matches('/')));
    }
    Err("no cgroup v2 file system is mounted where this process can see its cgroup".into())
}

/// mountinfo writes space, tab, newline and backslash as octal escapes.
fn unescape(field: &str) -> String {
    field
        .replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

/// A cgroup systemd made for a unit belongs to systemd unless the unit
/// delegated it (`Delegate=yes`), which systemd marks with an extended
/// attribute (`trusted.delegate`, or `user.delegate` for a user manager).
fn check_delegated(dir: &Path) -> Result<(), String> {
    let Some(name) = dir.file_name().and_then(|n| n.to_str()) else {
        return Ok(());
    };
    if !(name.ends_with(".service") || name.ends_with(".scope")) {
        return Ok(());
    }
    let marked = ["trusted.delegate", "user.delegate"]
        .iter()
        .any(|attr| matches!(xattr::get(dir, attr), Ok(Some(value)) if value == b"1"));
    if marked {
        Ok(())
    } else {
        Err(format!(
            "{} is a systemd unit's cgroup that was not delegated (set Delegate=yes in the unit)",
            dir.display()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &str = "\
25 30 0:22 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
26 25 0:23 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
27 25 0:24 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
";

    #[test]
    fn the_own_cgroup_is_found_below_the_v2_mount() {
        assert_eq!(
            own_dir_from("4:memory:/x\n0::/system.slice/a.service\n", HYBRID),
            Ok(PathBuf::from(
                "/sys/fs/cgroup/unified/system.slice/a.service"
            ))
        );
        assert_eq!(
            own_dir_from("0::/\n", HYBRID),
            Ok(PathBuf::from("/sys/fs/cgroup/unified"))
        );
    }

    #[test]
    fn a_mount_of_a_subtree_is_used_only_for_paths_below_it() {
        let mountinfo = "30 1 0:26 /kubepods/pod1 /sys/fs/cgroup ro - cgroup2 cgroup2 rw\n";
        assert_eq!(
            own_dir_from("0::/kubepods/pod1/c1\n", mountinfo),
            Ok(PathBuf::from("/sys/fs/cgroup/c1"))
        );
        assert!(own_dir_from("0::/kubepods/pod10\n", mountinfo).is_err());
    }

    #[test]
    fn without_a_v2_hierarchy_there_is_no_cgroup() {
        assert!(own_dir_from("4:memory:/x\n", HYBRID).is_err());
        assert!(own_dir_from("0::/\n", "25 30 0:22 / /x rw - tmpfs tmpfs rw\n").is_err());
    }

    #[test]
    fn escaped_mount_points_are_read_back() {
        let mountinfo = "26 25 0:23 / /mnt/c\\040g rw - cgroup2 cgroup2 rw\n";
        assert_eq!(
            own_dir_from("0::/a\n", mountinfo),
            Ok(PathBuf::from("/mnt/c g/a"))
        );
    }
}
