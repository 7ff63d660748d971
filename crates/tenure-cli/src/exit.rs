//! Exit codes of the `tenure` command, and errors that carry one. The
//! table is [`TABLE`], which `tenure --help` prints as it is.

use std::fmt;

/// What each exit code means; a contract for scripts and unit files.
pub const TABLE: &str =
    "  0        success; or CMD's own status when `tenure run` ends because CMD exited
  1        demo: the demonstration failed; the async runtime could not start
  2        invalid flags or configuration
  3        run --once: leadership was lost while CMD ran; CMD was stopped
  69       the store unusable: unreachable or not answering, not the store the URL
           names, credentials, TLS, ACL, a read-only replica, foreign data;
           status: some election could not be read (the rest is listed)
  70       internal failure (the guardian died or could not start); CMD was killed,
           the lease released; run --cgroup require without a usable cgroup;
           serve: an election's task failed
  74       a write to stdout failed (a full disk)
  75       run --no-wait: another instance leads; run --wait-timeout: not elected in time
  126/127  CMD could not be executed / was not found
  128+N    CMD was ended by signal N";

pub const OK: i32 = 0;
pub const USAGE: i32 = 2;
pub const LOST: i32 = 3;
pub const UNAVAILABLE: i32 = 69;
pub const INTERNAL: i32 = 70;
pub const CANNOT_WRITE: i32 = 74;
pub const SOMEONE_ELSE_LEADS: i32 = 75;

/// An error with the exit code it should end the process with.
#[derive(Debug)]
pub struct Failure {
    pub code: i32,
    pub message: String,
    /// The store did not answer in time: the library's error names no
    /// address, so [`Failure::naming_store`] adds it.
    timed_out: bool,
}

impl Failure {
    pub fn new(code: i32, message: impl Into<String>) -> Self {
        Failure {
            code,
            message: message.into(),
            timed_out: false,
        }
    }

    /// The failure, naming `url` (already redacted) if it is a store's
    /// timeout: every other store error names its address itself.
    pub fn naming_store(mut self, url: Option<&str>) -> Self {
        if let (true, Some(url)) = (self.timed_out, url) {
            self.message = format!(
                "{} (from {url}; is that the store's address?)",
                self.message
            );
        }
        self
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl From<tenure::Error> for Failure {
    fn from(err: tenure::Error) -> Self {
        let code = match err {
            tenure::Error::Config(_) => USAGE,
            _ => UNAVAILABLE,
        };
        let mut failure = Failure::new(code, err.to_string());
        failure.timed_out = matches!(err, tenure::Error::Timeout(_));
        failure
    }
}
