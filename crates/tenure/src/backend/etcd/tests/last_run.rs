//! The last-run marker against a real member: a record whose transaction
//! is refused because a hedged copy of it committed first is a record
//! made, not one to undo.

use etcd_client::PutOptions;

use super::one_member;
use crate::backend::address::Address;
use crate::backend::etcd::codec::{wall_ms, MAGIC};
use crate::backend::etcd::layout::last_run_key;
use crate::machine::{AcquireReply, AcquireRequest};

const KEEP_MS: u64 = 3_600_000;

/// A claim is sent twice (the hedge): the copy that reached a member
/// first commits, on the new lease; the other is refused by the marker
/// that copy wrote. Settling the refusal must keep that marker: revoking
/// its lease, as the code did before, deleted the record, and the next
/// leader found no slot claimed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_refused_because_its_hedged_copy_committed_is_kept() {
    let (_cluster, store) = one_member().await;
    let at = Address::new("tenure", "nightly");
    let request = AcquireRequest {
        id: "owner",
        attempt: "1",
        ttl_ms: 5_000,
        hold_off_ms: 5_000,
    };
    let AcquireReply::Won { token } = store.acquire(at, &request).await.expect("acquire") else {
        panic!("the first candidate wins");
    };
    let first = 1_796_263_200_000;
    let recorded = store.record_run(at, "owner", token, KEEP_MS, Some(first));
    assert!(recorded.await.expect("record"));
    let marker = last_run_key(at).expect("a key");
    let previous = store.get(&marker).await.expect("read").expect("a marker");

    // The committed copy of the next claim, on its own new lease.
    let second = first + 60_000;
    let lease = store.lease_grant(3600).await.expect("grant").id();
    let value = format!("{MAGIC}\nlast-run\n{token}\nowner\n{}\n{second}", wall_ms());
    let key = marker.clone();
    store
        .call(|mut c| {
            let (key, value) = (key.clone(), value.clone());
            async move {
                c.put(key, value, Some(PutOptions::new().with_lease(lease)))
                    .await
            }
        })
        .await
        .expect("put");

    let settled = store.settle_refused_claim(&marker, lease, previous.lease());
    assert!(settled.await.expect("settle"), "the claim was made");
    let kept = store
        .last_run(at)
        .await
        .expect("read")
        .expect("the marker stays");
    assert_eq!(kept.slot, Some(second));

    // A claim that really was refused (the marker is on another lease):
    // its own lease goes, the marker stays.
    let refused = store.lease_grant(3600).await.expect("grant").id();
    let settled = store.settle_refused_claim(&marker, refused, lease);
    assert!(!settled.await.expect("settle"), "refused");
    let kept = store
        .last_run(at)
        .await
        .expect("read")
        .expect("the marker stays");
    assert_eq!(kept.slot, Some(second));
}
