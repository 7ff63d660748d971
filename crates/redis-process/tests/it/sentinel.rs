//! Sentinel groups of real processes: start-up, forced and crash failovers,
//! a stale primary coming back, passwords.

use std::time::{Duration, Instant};

use redis_process::{Node, SentinelGroup};

const DEADLINE: Duration = Duration::from_secs(30);

/// Poll `check` until it returns `Some`, failing the test after [`DEADLINE`].
fn eventually<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let started = Instant::now();
    loop {
        if let Some(value) = check() {
            return value;
        }
        assert!(
            started.elapsed() < DEADLINE,
            "timed out waiting until {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The first reply line to an inline `PING` on a fresh connection.
fn unauthenticated_ping(port: u16) -> String {
    use std::io::{BufRead, BufReader, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream.write_all(b"PING\r\n").unwrap();
    let mut line = String::new();
    BufReader::new(stream).read_line(&mut line).unwrap();
    line
}

/// `SET key value` on the primary, then wait until the replica has it:
/// replication is asynchronous, and a write not yet copied when the primary
/// dies is lost.
fn set_replicated(group: &SentinelGroup, key: &str, value: &str) {
    let primary = group.primary().unwrap();
    primary.command(&["SET", key, value]).unwrap();
    group.wait_for_replication(DEADLINE).unwrap();
    for node in group.data_nodes() {
        assert_eq!(node.command(&["GET", key]).unwrap(), value);
    }
}

fn role(node: &Node) -> String {
    let role = node.command(&["ROLE"]).unwrap();
    role.lines().next().unwrap_or_default().to_owned()
}

#[test]
fn a_group_starts_ready_and_replicates_writes() {
    let started = Instant::now();
    let group = SentinelGroup::start().unwrap();
    eprintln!("sentinel group started in {:?}", started.elapsed());

    let primary = group.primary_port().unwrap();
    assert_eq!(primary, group.data_nodes()[0].port());
    let ports = group.sentinel_ports();
    assert_eq!(
        group.url(),
        format!(
            "redis+sentinel://127.0.0.1:{},127.0.0.1:{},127.0.0.1:{}/tenure-test",
            ports[0], ports[1], ports[2]
        )
    );
    assert_eq!(role(group.primary().unwrap()), "master");

    group
        .primary()
        .unwrap()
        .command(&["SET", "k", "v"])
        .unwrap();
    let replica = &group.data_nodes()[1];
    assert_eq!(role(replica), "slave");
    eventually("the write reaches the replica", || {
        (replica.command(&["GET", "k"]).unwrap() == "v").then_some(())
    });
}

#[test]
fn failover_swaps_primary_and_replica() {
    let group = SentinelGroup::start().unwrap();
    let old = group.primary_port().unwrap();

    let started = Instant::now();
    let new = group.failover().unwrap();
    eprintln!("forced failover took {:?}", started.elapsed());
    assert_ne!(new, old);
    assert_eq!(group.primary_port().unwrap(), new);
    assert_eq!(role(group.node(new).unwrap()), "master");
    for sentinel in group.sentinels() {
        let addr = sentinel
            .command(&["SENTINEL", "get-master-addr-by-name", "tenure-test"])
            .unwrap();
        assert_eq!(addr, format!("127.0.0.1\n{new}"));
    }

    let started = Instant::now();
    assert_eq!(group.wait_until_ready(DEADLINE).unwrap(), new);
    eprintln!("old primary demoted after {:?}", started.elapsed());
    assert_eq!(role(group.node(old).unwrap()), "slave");

    // And back again.
    assert_eq!(group.failover().unwrap(), old);
}

#[test]
fn a_killed_primary_is_replaced_and_returns_as_a_stale_primary() {
    let group = SentinelGroup::start().unwrap();
    set_replicated(&group, "k", "v");

    let started = Instant::now();
    let old = group.kill_primary().unwrap();
    assert!(!group.node(old).unwrap().is_running());
    let new = group.wait_for_new_primary(old, DEADLINE).unwrap();
    eprintln!("failover after kill -9 took {:?}", started.elapsed());
    assert_ne!(new, old);
    assert_eq!(
        group.node(new).unwrap().command(&["GET", "k"]).unwrap(),
        "v"
    );

    // Without persistence the old primary comes back empty, and as a primary
    // until Sentinel demotes it. Not before every sentinel has heard from
    // the new primary: one that has not counts it as down, and may fail
    // over again to the empty node.
    assert_eq!(group.wait_until_ready(DEADLINE).unwrap(), new);
    let node = group.node(old).unwrap();
    node.resume().unwrap();
    assert_eq!(role(node), "master");
    assert_eq!(node.command(&["DBSIZE"]).unwrap(), "0");

    let started = Instant::now();
    assert_eq!(group.wait_until_ready(DEADLINE).unwrap(), new);
    eprintln!("resumed primary demoted after {:?}", started.elapsed());
    assert_eq!(role(node), "slave");
    eventually("the demoted node has resynced", || {
        (node.command(&["GET", "k"]).unwrap() == "v").then_some(())
    });
}

#[test]
fn a_primary_killed_after_a_snapshot_returns_with_its_keys() {
    let group = SentinelGroup::start().unwrap();
    set_replicated(&group, "k", "old");

    let old = group.kill_primary_keep_snapshot().unwrap();
    let new = group.wait_for_new_primary(old, DEADLINE).unwrap();
    group
        .node(new)
        .unwrap()
        .command(&["SET", "k", "new"])
        .unwrap();
    // Not before every sentinel has heard from the new primary (see above).
    assert_eq!(group.wait_until_ready(DEADLINE).unwrap(), new);

    let node = group.node(old).unwrap();
    node.resume().unwrap();
    assert_eq!(role(node), "master");
    assert_eq!(node.command(&["GET", "k"]).unwrap(), "old");

    group.wait_until_ready(DEADLINE).unwrap();
    eventually("the stale primary has resynced", || {
        (node.command(&["GET", "k"]).unwrap() == "new").then_some(())
    });
}

#[test]
fn passwords_protect_data_nodes_and_sentinels() {
    let group = SentinelGroup::builder()
        .password("data-pw")
        .sentinel_password("sentinel-pw")
        .service_name("svc")
        .start()
        .unwrap();
    let ports = group.sentinel_ports();
    assert_eq!(
        group.url(),
        format!(
            "redis+sentinel://:data-pw@127.0.0.1:{},127.0.0.1:{},127.0.0.1:{}/svc\
             ?sentinel_password=sentinel-pw",
            ports[0], ports[1], ports[2]
        )
    );
    // The nodes' own connections authenticate; a bare connection may not.
    set_replicated(&group, "k", "v");
    assert!(unauthenticated_ping(group.primary_port().unwrap()).starts_with("-NOAUTH"));
    assert!(unauthenticated_ping(ports[0]).starts_with("-NOAUTH"));

    let old = group.kill_primary().unwrap();
    let new = group.wait_for_new_primary(old, DEADLINE).unwrap();
    assert_eq!(
        group.node(new).unwrap().command(&["GET", "k"]).unwrap(),
        "v"
    );
}

#[test]
fn paused_sentinels_and_nodes_continue() {
    let group = SentinelGroup::start().unwrap();
    let sentinel = &group.sentinels()[0];
    sentinel.pause().unwrap();
    assert!(sentinel.is_paused());
    // Two sentinels are still a majority.
    let primary = group.primary_port().unwrap();
    sentinel.unpause().unwrap();
    assert!(!sentinel.is_paused());
    assert_eq!(group.wait_until_ready(DEADLINE).unwrap(), primary);

    // Stopped for longer than Sentinel's 2 s TILT trigger (the sleep is the
    // length of the fault, not a wait for something to happen).
    sentinel.pause().unwrap();
    std::thread::sleep(Duration::from_millis(2500));
    sentinel.unpause().unwrap();
    let started = Instant::now();
    assert_eq!(group.wait_until_ready(DEADLINE).unwrap(), primary);
    eprintln!("ready again {:?} after a 2.5 s pause", started.elapsed());

    let pid = sentinel.pid().unwrap();
    sentinel.kill();
    assert_eq!(sentinel.pid(), None);
    sentinel.resume().unwrap();
    assert_ne!(sentinel.pid(), Some(pid));
    assert_eq!(group.wait_until_ready(DEADLINE).unwrap(), primary);
}
