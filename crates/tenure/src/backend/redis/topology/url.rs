//! Store URLs taken apart (single server, Sentinel, Cluster) into the
//! node and sentinel URLs they stand for, and the `host:port` addresses
//! that URLs and Redis replies write. Apart from the topology so that a
//! bad URL is refused before anything is reached.

use crate::{Error, Result};

/// The shape of a store URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Layout {
    Single,
    Sentinel {
        sentinels: Vec<String>,
        service: String,
        /// `user:password` (as written in the URL, percent-encoded) for the
        /// sentinels, from the `sentinel_username`/`sentinel_password`
        /// query parameters.
        sentinel_userinfo: Option<String>,
    },
    Cluster {
        seeds: Vec<String>,
    },
}

/// A parsed store URL: its layout and what every node URL is made of.
#[derive(Debug, Clone)]
pub(crate) struct StoreUrl {
    pub layout: Layout,
    tls: bool,
    userinfo: Option<String>,
    db: u32,
}

const SENTINEL_FORM: &str =
    "redis+sentinel://[USER:PASSWORD@]HOST:PORT[,HOST:PORT...]/SERVICE[/DB] \
     (rediss+sentinel:// for TLS)";
const CLUSTER_FORM: &str =
    "redis+cluster://[USER:PASSWORD@]HOST:PORT[,HOST:PORT...] (rediss+cluster:// for TLS)";

impl StoreUrl {
    /// Parse a store URL. Single-server URLs are left to the redis crate's
    /// parser (in
    /// [`Endpoint::new`](crate::backend::redis::connection::Endpoint::new));
    /// Sentinel and Cluster URLs are parsed here, into the node URLs they
    /// stand for.
    pub fn parse(url: &str) -> Result<StoreUrl> {
        let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
        let scheme = scheme.to_ascii_lowercase();
        let (tls, sentinel) = match scheme.as_str() {
            "redis+sentinel" => (false, true),
            "rediss+sentinel" => (true, true),
            "redis+cluster" => (false, false),
            "rediss+cluster" => (true, false),
            _ => {
                return Ok(StoreUrl {
                    layout: Layout::Single,
                    tls: false,
                    userinfo: None,
                    db: 0,
                })
            }
        };
        let form = if sentinel {
            SENTINEL_FORM
        } else {
            CLUSTER_FORM
        };
        let invalid = |detail: String| {
            Error::Config(format!(
                "invalid store URL {}: {detail} (expected {form})",
                crate::redact_url(url)
            ))
        };
        let (rest, query) = match rest.split_once('?') {
            Some((rest, query)) => (rest, Some(query)),
            None => (rest, None),
        };
        let (authority, path) = match rest.split_once('/') {
            Some((authority, path)) => (authority, path),
            None => (rest, ""),
        };
        let (userinfo, hosts) = match authority.rsplit_once('@') {
            Some((userinfo, hosts)) => (Some(userinfo.to_string()), hosts),
            None => (None, authority),
        };
        let default_port = if sentinel { 26379 } else { 6379 };
        let addrs = hosts
            .split(',')
            .map(|host| host_port(host, default_port).map_err(&invalid))
            .collect::<Result<Vec<_>>>()?;
        let sentinel_credentials = query_params(query, sentinel, &invalid)?;
        let (layout, db) = if sentinel {
            sentinel_layout(path, addrs, sentinel_credentials, &invalid)?
        } else {
            if !matches!(path, "" | "0") {
                return Err(invalid(format!(
                    "a cluster has only database 0, not {path:?}"
                )));
            }
            (Layout::Cluster { seeds: addrs }, 0)
        };
        Ok(StoreUrl {
            layout,
            tls,
            userinfo,
            db,
        })
    }

    /// The URL of a data node at `addr` (`host:port`).
    pub(super) fn node_url(&self, addr: &str) -> String {
        let scheme = if self.tls { "rediss" } else { "redis" };
        match &self.userinfo {
            Some(userinfo) => format!("{scheme}://{userinfo}@{addr}/{}", self.db),
            None => format!("{scheme}://{addr}/{}", self.db),
        }
    }

