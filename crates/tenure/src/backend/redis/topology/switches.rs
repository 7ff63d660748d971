//! Following a Sentinel failover as it is announced: a `+switch-master`
//! subscription on every sentinel, each its own task, that makes the
//! topology ask for the primary again. Apart because these tasks outlive
//! every call.

use std::sync::Weak;
use std::time::Duration;

use futures_util::StreamExt;
use tokio_util::sync::CancellationToken;

use super::super::target::RedisTarget;
use super::url::{host_and_port, Layout};
use super::Topology;
use crate::{Error, Result};

/// Sentinel: listen for `+switch-master` on `sentinel` and stop using the
/// old primary as soon as one is announced, instead of at the next failed
/// call. One of these runs for every sentinel of the URL: a failover is
/// announced by every sentinel that takes part, so one hung sentinel (or
/// one cut off) cannot keep the news from a leader that listens to the
/// others.
pub(super) async fn watch_switches(
    topology: Weak<Topology>,
    sentinel: String,
    stop: CancellationToken,
) {
    let mut backoff = Duration::from_millis(100);
    loop {
        let Some((service, target)) = sentinel_target(&topology, &sentinel) else {
            return;
        };
        let mut subscribed = false;
        let session = listen(&topology, &target, &service, &mut subscribed);
        tokio::select! {
            _ = stop.cancelled() => return,
            ended = session => {
                if let Err(err) = ended {
                    tracing::debug!(%sentinel, error = %err, "+switch-master subscription failed");
                    if subscribed {
                        // A failed call (the keepalive ping): the sentinel
                        // may have announced a switch we did not hear.
                        forget_current_primary(&topology);
                    }
                } else {
                    backoff = Duration::from_millis(100);
                }
            }
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

/// The service of `topology` and how to reach `sentinel`, for
/// [`watch_switches`]; `None` once the topology is gone (or is not
/// Sentinel's).
fn sentinel_target(topology: &Weak<Topology>, sentinel: &str) -> Option<(String, RedisTarget)> {
    let strong = topology.upgrade()?;
    let Layout::Sentinel {
        service,
        sentinel_userinfo,
        ..
    } = &strong.url.layout
    else {
        return None;
    };
    let service = service.clone();
    let target = RedisTarget {
        url: strong
            .url
            .sentinel_url(sentinel, sentinel_userinfo.as_deref()),
        tls_ca: strong.target.tls_ca.clone(),
    };
    drop(strong);
    Some((service, target))
}

/// One subscription of [`watch_switches`] to the sentinel at `target`,
/// until it fails or ends; `subscribed` once it has subscribed.
async fn listen(
    topology: &Weak<Topology>,
    target: &RedisTarget,
    service: &str,
    subscribed: &mut bool,
) -> Result<()> {
    let limit = Duration::from_secs(5);
    let pubsub = target
        .endpoint()?
        .pubsub(limit)
        .await
        .map_err(|e| target.classify(e))?;
    let (mut sink, mut messages) = pubsub.split();
    tokio::time::timeout(limit, sink.subscribe("+switch-master"))
        .await
        .map_err(|_| Error::Timeout(limit))?
        .map_err(|e| target.classify(e))?;
    // A switch may have been announced while we were not listening:
    // check the primary again at the next call.
    forget_current_primary(topology);
    *subscribed = true;
    // A half-open connection delivers nothing: ping it.
    let mut keepalive = tokio::time::interval(limit);
    keepalive.tick().await;
    loop {
        let message = tokio::select! {
            message = messages.next() => message,
            _ = keepalive.tick() => {
                tokio::time::timeout(limit, sink.ping::<()>())
                    .await
                    .map_err(|_| Error::Timeout(limit))?
                    .map_err(|e| target.classify(e))?;
                continue;
            }
        };
        let Some(message) = message else {
            return Ok::<(), Error>(());
        };
        // "SERVICE OLD-IP OLD-PORT NEW-IP NEW-PORT"
        let payload = String::from_utf8_lossy(message.get_payload_bytes()).into_owned();
        let mut words = payload.split(' ');
        if words.next() != Some(service) {
            continue;
        }
        let old = match (
            words.next(),
            words.next().and_then(|p| p.parse::<u16>().ok()),
        ) {
            (Some(host), Some(port)) => host_and_port(host, port),
            _ => continue,
        };
        let Some(topology) = topology.upgrade() else {
            return Ok(());
        };
        tracing::info!(%payload, "Sentinel announced a new primary");
        topology.forget_primary(&old);
    }
}

/// Ask the sentinels for the primary again at the next call.
fn forget_current_primary(topology: &Weak<Topology>) {
    if let Some(topology) = topology.upgrade() {
        let current = topology.lock().primary.as_ref().map(|n| n.addr.clone());
        if let Some(current) = current {
            topology.forget_primary(&current);
        }
    }
}
