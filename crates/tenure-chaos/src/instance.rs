//! The processes under test: an instance campaigning through the library,
//! and the writer that `tenure run` supervises in CLI mode. While leader,
//! both perform a fenced write to the shared resource every tick and log
//! every attempt.

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
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

/// How a library-mode instance campaigns.
#[derive(Debug, Clone)]
pub struct Campaign {
    pub redis_url: String,
    /// The id it campaigns under (two processes share one under `dup-id`).
    pub id: String,
    pub ttl: Duration,
    /// The largest ttl in the election, when ttls are mixed.
    pub max_ttl: Option<Duration>,
    /// Act on the local deadline (off: the unsafe mode that shows the
    /// checker can fail).
    pub deadline: bool,
    /// Switch back on the bugs issue 9 fixed (failing-mode tests).
    pub issue_9_bugs: bool,
    /// Fixed bugs of one store switched back on, by name ([`STORE_BUGS`]).
    pub store_bugs: Vec<String>,
}

/// Fixed bugs of one store that `--unsafe-bug NAME` switches back on in
/// every library-mode instance, for failing-mode tests: each is one hidden
/// `unsafe_*` switch of [`tenure::ElectionBuilder`].
pub const STORE_BUGS: [&str; 7] = [
    "etcd-tokens-without-clock",
    "etcd-no-hedges",
    "first-sentinel-only",
    "zk-ignore-witness",
    "zk-tokens-without-clock",
    "sqlite-ignore-rollback",
    "postgres-ignore-epoch",
];

/// `builder` with the store bug `name` switched back on.
fn with_store_bug(builder: tenure::ElectionBuilder, name: &str) -> tenure::ElectionBuilder {
    match name {
        "etcd-tokens-without-clock" => builder.unsafe_etcd_tokens_without_clock(true),
        "etcd-no-hedges" => builder.unsafe_etcd_no_hedges(true),
        "first-sentinel-only" => builder.unsafe_first_sentinel_only(true),
        "zk-ignore-witness" => builder.unsafe_zk_ignore_witness(true),
        "zk-tokens-without-clock" => builder.unsafe_zk_tokens_without_clock(true),
        "sqlite-ignore-rollback" => builder.unsafe_sqlite_ignore_rollback(true),
        "postgres-ignore-epoch" => builder.unsafe_postgres_ignore_epoch(true),
        // Refused by the harness before any instance starts.
        _ => builder,
    }
}

/// Why an instance stopped acting on a term.
enum End {
    Shutdown,
    Lost,
    /// `churn` (SIGUSR1): drop the term without resigning, campaign again.
    Churn,
    /// `rollback` (SIGUSR2): resign, then campaign again shortly after.
    Handover,
}

/// The signals the harness sends an instance.
struct Signals {
    /// SIGTERM or SIGINT: resign and exit.
    shutdown: Pin<Box<dyn Future<Output = ()>>>,
    /// SIGUSR1: `churn`.
    churn: tokio::signal::unix::Signal,
    /// SIGUSR2: `rollback`'s hand-over.
    handover: tokio::signal::unix::Signal,
}

/// A library-mode instance at work: its name, its event log, the signals
/// it listens to and its connection to the resource.
struct Instance {
    inst: String,
    log: EventLog,
    signals: Signals,
    resource: Resource,
}

/// Library mode: campaign, write while leader, log everything, until SIGTERM.
///
/// With `deadline = false` (the unsafe mode that shows the checker can
/// fail), the instance ignores its local deadline and, like the seed
/// documents' design, trusts a flag that a heartbeat task refreshes once per
/// renew interval.
///
/// Two signals make the leader misbehave the way applications do:
/// - SIGUSR1 (`churn`): it stops using its term without resigning and
///   campaigns again at once on the same `Election`. Odd churns drop every
///   handle (the keeper releases the lease in the background, racing the new
///   campaign); even ones keep a stale handle and call `resign()` on it just
///   after the new campaign began.
/// - SIGUSR2 (`rollback`'s hand-over): it resigns, and campaigns again a
///   tenth of a ttl later, so another instance leads in between.
pub async fn run_instance(settings: Settings, campaign: Campaign) -> Result<(), String> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut log = EventLog::create(&settings.log).map_err(|e| e.to_string())?;
    // Listen for the harness's SIGTERM from the start, and only then say
    // so: the harness waits for this first line before stopping the run,
    // so an instance it respawned just before exits 0 instead of dying of
    // the signal.
    let mut terminate = signal(SignalKind::terminate()).map_err(|e| e.to_string())?;
    let mut interrupt = signal(SignalKind::interrupt()).map_err(|e| e.to_string())?;
    log.record(&Event::Start {
        inst: settings.inst.clone(),
        t: now_ns(),
    });
    log.healthy()?;
    let mut signals = Signals {
        shutdown: Box::pin(async move {
            tokio::select! {
                _ = terminate.recv() => {}
                _ = interrupt.recv() => {}
            }
        }),
        churn: signal(SignalKind::user_defined1()).map_err(|e| e.to_string())?,
        handover: signal(SignalKind::user_defined2()).map_err(|e| e.to_string())?,
    };
    let resource = tokio::select! {
        resource = Resource::connect(&settings.resource_url, settings.fencing) => resource?,
        _ = &mut signals.shutdown => return Ok(()),
    };
    let Some(election) = build_election(&campaign, &mut signals.shutdown).await? else {
        return Ok(());
    };
    let mut me = Instance {
        inst: settings.inst,
        log,
        signals,
        resource,
    };
    let mut churns = 0u32;
    loop {
        let campaigning = election.campaign();
        tokio::pin!(campaigning);
        let term = loop {
            tokio::select! {
                term = &mut campaigning => break term.map_err(|e| e.to_string())?,
                _ = &mut me.signals.shutdown => return Ok(()),
                // Not leading: nothing to churn or hand over.
                _ = me.signals.churn.recv() => {}
                _ = me.signals.handover.recv() => {}
            }
        };
        me.log.record(&Event::Elected {
            inst: me.inst.clone(),
            token: term.token(),
            t: now_ns(),
        });
        me.log.healthy()?;
        let end = me.lead(&election, &term, campaign.deadline).await?;
        if me
            .end_term(end, term, campaign.deadline, campaign.ttl, &mut churns)
            .await?
        {
            return Ok(());
        }
    }
}

