//! Exit codes of the `tenure` command, and errors that carry one. The
//! table is [`TABLE`], which `tenure --help` prints as it is.

use std::fmt;

/// What each exit code means; a contract for scripts and unit files.
pub const TABLE: &str =
    "  0        success; or CMD's own status when `tenure run` ends because CMD exited
  2        invalid flags or configuration
  3        run --once: leadership was lost while CMD ran; CMD was stopped
  69       Redis unusable: unreachable, credentials, TLS, ACL, a read-only replica,
           foreign data; status: some election could not be read (the rest is listed)
  70       internal failure (the guardian died or could not start); CMD was killed,
           the lease released; run --cgroup require without a usable cgroup
  75       run --no-wait: another instance leads; run --wait-timeout: not elected in time
  126/127  CMD could not be executed / was not found
  128+N    CMD was ended by signal N";

pub const OK: i32 = 0;
pub const USAGE: i32 = 2;
pub const LOST: i32 = 3;
pub const UNAVAILABLE: i32 = 69;
pub const INTERNAL: i32 = 70;
pub const SOMEONE_ELSE_LEADS: i32 = 75;

/// An error with the exit code it should end the process with.
#[derive(Debug)]
pub struct Failure {
    pub code: i32,
    pub message: String,
}

impl Failure {
    pub fn new(code: i32, message: impl Into<String>) -> Self {
        Failure {
            code,
            message: message.into(),
        }
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
        Failure::new(code, err.to_string())
    }
}
