//! A Redis Cluster's slot map: read with `CLUSTER SLOTS` from the first
//! node that answers (every seed at start, which must be of one cluster),
//! and the warning about `cluster-require-full-coverage`. Apart from the
//! node choice, which only reads the map.

use std::collections::HashMap;

use futures_util::StreamExt;
use redis::Value;

use super::slots::SLOTS;
use super::url::Layout;
use super::Topology;
use crate::{Error, Result};

impl Topology {
    /// With Redis's default `cluster-require-full-coverage yes`, every node
    /// answers `CLUSTERDOWN` from the moment a primary is judged failed
    /// until its replica is promoted (about 2 s with a node timeout of
    /// 1 s), so every term whose ttl is shorter ends, on every shard. That
    /// costs terms, never safety (nobody is granted a lease meanwhile), so
    /// it is said, not refused. `CONFIG GET` may be refused (an ACL, a
    /// managed service): then that is said, and tenure carries on.
    pub(super) async fn warn_about_full_coverage(&self) {
        let Ok(primaries) = self.primaries().await else {
            return;
        };
        let asked = primaries.iter().map(|node| async move {
            let reply = tokio::time::timeout(
                self.call_timeout,
                redis::cmd("CONFIG")
                    .arg("GET")
                    .arg("cluster-require-full-coverage")
                    .query_async::<HashMap<String, String>>(&mut node.conn()),
            )
            .await;
            let reply = match reply {
                Ok(Ok(reply)) => Ok(reply.get("cluster-require-full-coverage").cloned()),
                Ok(Err(err)) => Err(crate::error::one_line(&err.to_string())),
                Err(_) => Err(format!("no answer within {:?}", self.call_timeout)),
            };
            (node.addr.clone(), reply)
        });
        let mut full = Vec::new();
        let mut unknown = Vec::new();
        for (addr, reply) in futures_util::future::join_all(asked).await {
            match reply {
                Ok(Some(value)) if value.eq_ignore_ascii_case("no") => {}
                Ok(Some(_)) => full.push(addr),
                Ok(None) => unknown.push(format!("{addr}: not reported")),
                Err(why) => unknown.push(format!("{addr}: {why}")),
            }
        }
        if !full.is_empty() {
            tracing::warn!(
                nodes = %full.join(", "),
                "cluster-require-full-coverage is yes (Redis's default): while any shard fails \
                 over, every node answers CLUSTERDOWN (cluster-node-timeout plus the replicas' \
                 election), and the terms of elections on healthy shards whose ttl is shorter \
                 end; set cluster-require-full-coverage no on every node, or use a ttl above \
                 that (the book's Topologies page, docs/src/stores/topologies.md)"
            );
        }
        if !unknown.is_empty() {
            tracing::warn!(
                nodes = %unknown.join("; "),
                "cannot read cluster-require-full-coverage (CONFIG GET refused or unanswered); \
                 if it is yes (Redis's default), a failover of any shard ends the terms on every \
                 shard whose ttl is shorter than the failover: make sure it is no (the book's \
                 Topologies page, docs/src/stores/topologies.md)"
            );
        }
    }

    /// Read the slot map with `CLUSTER SLOTS` from the first node that
    /// answers: the nodes of the current map, then the URL's seeds.
    pub(super) async fn refresh_slots(&self) -> Result<()> {
        let Layout::Cluster { seeds } = &self.url.layout else {
            return Ok(());
        };
        let _one = self.discovery.lock().await;
        {
            let state = self.lock();
            if !state.stale && !state.slots.is_empty() {
                return Ok(());
            }
        }
        let mut candidates: Vec<String> = {
            let state = self.lock();
            let mut seen = std::collections::HashSet::new();
            state
                .slots
                .iter()
                .flatten()
                .map(|node| node.addr.clone())
                .filter(|addr| seen.insert(addr.clone()))
                .collect()
        };
        for seed in seeds {
            if !candidates.contains(seed) {
                candidates.push(seed.clone());
            }
        }
        let (accepted, problems, final_error) = self.read_slot_maps(&candidates).await?;
        if let Some(map) = accepted {
            return self.use_slot_map(map);
        }
        if let Some(err) = final_error {
            return Err(err);
        }
        Err(Error::Unreachable {
            url: self.target.redacted(),
            detail: format!(
                "no cluster node answered CLUSTER SLOTS ({})",
                problems.join("; ")
            ),
        })
    }

