//! The Redis key layout of an election.
//!
//! The layout itself, every key and channel with its type and contents, is
//! documented once, in the book's *Keys* page (`docs/src/key-layout.md`);
//! this module builds the names.
//!
//! `{NAME}` is a Redis Cluster hash tag: every key of one election lives in
//! one slot, so each script touches a single node. Names may not contain
//! braces (they would change the tag), white space or control characters.

use crate::{Error, Result};

/// The longest election name accepted.
pub(crate) const MAX_NAME_LEN: usize = 200;

/// The keys and channel of one election.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Keys {
    pub lease: String,
    pub witness: String,
    pub token: String,
    pub events: String,
    pub epoch: String,
    pub last_run: String,
    pub probe: String,
    pub prefix_epoch: String,
    /// For a partition set named `NAME`: its member set.
    pub members: String,
}

impl Keys {
    pub fn new(prefix: &str, name: &str) -> Self {
        Keys {
            lease: format!("{prefix}:{{{name}}}:lease"),
            witness: format!("{prefix}:{{{name}}}:witness"),
            token: format!("{prefix}:{{{name}}}:token"),
            events: format!("{prefix}:{{{name}}}:events"),
            epoch: format!("{prefix}:{{{name}}}:epoch"),
            last_run: format!("{prefix}:{{{name}}}:last-run"),
            probe: format!("{prefix}:{{{name}}}:probe"),
            prefix_epoch: format!("{prefix}:epoch"),
            members: format!("{prefix}:{{{name}}}:members"),
        }
    }

    /// The witness key beside a lease key (`PREFIX:{NAME}:lease`).
    pub fn witness_of_lease(lease: &str) -> String {
        let stem = lease.strip_suffix(":lease").unwrap_or(lease);
        format!("{stem}:witness")
    }

    /// The pattern matching every lease under a prefix, for `status`.
    pub fn lease_pattern(prefix: &str) -> String {
        format!("{prefix}:{{*}}:lease")
    }

    /// The election name in a lease key under `prefix`, if it is one.
    pub fn name_of_lease(prefix: &str, key: &str) -> Option<String> {
        let rest = key.strip_prefix(prefix)?.strip_prefix(":{")?;
        let name = rest.strip_suffix("}:lease")?;
        Some(name.to_string())
    }
}

/// Check an election name or key prefix: non-empty, bounded, and free of
/// characters that would break the key layout.
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
    fn all_keys_share_the_hash_tag() {
        let keys = Keys::new("tenure", "reports");
        assert_eq!(keys.lease, "tenure:{reports}:lease");
        assert_eq!(keys.token, "tenure:{reports}:token");
        assert_eq!(keys.events, "tenure:{reports}:events");
    }

    #[test]
    fn lease_keys_map_back_to_names() {
        assert_eq!(
            Keys::name_of_lease("tenure", "tenure:{a:b}:lease").as_deref(),
            Some("a:b")
        );
        assert_eq!(Keys::name_of_lease("tenure", "other:{a}:lease"), None);
        assert_eq!(Keys::name_of_lease("tenure", "tenure:{a}:token"), None);
    }

    #[test]
    fn names_that_break_the_layout_are_rejected() {
        assert!(validate_name("election name", "cron-nightly").is_ok());
        for bad in ["", "a{b", "a}b", "a b", "a\nb"] {
            assert!(validate_name("election name", bad).is_err(), "{bad:?}");
        }
        assert!(validate_name("election name", &"x".repeat(MAX_NAME_LEN + 1)).is_err());
    }
}
