//! The operations endpoint of `tenure run --metrics-addr`: Prometheus
//! metrics, liveness and readiness.
//!
//! `/healthz` fails when the run loop is wedged (like client-go's leader
//! election health adaptor): this instance still runs CMD as leader although
//! its local deadline passed more than a grace ago, which a working loop
//! never allows. `/readyz` succeeds once Redis was reached and the election
//! is running.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tokio::time::Instant;

use crate::exit::{Failure, USAGE};

/// What the run loop is doing, for the health checks.
#[derive(Debug, Clone, Default)]
pub enum Phase {
    #[default]
    Starting,
    Campaigning,
    /// Running CMD as leader until this local deadline (refreshed by the loop).
    Leading {
        term: tenure::Leadership,
    },
}

/// Shared between the run loop and the endpoint.
#[derive(Debug, Clone, Default)]
pub struct Health {
    phase: Arc<Mutex<Phase>>,
}

impl Health {
    pub fn set(&self, phase: Phase) {
        *self.phase.lock().unwrap_or_else(|p| p.into_inner()) = phase;
    }

    fn phase(&self) -> Phase {
        self.phase.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// `Err(reason)` when the loop is wedged.
    pub fn check_live(&self, slack: Duration) -> Result<(), String> {
        match self.phase() {
            Phase::Leading { term } if Instant::now() > term.deadline() + slack => Err(format!(
                "still running the command {:?} past the lease deadline of term {}",
                Instant::now() - term.deadline(),
                term.token()
            )),
            _ => Ok(()),
        }
    }

    pub fn ready(&self) -> bool {
        !matches!(self.phase(), Phase::Starting)
    }
}

/// Install the Prometheus recorder (before any metric is recorded).
pub fn install_recorder() -> Result<PrometheusHandle, Failure> {
    // Real histogram buckets (not client-side quantiles), so dashboards can
    // aggregate renew latency across instances.
    let buckets = [
        0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    ];
    PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Full("leader_election_renew_duration_seconds".into()),
            &buckets,
        )
        .map_err(|e| Failure::new(USAGE, format!("invalid metrics buckets: {e}")))?
        .install_recorder()
        .map_err(|e| Failure::new(USAGE, format!("cannot install the metrics recorder: {e}")))
}

/// Bind `addr` and serve the endpoint in the background.
pub async fn serve(
    addr: SocketAddr,
    metrics: PrometheusHandle,
    health: Health,
    slack: Duration,
) -> Result<SocketAddr, Failure> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| Failure::new(USAGE, format!("cannot listen on {addr} for metrics: {e}")))?;
    let bound = listener
        .local_addr()
        .map_err(|e| Failure::new(USAGE, format!("cannot listen on {addr} for metrics: {e}")))?;
    let live = health.clone();
    let app = Router::new()
        .route(
            "/metrics",
            get(move || std::future::ready(metrics.render())),
        )
        .route(
            "/healthz",
            get(move || {
                std::future::ready(match live.check_live(slack) {
                    Ok(()) => (StatusCode::OK, "ok\n".to_string()),
                    Err(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("wedged: {why}\n")),
                })
            }),
        )
        .route(
            "/readyz",
            get(move || {
                std::future::ready(if health.ready() {
                    (StatusCode::OK, "ready\n")
                } else {
                    (StatusCode::SERVICE_UNAVAILABLE, "starting\n")
                })
            }),
        );
    tokio::spawn(async move {
        if let Err(err) = axum::serve(listener, app).await {
            tracing::error!(error = %err, "metrics endpoint stopped");
        }
    });
    tracing::info!(addr = %bound, "serving /metrics, /healthz, /readyz");
    Ok(bound)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn healthz_fails_only_when_the_command_outlives_the_deadline() {
        let store = tenure::MemoryStore::new();
        let election = tenure::Election::builder("job")
            .memory(&store)
            .ttl(Duration::from_secs(3))
            .build()
            .await
            .expect("valid settings");
        let health = Health::default();
        assert!(!health.ready());
        health.set(Phase::Campaigning);
        assert!(health.ready());
        assert!(
            health.check_live(Duration::from_secs(1)).is_ok(),
            "followers are healthy"
        );

        let term = election.campaign().await.expect("elected");
        health.set(Phase::Leading { term: term.clone() });
        store.set_fault(tenure::Fault::Stall);
        tokio::time::sleep_until(term.deadline() + Duration::from_millis(500)).await;
        assert!(
            health.check_live(Duration::from_secs(1)).is_ok(),
            "within the slack"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
        let wedged = health.check_live(Duration::from_secs(1)).unwrap_err();
        assert!(wedged.contains("past the lease deadline"), "{wedged}");
    }
}
