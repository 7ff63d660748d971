//! What tenure records through the `metrics` facade. A test binary of its
//! own: it installs the process-wide recorder.
#![cfg(feature = "metrics")]

use std::collections::HashMap;

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use tenure::{Election, MemoryStore};

/// The gauges with the label `name` = `election`, by metric name. One
/// snapshot for all: taking one resets the debugging recorder's values.
fn gauges(snapshotter: &Snapshotter, election: &str) -> HashMap<String, f64> {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter_map(|(key, _, _, value)| {
            let key = key.key();
            let ours = key
                .labels()
                .any(|l| l.key() == "name" && l.value() == election);
            match (ours, value) {
                (true, DebugValue::Gauge(v)) => Some((key.name().to_string(), v.into_inner())),
                _ => None,
            }
        })
        .collect()
}

/// The process-wide recorder's snapshotter, installed by the first test
/// that asks, and held by one test at a time (a snapshot of one test could
/// otherwise take another's values).
async fn recorder() -> (tokio::sync::MutexGuard<'static, ()>, &'static Snapshotter) {
    static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    static SNAPSHOTTER: std::sync::OnceLock<Snapshotter> = std::sync::OnceLock::new();
    let turn = ONE_AT_A_TIME.lock().await;
    let snapshotter = SNAPSHOTTER.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder
            .install()
            .expect("the only recorder of this test binary");
        snapshotter
    });
    (turn, snapshotter)
}

#[tokio::test(start_paused = true)]
async fn leadership_is_recorded_under_tenures_name_and_client_gos() {
    let (_turn, snapshotter) = recorder().await;

    let store = MemoryStore::new();
    let election = Election::builder("metered")
        .memory(&store)
        .build()
        .await
        .expect("valid settings");
    let term = election.campaign().await.expect("elected");
    let leading = gauges(snapshotter, "metered");
    for metric in ["leader_election_is_leader", "leader_election_master_status"] {
        assert_eq!(leading.get(metric), Some(&1.0), "{metric}: {leading:?}");
    }
    term.resign().await.expect("resigned");
    let resigned = gauges(snapshotter, "metered");
    for metric in ["leader_election_is_leader", "leader_election_master_status"] {
        assert_eq!(resigned.get(metric), Some(&0.0), "{metric}: {resigned:?}");
    }
}

/// Permits, permits held and callers waiting, by semaphore: summed over a
/// group's instances they say how full it is, and how many wait.
#[tokio::test(start_paused = true)]
async fn a_semaphore_records_its_permits_holders_and_waiters() {
    let (_turn, snapshotter) = recorder().await;
    let store = MemoryStore::new();
    let instance = |id: &'static str| {
        let store = store.clone();
        async move {
            Election::builder("pool")
                .memory(&store)
                .id(id)
                .semaphore(2)
                .await
                .expect("valid settings")
        }
    };
    let (a, b, c) = (
        instance("a").await,
        instance("b").await,
        instance("c").await,
    );
    // (permits, held, waiting), held and waiting over the three instances.
    // A snapshot takes each gauge's value and leaves 0 behind, so the
    // figures of held and waiting (only ever moved up or down) are the sum
    // of every snapshot's; that of permits (only ever set) the last set.
    let totals = std::cell::Cell::new((0.0, 0.0, 0.0));
    let figures = || {
        let now = gauges(snapshotter, "pool");
        let get = |metric: &str| now.get(metric).copied().unwrap_or(0.0);
        let (permits, held, waiting) = totals.get();
        let permits = match get("leader_election_semaphore_permits") {
            0.0 => permits,
            set => set,
        };
        totals.set((
            permits,
            held + get("leader_election_semaphore_held"),
            waiting + get("leader_election_semaphore_waiting"),
        ));
        totals.get()
    };
    settled(&figures, (2.0, 0.0, 0.0)).await;

    let first = a.acquire().await.expect("a permit");
    let second = b.try_acquire().await.expect("read").expect("a permit");
    settled(&figures, (2.0, 2.0, 0.0)).await;
    let waiter = tokio::spawn(async move { c.acquire().await });
    settled(&figures, (2.0, 2.0, 1.0)).await;
    first.resign().await.expect("resigned");
    let third = waiter.await.expect("no panic").expect("a permit");
    settled(&figures, (2.0, 2.0, 0.0)).await;

    // A permit dropped, or lost, is no longer held.
    drop(second);
    settled(&figures, (2.0, 1.0, 0.0)).await;
    // A waiting call that is cancelled no longer waits.
    let _other = b.acquire().await.expect("the dropped permit");
    settled(&figures, (2.0, 2.0, 0.0)).await;
    let waiter = tokio::spawn(async move { a.acquire().await });
    settled(&figures, (2.0, 2.0, 1.0)).await;
    waiter.abort();
    settled(&figures, (2.0, 2.0, 0.0)).await;
    drop(third);
}

/// Wait, in paused time, until `figures` reads `expected`: (permits, held,
/// waiting).
async fn settled(figures: &impl Fn() -> (f64, f64, f64), expected: (f64, f64, f64)) {
    for _ in 0..100 {
        if figures() == expected {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(figures(), expected, "(permits, held, waiting)");
}
