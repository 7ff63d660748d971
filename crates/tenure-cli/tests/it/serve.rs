//! `tenure serve` end to end: real `serve` processes on a private Redis,
//! spoken to over HTTP the way a program in any language would.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::*;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::Value;

/// A `tenure serve` process, and the address its log says it bound.
struct Serve {
    id: String,
    child: Child,
    addr: String,
    log: std::path::PathBuf,
}

impl Serve {
    /// `tenure serve --store URL --election E... --id ID --listen 127.0.0.1:0 EXTRA...`
    fn start(url: &str, elections: &[&str], id: &str, extra: &[&str], scratch: &Scratch) -> Self {
        Self::start_with_env(url, elections, id, extra, &[], scratch)
    }

    fn start_with_env(
        url: &str,
        elections: &[&str],
        id: &str,
        extra: &[&str],
        env: &[(&str, &str)],
        scratch: &Scratch,
    ) -> Self {
        let log = scratch.path(&format!("serve-{id}.log"));
        let log_file = std::fs::File::create(&log).expect("log file");
        let mut command = tenure();
        command.args(["serve", "--store", url, "--id", id]);
        if !extra.contains(&"--listen") {
            command.args(["--listen", "127.0.0.1:0"]);
        }
        for election in elections {
            command.args(["--election", election]);
        }
        let child = command
            .args(extra)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file)
            .spawn()
            .expect("tenure serve starts");
        let mut serve = Serve {
            id: id.to_string(),
            child,
            addr: String::new(),
            log,
        };
        let mut addr = None;
        eventually_or_show(
            "serve to log the address it listens on",
            || {
                addr = listening_on(&serve.log_text());
                addr.is_some()
            },
            || serve.log_text(),
        );
        serve.addr = addr.unwrap_or_default();
        serve
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `GET /v1/elections/NAME`, as JSON.
    fn state(&self, election: &str) -> Value {
        let (status, body) = http_get(&self.addr, &format!("/v1/elections/{election}"));
        assert_eq!(status, 200, "{body}");
        serde_json::from_str(&body).expect("JSON state")
    }

    fn leads(&self, election: &str) -> bool {
        self.state(election)["is_leader"] == Value::Bool(true)
    }

    fn signal(&self, signal: Signal) {
        let _ = kill(Pid::from_raw(self.child.id() as i32), signal);
    }

    /// Wait for exit; the exit code.
    fn wait(&mut self) -> i32 {
        let deadline = Instant::now() + HANG;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status.code().unwrap_or(-1);
            }
            assert!(
                Instant::now() < deadline,
                "serve {} did not exit; log:\n{}",
                self.id,
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The address in serve's "serving leader election addr=…" log line.
fn listening_on(log: &str) -> Option<String> {
    let line = log
        .lines()
        .find(|l| l.contains("serving leader election"))?;
    let rest = &line[line.find("addr=")? + "addr=".len()..];
    Some(rest.split_whitespace().next()?.to_string())
}

/// An HTTP request on a new connection: (status, headers and body).
fn http(addr: &str, method: &str, path: &str, headers: &[&str]) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).expect("serve accepts");
    let mut request = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for header in headers {
        request.push_str(header);
        request.push_str("\r\n");
    }
    request.push_str("Content-Length: 0\r\n\r\n");
    stream.write_all(request.as_bytes()).expect("request sent");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("response read");
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, response)
}

fn body_json(response: &str) -> Value {
    let body = response.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    serde_json::from_str(body.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {response}"))
}

/// An event stream being read in the background: the events so far, and
/// whether the server ended it.
#[derive(Clone, Default)]
struct Events {
    seen: Arc<Mutex<(Vec<Value>, bool)>>,
}

impl Events {
    fn open(addr: &str, election: &str) -> Self {
        let events = Events::default();
        let mut stream = TcpStream::connect(addr).expect("serve accepts");
        write!(
            stream,
            "GET /v1/elections/{election}/events HTTP/1.1\r\nHost: {addr}\r\n\r\n"
        )
        .expect("request sent");
        let seen = events.seen.clone();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stream);
            let mut line = String::new();
            loop {
                line.clear();
                match lines.read_line(&mut line) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
                // Chunked transfer: data lines are whole within a chunk.
                if let Some(data) = line.trim_end().strip_prefix("data: ") {
                    if let Ok(event) = serde_json::from_str(data) {
                        seen.lock().expect("lock").0.push(event);
                    }
                }
            }
            seen.lock().expect("lock").1 = true;
        });
        events
    }

    fn events(&self) -> Vec<Value> {
        self.seen.lock().expect("lock").0.clone()
    }

    fn ended(&self) -> bool {
        self.seen.lock().expect("lock").1
    }
}

fn token(state: &Value) -> u64 {
    state["token"]
        .as_u64()
        .unwrap_or_else(|| panic!("no token in {state}"))
}

/// The one of `serves` that leads `election`, once one does.
fn leader_of<'a>(serves: &[&'a Serve], election: &str) -> &'a Serve {
    let mut found = None;
    eventually("one serve instance to lead", || {
        found = serves.iter().find(|s| s.leads(election)).copied();
        found.is_some()
    });
    found.expect("found")
}

