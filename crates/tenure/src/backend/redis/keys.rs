//! The Redis key layout of an election: what an [`Address`] is on Redis.
//!
//! The layout itself, every key and channel with its type and contents, is
//! documented once, in the book's *Keys* page (`docs/src/key-layout.md`);
//! this module builds the names.
//!
//! `{NAME}` is a Redis Cluster hash tag: every key of one election lives in
//! one slot, so each script touches a single node. Names may not contain
//! braces (they would change the tag), white space or control characters.

use crate::backend::address::Address;

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
    /// Every key of the election (or group) at `at`.
    pub fn of(at: Address<'_>) -> Self {
        Keys::new(at.prefix, at.name)
    }

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

    /// The lease key of the election at `at` alone (renewals of many
    /// partitions need only it and the witness).
    pub fn lease_of(at: Address<'_>) -> String {
        format!("{}:{{{}}}:lease", at.prefix, at.name)
    }

    /// The witness key of the election at `at` alone.
    pub fn witness_of(at: Address<'_>) -> String {
        format!("{}:{{{}}}:witness", at.prefix, at.name)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_keys_share_the_hash_tag() {
        let keys = Keys::new("tenure", "reports");
        assert_eq!(keys.lease, "tenure:{reports}:lease");
        assert_eq!(keys.token, "tenure:{reports}:token");
        assert_eq!(keys.events, "tenure:{reports}:events");
        let at = Address::new("tenure", "reports");
        assert_eq!(Keys::of(at), keys);
        assert_eq!(Keys::lease_of(at), keys.lease);
        assert_eq!(Keys::witness_of(at), keys.witness);
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
}
