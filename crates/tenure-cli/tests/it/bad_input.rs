//! The bad-input suite: one table of mistakes a new user makes, each with
//! the exit code the book's table (command.md) gives and the one line that says what
//! is wrong. A flag that `--help` lists but no case uses fails
//! [`every_flag_has_a_bad_case`]: a new flag lands with its bad cases.
//!
//! Arguments may name a store or a file to set up first:
//! - `{redis}`: a private redis-server; `{closed}`: a port nobody listens
//!   on; `{http}`: a web server; `{silent}`: a port that accepts and never
//!   answers (each as a `redis://` URL);
//! - `{file:TEXT}`: a file holding TEXT, readable by its owner only;
//!   `{public:TEXT}`: the same, readable by every user; `{missing}`: a path
//!   where there is no file.

use crate::support;
use std::os::unix::fs::PermissionsExt;
use std::process::Stdio;

use crate::support::{foreign_server, tenure, RedisServer, Scratch, HANG};
use regex::Regex;

/// One bad input and what tenure must answer.
struct Case {
    args: &'static [&'static str],
    env: &'static [(&'static str, &'static str)],
    /// stdout is `/dev/full` (every write fails: a full disk).
    full_stdout: bool,
    code: i32,
    /// Matches the last line of stderr.
    line: &'static str,
    /// Lines on stderr: 1, or 2 when a warning about a secret's file
    /// mode comes first.
    lines: usize,
}