#[test]
fn of_two_serve_instances_exactly_one_leads_with_a_token_and_both_name_it() {
    let redis = redis();
    let scratch = Scratch::new("serve-one");
    let a = Serve::start(&redis.url(), &["reports"], "a", &[], &scratch);
    let b = Serve::start(&redis.url(), &["reports"], "b", &[], &scratch);
    let leader = leader_of(&[&a, &b], "reports");
    let follower = if leader.id == "a" { &b } else { &a };

    let led = leader.state("reports");
    assert_eq!(led["election"], "reports");
    assert_eq!(led["leader"], leader.id.as_str());
    assert!(led["deadline_ms"].as_u64().unwrap_or(0) > 0, "{led}");
    assert!(token(&led) > 0);
    eventually("the follower to see who leads", || {
        follower.state("reports")["leader"] == leader.id.as_str()
    });
    let followed = follower.state("reports");
    assert_eq!(followed["is_leader"], false, "{followed}");
    assert_eq!(followed["token"], Value::Null);
    assert_eq!(followed["deadline_ms"], Value::Null);
    assert!(!leader.leads("reports") || !follower.leads("reports"));

    // The leader-only readiness probe and the list of elections.
    assert_eq!(
        http_get(&leader.addr, "/readyz?leader=reports").0,
        200,
        "the leader is ready for leader-only traffic"
    );
    assert_eq!(http_get(&follower.addr, "/readyz?leader=reports").0, 503);
    assert_eq!(http_get(&follower.addr, "/readyz").0, 200);
    assert_eq!(http_get(&follower.addr, "/healthz").0, 200);
    let (_, names) = http_get(&a.addr, "/v1/elections");
    assert_eq!(
        serde_json::from_str::<Value>(&names).expect("JSON"),
        serde_json::json!({"elections": ["reports"]})
    );
}

#[test]
fn sigterm_of_the_leaders_serve_hands_over_before_the_lease_could_expire_and_the_streams_show_it() {
    let redis = redis();
    let scratch = Scratch::new("serve-sigterm");
    // A long lease: a hand-over before it could expire can only be the
    // resign's doing.
    let ttl = ["--ttl", "10s"];
    let mut a = Serve::start(&redis.url(), &["mailer"], "a", &ttl, &scratch);
    let mut b = Serve::start(&redis.url(), &["mailer"], "b", &ttl, &scratch);
    let leader = leader_of(&[&a, &b], "mailer").id.clone();
    let (old, new) = if leader == "a" {
        (&mut a, &mut b)
    } else {
        (&mut b, &mut a)
    };
    let old_token = token(&old.state("mailer"));
    eventually("the follower to see who leads", || {
        new.state("mailer")["leader"] == old.id.as_str()
    });
    let old_events = Events::open(&old.addr, "mailer");
    let new_events = Events::open(&new.addr, "mailer");
    eventually("both streams to say who leads", || {
        old_events.events().len() == 1 && new_events.events().len() == 1
    });
    assert_eq!(old_events.events()[0]["is_leader"], true);
    assert_eq!(new_events.events()[0]["leader"], old.id.as_str());

    let terminated = Instant::now();
    old.signal(Signal::SIGTERM);
    eventually_or_show(
        "the other instance to lead",
        || new.leads("mailer"),
        || old.log_text(),
    );
    let handover = terminated.elapsed();
    let took_over = new.state("mailer");
    assert!(token(&took_over) > old_token, "{took_over}");
    assert!(
        handover < Duration::from_secs(9),
        "took {handover:?}: the lease's expiry, not the resign, ended the term"
    );
    println!("hand-over after SIGTERM: {handover:?}");
    assert_eq!(old.wait(), 0, "{}", old.log_text());

    // The old leader's stream ends with its term; the new leader's stream
    // reports the change and ends with the term it began in.
    eventually("the old leader's stream to end", || old_events.ended());
    let last = old_events.events().last().cloned().expect("events");
    assert_eq!(last["is_leader"], false, "{:?}", old_events.events());
    eventually("the new leader's stream to end", || new_events.ended());
    let changes = new_events.events();
    let last = changes.last().expect("events");
    assert_ne!(last["leader"], old.id.as_str(), "{changes:?}");
}

#[test]
fn deadline_ms_falls_to_zero_while_redis_is_paused_before_anyone_else_leads() {
    let redis = redis();
    let scratch = Scratch::new("serve-pause");
    let ttl = ["--ttl", "2s"];
    let a = Serve::start(&redis.url(), &["cleanup"], "a", &ttl, &scratch);
    let b = Serve::start(&redis.url(), &["cleanup"], "b", &ttl, &scratch);
    let leader = leader_of(&[&a, &b], "cleanup");
    let other = if leader.id == "a" { &b } else { &a };
    let old_token = token(&leader.state("cleanup"));

    // Writes and reads both wait: nobody can renew, nobody can acquire.
    redis
        .command(&["CLIENT", "PAUSE", "20000", "ALL"])
        .expect("CLIENT PAUSE");
    let mut left = Vec::new();
    eventually_or_show(
        "the leader's deadline_ms to reach 0 while Redis is paused",
        || {
            let state = leader.state("cleanup");
            left.push(state["deadline_ms"].as_u64());
            state["deadline_ms"].as_u64().unwrap_or(0) == 0 && state["is_leader"] == false
        },
        || leader.log_text(),
    );
    // Nobody else leads, and Redis is still paused (no one could have).
    assert!(!other.leads("cleanup"));
    let paused = redis
        .command(&["CLIENT", "UNPAUSE"])
        .expect("CLIENT UNPAUSE");
    assert_eq!(paused, "OK");
    let counted: Vec<u64> = left.iter().flatten().copied().collect();
    assert!(
        counted.windows(2).all(|w| w[1] <= w[0]),
        "deadline_ms only falls while nothing can renew: {counted:?}"
    );

    let next = leader_of(&[&a, &b], "cleanup");
    assert!(token(&next.state("cleanup")) > old_token);
}

