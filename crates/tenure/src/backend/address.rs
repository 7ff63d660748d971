//! Where an election lives in a store, in words every backend understands.
//!
//! An [`Address`] is what crosses the seam: the key prefix an application
//! chose and the election's (or partition set's group's) name. Each backend
//! lays it out its own way (Redis keys in `backend/redis/keys.rs`, etcd keys
//! in `backend/etcd/layout.rs`), so nothing above the seam builds a key,
//! and a new backend brings its layout with it.

use crate::{Error, Result};

/// The longest election name (or key prefix) accepted.
pub(crate) const MAX_NAME_LEN: usize = 200;

/// One election (or a partition set's group) in a store: its key prefix
/// and its name, both checked by [`validate_name`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Address<'a> {
    pub prefix: &'a str,
    pub name: &'a str,
}

impl<'a> Address<'a> {
    pub fn new(prefix: &'a str, name: &'a str) -> Self {
        Address { prefix, name }
    }
}

/// Check an election name or key prefix: non-empty, bounded, and free of
/// characters that would break a store's layout (braces are Redis Cluster
/// hash tags; white space and control characters make keys unreadable in
/// every store's tools).
pub(crate) fn validate_name(what: &str, value: &str) -> Result<()> {
    if value.is_empty() {
        return Err(Error::Config(format!("{what} must not be empty")));
    }
    if value.len() > MAX_NAME_LEN {
        return Err(Error::Config(format!(
            "{what} is {} bytes long; at most {MAX_NAME_LEN} are allowed",
            value.len()
        )));
    }
    if let Some(bad) = value
        .chars()
        .find(|c| *c == '{' || *c == '}' || c.is_whitespace() || c.is_control())
    {
        return Err(Error::Config(format!(
            "{what} {value:?} contains {bad:?}; braces, white space and control characters \
             are not allowed"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_break_a_layout_are_rejected() {
        assert!(validate_name("election name", "cron-nightly").is_ok());
        for bad in ["", "a{b", "a}b", "a b", "a\nb"] {
            assert!(validate_name("election name", bad).is_err(), "{bad:?}");
        }
        assert!(validate_name("election name", &"x".repeat(MAX_NAME_LEN + 1)).is_err());
    }
}
