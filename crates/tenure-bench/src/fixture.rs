//! The measurements every section shares, run on whatever store a URL
//! names (one redis-server, a Sentinel group, a Redis Cluster, etcd,
//! ZooKeeper): the floor of raw round trips, hand-overs, takeovers after a
//! crash, the requests of idle elections, and the timestamping of a
//! store's watch events. A leaf: it knows no section.

use std::time::Duration;

use redis::aio::MultiplexedConnection;
use tenure::{Election, Leadership};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::stats::Samples;

type Result<T> = std::result::Result<T, String>;

pub(crate) async fn connect(url: &str) -> Result<MultiplexedConnection> {
    let client = redis::Client::open(url).map_err(|e| e.to_string())?;
    client
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| e.to_string())
}

/// PING and EVALSHA of `return 1` back to back (a busy client), and
/// EVALSHA after 20 ms idle (a client that wakes up for each call, as a
/// keeper renewing on a timer does).
pub(crate) async fn floor(
    conn: &MultiplexedConnection,
    n: usize,
    idle_n: usize,
) -> Result<(Samples, Samples, Samples)> {
    let mut conn = conn.clone();
    let trivial = redis::Script::new("return 1");
    let _: i64 = trivial
        .invoke_async(&mut conn)
        .await
        .map_err(|e| e.to_string())?;
    let evalsha = || {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(trivial.get_hash()).arg(0);
        cmd
    };
    let (mut ping, mut busy, mut idle) =
        (Samples::default(), Samples::default(), Samples::default());
    for _ in 0..n {
        let t = Instant::now();
        let _: String = redis::cmd("PING")
            .query_async(&mut conn)
            .await
            .map_err(|e| e.to_string())?;
        ping.push(t.elapsed());
        let t = Instant::now();
        let _: i64 = evalsha()
            .query_async(&mut conn)
            .await
            .map_err(|e| e.to_string())?;
        busy.push(t.elapsed());
    }
    for _ in 0..idle_n {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let t = Instant::now();
        let _: i64 = evalsha()
            .query_async(&mut conn)
            .await
            .map_err(|e| e.to_string())?;
        idle.push(t.elapsed());
    }
    Ok((ping, busy, idle))
}

pub(crate) async fn election(url: &str, name: &str, id: &str, ttl: Duration) -> Result<Election> {
    Election::builder(name)
        .redis(url)
        .ttl(ttl)
        .id(id)
        .build()
        .await
        .map_err(|e| e.to_string())
}

/// Wait out the start-up grace period of a fresh election.
pub(crate) async fn first_term(e: &Election) -> Result<Leadership> {
    e.campaign().await.map_err(|e| e.to_string())
}

/// The floor of a hand-over by announcement, as [`handovers`] makes one:
/// after 30 ms idle, one client's EVALSHA publishes on a channel, and a
/// subscriber, on hearing it, sends an EVALSHA of its own; from the first
/// call to the second's answer. Release, announcement and acquisition
/// with nothing between them: the least a hand-over by announcement costs
/// on this host, two round trips of a woken client and one message.
pub(crate) async fn handover_floor(url: &str, rounds: usize) -> Result<Samples> {
    use futures_util::StreamExt;
    const CHANNEL: &str = "bench-handover-floor";
    let failed = |e: redis::RedisError| e.to_string();
    let client = redis::Client::open(url).map_err(failed)?;
    let mut leader = client
        .get_multiplexed_async_connection()
        .await
        .map_err(failed)?;
    let mut follower = client
        .get_multiplexed_async_connection()
        .await
        .map_err(failed)?;
    let mut pubsub = client.get_async_pubsub().await.map_err(failed)?;
    pubsub.subscribe(CHANNEL).await.map_err(failed)?;
    let mut messages = pubsub.into_on_message();
    let release = redis::Script::new("redis.call('PUBLISH', ARGV[1], 'released') return 1");
    let acquire = redis::Script::new("return 1");
    // Loaded before the first round, so every call is an EVALSHA.
    let _: i64 = acquire.invoke_async(&mut follower).await.map_err(failed)?;
    let _: String = release
        .prepare_invoke()
        .load_async(&mut leader)
        .await
        .map_err(failed)?;
    let (heard_tx, mut heard) = mpsc::channel(1);
    let listener = tokio::spawn(async move {
        while messages.next().await.is_some() {
            let answered: redis::RedisResult<i64> = acquire.invoke_async(&mut follower).await;
            if heard_tx
                .send(answered.map(|_| Instant::now()).map_err(failed))
                .await
                .is_err()
            {
                return;
            }
        }
    });
    let measured = async {
        let mut samples = Samples::default();
        for _ in 0..rounds {
            tokio::time::sleep(Duration::from_millis(30)).await;
            let t = Instant::now();
            let _: i64 = release
                .arg(CHANNEL)
                .invoke_async(&mut leader)
                .await
                .map_err(failed)?;
            let answered = heard
                .recv()
                .await
                .ok_or("the hand-over floor's subscriber stopped")??;
            samples.push(answered - t);
        }
        Ok(samples)
    }
    .await;
    listener.abort();
    measured
}

