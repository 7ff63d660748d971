//! `--at-most-every`: the cluster-wide "last successful run" marker.
//!
//! The marker is a [`tenure::FencedKey`] in the election's hash slot whose
//! value is the Redis server's clock (ms) when the run succeeded; it is
//! written with the term's fencing token, so a stale leader cannot record a
//! run. Using the server's clock gives every host the same notion of "now".

use std::time::Duration;

use tenure::admin::Connection;
use tenure::{admin, FencedKey, FencedWrite};

use crate::cli::RunArgs;
use crate::exit::Failure;

pub struct Marker {
    conn: Connection,
    key: FencedKey,
    period: Duration,
}

impl Marker {
    pub async fn connect(args: &RunArgs, period: Duration) -> Result<Self, Failure> {
        if args.redis.url.starts_with("etcd://") || args.redis.url.starts_with("etcds://") {
            return Err(Failure::new(
                crate::exit::USAGE,
                "--at-most-every keeps its marker in Redis; it does not work with an etcd \
                 store yet",
            ));
        }
        let conn = admin::connect(
            &args.redis.url,
            args.redis.tls_ca.as_deref(),
            Duration::from_secs(2),
        )
        .await?;
        let key = FencedKey::new(admin::last_run_key(&args.redis.prefix, &args.election)?);
        Ok(Marker { conn, key, period })
    }

    /// `Some(explanation)` when the command already succeeded within the period.
    pub async fn recent_run(&mut self) -> Result<Option<String>, Failure> {
        let Some((_, value)) = self.key.get(&mut self.conn).await? else {
            return Ok(None);
        };
        let last_ms: u64 = String::from_utf8_lossy(&value).parse().map_err(|_| {
            Failure::new(
                crate::exit::UNAVAILABLE,
                format!(
                    "key {} holds a marker tenure did not write; delete it",
                    self.key.key()
                ),
            )
        })?;
        let now_ms = admin::server_time_ms(&mut self.conn).await?;
        let age = Duration::from_millis(now_ms.saturating_sub(last_ms));
        Ok((age < self.period).then(|| {
            format!(
                "the command last succeeded {} ago, within --at-most-every {}",
                humantime::format_duration(Duration::from_secs(age.as_secs())),
                humantime::format_duration(self.period)
            )
        }))
    }

    /// Record a successful run by the term with `token` (best effort: a
    /// failure means the next cron run may repeat the job, which is logged).
    pub async fn record_run(&mut self, token: u64) {
        let written = match admin::server_time_ms(&mut self.conn).await {
            Ok(now_ms) => {
                self.key
                    .set(&mut self.conn, token, now_ms.to_string())
                    .await
            }
            Err(err) => Err(err),
        };
        match written {
            Ok(FencedWrite::Rejected { highest }) => {
                tracing::warn!(
                    highest,
                    token,
                    "a newer leader recorded a run; this run's marker was rejected"
                )
            }
            Ok(_accepted) => {}
            Err(err) => {
                tracing::error!(error = %err, "could not record the run; another host may repeat it")
            }
        }
    }
}