#[test]
fn post_resign_hands_over_and_answers_409_when_not_leading() {
    let redis = redis();
    let scratch = Scratch::new("serve-resign");
    let a = Serve::start(&redis.url(), &["queue"], "a", &["--ttl", "3s"], &scratch);
    let b = Serve::start(&redis.url(), &["queue"], "b", &["--ttl", "3s"], &scratch);
    let leads_a = leader_of(&[&a, &b], "queue").id == "a";
    let (leader, other) = if leads_a { (a, b) } else { (b, a) };
    let held = token(&leader.state("queue"));

    let (status, response) = http(&other.addr, "POST", "/v1/elections/queue/resign", &[]);
    assert_eq!(status, 409, "{response}");
    assert!(body_json(&response)["error"].is_string(), "{response}");
    let (status, response) = http(&leader.addr, "GET", "/v1/elections/queue/resign", &[]);
    assert_eq!(status, 405, "{response}");
    let (status, response) = http(
        &leader.addr,
        "POST",
        "/v1/elections/queue/resign?rejoin=later",
        &[],
    );
    assert_eq!(status, 400, "{response}");

    let (status, response) = http(&leader.addr, "POST", "/v1/elections/queue/resign", &[]);
    assert_eq!(status, 200, "{response}");
    assert_eq!(
        body_json(&response),
        serde_json::json!({"election": "queue", "resigned": true, "token": held})
    );
    assert!(!leader.leads("queue"), "a resigned term ends at once");
    eventually("the other instance to take over", || other.leads("queue"));
    assert!(token(&other.state("queue")) > held);

    // rejoin=now: alone, the instance campaigns again at once and starts
    // a new term.
    let mut leader = leader;
    let taken = token(&other.state("queue"));
    leader.signal(Signal::SIGTERM);
    assert_eq!(leader.wait(), 0);
    let (status, response) = http(
        &other.addr,
        "POST",
        "/v1/elections/queue/resign?rejoin=now",
        &[],
    );
    assert_eq!(status, 200, "{response}");
    eventually("rejoin=now to campaign again", || other.leads("queue"));
    assert!(token(&other.state("queue")) > taken);
}

#[test]
fn an_unknown_election_is_a_404_with_a_json_error() {
    let redis = redis();
    let scratch = Scratch::new("serve-404");
    let a = Serve::start(&redis.url(), &["known"], "a", &[], &scratch);
    for (method, path) in [
        ("GET", "/v1/elections/unknown"),
        ("GET", "/v1/elections/unknown/events"),
        ("POST", "/v1/elections/unknown/resign"),
        ("GET", "/readyz?leader=unknown"),
    ] {
        let (status, response) = http(&a.addr, method, path, &[]);
        assert_eq!(status, 404, "{method} {path}: {response}");
        assert_eq!(
            body_json(&response)["error"],
            "unknown election \"unknown\"",
            "{method} {path}"
        );
    }
    let (status, response) = http(&a.addr, "HEAD", "/healthz", &[]);
    assert_eq!(status, 200, "HEAD is GET without a body: {response}");
    let (status, response) = http(&a.addr, "GET", "/v2/anything", &[]);
    assert_eq!(status, 404, "{response}");
    assert!(body_json(&response)["error"].is_string());
    // Percent-encoded names are decoded.
    let (status, response) = http(&a.addr, "GET", "/v1/elections/%6Bnown", &[]);
    assert_eq!(status, 200, "{response}");
}

#[test]
fn a_non_local_bind_needs_a_token_and_post_without_it_is_refused() {
    let redis = redis();
    let scratch = Scratch::new("serve-auth");
    let refused = tenure()
        .args(["serve", "--store", &redis.url(), "--election", "x"])
        .args(["--listen", "0.0.0.0:0"])
        .env_remove("TENURE_AUTH_TOKEN")
        .stdin(Stdio::null())
        .output()
        .expect("tenure runs");
    assert_eq!(refused.status.code(), Some(2));
    let message = one_line(&refused.stderr);
    assert!(message.contains("--auth-token-file"), "{message}");

    let secret = "s3cret-token-0123456789";
    let a = Serve::start_with_env(
        &redis.url(),
        &["x"],
        "a",
        &["--listen", "0.0.0.0:0"],
        &[("TENURE_AUTH_TOKEN", secret)],
        &scratch,
    );
    let port = a.addr.rsplit(':').next().expect("a port");
    let addr = format!("127.0.0.1:{port}");
    eventually("a to lead", || {
        http_get(&addr, "/v1/elections/x")
            .1
            .contains("\"is_leader\":true")
    });
    for headers in [
        &[][..],
        &["Authorization: Bearer wrong"][..],
        &["Authorization: s3cret-token-0123456789"][..],
    ] {
        let (status, response) = http(&addr, "POST", "/v1/elections/x/resign", headers);
        assert_eq!(status, 401, "{headers:?}: {response}");
        assert!(body_json(&response)["error"].is_string());
    }
    assert!(
        http_get(&addr, "/v1/elections/x")
            .1
            .contains("\"is_leader\":true"),
        "a refused POST changes nothing"
    );
    let bearer = format!("Authorization: Bearer {secret}");
    let (status, response) = http(&addr, "POST", "/v1/elections/x/resign", &[&bearer]);
    assert_eq!(status, 200, "{response}");
    assert!(!a.log_text().contains(secret), "the token is never logged");
}