/// The election [`handovers`] hands over.
pub(crate) const HANDOVER_ELECTION: &str = "bench-handover";

/// Time from `resign()` being called to the follower's `campaign()` returning.
pub(crate) async fn handovers(url: &str, rounds: usize) -> Result<Samples> {
    let ttl = Duration::from_secs(5);
    let a = election(url, HANDOVER_ELECTION, "a", ttl).await?;
    let b = election(url, HANDOVER_ELECTION, "b", ttl).await?;
    let mut term = first_term(&a).await?;
    let (mut leader, mut follower) = (a, b);
    let mut samples = Samples::default();
    for _ in 0..rounds {
        let waiting = tokio::spawn({
            let follower = follower.clone();
            async move {
                let term = follower.campaign().await;
                (Instant::now(), term)
            }
        });
        // Let the follower find the holder and go to sleep on it.
        tokio::time::sleep(Duration::from_millis(30)).await;
        let t = Instant::now();
        term.resign().await.map_err(|e| e.to_string())?;
        let (elected, next) = waiting.await.map_err(|e| e.to_string())?;
        samples.push(elected - t);
        term = next.map_err(|e| e.to_string())?;
        std::mem::swap(&mut leader, &mut follower);
    }
    term.resign().await.map_err(|e| e.to_string())?;
    drop(leader);
    Ok(samples)
}

/// A pseudo-random number of milliseconds from the clock, to spread events
/// over a polling period.
pub(crate) fn samples_len_jitter(salt: usize) -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    u64::from(nanos / 1000) ^ salt as u64
}

/// A leader on a runtime of its own, so it can vanish like a crashed process.
pub(crate) struct Crashable {
    runtime: tokio::runtime::Runtime,
    /// When its `campaign()` returned: its lease was granted (or set)
    /// before, by the acquire that won, and renewed only after
    /// `renew_every` (ttl/3) more.
    pub(crate) elected: Instant,
}

impl Crashable {
    pub(crate) async fn lead(url: &str, name: &str, ttl: Duration) -> Result<Crashable> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        let (url, name) = (url.to_string(), name.to_string());
        let (elected_tx, elected_rx) = tokio::sync::oneshot::channel();
        runtime.spawn(async move {
            let Ok(e) = election(&url, &name, "crashing", ttl).await else {
                return;
            };
            let Ok(term) = e.campaign().await else { return };
            let _ = elected_tx.send(Instant::now());
            let _keep = (e, term);
            std::future::pending::<()>().await;
        });
        let elected = elected_rx
            .await
            .map_err(|_| "the crashing leader never led".to_string())?;
        Ok(Crashable { runtime, elected })
    }

    pub(crate) fn crash(self) {
        self.runtime.shutdown_background();
    }
}

/// Time from the crashed leader's lease expiry to the follower's election.
pub(crate) async fn takeovers(url: &str, rounds: usize) -> Result<Samples> {
    let ttl = Duration::from_secs(1);
    let mut samples = Samples::default();
    let admin = tenure::Store::open(url)
        .connect()
        .await
        .map_err(|e| e.to_string())?;
    for round in 0..rounds {
        let name = format!("bench-crash-{round}");
        let crashing = Crashable::lead(url, &name, ttl).await?;
        let follower = election(url, &name, "follower", ttl).await?;
        let waiting = tokio::spawn(async move {
            let term = follower.campaign().await;
            (Instant::now(), term)
        });
        tokio::time::sleep(Duration::from_millis(100 + samples_len_jitter(round) % 300)).await;
        crashing.crash();
        let crashed_at = Instant::now();
        let ttl_left = admin
            .leader_of("tenure", &name)
            .await
            .map_err(|e| e.to_string())?
            .map_or(Duration::ZERO, |l| l.ttl_left);
        let (elected, term) = waiting.await.map_err(|e| e.to_string())?;
        let term = term.map_err(|e| e.to_string())?;
        let expiry = crashed_at + ttl_left;
        samples.push(elected.saturating_duration_since(expiry));
        term.resign().await.map_err(|e| e.to_string())?;
    }
    Ok(samples)
}