const fn case(code: i32, line: &'static str, args: &'static [&'static str]) -> Case {
    Case {
        args,
        env: &[],
        full_stdout: false,
        code,
        line,
        lines: 1,
    }
}

impl Case {
    const fn env(mut self, env: &'static [(&'static str, &'static str)]) -> Case {
        self.env = env;
        self
    }

    const fn full_stdout(mut self) -> Case {
        self.full_stdout = true;
        self
    }

    const fn after_a_warning(mut self) -> Case {
        self.lines = 2;
        self
    }
}

const STDOUT: &str = r"^tenure: cannot write to stdout: No space left on device";
const NO_STORE: &str = r"^tenure: cannot reach Redis at redis://(:\*\*\*@)?127\.0\.0\.1:\d+: ";
const TOKEN: &str = "tenure: the bearer token may hold only visible ASCII characters";

/// The table: (args, env, stdout) -> exit code and the line.
const CASES: &[Case] = &[
    // Every subcommand's output on a full disk, --help and --version too.
    case(74, STDOUT, &["--help"]).full_stdout(),
    case(74, STDOUT, &["--version"]).full_stdout(),
    case(74, STDOUT, &["run", "--help"]).full_stdout(),
    case(74, STDOUT, &["status", "--store", "{redis}"]).full_stdout(),
    case(74, STDOUT, &["status", "--json", "--store", "{redis}"]).full_stdout(),
    case(74, STDOUT, &["completions", "bash"]).full_stdout(),
    case(74, STDOUT, &["man"]).full_stdout(),
    case(74, STDOUT, &["demo", "--store", "{redis}"]).full_stdout(),
    // Global flags.
    case(2, r"not a log filter", &["--log", "bogus[[[", "man"]),
    case(
        2,
        r"invalid value 'xml' for '--log-format",
        &["--log-format", "xml", "man"],
    ),
    case(2, r"invalid value 'tcsh'", &["completions", "tcsh"]),
    // Store URLs and the servers behind them.
    case(
        2,
        r"invalid configuration: .*nope://",
        &["status", "--store", "nope://x"],
    ),
    case(69, NO_STORE, &["status", "--store", "{closed}"]),
    case(69, NO_STORE, &["watch", "e", "--redis", "{closed}"]),
    case(
        69,
        NO_STORE,
        &[
            "run",
            "--store",
            "{closed}",
            "--election",
            "e",
            "--",
            "true",
        ],
    ),
    case(
        69,
        r"^tenure: the store did not answer in time.*from redis://127\.0\.0\.1:\d+",
        &["status", "--store", "{silent}"],
    ),
    case(
        69,
        r"^tenure: the server at redis://127\.0\.0\.1:\d+ does not speak the Redis protocol",
        &[
            "serve",
            "--store",
            "{http}",
            "--election",
            "e",
            "--listen",
            "127.0.0.1:0",
        ],
    ),
    case(
        2,
        r"--tls-ca is for rediss://, etcds:// and postgres://…\?sslmode=require URLs",
        &[
            "status",
            "--store",
            "{closed}",
            "--tls-ca",
            "{file:garbage}",
        ],
    ),
    case(
        2,
        r"invalid configuration: .*sslmode=prefer is not supported",
        &[
            "status",
            "--store",
            "postgres://app@127.0.0.1:1/db?sslmode=prefer",
        ],
    ),
    case(
        2,
        r"invalid configuration: .*must name exactly one host",
        &[
            "status",
            "--store",
            "postgres://app@127.0.0.1:1,127.0.0.1:2/db",
        ],
    ),
    case(
        2,
        r"--tls-key <TLS_KEY>",
        &["status", "--store", "{closed}", "--tls-cert", "{missing}"],
    ),
    case(
        2,
        r"--tls-cert <TLS_CERT>",
        &["status", "--store", "{closed}", "--tls-key", "{missing}"],
    ),
    case(
        2,
        r"cannot read the password file",
        &[
            "status",
            "--store",
            "{closed}",
            "--password-file",
            "{missing}",
        ],
    ),
    case(
        69,
        NO_STORE,
        &[
            "status",
            "--store",
            "{closed}",
            "--password-file",
            "{public:pw}",
        ],
    )
    .after_a_warning(),
    case(
        2,
        r"invalid configuration: .*prefix",
        &["status", "--store", "{redis}", "--prefix", ""],
    ),
    case(
        2,
        r"unexpected value 'maybe' for '--allow-eviction'",
        &["status", "--store", "{closed}", "--allow-eviction=maybe"],
    ),
    // Names.
    case(
        2,
        r#"election name "a\{b" contains '\{'"#,
        &["status", "a{b", "--store", "{redis}"],
    ),
    case(2, r"election name", &["watch", "a b", "--store", "{redis}"]),
    case(
        2,
        r"unexpected value 'yes' for '--json'",
        &["watch", "e", "--store", "{closed}", "--json=yes"],
    ),
    // A semaphore's permits, shown or watched.
    case(
        2,
        r"the following required arguments were not provided",
        &["status", "--slots", "3", "--store", "{redis}"],
    ),
    case(
        2,
        r"invalid value '0' for '--slots <SLOTS>'",
        &["watch", "e", "--slots", "0", "--store", "{redis}"],
    ),
    // 195 bytes: a valid name, but not its permits' names.
    case(
        2,
        r"^tenure: invalid configuration: election name is 204 bytes long; at most 200 are allowed$",
        &["status", "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn", "--slots", "11", "--store", "{redis}"],
    ),
    case(
        2,
        r"^tenure: invalid configuration: election name is 204 bytes long; at most 200 are allowed$",
        &["serve", "--election", "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn", "--slots", "2", "--store", "{redis}"],
    ),
    case(
        2,
        r"invalid value '1001' for '--slots <SLOTS>'",
        &["serve", "--election", "e", "--slots", "1001", "--store", "{redis}"],
    ),
    case(
        2,
        r"permit's election name is 204 bytes long",
        &["watch", "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn", "--slots", "2", "--store", "{redis}"],
    ),
    // `run`'s flags.
    case(
        2,
        r"must not be negative",
        &[
            "run",
            "--store",
            "{closed}",
            "--election",
            "e",
            "--ttl",
            "-1s",
            "--",
            "true",
        ],
    ),
    case(
        2,
        r"greater than zero",
        &[
            "run",
            "--store",
            "{closed}",
            "--election",
            "e",
            "--renew-every",
            "0s",
            "--",
            "true",
        ],
    ),
    case(
        2,
        r"max ttl .* must be at least the ttl",
        &[
            "run",
            "--store",
            "{redis}",
            "--election",
            "e",
            "--ttl",
            "2s",
            "--max-ttl",
            "1s",
            "--",
            "true",
        ],
    ),
    case(
        2,
        r"invalid configuration: .*margin",
        &[
            "run",
            "--store",
            "{redis}",
            "--election",
            "e",
            "--margin",
            "20s",
            "--",
            "true",
        ],
    ),
    case(
        2,
        r"control characters",
        &[
            "run",
            "--store",
            "{redis}",
            "--election",
            "e",
            "--id",
            "two\nlines",
            "--",
            "true",
        ],
    ),
    case(
        2,
        r"use a unit",
        &[
            "run",
            "--store",
            "{closed}",
            "--election",
            "e",
            "--kill-grace",
            "10",
            "--",
            "true",
        ],
    ),
    case(
        2,
        r"is not a port or an address",
        &[
            "run",
            "--store",
            "{closed}",
            "--election",
            "e",
            "--metrics-addr",
            "localhost",
            "--",
            "true",
        ],
    ),
    case(
        2,
        r"TENURE_ONCE",
        &[
            "run",
            "--store",
            "{closed}",
            "--election",
            "e",
            "--",
            "true",
        ],
    )
    .env(&[("TENURE_ONCE", "maybe")]),
    case(
        2,
        r"cannot be used with",
        &[
            "run",
            "--store",
            "{closed}",
            "--election",
            "e",
            "--once",
            "--no-wait",
            "--wait-timeout",
            "1s",
            "--",
            "true",
        ],
    ),
    case(
        2,
        r"--once",
        &[
            "run",
            "--store",
            "{closed}",
            "--election",
            "e",
            "--at-most-every",
            "1h",
            "--",
            "true",
        ],
    ),
    case(
        2,
        r"at most 100 years",
        &[
            "run",
            "--store",
            "{closed}",
            "--election",
            "e",
            "--once",
            "--at-most-every",
            "101y",
            "--",
            "true",
        ],
    ),
    case(
        2,
        r"invalid value '0' for '--slots <SLOTS>': 0 is not in 1..=1000",
        &[
            "run",
            "--store",
            "{closed}",
            "--election",
            "e",
            "--slots",
            "0",
            "--",
            "true",
        ],
    ),
    case(
        2,
        r"invalid value '61 \* \* \* \*' for '--cron <CRON>': .61 \* \* \* \*. is not a cron expression",
        &[
            "run",
            "--store",
            "{closed}",
            "--election",
            "e",
            "--cron",
            "61 * * * *",
            "--",
            "true",
        ],
    ),
    case(
        2,
        r#""Mars/Olympus" is not a known IANA time zone"#,
        &[
            "run",
            "--store",
            "{closed}",
            "--election",
            "e",
            "--cron",
            "@daily",
            "--tz",
            "Mars/Olympus",
            "--",
            "true",
        ],
    ),
    case(
        2,
        r"invalid value '-1s' for '--starting-deadline <STARTING_DEADLINE>': must not be negative",
        &[
            "run",
            "--store",
            "{closed}",
            "--election",
            "e",
            "--cron",
            "@daily",
            "--starting-deadline",
            "-1s",
            "--",
            "true",
        ],
    ),
    case(
        2,
        r"the argument '--cron <CRON>' cannot be used with '--once'",
        &[
            "run",
            "--store",
            "{closed}",
            "--election",
            "e",
            "--cron",
            "@daily",
            "--once",
            "--",
            "true",
        ],
    ),
    case(
        2,
        r"invalid value 'bogus' for '--cgroup",
        &[
            "run",
            "--store",
            "{closed}",
            "--election",
            "e",
            "--cgroup",
            "bogus",
            "--",
            "true",
        ],
    ),
    case(
        2,
        r"--election <ELECTION>",
        &["run", "--store", "{closed}", "--", "true"],
    ),
    case(
        2,
        r"<CMD>",
        &["run", "--store", "{closed}", "--election", "e"],
    ),
    case(
        2,
        r"^tenure: __guardian is internal to `tenure run`",
        &["__guardian", "--channel", "nope", "--", "true"],
    ),
    // `serve`'s flags.
    case(
        2,
        r"--max-deadline.*must be at least 10ms",
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--store",
            "{closed}",
            "--election",
            "e",
            "--max-deadline",
            "500us",
        ],
    ),
    case(
        2,
        TOKEN,
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--store",
            "{closed}",
            "--election",
            "e",
            "--auth-token-file",
            "{file:tökén-ü}",
        ],
    ),
    case(
        2,
        TOKEN,
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--store",
            "{closed}",
            "--election",
            "e",
            "--auth-token-file",
            "{file:two words}",
        ],
    ),
    case(
        2,
        r"is empty",
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--store",
            "{closed}",
            "--election",
            "e",
            "--auth-token-file",
            "{file:}",
        ],
    ),
    case(
        2,
        r"ends like one of the API's paths",
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--store",
            "{closed}",
            "--election",
            "x/resign",
            "--auth-token-file",
            "{public:token}",
        ],
    )
    .after_a_warning(),
    case(
        2,
        r"not both",
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--store",
            "{closed}",
            "--election",
            "e",
            "--auth-token-file",
            "{file:t}",
        ],
    )
    .env(&[("TENURE_AUTH_TOKEN", "t")]),
    case(
        2,
        r"is not a loopback address",
        &[
            "serve",
            "--store",
            "{closed}",
            "--election",
            "e",
            "--listen",
            "0.0.0.0:0",
        ],
    ),
    case(
        2,
        r"is not a port or an address",
        &[
            "serve",
            "--store",
            "{closed}",
            "--election",
            "e",
            "--listen",
            "nope",
        ],
    ),
    case(
        2,
        r"is given twice",
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--store",
            "{closed}",
            "--election",
            "a,a",
        ],
    ),
    case(
        2,
        r"ends like one of the API's paths",
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--store",
            "{closed}",
            "--election",
            "x/events",
        ],
    ),
    // `demo`'s flags.
    case(2, r"between 100ms and 1m", &["demo", "--ttl", "1ms"]),
    case(
        2,
        r"^tenure: the demo's ttl on etcd must be a whole number of seconds",
        &["demo", "--store", "etcd://127.0.0.1:1", "--ttl", "500ms"],
    ),
    case(69, NO_STORE, &["demo", "--store", "{closed}"]),
    case(
        2,
        r"cannot read the password file",
        &[
            "demo",
            "--store",
            "{closed}",
            "--password-file",
            "{missing}",
        ],
    ),
];