#[test]
fn serve_works_the_same_on_etcd() {
    let cluster = etcd_process::EtcdCluster::builder()
        .election_timeout(Duration::from_millis(500))
        .start()
        .expect("an etcd cluster");
    serve_works_the_same_on(&cluster.url(), "serve-etcd");
}

#[test]
fn serve_works_the_same_on_zookeeper() {
    let ensemble = zk_process::ZkEnsemble::builder()
        .tick_time(Duration::from_millis(100))
        .start()
        .expect("a ZooKeeper ensemble");
    serve_works_the_same_on(&ensemble.url(), "serve-zk");
}

/// Two `tenure serve` on `url` hand over each election on `POST resign`
/// and every one on SIGTERM.
fn serve_works_the_same_on(url: &str, scratch: &str) {
    let scratch = Scratch::new(scratch);
    let ttl = ["--ttl", "2s"];
    let mut a = Serve::start(url, &["etl", "mail"], "a", &ttl, &scratch);
    let mut b = Serve::start(url, &["etl", "mail"], "b", &ttl, &scratch);
    for election in ["etl", "mail"] {
        let leader = leader_of(&[&a, &b], election);
        let held = token(&leader.state(election));
        let (status, response) = http(
            &leader.addr,
            "POST",
            &format!("/v1/elections/{election}/resign"),
            &[],
        );
        assert_eq!(status, 200, "{response}");
        let other = if leader.id == "a" { &b } else { &a };
        eventually("the other instance to take over", || other.leads(election));
        assert!(token(&other.state(election)) > held);
    }
    // SIGTERM resigns every held term: the other instance leads both.
    let leads_a = a.leads("etl");
    let (stop, stay) = if leads_a { (&mut a, &b) } else { (&mut b, &a) };
    stop.signal(Signal::SIGTERM);
    assert_eq!(stop.wait(), 0, "{}", stop.log_text());
    for election in ["etl", "mail"] {
        eventually("the remaining instance to lead", || stay.leads(election));
    }
}

#[test]
fn serve_answers_while_the_store_is_down_and_leads_once_it_is_up() {
    let mut redis = redis();
    let url = redis.url();
    redis.kill();
    let scratch = Scratch::new("serve-down");
    let a = Serve::start(&url, &["late"], "a", &[], &scratch);
    let (status, body) = http_get(&a.addr, "/readyz");
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("not reached"), "{body}");
    let state = a.state("late");
    assert_eq!(state["is_leader"], false, "{state}");
    let (status, response) = http(&a.addr, "POST", "/v1/elections/late/resign", &[]);
    assert_eq!(status, 409, "{response}");

    redis.resume().expect("redis starts again");
    eventually_or_show(
        "a to lead once Redis is up",
        || a.leads("late"),
        || a.log_text(),
    );
    assert_eq!(http_get(&a.addr, "/readyz").0, 200);
}

#[test]
fn wrong_credentials_end_serve_at_once_with_one_line() {
    let redis = RedisServer::builder()
        .password("right-password")
        .start()
        .expect("redis with a password");
    let url = format!("redis://:wrong-password@127.0.0.1:{}", redis.port());
    let out = tenure()
        .args(["serve", "--store", &url, "--election", "x"])
        .args(["--listen", "127.0.0.1:0"])
        .stdin(Stdio::null())
        .output()
        .expect("tenure runs");
    assert_eq!(out.status.code(), Some(69));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("wrong-password"), "{stderr}");
    let last = stderr.lines().last().unwrap_or_default();
    assert!(last.starts_with("tenure: "), "{stderr}");
}

