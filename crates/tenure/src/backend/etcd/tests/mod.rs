//! Unit tests of the etcd backend; those against a real cluster start
//! their own member (etcd-process). The shared fixtures are here, the
//! tests in one file per topic.

use std::time::Duration;

use super::*;

mod hedges;
mod last_run;
mod other_cluster;
mod terms;
mod urls;

pub(super) fn target(url: &str) -> EtcdTarget {
    EtcdTarget {
        url: url.to_string(),
        tls_ca: None,
        tls_cert: None,
        tls_key: None,
        bugs: EtcdBugs::default(),
    }
}

/// A one-member cluster (stopped when dropped) and a store on it.
pub(super) async fn one_member() -> (etcd_process::EtcdCluster, EtcdStore) {
    let cluster = etcd_process::EtcdCluster::builder()
        .members(1)
        .election_timeout(Duration::from_millis(500))
        .start()
        .expect("an etcd member");
    let store = EtcdStore::connect(target(&cluster.url()), Duration::from_secs(2))
        .await
        .expect("connected");
    (cluster, store)
}

/// A store on one cluster whose only endpoint (a proxy) is then
/// pointed at another one-member cluster that has a lease of the same
/// id as the store's session lease, as a restore of the first
/// cluster's snapshot under a new cluster token does (it keeps the
/// leases, and the cluster id changes); and that lease.
pub(super) async fn lease_known_elsewhere() -> (
    [etcd_process::EtcdCluster; 2],
    etcd_process::Proxy,
    EtcdStore,
    i64,
) {
    let start = || {
        etcd_process::EtcdCluster::builder()
            .members(1)
            .election_timeout(Duration::from_millis(500))
            .start()
            .expect("an etcd member")
    };
    let (first, other) = (start(), start());
    let proxy = etcd_process::Proxy::start(first.client_port(0)).expect("a proxy");
    let url = format!("etcd://127.0.0.1:{}", proxy.port());
    let store = EtcdStore::connect(target(&url), Duration::from_secs(2))
        .await
        .expect("connected");
    let (lease, _) = store.session("me", 2_000).await.expect("a session lease");
    let grant = format!(r#"{{"TTL":"60","ID":"{lease}"}}"#);
    other
        .post(0, "/v3/lease/grant", &grant)
        .expect("the same lease id on the other cluster");
    proxy.retarget(other.client_port(0));
    ([first, other], proxy, store, lease)
}

/// `call` until it has an answer that is not a transient error: a call
/// in flight when the proxy closed its connection fails.
pub(super) async fn answered<T>(
    call: impl Fn() -> futures_util::future::BoxFuture<'static, Result<T>>,
) -> Result<T> {
    tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            match call().await {
                Err(err) if err.is_transient() => {
                    tokio::time::sleep(Duration::from_millis(20)).await
                }
                other => return other,
            }
        }
    })
    .await
    .expect("an answer")
}
