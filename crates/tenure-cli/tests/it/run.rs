//! End-to-end: real redis-server, several real `tenure run` processes.

use std::time::{Duration, Instant};

use crate::support::*;
use nix::sys::signal::Signal;

/// Which of the instances' commands is running now, by the PID files.
fn running_child(scratch: &Scratch, ids: &[&str]) -> Option<(String, i32)> {
    ids.iter().find_map(|id| {
        child_pid(scratch, id)
            .filter(|pid| alive(*pid))
            .map(|pid| (id.to_string(), pid))
    })
}

#[test]
fn kill_9_of_the_leaders_tenure_kills_its_command_and_another_starts_after_expiry() {
    let server = redis();
    let scratch = Scratch::new("kill9");
    let ttl = ["--ttl", "1500ms"];
    let a = Instance::start(&server.url(), "kill9", "a", &ttl, LONG_JOB, &scratch);
    let b = Instance::start(&server.url(), "kill9", "b", &ttl, LONG_JOB, &scratch);
    let mut leader = None;
    eventually("a command starts", || {
        leader = running_child(&scratch, &["a", "b"]);
        leader.is_some()
    });
    let (leader_id, old_pid) = leader.unwrap();
    // The command writes its PID before its token: wait for the token, or
    // the kill below may come between the two.
    eventually("the leader's command records its token", || {
        tokens(&scratch, &leader_id).len() == 1
    });
    let (victim, survivor) = if leader_id == "a" {
        (&a, "b")
    } else {
        (&b, "a")
    };
    victim.kill_group();
    eventually("the killed leader's command dies with it", || {
        !alive(old_pid)
    });
    eventually("the survivor's command starts", || {
        child_pid(&scratch, survivor).is_some()
    });
    assert!(!alive(old_pid), "never two commands at once");
    eventually("the survivor's command records its token", || {
        tokens(&scratch, survivor).len() == 1
    });
    let old = tokens(&scratch, &leader_id);
    let new = tokens(&scratch, survivor);
    assert!(new[0] > old[0], "{old:?} then {new:?}");
}

#[test]
fn sigterm_hands_over_without_waiting_for_the_ttl() {
    let server = redis();
    let scratch = Scratch::new("sigterm");
    let ttl = ["--ttl", "4s"];
    let mut a = Instance::start(&server.url(), "sigterm", "a", &ttl, LONG_JOB, &scratch);
    eventually("a's command starts", || child_pid(&scratch, "a").is_some());
    let b = Instance::start(&server.url(), "sigterm", "b", &ttl, LONG_JOB, &scratch);
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        child_pid(&scratch, "b").is_none(),
        "b follows while a leads"
    );
    let a_child = child_pid(&scratch, "a").unwrap();
    let stopped_at = Instant::now();
    a.signal(Signal::SIGTERM);
    assert_eq!(a.wait(), 0, "clean shutdown; log:\n{}", a.log());
    assert!(!alive(a_child), "a's command is gone when a exits");
    eventually("b's command starts", || child_pid(&scratch, "b").is_some());
    assert!(
        stopped_at.elapsed() < Duration::from_secs(2),
        "well before the 4 s lease could have expired"
    );
    drop(b);
}

/// A leader that exits after its release stays until its successor's term
/// is announced, and says so; alone, it exits all the same.
#[test]
fn an_exiting_leader_waits_for_its_successors_announcement() {
    let server = redis();
    let scratch = Scratch::new("successor");
    let ttl = ["--ttl", "4s"];
    let mut a = Instance::start(&server.url(), "successor", "a", &ttl, LONG_JOB, &scratch);
    eventually("a's command starts", || child_pid(&scratch, "a").is_some());
    let mut b = Instance::start(&server.url(), "successor", "b", &ttl, LONG_JOB, &scratch);
    // Both listen: b hears a's release and campaigns at once.
    eventually("b listens", || {
        server
            .command(&["PUBSUB", "NUMSUB", "tenure:{successor}:events"])
            .is_ok_and(|reply| reply.lines().last() == Some("2"))
    });
    a.signal(Signal::SIGTERM);
    assert_eq!(a.wait(), 0, "{}", a.log());
    assert!(
        a.log().contains("the next term was announced"),
        "a waited for b's term: {}",
        a.log()
    );
    eventually("b's command starts", || child_pid(&scratch, "b").is_some());
    // Nobody follows b: nothing is announced, and b exits all the same.
    b.signal(Signal::SIGTERM);
    assert_eq!(b.wait(), 0, "{}", b.log());
    assert!(
        !b.log().contains("the next term was announced"),
        "{}",
        b.log()
    );
}

