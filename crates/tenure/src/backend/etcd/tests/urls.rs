//! Taking etcd URLs apart, and refusing bad ones.

use super::target;

#[test]
fn urls_name_every_member_and_the_credentials() {
    let parsed = target("etcd://app:p%40ss@10.0.0.1:2379,10.0.0.2:2379/")
        .parse()
        .expect("valid");
    assert_eq!(
        parsed.endpoints,
        ["http://10.0.0.1:2379", "http://10.0.0.2:2379"]
    );
    assert_eq!(parsed.user, Some(("app".into(), "p@ss".into())));
    assert!(!parsed.tls);
    assert_eq!(
        target("etcds://h:1").parse().expect("valid").endpoints,
        ["https://h:1"]
    );
}

#[test]
fn bad_urls_get_one_line_without_the_password() {
    for bad in [
        "etcd://u:secret@h",
        "etcd://u:secret@h:0",
        "etcd://u:secret@h:1/path",
        "etcd://u:secret@:1",
        "etcd://:secret@h:1",
    ] {
        let err = target(bad).parse().expect_err(bad).to_string();
        assert!(!err.contains("secret"), "{err}");
        assert!(!err.contains('\n'), "{err}");
        assert!(err.contains("etcd://"), "{err}");
    }
}
