//! One consumer per queue partition: four partitions, one election each,
//! shared by two instances.
//!
//! Each partition is a Redis Stream `orders:{p}`. Whoever leads the
//! election `orders-p` reads the stream in order from the partition's
//! offset and records each entry it processed. The offset is a
//! [`tenure::FencedKey`] written with the leader's token, so an instance
//! that lost the partition cannot move the offset back or forward after the
//! new owner started. Halfway through, instance A shuts down and B takes its
//! partitions over.
//!
//! Run: `cargo run -p tenure --example partition_consumers`

#[path = "common/mod.rs"]
mod common;

use std::time::Duration;

use redis::AsyncCommands;
use tenure::{Election, FencedKey, FencedWrite, Leadership};

const PARTITIONS: usize = 4;
const MESSAGES: usize = 30;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    common::init_logs();
    let (url, _server) = common::redis_url();
    let client = redis::Client::open(url.as_str())?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    for p in 0..PARTITIONS {
        let _: () = conn
            .del(&[
                format!("orders:{{{p}}}"),
                format!("orders:{{{p}}}:offset"),
                format!("orders:{{{p}}}:done"),
            ])
            .await?;
    }
    // A producer appends to every partition throughout the run.
    let producer = tokio::spawn({
        let mut conn = conn.clone();
        async move {
            for n in 0..MESSAGES {
                for p in 0..PARTITIONS {
                    let _: redis::RedisResult<String> = conn
                        .xadd(format!("orders:{{{p}}}"), "*", &[("order", n)])
                        .await;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    });

    let (stop_a, stopped_a) = tokio::sync::watch::channel(false);
    let (stop_b, stopped_b) = tokio::sync::watch::channel(false);
    let mut runners = Vec::new();
    for (instance, stopped) in [("instance-a", stopped_a), ("instance-b", stopped_b)] {
        for p in 0..PARTITIONS {
            let election = Election::builder(format!("orders-{p}"))
                .redis(&url)
                .ttl(Duration::from_secs(3))
                .id(instance)
                .build()
                .await?;
            let conn = conn.clone();
            let mut stopped = stopped.clone();
            let run = election
                .runner()
                .on_elected(move |t| {
                    println!("{instance}: owns partition {p} (token {})", t.token())
                })
                .every(Duration::from_millis(200), move |term| {
                    consume(term, p, conn.clone())
                })
                .run_until(async move {
                    let _ = stopped.wait_for(|stop| *stop).await;
                });
            runners.push((instance, tokio::spawn(run)));
        }
    }

    tokio::time::sleep(Duration::from_millis(1500)).await;
    println!("instance-a: shutting down");
    stop_a.send_replace(true);
    producer.await?;
    tokio::time::sleep(Duration::from_millis(800)).await;
    stop_b.send_replace(true);
    for (_, runner) in runners {
        runner.await??;
    }

    for p in 0..PARTITIONS {
        let done: Vec<u64> = conn.lrange(format!("orders:{{{p}}}:done"), 0, -1).await?;
        let in_order = done.windows(2).all(|w| w[0] + 1 == w[1]);
        println!(
            "partition {p}: processed {} of {MESSAGES}, in order without repeats: {in_order}",
            done.len()
        );
    }
    Ok(())
}

/// Process the partition's new entries in order, moving the fenced offset.
async fn consume(term: Leadership, p: usize, mut conn: redis::aio::MultiplexedConnection) {
    let stream = format!("orders:{{{p}}}");
    let offset = FencedKey::new(format!("orders:{{{p}}}:offset"));
    let after = match offset.get(&mut conn).await {
        Ok(Some((_, id))) => String::from_utf8_lossy(&id).into_owned(),
        Ok(None) => "0-0".to_string(),
        Err(err) => return eprintln!("{}: partition {p}: {err}", term.id()),
    };
    let entries: redis::streams::StreamRangeReply = match conn
        .xrange_count(&stream, format!("({after}"), "+", 50)
        .await
    {
        Ok(entries) => entries,
        Err(err) => return eprintln!("{}: partition {p}: {err}", term.id()),
    };
    for entry in entries.ids {
        if !term.is_leader() {
            return;
        }
        let order: u64 = entry.get("order").unwrap_or(0);
        // Move the offset first, fenced: if a newer owner has moved it, stop.
        match offset.set(&mut conn, term.token(), &entry.id).await {
            Ok(FencedWrite::Accepted) => {
                let _: redis::RedisResult<()> =
                    conn.rpush(format!("orders:{{{p}}}:done"), order).await;
            }
            Ok(FencedWrite::Rejected { .. }) | Err(_) => return,
        }
    }
}