#[test]
fn a_stolen_lease_kills_the_command_and_the_instance_campaigns_again() {
    let server = redis();
    let scratch = Scratch::new("stolen");
    let mut a = Instance::start(
        &server.url(),
        "stolen",
        "a",
        &["--ttl", "1s"],
        LONG_JOB,
        &scratch,
    );
    eventually("a's command starts", || child_pid(&scratch, "a").is_some());
    // The command writes its PID before its token: what stops it below
    // must not come between the two.
    eventually("a's command records its token", || {
        tokens(&scratch, "a").len() == 1
    });
    let first = child_pid(&scratch, "a").unwrap();
    server
        .command(&[
            "HSET",
            "tenure:{stolen}:lease",
            "owner",
            "thief",
            "token",
            "99999999999999",
            "since",
            "1",
        ])
        .unwrap();
    server
        .command(&["PEXPIRE", "tenure:{stolen}:lease", "1500"])
        .unwrap();
    eventually("the command is killed", || !alive(first));
    assert!(a.is_running(), "tenure keeps campaigning");
    eventually("a leads again once the thief's lease expired", || {
        tokens(&scratch, "a").len() == 2
    });
    let tokens = tokens(&scratch, "a");
    assert!(tokens[1] > tokens[0], "a new term: {tokens:?}");
}

#[test]
fn a_redis_restart_that_lost_the_lease_restarts_the_command_with_a_higher_token() {
    let mut server = redis();
    let scratch = Scratch::new("restart");
    let a = Instance::start(
        &server.url(),
        "restart",
        "a",
        &["--ttl", "1s"],
        LONG_JOB,
        &scratch,
    );
    eventually("a's command starts", || child_pid(&scratch, "a").is_some());
    // The command writes its PID before its token: what stops it below
    // must not come between the two.
    eventually("a's command records its token", || {
        tokens(&scratch, "a").len() == 1
    });
    let first = child_pid(&scratch, "a").unwrap();
    server.restart().unwrap();
    eventually("the command is stopped", || !alive(first));
    eventually("a new term starts", || tokens(&scratch, "a").len() == 2);
    let tokens = tokens(&scratch, "a");
    assert!(tokens[1] > tokens[0], "{tokens:?}");
    drop(a);
}

#[test]
fn failing_renewals_stop_the_command_before_anyone_else_could_lead() {
    let server = redis();
    let scratch = Scratch::new("paused");
    let a = Instance::start(
        &server.url(),
        "paused",
        "a",
        &["--ttl", "1s", "--kill-grace", "10s"],
        LONG_JOB,
        &scratch,
    );
    eventually("a's command starts", || child_pid(&scratch, "a").is_some());
    let first = child_pid(&scratch, "a").unwrap();
    // Nothing can change hands while every client is paused (expiry is
    // paused too), so the command must be gone before the pause ends.
    let paused_at = Instant::now();
    server.command(&["CLIENT", "PAUSE", "4000", "ALL"]).unwrap();
    eventually("the command is stopped", || !alive(first));
    assert!(
        paused_at.elapsed() < Duration::from_millis(3500),
        "stopped while Redis was still paused"
    );
    drop(a);
}

