//! Three replicas of a scheduler; only the leader triggers due jobs.
//!
//! Jobs wait in a sorted set scored by due time. Every tick (5 s in the
//! seed; 1 s here to keep the demo short) the leader takes the due ones. A
//! job is claimed with `ZREM`, which succeeds for exactly one caller, so even
//! the rare overlap of an old and a new leader cannot run a job twice; the
//! claim also records the claimer's fencing token for the audit trail.
//! Halfway through, the leader shuts down gracefully and another replica
//! takes over within milliseconds.
//!
//! Run: `cargo run -p tenure --example scheduler` (uses `$REDIS_URL`, or
//! starts a private redis-server).

#[path = "common/mod.rs"]
mod common;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis::AsyncCommands;
use tenure::{Election, Leadership};

const JOBS: u32 = 12;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    common::init_logs();
    let (url, _server) = common::redis_url();
    let client = redis::Client::open(url.as_str())?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    let _: () = redis::cmd("DEL")
        .arg(&["sched:due", "sched:ran"])
        .query_async(&mut conn)
        .await?;
    let now = now_ms();
    for job in 0..JOBS {
        // One job falls due every 500 ms.
        let _: () = conn
            .zadd(
                "sched:due",
                format!("job-{job}"),
                now + u64::from(job) * 500,
            )
            .await?;
    }

    let mut replicas = Vec::new();
    for name in ["replica-a", "replica-b", "replica-c"] {
        let election = Election::builder("example-scheduler")
            .redis(&url)
            .ttl(Duration::from_secs(3))
            .id(name)
            .build()
            .await?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let conn = conn.clone();
        let run = election
            .runner()
            .on_elected(move |term| println!("{name}: elected (token {})", term.token()))
            .on_revoked(move |reason| println!("{name}: no longer leader ({reason})"))
            .every(Duration::from_secs(1), move |term| {
                trigger_due_jobs(term, conn.clone())
            })
            .run_until(async {
                let _ = stopped.await;
            });
        replicas.push((name, stop, tokio::spawn(run)));
    }

    tokio::time::sleep(Duration::from_secs(3)).await;
    // Stop whoever leads now, the way SIGTERM would.
    let leader = Election::builder("example-scheduler")
        .redis(&url)
        .build()
        .await?
        .leader()
        .await?;
    if let Some(leader) = leader {
        if let Some(i) = replicas.iter().position(|(name, _, _)| *name == leader.id) {
            let (name, stop, task) = replicas.remove(i);
            println!("{name}: shutting down");
            let _ = stop.send(());
            task.await??;
        }
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    for (_, stop, task) in replicas {
        let _ = stop.send(());
        task.await??;
    }

    let ran: Vec<(String, String)> = conn.hgetall("sched:ran").await?;
    let left: u32 = conn.zcard("sched:due").await?;
    println!("jobs run: {} of {JOBS} (each exactly once: the claims are a hash keyed by job); still due: {left}", ran.len());
    Ok(())
}

/// One scheduler tick: claim and run every job that is due.
async fn trigger_due_jobs(term: Leadership, mut conn: redis::aio::MultiplexedConnection) {
    let due: Vec<String> = match conn.zrangebyscore("sched:due", 0, now_ms()).await {
        Ok(due) => due,
        Err(err) => return eprintln!("{}: cannot read due jobs: {err}", term.id()),
    };
    for job in due {
        if !term.is_leader() {
            return; // stop at once; the next leader picks up the rest
        }
        let claimed: redis::RedisResult<i64> = conn.zrem("sched:due", &job).await;
        if claimed == Ok(1) {
            let _: redis::RedisResult<()> = conn.hset("sched:ran", &job, term.token()).await;
            println!("{}: ran {job} (token {})", term.id(), term.token());
        }
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
