//! The PostgreSQL store's own promises, beyond the contract every store
//! keeps: a server that comes back from an older copy of its data, or a
//! replica promoted without the latest lease, grants no new term while a
//! holder of a lease it lost may still lead; a lease row deleted by hand
//! holds the election until its holder surely stopped; a least-privilege
//! role works with the documented grants; and every misconfiguration is
//! one clear line.

use std::time::Duration;

use pg_process::PgServer;
use tenure::{Election, Error};
use tenure_test_support::proxy::Proxy;
use tokio::time::timeout;

use crate::support::{self, campaign, Target, HANG};

const TTL: Duration = Duration::from_secs(3);

async fn election(url: &str, name: &str, id: &str, ignore_epoch: bool) -> Election {
    Election::builder(name)
        .redis(url)
        .ttl(TTL)
        .id(id)
        .unsafe_postgres_ignore_epoch(ignore_epoch)
        .build()
        .await
        .unwrap_or_else(|err| panic!("building election {name} for {id}: {err}"))
}

/// a leads on `url`; `lose` takes the lease from the store under it (the
/// store now serves older data); b, campaigning meanwhile, must not begin
/// before a's deadline. How early b began, if it did (and what `lose`
/// returned: the servers, dropped by the caller once the test is done).
async fn lost_under_its_leader<T: Send + 'static>(
    url: &str,
    name: &str,
    ignore_epoch: bool,
    lose: impl FnOnce() -> T + Send + 'static,
) -> (Option<Duration>, T) {
    let a = election(url, name, "a", ignore_epoch).await;
    let b = election(url, name, "b", ignore_epoch).await;
    let term = campaign(&a).await;
    support::topo::renewed(&term).await;
    let follower = tokio::spawn(async move { campaign(&b).await });
    tokio::task::yield_now().await;
    let servers = tokio::task::spawn_blocking(lose)
        .await
        .expect("the fault is injected");
    timeout(HANG, term.lost()).await.expect("a's term ends");
    let last_deadline = term.deadline();
    let next = timeout(HANG, follower)
        .await
        .expect("b leads")
        .expect("no panic");
    assert!(next.token() > term.token(), "tokens rise");
    let b_began = next.deadline() - TTL;
    let early = (b_began < last_deadline).then(|| last_deadline - b_began);
    (early, servers)
}

/// Restore the server from a copy of its data taken before anyone led.
async fn restored(ignore_epoch: bool) -> Option<Duration> {
    let mut server = support::postgres();
    let url = server.url();
    // The schema exists in the copy: the first election installs it.
    let _ = election(&url, "restored", "setup", false).await;
    let copy = server.backup().expect("a copy of the data");
    let (early, _server) = lost_under_its_leader(&url, "restored", ignore_epoch, move || {
        server.restore(&copy).expect("the older copy is back");
        server
    })
    .await;
    early
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_from_an_older_copy_gives_no_second_leader() {
    let early = restored(false).await;
    assert_eq!(early, None, "b began before a's deadline");
}

/// The test above can fail: with the epoch ignored, b is elected as soon
/// as the restored server answers, while a still leads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_with_the_epoch_ignored_gives_two_leaders() {
    let early = restored(true).await;
    assert!(early.is_some(), "b waited for a's deadline anyway");
}

/// A failover to a replica that never received the lease (cut off from
/// the primary before a won), the clients' address moved to it.
async fn failed_over(ignore_epoch: bool) -> Option<Duration> {
    let primary = support::postgres();
    let proxy = Proxy::start(primary.port()).expect("a proxy");
    let url = format!("postgres://postgres@127.0.0.1:{}/postgres", proxy.port());
    let _ = election(&url, "failover", "setup", false).await;
    let replica = primary.start_replica().expect("a replica");
    replica
        .wait_caught_up(&primary)
        .expect("the replica follows");
    // From now on the replica hears nothing: stop its WAL receiver.
    replica
        .sql("ALTER SYSTEM SET primary_conninfo = ''")
        .and_then(|_| replica.sql("SELECT pg_reload_conf()"))
        .expect("cut the replica off");
    wait_for(|| {
        replica
            .sql("SELECT count(*) FROM pg_stat_wal_receiver")
            .is_ok_and(|n| n == "0")
    });
    let mut primary = primary;
    let (early, _servers) = lost_under_its_leader(&url, "failover", ignore_epoch, move || {
        primary.kill();
        replica.promote().expect("the replica is promoted");
        proxy.retarget(replica.port());
        (primary, replica, proxy)
    })
    .await;
    early
}

