//! Exit codes of the `tenure` command, and errors that carry one.
//!
//! | code | meaning |
//! |---|---|
//! | 0 | success; or CMD's own status when `tenure run` ends because CMD exited |
//! | 2 | invalid flags or configuration |
//! | 3 | `--once`: leadership was lost while CMD ran; CMD was stopped |
//! | 69 | Redis unusable: unreachable, credentials, TLS, ACL, foreign data |
//! | 70 | internal failure while leading (the guardian died or could not start); CMD was killed, the lease released; `--cgroup require` without a usable cgroup |
//! | 75 | `--no-wait`: another instance leads |
//! | 126/127 | CMD could not be executed / was not found |
//! | 128+N | CMD was ended by signal N |

use std::fmt;

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