#[test]
fn the_commands_exit_status_is_propagated_and_the_lease_released() {
    let server = redis();
    let out = tenure_output(&[
        "run",
        "--redis",
        &server.url(),
        "--election",
        "status7",
        "--",
        "sh",
        "-c",
        "exit 7",
    ]);
    assert_eq!(out.status.code(), Some(7));
    let out = tenure_output(&[
        "run",
        "--redis",
        &server.url(),
        "--election",
        "status7",
        "--",
        "sh",
        "-c",
        "kill -TERM $$",
    ]);
    assert_eq!(out.status.code(), Some(128 + 15));
    let out = tenure_output(&[
        "run",
        "--redis",
        &server.url(),
        "--election",
        "status7",
        "--",
        "/no/such/program",
    ]);
    assert_eq!(out.status.code(), Some(127));
    let lease = server
        .command(&["EXISTS", "tenure:{status7}:lease"])
        .unwrap();
    assert_eq!(lease, "0", "released after the command exited");
}

#[test]
fn once_with_at_most_every_runs_the_job_on_exactly_one_of_several_racing_hosts() {
    let server = redis();
    let scratch = Scratch::new("cron");
    let job = r#"echo "$ME" >> "$DIR/ran"; sleep 0.3"#;
    let mut hosts: Vec<Instance> = ["h1", "h2", "h3", "h4"]
        .iter()
        .map(|id| {
            Instance::start(
                &server.url(),
                "cron",
                id,
                &["--once", "--at-most-every", "1h", "--ttl", "2s"],
                job,
                &scratch,
            )
        })
        .collect();
    for host in &mut hosts {
        assert_eq!(host.wait(), 0, "log of {}:\n{}", host.id, host.log());
    }
    let ran = scratch.read("ran");
    assert_eq!(
        ran.lines().count(),
        1,
        "exactly one host ran the job: {ran:?}"
    );
    let skipped = hosts
        .iter()
        .filter(|h| h.log().contains("skipping"))
        .count();
    assert_eq!(skipped, 3);
    // A later cron tick anywhere skips too.
    let out = tenure_output(&[
        "run",
        "--redis",
        &server.url(),
        "--election",
        "cron",
        "--once",
        "--at-most-every",
        "1h",
        "--",
        "sh",
        "-c",
        "exit 9",
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_failed_run_is_not_recorded_so_the_next_tick_retries() {
    let server = redis();
    let args = |cmd: &'static str| {
        vec![
            "run",
            "--redis",
            Box::leak(server.url().into_boxed_str()),
            "--election",
            "retry",
            "--once",
            "--at-most-every",
            "1h",
            "--",
            "sh",
            "-c",
            cmd,
        ]
    };
    assert_eq!(tenure_output(&args("exit 3")).status.code(), Some(3));
    assert_eq!(tenure_output(&args("exit 0")).status.code(), Some(0));
    let out = tenure_output(&args("exit 5"));
    assert_eq!(out.status.code(), Some(0), "skipped after the success");
    assert!(String::from_utf8_lossy(&out.stderr).contains("skipping"));
}

#[test]
fn no_wait_exits_75_when_another_instance_leads() {
    let server = redis();
    let scratch = Scratch::new("nowait");
    let _a = Instance::start(&server.url(), "nowait", "a", &[], LONG_JOB, &scratch);
    eventually("a's command starts", || child_pid(&scratch, "a").is_some());
    let out = tenure_output(&[
        "run",
        "--redis",
        &server.url(),
        "--election",
        "nowait",
        "--once",
        "--no-wait",
        "--",
        "true",
    ]);
    assert_eq!(out.status.code(), Some(75));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("a (token"), "{stderr}");
}

#[test]
fn no_wait_on_a_fresh_store_waits_out_the_hold_off_and_one_host_runs() {
    // A new Redis grants no lease for one ttl: nobody leads, so --no-wait
    // must not give up. Of three cron hosts, one runs CMD (which holds its
    // term until the test releases it) and the other two give up.
    let server = redis();
    let scratch = Scratch::new("nowait-fresh");
    let (ran, release) = (scratch.path("ran"), scratch.path("release"));
    let job = r#"echo "$TENURE_ID" >> "$1"; while [ ! -e "$2" ]; do sleep 0.01; done"#;
    let mut hosts: Vec<std::process::Child> = ["a", "b", "c"]
        .iter()
        .map(|id| {
            tenure()
                .args(["run", "--redis", &server.url(), "--election", "cron"])
                .args([
                    "--id",
                    id,
                    "--once",
                    "--no-wait",
                    "--",
                    "sh",
                    "-c",
                    job,
                    "sh",
                ])
                .arg(&ran)
                .arg(&release)
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .expect("tenure runs")
        })
        .collect();
    let mut codes = Vec::new();
    eventually("two hosts to give up", || {
        for host in &mut hosts {
            if let Ok(Some(status)) = host.try_wait() {
                codes.push(status.code());
            }
        }
        hosts.retain_mut(|host| matches!(host.try_wait(), Ok(None)));
        codes.len() >= 2
    });
    std::fs::write(&release, "").expect("release the job");
    for host in hosts {
        codes.push(host.wait_with_output().expect("tenure ends").status.code());
    }
    codes.sort();
    assert_eq!(
        codes,
        [Some(0), Some(75), Some(75)],
        "{}",
        scratch.read("ran")
    );
    assert_eq!(
        scratch.read("ran").lines().count(),
        1,
        "{}",
        scratch.read("ran")
    );
}

#[test]
fn wait_timeout_gives_up_with_75_after_about_the_timeout_while_another_instance_leads() {
    let server = redis();
    let scratch = Scratch::new("waittimeout");
    let _a = Instance::start(&server.url(), "waittimeout", "a", &[], LONG_JOB, &scratch);
    eventually("a's command starts", || child_pid(&scratch, "a").is_some());
    let wait = std::time::Duration::from_secs(2);
    let asked = std::time::Instant::now();
    let out = tenure_output(&[
        "run",
        "--redis",
        &server.url(),
        "--election",
        "waittimeout",
        "--once",
        "--wait-timeout",
        "2s",
        "--",
        "sh",
        "-c",
        "exit 9",
    ]);
    let took = asked.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(75), "{stderr}");
    assert!(took >= wait, "gave up after {took:?}, before the timeout");
    assert!(
        took < wait * 5,
        "gave up after {took:?}, long after the timeout"
    );
    let last = stderr.lines().last().unwrap_or_default();
    assert!(
        last.contains("--wait-timeout") && last.contains("a (token"),
        "{stderr}"
    );
    // Only with --once, and not with --no-wait.
    for flags in [
        &["--wait-timeout", "2s"][..],
        &["--once", "--no-wait", "--wait-timeout", "2s"],
    ] {
        let mut args = vec!["run", "--redis", "redis://127.0.0.1:1", "--election", "x"];
        args.extend(flags);
        args.extend(["--", "true"]);
        assert_eq!(tenure_output(&args).status.code(), Some(2), "{flags:?}");
    }
}

