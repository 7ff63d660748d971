//! The etcd key layout of an election: what an [`Address`] is on etcd.
//!
//! Election `NAME` under prefix `PREFIX` is the key `PREFIX/NAME`; the
//! election's other keys live under `PREFIX/{NAME}/` (braces cannot occur
//! in names, so no other election's key is ever listed with them). The
//! book's *Keys* page documents every key and its contents.

use crate::backend::address::Address;
use crate::{Error, Result};

/// The prefix of `at`, checked: `PREFIX/NAME` must split one way only, and
/// names may contain '/', so prefixes may not.
fn prefix_of(at: Address<'_>) -> Result<&str> {
    if at.prefix.contains('/') {
        return Err(Error::Config(format!(
            "key prefix {:?} contains '/', which etcd keys use to separate the prefix \
             from the election name",
            at.prefix
        )));
    }
    Ok(at.prefix)
}

/// The election's key, `PREFIX/NAME`: it holds the lease.
pub(crate) fn lease_key(at: Address<'_>) -> Result<String> {
    Ok(format!("{}/{}", prefix_of(at)?, at.name))
}

/// The election's token counter: `PREFIX/{NAME}/token`.
pub(super) fn counter_key(at: Address<'_>) -> Result<String> {
    Ok(format!("{}/{{{}}}/token", prefix_of(at)?, at.name))
}

/// The election's witness: `PREFIX/{NAME}/witness`.
pub(super) fn witness_key(at: Address<'_>) -> Result<String> {
    Ok(format!("{}/{{{}}}/witness", prefix_of(at)?, at.name))
}

/// The election's last-run marker: `PREFIX/{NAME}/last-run`.
pub(super) fn last_run_key(at: Address<'_>) -> Result<String> {
    Ok(format!("{}/{{{}}}/last-run", prefix_of(at)?, at.name))
}

/// Where a partition set's members are: `PREFIX/{GROUP}/members/`.
pub(super) fn members_prefix(group: Address<'_>) -> Result<String> {
    Ok(format!("{}/{{{}}}/members/", prefix_of(group)?, group.name))
}

/// `PREFIX/{NAME}` of an election's key `PREFIX/NAME`: where its witness
/// and last-run marker are. Prefixes contain no '/'.
pub(super) fn key_dir(key: &str) -> String {
    match key.split_once('/') {
        Some((prefix, name)) => format!("{prefix}/{{{name}}}"),
        None => key.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_with_a_slash_is_refused_as_ambiguous() {
        let err = lease_key(Address::new("a/b", "c")).expect_err("refused");
        assert!(matches!(err, Error::Config(_)), "{err}");
        assert_eq!(lease_key(Address::new("a", "b/c")).expect("fine"), "a/b/c");
    }

    #[test]
    fn keys_follow_the_documented_layout() {
        let at = Address::new("tenure", "reports/daily");
        let key = lease_key(at).expect("layout");
        assert_eq!(key, "tenure/reports/daily");
        assert_eq!(
            members_prefix(at).expect("layout"),
            "tenure/{reports/daily}/members/"
        );
        assert_eq!(
            last_run_key(at).expect("layout"),
            "tenure/{reports/daily}/last-run"
        );
        assert_eq!(
            witness_key(at).expect("layout"),
            "tenure/{reports/daily}/witness"
        );
        assert_eq!(
            counter_key(at).expect("layout"),
            "tenure/{reports/daily}/token"
        );
        assert_eq!(key_dir(&key), "tenure/{reports/daily}");
    }
}
