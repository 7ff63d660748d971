//! One consumer per queue partition, shared fairly by a partition set.
//!
//! Eight partitions, each a Redis Stream `orders:{p}`, are shared by the
//! live members of the group `orders` (two instances here, each a
//! [`tenure::PartitionSet`]): each member owns its fair share, renews all
//! its leases in one round trip per interval, and reads its partitions in
//! order from each partition's offset. The offset is a
//! [`tenure::FencedKey`] written with the partition's token, so a member
//! that lost a partition cannot move its offset after the new owner started.
//! Halfway through, instance A shuts down and B takes its partitions over
//! within milliseconds (A releases them once their consumers stopped).
//!
//! Run: `cargo run -p tenure --example partition_consumers`

#[path = "common/mod.rs"]
mod common;

use std::time::Duration;

use redis::AsyncCommands;
use tenure::{FencedKey, FencedWrite, Leadership, PartitionSet};

const PARTITIONS: usize = 8;
const MESSAGES: usize = 30;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    common::init_logs();
    let (url, _server) = common::redis_url();
    let client = redis::Client::open(url.as_str())?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    let names: Vec<String> = (0..PARTITIONS).map(|p| format!("orders-{p}")).collect();
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
                tokio::time::sleep(Duration::from_millis(150)).await;
            }
        }
    });

    let mut members = Vec::new();
    for instance in ["instance-a", "instance-b"] {
        let set = PartitionSet::builder("orders", names.clone())
            .redis(&url)
            .ttl(Duration::from_secs(2))
            .id(instance)
            .build()
            .await?;
        let observer = set.observer();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let conn = conn.clone();
        let run = set.run(
            move |partition, term| consume(instance, partition, term, conn.clone()),
            async {
                let _ = stopped.await;
            },
        );
        members.push((instance, observer, stop, tokio::spawn(run)));
    }

    tokio::time::sleep(Duration::from_secs(3)).await;
    for (instance, observer, _, _) in &members {
        println!("{instance} owns {:?}", observer.owned());
    }
    let (_, _, stop_a, run_a) = members.remove(0);
    println!("instance-a: shutting down");
    let _ = stop_a.send(());
    run_a.await??;
    tokio::time::sleep(Duration::from_millis(500)).await;
    println!("instance-b owns {} partitions", members[0].1.owned().len());
    producer.await?;
    tokio::time::sleep(Duration::from_millis(800)).await;
    for (_, _, stop, run) in members {
        let _ = stop.send(());
        run.await??;
    }

    for p in 0..PARTITIONS {
        let done: Vec<u64> = conn.lrange(format!("orders:{{{p}}}:done"), 0, -1).await?;
        let in_order = done.iter().enumerate().all(|(i, n)| *n == i as u64);
        println!(
            "partition {p}: processed {} of {MESSAGES}, in order without repeats: {in_order}",
            done.len()
        );
    }
    Ok(())
}

/// Consume one partition while its term lasts.
async fn consume(
    instance: &str,
    partition: String,
    term: Leadership,
    mut conn: redis::aio::MultiplexedConnection,
) {
    let p = partition.trim_start_matches("orders-").to_string();
    println!(
        "{instance}: consuming partition {p} (token {})",
        term.token()
    );
    let stream = format!("orders:{{{p}}}");
    let offset = FencedKey::new(format!("orders:{{{p}}}:offset"));
    while term.is_leader() {
        let after = match offset.get(&mut conn).await {
            Ok(Some((_, id))) => String::from_utf8_lossy(&id).into_owned(),
            Ok(None) => "0-0".to_string(),
            Err(err) => return eprintln!("{instance}: partition {p}: {err}"),
        };
        let entries: redis::RedisResult<redis::streams::StreamRangeReply> = conn
            .xrange_count(&stream, format!("({after}"), "+", 50)
            .await;
        for entry in entries.map(|e| e.ids).unwrap_or_default() {
            if !term.is_leader() {
                return;
            }
            let order: u64 = entry.get("order").unwrap_or(0);
            // Move the offset first, fenced: if a newer owner moved it, stop.
            match offset.set(&mut conn, term.token(), &entry.id).await {
                Ok(FencedWrite::Accepted) => {
                    let _: redis::RedisResult<()> =
                        conn.rpush(format!("orders:{{{p}}}:done"), order).await;
                }
                // Rejected, or failed.
                _ => return,
            }
        }
        tokio::select! {
            _ = term.lost() => return,
            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
    }
}