/// The instance's election, built again and again while the proxy cuts it
/// off or the store fails over; `None` on shutdown.
async fn build_election(
    campaign: &Campaign,
    shutdown: &mut Pin<Box<dyn Future<Output = ()>>>,
) -> Result<Option<Election>, String> {
    let ttl = campaign.ttl;
    loop {
        let mut builder = Election::builder(ELECTION)
            .redis(&campaign.redis_url)
            .ttl(ttl)
            .id(&campaign.id)
            .unsafe_issue_9_bugs(campaign.issue_9_bugs);
        if let Some(max_ttl) = campaign.max_ttl {
            builder = builder.max_ttl(max_ttl);
        }
        for bug in &campaign.store_bugs {
            builder = with_store_bug(builder, bug);
        }
        // The proxy may be cutting us off right now, or the store failing
        // over; keep trying.
        let built = tokio::select! {
            built = builder.build() => built,
            _ = &mut *shutdown => return Ok(None),
        };
        match built {
            Ok(election) => return Ok(Some(election)),
            Err(err) if err.is_transient() => tokio::select! {
                _ = tokio::time::sleep(ttl / 4) => {}
                _ = &mut *shutdown => return Ok(None),
            },
            Err(err) => return Err(err.to_string()),
        }
    }
}

impl Instance {
    /// Act on `term`: a write to the resource every tick, each logged,
    /// until the term is lost (by its deadline or, with `deadline` off,
    /// by the heartbeat's flag) or a signal ends it.
    async fn lead(
        &mut self,
        election: &Election,
        term: &Leadership,
        deadline: bool,
    ) -> Result<End, String> {
        let believes = Arc::new(AtomicBool::new(true));
        let heartbeat = (!deadline).then(|| {
            tokio::spawn(naive_heartbeat(
                election.clone(),
                term.clone(),
                believes.clone(),
            ))
        });
        let end = loop {
            tokio::select! {
                _ = tokio::time::sleep(TICK) => {}
                _ = &mut self.signals.shutdown => break End::Shutdown,
                _ = self.signals.churn.recv() => break End::Churn,
                _ = self.signals.handover.recv() => break End::Handover,
            }
            let t = now_ns();
            let until = if deadline {
                if !term.is_leader() {
                    break End::Lost;
                }
                deadline_ns(term.deadline())
            } else {
                if !believes.load(Ordering::SeqCst) {
                    break End::Lost;
                }
                u64::MAX
            };
            if let Some(ok) = self.resource.write(term.token(), &self.inst).await {
                self.log.record(&Event::Write {
                    inst: self.inst.clone(),
                    token: term.token(),
                    t,
                    until,
                    ok,
                });
                self.log.healthy()?;
            }
        };
        if let Some(heartbeat) = heartbeat {
            heartbeat.abort();
        }
        Ok(end)
    }

    /// Leave `term` the way `end` says, and log it; `true` when the
    /// instance is to exit (shutdown), else it campaigns again.
    async fn end_term(
        &mut self,
        end: End,
        term: Leadership,
        deadline: bool,
        ttl: Duration,
        churns: &mut u32,
    ) -> Result<bool, String> {
        match end {
            End::Shutdown => {
                let _ = term.resign().await;
                self.log
                    .record(&lost(&self.inst, &term, LostReason::Shutdown));
                self.log.healthy()?;
                return Ok(true);
            }
            End::Lost => {
                let reason = term.lost_reason().unwrap_or(LostReason::DeadlinePassed);
                self.log.record(&lost(&self.inst, &term, reason));
                self.log.healthy()?;
                if !deadline {
                    // Make sure the keeper has let go before campaigning again.
                    let _ = term.resign().await;
                }
            }
            End::Churn => {
                // The instance stops acting now; the term itself lives on
                // until its keeper (or the stale handle) lets go.
                self.log.record(&Event::Lost {
                    inst: self.inst.clone(),
                    token: term.token(),
                    t: now_ns(),
                    reason: "dropped".into(),
                });
                self.log.healthy()?;
                *churns += 1;
                if churns.is_multiple_of(2) {
                    let stale = term;
                    tokio::spawn(async move {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        let _ = stale.resign().await;
                    });
                } else {
                    // Every handle: the keeper releases in the background.
                    drop(term);
                }
            }
            End::Handover => {
                let _ = term.resign().await;
                self.log
                    .record(&lost(&self.inst, &term, LostReason::Resigned));
                self.log.healthy()?;
                tokio::time::sleep(ttl / 10).await;
            }
        }
        Ok(false)
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
    log.healthy()?;
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
            log.healthy()?;
        }
    }
}
