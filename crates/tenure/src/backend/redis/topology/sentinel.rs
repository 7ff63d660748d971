//! Redis Sentinel discovery: every sentinel asked at once for the
//! primary, the newest answer of one Sentinel group taken, and that
//! primary used once it says it is one. Apart from the cluster's slot
//! maps and from the `+switch-master` subscriptions (`switches.rs`).

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use redis::Value;

use super::super::target::RedisTarget;
use super::url::{host_and_port, Layout};
use super::{Node, Topology};
use crate::{Error, Result};

impl Topology {
    /// Sentinel: stop using the primary at `addr` (if it is still the one
    /// in use).
    pub(super) fn forget_primary(&self, addr: &str) {
        let mut state = self.lock();
        state.forgotten += 1;
        if state.primary.as_ref().is_some_and(|node| node.addr == addr) {
            state.primary = None;
            tracing::info!(primary = %addr, "asking the sentinels for the primary again");
        }
    }

    /// Ask every sentinel for the primary (see [`Topology::ask_sentinels`]),
    /// take the newest answer of one Sentinel group, and use that primary
    /// once it says it is one.
    pub(super) async fn discover_primary(&self) -> Result<Arc<Node>> {
        let Layout::Sentinel { service, .. } = &self.url.layout else {
            return Err(Error::internal("not a Sentinel store"));
        };
        let _one = self.discovery.lock().await;
        for _ in 0..3 {
            let (forgotten, first) = {
                let state = self.lock();
                if let Some(node) = &state.primary {
                    return Ok(node.clone());
                }
                (state.forgotten, state.last_primary.is_none())
            };
            let answers = self.ask_sentinels(first).await?;
            one_sentinel_group(&answers, service).map_err(Error::Config)?;
            let Some(newest) = newest_answer(&answers) else {
                return Err(Error::internal("no sentinel answer"));
            };
            let (sentinel, addr) = (newest.sentinel.clone(), newest.primary.clone());
            let node = self.confirm_primary(&addr).await?;
            let moved = {
                let mut state = self.lock();
                if state.forgotten != forgotten {
                    // A switch was announced meanwhile: this answer may
                    // name the old primary. Ask again.
                    continue;
                }
                state.primary = Some(node.clone());
                state.nodes.insert(node.addr.clone(), node.clone());
                let moved = state.last_primary.as_deref() != Some(node.addr.as_str());
                state.last_primary = Some(node.addr.clone());
                moved
            };
            if moved {
                // The subscriber follows the primary.
                self.changes.send_modify(|n| *n += 1);
                tracing::info!(primary = %node.addr, %sentinel, "primary found through Sentinel");
                self.warn_without_min_replicas(&node).await;
            }
            return Ok(node);
        }
        Err(Error::Unreachable {
            url: self.target.redacted(),
            detail: "the sentinels keep announcing new primaries".into(),
        })
    }

    /// Every sentinel's answer, all asked at once. The first discovery
    /// (`all`) waits for every sentinel that answers within the timeout, so
    /// that a list spanning two Sentinel groups is refused at start; later
    /// ones wait for a majority of the list only (a hung sentinel must not
    /// hold up following a failover), or for every sentinel to reply.
    async fn ask_sentinels(&self, all: bool) -> Result<Vec<SentinelAnswer>> {
        let Layout::Sentinel {
            service,
            sentinel_userinfo,
            ..
        } = &self.url.layout
        else {
            return Err(Error::internal("not a Sentinel store"));
        };
        let sentinels = self.followed();
        let limit = self.call_timeout.max(Duration::from_millis(500)) * 2;
        let asked = sentinels.iter().map(|sentinel| async move {
            let answer = tokio::time::timeout(
                limit,
                self.ask_sentinel(sentinel, service, sentinel_userinfo.as_deref()),
            )
            .await;
            match answer {
                Ok(Ok(answer)) => Ok(answer),
                Ok(Err(err)) => Err((format!("{sentinel}: {err}"), Some(err))),
                Err(_) => Err((format!("{sentinel}: no answer in time"), None)),
            }
        });
        let needed = if all {
            sentinels.len()
        } else {
            sentinels.len() / 2 + 1
        };
        let mut pending: futures_util::stream::FuturesUnordered<_> = asked.collect();
        let mut answers = Vec::new();
        let mut problems = Vec::new();
        let mut final_error = None;
        while let Some(answer) = pending.next().await {
            match answer {
                Ok(answer) => answers.push(answer),
                Err((problem, err)) => {
                    problems.push(problem);
                    if let Some(err) = err.filter(|e| !e.is_transient()) {
                        final_error.get_or_insert(err);
                    }
                }
            }
            if answers.len() >= needed {
                break;
            }
        }
        if !answers.is_empty() {
            return Ok(answers);
        }
        if let Some(err) = final_error {
            return Err(err);
        }
        Err(Error::Unreachable {
            url: self.target.redacted(),
            detail: format!(
                "no sentinel named a primary for {service:?} ({})",
                problems.join("; ")
            ),
        })
    }

