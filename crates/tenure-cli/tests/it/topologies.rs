//! `tenure run` and `tenure status` end to end on Redis Sentinel and Redis
//! Cluster: `--store URL` with the topology schemes.

use crate::support;
use nix::sys::signal::Signal;
use redis_process::{slot_of, RedisCluster, SentinelGroup};

use crate::support::{eventually, status, tokens, Instance, Scratch, LONG_JOB};

#[test]
fn run_hands_over_and_status_reports_through_sentinel() {
    let group = SentinelGroup::start().expect("a Sentinel group");
    let url = group.url();
    let scratch = Scratch::new("sentinel-run");
    let mut a = Instance::start(&url, "nightly", "a", &[], LONG_JOB, &scratch);
    eventually("a leads", || !tokens(&scratch, "a").is_empty());
    let b = Instance::start(&url, "nightly", "b", &[], LONG_JOB, &scratch);
    eventually("status shows a", || {
        status(&url) == [("nightly".to_string(), Some("a".to_string()))]
    });
    // A graceful stop hands over to b.
    a.signal(Signal::SIGTERM);
    assert_eq!(a.wait(), 0, "{}", a.log());
    eventually("b leads", || !tokens(&scratch, "b").is_empty());
    assert!(tokens(&scratch, "b")[0] > tokens(&scratch, "a")[0]);
    eventually("status shows b", || {
        status(&url) == [("nightly".to_string(), Some("b".to_string()))]
    });
    drop(b);
}

#[test]
fn run_and_status_cover_every_shard_of_a_cluster() {
    let cluster = RedisCluster::start().expect("a Redis Cluster");
    let url = cluster.url();
    let scratch = Scratch::new("cluster-run");
    // Three election names on three different shards.
    let mut names: Vec<String> = Vec::new();
    let mut shards = std::collections::HashSet::new();
    for i in 0.. {
        let name = format!("job-{i}");
        let shard = cluster
            .primary_of_slot(slot_of(format!("{{{name}}}")))
            .expect("owner");
        if shards.insert(shard) {
            names.push(name);
        }
        if names.len() == 3 {
            break;
        }
    }
    let instances: Vec<Instance> = names
        .iter()
        .map(|name| Instance::start(&url, name, name, &[], LONG_JOB, &scratch))
        .collect();
    for name in &names {
        eventually("every election is led", || {
            !tokens(&scratch, name).is_empty()
        });
    }
    let mut expected: Vec<(String, Option<String>)> = names
        .iter()
        .map(|name| (name.clone(), Some(name.clone())))
        .collect();
    expected.sort();
    eventually("status lists every shard's elections", || {
        status(&url) == expected
    });
    drop(instances);
}

#[test]
fn status_on_a_cluster_with_a_silent_primary_lists_the_rest() {
    let cluster = RedisCluster::start().expect("a Redis Cluster");
    let url = cluster.url();
    let scratch = Scratch::new("cluster-silent");
    let mut names: Vec<String> = Vec::new();
    let mut shards = Vec::new();
    for i in 0.. {
        let name = format!("job-{i}");
        let shard = cluster
            .primary_of_slot(slot_of(format!("{{{name}}}")))
            .expect("owner");
        if !shards.contains(&shard) {
            shards.push(shard);
            names.push(name);
        }
        if names.len() == 3 {
            break;
        }
    }
    let instances: Vec<Instance> = names
        .iter()
        .map(|name| Instance::start(&url, name, name, &[], LONG_JOB, &scratch))
        .collect();
    eventually("every election is led", || status(&url).len() == 3);
    let silent = shards[0];
    cluster.pause(silent).expect("SIGSTOP");
    let out = support::tenure_output(&["status", "--json", "--store", &url]);
    cluster.unpause(silent).expect("SIGCONT");
    assert_eq!(out.status.code(), Some(69), "{out:?}");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let mut listed: Vec<&str> = json["elections"]
        .as_array()
        .expect("an array")
        .iter()
        .filter_map(|e| e["name"].as_str())
        .collect();
    listed.sort();
    let mut readable: Vec<&str> = names[1..].iter().map(String::as_str).collect();
    readable.sort();
    assert_eq!(listed, readable, "{json}");
    let node = format!("127.0.0.1:{silent}");
    assert_eq!(json["unreadable_nodes"][0]["node"], node.as_str(), "{json}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(&node), "{stderr}");
    drop(instances);
}
