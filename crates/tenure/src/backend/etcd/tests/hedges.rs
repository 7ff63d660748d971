//! Hedged sends: a stopped member costs one call a second hedge at most,
//! never every third call.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use etcd_client::Client;

use super::super::calls::{send, Clients};

/// A follower member stopped (SIGSTOP) holds every call sent to it. Here
/// the balanced client is that member's own, so every call's first send
/// is held and each call is hedged; the hedges begin at the stopped
/// member too. The first call learns which member answers: every later
/// call is answered by its first hedge (two sends), where a counter
/// shared by the calls sent every third call's first hedge to the stopped
/// member, and that call's answer waited for a third send.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_one_call_the_hedges_avoid_a_stopped_member() {
    let cluster = etcd_process::EtcdCluster::builder()
        .members(3)
        .election_timeout(Duration::from_millis(500))
        .start()
        .expect("an etcd cluster");
    let leader = tokio::task::block_in_place(|| cluster.wait_for_leader(Duration::from_secs(30)))
        .expect("a leader");
    let stopped = (leader + 1) % 3;
    let mut members = Vec::new();
    for endpoint in cluster.endpoints() {
        members.push(Client::connect([endpoint], None).await.expect("connected"));
    }
    let clients = Clients {
        balanced: members[stopped].clone(),
        members: Arc::new(members),
        answered: Arc::new(AtomicUsize::new(stopped)),
        no_hedges: false,
    };
    cluster.pause(stopped).expect("paused");
    let requests = AtomicU64::new(0);
    let mut sends = Vec::new();
    for _ in 0..6 {
        let before = requests.load(Ordering::Relaxed);
        // A patience far above a live member's answer time even on a
        // loaded machine: a send that waits for it was due to a stopped
        // member, never to a slow one.
        let got = send(
            &clients,
            &requests,
            Duration::from_millis(1500),
            |mut c| async move { c.get("tenure/hedges", None).await },
        )
        .await;
        got.expect("answered by a running member");
        sends.push(requests.load(Ordering::Relaxed) - before);
    }
    cluster.resume(stopped).expect("resumed");
    assert_eq!(
        sends[0], 3,
        "the first hedge went to the stopped member: {sends:?}"
    );
    assert!(
        sends[1..].iter().all(|&n| n == 2),
        "every later call is answered by its first hedge: {sends:?}"
    );
}