    /// Sentinel fails over asynchronously: a primary cut off from the
    /// sentinels keeps accepting writes, and a leader cut off with it keeps
    /// renewing there, unless the primary refuses writes it cannot
    /// replicate (`min-replicas-to-write`). Say so once per primary.
    async fn warn_without_min_replicas(&self, node: &Node) {
        let info: redis::RedisResult<String> = redis::cmd("INFO")
            .arg("replication")
            .query_async(&mut node.conn())
            .await;
        // Redis reports min_slaves_good_slaves only when
        // min-replicas-to-write and min-replicas-max-lag are set.
        if let Ok(info) = info {
            if !info.contains("min_slaves_good_slaves:") {
                tracing::warn!(
                    primary = %node.addr,
                    "the Sentinel primary accepts writes it cannot replicate (min-replicas-to-write 0): \
                     a leader cut off together with it keeps renewing there after a failover; set \
                     min-replicas-to-write 1 and min-replicas-max-lag below down-after-milliseconds \
                     (the book's Topologies page, docs/src/stores/topologies.md), and fence every \
                     write"
                );
            }
        }
    }

    /// One sentinel's answer: the primary of `service` with the
    /// configuration epoch it was announced in, and who the sentinel is and
    /// knows. Only the primary's address is required: a sentinel user may
    /// be allowed `SENTINEL GET-MASTER-ADDR-BY-NAME` alone.
    async fn ask_sentinel(
        &self,
        sentinel: &str,
        service: &str,
        userinfo: Option<&str>,
    ) -> Result<SentinelAnswer> {
        let sentinel_target = RedisTarget {
            url: self.url.sentinel_url(sentinel, userinfo),
            tls_ca: self.target.tls_ca.clone(),
        };
        let mut conn = sentinel_target.endpoint()?.connection(self.call_timeout)?;
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        pipe.cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg(service);
        pipe.cmd("SENTINEL").arg("master").arg(service);
        pipe.cmd("SENTINEL").arg("myid");
        pipe.cmd("SENTINEL").arg("sentinels").arg(service);
        let replies: Vec<redis::RedisResult<Value>> = pipe
            .query_async(&mut conn)
            .await
            .map_err(|e| sentinel_target.classify_first(e))?;
        let mut replies = replies.into_iter();
        let addr: Option<(String, u16)> = match replies.next() {
            Some(Ok(value)) => redis::from_redis_value(value).map_err(|e| {
                Error::redis(format!(
                    "sentinel {sentinel} answered SENTINEL GET-MASTER-ADDR-BY-NAME \
                     unexpectedly: {e}"
                ))
            })?,
            Some(Err(err)) => return Err(sentinel_target.classify_first(err)),
            None => return Err(Error::internal("a pipeline reply is missing")),
        };
        let Some((host, port)) = addr else {
            return Err(Error::Config(format!(
                "sentinel {sentinel} does not monitor a service named {service:?}"
            )));
        };
        let epoch = match replies.next() {
            Some(Ok(master)) => field_of(&master, "config-epoch").and_then(|e| e.parse().ok()),
            _ => None,
        };
        let id = match replies.next() {
            Some(Ok(id)) => text_of(&id),
            _ => None,
        };
        let peers = match replies.next() {
            Some(Ok(Value::Array(peers))) => Some(
                peers
                    .iter()
                    .filter_map(|peer| field_of(peer, "runid"))
                    .collect(),
            ),
            _ => None,
        };
        Ok(SentinelAnswer {
            sentinel: sentinel.to_string(),
            primary: host_and_port(&host, port),
            epoch,
            id,
            peers,
        })
    }