fn wait_for(mut done: impl FnMut() -> bool) {
    let started = std::time::Instant::now();
    while !done() {
        assert!(started.elapsed() < HANG, "timed out");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_to_a_replica_without_the_lease_gives_no_second_leader() {
    let early = failed_over(false).await;
    assert_eq!(early, None, "b began before a's deadline");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_with_the_epoch_ignored_gives_two_leaders() {
    let early = failed_over(true).await;
    assert!(early.is_some(), "b waited for a's deadline anyway");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_row_deleted_by_hand_holds_the_election_until_its_holder_stopped() {
    let server = support::postgres();
    let url = server.url();
    let a = election(&url, "deleted", "a", false).await;
    let b = election(&url, "deleted", "b", false).await;
    let term = campaign(&a).await;
    support::topo::renewed(&term).await;
    let follower = tokio::spawn(async move { campaign(&b).await });
    server
        .sql("DELETE FROM tenure_leases WHERE name = 'deleted'")
        .expect("the operator deletes the row");
    timeout(HANG, term.lost()).await.expect("a's term ends");
    let next = timeout(HANG, follower)
        .await
        .expect("b leads")
        .expect("no panic");
    let b_began = next.deadline() - TTL;
    assert!(
        b_began >= term.deadline(),
        "b began {:?} before a's deadline",
        term.deadline() - b_began
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_least_privilege_role_works_with_the_documented_grants() {
    let server = support::postgres();
    server
        .sql("CREATE ROLE app LOGIN PASSWORD 'app-secret'")
        .expect("a role");
    let app = server.url_as("app", Some("app-secret"));
    // Without the tables, and without the right to create them: one line.
    let err = tenure::Store::open(&app).connect().await.err();
    let text = err.as_ref().map(ToString::to_string).unwrap_or_default();
    assert!(matches!(err, Some(Error::Auth { .. })), "{err:?}");
    assert!(
        !text.contains('\n') && !text.contains("app-secret"),
        "{text}"
    );
    assert!(text.contains("the book's PostgreSQL page"), "{text}");
    // An owner runs the migration and grants the role what it needs.
    server.sql(tenure::POSTGRES_SCHEMA).expect("the migration");
    server
        .sql(&format!("GRANT {} TO app", tenure::POSTGRES_GRANTS))
        .expect("the grants");
    let a = election(&app, "least", "a", false).await;
    let b = election(&app, "least", "b", false).await;
    let term = campaign(&a).await;
    support::topo::renewed(&term).await;
    assert!(tenure::Store::open(&app)
        .connect()
        .await
        .expect("connect")
        .elections(tenure::DEFAULT_PREFIX)
        .await
        .expect("status lists elections")
        .contains(&"least".to_string()));
    let follower = tokio::spawn(async move { campaign(&b).await });
    term.resign().await.expect("resign");
    let next = timeout(HANG, follower).await.expect("b leads").expect("b");
    assert!(next.token() > term.token());
    // A role without the grants gets one line, not a hang.
    server
        .sql("CREATE ROLE stranger LOGIN PASSWORD 'pw'")
        .expect("a role");
    let err = Election::builder("least")
        .redis(server.url_as("stranger", Some("pw")))
        .build()
        .await
        .err();
    let text = err.as_ref().map(ToString::to_string).unwrap_or_default();
    assert!(matches!(err, Some(Error::Auth { .. })), "{err:?}");
    assert!(!text.contains('\n'), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_urls_and_servers_are_one_clear_line() {
    let server = support::postgres();
    server
        .sql("CREATE ROLE alice LOGIN PASSWORD 'right'")
        .expect("a role");
    let open = |url: String| async move {
        let err = timeout(HANG, tenure::Store::open(&url).connect())
            .await
            .expect("an answer, not a hang")
            .err();
        let text = err.as_ref().map(ToString::to_string).unwrap_or_default();
        assert!(!text.contains('\n'), "{text}");
        assert!(!text.contains("wrong") && !text.contains("right"), "{text}");
        err
    };
    let port = server.port();
    let err = open(format!("postgres://alice:wrong@127.0.0.1:{port}/postgres")).await;
    assert!(matches!(err, Some(Error::Auth { .. })), "{err:?}");
    let err = open(format!("postgres://alice@127.0.0.1:{port}/postgres")).await;
    assert!(matches!(err, Some(Error::Auth { .. })), "{err:?}");
    let err = open(format!("postgres://postgres@127.0.0.1:{port}/nosuchdb")).await;
    assert!(matches!(err, Some(Error::Config(_))), "{err:?}");
    let err = open(format!(
        "postgres://postgres@127.0.0.1:{port}/postgres?sslmode=prefer"
    ))
    .await;
    assert!(matches!(err, Some(Error::Config(_))), "{err:?}");
    let err = open(format!(
        "postgres://postgres@127.0.0.1:{port},127.0.0.1:{port}/postgres"
    ))
    .await;
    assert!(matches!(err, Some(Error::Config(_))), "{err:?}");
    // TLS asked of a server without it.
    let err = open(format!(
        "postgres://postgres@127.0.0.1:{port}/postgres?sslmode=require"
    ))
    .await;
    assert!(matches!(err, Some(Error::Tls { .. })), "{err:?}");
    // Nothing listening.
    let free = tenure_test_support::ports::free_port(&[5432]).expect("a free port");
    let err = open(format!("postgres://postgres@127.0.0.1:{free}/postgres")).await;
    assert!(matches!(err, Some(Error::Unreachable { .. })), "{err:?}");
    // A table of another program where tenure keeps its own.
    server
        .sql("CREATE DATABASE other")
        .expect("another database");
    let other = format!("postgres://postgres@127.0.0.1:{port}/other");
    sql_on(
        &server,
        "other",
        "CREATE TABLE tenure_meta (id int, note text)",
    );
    let err = open(other).await;
    assert!(matches!(err, Some(Error::ForeignData { .. })), "{err:?}");
    // Another program's lease table, without tenure's other tables.
    server
        .sql("CREATE DATABASE third")
        .expect("a third database");
    sql_on(
        &server,
        "third",
        "CREATE TABLE tenure_leases (id int, note text)",
    );
    let err = open(format!("postgres://postgres@127.0.0.1:{port}/third")).await;
    assert!(matches!(err, Some(Error::ForeignData { .. })), "{err:?}");
    sql_on(
        &server,
        "third",
        "SELECT count(*) FROM tenure_leases WHERE note IS NULL",
    );
}

/// Run `sql` on database `db` of `server` as the superuser.
fn sql_on(server: &PgServer, db: &str, sql: &str) {
    let status = std::process::Command::new(
        pg_process::find_bindir()
            .expect("PostgreSQL's binaries")
            .join("psql"),
    )
    .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1"])
    .args([
        "-p",
        &server.port().to_string(),
        "-U",
        "postgres",
        "-d",
        db,
        "-c",
        sql,
    ])
    .status()
    .expect("psql runs");
    assert!(status.success(), "{sql}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_server_ends_the_term_at_its_deadline_and_nobody_else_leads() {
    let mut server = support::postgres();
    let target = Target::Url(server.url());
    let a = target.election("hung", "a", TTL).await;
    let term = campaign(&a).await;
    support::topo::renewed(&term).await;
    server.pause();
    let reason = timeout(HANG, term.lost()).await.expect("a's term ends");
    let ended = tokio::time::Instant::now();
    assert!(ended >= term.deadline(), "{reason:?}");
    server.unpause();
    // Once it answers again, a new term begins: on the same server
    // process, after the lease expired.
    let next = timeout(HANG, campaign(&a)).await.expect("a leads again");
    assert!(next.token() > term.token());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_a_pooler_a_resignation_hands_over_by_the_expiry() {
    let server = support::postgres();
    let pooler = server.start_pooler().expect("PgBouncer starts");
    let url = pooler.url();
    let a = election(&url, "pooled", "a", false).await;
    let b = election(&url, "pooled", "b", false).await;
    let term = campaign(&a).await;
    support::topo::renewed(&term).await;
    let follower = tokio::spawn(async move { campaign(&b).await });
    // b has been told who leads, and waits.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let resigned = tokio::time::Instant::now();
    term.resign().await.expect("resign");
    let next = timeout(TTL * 3, follower)
        .await
        .expect("b leads by the lease's expiry")
        .expect("no panic");
    assert!(next.token() > term.token());
    // At the latest when the lease b was told of ran out (a renewal is a
    // ttl long), plus one retry.
    assert!(
        resigned.elapsed() < TTL + Duration::from_secs(1),
        "{:?}",
        resigned.elapsed()
    );
    drop(pooler);
}

/// The operator empties tenure's lease tables (`TRUNCATE`) while a term
/// leads, and a newcomer campaigns at once: the tables' files change, and
/// with them the epoch. How early the newcomer began, if it did.
async fn emptied(ignore_epoch: bool) -> Option<Duration> {
    let server = support::postgres();
    let url = server.url();
    let a = election(&url, "emptied", "a", ignore_epoch).await;
    let term = campaign(&a).await;
    support::topo::renewed(&term).await;
    server
        .sql("TRUNCATE tenure_leases, tenure_witnesses")
        .expect("the operator empties the tables");
    let b = election(&url, "emptied", "b", ignore_epoch).await;
    let next = timeout(HANG, campaign(&b)).await.expect("b leads");
    timeout(HANG, term.lost()).await.expect("a's term ends");
    assert!(next.token() > term.token(), "tokens rise");
    let b_began = next.deadline() - TTL;
    (b_began < term.deadline()).then(|| term.deadline() - b_began)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_tables_emptied_under_a_leader_give_no_second_leader() {
    assert_eq!(emptied(false).await, None, "b began before a's deadline");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_tables_emptied_with_the_epoch_ignored_give_two_leaders() {
    assert!(emptied(true).await.is_some(), "b waited anyway");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_copy_of_the_tables_is_refused_and_dropped_functions_come_back() {
    let server = support::postgres();
    let url = server.url();
    let a = election(&url, "copies", "a", false).await;
    campaign(&a).await.resign().await.expect("resign");
    // An owner drops a function: the next connection installs it again.
    server
        .sql("DROP FUNCTION tenure_acquire(text, text, text, text, bigint, bigint, boolean)")
        .expect("drop");
    let b = election(&url, "copies", "b", false).await;
    campaign(&b).await.resign().await.expect("resign");
    // Another role's search path made a second copy in another schema.
    server
        .sql("CREATE SCHEMA other; CREATE TABLE other.tenure_leases (x int)")
        .expect("a second copy");
    let err = tenure::Store::open(&url).connect().await.err();
    let text = err.as_ref().map(ToString::to_string).unwrap_or_default();
    assert!(matches!(err, Some(Error::Unsafe { .. })), "{err:?}");
    assert!(
        text.contains("other, public") && !text.contains('\n'),
        "{text}"
    );
}

/// Tables made before calendar schedules (no `slot` column, the old
/// `tenure_record_run`) get what this version needs when it connects, and
/// the marker they held stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tables_made_before_slots_gain_them_and_keep_the_last_run() {
    let server = support::postgres();
    let url = server.url();
    let a = election(&url, "upgrade", "a", false).await;
    let term = campaign(&a).await;
    assert!(term
        .record_run(Duration::from_secs(3600))
        .await
        .expect("recorded"));
    term.resign().await.expect("resign");
    server
        .sql(
            "DROP FUNCTION tenure_record_run(text, text, text, bigint, bigint, bigint); \
             DROP FUNCTION tenure_run_marker(text, text); \
             ALTER TABLE tenure_runs DROP COLUMN slot",
        )
        .expect("the tables of the version before");
    let b = election(&url, "upgrade", "b", false).await;
    assert!(b.since_last_run().await.expect("readable").is_some());
    let term = campaign(&b).await;
    let slot = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_796_263_200);
    assert!(term
        .claim_slot(slot, Duration::from_secs(3600))
        .await
        .expect("claimed"));
    assert_eq!(a.last_slot().await.expect("readable"), Some(slot));
}
