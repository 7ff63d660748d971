//! Elections and partition sets on a real Redis Cluster (3 primaries, 3
//! replicas): routing by slot, batching per node, resharding and shard
//! failover under a held term.

use crate::support;
use std::time::Duration;

use redis_process::{slot_of, RedisCluster};
use tenure::{PartitionSet, Store};
use tokio::time::timeout;

use crate::support::topo::{
    self, after_fault, contenders, election, renewed, store, until_led, TTL,
};
use crate::support::{campaign, init_logs, TermLog, HANG};

fn cluster() -> RedisCluster {
    init_logs();
    RedisCluster::start().unwrap_or_else(|err| panic!("cannot start a Redis Cluster: {err}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn elections_spread_over_every_shard_work() {
    let cluster = cluster();
    let url = cluster.url();
    let store = store(&url).await;
    let names: Vec<String> = (0..64).map(|i| format!("job-{i}")).collect();
    // All at once: each slot new to its node holds off for one ttl.
    let mut campaigns = Vec::new();
    for name in &names {
        let e = election(&store, name, "worker").await;
        campaigns.push(tokio::spawn(async move {
            let term = campaign(&e).await;
            (e, term)
        }));
    }
    let mut terms = Vec::new();
    for campaign in campaigns {
        terms.push(campaign.await.expect("campaign task"));
    }
    let mut shards = std::collections::HashSet::new();
    for (e, _) in &terms {
        let name = e.name();
        // The lease is on the primary that serves the election's slot.
        let port = cluster
            .primary_of_slot(slot_of(format!("{{{name}}}")))
            .expect("a primary");
        shards.insert(port);
        let owner = cluster
            .command(
                port,
                &["HGET", &format!("tenure:{{{name}}}:lease"), "owner"],
            )
            .expect("HGET");
        assert_eq!(owner, "worker", "{name}");
    }
    assert_eq!(shards.len(), 3, "64 names land on every shard");
    let store = tenure::Store::open(&url)
        .connect()
        .await
        .expect("store connection");
    let mut admin = store.redis_connection().expect("a Redis store");
    let mut listed = store
        .elections("tenure")
        .await
        .expect("scans every primary");
    listed.sort();
    let mut expected = names.clone();
    expected.sort();
    assert_eq!(listed, expected);
    // Fenced writes through the same connection land on each key's shard
    // (the script is loaded on every primary first).
    for (e, term) in terms.iter().take(8) {
        let marker = tenure::FencedKey::new(format!("tenure:{{{}}}:last-run", e.name()));
        let written = marker
            .set(&mut admin, term.token(), "done")
            .await
            .expect("fenced write");
        assert!(written.is_accepted());
        let stale = marker
            .set(&mut admin, term.token() - 1, "late")
            .await
            .expect("fenced write");
        assert!(!stale.is_accepted());
    }
    for (e, term) in &terms {
        let leader = store
            .leader_of("tenure", e.name())
            .await
            .expect("inspect")
            .expect("led");
        assert_eq!(leader.token, term.token());
        term.resign().await.expect("resigns");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_set_renews_with_one_round_trip_per_primary() {
    let cluster = cluster();
    let url = cluster.url();
    let partitions: Vec<String> = (0..256).map(|i| format!("orders-{i}")).collect();
    let set = PartitionSet::builder("orders", partitions)
        .redis(&url)
        .ttl(TTL)
        .id("member")
        .build()
        .await
        .expect("builds");
    let observer = set.observer();
    let checked = {
        let observer = observer.clone();
        async move {
            timeout(HANG, async {
                while observer.owned_count() < 256 {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            })
            .await
            .expect("all 256 partitions owned");
            let (c0, r0) = (observer.cycles(), observer.round_trips());
            timeout(HANG, async {
                while observer.cycles() < c0 + 5 {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            })
            .await
            .expect("five more cycles");
            let (c1, r1) = (observer.cycles(), observer.round_trips());
            // Heartbeat and 256 renewals: one pipeline to each of the 3
            // primaries per cycle (one cycle may be half counted at each end).
            let per_cycle_bound = 3 * (c1 - c0 + 1);
            assert!(
                r1 - r0 <= per_cycle_bound,
                "{} round trips in {} cycles",
                r1 - r0,
                c1 - c0
            );
            assert_eq!(observer.owned_count(), 256, "nothing lost meanwhile");
        }
    };
    set.run(
        |_partition, term| async move {
            term.lost().await;
        },
        checked,
    )
    .await
    .expect("runs");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resharding_the_slot_of_a_held_election_is_safe() {
    let cluster = cluster();
    let url = cluster.url();
    let log = TermLog::default();
    let tasks = contenders(&url, "moving", &log).await;
    let observer = election(&store(&url).await, "moving", "observer").await;
    let token = until_led(&observer).await;
    let slot = slot_of("{moving}");
    let from = cluster.primary_of_slot(slot).expect("owner");
    let to = cluster
        .primary_ports()
        .expect("primaries")
        .into_iter()
        .find(|port| *port != from)
        .expect("another primary");
    // The lease is in the store a moment before its contender has logged
    // the term.
    log.until_term_after(token.saturating_sub(1)).await;
    let term = log.current().expect("a leader");
    cluster.begin_migration(slot, to).expect("migrating");
    // Mid-migration, before the keys move: the term renews on the old owner.
    renewed(&term).await;
    cluster.migrate_keys(slot).expect("keys moved");
    // Keys moved, slot not yet: it renews through ASK on the new owner.
    renewed(&term).await;
    // A hand-over now: the next acquisition (a script over several keys,
    // some absent once the lease is gone) is refused with TRYAGAIN until
    // the slot has moved, then goes through.
    let resigned = log.resign_current().await.expect("a leader");
    assert!(resigned >= token);
    cluster.finish_migration(slot).expect("slot moved");
    log.until_term_after(resigned).await;
    assert_eq!(cluster.primary_of_slot(slot).expect("owner"), to);
    let _term = after_fault(&url, "moving", &log, tasks).await;
    let owner_port = cluster.primary_of_slot(slot).expect("owner");
    let owner = cluster
        .command(owner_port, &["HGET", "tenure:{moving}:lease", "owner"])
        .expect("HGET");
    assert_eq!(owner, "observer", "the new term lives on the new owner");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_of_the_elections_shard_is_safe() {
    let cluster = cluster();
    let url = cluster.url();
    let log = TermLog::default();
    let tasks = contenders(&url, "shard", &log).await;
    let observer = election(&store(&url).await, "shard", "observer").await;
    until_led(&observer).await;
    let primary = cluster.primary_of_slot(slot_of("{shard}")).expect("owner");
    let cluster = tokio::task::spawn_blocking(move || {
        cluster.failover(primary).expect("CLUSTER FAILOVER");
        cluster
    })
    .await
    .expect("joins");
    after_fault(&url, "shard", &log, tasks).await;
    drop(cluster);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_elections_shard_primary_is_safe() {
    let cluster = cluster();
    let url = cluster.url();
    let log = TermLog::default();
    let tasks = contenders(&url, "crash", &log).await;
    let observer = election(&store(&url).await, "crash", "observer").await;
    until_led(&observer).await;
    let primary = cluster.primary_of_slot(slot_of("{crash}")).expect("owner");
    let cluster = tokio::task::spawn_blocking(move || {
        cluster.kill(primary).expect("kill -9");
        cluster
            .wait_for_failover(primary)
            .expect("the replica takes over");
        cluster
    })
    .await
    .expect("joins");
    after_fault(&url, "crash", &log, tasks).await;
    drop(cluster);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_url_for_a_single_server_is_a_clear_error() {
    let server = support::redis();
    let url = format!("redis+cluster://127.0.0.1:{}", server.port());
    let err = Store::redis(&url)
        .connect()
        .await
        .expect_err("not a cluster");
    let text = err.to_string();
    assert!(text.contains("not in cluster mode"), "{text}");
    assert!(!err.is_transient());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resign_wakes_the_follower_through_sharded_pub_sub() {
    let cluster = cluster();
    let owner = cluster
        .primary_of_slot(slot_of("{handover}"))
        .expect("owner");
    let node = cluster.node(owner).expect("node");
    topo::a_resign_wakes_the_follower(&cluster.url(), node).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_promoted_replica_of_a_shard_holds_off_before_its_first_lease() {
    let cluster = cluster();
    let url = cluster.url();
    let e = election(&store(&url).await, "holdoff", "a").await;
    campaign(&e).await.resign().await.expect("resigns");
    let primary = cluster
        .primary_of_slot(slot_of("{holdoff}"))
        .expect("owner");
    let cluster = tokio::task::spawn_blocking(move || {
        cluster.failover(primary).expect("CLUSTER FAILOVER");
        cluster
    })
    .await
    .expect("joins");
    topo::holds_off_after_the_failover(&url, "holdoff").await;
    drop(cluster);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failback_of_a_shard_holds_off_like_a_failover() {
    let cluster = cluster();
    let url = cluster.url();
    let e = election(&store(&url).await, "failback", "a").await;
    campaign(&e).await.resign().await.expect("resigns");
    let first = cluster
        .primary_of_slot(slot_of("{failback}"))
        .expect("owner");
    let cluster = tokio::task::spawn_blocking(move || {
        let replica = cluster.failover(first).expect("away");
        let back = cluster.failover(replica).expect("back");
        assert_eq!(back, first, "failed back to the first primary");
        cluster
    })
    .await
    .expect("joins");
    topo::holds_off_after_the_failover(&url, "failback").await;
    drop(cluster);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_node_does_not_stop_the_other_shards() {
    let cluster = cluster();
    let url = cluster.url();
    let shared = store(&url).await;
    // The node that serves slot 0 is the first a slot-map refresh meets.
    let silent = cluster.primary_of_slot(0).expect("owner of slot 0");
    let name_on = |want_silent: bool| {
        (0..)
            .map(|i| format!("e{i}"))
            .find(|name| {
                let port = cluster
                    .primary_of_slot(slot_of(format!("{{{name}}}")))
                    .expect("owner");
                (port == silent) == want_silent
            })
            .expect("a name")
    };
    let (on_silent, elsewhere) = (name_on(true), name_on(false));
    let doomed = campaign(&election(&shared, &on_silent, "a").await).await;
    let other = election(&shared, &elsewhere, "a").await;
    let kept = campaign(&other).await;
    cluster
        .node(silent)
        .expect("node")
        .pause()
        .expect("SIGSTOP");
    // The term on the silent node ends at its deadline...
    timeout(HANG, doomed.lost()).await.expect("lost");
    let lost_at = tokio::time::Instant::now();
    // ...while the other shard's term keeps renewing through the same store.
    timeout(HANG, async {
        while kept.deadline() < lost_at + TTL / 2 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("renewed after the silent node's term ended");
    assert!(kept.is_leader(), "{:?}", kept.lost_reason());
    cluster
        .node(silent)
        .expect("node")
        .unpause()
        .expect("SIGCONT");
}

/// A cluster node given as a plain `redis://` URL: one line that says it
/// is a cluster node and which URL to use, whether or not the election's
/// slot is on that node (it used to fail with "Moved: …" for a slot
/// elsewhere, and repeat `CROSSSLOT` for a slot of its own).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_node_given_as_a_single_server_is_a_clear_error() {
    let cluster = cluster();
    let port = cluster.primary_of_slot(0).expect("owner of slot 0");
    let url = format!("redis://127.0.0.1:{port}");
    let local = (0..)
        .map(|i| format!("n{i}"))
        .find(|name| cluster.primary_of_slot(slot_of(format!("{{{name}}}"))).ok() == Some(port))
        .expect("a name on the node");
    let remote = (0..)
        .map(|i| format!("n{i}"))
        .find(|name| cluster.primary_of_slot(slot_of(format!("{{{name}}}"))).ok() != Some(port))
        .expect("a name elsewhere");
    for name in [local, remote] {
        let result = timeout(HANG, async {
            let e = tenure::Election::builder(&name).redis(&url).build().await?;
            e.try_campaign().await
        })
        .await
        .expect("no hang");
        let err = result.expect_err("a cluster node is no single server");
        let text = err.to_string();
        assert!(text.contains("is a Redis Cluster node"), "{name}: {text}");
        assert!(text.contains("redis+cluster://"), "{text}");
        assert!(!text.contains('\n'), "{text}");
        assert!(!err.is_transient(), "{text}");
    }
}

/// Seeds of two clusters are two stores: refused with one line naming a
/// node of each, not "the first slot map to answer wins".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seeds_of_two_clusters_are_refused() {
    let (a, b) = (cluster(), cluster());
    let (a_ports, b_ports) = (a.primary_ports().expect("A"), b.primary_ports().expect("B"));
    let mixed = format!(
        "redis+cluster://127.0.0.1:{},127.0.0.1:{},127.0.0.1:{}",
        b_ports[0], a_ports[0], a_ports[1]
    );
    let err = timeout(HANG, Store::redis(&mixed).connect())
        .await
        .expect("no hang")
        .expect_err("two clusters");
    let text = err.to_string();
    assert!(text.contains("different Redis Clusters"), "{text}");
    assert!(
        text.contains(&format!("127.0.0.1:{}", b_ports[0])),
        "{text}"
    );
    assert!(!text.contains('\n'), "{text}");
    assert!(!err.is_transient(), "{text}");
}

/// Log lines written while a [`Captured`] is the thread's subscriber.
#[derive(Clone, Default)]
struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl Captured {
    fn text(&self) -> String {
        let bytes = self.0.lock().unwrap_or_else(|p| p.into_inner());
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let mut bytes = self.0.lock().unwrap_or_else(|p| p.into_inner());
        bytes.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Captured {
    type Writer = Captured;
    fn make_writer(&'a self) -> Captured {
        self.clone()
    }
}

/// With Redis's default `cluster-require-full-coverage yes`, every node
/// refuses every command while one shard fails over, so terms on healthy
/// shards end too: connecting says so, naming the setting, and does not
/// refuse (it costs terms, never safety). With `no`, nothing is said.
#[tokio::test]
async fn full_coverage_is_warned_about_when_connecting() {
    use tracing_subscriber::util::SubscriberInitExt;
    let captured = Captured::default();
    let _logs = tracing_subscriber::fmt()
        .with_writer(captured.clone())
        .with_ansi(false)
        .with_max_level(tracing_subscriber::filter::LevelFilter::WARN)
        .finish()
        .set_default();
    let default = RedisCluster::start().expect("a cluster");
    drop(store(&default.url()).await);
    let text = captured.text();
    assert!(text.contains("cluster-require-full-coverage"), "{text}");
    assert!(
        text.contains("cluster-require-full-coverage no"),
        "the fix: {text}"
    );
    drop(default);
    let before = captured.text().len();
    let partial = RedisCluster::builder()
        .full_coverage(false)
        .start()
        .expect("a cluster");
    drop(store(&partial.url()).await);
    let after = captured.text()[before..].to_string();
    assert!(!after.contains("full-coverage"), "{after}");
    // A user that may not run CONFIG: said, and carried on.
    for port in partial.ports() {
        partial
            .command(
                port,
                &[
                    "ACL", "SETUSER", "noconf", "on", ">pw", "~*", "&*", "+@all", "-config",
                ],
            )
            .expect("ACL SETUSER");
    }
    let limited = partial
        .url()
        .replace("redis+cluster://", "redis+cluster://noconf:pw@");
    drop(store(&limited).await);
    let after = captured.text()[before..].to_string();
    assert!(
        after.contains("cannot read cluster-require-full-coverage"),
        "{after}"
    );
}

/// A killed primary costs the elections of the other shards nothing when
/// the cluster serves the slots it still covers
/// (`cluster-require-full-coverage no`): their terms renew through the
/// failover. (With `yes` every node answers CLUSTERDOWN for about 2 s and
/// every one of these terms ends.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_shard_primary_costs_the_other_shards_nothing() {
    init_logs();
    let cluster = RedisCluster::builder()
        .full_coverage(false)
        .start()
        .expect("a cluster");
    let url = cluster.url();
    let killed = cluster.primary_of_slot(0).expect("owner of slot 0");
    let mut names = Vec::new();
    for port in cluster.primary_ports().expect("primaries") {
        if port == killed {
            continue;
        }
        let name = (0..)
            .map(|i| format!("k{i}"))
            .find(|name| cluster.primary_of_slot(slot_of(format!("{{{name}}}"))).ok() == Some(port))
            .expect("a name on the shard");
        names.push(name);
    }
    let shared = store(&url).await;
    let mut terms = Vec::new();
    for name in &names {
        let e = election(&shared, name, "a").await;
        terms.push((campaign(&e).await, e));
    }
    let cluster = tokio::task::spawn_blocking(move || {
        cluster.kill(killed).expect("kill -9");
        cluster
            .wait_for_failover(killed)
            .expect("the replica takes over");
        cluster
    })
    .await
    .expect("joins");
    for (term, _) in &terms {
        // Renewed after the failover, never lost meanwhile.
        renewed(term).await;
        assert!(term.is_leader(), "{:?}", term.lost_reason());
    }
    drop(cluster);
}
