//! Where an election's znodes are (the book's *Keys* page, ZooKeeper).
//!
//! Election `NAME` under prefix `PREFIX` (and the URL's chroot) is the
//! ephemeral znode `/PREFIX/NAME`, there only while a term holds it. Beside
//! it, the persistent znode `/PREFIX/{NAME}` keeps the token counter as its
//! data and, as children, the witness `w-TOKEN` of the term holding the
//! lease (ephemeral), the last-run marker `last-run` and the clock znode
//! `now` that ages it; a partition set `GROUP` keeps its members under
//! `/PREFIX/{GROUP}/members/ID`. Names cannot contain braces, so none of
//! these clashes with an election's znode or is listed as one. A `/` or
//! `%` in a name is written `%2F` or `%25` (a znode name is one path
//! component), and so are the names `.` and `..`.

use crate::backend::address::Address;
use crate::{Error, Result};

/// One path component for `name`.
pub(super) fn component(name: &str) -> String {
    match name {
        "." => "%2E".to_string(),
        ".." => "%2E%2E".to_string(),
        _ => name.replace('%', "%25").replace('/', "%2F"),
    }
}

/// The name a component of [`component`] stands for.
pub(super) fn name_of(component: &str) -> String {
    let mut out = String::with_capacity(component.len());
    let mut rest = component;
    while let Some(at) = rest.find('%') {
        out.push_str(&rest[..at]);
        let code = rest.get(at + 1..at + 3);
        match code {
            Some("25") => out.push('%'),
            Some("2F") => out.push('/'),
            Some("2E") => out.push('.'),
            _ => {
                out.push('%');
                rest = &rest[at + 1..];
                continue;
            }
        }
        rest = &rest[at + 3..];
    }
    out.push_str(rest);
    out
}

/// The paths of one election (or group).
#[derive(Debug, Clone)]
pub(super) struct Paths {
    /// `/PREFIX` (under the chroot).
    pub root: String,
    /// The lease: `/PREFIX/NAME`.
    pub lease: String,
    /// `/PREFIX/{NAME}`: the token counter, the witness, the marker.
    pub dir: String,
}

impl Paths {
    pub fn of(chroot: &str, at: Address<'_>) -> Result<Paths> {
        if at.prefix.contains('/') || at.prefix == "." || at.prefix == ".." {
            return Err(Error::Config(format!(
                "key prefix {:?} is not one ZooKeeper path component (no '/', not '.' or '..'); \
                 put a common path in the URL's chroot instead (zk://HOST:PORT/CHROOT)",
                at.prefix
            )));
        }
        let root = format!("{chroot}/{}", at.prefix);
        let name = component(at.name);
        Ok(Paths {
            lease: format!("{root}/{name}"),
            dir: format!("{root}/{{{name}}}"),
            root,
        })
    }

    /// The witness of the term `token`.
    pub fn witness(&self, token: u64) -> String {
        format!("{}/w-{token}", self.dir)
    }

    pub fn last_run(&self) -> String {
        format!("{}/last-run", self.dir)
    }

    /// The znode whose writes read the ensemble's clock.
    pub fn now(&self) -> String {
        format!("{}/now", self.dir)
    }

    pub fn members(&self) -> String {
        format!("{}/members", self.dir)
    }

    pub fn member(&self, id: &str) -> String {
        format!("{}/members/{}", self.dir, component(id))
    }
}

/// The token of a witness child's name (`w-TOKEN`).
pub(super) fn witness_token(child: &str) -> Option<u64> {
    child.strip_prefix("w-")?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_one_component_per_name_and_round_trip() {
        let paths = Paths::of("/apps", Address::new("tenure", "a/b%c")).expect("fine");
        assert_eq!(paths.lease, "/apps/tenure/a%2Fb%25c");
        assert_eq!(paths.dir, "/apps/tenure/{a%2Fb%25c}");
        assert_eq!(paths.witness(7), "/apps/tenure/{a%2Fb%25c}/w-7");
        for name in ["a/b%c", ".", "..", "plain", "100%", "%2F"] {
            assert_eq!(name_of(&component(name)), name, "{name}");
        }
        assert_eq!(witness_token("w-12"), Some(12));
        assert_eq!(witness_token("last-run"), None);
    }

    #[test]
    fn a_prefix_that_is_not_one_component_is_refused() {
        for bad in ["a/b", ".", ".."] {
            let err = Paths::of("", Address::new(bad, "x")).expect_err(bad);
            assert!(matches!(err, Error::Config(_)), "{err}");
        }
    }
}