#[test]
fn the_python_worker_acts_on_one_replica_at_a_time() {
    let redis = redis();
    let scratch = Scratch::new("serve-python");
    let ttl = ["--ttl", "2s"];
    let mut a = Serve::start(&redis.url(), &["singleton"], "a", &ttl, &scratch);
    let mut b = Serve::start(&redis.url(), &["singleton"], "b", &ttl, &scratch);
    let worker = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/sidecar/worker.py"
    );
    let ledger = scratch.path("ledger");
    let start_worker = |serve: &Serve, name: &str| -> Child {
        std::process::Command::new("python3")
            .arg(worker)
            .args(["--url", &format!("http://{}", serve.addr)])
            .args(["--election", "singleton", "--name", name, "--every", "0.05"])
            .arg("--ledger")
            .arg(&ledger)
            .stdin(Stdio::null())
            .stdout(
                std::fs::File::create(scratch.path(&format!("worker-{name}.out"))).expect("out"),
            )
            .stderr(Stdio::null())
            .spawn()
            .expect("python3 runs the example")
    };
    let mut workers = [start_worker(&a, "wa"), start_worker(&b, "wb")];
    let accepted = |ledger: &str| -> Vec<(String, u64)> {
        ledger
            .lines()
            .filter_map(|line| {
                let mut fields = line.split_whitespace();
                (fields.next()? == "ACCEPT")
                    .then(|| Some((fields.next()?.to_string(), fields.next()?.parse().ok()?)))?
            })
            .collect()
    };
    eventually("the leader's worker to write 10 times", || {
        accepted(&std::fs::read_to_string(&ledger).unwrap_or_default()).len() >= 10
    });
    let first = accepted(&std::fs::read_to_string(&ledger).unwrap_or_default());
    let acting = first[0].0.clone();
    // Stop the acting replica's serve: the other replica's worker takes over.
    let stop = if acting == "wa" { &mut a } else { &mut b };
    stop.signal(Signal::SIGTERM);
    assert_eq!(stop.wait(), 0);
    eventually("the other worker to write", || {
        accepted(&std::fs::read_to_string(&ledger).unwrap_or_default())
            .iter()
            .any(|(name, _)| name != &acting)
    });
    for worker in &mut workers {
        let _ = kill(Pid::from_raw(worker.id() as i32), Signal::SIGTERM);
        let _ = worker.wait();
    }
    let all = std::fs::read_to_string(&ledger).unwrap_or_default();
    let writes = accepted(&all);
    // One worker, then the other: never interleaved, tokens never fall,
    // and no write was refused.
    let switches = writes.windows(2).filter(|w| w[0].0 != w[1].0).count();
    assert_eq!(switches, 1, "{all}");
    assert!(writes.windows(2).all(|w| w[1].1 >= w[0].1), "{all}");
    assert!(!all.contains("REJECT"), "{all}");
}

/// The curl one-liner of the book's `tenure serve` page, ready to run
/// against `serve` with `step`.
fn readme_one_liner(serve: &Serve, step: &std::path::Path) -> String {
    let page = include_str!("../../../../docs/src/serve.md");
    let block = page
        .split("# a short step, only on the leader\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("the curl one-liner of the book's tenure serve page");
    block
        .replace("127.0.0.1:7878", &serve.addr)
        .replace("./step.sh", &step.display().to_string())
}

/// An executable shell script.
fn script(path: &std::path::Path, body: &str) {
    std::fs::write(path, format!("#!/bin/sh\n{body}")).expect("step script");
    std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("executable");
}

/// Busy loops on every core while it lives: a one-liner must be safe on
/// a loaded machine, where the time between its steps grows.
struct CpuLoad {
    stop: Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl CpuLoad {
    fn start() -> Self {
        use std::sync::atomic::{AtomicBool, Ordering};
        let stop = Arc::new(AtomicBool::new(false));
        let cores = std::thread::available_parallelism().map_or(2, usize::from);
        let threads = (0..cores)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        std::hint::spin_loop();
                    }
                })
            })
            .collect();
        CpuLoad { stop, threads }
    }
}

impl Drop for CpuLoad {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

#[test]
fn the_python_worker_refuses_a_url_without_a_scheme_at_once() {
    let worker = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/sidecar/worker.py"
    );
    // Bounded: a worker that retries for ever is killed (exit 137).
    let out = std::process::Command::new("timeout")
        .args(["-s", "KILL", "30", "python3", worker])
        .args(["--url", "127.0.0.1:7878", "--election", "e"])
        .stdin(Stdio::null())
        .output()
        .expect("python3 runs the example");
    let stderr = one_line(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("is not an http:// URL"), "{stderr}");
}

#[test]
fn the_readmes_curl_one_liners_run_the_step_on_the_leader_only() {
    let redis = redis();
    let scratch = Scratch::new("serve-curl");
    let ttl = ["--ttl", "4s"];
    let a = Serve::start(&redis.url(), &["nightly-report"], "a", &ttl, &scratch);
    let b = Serve::start(&redis.url(), &["nightly-report"], "b", &ttl, &scratch);
    let leader = leader_of(&[&a, &b], "nightly-report");
    let follower = if leader.id == "a" { &b } else { &a };
    let step = scratch.path("step.sh");
    script(
        &step,
        "echo \"ran ${TENURE_TOKEN:-without a token}\" >> \"$OUT\"\n",
    );
    let _load = CpuLoad::start();
    let run = |serve: &Serve, out: &str| {
        let status = std::process::Command::new("sh")
            .args(["-c", &readme_one_liner(serve, &step)])
            .env("OUT", scratch.path(out))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("sh runs");
        (status, scratch.read(out))
    };
    let (_, ran) = run(follower, "follower.out");
    assert_eq!(ran, "", "the follower runs no step");
    let token = token(&leader.state("nightly-report"));
    let (status, ran) = run(leader, "leader.out");
    assert!(status.success(), "{ran}");
    assert_eq!(ran, format!("ran {token}\n"));
}

