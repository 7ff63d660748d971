//! A ZooKeeper URL: `zk://[USER:PASSWORD@]HOST:PORT[,HOST:PORT…][/CHROOT]`,
//! parsed once, with the password kept out of every message.

use percent_encoding::percent_decode_str;

use crate::{Error, Result};

/// Where the ensemble is and who tenure is there, from a `zk://` URL.
#[derive(Clone)]
pub(crate) struct ZkUrl {
    /// `host:port,host:port`, as the client takes it.
    pub hosts: String,
    /// The chroot every path goes under ("" for none), without a
    /// trailing slash.
    pub chroot: String,
    /// The digest user and password (`addauth digest user:password`).
    pub user: Option<(String, String)>,
    /// The URL for messages, password replaced by `***`.
    pub redacted: String,
}

impl std::fmt::Debug for ZkUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.redacted)
    }
}

impl ZkUrl {
    pub fn parse(url: &str) -> Result<ZkUrl> {
        let redacted = crate::redact_url(url);
        let bad = |why: &str| Error::Config(format!("{redacted} is not a ZooKeeper URL: {why}"));
        if url.starts_with("zks://") {
            return Err(Error::Config(format!(
                "{redacted}: TLS to ZooKeeper is not supported yet (use zk:// on a trusted \
                 network, or etcd or Redis with TLS)"
            )));
        }
        let rest = url
            .strip_prefix("zk://")
            .ok_or_else(|| bad("it must start with zk://"))?;
        if rest.contains('?') || rest.contains('#') {
            return Err(bad("it takes no query or fragment"));
        }
        let (userinfo, rest) = match rest.rsplit_once('@') {
            Some((userinfo, rest)) => (Some(userinfo), rest),
            None => (None, rest),
        };
        let (hosts, chroot) = match rest.find('/') {
            Some(at) => (&rest[..at], rest[at..].trim_end_matches('/')),
            None => (rest, ""),
        };
        if hosts.is_empty() {
            return Err(bad("no host:port"));
        }
        for host in hosts.split(',') {
            let port = host.rsplit_once(':').map(|(_, port)| port);
            if host.is_empty() || port.is_none_or(|p| p.parse::<u16>().is_err()) {
                return Err(bad(&format!("{host:?} is not host:port")));
            }
        }
        if chroot
            .split('/')
            .skip(1)
            .any(|part| part.is_empty() || part == "." || part == "..")
        {
            return Err(bad("the chroot is not a ZooKeeper path"));
        }
        let user = match userinfo {
            None => None,
            Some(userinfo) => {
                let (user, password) = userinfo
                    .split_once(':')
                    .ok_or_else(|| bad("a user needs a password (zk://USER:PASSWORD@…)"))?;
                let decode = |part: &str| {
                    percent_decode_str(part)
                        .decode_utf8()
                        .map(|text| text.into_owned())
                        .map_err(|_| bad("the user or password is not UTF-8"))
                };
                Some((decode(user)?, decode(password)?))
            }
        };
        Ok(ZkUrl {
            hosts: hosts.to_string(),
            chroot: chroot.to_string(),
            user,
            redacted,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_chroot_and_user_are_read_and_the_password_never_shown() {
        let url = ZkUrl::parse("zk://app:s%40cret@a:2181,b:2182/apps/x/").expect("parses");
        assert_eq!(url.hosts, "a:2181,b:2182");
        assert_eq!(url.chroot, "/apps/x");
        assert_eq!(url.user, Some(("app".into(), "s@cret".into())));
        assert!(!format!("{url:?} {}", url.redacted).contains("cret"));
        let bare = ZkUrl::parse("zk://127.0.0.1:2181").expect("parses");
        assert_eq!((bare.chroot.as_str(), bare.user), ("", None));
    }

    #[test]
    fn malformed_urls_are_one_line_config_errors() {
        for bad in [
            "zk://",
            "zk://host",
            "zk://host:notaport",
            "zk://a:1,,b:2",
            "zk://a:1/x//y",
            "zk://a:1/..",
            "zk://user@a:1",
            "zk://a:1?x=y",
            "zks://a:1",
        ] {
            let err = ZkUrl::parse(bad).expect_err(bad);
            assert!(matches!(err, Error::Config(_)), "{bad}: {err}");
            assert!(!err.to_string().contains('\n'));
        }
    }
}
