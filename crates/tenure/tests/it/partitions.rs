//! Partition sets against a real Redis: fair shares, takeover after a
//! crash, a newcomer getting its share, and clean hand-over on shutdown.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::{redis, Crashable, HANG};
use tenure::{FencedKey, FencedWrite, PartitionObserver, PartitionSet};
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(1);
const PARTITIONS: usize = 32;

/// One fenced write by a member's work: (partition, member, token, when, accepted).
type Write = (String, String, u64, Instant, bool);
/// Every fenced write any member's work made.
type Journal = Arc<Mutex<Vec<Write>>>;

fn partitions() -> Vec<String> {
    (0..PARTITIONS).map(|p| format!("orders-{p}")).collect()
}

/// A member whose work writes to each owned partition's fenced key every 20 ms.
struct Member {
    observer: PartitionObserver,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    runtime: Crashable,
}

impl Member {
    /// Start on a runtime of its own, so that `crash` can make it vanish.
    fn start(url: &str, id: &str, journal: &Journal) -> Member {
        Member::start_with_ttl(url, id, journal, TTL)
    }

    fn start_with_ttl(url: &str, id: &str, journal: &Journal, ttl: Duration) -> Member {
        let runtime = Crashable::start();
        let (url, id, journal) = (url.to_string(), id.to_string(), journal.clone());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (observer_tx, observer_rx) = std::sync::mpsc::channel();
        runtime.spawn(async move {
            let set = PartitionSet::builder("orders", partitions())
                .redis(&url)
                .ttl(ttl)
                .id(&id)
                .build()
                .await
                .expect("valid partition set");
            let _ = observer_tx.send(set.observer());
            let client = redis::Client::open(url.as_str()).expect("valid url");
            let conn = client
                .get_multiplexed_async_connection()
                .await
                .expect("redis is up");
            let work = move |partition: String, term: tenure::Leadership| {
                let (mut conn, journal, id) = (conn.clone(), journal.clone(), id.clone());
                async move {
                    let key = FencedKey::new(format!("data:{{{partition}}}"));
                    while term.is_leader() {
                        let at = Instant::now();
                        if let Ok(outcome) = key.set(&mut conn, term.token(), id.as_str()).await {
                            let accepted = outcome == FencedWrite::Accepted;
                            journal.lock().unwrap().push((
                                partition.clone(),
                                id.clone(),
                                term.token(),
                                at,
                                accepted,
                            ));
                        }
                        tokio::select! {
                            _ = term.lost() => break,
                            _ = tokio::time::sleep(Duration::from_millis(20)) => {}
                        }
                    }
                }
            };
            let _ = set
                .run(work, async {
                    let _ = stopped.await;
                })
                .await;
        });
        let observer = observer_rx.recv_timeout(HANG).expect("the set was built");
        Member {
            observer,
            stop: Some(stop),
            runtime,
        }
    }

    fn owned(&self) -> usize {
        self.observer.owned().len()
    }