    /// Ask every one of `candidates` for its slot map at once, for
    /// [`Topology::refresh_slots`]: the map accepted (if any), what went
    /// wrong with the others, and the first error that no retry can pass.
    /// Seeds of two clusters are refused.
    async fn read_slot_maps(
        &self,
        candidates: &[String],
    ) -> Result<(Option<SlotMap>, Vec<String>, Option<Error>)> {
        // Every candidate at once, each within the call timeout: the first
        // map wins, so one silent node cannot hold up the others.
        let asked = candidates.iter().map(|addr| self.ask_slots(addr));
        // The first read waits for every node that answers in time, so that
        // seeds of two clusters are refused at start; later ones compare
        // the first map with the one before.
        let first_read = self.lock().cluster_ids.is_empty();
        let mut pending: futures_util::stream::FuturesUnordered<_> = asked.collect();
        let mut problems = Vec::new();
        let mut final_error = None;
        let mut accepted: Option<SlotMap> = None;
        while let Some(answer) = pending.next().await {
            let map = match answer {
                Ok(map) => map,
                Err((problem, fatal)) => {
                    problems.push(problem);
                    if final_error.is_none() {
                        final_error = fatal;
                    }
                    continue;
                }
            };
            let before = match &accepted {
                Some(first) => first.clone(),
                None => SlotMap {
                    from: "the nodes met before".into(),
                    ranges: Vec::new(),
                    ids: self.lock().cluster_ids.clone(),
                },
            };
            if !before.ids.is_empty() && !map.ids.is_empty() && before.ids.is_disjoint(&map.ids) {
                return Err(Error::Config(format!(
                    "the cluster nodes {} and {} belong to different Redis Clusters (their slot \
                     maps have no node in common): list nodes of one cluster only in {}",
                    before.from,
                    map.from,
                    self.target.redacted()
                )));
            }
            if accepted.is_none() {
                accepted = Some(map);
            }
            if !first_read {
                break;
            }
        }
        drop(pending);
        Ok((accepted, problems, final_error))
    }

    /// One node's `CLUSTER SLOTS`, within the call timeout; else what went
    /// wrong, with the error if no retry can pass.
    async fn ask_slots(&self, addr: &str) -> std::result::Result<SlotMap, (String, Option<Error>)> {
        let node = self.node_at(addr).map_err(|e| (e.to_string(), Some(e)))?;
        let reply = tokio::time::timeout(
            self.call_timeout,
            redis::cmd("CLUSTER")
                .arg("SLOTS")
                .query_async::<Value>(&mut node.conn()),
        )
        .await;
        match reply {
            Err(_) => {
                node.reset();
                Err((
                    format!("{addr}: no answer within {:?}", self.call_timeout),
                    None,
                ))
            }
            Ok(Ok(value)) => {
                parse_slots(value, addr).map_err(|why| (format!("{addr}: {why}"), None))
            }
            Ok(Err(err)) => {
                let disabled = err
                    .detail()
                    .is_some_and(|d| d.contains("cluster support disabled"));
                if disabled {
                    let err = Error::Config(format!(
                        "{addr} (of {}) is not in cluster mode; use redis:// for a single \
                         server or redis+sentinel:// for Sentinel",
                        self.target.redacted()
                    ));
                    return Err((err.to_string(), Some(err)));
                }
                let err = node.target.classify_first(err);
                node.reset();
                let text = format!("{addr}: {err}");
                Err((text, (!err.is_transient()).then_some(err)))
            }
        }
    }

    /// Use the slot map `map` from now on.
    fn use_slot_map(&self, map: SlotMap) -> Result<()> {
        let mut slots = vec![None; usize::from(SLOTS)];
        for (start, end, owner) in &map.ranges {
            let owner = self.node_at(owner)?;
            for slot in *start..=(*end).min(SLOTS - 1) {
                slots[usize::from(slot)] = Some(owner.clone());
            }
        }
        let mut state = self.lock();
        state.slots = slots;
        state.stale = false;
        if !map.ids.is_empty() {
            state.cluster_ids = map.ids;
        }
        Ok(())
    }
}

/// One node's `CLUSTER SLOTS`.
#[derive(Debug, Clone)]
struct SlotMap {
    /// The node that answered.
    from: String,
    /// (first slot, last slot, primary `host:port`).
    ranges: Vec<(u16, u16, String)>,
    /// The IDs of every node in the map, primaries and replicas (empty
    /// when the server does not send them).
    ids: std::collections::HashSet<String>,
}

/// Parse `CLUSTER SLOTS`. A primary announced without an address is the
/// node asked (`asked`).
fn parse_slots(value: Value, asked: &str) -> std::result::Result<SlotMap, String> {
    let Value::Array(ranges) = value else {
        return Err(format!("CLUSTER SLOTS replied {value:?}"));
    };
    let asked_host = asked.rsplit_once(':').map_or(asked, |(host, _)| host);
    let int = |v: &Value| match v {
        Value::Int(n) => u16::try_from(*n).ok(),
        _ => None,
    };
    let text = |v: &Value| match v {
        Value::BulkString(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    };
    let mut out = Vec::new();
    let mut ids = std::collections::HashSet::new();
    for range in ranges {
        let Value::Array(items) = range else {
            return Err("a slot range is not an array".into());
        };
        let (Some(start), Some(end)) = (items.first().and_then(int), items.get(1).and_then(int))
        else {
            return Err("a slot range without its bounds".into());
        };
        let Some(Value::Array(primary)) = items.get(2) else {
            return Err("a slot range without its primary".into());
        };
        let host = primary.first().and_then(text).unwrap_or_default();
        let Some(port) = primary.get(1).and_then(int) else {
            return Err("a primary without a port".into());
        };
        let host = if host.is_empty() || host == "?" {
            asked_host.to_string()
        } else if host.contains(':') && !host.starts_with('[') {
            format!("[{host}]")
        } else {
            host
        };
        out.push((start, end, format!("{host}:{port}")));
        for node in items.iter().skip(2) {
            if let Value::Array(node) = node {
                if let Some(id) = node.get(2).and_then(text).filter(|id| !id.is_empty()) {
                    ids.insert(id);
                }
            }
        }
    }
    Ok(SlotMap {
        from: asked.to_string(),
        ranges: out,
        ids,
    })
}
