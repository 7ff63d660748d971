//! Helpers for end-to-end tests of the `tenure` binary: private Redis
//! servers, `tenure run` instances in their own process groups, and polling.
#![allow(dead_code)]

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;
pub use redis_process::RedisServer;

/// Bound for anything that should happen "soon"; only turns hangs into failures.
pub const HANG: Duration = Duration::from_secs(30);

pub fn redis() -> RedisServer {
    RedisServer::start().unwrap_or_else(|err| panic!("cannot start redis-server: {err}"))
}

/// The `tenure` binary under test.
pub fn tenure() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_tenure"));
    // Short leases keep the start-up grace period of each fresh server short;
    // tests that care pass --ttl, which wins over the variable.
    command
        .env_remove("TENURE_REDIS_URL")
        .env_remove("TENURE_STORE")
        .env("TENURE_LOG", "info")
        .env("TENURE_TTL", "1s");
    command
}

/// Run `tenure ARGS` to completion.
pub fn tenure_output(args: &[&str]) -> Output {
    tenure()
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("tenure runs")
}

/// A scratch directory removed on drop.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("tenure-e2e-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch dir");
        Scratch(dir)
    }

    pub fn path(&self, file: &str) -> PathBuf {
        self.0.join(file)
    }

    pub fn read(&self, file: &str) -> String {
        std::fs::read_to_string(self.path(file)).unwrap_or_default()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A `tenure run` process in a process group of its own.
pub struct Instance {
    pub id: String,
    pub child: Child,
    log: PathBuf,
}

impl Instance {
    /// Start `tenure run --election ELECTION --id ID EXTRA... -- sh -c SCRIPT`.
    pub fn start(
        url: &str,
        election: &str,
        id: &str,
        extra: &[&str],
        script: &str,
        scratch: &Scratch,
    ) -> Self {
        let log = scratch.path(&format!("{id}.log"));
        let log_file = std::fs::File::create(&log).expect("log file");
        Self::start_with_stderr(url, election, id, extra, script, scratch, log_file.into())
    }

    /// [`Instance::start`], with stderr going to `stderr` (stdout still to the log).
    pub fn start_with_stderr(
        url: &str,
        election: &str,
        id: &str,
        extra: &[&str],
        script: &str,
        scratch: &Scratch,
        stderr: Stdio,
    ) -> Self {
        let log = scratch.path(&format!("{id}.log"));
        let log_file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .expect("log file");
        let child = tenure()
            .args(["run", "--redis", url, "--election", election, "--id", id])
            .args(extra)
            .args(["--", "sh", "-c", script])
            .env("DIR", &scratch.0)
            .env("ME", id)
            .stdin(Stdio::null())
            .stdout(log_file)
            .stderr(stderr)
            .process_group(0)
            .spawn()
            .expect("tenure starts");
        Instance {
            id: id.to_string(),
            child,
            log,
        }
    }

    pub fn pid(&self) -> Pid {
        Pid::from_raw(self.child.id() as i32)
    }

    pub fn signal(&self, signal: Signal) {
        let _ = kill(self.pid(), signal);
    }

    /// SIGKILL tenure's whole process group (not the command's, which has its own).
    pub fn kill_group(&self) {
        let _ = killpg(self.pid(), Signal::SIGKILL);
    }

    /// Wait for exit and return the exit code (128+N for signal N).
    pub fn wait(&mut self) -> i32 {
        use std::os::unix::process::ExitStatusExt;
        let deadline = Instant::now() + HANG;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status
                    .code()
                    .unwrap_or_else(|| 128 + status.signal().unwrap_or(0));
            }
            assert!(
                Instant::now() < deadline,
                "{} did not exit; log:\n{}",
                self.id,
                self.log()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        if self.is_running() {
            let _ = killpg(self.pid(), Signal::SIGKILL);
            let _ = self.child.wait();
        }
    }
}

/// Whether a process exists (and is not a zombie).
pub fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

/// A pipe whose reading end is already closed: every write to it fails
/// (EPIPE), like a log shipper that went away.
pub fn closed_pipe() -> Stdio {
    let (reader, writer) = std::io::pipe().expect("pipe");
    drop(reader);
    writer.into()
}

/// Whether election `name`'s lease exists in `server`.
pub fn lease_exists(server: &RedisServer, name: &str) -> bool {
    server
        .command(&["EXISTS", &format!("tenure:{{{name}}}:lease")])
        .expect("EXISTS")
        == "1"
}

/// The parent PID of a process, while it runs.
pub fn parent_of(pid: i32) -> Option<i32> {
    tenure_procs::read(pid).map(|p| p.ppid)
}

/// Poll `condition` until it holds; panic with `what` after [`HANG`].
pub fn eventually(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + HANG;
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// [`eventually`], printing `context()` (a log, say) should it time out.
pub fn eventually_or_show(
    what: &str,
    condition: impl FnMut() -> bool,
    context: impl Fn() -> String,
) {
    let waited =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| eventually(what, condition)));
    if waited.is_err() {
        panic!("timed out waiting for: {what}\n{}", context());
    }
}

/// The PID the command of instance `id` wrote to `DIR/pid-ID`, once it has.
pub fn child_pid(scratch: &Scratch, id: &str) -> Option<i32> {
    scratch.read(&format!("pid-{id}")).trim().parse().ok()
}

/// The PID a process of instance `id` wrote to `DIR/NAME-ID`, once it has.
pub fn pid_file(scratch: &Scratch, name: &str, id: &str) -> Option<i32> {
    scratch.read(&format!("{name}-{id}")).trim().parse().ok()
}

