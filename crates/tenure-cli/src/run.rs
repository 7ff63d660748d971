//! `tenure run`: campaign, run CMD while leader, stop it before the lease
//! could pass to anyone else, campaign again.
//!
//! The one rule everything here serves: **CMD is gone before this
//! instance's local deadline.** Losing the lease to another owner (or the
//! lease vanishing) stops CMD at once; renewals failing start the stop early
//! enough that SIGKILL lands before the deadline; a shutdown stops CMD
//! first and releases the lease only after CMD is gone.

use std::time::Duration;

use metrics::{counter, gauge};
use tenure::{Election, Leadership, LostReason};
use tokio::time::{sleep_until, Instant};
use tokio_util::sync::CancellationToken;

use crate::cli::RunArgs;
use crate::exit::{self, Failure};
use crate::http::{self, Health, Phase};
use crate::supervisor::{exit_code, Job};

/// Time allowed between SIGKILL and the job being gone, kept free before the
/// deadline (less with a margin below it, so tiny ttls still work).
const KILL_SLACK: Duration = Duration::from_millis(100);

/// How one leadership term of CMD ended.
enum Outcome {
    /// CMD exited by itself with this code.
    Exited(i32),
    /// Leadership ended (or was about to); CMD was stopped.
    Lost(LostReason),
    /// We were asked to shut down; CMD was stopped and exited with this code.
    Shutdown(i32),
}

pub async fn run(args: RunArgs) -> Result<i32, Failure> {
    let health = Health::default();
    let recorder = match args.metrics_addr {
        Some(addr) => Some((addr, http::install_recorder()?)),
        None => None,
    };
    let election = build_election(&args).await?;
    if let Some((addr, handle)) = recorder {
        http::serve(
            addr,
            handle,
            health.clone(),
            args.kill_grace + Duration::from_secs(1),
        )
        .await?;
    }
    let shutdown = CancellationToken::new();
    tokio::spawn({
        let shutdown = shutdown.clone();
        async move {
            tenure::shutdown_signal().await;
            tracing::info!("shutdown requested");
            shutdown.cancel();
        }
    });
    let mut marker = match args.at_most_every {
        Some(period) => Some(crate::marker::Marker::connect(&args, period).await?),
        None => None,
    };
    let kill_slack = KILL_SLACK.min(election.margin());
    let stop_lead = stop_lead(&election, args.kill_grace, kill_slack);
    let name = election.name().to_string();
    loop {
        health.set(Phase::Campaigning);
        let term = if args.no_wait {
            match election.try_campaign().await? {
                Some(term) => term,
                None => {
                    match election.leader().await.ok().flatten() {
                        Some(l) => eprintln!(
                            "tenure: {} (token {}) leads election {name:?}; not waiting (--no-wait)",
                            l.id, l.token
                        ),
                        None => eprintln!(
                            "tenure: election {name:?} grants no lease yet (its Redis is new, \
                             restarted or failed over less than a ttl ago); not waiting (--no-wait)"
                        ),
                    }
                    return Ok(exit::SOMEONE_ELSE_LEADS);
                }
            }
        } else {
            tokio::select! {
                term = election.campaign() => term?,
                _ = shutdown.cancelled() => {
                    let _ = election.release_if_held().await;
                    return Ok(exit::OK);
                }
            }
        };
        if let Some(marker) = marker.as_mut() {
            if let Some(skip) = marker.recent_run().await? {
                eprintln!("tenure: skipping: {skip}");
                let _ = term.resign().await;
                return Ok(exit::OK);
            }
        }
        health.set(Phase::Leading { term: term.clone() });
        let env = [
            ("TENURE_ELECTION", name.clone()),
            ("TENURE_ID", election.id().to_string()),
            ("TENURE_TOKEN", term.token().to_string()),
        ];
        let mut job = Job::start(&args.command, &env).map_err(|e| {
            Failure::new(
                exit::USAGE,
                format!("cannot start the command supervisor: {e}"),
            )
        })?;
        tracing::info!(election = %name, token = term.token(), group = job.group(), "started command as leader");
        gauge!("tenure_child_running", "election" => name.clone()).set(1.0);
        counter!("tenure_child_starts_total", "election" => name.clone()).increment(1);
        let limits = StopLimits {
            stop_lead,
            kill_grace: args.kill_grace,
            kill_slack,
        };
        let outcome = supervise(&term, &mut job, limits, &shutdown).await;
        gauge!("tenure_child_running", "election" => name.clone()).set(0.0);
        health.set(Phase::Campaigning);
        match outcome {
            Outcome::Exited(code) => {
                counter!("tenure_child_stops_total", "election" => name.clone(), "how" => "exited")
                    .increment(1);
                tracing::info!(election = %name, code, "command exited; resigning");
                if code == 0 {
                    if let Some(marker) = marker.as_mut() {
                        marker.record_run(term.token()).await;
                    }
                }
                if let Err(err) = term.resign().await {
                    tracing::warn!(error = %err, "could not release the lease; it lapses at its ttl");
                }
                return Ok(code);
            }
            Outcome::Shutdown(code) => {
                counter!("tenure_child_stops_total", "election" => name.clone(), "how" => "shutdown").increment(1);
                if let Err(err) = term.resign().await {
                    tracing::warn!(error = %err, "could not release the lease; it lapses at its ttl");
                }
                return Ok(code);
            }
            Outcome::Lost(reason) => {
                counter!("tenure_child_stops_total", "election" => name.clone(), "how" => "lost")
                    .increment(1);
                // Release only if still ours (renewals were failing); the
                // keeper checks ownership.
                let _ = term.resign().await;
                if args.once {
                    eprintln!(
                        "tenure: leadership lost while the command ran ({reason}); it was stopped"
                    );
                    return Ok(exit::LOST);
                }
                tracing::info!(election = %name, %reason, "command stopped; campaigning again");
            }
        }
    }
}

