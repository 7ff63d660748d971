//! Single-member ensembles: standalone mode, settings reaching `zoo.cfg`,
//! ensembles side by side, and the errors of bad settings.

use std::time::Duration;

use zk_process::{Error, ZkEnsemble};

#[test]
fn single_members_run_standalone_side_by_side_on_their_own_ports() {
    let start = || {
        ZkEnsemble::builder()
            .members(1)
            .tick_time(Duration::from_millis(100))
            .session_timeouts(Duration::from_millis(300), Duration::from_secs(5))
            .start()
            .unwrap()
    };
    let (mut a, b) = std::thread::scope(|s| {
        let a = s.spawn(start);
        let b = s.spawn(start);
        (a.join().unwrap(), b.join().unwrap())
    });
    assert_ne!(a.client_port(0), b.client_port(0));
    assert_ne!(a.dir(0), b.dir(0));
    assert_eq!(
        a.connect_string(),
        format!("127.0.0.1:{}", a.client_port(0))
    );
    for zk in [&a, &b] {
        assert_eq!(zk.leader().unwrap(), 0);
        let srvr = zk.four_letter(0, "srvr").unwrap();
        assert!(srvr.contains("Mode: standalone"), "{srvr}");
        let conf = zk.four_letter(0, "conf").unwrap();
        for line in [
            "tickTime=100",
            "minSessionTimeout=300",
            "maxSessionTimeout=5000",
        ] {
            assert!(conf.lines().any(|l| l == line), "{line} not in {conf}");
        }
    }
    // Each ensemble's ports are its own: neither sees the other's znode.
    a.cli(0, &["create", "/only-a", ""]).unwrap();
    assert!(b.cli(0, &["get", "/only-a"]).is_err());

    a.restart(0).unwrap();
    assert!(a.cli(0, &["get", "/only-a"]).is_ok());
    let dir = a.dir(0).to_path_buf();
    drop(a);
    assert!(!dir.exists());
}

#[test]
fn bad_settings_are_refused_and_a_member_that_exits_is_reported() {
    for builder in [
        ZkEnsemble::builder().members(0),
        ZkEnsemble::builder().members(8),
        ZkEnsemble::builder().tick_time(Duration::from_millis(5)),
        ZkEnsemble::builder().session_timeouts(Duration::from_secs(2), Duration::from_secs(1)),
        ZkEnsemble::builder().config("bad\nkey", "1"),
    ] {
        assert!(matches!(builder.start(), Err(Error::Config(_))));
    }
    let result = ZkEnsemble::builder()
        .members(1)
        .config("maxClientCnxns", "lots")
        .start();
    match result {
        Err(Error::DidNotStart { member, detail, .. }) => {
            assert_eq!(member, 0);
            assert!(detail.contains("exited with"), "{detail}");
            assert!(detail.contains("lots"), "{detail}");
        }
        other => panic!("expected DidNotStart, got {other:?}"),
    }
}