/// Start a child that leaves CMD's process group and session (`setsid`)
/// and a grandchild whose parent exits at once (a double fork), each
/// recording its PID in `DIR/setsid-ME` and `DIR/orphan-ME`, then sleeping.
pub const ESCAPE: &str = r#"setsid sh -c 'echo $$ > "$DIR/setsid-$ME"; exec sleep 1000' &
( sh -c 'echo $$ > "$DIR/orphan-$ME"; exec sleep 1000' & )
while [ ! -s "$DIR/setsid-$ME" ] || [ ! -s "$DIR/orphan-$ME" ]; do sleep 0.01; done
"#;

/// CMD's PID and the PIDs of the two processes [`ESCAPE`] started, once all
/// three are recorded.
pub fn escaped_pids(scratch: &Scratch, id: &str) -> Option<[i32; 3]> {
    Some([
        child_pid(scratch, id)?,
        pid_file(scratch, "setsid", id)?,
        pid_file(scratch, "orphan", id)?,
    ])
}

/// A script that records its PID and token, then sleeps until stopped.
pub const LONG_JOB: &str =
    r#"echo $$ > "$DIR/pid-$ME"; echo "$TENURE_TOKEN" >> "$DIR/tokens-$ME"; exec sleep 1000"#;

/// Plain HTTP GET on 127.0.0.1: (status code, body).
pub fn http_get(addr: &str, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).expect("metrics endpoint accepts");
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").expect("request sent");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("response read");
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

/// Kills leftovers of a test that failed, so that they do not outlive it.
pub struct Reap(pub Vec<i32>);

impl Drop for Reap {
    fn drop(&mut self) {
        for pid in &self.0 {
            if alive(*pid) {
                let _ = kill(Pid::from_raw(*pid), Signal::SIGKILL);
            }
        }
    }
}

/// CMD runs [`ESCAPE`], records its PID and token, then sleeps.
pub fn escaping_job() -> String {
    format!(
        r#"echo $$ > "$DIR/pid-$ME"; echo "$TENURE_TOKEN" >> "$DIR/tokens-$ME"
{ESCAPE}exec sleep 1000"#
    )
}

/// CMD's PID and its escapees' once [`escaping_job`] recorded them all.
pub fn wait_for_escapes(scratch: &Scratch, id: &str) -> [i32; 3] {
    let mut pids = None;
    eventually("CMD and both escapees record their PIDs", || {
        pids = escaped_pids(scratch, id);
        pids.is_some()
    });
    let pids = pids.unwrap();
    assert!(pids.iter().all(|pid| alive(*pid)), "{pids:?}");
    pids
}

/// A CA and a server certificate for 127.0.0.1 signed by it, written as PEM
/// files into `scratch`, for a TLS redis-server ([`RedisServer::builder`]).
pub fn tls_files(scratch: &Scratch) -> redis_process::TlsFiles {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    let ca_key = KeyPair::generate().expect("CA key");
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca_params.self_signed(&ca_key).expect("CA certificate");
    let issuer = Issuer::new(ca_params, ca_key);
    let server_key = KeyPair::generate().expect("server key");
    let server_params = CertificateParams::new(vec!["127.0.0.1".to_string()]).expect("params");
    let server_cert = server_params
        .signed_by(&server_key, &issuer)
        .expect("server certificate");
    let files = redis_process::TlsFiles {
        cert: scratch.path("server.pem"),
        key: scratch.path("server.key"),
        ca: scratch.path("ca.pem"),
    };
    std::fs::write(&files.cert, server_cert.pem()).expect("write cert");
    std::fs::write(&files.key, server_key.serialize_pem()).expect("write key");
    std::fs::write(&files.ca, ca_cert.pem()).expect("write CA");
    files
}

/// A TCP server on a free loopback port that is not Redis: it greets every
/// client with `banner` (an SSH server) or, when `banner` is empty, answers
/// whatever arrives with an HTTP error (a web server). Returns the port; the
/// server lives as long as the test process.
pub fn foreign_server(banner: &'static str) -> u16 {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("local addr").port();
    std::thread::spawn(move || {
        for mut client in listener.incoming().flatten() {
            std::thread::spawn(move || {
                if banner.is_empty() {
                    let mut request = [0u8; 1024];
                    let _ = client.read(&mut request);
                    let _ = client.write_all(
                        b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                    );
                } else {
                    let _ = client.write_all(banner.as_bytes());
                }
                // Keep the connection open until the client gives up.
                let _ = client.read(&mut [0u8; 1024]);
            });
        }
    });
    port
}

/// One line of stderr, for errors that must fit one.
pub fn one_line(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr).trim().to_string();
    assert_eq!(text.lines().count(), 1, "one line of error: {text}");
    text
}

/// `tenure status --json --store URL`, parsed; (election, leader id) pairs.
pub fn status(url: &str) -> Vec<(String, Option<String>)> {
    let out = tenure_output(&["status", "--json", "--store", url]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    status["elections"]
        .as_array()
        .expect("an array")
        .iter()
        .map(|e| {
            (
                e["name"].as_str().unwrap_or_default().to_string(),
                e["leader"]["id"].as_str().map(str::to_string),
            )
        })
        .collect()
}

/// The fencing tokens instance `id`'s [`LONG_JOB`] saw, one per term.
pub fn tokens(scratch: &Scratch, id: &str) -> Vec<u64> {
    scratch
        .read(&format!("tokens-{id}"))
        .lines()
        .filter_map(|line| line.trim().parse().ok())
        .collect()
}
