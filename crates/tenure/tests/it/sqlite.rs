//! The SQLite store's own promises, beyond the contract every store keeps:
//! a killed holder is replaced at once (its lock went with it), a paused
//! one only when its lease expired (it keeps its lock), a lease deleted by
//! hand holds the election until its holder surely stopped, a lease of an
//! earlier boot is dead, tokens keep rising when the file is restored from
//! an older copy, a writer that holds the file for a while costs no term,
//! and bad files are one clear line.
//!
//! A holder "killed" here vanishes with its runtime and its store (the
//! kernel lets go of its lock when its file descriptor closes, as when a
//! process dies); a "paused" one loses its runtime but keeps its store
//! open, as a stopped process keeps its file descriptors.

use std::time::Duration;

use tenure::{Election, Error};
use tokio::time::{timeout, Instant};

use crate::support::{self, campaign, Crashable, SqliteFile, Target, HANG};

const TTL: Duration = Duration::from_secs(3);

/// An instance that leads election `name` on a runtime of its own; its
/// election (and so its store and its lock) is returned to the caller.
fn lead(file: &SqliteFile, name: &str, id: &str) -> (Crashable, Election, u64) {
    let (runtime, election, token, _) = lead_with_lock(file, name, id);
    (runtime, election, token)
}

/// [`lead`], and a duplicate of the term's OS lock.
fn lead_with_lock(
    file: &SqliteFile,
    name: &str,
    id: &str,
) -> (Crashable, Election, u64, std::os::fd::OwnedFd) {
    let runtime = Crashable::start();
    let target = Target::Url(file.url());
    let (election, token, lock) = runtime.block_on(async {
        let election = target.election(name, id, TTL).await;
        let term = campaign(&election).await;
        let token = term.token();
        let lock = term.lock_fd().expect("a SQLite term holds a lock");
        tokio::spawn(async move {
            let _term = term;
            std::future::pending::<()>().await;
        });
        (election, token, lock)
    });
    (runtime, election, token, lock)
}

/// A follower that campaigns from now on, once it has seen someone lead.
async fn follower(file: &SqliteFile, name: &str, id: &str) -> tokio::task::JoinHandle<Election> {
    let election = Target::Url(file.url()).election(name, id, TTL).await;
    support::topo::until_led(&election).await;
    election
        .leader()
        .await
        .expect("leader()")
        .expect("someone leads");
    let campaigning = election.clone();
    let task = tokio::spawn(async move {
        let term = campaign(&campaigning).await;
        std::mem::forget(term);
        campaigning
    });
    // Give it its first look at the lease.
    tokio::task::yield_now().await;
    drop(election);
    task
}

/// How long `task` took to win, from `since`.
async fn won(task: tokio::task::JoinHandle<Election>, since: Instant) -> (Election, Duration) {
    let election = timeout(HANG, task)
        .await
        .expect("a takeover")
        .expect("no panic");
    (election, since.elapsed())
}

/// The file's raw connection, as an operator's `sqlite3` would open it.
fn raw(file: &SqliteFile) -> rusqlite::Connection {
    let path = file.dir().join("tenure.db");
    let conn = rusqlite::Connection::open(&path).expect("the file opens");
    conn.busy_timeout(Duration::from_secs(5)).expect("timeout");
    conn
}