async fn build_election(args: &RunArgs) -> Result<Election, Failure> {
    let mut builder = Election::builder(&args.election)
        .redis(&args.redis.url)
        .prefix(&args.redis.prefix)
        .allow_eviction(args.redis.allow_eviction)
        .ttl(args.ttl);
    if let Some(max_ttl) = args.max_ttl {
        builder = builder.max_ttl(max_ttl);
    }
    if let Some(every) = args.renew_every {
        builder = builder.renew_every(every);
    }
    if let Some(margin) = args.margin {
        builder = builder.margin(margin);
    }
    if let Some(id) = &args.id {
        builder = builder.id(id);
    }
    if let Some(ca) = &args.redis.tls_ca {
        builder = builder.tls_ca_file(ca);
    }
    Ok(builder.build().await?)
}

/// How long before the deadline CMD's stop must begin when renewals fail:
/// the kill grace, but never so much that a merely late renewal stops CMD.
/// Half the time between the renewal being due and the deadline.
fn stop_lead(election: &Election, kill_grace: Duration, kill_slack: Duration) -> Duration {
    let slack = election
        .ttl()
        .saturating_sub(election.margin())
        .saturating_sub(election.renew_every());
    kill_grace.min(slack / 2) + kill_slack
}

/// When and how fast CMD must be stopped.
#[derive(Debug, Clone, Copy)]
struct StopLimits {
    /// Begin stopping when no more than this is left before the deadline.
    stop_lead: Duration,
    /// SIGTERM-to-SIGKILL time of a normal stop.
    kill_grace: Duration,
    /// Kept free between SIGKILL and the deadline.
    kill_slack: Duration,
}

impl StopLimits {
    /// The kill grace, capped so SIGKILL lands before the local deadline.
    fn grace(&self, term: &Leadership) -> Duration {
        self.kill_grace
            .min(term.remaining().saturating_sub(self.kill_slack))
    }
}

/// Run one term's CMD until it exits, leadership ends, or shutdown.
async fn supervise(
    term: &Leadership,
    job: &mut Job,
    limits: StopLimits,
    shutdown: &CancellationToken,
) -> Outcome {
    let stop_lead = limits.stop_lead;
    loop {
        let stop_by = term
            .deadline()
            .checked_sub(stop_lead)
            .unwrap_or_else(Instant::now);
        tokio::select! {
            status = job.wait() => {
                return Outcome::Exited(status.map(exit_code).unwrap_or(1));
            }
            reason = term.lost() => {
                tracing::warn!(%reason, "leadership lost; stopping the command now");
                let _ = job.stop(limits.grace(term)).await;
                return Outcome::Lost(reason);
            }
            _ = sleep_until(stop_by) => {
                // The deadline may have moved on since (a renewal succeeded).
                if term.remaining() > stop_lead {
                    continue;
                }
                tracing::warn!(time_left = ?term.remaining(), "renewals are failing; stopping the command before the lease deadline");
                let _ = job.stop(limits.grace(term)).await;
                return Outcome::Lost(LostReason::DeadlinePassed);
            }
            _ = shutdown.cancelled() => {
                let status = job.stop(limits.grace(term)).await;
                // Stopped by our SIGTERM/SIGKILL counts as a clean shutdown.
                let code = match status.map(exit_code) {
                    Ok(code) if code < 128 => code,
                    _ => exit::OK,
                };
                return Outcome::Shutdown(code);
            }
        }
    }
}
