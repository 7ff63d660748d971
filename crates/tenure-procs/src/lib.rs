//! The processes on this host as Linux's `/proc` shows them.
//!
//! `tenure run` must find everything its command started, including
//! processes that left the command's process group (`setsid`, a double
//! fork): the only record that survives such an escape is the parent link,
//! which a child subreaper keeps pointing at itself. The chaos harness uses
//! the same reader to find the command groups below `tenure run` and to
//! check that a run left nothing behind. One reader serves both, so "what
//! counts as a descendant" means the same thing in the product and in the
//! checks of it.
//!
//! `/proc` is a snapshot that is stale the moment it is read: processes come
//! and go while we look. Callers that must leave nothing behind read it
//! again until what they look for is gone.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod cgroup;

/// One process, from `/proc/PID/stat`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Proc {
    /// Process id.
    pub pid: i32,
    /// Parent's process id.
    pub ppid: i32,
    /// Process group id.
    pub pgrp: i32,
    /// Exited but not yet reaped: it runs no more code.
    pub zombie: bool,
}

/// Every process that could be read.
pub fn all() -> Vec<Proc> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(read)
        .collect()
}

/// One process, if it exists.
pub fn read(pid: i32) -> Option<Proc> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the parenthesised command name (which may itself
    // contain parentheses and spaces): state ppid pgrp ...
    let (_, rest) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    Some(Proc {
        pid,
        zombie: *fields.first()? == "Z",
        ppid: fields.get(1)?.parse().ok()?,
        pgrp: fields.get(2)?.parse().ok()?,
    })
}

/// Whether `pid` exists and is not a zombie.
pub fn running(pid: i32) -> bool {
    read(pid).is_some_and(|p| !p.zombie)
}

/// Every descendant of `root` in `procs` (children, their children, ...),
/// parents before their children; `root` itself is not included.
pub fn descendants(procs: &[Proc], root: i32) -> Vec<Proc> {
    let mut found: Vec<Proc> = Vec::new();
    let mut parents = vec![root];
    while let Some(parent) = parents.pop() {
        for p in procs.iter().filter(|p| p.ppid == parent) {
            // A PID seen twice would mean a cycle in a torn snapshot.
            if p.pid != root && !found.iter().any(|f| f.pid == p.pid) {
                found.push(*p);
                parents.push(p.pid);
            }
        }
    }
    found
}

/// A process's command line, arguments separated by spaces.
pub fn cmdline(pid: i32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/cmdline"))
        .unwrap_or_default()
        .replace('\0', " ")
        .trim()
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(pid: i32, ppid: i32) -> Proc {
        Proc {
            pid,
            ppid,
            pgrp: pid,
            zombie: false,
        }
    }

    #[test]
    fn descendants_are_the_whole_subtree_and_nothing_else() {
        let procs = [p(1, 0), p(10, 1), p(11, 10), p(12, 11), p(13, 10), p(20, 1)];
        let mut found: Vec<i32> = descendants(&procs, 10).iter().map(|p| p.pid).collect();
        found.sort();
        assert_eq!(found, [11, 12, 13]);
    }

    #[test]
    fn this_process_is_read_and_running() {
        let me = read(std::process::id() as i32).expect("own /proc entry");
        assert!(!me.zombie);
        assert!(running(me.pid));
        assert!(descendants(&all(), me.ppid).iter().any(|p| p.pid == me.pid));
    }
}