    /// The node at `addr`, the primary a sentinel named, once it says with
    /// `ROLE` that it is one (a sentinel can be behind, and a demoted
    /// primary that comes back believes it is one until it is reconfigured).
    async fn confirm_primary(&self, addr: &str) -> Result<Arc<Node>> {
        let addr = addr.to_string();
        let node = match self.lock().nodes.get(&addr) {
            Some(node) => node.clone(),
            None => {
                let target = RedisTarget {
                    url: self.url.node_url(&addr),
                    tls_ca: self.target.tls_ca.clone(),
                };
                Arc::new(Node::new(target, addr.clone(), self.call_timeout)?)
            }
        };
        let role: Value = match redis::cmd("ROLE").query_async(&mut node.conn()).await {
            Ok(role) => role,
            Err(err) => {
                node.reset();
                return Err(node.target.classify_first(err));
            }
        };
        let role = match &role {
            Value::Array(items) => match items.first() {
                Some(Value::BulkString(bytes)) => String::from_utf8_lossy(bytes).into_owned(),
                Some(Value::SimpleString(text)) => text.clone(),
                _ => String::new(),
            },
            _ => String::new(),
        };
        if role != "master" {
            // Reset: the next discovery opens a fresh connection to it.
            node.reset();
            return Err(Error::Unreachable {
                url: self.target.redacted(),
                detail: format!(
                    "the primary the sentinels named, {addr}, says it is a {}",
                    if role.is_empty() {
                        "non-primary"
                    } else {
                        &role
                    }
                ),
            });
        }
        Ok(node)
    }
}

/// What one sentinel says about the service ([`Topology::ask_sentinel`]).
#[derive(Debug, Clone)]
struct SentinelAnswer {
    /// The sentinel asked (`host:port`, as listed in the URL).
    sentinel: String,
    /// The primary it names (`host:port`).
    primary: String,
    /// The configuration epoch of that primary (each failover takes a new,
    /// larger one); `None` when `SENTINEL MASTER` is refused.
    epoch: Option<u64>,
    /// The sentinel's own run ID (`SENTINEL MYID`), when it tells.
    id: Option<String>,
    /// The run IDs of the other sentinels it knows for the service.
    peers: Option<Vec<String>>,
}

/// A text reply.
fn text_of(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
        Value::SimpleString(text) => Some(text.clone()),
        _ => None,
    }
}

/// The field `name` of a Sentinel reply: a flat array of names and
/// values (RESP2) or a map (RESP3).
fn field_of(value: &Value, name: &str) -> Option<String> {
    match value {
        Value::Array(items) => items
            .chunks(2)
            .find(|pair| text_of(&pair[0]).as_deref() == Some(name))
            .and_then(|pair| pair.get(1))
            .and_then(text_of),
        Value::Map(pairs) => pairs
            .iter()
            .find(|(key, _)| text_of(key).as_deref() == Some(name))
            .and_then(|(_, value)| text_of(value)),
        _ => None,
    }
}

