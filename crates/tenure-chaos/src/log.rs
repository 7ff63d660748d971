//! The event log: one JSON object per line, one file per process, all
//! timestamps from CLOCK_MONOTONIC (system-wide on one host, so the logs of
//! every process line up without clock synchronisation).

use std::io::Write;
use std::path::Path;

use serde::{Deserialize, Serialize};

/// Nanoseconds of CLOCK_MONOTONIC.
pub fn now_ns() -> u64 {
    match nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC) {
        Ok(ts) => ts.tv_sec() as u64 * 1_000_000_000 + ts.tv_nsec() as u64,
        // CLOCK_MONOTONIC exists on every Linux; a zero stamp would show up
        // in the checker as an obviously broken log.
        Err(_) => 0,
    }
}

/// Convert a tokio deadline to CLOCK_MONOTONIC nanoseconds.
pub fn deadline_ns(deadline: tokio::time::Instant) -> u64 {
    let now = tokio::time::Instant::now();
    let now_ns = now_ns();
    if deadline >= now {
        now_ns + (deadline - now).as_nanos() as u64
    } else {
        now_ns.saturating_sub((now - deadline).as_nanos() as u64)
    }
}

/// Everything that happens in a run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "ev", rename_all = "snake_case")]
pub enum Event {
    /// An instance process started (or was respawned).
    Start { inst: String, t: u64 },
    /// An instance won a term.
    Elected { inst: String, token: u64, t: u64 },
    /// An instance's term ended.
    Lost {
        inst: String,
        token: u64,
        t: u64,
        reason: String,
    },
    /// A fenced write attempt: `t` when the instance decided to act, `until`
    /// the deadline it relied on (`t` itself when it knows none), `ok`
    /// whether the resource accepted it.
    Write {
        inst: String,
        token: u64,
        t: u64,
        until: u64,
        ok: bool,
    },
    /// A fault injected by the harness (`target` empty for Redis-wide faults).
    /// `store_down`: whether the election's store could not serve from `t`
    /// to `until`, written by faults that decide it case by case (on etcd a
    /// killed raft leader stops the store, a killed follower does not) or
    /// whose kind alone does not say it (`delete-lease`: the wait for a
    /// lease that vanished is by design; `kill-shard-primary`: another
    /// shard's failover excuses no gap); absent, the checker decides by
    /// kind.
    Fault {
        kind: String,
        target: String,
        t: u64,
        until: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        store_down: Option<bool>,
    },
    /// An instance process ended: `how` is `exit:N`, `signal:N`, or `killed`
    /// (by the harness).
    Exit { inst: String, t: u64, how: String },
}

impl Event {
    pub fn t(&self) -> u64 {
        match self {
            Event::Start { t, .. }
            | Event::Elected { t, .. }
            | Event::Lost { t, .. }
            | Event::Write { t, .. }
            | Event::Fault { t, .. }
            | Event::Exit { t, .. } => *t,
        }
    }
}

/// Appends events to a file, one `write` per line so a SIGKILL loses at
/// most the line being written.
///
/// A write that fails (a full disk) is kept: the log is then incomplete
/// evidence, and a verdict from it could be a false SAFE. Every writer asks
/// [`EventLog::healthy`] before going on and fails the run if not.
pub struct EventLog {
    path: std::path::PathBuf,
    file: std::fs::File,
    failed: Option<String>,
}

impl EventLog {
    pub fn create(path: &Path) -> std::io::Result<Self> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        Ok(EventLog {
            path: path.to_path_buf(),
            file,
            failed: None,
        })
    }

    /// Append `event`; a failure is kept for [`EventLog::healthy`].
    pub fn record(&mut self, event: &Event) {
        if self.failed.is_some() {
            return;
        }
        let written = serde_json::to_vec(event)
            .map_err(|e| e.to_string())
            .and_then(|mut line| {
                line.push(b'\n');
                self.file.write_all(&line).map_err(|e| e.to_string())
            });
        if let Err(err) = written {
            self.failed = Some(format!(
                "cannot write the event log {}: {err}",
                self.path.display()
            ));
        }
    }

    /// Whether every event so far was written.
    pub fn healthy(&self) -> Result<(), String> {
        match &self.failed {
            None => Ok(()),
            Some(failure) => Err(failure.clone()),
        }
    }
}

/// Read every `*.jsonl` file in `dir`, sorted by time. Lines that do not
/// parse (a torn last line after SIGKILL) are counted, not fatal.
pub fn read_dir(dir: &Path) -> std::io::Result<(Vec<Event>, usize)> {
    let mut events = Vec::new();
    let mut torn = 0;
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.extension().and_then(|e| e.to_str()) != Some("jsonl") {
            continue;
        }
        for line in std::fs::read_to_string(&path)?.lines() {
            match serde_json::from_str::<Event>(line) {
                Ok(event) => events.push(event),
                Err(_) if line.trim().is_empty() => {}
                Err(_) => torn += 1,
            }
        }
    }
    events.sort_by_key(Event::t);
    Ok((events, torn))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_on_a_full_disk_is_not_healthy() {
        let mut log = EventLog::create(Path::new("/dev/full")).expect("/dev/full opens");
        assert!(log.healthy().is_ok());
        log.record(&Event::Start {
            inst: "a".into(),
            t: 1,
        });
        let failure = log.healthy().expect_err("the write failed");
        assert!(failure.contains("/dev/full"), "{failure}");
    }
}