#[test]
fn the_readmes_curl_one_liner_kills_its_step_before_a_resign_releases_the_lease() {
    let redis = redis();
    let scratch = Scratch::new("serve-curl-kill");
    let ttl = ["--ttl", "4s"];
    let a = Serve::start(&redis.url(), &["nightly-report"], "a", &ttl, &scratch);
    let b = Serve::start(&redis.url(), &["nightly-report"], "b", &ttl, &scratch);
    let leader = leader_of(&[&a, &b], "nightly-report");
    // A step that would run for ever: only the one-liner's kill ends it.
    let step = scratch.path("step.sh");
    script(&step, "echo started >> \"$OUT\"\nexec sleep 600\n");
    let _load = CpuLoad::start();
    let mut one_liner = std::process::Command::new("sh")
        .args(["-c", &readme_one_liner(leader, &step)])
        .env("OUT", scratch.path("step.out"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("sh runs");
    let (ended, step_ended) = std::sync::mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let status = one_liner.wait();
        let _ = ended.send(Instant::now());
        status
    });
    eventually("the step to start", || {
        scratch.read("step.out") == "started\n"
    });
    // The resign waits out the deadline the one-liner was given, then
    // releases the lease: from then on the next leader may act.
    let (status, response) = http(
        &leader.addr,
        "POST",
        "/v1/elections/nightly-report/resign",
        &[],
    );
    assert_eq!(status, 200, "{response}");
    let released = Instant::now();
    let step_ended = step_ended
        .recv_timeout(HANG)
        .expect("the one-liner ends its step");
    assert!(
        step_ended < released,
        "the step was still running {:?} after the lease was released",
        step_ended - released
    );
    let status = waiter.join().expect("waiter").expect("wait");
    // timeout's status after SIGKILL (137), or SIGKILL itself when the
    // shell ran timeout in its place and timeout killed its own group.
    assert!(
        status.code() == Some(137) || status.signal() == Some(9),
        "the step was killed: {status:?}"
    );
}

#[test]
fn a_resign_waits_for_the_deadline_a_client_was_given_before_anyone_else_leads() {
    let redis = redis();
    let scratch = Scratch::new("serve-grant");
    let ttl = ["--ttl", "5s", "--max-deadline", "2s"];
    let a = Serve::start(&redis.url(), &["exclusive"], "a", &ttl, &scratch);
    let b = Serve::start(&redis.url(), &["exclusive"], "b", &ttl, &scratch);
    let leader = leader_of(&[&a, &b], "exclusive");
    let other = if leader.id == "a" { &b } else { &a };
    // A client asks the leader: from the moment it sent the request, it
    // may act for deadline_ms.
    let sent = Instant::now();
    let granted = leader.state("exclusive");
    let may_act_until = sent + Duration::from_millis(granted["deadline_ms"].as_u64().expect("ms"));
    assert!(
        granted["deadline_ms"].as_u64().unwrap_or(0) > 1_000,
        "{granted}"
    );

    let (status, response) = http(&leader.addr, "POST", "/v1/elections/exclusive/resign", &[]);
    assert_eq!(status, 200, "{response}");
    assert!(
        Instant::now() >= may_act_until,
        "the resign returned before the deadline it had handed out"
    );
    eventually("the other instance to lead", || other.leads("exclusive"));
    // The other instance cannot have begun before the resign released the
    // lease, which was after the client's deadline.
    let after = leader.state("exclusive");
    assert_eq!(after["is_leader"], false, "{after}");
}

#[test]
fn event_streams_cannot_take_every_connection() {
    let redis = redis();
    let scratch = Scratch::new("serve-streams");
    let a = Serve::start(&redis.url(), &["busy"], "a", &[], &scratch);
    // Streams whose clients never read.
    let mut streams = Vec::new();
    for _ in 0..128 {
        let mut stream = TcpStream::connect(&a.addr).expect("connects");
        write!(
            stream,
            "GET /v1/elections/busy/events HTTP/1.1\r\nHost: x\r\n\r\n"
        )
        .expect("request sent");
        streams.push(stream);
    }
    // Each got its response head: the stream slots are all taken.
    for stream in &mut streams {
        stream.set_read_timeout(Some(HANG)).expect("read timeout");
        let mut head = [0u8; 12];
        stream.read_exact(&mut head).expect("a response");
        assert_eq!(&head, b"HTTP/1.1 200");
    }
    let (status, response) = http(&a.addr, "GET", "/v1/elections/busy/events", &[]);
    assert_eq!(status, 503, "{response}");
    assert!(body_json(&response)["error"].is_string());
    assert_eq!(
        http_get(&a.addr, "/healthz").0,
        200,
        "health checks still answer"
    );
    assert_eq!(a.state("busy")["election"], "busy");
    drop(streams);
}

/// docs/src/openapi.json, the description clients in other languages are
/// generated from.
fn openapi() -> Value {
    serde_json::from_str(include_str!("../../../../docs/src/openapi.json"))
        .expect("openapi.json is JSON")
}

/// Follow a `$ref` within the description.
fn resolve<'a>(spec: &'a Value, node: &'a Value) -> &'a Value {
    match node["$ref"].as_str() {
        Some(path) => {
            let target = path
                .strip_prefix('#')
                .and_then(|pointer| spec.pointer(pointer))
                .unwrap_or_else(|| panic!("openapi.json: no {path}"));
            resolve(spec, target)
        }
        None => node,
    }
}

