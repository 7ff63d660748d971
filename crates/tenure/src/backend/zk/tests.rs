//! Unit tests of the ZooKeeper backend against a real ensemble
//! (zk-process), for what the public API cannot set up on purpose.

use std::time::Duration;

use tokio::time::Instant;

use super::*;
use crate::machine::{AcquireReply, AcquireRequest};

const TTL_MS: u64 = 4_000;

async fn store(url: &str) -> ZkStore {
    ZkStore::connect(url, Duration::from_secs(2), ZkBugs::default())
        .await
        .expect("connected")
}

/// Two candidates that read one counter in the same millisecond compute
/// the same token, and only one `multi` commits. The loser's pending term,
/// its answer lost (its campaign was cancelled), is left to the sweep: a
/// ttl later the sweep must clear its own session's znodes only, never
/// the winner's lease and witness of that same token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sweep_never_clears_another_sessions_term_of_the_same_token() {
    let ensemble = zk_process::ZkEnsemble::builder()
        .tick_time(Duration::from_millis(100))
        .start()
        .expect("a ZooKeeper ensemble");
    let url = ensemble.url();
    let (loser, winner) = (store(&url).await, store(&url).await);
    let at = Address::new("tenure", "same-token");
    let request = AcquireRequest {
        id: "winner",
        attempt: "w.1",
        ttl_ms: TTL_MS,
        hold_off_ms: TTL_MS,
    };
    let token = match winner.acquire(at, &request).await.expect("answers") {
        AcquireReply::Won { token } => token,
        other => panic!("a free election: {other:?}"),
    };
    // The loser's term of that token, pending since a ttl ago on its own
    // session, as a commit whose answer never came.
    let session = loser.session(TTL_MS).await.expect("a session");
    let paths = loser.paths(at).expect("paths");
    let long_ago = Instant::now() - Duration::from_millis(TTL_MS + 1);
    assert!(loser.pend_term(&paths, token, TTL_MS, session.session_id().0, long_ago));
    loser.sweep().await;
    assert!(!loser.is_kept(&paths.lease, token), "the loser forgot it");
    let client = winner.session(TTL_MS).await.expect("the winner's session");
    assert!(
        winner
            .still_holds(&client, &paths, token)
            .await
            .expect("answers"),
        "the winner's lease and witness are still there"
    );
}
