//! The HTTP side of the `tenure` command: the operations endpoint of
//! `tenure run --metrics-addr` (Prometheus metrics, liveness, readiness)
//! here, and the server both it and `tenure serve`'s API ([`crate::api`])
//! run on.
//!
//! `/healthz` fails when the run loop is wedged (like client-go's leader
//! election health adaptor): this instance still runs CMD as leader although
//! its local deadline passed more than a grace ago, which a working loop
//! never allows. `/readyz` succeeds once Redis was reached and the election
//! is running.
//!
//! A handful of routes need no router: this is hyper's HTTP/1 server with a
//! `match` on the path. What keeps it answering under abuse (20,000 idle
//! connections exhausted the file descriptors before) is hyper's and
//! tokio's, not hand-written parsing:
//! - at most [`Limits::max_connections`] connections are served at once (a
//!   semaphore over accepted connections); one over the limit is closed as
//!   soon as it is accepted, so it holds no file descriptor;
//! - a client must send its request head within [`Limits::header_read`]
//!   (hyper's `header_read_timeout`), so idle and slow-header connections
//!   free their slot quickly;
//! - connections are not kept alive, and each is closed after
//!   [`Limits::lifetime`] whatever it is doing (a client that never reads
//!   its response, or an event stream: its client reconnects).

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tokio_util::task::TaskTracker;

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

/// How much of the process the endpoint may take.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Connections served at once.
    pub max_connections: usize,
    /// Time for a client to send its request head.
    pub header_read: Duration,
    /// Time a connection may stay open at all.
    pub lifetime: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            // Prometheus and a kubelet need one or two each.
            max_connections: 64,
            header_read: Duration::from_secs(5),
            lifetime: Duration::from_secs(30),
        }
    }
}

/// A response body: a whole text, or a stream (server-sent events).
pub type Body = BoxBody<Bytes, Infallible>;

/// What a server answers: one response per request.
pub type Handler = Arc<
    dyn Fn(Request<hyper::body::Incoming>) -> Pin<Box<dyn Future<Output = Response<Body>> + Send>>
        + Send
        + Sync,
>;

/// A response with a whole body.
pub fn respond(status: StatusCode, content_type: &str, body: impl Into<Bytes>) -> Response<Body> {
    let mut response = Response::new(Full::new(body.into()).boxed());
    *response.status_mut() = status;
    if let Ok(value) = hyper::header::HeaderValue::from_str(content_type) {
        response
            .headers_mut()
            .insert(hyper::header::CONTENT_TYPE, value);
    }
    response
}

/// A plain-text response.
pub fn text(status: StatusCode, body: impl Into<String>) -> Response<Body> {
    respond(status, "text/plain; charset=utf-8", body.into())
}

/// Bind `addr` and serve `tenure run`'s operations endpoint in the background.
pub async fn serve(
    addr: SocketAddr,
    metrics: PrometheusHandle,
    health: Health,
    slack: Duration,
) -> Result<SocketAddr, Failure> {
    serve_with(addr, metrics, health, slack, Limits::default()).await
}

/// [`serve`] with explicit limits.
pub async fn serve_with(
    addr: SocketAddr,
    metrics: PrometheusHandle,
    health: Health,
    slack: Duration,
    limits: Limits,
) -> Result<SocketAddr, Failure> {
    let routes = Arc::new(Routes {
        metrics,
        health,
        slack,
    });
    let handler: Handler = Arc::new(move |request| {
        let response = routes.answer(&request);
        Box::pin(std::future::ready(response))
    });
    let (bound, _connections) = listen(addr, "metrics", handler, limits).await?;
    tracing::info!(addr = %bound, "serving /metrics, /healthz, /readyz");
    Ok(bound)
}

/// Bind `addr` and answer every request on it with `handler`, in the
/// background. `what` names the endpoint in errors. The tracker counts the
/// open connections, so that a shutdown can let them finish.
pub async fn listen(
    addr: SocketAddr,
    what: &str,
    handler: Handler,
    limits: Limits,
) -> Result<(SocketAddr, TaskTracker), Failure> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| Failure::new(USAGE, format!("cannot listen on {addr} for {what}: {e}")))?;
    let bound = listener
        .local_addr()
        .map_err(|e| Failure::new(USAGE, format!("cannot listen on {addr} for {what}: {e}")))?;
    let connections = TaskTracker::new();
    tokio::spawn(accept_loop(listener, handler, limits, connections.clone()));
    Ok((bound, connections))
}

struct Routes {
    metrics: PrometheusHandle,
    health: Health,
    slack: Duration,
}

impl Routes {
    fn answer<B>(&self, request: &Request<B>) -> Response<Body> {
        match (request.method(), request.uri().path()) {
            (&Method::GET, "/metrics") => text(StatusCode::OK, self.metrics.render()),
            (&Method::GET, "/healthz") => match self.health.check_live(self.slack) {
                Ok(()) => text(StatusCode::OK, "ok\n"),
                Err(why) => text(StatusCode::SERVICE_UNAVAILABLE, format!("wedged: {why}\n")),
            },
            (&Method::GET, "/readyz") if self.health.ready() => text(StatusCode::OK, "ready\n"),
            (&Method::GET, "/readyz") => text(StatusCode::SERVICE_UNAVAILABLE, "starting\n"),
            (_, "/metrics" | "/healthz" | "/readyz") => {
                text(StatusCode::METHOD_NOT_ALLOWED, "GET only\n")
            }
            _ => text(StatusCode::NOT_FOUND, "not found\n"),
        }
    }
}

