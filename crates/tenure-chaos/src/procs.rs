//! The processes on this host, read from Linux's /proc: what the harness
//! needs to find the command groups below `tenure run` and to check that a
//! run left nothing behind.

/// One process, from `/proc/PID/stat`.
pub struct Proc {
    pub pid: i32,
    pub ppid: i32,
    pub pgrp: i32,
    pub zombie: bool,
}

/// Every process that could be read (they come and go while we look).
pub fn all() -> Vec<Proc> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            // Fields after the parenthesised command name: state ppid pgrp ...
            let (_, rest) = stat.rsplit_once(')')?;
            let fields: Vec<&str> = rest.split_whitespace().collect();
            Some(Proc {
                pid,
                zombie: *fields.first()? == "Z",
                ppid: fields.get(1)?.parse().ok()?,
                pgrp: fields.get(2)?.parse().ok()?,
            })
        })
        .collect()
}

/// A process's command line, arguments separated by spaces.
pub fn cmdline(pid: i32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/cmdline"))
        .unwrap_or_default()
        .replace('\0', " ")
        .trim()
        .to_string()
}