/// The stores and files the table's placeholders name, set up once.
struct World {
    redis: RedisServer,
    closed: u16,
    http: u16,
    silent: std::net::TcpListener,
    scratch: Scratch,
    files: std::cell::Cell<usize>,
}

impl World {
    fn new() -> Self {
        let closed = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("a free port")
            .port();
        World {
            redis: support::redis(),
            closed,
            http: foreign_server(""),
            // Bound and listening, never accepted: the kernel completes
            // the handshake and nobody ever answers.
            silent: std::net::TcpListener::bind("127.0.0.1:0").expect("bind"),
            scratch: Scratch::new("bad-input"),
            files: std::cell::Cell::new(0),
        }
    }

    fn file(&self, text: &str, mode: u32) -> String {
        let n = self.files.get() + 1;
        self.files.set(n);
        let path = self.scratch.path(&format!("file-{n}"));
        std::fs::write(&path, text).expect("file");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).expect("chmod");
        path.display().to_string()
    }

    fn arg(&self, arg: &str) -> String {
        let port = |port: u16| format!("redis://127.0.0.1:{port}");
        match arg {
            "{redis}" => self.redis.url(),
            "{closed}" => port(self.closed),
            "{http}" => port(self.http),
            "{silent}" => port(self.silent.local_addr().expect("addr").port()),
            "{missing}" => self.scratch.path("missing").display().to_string(),
            _ => {
                if let Some(text) = arg.strip_prefix("{file:").and_then(|a| a.strip_suffix('}')) {
                    self.file(text, 0o600)
                } else if let Some(text) = arg
                    .strip_prefix("{public:")
                    .and_then(|a| a.strip_suffix('}'))
                {
                    self.file(text, 0o644)
                } else {
                    arg.to_string()
                }
            }
        }
    }

    /// Run one case; what went wrong, if anything.
    fn check(&self, case: &Case) -> Result<(), String> {
        let args: Vec<String> = case.args.iter().map(|arg| self.arg(arg)).collect();
        let mut command = tenure();
        command
            .args(&args)
            .envs(case.env.iter().copied())
            .env_remove("TENURE_TTL")
            // Information lines are not errors; a warning before an error
            // counts as a line.
            .env("TENURE_LOG", "warn")
            .stdin(Stdio::null())
            .stderr(Stdio::piped());
        if case.full_stdout {
            command.stdout(
                std::fs::OpenOptions::new()
                    .write(true)
                    .open("/dev/full")
                    .expect("/dev/full"),
            );
        } else {
            command.stdout(Stdio::null());
        }
        let child = command.spawn().expect("tenure runs");
        let out =
            wait_bounded(child).ok_or_else(|| format!("{args:?}: still running after {HANG:?}"))?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        // clap's usage errors are a paragraph (the error, the arguments
        // missing) and then a "Usage:" block: the paragraph is the line.
        let lines: Vec<String> = match stderr.strip_prefix("error: ") {
            Some(error) => {
                let paragraph = error.split("\n\n").next().unwrap_or_default();
                vec![paragraph.split_whitespace().collect::<Vec<_>>().join(" ")]
            }
            None => stderr
                .lines()
                .filter(|line| !line.trim().is_empty())
                .map(str::to_string)
                .collect(),
        };
        let pattern = Regex::new(case.line).map_err(|e| format!("{:?}: {e}", case.line))?;
        let warned = case.lines == 1
            || lines
                .first()
                .is_some_and(|line| line.contains("is readable by every user"));
        let wrong = out.status.code() != Some(case.code)
            || lines.len() != case.lines
            || !warned
            || !lines.last().is_some_and(|line| pattern.is_match(line));
        if wrong {
            return Err(format!(
                "{args:?}: expected exit {} and {} line(s) matching {:?}; got {:?} and:\n{stderr}",
                case.code, case.lines, case.line, out.status
            ));
        }
        Ok(())
    }
}

