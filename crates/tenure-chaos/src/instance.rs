//! The processes under test: an instance campaigning through the library,
//! and the writer that `tenure run` supervises in CLI mode. While leader,
//! both perform a fenced write to the shared resource every tick and log
//! every attempt.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use tenure::{Election, Leadership, LostReason};

use crate::log::{deadline_ns, now_ns, Event, EventLog};

pub const ELECTION: &str = "chaos";
const TICK: Duration = Duration::from_millis(20);
static RESOURCE_SCRIPT: &str = include_str!("resource.lua");

/// Settings shared by the instance and the writer.
#[derive(Debug, Clone)]
pub struct Settings {
    pub inst: String,
    pub resource_url: String,
    pub log: PathBuf,
    pub fencing: bool,
}

/// The fenced resource, reached directly (never through a proxy): it
/// stands for the database the leader protects.
pub struct Resource {
    conn: MultiplexedConnection,
    script: redis::Script,
    fencing: bool,
}

impl Resource {
    pub async fn connect(url: &str, fencing: bool) -> Result<Self, String> {
        let client = redis::Client::open(url).map_err(|e| e.to_string())?;
        let conn = client
            .get_multiplexed_async_connection()
            .await
            .map_err(|e| format!("cannot reach the resource at {url}: {e}"))?;
        Ok(Resource {
            conn,
            script: redis::Script::new(RESOURCE_SCRIPT),
            fencing,
        })
    }

    /// One write; `None` when the resource could not be reached.
    pub async fn write(&mut self, token: u64, inst: &str) -> Option<bool> {
        let reply: redis::RedisResult<(i64, u64)> = self
            .script
            .key("resource")
            .key("resource:accepted")
            .arg(token)
            .arg(inst)
            .arg(if self.fencing { "1" } else { "0" })
            .invoke_async(&mut self.conn)
            .await;
        reply.ok().map(|(accepted, _)| accepted == 1)
    }
}

/// Library mode: campaign, write while leader, log everything, until SIGTERM.
///
/// With `deadline = false` (the unsafe mode that shows the checker can
/// fail), the instance ignores its local deadline and, like the seed
/// documents' design, trusts a flag that a heartbeat task refreshes once per
/// renew interval.
pub async fn run_instance(
    settings: Settings,
    redis_url: String,
    ttl: Duration,
    deadline: bool,
) -> Result<(), String> {
    let mut log = EventLog::create(&settings.log).map_err(|e| e.to_string())?;
    log.record(&Event::Start {
        inst: settings.inst.clone(),
        t: now_ns(),
    });
    let mut resource = Resource::connect(&settings.resource_url, settings.fencing).await?;
    let election = loop {
        // The proxy may be cutting us off right now; keep trying.
        match Election::builder(ELECTION)
            .redis(&redis_url)
            .ttl(ttl)
            .id(&settings.inst)
            .build()
            .await
        {
            Ok(election) => break election,
            Err(err) if err.is_transient() => tokio::time::sleep(ttl / 4).await,
            Err(err) => return Err(err.to_string()),
        }
    };
    let mut shutdown = Box::pin(tenure::shutdown_signal());
    loop {
        let term = tokio::select! {
            term = election.campaign() => term.map_err(|e| e.to_string())?,
            _ = &mut shutdown => return Ok(()),
        };
        log.record(&Event::Elected {
            inst: settings.inst.clone(),
            token: term.token(),
            t: now_ns(),
        });
        let believes = Arc::new(AtomicBool::new(true));
        let heartbeat = (!deadline).then(|| {
            tokio::spawn(naive_heartbeat(
                election.clone(),
                term.clone(),
                believes.clone(),
            ))
        });
        let stopped = loop {
            tokio::select! {
                _ = tokio::time::sleep(TICK) => {}
                _ = &mut shutdown => break true,
            }
            let t = now_ns();
            let until = if deadline {
                if !term.is_leader() {
                    break false;
                }
                deadline_ns(term.deadline())
            } else {
                if !believes.load(Ordering::SeqCst) {
                    break false;
                }
                u64::MAX
            };
            if let Some(ok) = resource.write(term.token(), &settings.inst).await {
                log.record(&Event::Write {
                    inst: settings.inst.clone(),
                    token: term.token(),
                    t,
                    until,
                    ok,
                });
            }
        };
        if let Some(heartbeat) = heartbeat {
            heartbeat.abort();
        }
        if stopped {
            let _ = term.resign().await;
            log.record(&lost(&settings.inst, &term, LostReason::Shutdown));
            return Ok(());
        }
        let reason = term.lost_reason().unwrap_or(LostReason::DeadlinePassed);
        log.record(&lost(&settings.inst, &term, reason));
        if !deadline {
            // Make sure the keeper has let go before campaigning again.
            let _ = term.resign().await;
        }
    }
}

fn lost(inst: &str, term: &Leadership, reason: LostReason) -> Event {
    Event::Lost {
        inst: inst.to_string(),
        token: term.token(),
        t: now_ns(),
        reason: reason.label().to_string(),
    }
}

/// The unsafe mode's notion of leadership: a flag refreshed once per renew
/// interval by asking Redis who leads.
async fn naive_heartbeat(election: Election, term: Leadership, believes: Arc<AtomicBool>) {
    loop {
        tokio::time::sleep(election.renew_every()).await;
        let still = matches!(election.leader().await, Ok(Some(l)) if l.id == election.id() && l.token == term.token());
        let lost_to_server = matches!(
            term.lost_reason(),
            Some(LostReason::Taken { .. } | LostReason::Expired)
        );
        if !still || lost_to_server {
            believes.store(false, Ordering::SeqCst);
            return;
        }
    }
}

/// CLI mode: the command `tenure run` supervises. It knows its token from
/// `TENURE_TOKEN` but not the lease deadline: stopping it in time is
/// `tenure run`'s job.
pub async fn run_writer(settings: Settings) -> Result<(), String> {
    let token: u64 = std::env::var("TENURE_TOKEN")
        .ok()
        .and_then(|t| t.parse().ok())
        .ok_or("TENURE_TOKEN is not set: run the writer under `tenure run`")?;
    let mut log = EventLog::create(&settings.log).map_err(|e| e.to_string())?;
    log.record(&Event::Elected {
        inst: settings.inst.clone(),
        token,
        t: now_ns(),
    });
    let mut resource = Resource::connect(&settings.resource_url, settings.fencing).await?;
    loop {
        tokio::time::sleep(TICK).await;
        let t = now_ns();
        if let Some(ok) = resource.write(token, &settings.inst).await {
            log.record(&Event::Write {
                inst: settings.inst.clone(),
                token,
                t,
                until: t,
                ok,
            });
        }
    }
}