async fn accept_loop(
    listener: TcpListener,
    handler: Handler,
    limits: Limits,
    connections: TaskTracker,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _peer)) => stream,
            Err(err) => {
                // Out of file descriptors, or a connection reset before it
                // was accepted: neither ends the endpoint. The pause keeps a
                // persistent error from spinning.
                tracing::debug!(error = %err, "http endpoint: accept failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            // Dropping the stream closes it at once.
            tracing::debug!("http endpoint: connection limit reached; closing a new connection");
            continue;
        };
        let handler = handler.clone();
        connections.spawn(async move {
            let service = service_fn(move |request: Request<hyper::body::Incoming>| {
                let response = handler(request);
                async move { Ok::<_, Infallible>(response.await) }
            });
            let connection = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_read)
                .keep_alive(false)
                .serve_connection(TokioIo::new(stream), service);
            match tokio::time::timeout(limits.lifetime, connection).await {
                Ok(Ok(())) => {}
                Ok(Err(err)) => {
                    tracing::debug!(error = %err, "http endpoint: connection failed")
                }
                Err(_) => {
                    tracing::debug!("http endpoint: connection outlived its lifetime; closed")
                }
            }
            drop(slot);
        });
    }
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

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    async fn endpoint(limits: Limits) -> SocketAddr {
        let metrics = PrometheusBuilder::new().build_recorder().handle();
        let addr: SocketAddr = "127.0.0.1:0".parse().expect("a literal address");
        serve_with(
            addr,
            metrics,
            Health::default(),
            Duration::from_secs(1),
            limits,
        )
        .await
        .expect("binds a free port")
    }

    /// One GET over a new connection: the response, or why there was none.
    async fn get(addr: SocketAddr, path: &str) -> Result<String, String> {
        let exchange = async {
            let mut stream = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
            let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n");
            stream
                .write_all(request.as_bytes())
                .await
                .map_err(|e| e.to_string())?;
            let mut response = String::new();
            stream
                .read_to_string(&mut response)
                .await
                .map_err(|e| e.to_string())?;
            Ok(response)
        };
        tokio::time::timeout(Duration::from_secs(2), exchange)
            .await
            .map_err(|_| "no response within 2 s".to_string())?
    }

    /// Whether the server closes `stream` (EOF or reset) within `within`.
    async fn closed_within(mut stream: TcpStream, within: Duration) -> bool {
        let mut buf = [0u8; 64];
        matches!(
            tokio::time::timeout(within, stream.read(&mut buf)).await,
            Ok(Ok(0) | Err(_))
        )
    }

    #[tokio::test]
    async fn the_three_routes_answer_and_others_are_not_found() {
        let addr = endpoint(Limits::default()).await;
        let healthz = get(addr, "/healthz").await.expect("a response");
        assert!(healthz.starts_with("HTTP/1.1 200"), "{healthz}");
        let readyz = get(addr, "/readyz").await.expect("a response");
        assert!(readyz.starts_with("HTTP/1.1 503"), "{readyz}");
        let metrics = get(addr, "/metrics").await.expect("a response");
        assert!(metrics.starts_with("HTTP/1.1 200"), "{metrics}");
        let other = get(addr, "/other").await.expect("a response");
        assert!(other.starts_with("HTTP/1.1 404"), "{other}");
    }

    #[tokio::test]
    async fn connections_beyond_the_limit_are_closed_at_once() {
        let limits = Limits {
            max_connections: 8,
            header_read: Duration::from_secs(60),
            lifetime: Duration::from_secs(60),
        };
        let addr = endpoint(limits).await;
        let mut idle = Vec::new();
        for _ in 0..40 {
            idle.push(TcpStream::connect(addr).await.expect("connects"));
        }
        // The header timeout is a minute away: only the limit closes them.
        let closed = futures_util::future::join_all(
            idle.into_iter()
                .map(|stream| closed_within(stream, Duration::from_secs(3))),
        )
        .await;
        let closed = closed.iter().filter(|closed| **closed).count();
        assert_eq!(
            closed,
            40 - 8,
            "the 8 served connections stay open, the rest are closed"
        );
    }

    #[tokio::test]
    async fn healthz_answers_while_more_idle_connections_than_the_limit_are_open() {
        let limits = Limits {
            max_connections: 16,
            header_read: Duration::from_secs(1),
            lifetime: Duration::from_secs(60),
        };
        let addr = endpoint(limits).await;
        let mut idle = Vec::new();
        for _ in 0..500 {
            idle.push(TcpStream::connect(addr).await.expect("connects"));
        }
        // The idle connections hold every slot for at most the header
        // timeout; a probe that retries gets through after that.
        let deadline = Instant::now() + Duration::from_secs(15);
        let mut last = Err("not tried".to_string());
        while Instant::now() < deadline {
            last = get(addr, "/healthz").await;
            if last.as_ref().is_ok_and(|r| r.starts_with("HTTP/1.1 200")) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let response = last.expect("/healthz answered");
        assert!(response.starts_with("HTTP/1.1 200"), "{response}");
        drop(idle);
    }

    #[tokio::test]
    async fn a_slow_header_sender_is_disconnected() {
        let limits = Limits {
            max_connections: 4,
            header_read: Duration::from_millis(500),
            lifetime: Duration::from_secs(60),
        };
        let addr = endpoint(limits).await;
        let mut slow = TcpStream::connect(addr).await.expect("connects");
        slow.write_all(b"GET /healthz HTTP/1.1\r\nHost: loc")
            .await
            .expect("writes");
        // Well before the lifetime limit, well after the header timeout.
        assert!(
            closed_within(slow, Duration::from_secs(10)).await,
            "a client that never finishes its request head keeps its connection"
        );
    }
}
