//! A member that cannot start: the error says which, and why, from its log.
//! (A test binary of its own: it sets `ETCD_BIN` for the whole process.)

use etcd_process::{Error, EtcdCluster};

#[test]
fn a_member_that_exits_is_reported_with_its_log() {
    let script = std::env::temp_dir().join(format!("fake-etcd-{}", std::process::id()));
    std::fs::write(
        &script,
        "#!/bin/sh\necho \"fake etcd: cannot start\" >&2\nexit 3\n",
    )
    .unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    std::env::set_var("ETCD_BIN", &script);
    let result = EtcdCluster::builder().members(1).start();
    std::fs::remove_file(&script).unwrap();
    match result {
        Err(Error::DidNotStart { member, detail, .. }) => {
            assert_eq!(member, 0);
            assert!(detail.contains("exit status: 3"), "{detail}");
            assert!(detail.contains("fake etcd: cannot start"), "{detail}");
        }
        other => panic!("expected DidNotStart, got {other:?}"),
    }
}