/// SQLite announces no terms (a follower learns of a release from the
/// term's lock): waiting for the next term's announcement says no at once,
/// even as one begins, so an exiting `tenure run` does not wait for one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_term_is_never_announced() {
    let file = support::sqlite();
    let a = Target::Url(file.url()).election("next", "a", TTL).await;
    let b = Target::Url(file.url()).election("next", "b", TTL).await;
    let term = campaign(&a).await;
    let next = a.next_term();
    term.resign().await.expect("resign");
    let successor = campaign(&b).await;
    let announced = timeout(HANG, next.announced(Duration::from_secs(3600)))
        .await
        .expect("an answer at once, not after the hour asked for");
    assert!(!announced);
    drop(successor);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_holder_is_replaced_before_its_lease_expires() {
    let file = support::sqlite();
    let (mut runtime, election, old) = lead(&file, "killed", "victim");
    let task = follower(&file, "killed", "survivor").await;
    runtime.crash();
    let killed_at = Instant::now();
    // Its last file descriptor closes, as the kernel closes a dead process's.
    drop(election);
    let (survivor, waited) = won(task, killed_at).await;
    // Its lease had at least ttl - ttl/3 left.
    assert!(waited < TTL - TTL / 3, "waited for the expiry: {waited:?}");
    let leader = survivor.leader().await.expect("leader()").expect("leads");
    assert_eq!(leader.id, "survivor");
    assert!(leader.token > old);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_holder_whose_work_lives_on_elsewhere_is_replaced_only_after_the_work() {
    let file = support::sqlite();
    // The holder's work runs elsewhere (as `tenure run`'s command under
    // its guardian), with a duplicate of the lock.
    let (mut runtime, election, old, work) = lead_with_lock(&file, "work", "victim");
    let task = follower(&file, "work", "survivor").await;
    runtime.crash();
    let killed_at = Instant::now();
    drop(election);
    // The work takes a while to stop after its leader died.
    tokio::time::sleep(TTL / 6).await;
    assert!(!task.is_finished(), "took over while the work ran");
    let work_gone_at = Instant::now();
    drop(work);
    let (survivor, _) = won(task, killed_at).await;
    let after_the_work = work_gone_at.elapsed();
    let waited = killed_at.elapsed();
    assert!(
        waited < TTL - TTL / 3,
        "waited for the expiry, not the work: {waited:?} ({after_the_work:?} after it)"
    );
    let leader = survivor.leader().await.expect("leader()").expect("leads");
    assert!(leader.token > old);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_holder_is_replaced_only_once_its_lease_expired() {
    let file = support::sqlite();
    let (mut runtime, paused, old) = lead(&file, "paused", "victim");
    let task = follower(&file, "paused", "survivor").await;
    runtime.crash();
    let paused_at = Instant::now();
    let (survivor, waited) = won(task, paused_at).await;
    assert!(
        // Half a ttl at least: the holder's last renewal may have run late
        // on a busy machine, and an early takeover takes milliseconds.
        waited >= TTL / 2,
        "took over while the paused holder's lease lived: {waited:?}"
    );
    let leader = survivor.leader().await.expect("leader()").expect("leads");
    assert!(leader.token > old);
    drop(paused);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_deleted_by_hand_holds_the_election_until_its_paused_holder_stopped() {
    let file = support::sqlite();
    let (mut runtime, paused, _) = lead(&file, "deleted", "victim");
    let task = follower(&file, "deleted", "survivor").await;
    runtime.crash();
    let deleted = raw(&file)
        .execute("DELETE FROM tenure_leases WHERE name = 'deleted'", [])
        .expect("delete");
    assert_eq!(deleted, 1);
    let deleted_at = Instant::now();
    let (_survivor, waited) = won(task, deleted_at).await;
    assert!(
        // Half a ttl at least: the holder's last renewal may have run late
        // on a busy machine, and an early takeover takes milliseconds.
        waited >= TTL / 2,
        "took over while the holder might still act: {waited:?}"
    );
    drop(paused);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_of_an_earlier_boot_is_dead() {
    let file = support::sqlite();
    let a = Target::Url(file.url()).election("boot", "a", TTL).await;
    // A new file's hold-off passes; the election is then free.
    campaign(&a).await.resign().await.expect("resign");
    let forge = |boot: &str| {
        raw(&file)
            .execute(
                "INSERT OR REPLACE INTO tenure_leases (prefix, name, owner, attempt, token, \
                 ttl_ms, boot, expires, since_ms, locked) \
                 VALUES (?1, 'boot', 'ghost', 'x', 1, 3000, ?2, 9000000000000, 0, 0)",
                [tenure::DEFAULT_PREFIX, boot],
            )
            .expect("insert")
    };
    let this_boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .expect("boot id")
        .trim()
        .to_string();
    forge(&this_boot);
    let held = a
        .leader()
        .await
        .expect("leader()")
        .expect("the ghost leads");
    assert_eq!(held.id, "ghost");
    assert!(a.try_campaign().await.expect("try").is_none());
    forge("00000000-0000-0000-0000-000000000000");
    assert_eq!(a.leader().await.expect("leader()"), None);
    let term = a
        .try_campaign()
        .await
        .expect("try")
        .expect("a wins at once");
    assert!(term.token() > 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_keep_rising_after_the_file_is_restored_from_an_older_copy() {
    let file = support::sqlite();
    let copy = file.dir().join("copy.db");
    let a = Target::Url(file.url()).election("restore", "a", TTL).await;
    let first = campaign(&a).await;
    first.resign().await.expect("resign");
    copy_of(&file, &copy);
    let second = campaign(&a).await;
    second.resign().await.expect("resign");
    assert!(second.token() > first.token());
    restore_in_place(&file, &copy);
    let third = campaign(&a).await;
    assert!(
        third.token() > second.token(),
        "{} after {}",
        third.token(),
        second.token()
    );
}

/// The operator restores the older copy's rows over the live file's, in
/// one transaction, as a restore through SQLite would.
fn restore_in_place(file: &SqliteFile, copy: &std::path::Path) {
    let live = raw(file);
    live.execute("ATTACH ?1 AS old", [copy.to_string_lossy()])
        .expect("attach");
    let mut script = String::from("BEGIN IMMEDIATE;");
    for table in [
        "tenure_meta",
        "tenure_sessions",
        "tenure_leases",
        "tenure_witnesses",
        "tenure_tokens",
        "tenure_members",
        "tenure_runs",
    ] {
        script.push_str(&format!(
            "DELETE FROM main.{table}; INSERT INTO main.{table} SELECT * FROM old.{table};"
        ));
    }
    script.push_str("COMMIT;");
    live.execute_batch(&script).expect("restore");
}

/// A copy of the file as it is now (`VACUUM INTO`), at `copy`.
fn copy_of(file: &SqliteFile, copy: &std::path::Path) {
    raw(file)
        .execute("VACUUM INTO ?1", [copy.to_string_lossy()])
        .expect("a copy");
}

/// `a` leads election `name`; the file is rolled back to a copy taken
/// before a's term began, by `roll_back`; b, campaigning all along, must
/// not begin its term before a's last deadline.
async fn rolled_back_under_its_leader(
    name: &str,
    roll_back: impl FnOnce(&SqliteFile, &std::path::Path),
) {
    let file = support::sqlite();
    let copy = file.dir().join("older.db");
    let target = Target::Url(file.url());
    let a = target.election(name, "a", TTL).await;
    let b = target.election(name, "b", TTL).await;
    // A copy of the file before anyone led.
    copy_of(&file, &copy);
    let term = campaign(&a).await;
    support::topo::renewed(&term).await;
    let follower = tokio::spawn(async move { campaign(&b).await });
    tokio::task::yield_now().await;
    roll_back(&file, &copy);
    let reason = timeout(HANG, term.lost()).await.expect("a's term ends");
    let last_deadline = term.deadline();
    let next = timeout(HANG, follower)
        .await
        .expect("b leads")
        .expect("no panic");
    let b_began = next.deadline() - TTL;
    assert!(
        b_began >= last_deadline,
        "b began {:?} before a's deadline (a lost: {reason:?})",
        last_deadline - b_began
    );
    assert!(next.token() > term.token());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_in_place_from_an_older_copy_gives_no_second_leader() {
    rolled_back_under_its_leader("restored", restore_in_place).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_copy_put_in_the_file_s_place_gives_no_second_leader() {
    rolled_back_under_its_leader("replaced", |file, copy| {
        for suffix in ["-wal", "-shm"] {
            let _ = std::fs::remove_file(file.dir().join(format!("tenure.db{suffix}")));
        }
        std::fs::rename(copy, file.dir().join("tenure.db")).expect("the copy replaces the file");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_holding_the_file_for_a_while_costs_no_term() {
    let file = support::sqlite();
    let a = Target::Url(file.url()).election("busy", "a", TTL).await;
    let term = campaign(&a).await;
    support::topo::renewed(&term).await;
    let writer = std::thread::spawn({
        let conn = raw(&file);
        move || {
            conn.execute_batch("BEGIN IMMEDIATE").expect("begin");
            // Longer than a renew interval, shorter than the deadline.
            std::thread::sleep(TTL / 2);
            conn.execute_batch("COMMIT").expect("commit");
        }
    });
    writer.join().expect("the writer ends");
    support::topo::renewed(&term).await;
    assert!(term.is_leader(), "{:?}", term.lost_reason());
    term.resign().await.expect("resign");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_files_are_one_clear_line() {
    let file = support::sqlite();
    let open = |url: String| async move {
        let err = tenure::Store::open(&url).connect().await.err();
        let text = err.as_ref().map(ToString::to_string).unwrap_or_default();
        assert!(!text.contains('\n'), "{text}");
        err
    };
    // Not a database.
    let text = file.dir().join("notes.txt");
    std::fs::write(&text, "hello, this is not a database\n".repeat(100)).expect("write");
    let err = open(format!("sqlite://{}", text.display())).await;
    assert!(matches!(err, Some(Error::ForeignData { .. })), "{err:?}");
    // Another program's table of the same name.
    let foreign = file.dir().join("foreign.db");
    rusqlite::Connection::open(&foreign)
        .expect("open")
        .execute_batch("CREATE TABLE tenure_leases (id INTEGER PRIMARY KEY, note TEXT)")
        .expect("create");
    let err = open(format!("sqlite://{}", foreign.display())).await;
    assert!(matches!(err, Some(Error::ForeignData { .. })), "{err:?}");
    // A directory that does not exist.
    let missing = file.dir().join("no/such/dir/x.db");
    let err = open(format!("sqlite://{}", missing.display())).await;
    assert!(matches!(err, Some(Error::Unreachable { .. })), "{err:?}");
    // No file at all.
    let err = open("sqlite://".to_string()).await;
    assert!(matches!(err, Some(Error::Config(_))), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_deleted_under_its_leader_gives_no_second_leader() {
    let file = support::sqlite();
    let target = Target::Url(file.url());
    let a = target.election("gone", "a", TTL).await;
    let b = target.election("gone", "b", TTL).await;
    let term = campaign(&a).await;
    support::topo::renewed(&term).await;
    let follower = tokio::spawn(async move { campaign(&b).await });
    // The operator deletes the database (and its WAL) under both.
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(file.dir().join(format!("tenure.db{suffix}")));
    }
    let reason = timeout(HANG, term.lost()).await.expect("a's term ends");
    let last_deadline = term.deadline();
    let next = timeout(HANG, follower)
        .await
        .expect("b leads in the new file")
        .expect("no panic");
    // b's term began after a's could have ended: its first deadline is a
    // ttl after its acquisition was sent.
    let b_began = next.deadline() - TTL;
    assert!(
        b_began >= last_deadline,
        "b began {:?} before a's deadline (a lost: {reason:?})",
        last_deadline - b_began
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_file_deleted_under_its_holder_lets_nobody_in_early() {
    let file = support::sqlite();
    let target = Target::Url(file.url());
    let a = target.election("unlinked", "a", TTL).await;
    let term = campaign(&a).await;
    assert!(term.lock_fd().is_some());
    // The operator cleans up the lock directory while a leads.
    let locks = file.dir().join("tenure.db.locks");
    std::fs::remove_dir_all(&locks).expect("remove the locks");
    std::fs::create_dir_all(&locks).expect("make it again");
    // b takes a new lock file's lock: it says nothing of a, which goes on
    // renewing and leading.
    let b = target.election("unlinked", "b", TTL).await;
    let tried = timeout(TTL * 2, b.campaign()).await;
    assert!(tried.is_err(), "b won while a led");
    assert!(term.is_leader(), "{:?}", term.lost_reason());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_election_beside_a_partition_of_its_name_on_one_store_waits_for_it() {
    let file = support::sqlite();
    let store = tenure::Store::open(file.url())
        .connect()
        .await
        .expect("the file opens");
    // The election's watcher makes the store take locks for this name.
    let election = tenure::Election::builder("shared")
        .store(&store)
        .ttl(TTL)
        .id("e")
        .build()
        .await
        .expect("an election");
    let set = tenure::PartitionSet::builder("group", vec!["shared".to_string()])
        .store(&store)
        .ttl(TTL)
        .id("s")
        .build()
        .await
        .expect("a partition set");
    let observer = set.observer();
    let running = tokio::spawn(set.run(
        |_, term| async move {
            term.lost().await;
        },
        std::future::pending::<()>(),
    ));
    timeout(HANG, async {
        while observer.owned_count() != 1 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the set holds its partition");
    // Past a ttl of the set's renewals, the partition still holds its
    // lease, and with it the lock it took: the election cannot win.
    let tried = timeout(TTL * 2, election.campaign()).await;
    assert!(tried.is_err(), "the election won a partition's live lease");
    assert_eq!(observer.owned_count(), 1);
    running.abort();
}