/// Whether `value` fits `schema`, for the part of JSON Schema the
/// description uses (type, const, enum, minimum, properties, required,
/// additionalProperties: false, items, $ref); the first misfit otherwise.
fn misfit(spec: &Value, schema: &Value, value: &Value, at: &str) -> Option<String> {
    let schema = resolve(spec, schema);
    if let Some(expected) = schema.get("const") {
        if value != expected {
            return Some(format!("{at}: {value} is not {expected}"));
        }
    }
    if let Some(allowed) = schema["enum"].as_array() {
        if !allowed.contains(value) {
            return Some(format!("{at}: {value} is not one of {allowed:?}"));
        }
    }
    if let Some(types) = schema.get("type") {
        let types: Vec<&str> = match types {
            Value::String(one) => vec![one.as_str()],
            many => many
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect(),
        };
        let fits = |t: &str| match t {
            "null" => value.is_null(),
            "boolean" => value.is_boolean(),
            "integer" => value.is_u64() || value.is_i64(),
            "number" => value.is_number(),
            "string" => value.is_string(),
            "array" => value.is_array(),
            "object" => value.is_object(),
            other => panic!("openapi.json: type {other} is not checked here"),
        };
        if !types.iter().any(|t| fits(t)) {
            return Some(format!("{at}: {value} is not of type {types:?}"));
        }
    }
    if let (Some(minimum), Some(number)) = (schema["minimum"].as_f64(), value.as_f64()) {
        if number < minimum {
            return Some(format!("{at}: {value} is below {minimum}"));
        }
    }
    if let Some(object) = value.as_object() {
        for name in schema["required"].as_array().into_iter().flatten() {
            let name = name.as_str().expect("required names are strings");
            if !object.contains_key(name) {
                return Some(format!("{at}: no field {name:?}"));
            }
        }
        let properties = schema["properties"].as_object();
        for (name, field) in object {
            match properties.and_then(|p| p.get(name)) {
                Some(property) => {
                    if let Some(why) = misfit(spec, property, field, &format!("{at}.{name}")) {
                        return Some(why);
                    }
                }
                None if schema["additionalProperties"] == Value::Bool(false) => {
                    return Some(format!("{at}: field {name:?} is not described"));
                }
                None => {}
            }
        }
    }
    if let (Some(items), Some(array)) = (schema.get("items"), value.as_array()) {
        for (i, item) in array.iter().enumerate() {
            if let Some(why) = misfit(spec, items, item, &format!("{at}[{i}]")) {
                return Some(why);
            }
        }
    }
    None
}

/// A response's header value, by name.
fn header<'a>(response: &'a str, name: &str) -> Option<&'a str> {
    let head = response.split_once("\r\n\r\n").map_or(response, |(h, _)| h);
    head.lines().skip(1).find_map(|line| {
        let (key, value) = line.split_once(':')?;
        key.trim().eq_ignore_ascii_case(name).then(|| value.trim())
    })
}

/// Check one answer of the server against the operation `method` of the
/// description's `template` path: its status is documented there, its
/// media type is the documented one, and a JSON body (or, for an event
/// stream, every event's data) fits the documented schema.
fn check_answer(
    spec: &Value,
    template: &str,
    method: &str,
    status: u16,
    content_type: &str,
    bodies: &[Value],
) {
    let what = format!("{} {template} answered {status}", method.to_uppercase());
    let operation = &spec["paths"][template][method];
    assert!(
        operation.is_object(),
        "{what}: the operation is not described"
    );
    let response = resolve(spec, &operation["responses"][status.to_string()]);
    assert!(response.is_object(), "{what}: the status is not described");
    let media = content_type.split(';').next().unwrap_or("").trim();
    let content = &response["content"][media];
    assert!(content.is_object(), "{what}: {media:?} is not described");
    let schema = content.get("x-data").unwrap_or(&content["schema"]);
    for body in bodies {
        if let Some(why) = misfit(spec, schema, body, "body") {
            panic!("{what}: {why}");
        }
    }
}

