//! Requests counted where they arrive: each etcd member's
//! `grpc_server_msg_received_total` (every unary call, and every message on
//! a stream), read from `/metrics` on its client port over plain HTTP (no
//! gRPC, so reading counts nothing itself) and summed over the members. A
//! leaf: the etcd section and the scale child both count with it.

use std::collections::BTreeMap;
use std::time::Duration;

type Result<T> = std::result::Result<T, String>;

/// Requests counted by the etcd members, by gRPC method.
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct ByMethod(pub(crate) BTreeMap<String, f64>);

impl ByMethod {
    pub(crate) fn total(&self) -> f64 {
        self.0.values().sum()
    }

    /// What was counted since `earlier` (methods that did not change are
    /// left out).
    pub(crate) fn minus(&self, earlier: &ByMethod) -> ByMethod {
        ByMethod(
            self.0
                .iter()
                .map(|(method, n)| {
                    let before = earlier.0.get(method).copied().unwrap_or(0.0);
                    (method.clone(), n - before)
                })
                .filter(|(_, n)| *n != 0.0)
                .collect(),
        )
    }

    pub(crate) fn scaled(&self, by: f64) -> ByMethod {
        ByMethod(self.0.iter().map(|(m, n)| (m.clone(), n * by)).collect())
    }

    /// One method's count (0 when it was not called).
    pub(crate) fn get(&self, method: &str) -> f64 {
        self.0.get(method).copied().unwrap_or(0.0)
    }

    /// `LeaseKeepAlive 3.00, Range 3.00`, the busiest first.
    pub(crate) fn describe(&self) -> String {
        let mut methods: Vec<(&String, &f64)> = self.0.iter().collect();
        methods.sort_by(|a, b| b.1.total_cmp(a.1).then(a.0.cmp(b.0)));
        if methods.is_empty() {
            return "none".into();
        }
        methods
            .iter()
            .map(|(m, n)| format!("{m} {n:.2}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// The members' `HOST:PORT`s of an `etcd://` URL, `None` for any other
/// store.
pub(crate) fn metrics_endpoints(url: &str) -> Option<Vec<String>> {
    let hosts = url.strip_prefix("etcd://")?;
    let hosts = hosts.rsplit_once('@').map_or(hosts, |(_, h)| h);
    let hosts = hosts.strip_suffix('/').unwrap_or(hosts);
    Some(hosts.split(',').map(str::to_string).collect())
}

/// The gRPC messages each member has received so far, summed over the
/// members (`grpc_server_msg_received_total` of its `/metrics`).
pub(crate) async fn scrape(members: &[String]) -> Result<ByMethod> {
    let members = members.to_vec();
    tokio::task::spawn_blocking(move || {
        let mut sum = ByMethod::default();
        for member in &members {
            let text = http_get(member, "/metrics")?;
            for (method, n) in parse_metrics(&text).0 {
                *sum.0.entry(method).or_default() += n;
            }
        }
        Ok(sum)
    })
    .await
    .map_err(|e| e.to_string())?
}

/// `grpc_server_msg_received_total` by `grpc_method`, from Prometheus'
/// text format.
fn parse_metrics(text: &str) -> ByMethod {
    let mut counts = ByMethod::default();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("grpc_server_msg_received_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.split_once('}') else {
            continue;
        };
        let method = labels
            .split(',')
            .find_map(|l| l.trim().strip_prefix("grpc_method=\""))
            .and_then(|m| m.strip_suffix('"'));
        let value = value.split_whitespace().next().map(str::parse::<f64>);
        if let (Some(method), Some(Ok(value))) = (method, value) {
            *counts.0.entry(method.to_string()).or_default() += value;
        }
    }
    counts
}

/// A plain HTTP/1.0 GET (etcd's client port serves `/metrics` as HTTP).
fn http_get(host_port: &str, path: &str) -> Result<String> {
    use std::io::{Read, Write};
    let mut stream =
        std::net::TcpStream::connect(host_port).map_err(|e| format!("{host_port}: {e}"))?;
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| e.to_string())?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {host_port}\r\n\r\n")
        .map_err(|e| format!("{host_port}: {e}"))?;
    let mut reply = String::new();
    stream
        .read_to_string(&mut reply)
        .map_err(|e| format!("{host_port}{path}: {e}"))?;
    let (head, body) = reply
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("{host_port}{path}: no HTTP reply"))?;
    let status = head.split_whitespace().nth(1);
    if !head.starts_with("HTTP/1.") || status != Some("200") {
        return Err(format!(
            "{host_port}{path}: {}",
            head.lines().next().unwrap_or("")
        ));
    }
    Ok(body.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_are_summed_by_method() {
        let text = "\
# HELP grpc_server_msg_received_total Total number of RPC stream messages received on the server.
# TYPE grpc_server_msg_received_total counter
grpc_server_msg_received_total{grpc_method=\"LeaseKeepAlive\",grpc_service=\"etcdserverpb.Lease\",grpc_type=\"bidi_stream\"} 1381
grpc_server_msg_received_total{grpc_method=\"Range\",grpc_service=\"etcdserverpb.KV\",grpc_type=\"unary\"} 2.5e+06
grpc_server_msg_received_total{grpc_method=\"Txn\",grpc_service=\"etcdserverpb.KV\",grpc_type=\"unary\"} 0
grpc_server_msg_sent_total{grpc_method=\"Range\",grpc_service=\"etcdserverpb.KV\",grpc_type=\"unary\"} 99
grpc_server_started_total{grpc_method=\"Txn\",grpc_service=\"etcdserverpb.KV\",grpc_type=\"unary\"} 7
";
        let counts = parse_metrics(text);
        assert_eq!(counts.get("LeaseKeepAlive"), 1381.0);
        assert_eq!(counts.get("Range"), 2_500_000.0, "exponent notation");
        assert_eq!(counts.get("Txn"), 0.0, "only messages received are counted");
        assert_eq!(counts.total(), 2_501_381.0);
    }

    #[test]
    fn a_window_keeps_what_changed_and_describes_the_busiest_first() {
        let before = ByMethod(BTreeMap::from([
            ("LeaseKeepAlive".to_string(), 10.0),
            ("Range".to_string(), 5.0),
            ("Watch".to_string(), 2.0),
        ]));
        let after = ByMethod(BTreeMap::from([
            ("LeaseKeepAlive".to_string(), 13.0),
            ("Range".to_string(), 11.0),
            ("Watch".to_string(), 2.0),
            ("Txn".to_string(), 3.0),
        ]));
        let window = after.minus(&before);
        assert_eq!(window.get("Watch"), 0.0);
        assert_eq!(window.0.len(), 3, "unchanged methods are left out");
        assert_eq!(
            window.scaled(0.5).describe(),
            "Range 3.00, LeaseKeepAlive 1.50, Txn 1.50"
        );
        assert_eq!(ByMethod::default().describe(), "none");
    }

    #[test]
    fn only_etcd_urls_name_members_to_read_metrics_from() {
        assert_eq!(
            metrics_endpoints("etcd://127.0.0.1:1,127.0.0.1:2/"),
            Some(vec!["127.0.0.1:1".to_string(), "127.0.0.1:2".to_string()])
        );
        assert_eq!(
            metrics_endpoints("etcd://user:pw@h:3"),
            Some(vec!["h:3".to_string()])
        );
        assert_eq!(metrics_endpoints("redis://127.0.0.1:6379"), None);
    }
}