#[test]
fn status_and_watch_show_the_leader() {
    let server = redis();
    let scratch = Scratch::new("observe");
    let mut watch = tenure()
        .args(["watch", "observed", "--json", "--redis", &server.url()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut watch_out = std::io::BufReader::new(watch.stdout.take().unwrap());
    let mut line = String::new();
    use std::io::BufRead;
    watch_out.read_line(&mut line).unwrap();
    let first: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(first["leader"], serde_json::Value::Null);

    let _a = Instance::start(&server.url(), "observed", "a", &[], LONG_JOB, &scratch);
    let mut token = None;
    eventually("a's command records its token", || {
        token = scratch.read("tokens-a").trim().parse::<u64>().ok();
        token.is_some()
    });
    let token = token.unwrap();

    line.clear();
    watch_out.read_line(&mut line).unwrap();
    let change: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(change["leader"], "a");
    assert_eq!(change["token"], token);
    assert_eq!(change["election"], "observed");
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(watch.id() as i32),
        Signal::SIGINT,
    );
    assert_eq!(watch.wait().unwrap().code(), Some(0));

    let out = tenure_output(&["status", "--json", "--redis", &server.url()]);
    assert!(out.status.success());
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let election = &status["elections"][0];
    assert_eq!(election["name"], "observed");
    assert_eq!(election["leader"]["id"], "a");
    assert_eq!(election["leader"]["token"], token);
    assert!(election["leader"]["ttl_left_ms"].as_u64().unwrap() > 0);
    assert!(election["leader"]["held_since"]
        .as_str()
        .unwrap()
        .ends_with('Z'));

    let out = tenure_output(&["status", "--redis", &server.url(), "observed", "idle"]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.lines().next().unwrap().starts_with("ELECTION"));
    assert!(table.contains(&token.to_string()), "{table}");
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("idle") && l.contains("(none)")),
        "{table}"
    );
}