    /// The URL of a sentinel at `addr`.
    pub(super) fn sentinel_url(&self, addr: &str, userinfo: Option<&str>) -> String {
        let scheme = if self.tls { "rediss" } else { "redis" };
        match userinfo {
            Some(userinfo) => format!("{scheme}://{userinfo}@{addr}"),
            None => format!("{scheme}://{addr}"),
        }
    }
}

/// The query parameters of a Sentinel or Cluster URL (`sentinel`): the
/// sentinels' user and password, if given; any other parameter is refused
/// (`invalid`).
fn query_params(
    query: Option<&str>,
    sentinel: bool,
    invalid: &impl Fn(String) -> Error,
) -> Result<(Option<String>, Option<String>)> {
    let mut sentinel_user = None;
    let mut sentinel_password = None;
    for param in query.into_iter().flat_map(|q| q.split('&')) {
        if param.is_empty() {
            continue;
        }
        let (key, value) = param.split_once('=').unwrap_or((param, ""));
        match key {
            "sentinel_username" if sentinel => sentinel_user = Some(value.to_string()),
            "sentinel_password" if sentinel => sentinel_password = Some(value.to_string()),
            _ => {
                let known = if sentinel {
                    " (known: sentinel_username, sentinel_password)"
                } else {
                    " (cluster URLs take none)"
                };
                return Err(invalid(format!("unknown query parameter {key:?}{known}")));
            }
        }
    }
    Ok((sentinel_user, sentinel_password))
}

/// The layout and database of a Sentinel URL: the service and database
/// from its `path`, the sentinels at `addrs`, and their user and password
/// if given.
fn sentinel_layout(
    path: &str,
    addrs: Vec<String>,
    (sentinel_user, sentinel_password): (Option<String>, Option<String>),
    invalid: &impl Fn(String) -> Error,
) -> Result<(Layout, u32)> {
    let mut parts = path.split('/');
    let service = parts.next().unwrap_or_default();
    if service.is_empty() {
        return Err(invalid("the service name (the path) is missing".into()));
    }
    let db = match parts.next() {
        None | Some("") => 0,
        Some(db) => db
            .parse::<u32>()
            .map_err(|_| invalid(format!("database {db:?} is not a number")))?,
    };
    if parts.next().is_some() {
        return Err(invalid("too many path segments".into()));
    }
    let sentinel_userinfo = match (sentinel_user, sentinel_password) {
        (None, None) => None,
        (user, Some(password)) => Some(format!("{}:{password}", user.unwrap_or_default())),
        (Some(user), None) => Some(user),
    };
    let layout = Layout::Sentinel {
        sentinels: addrs,
        service: service.to_string(),
        sentinel_userinfo,
    };
    Ok((layout, db))
}

/// `host:port` from one entry of a host list, with the default port when
/// it has none.
fn host_port(host: &str, default_port: u16) -> std::result::Result<String, String> {
    if host.is_empty() {
        return Err("a host is missing".into());
    }
    let (name, port) = if let Some(rest) = host.strip_prefix('[') {
        let (name, after) = rest
            .split_once(']')
            .ok_or_else(|| format!("{host:?} lacks its closing bracket"))?;
        let port = match after.strip_prefix(':') {
            Some(port) => Some(port),
            None if after.is_empty() => None,
            None => return Err(format!("{host:?} is not HOST:PORT")),
        };
        (format!("[{name}]"), port)
    } else {
        match host.rsplit_once(':') {
            Some((name, port)) => (name.to_string(), Some(port)),
            None => (host.to_string(), None),
        }
    };
    if name.is_empty() || name == "[]" {
        return Err(format!("{host:?} has no host name"));
    }
    let port = match port {
        None => default_port,
        Some(port) => port
            .parse::<u16>()
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| format!("{port:?} is not a port number"))?,
    };
    Ok(format!("{name}:{port}"))
}

