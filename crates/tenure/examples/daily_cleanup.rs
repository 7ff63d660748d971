//! A cleanup that runs at most once per day across the cluster.
//!
//! The seed keeps "last run" in process memory, so a failover repeats the
//! cleanup. Here the marker lives in Redis as a [`tenure::FencedKey`]: it is
//! written with the leader's fencing token after the cleanup finished, and a
//! stale leader's write is rejected. Deletion goes in batches, checking
//! leadership between batches, so a leader that loses its term stops within
//! one batch. The marker is written only after the work, so a leader that
//! dies mid-way leaves the day unmarked and the next one finishes the job
//! (deleting is idempotent).
//!
//! Run: `cargo run -p tenure --example daily_cleanup`

#[path = "common/mod.rs"]
mod common;

use std::time::Duration;

use redis::AsyncCommands;
use tenure::{Election, FencedKey, FencedWrite, Leadership};

const BATCH: usize = 100;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    common::init_logs();
    let (url, _server) = common::redis_url();
    let client = redis::Client::open(url.as_str())?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    let _: () = conn.del("cleanup:last-run").await?;
    for i in 0..1000 {
        let _: () = conn.set(format!("session:stale:{i}"), "x").await?;
    }
    // The UTC day number is the period; any stable day label works.
    let days = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() / 86_400)
        .unwrap_or(0);
    let today: &'static str = Box::leak(format!("utc-day-{days}").into_boxed_str());

    // Three replicas, each checking every 500 ms whether today's cleanup is due.
    // Every 2 s the current leader steps down, forcing failovers.
    let mut tasks = Vec::new();
    for name in ["node-1", "node-2", "node-3"] {
        let election = Election::builder("example-daily-cleanup")
            .redis(&url)
            .ttl(Duration::from_secs(3))
            .id(name)
            .build()
            .await?;
        let conn = conn.clone();
        let run = election
            .runner()
            .on_elected(move |term| println!("{name}: elected (token {})", term.token()))
            .lead(move |term| cleanup_while_leader(term, conn.clone(), today))
            .run_until(tokio::time::sleep(Duration::from_secs(7)));
        tasks.push(tokio::spawn(run));
    }
    for task in tasks {
        task.await??;
    }
    let left: Vec<String> = conn.keys("session:stale:*").await?;
    let marker = FencedKey::new("cleanup:last-run").get(&mut conn).await?;
    let runs: u32 = conn.get("cleanup:runs").await.unwrap_or(0);
    println!(
        "stale sessions left: {}; cleanups run: {runs}; marker: {:?}",
        left.len(),
        marker.map(|(token, day)| (token, String::from_utf8_lossy(&day).into_owned()))
    );
    let _: () = conn.del("cleanup:runs").await?;
    Ok(())
}

/// One term: clean up if today's run has not happened, then lead for 2 s
/// and step down so the demo shows failovers.
async fn cleanup_while_leader(
    term: Leadership,
    mut conn: redis::aio::MultiplexedConnection,
    today: &str,
) {
    let marker = FencedKey::new("cleanup:last-run");
    let done_today = match marker.get(&mut conn).await {
        Ok(Some((_, day))) => day == today.as_bytes(),
        Ok(None) => false,
        Err(err) => return eprintln!("{}: cannot read the marker: {err}", term.id()),
    };
    if done_today {
        println!("{}: today's cleanup already ran; nothing to do", term.id());
    } else if delete_in_batches(&term, &mut conn).await {
        match marker.set(&mut conn, term.token(), today).await {
            Ok(FencedWrite::Accepted) => {
                let _: redis::RedisResult<i64> = conn.incr("cleanup:runs", 1).await;
                println!(
                    "{}: cleanup done, marker written with token {}",
                    term.id(),
                    term.token()
                );
            }
            Ok(FencedWrite::Rejected { highest }) => {
                println!(
                    "{}: a newer leader (token {highest}) wrote the marker; mine is stale",
                    term.id()
                )
            }
            // FencedWrite may grow outcomes; none of them is a success.
            Ok(other) => eprintln!("{}: the marker was not written: {other:?}", term.id()),
            Err(err) => eprintln!("{}: cannot write the marker: {err}", term.id()),
        }
    }
    tokio::select! {
        _ = term.lost() => {}
        _ = tokio::time::sleep(Duration::from_secs(2)) => {}
    }
}

/// Delete stale sessions about `BATCH` at a time, walking the keyspace once
/// with SCAN; false if leadership ended (or Redis failed) first.
async fn delete_in_batches(
    term: &Leadership,
    conn: &mut redis::aio::MultiplexedConnection,
) -> bool {
    let mut cursor: u64 = 0;
    loop {
        if !term.is_leader() {
            return false;
        }
        let scanned: redis::RedisResult<(u64, Vec<String>)> = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg("session:stale:*")
            .arg("COUNT")
            .arg(BATCH)
            .query_async(conn)
            .await;
        let (next, keys) = match scanned {
            Ok(page) => page,
            Err(err) => {
                eprintln!("{}: scan failed: {err}", term.id());
                return false;
            }
        };
        if !keys.is_empty() {
            if let Err(err) = conn.unlink::<_, ()>(&keys).await {
                eprintln!("{}: delete failed: {err}", term.id());
                return false;
            }
        }
        if next == 0 {
            return true;
        }
        cursor = next;
    }
}
