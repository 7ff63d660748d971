//! The seed's first example, done right: a report mailed at 02:00 by three
//! replicas, once, on one of them.
//!
//! Each replica runs `Runner::cron` on the same schedule. The leader
//! claims each slot in Redis before running it, so a slot runs at most
//! once across failovers, and slots stay on the calendar (a report that
//! took ten minutes does not move tomorrow's). To keep the demo short,
//! the "02:00 report" falls due every two seconds here; halfway through,
//! the leader shuts down and another replica takes the next slots.
//!
//! Run: `cargo run -p tenure --example nightly_report` (uses `$REDIS_URL`,
//! or starts a private redis-server).

#[path = "common/mod.rs"]
mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use tenure::{Election, Schedule};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    common::init_logs();
    let (url, _server) = common::redis_url();
    // In production: Schedule::cron("0 2 * * *")?.time_zone("Europe/Berlin")?
    let schedule = Schedule::cron("*/2 * * * * *")?.starting_deadline(Duration::from_secs(10));
    // Which replica mailed the report of each slot (a mailbox, here).
    let mailed: Arc<Mutex<BTreeMap<SystemTime, Vec<String>>>> = Arc::default();

    let mut replicas = Vec::new();
    for name in ["replica-a", "replica-b", "replica-c"] {
        let election = Election::builder("example-nightly-report")
            .redis(&url)
            .ttl(Duration::from_secs(3))
            .id(name)
            .build()
            .await?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let mailed = mailed.clone();
        let run = election
            .runner()
            .on_elected(move |term| println!("{name}: elected (token {})", term.token()))
            .cron(schedule.clone(), move |term, slot| {
                let mailed = mailed.clone();
                async move {
                    // A real report would fence its writes with term.token().
                    let at = jiff::Timestamp::try_from(slot).map_err(|_| "a slot after 9999")?;
                    println!(
                        "{name}: mailing the report of {at} (token {})",
                        term.token()
                    );
                    let mut mailed = mailed.lock().map_err(|_| "poisoned")?;
                    mailed.entry(slot).or_default().push(name.to_string());
                    Ok::<(), &str>(())
                }
            })
            .run_until(async {
                let _ = stopped.await;
            });
        replicas.push((name, stop, tokio::spawn(run)));
    }

    // A fresh redis-server grants no lease for a ttl (it may have lost
    // some), then the leader runs a few slots.
    tokio::time::sleep(Duration::from_secs(8)).await;
    // Stop whoever leads now, the way SIGTERM would.
    let observer = Election::builder("example-nightly-report")
        .redis(&url)
        .build()
        .await?;
    if let Some(leader) = observer.leader().await? {
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

    let mailed = mailed.lock().map_err(|_| "poisoned")?;
    let twice = mailed.values().filter(|by| by.len() > 1).count();
    println!(
        "slots run: {}, by {:?}; mailed twice: {twice}",
        mailed.len(),
        mailed
            .values()
            .flatten()
            .collect::<std::collections::BTreeSet<_>>()
    );
    Ok(())
}