/// `host:port`, with an IPv6 address in brackets (as URLs and the slot map
/// write it; Redis replies write it bare).
pub(crate) fn host_and_port(host: &str, port: u16) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// A `host:port` from a Redis reply (`MOVED`, `ASK`), bracketed when the
/// host is an IPv6 address; `from`'s host when the reply leaves it out
/// (`:PORT`, a node that does not know its own address).
pub(crate) fn reply_addr(addr: &str, from: &str) -> String {
    let Some((host, port)) = addr.rsplit_once(':') else {
        return addr.to_string();
    };
    let Ok(port) = port.parse::<u16>() else {
        return addr.to_string();
    };
    if host.is_empty() {
        let from_host = from.rsplit_once(':').map_or(from, |(host, _)| host);
        return format!("{from_host}:{port}");
    }
    host_and_port(host, port)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_from_replies_are_bracketed_and_completed() {
        assert_eq!(reply_addr("::1:7001", "[::1]:7000"), "[::1]:7001");
        assert_eq!(
            reply_addr("10.0.0.2:7001", "10.0.0.1:7000"),
            "10.0.0.2:7001"
        );
        assert_eq!(reply_addr(":7001", "10.0.0.1:7000"), "10.0.0.1:7001");
        assert_eq!(reply_addr(":7001", "[::1]:7000"), "[::1]:7001");
        assert_eq!(host_and_port("fe80::1", 6379), "[fe80::1]:6379");
    }

    #[test]
    fn sentinel_urls_parse() {
        let url = StoreUrl::parse(
            "redis+sentinel://app:pw@s1:26379,s2,[::1]:26380/mymaster/2?sentinel_password=spw",
        )
        .unwrap();
        assert_eq!(
            url.layout,
            Layout::Sentinel {
                sentinels: vec!["s1:26379".into(), "s2:26379".into(), "[::1]:26380".into()],
                service: "mymaster".into(),
                sentinel_userinfo: Some(":spw".into()),
            }
        );
        assert_eq!(
            url.node_url("10.0.0.1:6379"),
            "redis://app:pw@10.0.0.1:6379/2"
        );
        assert_eq!(
            url.sentinel_url("s1:26379", Some(":spw")),
            "redis://:spw@s1:26379"
        );
        let tls = StoreUrl::parse("rediss+sentinel://s1/svc").unwrap();
        assert_eq!(tls.node_url("h:1"), "rediss://h:1/0");
    }

    #[test]
    fn cluster_urls_parse() {
        let url = StoreUrl::parse("redis+cluster://u:p@a:7000,b").unwrap();
        assert_eq!(
            url.layout,
            Layout::Cluster {
                seeds: vec!["a:7000".into(), "b:6379".into()]
            }
        );
        assert_eq!(url.node_url("c:7001"), "redis://u:p@c:7001/0");
        assert_eq!(StoreUrl::parse("redis://h").unwrap().layout, Layout::Single);
    }

    #[test]
    fn bad_urls_name_the_problem_without_the_password() {
        for (url, needle) in [
            ("redis+sentinel://u:secret@s1", "service name"),
            ("redis+sentinel://s1:0/svc", "port"),
            ("redis+sentinel://s1/svc/x", "not a number"),
            (
                "redis+sentinel://s1/svc?sentinel_pass=1",
                "unknown query parameter",
            ),
            ("redis+cluster://u:secret@a,/", "host is missing"),
            ("redis+cluster://a/3", "only database 0"),
            ("redis+cluster://a?x=1", "take none"),
        ] {
            let err = StoreUrl::parse(url).unwrap_err().to_string();
            assert!(err.contains(needle), "{url}: {err}");
            assert!(!err.contains("secret"), "{err}");
            assert!(!err.contains('\n'), "{err}");
        }
    }
}
