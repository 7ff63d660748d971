//! `tenure run` and `status` end to end on a private PostgreSQL server:
//! `--store postgres://…`, the password from `--password-file`.

use crate::consensus;
use crate::support::{status, tenure_output, Scratch};

fn server() -> pg_process::PgServer {
    pg_process::PgServer::start()
        .unwrap_or_else(|err| panic!("cannot start PostgreSQL for the tests: {err}"))
}

#[test]
fn run_hands_over_on_sigterm_and_after_a_kill_and_status_follows() {
    let pg = server();
    consensus::run_hands_over_on_sigterm_and_after_a_kill_and_status_follows(
        &pg.url(),
        "postgres-run",
    );
}

#[test]
fn at_most_every_skips_a_job_that_succeeded_within_the_period_and_retries_a_failed_one() {
    let pg = server();
    consensus::at_most_every_skips_a_job_that_succeeded_within_the_period_and_retries_a_failed_one(
        &pg.url(),
    );
}

#[test]
fn the_password_comes_from_a_file_and_is_never_printed() {
    let pg = server();
    pg.sql("CREATE ROLE ops LOGIN SUPERUSER PASSWORD 's3cret-pg'")
        .expect("a role");
    let scratch = Scratch::new("postgres-password");
    let file = scratch.path("password");
    std::fs::write(&file, "s3cret-pg\n").expect("write the password file");
    let url = pg.url_as("ops", None);
    let out = tenure_output(&[
        "run",
        "--store",
        &url,
        "--password-file",
        file.to_str().expect("a UTF-8 path"),
        "--election",
        "pw",
        "--ttl",
        "2s",
        "--once",
        "--",
        "true",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(!stderr.contains("s3cret"), "{stderr}");
    // A wrong one is one line naming the store, without the password.
    std::fs::write(&file, "wrong-pg\n").expect("write the password file");
    let out = tenure_output(&[
        "status",
        "--store",
        &url,
        "--password-file",
        file.to_str().expect("a UTF-8 path"),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0));
    assert!(stderr.contains("rejected the credentials"), "{stderr}");
    assert!(!stderr.contains("wrong-pg"), "{stderr}");
    assert_eq!(status(&pg.url()), Vec::new());
}

#[test]
fn the_schema_an_owner_runs_lets_a_least_privilege_role_lead() {
    let pg = server();
    let out = tenure_output(&["schema", "postgres"]);
    assert_eq!(out.status.code(), Some(0));
    let schema = String::from_utf8(out.stdout).expect("UTF-8 SQL");
    assert!(schema.contains("-- GRANT SELECT, INSERT, UPDATE, DELETE ON tenure_meta"));
    pg.sql(&schema).expect("the owner runs it");
    pg.sql("CREATE ROLE app LOGIN PASSWORD 'app-pw'")
        .expect("a role");
    pg.sql(&format!("GRANT {} TO app", tenure::POSTGRES_GRANTS))
        .expect("the grant");
    let out = tenure_output(&[
        "run",
        "--store",
        &pg.url_as("app", Some("app-pw")),
        "--election",
        "least",
        "--ttl",
        "2s",
        "--once",
        "--",
        "true",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
}

#[test]
fn five_instances_with_three_slots_run_three_commands() {
    let pg = server();
    crate::slots::five_instances_with_three_slots_run_three_commands_on(&pg.url(), "pg-slots");
}
