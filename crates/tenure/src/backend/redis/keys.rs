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
        let at = Address::new(prefix, name);
        Keys {
            lease: Keys::lease_of(at),
            witness: Keys::witness_of(at),
            token: key(at, "token"),
            events: Keys::events_of(at),
            epoch: key(at, "epoch"),
            last_run: key(at, "last-run"),
            probe: key(at, "probe"),
            prefix_epoch: Keys::prefix_epoch_of(prefix),
            members: key(at, "members"),
        }
    }

    /// The lease key of the election at `at` alone (renewals need only a
    /// few of the keys, and build only those).
    pub fn lease_of(at: Address<'_>) -> String {
        key(at, "lease")
    }

    /// The witness key of the election at `at` alone.
    pub fn witness_of(at: Address<'_>) -> String {
        key(at, "witness")
    }

    /// The announcement channel of the election at `at` alone.
    pub fn events_of(at: Address<'_>) -> String {
        key(at, "events")
    }

    /// The prefix's epoch key (one server; a cluster has one per slot).
    pub fn prefix_epoch_of(prefix: &str) -> String {
        format!("{prefix}:epoch")
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

/// The key `part` of the election at `at`: `PREFIX:{NAME}:PART`.
fn key(at: Address<'_>, part: &str) -> String {
    format!("{}:{{{}}}:{part}", at.prefix, at.name)
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
        assert_eq!(Keys::events_of(at), keys.events);
        assert_eq!(keys.prefix_epoch, "tenure:epoch");
        assert_eq!(keys.last_run, "tenure:{reports}:last-run");
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