#[test]
fn the_metrics_endpoint_reports_leadership_and_health() {
    let server = redis();
    let scratch = Scratch::new("metrics");
    let port = redis_process::free_port().unwrap().to_string();
    let _a = Instance::start(
        &server.url(),
        "metered",
        "a",
        &["--metrics-addr", &port, "--ttl", "900ms"],
        LONG_JOB,
        &scratch,
    );
    eventually("a's command starts", || child_pid(&scratch, "a").is_some());
    let addr = format!("127.0.0.1:{port}");
    let mut metrics = String::new();
    eventually("metrics show the leader", || {
        metrics = http_get(&addr, "/metrics").1;
        metrics.contains("leader_election_is_leader{name=\"metered\"} 1")
    });
    assert!(
        metrics.contains("leader_election_acquired_total{name=\"metered\"} 1"),
        "{metrics}"
    );
    // client-go's name, for dashboards and alerts written for Kubernetes.
    assert!(
        metrics.contains("leader_election_master_status{name=\"metered\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("tenure_child_running{election=\"metered\"} 1"),
        "{metrics}"
    );
    eventually("a renewal shows in the latency histogram", || {
        metrics = http_get(&addr, "/metrics").1;
        metrics.contains("leader_election_renew_duration_seconds_bucket{name=\"metered\"")
    });
    assert_eq!(http_get(&addr, "/healthz").0, 200);
    assert_eq!(http_get(&addr, "/readyz").0, 200);
}

#[test]
fn bad_input_gets_one_clear_line_and_a_nonzero_exit() {
    let server = redis();
    let url = server.url();
    let cases: Vec<(Vec<&str>, i32, &str)> = vec![
        (
            vec!["run", "--election", "x", "--ttl", "15", "--", "true"],
            2,
            "time unit needed",
        ),
        (
            vec![
                "run",
                "--election",
                "x",
                "--redis",
                &url,
                "--ttl",
                "1s",
                "--renew-every",
                "1s",
                "--",
                "true",
            ],
            2,
            "renew interval",
        ),
        (
            vec![
                "run",
                "--election",
                "x",
                "--redis",
                &url,
                "--kill-grace",
                "soon",
                "--",
                "true",
            ],
            2,
            "kill-grace",
        ),
        (
            vec![
                "run",
                "--election",
                "x",
                "--redis",
                "redis://127.0.0.1:1",
                "--",
                "true",
            ],
            69,
            "cannot reach Redis",
        ),
        (
            vec!["run", "--election", "a b", "--redis", &url, "--", "true"],
            2,
            "white space",
        ),
        (
            vec![
                "run",
                "--election",
                "x",
                "--redis",
                "http://nope",
                "--",
                "true",
            ],
            2,
            "invalid Redis URL",
        ),
        (
            vec!["status", "--redis", "redis://127.0.0.1:1"],
            69,
            "cannot reach Redis",
        ),
    ];
    for (args, code, message) in cases {
        let out = tenure_output(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{args:?}: {stderr}");
        assert!(
            stderr.contains(message),
            "{args:?} should say {message:?}: {stderr}"
        );
    }
}

#[test]
fn a_wrong_password_is_reported_without_echoing_it() {
    let server = RedisServer::builder().password("s3cret").start().unwrap();
    let url = format!("redis://:wrong-pw@127.0.0.1:{}", server.port());
    let out = tenure_output(&["run", "--election", "x", "--redis", &url, "--", "true"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(69), "{stderr}");
    assert!(stderr.contains("rejected the credentials"), "{stderr}");
    assert!(!stderr.contains("wrong-pw"), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
}

#[test]
fn kill_9_of_the_guardian_kills_the_whole_command_before_the_lease_is_released() {
    let server = redis();
    let scratch = Scratch::new("guardian9");
    let job = escaping_job();
    let mut a = Instance::start(
        &server.url(),
        "guardian9",
        "a",
        &["--ttl", "5s"],
        &job,
        &scratch,
    );
    let pids = wait_for_escapes(&scratch, "a");
    let _reap = Reap(pids.to_vec());
    let guardian = parent_of(pids[0]).expect("CMD has a parent");
    assert_ne!(guardian, a.pid().as_raw(), "CMD runs under a guardian");
    assert!(lease_exists(&server, "guardian9"));

    let killed_at = Instant::now();
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(guardian), Signal::SIGKILL);
    let mut all_dead_after = None;
    eventually("the lease is released", || {
        // The lease first, then the processes: one seen running after the
        // lease was seen gone ran while the lease was free.
        let lease = lease_exists(&server, "guardian9");
        let running: Vec<i32> = pids.iter().copied().filter(|p| alive(*p)).collect();
        assert!(
            lease || running.is_empty(),
            "lease released while {running:?} of {pids:?} still ran"
        );
        if running.is_empty() && all_dead_after.is_none() {
            all_dead_after = Some(killed_at.elapsed());
        }
        !lease
    });
    let all_dead_after = all_dead_after.expect("all dead before the release");
    assert!(
        all_dead_after < Duration::from_secs(1),
        "CMD's tree took {all_dead_after:?} to die"
    );
    assert_eq!(
        a.wait(),
        70,
        "a dead guardian is an internal failure; log:\n{}",
        a.log()
    );
    assert!(!a.log().contains("command exited"), "{}", a.log());
}

#[test]
fn escaped_descendants_die_when_the_command_exits() {
    let server = redis();
    let scratch = Scratch::new("escape-exit");
    let job = format!(r#"echo $$ > "$DIR/pid-$ME"; {ESCAPE}exit 0"#);
    let mut a = Instance::start(&server.url(), "escape-exit", "a", &[], &job, &scratch);
    assert_eq!(a.wait(), 0, "CMD's status; log:\n{}", a.log());
    let pids = escaped_pids(&scratch, "a").expect("all PIDs recorded");
    let _reap = Reap(pids.to_vec());
    let running: Vec<i32> = pids.iter().copied().filter(|p| alive(*p)).collect();
    assert!(
        running.is_empty(),
        "{running:?} of {pids:?} outlived tenure"
    );
    assert!(!lease_exists(&server, "escape-exit"));
}

#[test]
fn escaped_descendants_die_on_sigterm_before_the_lease_is_released() {
    let server = redis();
    let scratch = Scratch::new("escape-term");
    let job = escaping_job();
    let mut a = Instance::start(&server.url(), "escape-term", "a", &[], &job, &scratch);
    let pids = wait_for_escapes(&scratch, "a");
    let _reap = Reap(pids.to_vec());
    a.signal(Signal::SIGTERM);
    assert_eq!(a.wait(), 0, "clean shutdown; log:\n{}", a.log());
    let running: Vec<i32> = pids.iter().copied().filter(|p| alive(*p)).collect();
    assert!(
        running.is_empty(),
        "{running:?} of {pids:?} outlived tenure"
    );
    assert!(!lease_exists(&server, "escape-term"));
}

#[test]
fn escaped_descendants_die_before_the_next_leader_starts_when_tenure_is_killed() {
    let server = redis();
    let scratch = Scratch::new("escape-kill9");
    let job = escaping_job();
    let ttl = ["--ttl", "2s"];
    let a = Instance::start(&server.url(), "escape-kill9", "a", &ttl, &job, &scratch);
    let pids = wait_for_escapes(&scratch, "a");
    let _reap = Reap(pids.to_vec());
    let b = Instance::start(&server.url(), "escape-kill9", "b", &ttl, LONG_JOB, &scratch);
    // tenure alone: its process group, not the guardian's.
    a.kill_group();
    eventually("b's command starts", || child_pid(&scratch, "b").is_some());
    let running: Vec<i32> = pids.iter().copied().filter(|p| alive(*p)).collect();
    assert!(
        running.is_empty(),
        "{running:?} of a's {pids:?} still ran when b's command started"
    );
    drop(b);
}

#[test]
fn a_stopped_tenure_cannot_keep_its_command_running_past_the_deadline() {
    let server = redis();
    let scratch = Scratch::new("sigstop");
    // Every 10 ms: a CLOCK_REALTIME timestamp (ns), written as one line.
    let job = r#"echo $$ > "$DIR/pid-$ME"
while :; do date +%s%N >> "$DIR/writes-$ME"; sleep 0.01; done"#;
    let ttl = ["--ttl", "2s"];
    let mut a = Instance::start(&server.url(), "sigstop", "a", &ttl, job, &scratch);
    eventually("a's command writes", || {
        !scratch.read("writes-a").is_empty()
    });
    let b = Instance::start(&server.url(), "sigstop", "b", &ttl, job, &scratch);
    let a_cmd = child_pid(&scratch, "a").unwrap();
    let _reap = Reap(vec![a_cmd]);

    let stopped_at = now_ns();
    a.signal(Signal::SIGSTOP);
    eventually("b's command has written 20 lines", || {
        scratch.read("writes-b").lines().count() >= 20
    });
    let a_writes = timestamps(&scratch.read("writes-a"));
    a.signal(Signal::SIGCONT);
    let b_writes = timestamps(&scratch.read("writes-b"));
    let a_last = *a_writes.last().unwrap();
    let b_first = b_writes[0];
    // a's deadline is at most one ttl minus the margin (200 ms) after its
    // last renewal, which came before the stop.
    let a_deadline = stopped_at + 1_800_000_000;
    assert!(
        a_last < a_deadline,
        "a's command wrote {} ms after a's deadline",
        (a_last - a_deadline) / 1_000_000
    );
    assert!(
        a_last < b_first,
        "a's command wrote {} ms after b's command started",
        (a_last - b_first) / 1_000_000
    );
    assert!(!alive(a_cmd));
    eventually("a, continued, notices and campaigns again", || {
        a.log().contains("campaigning again")
    });
    assert!(a.is_running(), "log:\n{}", a.log());
    drop(b);
}

fn now_ns() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

fn timestamps(text: &str) -> Vec<u128> {
    text.lines().filter_map(|l| l.trim().parse().ok()).collect()
}

#[test]
fn a_closed_stderr_neither_panics_nor_keeps_the_lease() {
    let server = redis();
    let scratch = Scratch::new("stderr");
    // Shutdown with a closed stderr: every log line fails to write.
    let mut a = Instance::start_with_stderr(
        &server.url(),
        "closed-stderr",
        "a",
        &[],
        LONG_JOB,
        &scratch,
        closed_pipe(),
    );
    eventually("a's command starts", || child_pid(&scratch, "a").is_some());
    let cmd = child_pid(&scratch, "a").unwrap();
    eventually("a's token is recorded", || {
        scratch.read("tokens-a").trim().parse::<u64>().is_ok()
    });
    a.signal(Signal::SIGTERM);
    assert_eq!(a.wait(), 0, "a clean shutdown, as with a working stderr");
    assert!(!alive(cmd));
    assert!(!lease_exists(&server, "closed-stderr"));

    // CMD shares the closed stderr: writing to it kills CMD with SIGPIPE,
    // and tenure passes that status on (128 + 13).
    let mut b = Instance::start_with_stderr(
        &server.url(),
        "closed-stderr",
        "b",
        &[],
        "echo to-stderr >&2; exit 0",
        &scratch,
        closed_pipe(),
    );
    assert_eq!(b.wait(), 141);
    assert!(!lease_exists(&server, "closed-stderr"));

    let status = tenure()
        .args([
            "status",
            "--json",
            "--redis",
            &server.url(),
            "--log",
            "debug",
        ])
        .stdin(std::process::Stdio::null())
        .stderr(closed_pipe())
        .output()
        .expect("tenure status runs");
    assert_eq!(status.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&status.stdout).contains("\"elections\""));
}

#[test]
fn sighup_stops_the_command_and_releases_the_lease() {
    let server = redis();
    let scratch = Scratch::new("sighup");
    let mut a = Instance::start(&server.url(), "sighup", "a", &[], LONG_JOB, &scratch);
    eventually("a's command starts", || child_pid(&scratch, "a").is_some());
    let cmd = child_pid(&scratch, "a").unwrap();
    a.signal(Signal::SIGHUP);
    assert_eq!(a.wait(), 0, "log:\n{}", a.log());
    assert!(!alive(cmd));
    assert!(!lease_exists(&server, "sighup"));
}

#[test]
fn a_followers_waiting_guardian_runs_nothing_and_dies_with_tenure() {
    let server = redis();
    let scratch = Scratch::new("standby");
    let a = Instance::start(&server.url(), "standby", "a", &[], LONG_JOB, &scratch);
    eventually("a's command starts", || child_pid(&scratch, "a").is_some());
    let b = Instance::start(&server.url(), "standby", "b", &[], LONG_JOB, &scratch);
    let below_b = || tenure_procs::descendants(&tenure_procs::all(), b.pid().as_raw());
    // Connected to b and waiting: b campaigns only once it is.
    eventually("b's guardian waits for a term", || {
        b.log().contains("guardian is ready; campaigning")
    });
    let waiting = below_b();
    assert_eq!(
        waiting.len(),
        1,
        "only the guardian, no command: {waiting:?}"
    );
    let guardian = waiting[0].pid;
    assert_eq!(parent_of(guardian), Some(b.pid().as_raw()));
    // tenure alone: the guardian is in a process group of its own.
    b.kill_group();
    eventually("b's waiting guardian leaves with b", || !alive(guardian));
    assert!(child_pid(&scratch, "b").is_none(), "b's command never ran");
    drop(a);
}

#[test]
fn a_killed_waiting_guardian_is_replaced_when_the_term_begins() {
    let server = redis();
    let scratch = Scratch::new("standby-killed");
    let mut a = Instance::start(
        &server.url(),
        "standby-killed",
        "a",
        &[],
        LONG_JOB,
        &scratch,
    );
    eventually("a's command starts", || child_pid(&scratch, "a").is_some());
    let b = Instance::start(
        &server.url(),
        "standby-killed",
        "b",
        &[],
        LONG_JOB,
        &scratch,
    );
    let below_b = || tenure_procs::descendants(&tenure_procs::all(), b.pid().as_raw());
    // Connected to b and waiting: b campaigns only once it is.
    eventually("b's guardian waits for a term", || {
        b.log().contains("guardian is ready; campaigning")
    });
    let guardian = below_b()[0].pid;
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(guardian), Signal::SIGKILL);
    eventually("b's guardian is dead", || !alive(guardian));
    a.signal(Signal::SIGTERM);
    assert_eq!(a.wait(), 0, "clean shutdown; log:\n{}", a.log());
    eventually_or_show(
        "b's command starts all the same",
        || child_pid(&scratch, "b").is_some(),
        || format!("b's log:\n{}", b.log()),
    );
    let cmd = child_pid(&scratch, "b").unwrap();
    let new_guardian = parent_of(cmd).expect("b's command runs");
    assert_ne!(new_guardian, guardian);
    assert_eq!(parent_of(new_guardian), Some(b.pid().as_raw()));
    assert!(b.log().contains("starting another"), "log:\n{}", b.log());
}