/// Whether the sentinels that answered are of one Sentinel group: each is
/// known to another (directly or through others) by run ID. Sentinels of
/// two groups that monitor the same service name (the docs' `mymaster`
/// makes that likely) would send tenure to two primaries, that is two
/// stores. A sentinel that does not tell its run ID or peers is taken to
/// belong. The error is one line naming the sentinels that disagree.
fn one_sentinel_group(
    answers: &[SentinelAnswer],
    service: &str,
) -> std::result::Result<(), String> {
    let knows = |a: &SentinelAnswer, b: &SentinelAnswer| match (&a.peers, &b.id) {
        (Some(peers), Some(id)) => peers.contains(id),
        _ => true,
    };
    // Grow the group of the first answer until it stops growing.
    let mut group = vec![false; answers.len()];
    if let Some(first) = group.first_mut() {
        *first = true;
    }
    loop {
        let mut grew = false;
        for i in 0..answers.len() {
            if group[i] {
                continue;
            }
            let linked = (0..answers.len()).any(|j| {
                group[j] && (knows(&answers[i], &answers[j]) || knows(&answers[j], &answers[i]))
            });
            if linked {
                group[i] = true;
                grew = true;
            }
        }
        if !grew {
            break;
        }
    }
    let Some(outsider) = group.iter().position(|member| !member) else {
        return Ok(());
    };
    let (a, b) = (&answers[0], &answers[outsider]);
    Err(format!(
        "the sentinels {} and {} are of different Sentinel groups (neither knows the other; \
         they name {} and {} as the primary of {service:?}): list the sentinels of one group \
         only, or give each group's primary its own service name",
        a.sentinel, b.sentinel, a.primary, b.primary
    ))
}

/// The answer to follow: the primary of the newest configuration epoch (a
/// sentinel that has not yet heard of the last failover names the primary
/// before it, with an older epoch), the most named on a tie.
fn newest_answer(answers: &[SentinelAnswer]) -> Option<&SentinelAnswer> {
    let named = |primary: &str| answers.iter().filter(|a| a.primary == primary).count();
    answers
        .iter()
        .rev()
        .max_by_key(|a| (a.epoch.unwrap_or(0), named(&a.primary)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(
        sentinel: &str,
        primary: &str,
        epoch: u64,
        id: &str,
        peers: &[&str],
    ) -> SentinelAnswer {
        SentinelAnswer {
            sentinel: sentinel.into(),
            primary: primary.into(),
            epoch: Some(epoch),
            id: Some(id.into()),
            peers: Some(peers.iter().map(|p| p.to_string()).collect()),
        }
    }

    #[test]
    fn sentinels_of_two_groups_are_refused_by_name() {
        let one = [
            answer("s1:1", "p:1", 3, "a", &["b", "c"]),
            answer("s2:2", "p:1", 3, "b", &["a"]),
            // Knows nobody yet, but is known.
            answer("s3:3", "p:1", 3, "c", &[]),
        ];
        assert!(one_sentinel_group(&one, "svc").is_ok());
        let two = [
            answer("s1:1", "p:1", 3, "a", &["b"]),
            answer("s2:2", "p:1", 3, "b", &["a"]),
            answer("x9:9", "q:2", 1, "z", &[]),
        ];
        let err = one_sentinel_group(&two, "svc").unwrap_err();
        assert!(err.contains("s1:1") && err.contains("x9:9"), "{err}");
        assert!(err.contains("p:1") && err.contains("q:2"), "{err}");
        let mut silent = two.clone();
        silent[2].id = None;
        assert!(one_sentinel_group(&silent, "svc").is_ok(), "cannot tell");
    }

    #[test]
    fn the_newest_epoch_names_the_primary() {
        let answers = [
            answer("s1:1", "old:1", 3, "a", &[]),
            answer("s2:2", "new:2", 4, "b", &[]),
            answer("s3:3", "old:1", 3, "c", &[]),
        ];
        assert_eq!(
            newest_answer(&answers).map(|a| a.primary.as_str()),
            Some("new:2")
        );
        let mut unknown = answers.clone();
        unknown.iter_mut().for_each(|a| a.epoch = None);
        assert_eq!(
            newest_answer(&unknown).map(|a| a.primary.as_str()),
            Some("old:1")
        );
    }
}