/// Requests that clients sent during `window`, counted with MONITOR
/// (commands that scripts run inside Redis are not requests and are not
/// counted; MONITOR marks them `lua`).
pub(crate) async fn requests_during(port: u16, window: Duration) -> Result<f64> {
    tokio::task::spawn_blocking(move || {
        use std::io::{BufRead, BufReader, Write};
        let mut stream =
            std::net::TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
        stream
            .write_all(b"MONITOR\r\n")
            .map_err(|e| e.to_string())?;
        let deadline = std::time::Instant::now() + window;
        stream
            .set_read_timeout(Some(Duration::from_millis(50)))
            .map_err(|e| e.to_string())?;
        let mut reader = BufReader::new(stream);
        let mut line = String::new();
        let mut requests = 0u64;
        let mut started = false;
        while std::time::Instant::now() < deadline {
            line.clear();
            match reader.read_line(&mut line) {
                Ok(0) => break,
                Ok(_) if line.starts_with("+OK") && !started => started = true,
                Ok(_) => {
                    if line.contains("] \"") && !line.contains(" lua] ") {
                        requests += 1;
                    }
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(e) => return Err(e.to_string()),
            }
        }
        Ok(requests as f64)
    })
    .await
    .map_err(|e| e.to_string())?
}

/// Requests an idle tenure leader makes during `window`, then a leader
/// and a follower waiting in `campaign()` together (the follower's are the
/// difference), each window after half a ttl to settle. `count` counts the
/// requests the store receives during a window.
pub(crate) async fn idle_requests<C, F>(
    url: &str,
    ttl: Duration,
    window: Duration,
    count: impl Fn(Duration) -> F,
) -> Result<(C, C)>
where
    F: std::future::Future<Output = Result<C>>,
{
    let a = election(url, "bench-load", "a", ttl).await?;
    let term = first_term(&a).await?;
    tokio::time::sleep(ttl / 2).await;
    let leader = count(window).await?;
    let b = election(url, "bench-load", "b", ttl).await?;
    let follower_task = tokio::spawn(async move { b.campaign().await.map(|t| t.token()) });
    tokio::time::sleep(ttl / 2).await;
    let both = count(window).await?;
    follower_task.abort();
    term.resign().await.map_err(|e| e.to_string())?;
    Ok((leader, both))
}

/// Requests an idle tenure leader, then an idle follower, sent to the
/// redis-server on `port` during `window` each (see [`idle_requests`];
/// counted with MONITOR): the Redis baseline of the consensus sections.
pub(crate) async fn redis_idle(
    redis_url: &str,
    port: u16,
    ttl: Duration,
    window: Duration,
) -> Result<(f64, f64)> {
    let (leader, both) =
        idle_requests(redis_url, ttl, window, |w| requests_during(port, w)).await?;
    Ok((leader, both - leader))
}

/// A store's watch events as they arrive, each with the instant it arrived,
/// read by a task of its own: a busy caller delays no timestamp, and the
/// same timestamps serve etcd's watch and ZooKeeper's.
pub(crate) struct Arrivals<E> {
    events: mpsc::UnboundedReceiver<(Instant, E)>,
    task: tokio::task::JoinHandle<()>,
}

impl<E: PartialEq + std::fmt::Debug + Send + 'static> Arrivals<E> {
    /// Run `read` on a task of its own; it sends each event with its
    /// arrival instant and returns when the watch ends or nobody listens.
    pub(crate) fn spawn<F>(read: impl FnOnce(mpsc::UnboundedSender<(Instant, E)>) -> F) -> Self
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        let (sender, events) = mpsc::unbounded_channel();
        let task = tokio::spawn(read(sender));
        Arrivals { events, task }
    }

    /// When the next event equal to `kind` arrived (earlier events of other
    /// kinds are passed over).
    pub(crate) async fn next(&mut self, kind: E, limit: Duration) -> Result<Instant> {
        let wait = async {
            while let Some((at, event)) = self.events.recv().await {
                if event == kind {
                    return Ok(at);
                }
            }
            Err("the watch ended".to_string())
        };
        tokio::time::timeout(limit, wait)
            .await
            .map_err(|_| format!("no {kind:?} event within {limit:?}"))?
    }
}

impl<E> Drop for Arrivals<E> {
    fn drop(&mut self) {
        self.task.abort();
    }
}
