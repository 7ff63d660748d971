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

#[tokio::test(start_paused = true)]
async fn leadership_is_recorded_under_tenures_name_and_client_gos() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder
        .install()
        .expect("the only recorder of this test binary");

    let store = MemoryStore::new();
    let election = Election::builder("metered")
        .memory(&store)
        .build()
        .await
        .expect("valid settings");
    let term = election.campaign().await.expect("elected");
    let leading = gauges(&snapshotter, "metered");
    for metric in ["leader_election_is_leader", "leader_election_master_status"] {
        assert_eq!(leading.get(metric), Some(&1.0), "{metric}: {leading:?}");
    }
    term.resign().await.expect("resigned");
    let resigned = gauges(&snapshotter, "metered");
    for metric in ["leader_election_is_leader", "leader_election_master_status"] {
        assert_eq!(resigned.get(metric), Some(&0.0), "{metric}: {resigned:?}");
    }
}
