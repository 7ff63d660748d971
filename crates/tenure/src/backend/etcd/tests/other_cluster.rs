//! Answers from another cluster than the one first reached (a restore
//! under a new cluster token, behind an address that stayed) are refused.

use std::sync::Arc;

use futures_util::future::FutureExt;

use super::{answered, lease_known_elsewhere};
use crate::Error;

/// A keep-alive answered by another cluster that has a lease of the
/// same id renews nothing here: it is refused, never taken for a
/// renewal of this cluster's lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keep_alive_answered_by_another_cluster_is_refused() {
    let (_clusters, _proxy, store, lease) = lease_known_elsewhere().await;
    let store = Arc::new(store);
    let kept = answered(|| {
        let store = store.clone();
        async move { store.keep_alive(lease).await }.boxed()
    })
    .await;
    assert!(matches!(kept, Err(Error::Unsafe { .. })), "{kept:?}");
}

/// Another cluster's lease lookups, grants and key listings are
/// refused too: its word that a lease is gone would let a run be
/// repeated early (the last-run marker's age), and a lease it granted
/// is none of this cluster's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_answers_and_listings_from_another_cluster_are_refused() {
    let (_clusters, _proxy, store, lease) = lease_known_elsewhere().await;
    let store = Arc::new(store);
    let left = answered(|| {
        let store = store.clone();
        async move { store.ttl_left(lease).await }.boxed()
    })
    .await;
    assert!(matches!(left, Err(Error::Unsafe { .. })), "{left:?}");
    let granted = store.grant(2_000).await;
    assert!(matches!(granted, Err(Error::Unsafe { .. })), "{granted:?}");
    let listed = store.list_elections("tenure").await;
    assert!(matches!(listed, Err(Error::Unsafe { .. })), "{listed:?}");
}