/// The child's output, or None (and the child killed) after [`HANG`].
fn wait_bounded(mut child: std::process::Child) -> Option<std::process::Output> {
    let (done, finished) = std::sync::mpsc::channel();
    let pid = child.id();
    let stderr = child.stderr.take();
    let reader = std::thread::spawn(move || {
        let mut text = Vec::new();
        if let Some(mut stderr) = stderr {
            let _ = std::io::Read::read_to_end(&mut stderr, &mut text);
        }
        text
    });
    let waiter = std::thread::spawn(move || {
        let status = child.wait();
        let _ = done.send(());
        status
    });
    if finished.recv_timeout(HANG).is_err() {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
        let _ = waiter.join();
        return None;
    }
    let status = waiter.join().ok()?.ok()?;
    let stderr = reader.join().ok()?;
    Some(std::process::Output {
        status,
        stdout: Vec::new(),
        stderr,
    })
}

#[test]
fn every_bad_input_gets_its_exit_code_and_one_clear_line() {
    let world = World::new();
    let failures: Vec<String> = CASES
        .iter()
        .filter_map(|case| world.check(case).err())
        .collect();
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n\n{}",
        failures.len(),
        CASES.len(),
        failures.join("\n\n")
    );
}

#[test]
fn every_flag_has_a_bad_case() {
    let flag = Regex::new(r"(?m)^\s+(?:-\w, )?(--[a-z][a-z0-9-]*)").expect("regex");
    let mut missing = Vec::new();
    for subcommand in [
        &[][..],
        &["run"],
        &["status"],
        &["watch"],
        &["serve"],
        &["demo"],
        &["completions"],
        &["man"],
    ] {
        let out = tenure()
            .args(subcommand)
            .arg("--help")
            .output()
            .expect("tenure runs");
        let help = String::from_utf8_lossy(&out.stdout);
        for found in flag.captures_iter(&help) {
            let name = &found[1];
            if matches!(name, "--help" | "--version") {
                continue;
            }
            // Flags that several subcommands share (the store's, a term's)
            // have one parser: one case covers them all.
            let covered = CASES.iter().any(|case| {
                case.args
                    .iter()
                    .any(|arg| *arg == name || arg.starts_with(&format!("{name}=")))
            });
            if !covered {
                missing.push(format!("tenure {} {name}", subcommand.join(" ")));
            }
        }
    }
    assert!(missing.is_empty(), "flags without a bad case: {missing:?}");
}