    /// Graceful: stop the work, release everything, leave the group.
    fn shut_down(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let deadline = std::time::Instant::now() + HANG;
        while self.owned() > 0 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Vanish without releasing anything.
    fn crash(&mut self) {
        self.runtime.crash();
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        // Before `stop` is dropped, which would begin a graceful shutdown.
        self.crash();
    }
}

/// Owner of every partition, read from Redis.
async fn owners(url: &str) -> BTreeMap<String, String> {
    let store = tenure::Store::open(url).connect().await.unwrap();
    let mut owners = BTreeMap::new();
    for partition in partitions() {
        if let Some(leader) = store.leader_of("tenure", &partition).await.unwrap() {
            owners.insert(partition, leader.id);
        }
    }
    owners
}

async fn eventually(what: &str, mut condition: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + HANG;
    while !condition().await {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// No partition's writes ever interleave two members: once another member
/// wrote, the earlier one never wrote (let alone was accepted) again.
fn assert_no_two_acting_owners(journal: &Journal) {
    let entries = journal.lock().unwrap().clone();
    let mut by_partition: BTreeMap<&str, Vec<&Write>> = BTreeMap::new();
    for entry in &entries {
        by_partition
            .entry(entry.0.as_str())
            .or_default()
            .push(entry);
    }
    for (partition, mut writes) in by_partition {
        writes.sort_by_key(|w| w.3);
        let mut finished: Vec<&str> = Vec::new();
        let mut current: Option<&str> = None;
        for write in writes {
            let member = write.1.as_str();
            if current != Some(member) {
                assert!(
                    !finished.contains(&member),
                    "{partition}: {member} wrote again after another owner started"
                );
                if let Some(previous) = current {
                    finished.push(previous);
                }
                current = Some(member);
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_members_share_32_partitions_fairly_and_survivors_take_over_a_crash() {
    let server = redis();
    let url = server.url();
    let journal: Journal = Arc::default();
    let mut members: Vec<Member> = ["m1", "m2", "m3", "m4"]
        .iter()
        .map(|id| Member::start(&url, id, &journal))
        .collect();

    eventually(
        "every partition has an owner, each member its fair share",
        async || {
            let owners = owners(&url).await;
            owners.len() == PARTITIONS && members.iter().all(|m| m.owned() == PARTITIONS / 4)
        },
    )
    .await;

    let crashed_at = Instant::now();
    members[0].crash();
    eventually(
        "the survivors own everything, within their fair share",
        async || {
            let owners = owners(&url).await;
            owners.len() == PARTITIONS
                && owners.values().all(|id| id != "m1")
                && members[1..]
                    .iter()
                    .all(|m| m.owned() <= PARTITIONS.div_ceil(3))
        },
    )
    .await;
    // The crashed member's leases had to expire: nobody released them.
    assert!(
        crashed_at.elapsed() >= TTL / 2,
        "taken over only after the leases lapsed"
    );
    assert_no_two_acting_owners(&journal);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_member_gets_its_share_and_no_partition_ever_has_two_acting_owners() {
    let server = redis();
    let url = server.url();
    let journal: Journal = Arc::default();
    let first: Vec<Member> = ["m1", "m2", "m3"]
        .iter()
        .map(|id| Member::start(&url, id, &journal))
        .collect();
    eventually("three members own everything", async || {
        owners(&url).await.len() == PARTITIONS
    })
    .await;

    let newcomer = Member::start(&url, "m4", &journal);
    eventually("the newcomer owns its fair share", async || {
        newcomer.owned() == PARTITIONS / 4 && first.iter().all(|m| m.owned() == PARTITIONS / 4)
    })
    .await;
    let owners = owners(&url).await;
    assert_eq!(owners.len(), PARTITIONS);
    assert_eq!(
        owners.values().filter(|id| *id == "m4").count(),
        PARTITIONS / 4
    );
    assert_no_two_acting_owners(&journal);
    let rejected = journal.lock().unwrap().iter().filter(|w| !w.4).count();
    assert_eq!(
        rejected, 0,
        "hand-overs happen after the old owner stopped: nothing stale to reject"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutting_a_member_down_hands_all_its_partitions_over() {
    let server = redis();
    let url = server.url();
    let journal: Journal = Arc::default();
    // A long ttl: a takeover by expiry would take seconds, a release does not.
    let ttl = Duration::from_secs(4);
    let mut leaving = Member::start_with_ttl(&url, "leaving", &journal, ttl);
    eventually("the first member owns everything", async || {
        leaving.owned() == PARTITIONS
    })
    .await;
    let staying = Member::start_with_ttl(&url, "staying", &journal, ttl);
    eventually("the two split the partitions", async || {
        staying.owned() == PARTITIONS / 2
    })
    .await;

    let started = Instant::now();
    leaving.shut_down();
    eventually("the remaining member owns everything", async || {
        staying.owned() == PARTITIONS
    })
    .await;
    assert!(
        started.elapsed() < ttl / 2,
        "released, not left to expire: {:?}",
        started.elapsed()
    );
    assert!(owners(&url).await.values().all(|id| id == "staying"));
    assert_no_two_acting_owners(&journal);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_data_in_one_partitions_key_costs_that_partition_only() {
    let server = redis();
    let url = server.url();
    let journal: Journal = Arc::default();
    let member = Member::start(&url, "m1", &journal);
    eventually("the member owns every partition", async || {
        member.owned() == PARTITIONS
    })
    .await;
    // Someone else's data where orders-3's lease was.
    let key = "tenure:{orders-3}:lease";
    server.command(&["SET", key, "not a lease"]).unwrap();
    eventually(
        "orders-3's term ends (its lease cannot be renewed)",
        async || !member.observer.owned().contains(&"orders-3".to_string()),
    )
    .await;
    // The other partitions keep their terms and the set keeps running,
    // trying orders-3 again now and then without touching the data.
    let before = journal.lock().unwrap().len();
    eventually("the other partitions' work goes on", async || {
        journal.lock().unwrap().len() > before + PARTITIONS
    })
    .await;
    tokio::time::sleep(TTL * 2).await;
    assert_eq!(member.owned(), PARTITIONS - 1);
    assert_eq!(server.command(&["GET", key]).unwrap(), "not a lease");
    // Once the key is cleaned up, the partition is taken again.
    server.command(&["DEL", key]).unwrap();
    eventually("orders-3 is owned again", async || {
        member.owned() == PARTITIONS
    })
    .await;
}

/// Calls of `command` the server has run so far, its scripts' included.
fn calls_of(server: &crate::support::RedisServer, command: &str) -> u64 {
    let stats = server.command(&["INFO", "commandstats"]).unwrap();
    let field = format!("cmdstat_{command}:calls=");
    stats
        .lines()
        .find_map(|line| line.strip_prefix(field.as_str()))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |calls| calls.parse().unwrap())
}

/// `INFO` calls the server has run so far, its scripts' included.
fn info_calls(server: &crate::support::RedisServer) -> u64 {
    calls_of(server, "info")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_steady_sets_renewals_skip_the_full_reading_of_each_lease() {
    let server = redis();
    let set = PartitionSet::builder("orders", partitions())
        .redis(server.url())
        .ttl(TTL)
        .id("m1")
        .build()
        .await
        .expect("valid partition set");
    let observer = set.observer();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    // Work that sends nothing to Redis: the only commands are the set's.
    let running = tokio::spawn(set.run(
        |_partition, term: tenure::Leadership| async move {
            term.lost().await;
        },
        async move {
            let _ = stopped.await;
        },
    ));
    eventually("the set owns every partition", async || {
        observer.owned_count() == PARTITIONS
    })
    .await;
    let (hlen, pexpire) = (calls_of(&server, "hlen"), calls_of(&server, "pexpire"));
    let from = observer.cycles();
    eventually("three more renewal cycles", async || {
        observer.cycles() >= from + 3
    })
    .await;
    // HLEN is the full reading's (read_lease's exact fields): a renewal of
    // the term's own lease and witness is HMGET, GET and two PEXPIREs.
    let full = calls_of(&server, "hlen") - hlen;
    assert_eq!(full, 0, "renewals read {full} leases in full");
    let renewed = calls_of(&server, "pexpire") - pexpire;
    assert!(
        renewed >= 2 * 2 * PARTITIONS as u64,
        "{renewed} PEXPIREs in three cycles of {PARTITIONS} partitions"
    );
    assert_eq!(observer.owned_count(), PARTITIONS);
    let _ = stop.send(());
    let _ = running.await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_renewal_pipeline_goes_in_slices_and_each_answer_reaches_its_own_term() {
    // 12,345 renewals are more than 36,000 arguments: a pipeline of two
    // slices, the second sent once the first is answered (the client holds
    // one slice at a time, not 100,000 renewals at once). Every answer
    // must reach its own term: the second slice's lost would end 2,345
    // terms at their deadlines (or show as cycles retried early), and its
    // calls' answers given to others would not match their lengths (the
    // last call renews 345 terms, the others 1,000).
    const MANY: usize = 12_345;
    let ttl = Duration::from_secs(3);
    let server = redis();
    let names: Vec<String> = (0..MANY).map(|p| format!("bulk-{p}")).collect();
    let set = PartitionSet::builder("bulk", names)
        .redis(server.url())
        .ttl(ttl)
        .id("m1")
        .build()
        .await
        .expect("valid partition set");
    let observer = set.observer();
    let lost = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(set.run(
        {
            let lost = lost.clone();
            move |_partition, term: tenure::Leadership| {
                let lost = lost.clone();
                async move {
                    term.lost().await;
                    lost.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }
            }
        },
        async move {
            let _ = stopped.await;
        },
    ));
    eventually("the set owns every partition", async || {
        observer.owned_count() == MANY
    })
    .await;
    let pexpire = calls_of(&server, "pexpire");
    let lost_before = lost.load(std::sync::atomic::Ordering::SeqCst);
    let (start, cycles, trips) = (Instant::now(), observer.cycles(), observer.round_trips());
    // Longer than a ttl: a term whose renewals went astray has reached
    // its deadline by then.
    let renew_every = ttl / 3;
    eventually("a ttl and a renew interval", async || {
        start.elapsed() >= ttl + renew_every
    })
    .await;
    let (done, sent) = (observer.cycles() - cycles, observer.round_trips() - trips);
    let elapsed = start.elapsed();
    assert_eq!(
        lost.load(std::sync::atomic::Ordering::SeqCst) - lost_before,
        0,
        "terms ended"
    );
    assert_eq!(observer.owned_count(), MANY);
    // No cycle was retried early (a retry follows a renewal that went
    // unanswered): about one per renew interval.
    let regular = (elapsed.as_millis() / renew_every.as_millis()) as u64 + 2;
    assert!(
        done >= 3 && done <= regular,
        "{done} cycles in {elapsed:?}: renewals failed and were retried"
    );
    assert!(
        sent >= 2 * (done - 1),
        "{sent} round trips in {done} cycles of {MANY} renewals: not sliced"
    );
    let renewed = calls_of(&server, "pexpire") - pexpire;
    assert!(
        renewed >= 2 * MANY as u64 * (done - 1),
        "{renewed} PEXPIREs in {done} cycles of {MANY} partitions"
    );
    let _ = stop.send(());
    let _ = running.await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sets_acquisitions_read_the_servers_epoch_once_a_call_not_once_a_partition() {
    let server = redis();
    let url = server.url();
    let journal: Journal = Arc::default();
    let before = info_calls(&server);
    let member = Member::start(&url, "m1", &journal);
    eventually("the member owns every partition", async || {
        member.owned() == PARTITIONS
    })
    .await;
    // Two INFO calls (the process epoch) per acquire_many call of up to a
    // hundred partitions, a call for the start-up hold-off and one past
    // it, and the client's own look at the server: an INFO pair per
    // partition would be 64 at least.
    let calls = info_calls(&server) - before;
    assert!(
        calls <= 16,
        "{calls} INFO calls to acquire {PARTITIONS} partitions"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_data_found_by_the_first_acquisitions_costs_its_partition_only() {
    let server = redis();
    let url = server.url();
    // Before any member starts, so the set's first call, which acquires
    // every partition at once, finds it.
    let key = "tenure:{orders-5}:lease";
    server.command(&["SET", key, "not a lease"]).unwrap();
    let journal: Journal = Arc::default();
    let member = Member::start(&url, "m1", &journal);
    eventually("the member owns every other partition", async || {
        member.owned() == PARTITIONS - 1
    })
    .await;
    assert!(!member.observer.owned().contains(&"orders-5".to_string()));
    assert_eq!(server.command(&["GET", key]).unwrap(), "not a lease");
    server.command(&["DEL", key]).unwrap();
    eventually("orders-5 is owned once its key is cleaned up", async || {
        member.owned() == PARTITIONS
    })
    .await;
}

/// The ids of the server's client connections, but for the one asking.
fn connection_ids(server: &crate::support::RedisServer) -> Vec<String> {
    let clients = server.command(&["CLIENT", "LIST"]).unwrap();
    clients
        .lines()
        .filter(|line| !line.contains("cmd=client|list"))
        .filter_map(|line| line.split(' ').find_map(|f| f.strip_prefix("id=")))
        .map(str::to_string)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_the_server_answers_after_the_call_timeout_is_waited_for_not_sent_again() {
    // A server that holds every command for 2 s (busy, as a server
    // renewing 100,000 terms can be for a second) answers the renewal sent
    // during it long after the 400 ms call timeout, but before the terms'
    // deadlines (2.7 s after the renewal before). A set that gave up at the
    // call timeout dropped its connection and sent the renewal again
    // behind the work still queued: on a busy server, over and over.
    let server = redis();
    let ttl = Duration::from_secs(3);
    let set = PartitionSet::builder("orders", partitions())
        .redis(server.url())
        .ttl(ttl)
        .call_timeout(Duration::from_millis(400))
        .id("m1")
        .build()
        .await
        .expect("valid partition set");
    let observer = set.observer();
    let lost = Arc::new(Mutex::new(0_usize));
    let (terms_tx, mut terms) = tokio::sync::mpsc::unbounded_channel();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(set.run(
        {
            let lost = lost.clone();
            move |_partition, term: tenure::Leadership| {
                let lost = lost.clone();
                let _ = terms_tx.send(term.clone());
                async move {
                    term.lost().await;
                    *lost.lock().unwrap() += 1;
                }
            }
        },
        async move {
            let _ = stopped.await;
        },
    ));
    eventually("the set owns every partition", async || {
        observer.owned_count() == PARTITIONS
    })
    .await;
    let term = terms.recv().await.expect("a term began");
    let url = server.url();
    let before = owners(&url).await;
    let connections = connection_ids(&server);
    assert!(!connections.is_empty(), "the set is connected");
    // Pause right after a renewal was answered: the next one is sent
    // about 1 s into the pause and waits about 1 s for its answer.
    let renewed = term.deadline();
    eventually("a renewal is answered", async || term.deadline() > renewed).await;
    let server = Arc::new(server);
    let paused = server.clone();
    tokio::task::spawn_blocking(move || {
        paused.command(&["CLIENT", "PAUSE", "2000", "ALL"]).unwrap();
        // Answered once the pause is over.
        paused.command(&["PING"]).unwrap();
    })
    .await
    .unwrap();
    let from = observer.cycles();
    eventually("a whole renewal cycle after the pause", async || {
        observer.cycles() >= from + 2
    })
    .await;
    let after = connection_ids(&server);
    assert!(
        after.iter().all(|id| connections.contains(id)),
        "the set opened new connections (it gave up on a reply): {connections:?} before, \
         {after:?} after"
    );
    assert_eq!(*lost.lock().unwrap(), 0, "a term ended");
    assert_eq!(observer.owned_count(), PARTITIONS);
    assert_eq!(owners(&url).await, before, "a partition changed hands");
    let _ = stop.send(());
    let _ = running.await;
}