#[test]
fn the_openapi_description_matches_what_serve_answers() {
    let spec = openapi();
    assert_eq!(spec["openapi"], "3.1.0");
    let redis = redis();
    let scratch = Scratch::new("serve-openapi");
    let a = Serve::start(&redis.url(), &["reports"], "a", &[], &scratch);
    let b = Serve::start(&redis.url(), &["reports"], "b", &[], &scratch);
    let leader = leader_of(&[&a, &b], "reports");
    let follower = if leader.id == "a" { &b } else { &a };
    eventually("the follower to see the leader", || {
        follower.state("reports")["leader"].is_string()
    });
    let checked = std::cell::RefCell::new(std::collections::BTreeSet::new());
    let call = |serve: &Serve, method: &str, path: &str, template: &str| -> u16 {
        let (status, response) = http(&serve.addr, &method.to_uppercase(), path, &[]);
        let content_type = header(&response, "content-type").unwrap_or("");
        let bodies = if content_type.starts_with("application/json") {
            vec![body_json(&response)]
        } else {
            vec![]
        };
        check_answer(&spec, template, method, status, content_type, &bodies);
        checked
            .borrow_mut()
            .insert((template.to_string(), method.to_string()));
        status
    };
    let name = "/v1/elections/{name}";
    assert_eq!(call(leader, "get", "/v1/elections", "/v1/elections"), 200);
    assert_eq!(call(leader, "get", "/v1/elections/reports", name), 200);
    assert_eq!(call(follower, "get", "/v1/elections/reports", name), 200);
    assert_eq!(call(leader, "get", "/v1/elections/nobody", name), 404);
    assert_eq!(call(leader, "get", "/healthz", "/healthz"), 200);
    assert_eq!(call(leader, "get", "/readyz", "/readyz"), 200);
    assert_eq!(
        call(leader, "get", "/readyz?leader=reports", "/readyz"),
        200
    );
    assert_eq!(
        call(follower, "get", "/readyz?leader=reports", "/readyz"),
        503
    );
    assert_eq!(call(leader, "get", "/readyz?leader=nobody", "/readyz"), 404);
    assert_eq!(call(leader, "get", "/metrics", "/metrics"), 200);
    let resign = "/v1/elections/{name}/resign";
    assert_eq!(
        call(follower, "post", "/v1/elections/reports/resign", resign),
        409
    );
    assert_eq!(
        call(
            leader,
            "post",
            "/v1/elections/reports/resign?rejoin=soon",
            resign
        ),
        400
    );
    assert_eq!(
        call(leader, "post", "/v1/elections/nobody/resign", resign),
        404
    );

    // The event stream: its status, media type and first event.
    let events = "/v1/elections/{name}/events";
    let mut stream = TcpStream::connect(&leader.addr).expect("serve accepts");
    write!(
        stream,
        "GET /v1/elections/reports/events HTTP/1.1\r\nHost: {}\r\n\r\n",
        leader.addr
    )
    .expect("request sent");
    let mut lines = BufReader::new(stream);
    let mut head = String::new();
    let mut line = String::new();
    while lines.read_line(&mut line).expect("stream read") > 2 {
        head.push_str(&line);
        line.clear();
    }
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let content_type = header(&head, "content-type").unwrap_or("").to_string();
    let first = loop {
        line.clear();
        assert!(
            lines.read_line(&mut line).expect("stream read") > 0,
            "the stream ended"
        );
        if let Some(data) = line.trim_end().strip_prefix("data: ") {
            break serde_json::from_str::<Value>(data).expect("an event is JSON");
        }
    };
    assert_eq!(first["is_leader"], true, "{first}");
    check_answer(&spec, events, "get", status, &content_type, &[first]);
    checked
        .borrow_mut()
        .insert((events.to_string(), "get".to_string()));
    assert_eq!(
        call(leader, "get", "/v1/elections/nobody/events", events),
        404
    );

    // Last, the resign that succeeds (it waits for the deadline the
    // stream handed out).
    assert_eq!(
        call(leader, "post", "/v1/elections/reports/resign", resign),
        200
    );

    // Every operation the description has was asked.
    let described: std::collections::BTreeSet<(String, String)> = spec["paths"]
        .as_object()
        .expect("paths")
        .iter()
        .flat_map(|(path, item)| {
            item.as_object()
                .expect("a path item")
                .keys()
                .filter(|key| ["get", "post", "put", "delete", "patch"].contains(&key.as_str()))
                .map(move |method| (path.clone(), method.clone()))
        })
        .collect();
    assert_eq!(
        described,
        checked.into_inner(),
        "operations described vs. asked"
    );
}

/// `serve --slots 2`: of three instances, two hold a permit each, each
/// answer naming its own; a resign hands that permit to the third, with a
/// larger token. The answers fit the OpenAPI description.
#[test]
fn serve_with_slots_hands_out_each_permit_to_one_instance() {
    let spec = openapi();
    let redis = redis();
    let scratch = Scratch::new("serve-slots");
    let extra = ["--slots", "2", "--ttl", "3s"];
    let serves: Vec<Serve> = ["a", "b", "c"]
        .iter()
        .map(|id| Serve::start(&redis.url(), &["exports"], id, &extra, &scratch))
        .collect();
    let holding = || -> Vec<(&Serve, Value)> {
        serves
            .iter()
            .map(|serve| (serve, serve.state("exports")))
            .filter(|(_, state)| state["is_leader"] == true)
            .collect()
    };
    let mut holders = Vec::new();
    eventually("two instances to hold a permit", || {
        holders = holding();
        holders.len() == 2
    });
    let fits = |state: &Value| {
        check_answer(
            &spec,
            "/v1/elections/{name}",
            "get",
            200,
            "application/json",
            std::slice::from_ref(state),
        )
    };
    let mut permits = Vec::new();
    for (serve, state) in &holders {
        fits(state);
        assert_eq!(state["election"], "exports", "{state}");
        assert_eq!(state["leader"], serve.id.as_str(), "{state}");
        assert!(state["deadline_ms"].as_u64() > Some(0), "{state}");
        permits.push(state["permit"].as_str().expect("a permit").to_string());
        assert_eq!(http_get(&serve.addr, "/readyz?leader=exports").0, 200);
    }
    permits.sort();
    assert_eq!(permits, ["exports/permit-0", "exports/permit-1"]);
    let waiter = serves
        .iter()
        .find(|serve| holders.iter().all(|(holder, _)| holder.id != serve.id))
        .expect("a waiter");
    let waiting = waiter.state("exports");
    fits(&waiting);
    assert_eq!(
        waiting,
        serde_json::json!({"election": "exports", "is_leader": false, "token": null, "leader": null, "deadline_ms": null})
    );

    let (resigned, state) = &holders[0];
    let (status, response) = http(&resigned.addr, "POST", "/v1/elections/exports/resign", &[]);
    assert_eq!(status, 200, "{response}");
    assert!(!resigned.leads("exports"), "a resigned permit ends at once");
    eventually("the waiter to take the permit", || waiter.leads("exports"));
    let taken = waiter.state("exports");
    fits(&taken);
    assert_eq!(taken["permit"], state["permit"], "{taken}");
    assert!(token(&taken) > token(state), "{taken} after {state}");
    assert_eq!(holding().len(), 2);
}
