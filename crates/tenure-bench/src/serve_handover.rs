//! The graceful hand-over through `tenure serve`, measured as a program
//! using the sidecar sees it: SIGTERM to the leader's `tenure serve` → the
//! follower's event stream (`GET /v1/elections/NAME/events`) says
//! `"is_leader":true`.
//!
//! Two real `tenure serve` processes per round on the bench's private
//! Redis. The follower's stream is read the way a client does: when it ends
//! with its term (the old leader's), it is opened again at once, and that
//! reconnection is part of the figure. No client holds time to act from
//! the leader (it is found with the leader-only probe, which hands out
//! none), so its resign does not wait for a deadline it gave: with one, the
//! hand-over waits up to `--max-deadline` more, by design. The floor is one
//! request and answer on a new connection to the same server (`GET /healthz`).

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};

use crate::stats::Samples;

type Result<T> = std::result::Result<T, String>;

const ELECTION: &str = "bench-serve-handover";

/// Hand-overs seen on the follower's stream, and the HTTP floor.
pub struct ServeHandovers {
    pub handover: Samples,
    pub floor: Samples,
}

pub async fn measure(tenure: &Path, url: &str, rounds: usize) -> Result<ServeHandovers> {
    let mut out = ServeHandovers {
        handover: Samples::default(),
        floor: Samples::default(),
    };
    for round in 0..rounds {
        let (mut a, a_addr) = serve(tenure, url, &format!("a{round}")).await?;
        let (mut b, b_addr) = serve(tenure, url, &format!("b{round}")).await?;
        let a_leads = wait_for_leader(&a_addr, &b_addr).await?;
        let (leader, follower_addr) = if a_leads {
            (&a, &b_addr)
        } else {
            (&b, &a_addr)
        };
        // The follower's stream first says who leads: from then on it
        // follows the leader's term.
        let mut stream = open_events(follower_addr).await?;
        let first = next_event(&mut stream)
            .await?
            .ok_or("the follower's stream ended at once")?;
        if first.contains("\"is_leader\":true") {
            return Err(format!("the follower leads: {first}"));
        }
        let sent = Instant::now();
        signal(leader, Signal::SIGTERM);
        let until = sent + Duration::from_secs(10);
        loop {
            match tokio::time::timeout_at(until.into(), next_event(&mut stream)).await {
                Err(_) => return Err("the follower did not lead within 10 s".into()),
                Ok(Err(err)) => return Err(err),
                Ok(Ok(Some(event))) if event.contains("\"is_leader\":true") => break,
                Ok(Ok(Some(_))) => {}
                // The stream ended with the old term: reconnect, as a client does.
                Ok(Ok(None)) => stream = open_events(follower_addr).await?,
            }
        }
        out.handover.push(sent.elapsed());
        let floor_start = Instant::now();
        get(follower_addr, "/healthz").await?;
        out.floor.push(floor_start.elapsed());
        for child in [&mut a, &mut b] {
            signal(child, Signal::SIGTERM);
            let status = tokio::time::timeout(Duration::from_secs(10), child.wait()).await;
            if !matches!(status, Ok(Ok(s)) if s.success()) {
                signal(child, Signal::SIGKILL);
                return Err(format!("a tenure serve did not exit cleanly: {status:?}"));
            }
        }
    }
    Ok(out)
}

/// A `tenure serve` of this election on a free port, logs off, once it answers.
async fn serve(tenure: &Path, url: &str, id: &str) -> Result<(Child, String)> {
    let port = redis_process::free_port().map_err(|e| e.to_string())?;
    let addr = format!("127.0.0.1:{port}");
    let child = Command::new(tenure)
        .args([
            "serve",
            "--election",
            ELECTION,
            "--store",
            url,
            "--ttl",
            "2s",
        ])
        .args(["--id", id, "--listen", &addr])
        .env("TENURE_LOG", "off")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", tenure.display()))?;
    let until = Instant::now() + Duration::from_secs(10);
    while get(&addr, "/healthz").await.is_err() {
        if Instant::now() > until {
            return Err(format!("tenure serve on {addr} did not answer within 10 s"));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok((child, addr))
}

/// Whether `a` leads, once one of the two does.
async fn wait_for_leader(a: &str, b: &str) -> Result<bool> {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        // The leader-only probe: it hands out no time to act, so the
        // leader's resign need not wait for a client's deadline.
        for (addr, is_a) in [(a, true), (b, false)] {
            let path = format!("/readyz?leader={ELECTION}");
            if get(addr, &path).await?.starts_with("HTTP/1.1 200") {
                return Ok(is_a);
            }
        }
        if Instant::now() > until {
            return Err("nobody led within 10 s".into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// One GET on a new connection: the whole response.
async fn get(addr: &str, path: &str) -> Result<String> {
    let mut stream = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
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
}

async fn open_events(addr: &str) -> Result<BufReader<TcpStream>> {
    let mut stream = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let request = format!("GET /v1/elections/{ELECTION}/events HTTP/1.1\r\nHost: {addr}\r\n\r\n");
    stream
        .write_all(request.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    Ok(BufReader::new(stream))
}

/// The next `data:` line of a stream, or `None` when it ended.
async fn next_event(stream: &mut BufReader<TcpStream>) -> Result<Option<String>> {
    let mut line = String::new();
    loop {
        line.clear();
        let read = stream
            .read_line(&mut line)
            .await
            .map_err(|e| e.to_string())?;
        if read == 0 {
            return Ok(None);
        }
        if let Some(data) = line.trim_end().strip_prefix("data: ") {
            return Ok(Some(data.to_string()));
        }
    }
}

fn signal(child: &Child, signal: Signal) {
    if let Some(pid) = child.id() {
        let _ = kill(Pid::from_raw(pid as i32), signal);
    }
}
