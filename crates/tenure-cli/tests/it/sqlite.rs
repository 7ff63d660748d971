//! `tenure run`, `status` and `demo` end to end on the embedded store, a
//! SQLite file: `--store sqlite:///path/to/file.db`, and the demo's
//! default.

use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};

use crate::consensus;
use crate::support::{
    child_pid, eventually, parent_of, status, tenure_output, tokens, Instance, Scratch,
};

fn db(scratch: &Scratch) -> String {
    format!("sqlite://{}", scratch.path("tenure.db").display())
}

#[test]
fn run_hands_over_on_sigterm_and_after_a_kill_and_status_follows() {
    let scratch = Scratch::new("sqlite-db-run");
    consensus::run_hands_over_on_sigterm_and_after_a_kill_and_status_follows(
        &db(&scratch),
        "sqlite-run",
    );
}

#[test]
fn at_most_every_skips_a_job_that_succeeded_within_the_period_and_retries_a_failed_one() {
    let scratch = Scratch::new("sqlite-db-cron");
    consensus::at_most_every_skips_a_job_that_succeeded_within_the_period_and_retries_a_failed_one(
        &db(&scratch),
    );
}

/// A job that, as it starts, records every earlier job (of any instance)
/// still running in `DIR/overlaps`, then its PID and token.
const CHECKING_JOB: &str = r#"for f in "$DIR"/pid-*; do
  p=$(cat "$f" 2>/dev/null)
  if [ -n "$p" ] && [ -e "/proc/$p" ] && ! grep -q '^State:.*Z' "/proc/$p/status" 2>/dev/null; then
    echo "$ME started while $p ran" >> "$DIR/overlaps"
  fi
done
echo $$ > "$DIR/pid-$ME"; echo "$TENURE_TOKEN" >> "$DIR/tokens-$ME"; exec sleep 1000"#;

/// Whether process `pid` has a file open on which it holds a `flock`
/// (`/proc/PID/fdinfo/*` lists the locks of each open file).
fn holds_a_lock(pid: i32) -> bool {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fdinfo")) else {
        return false;
    };
    fds.flatten().any(|fd| {
        std::fs::read_to_string(fd.path()).is_ok_and(|info| {
            info.lines()
                .any(|l| l.starts_with("lock:") && l.contains("FLOCK"))
        })
    })
}

#[test]
fn a_killed_tenure_is_replaced_before_its_lease_expires_and_only_after_its_command() {
    let scratch = Scratch::new("sqlite-kill9");
    let url = db(&scratch);
    let ttl = ["--ttl", "10s"];
    let a = Instance::start(&url, "kill9", "a", &ttl, CHECKING_JOB, &scratch);
    eventually("a leads", || !tokens(&scratch, "a").is_empty());
    let b = Instance::start(&url, "kill9", "b", &ttl, CHECKING_JOB, &scratch);
    eventually("status shows a", || {
        status(&url) == [("kill9".to_string(), Some("a".to_string()))]
    });
    // a's command's guardian holds a share of a's lock on the election, so
    // that nobody takes over while the command may still run, even once
    // tenure itself is gone.
    let guardian = child_pid(&scratch, "a")
        .and_then(parent_of)
        .expect("a's command has a guardian");
    assert!(
        holds_a_lock(guardian),
        "the guardian holds no lock: {}",
        a.log()
    );
    // tenure alone is killed; its command is left to its guardian.
    let killed_at = Instant::now();
    kill(a.pid(), Signal::SIGKILL).expect("kill a");
    eventually("b leads", || !tokens(&scratch, "b").is_empty());
    let waited = killed_at.elapsed();
    // a's lease had at least ttl - ttl/3 left (a new file's hold-off,
    // one ttl, is over by the time a leads).
    assert!(waited < Duration::from_secs(6), "b waited for the expiry");
    assert_eq!(scratch.read("overlaps"), "", "two commands at once");
    assert!(tokens(&scratch, "b")[0] > tokens(&scratch, "a")[0]);
    drop((a, b));
}

#[test]
fn the_demo_runs_on_a_temporary_sqlite_file_with_no_server() {
    let out = tenure_output(&["demo", "--ttl", "1s"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for expected in [
        "leader election on SQLite",
        "leads after",
        "took over",
        "a crash is seen at once",
        "after the resignation",
        "refuses a late write",
        "the temporary file was removed",
    ] {
        assert!(
            stdout.contains(expected),
            "demo output lacks {expected:?}:\n{stdout}"
        );
    }
    let dir = stdout
        .lines()
        .find_map(|line| line.strip_prefix("sqlite: a temporary file, "))
        .and_then(|rest| rest.split(" (").next())
        .and_then(|file| std::path::Path::new(file).parent().map(|d| d.to_path_buf()))
        .expect("the demo names its file");
    assert!(!dir.exists(), "{} was left behind", dir.display());
}

#[test]
fn five_instances_with_three_slots_run_three_commands() {
    let scratch = Scratch::new("sqlite-db-slots");
    crate::slots::five_instances_with_three_slots_run_three_commands_on(
        &db(&scratch),
        "sqlite-slots",
    );
}
