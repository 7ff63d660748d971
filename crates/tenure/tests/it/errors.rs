//! Bad input gets a clear error: configuration, URLs, credentials, TLS,
//! ACLs, and keys holding data tenure did not write.

use crate::support;
use std::time::Duration;

use crate::support::{raw, redis, RedisServer};
use redis::AsyncCommands;
use tenure::{Election, Error};

async fn build_err(builder: tenure::ElectionBuilder) -> Error {
    match builder.build().await {
        Ok(e) => panic!("expected an error, built {e:?}"),
        Err(err) => err,
    }
}

fn memory(name: &str) -> tenure::ElectionBuilder {
    Election::builder(name).memory(&tenure::MemoryStore::new())
}

#[tokio::test]
async fn every_invalid_setting_is_named_in_its_error() {
    let ms = Duration::from_millis;
    let cases: Vec<(tenure::ElectionBuilder, &str)> = vec![
        (memory("e").ttl(ms(0)), "ttl must be between 100ms and 24h"),
        (memory("e").ttl(ms(99)), "ttl must be between 100ms and 24h"),
        (
            memory("e").ttl(Duration::from_secs(24 * 3600 + 1)),
            "ttl must be between 100ms and 24h",
        ),
        (
            memory("e").ttl(Duration::from_micros(150_500)),
            "whole number of milliseconds",
        ),
        (
            memory("e").ttl(ms(1000)).renew_every(ms(1000)),
            "renew interval",
        ),
        (
            memory("e").ttl(ms(1000)).renew_every(ms(5000)),
            "must be shorter than the ttl",
        ),
        (
            memory("e").ttl(ms(1000)).renew_every(ms(9)),
            "renew interval must be at least 10ms",
        ),
        (
            memory("e")
                .ttl(ms(1000))
                .renew_every(ms(600))
                .margin(ms(400)),
            "safety margin",
        ),
        (memory("e").call_timeout(ms(0)), "call timeout"),
        (memory(""), "election name must not be empty"),
        (memory("a{b}"), "braces"),
        (memory("a b"), "white space"),
        (memory("e").prefix(""), "key prefix must not be empty"),
        (memory("e").id(""), "instance id"),
        (memory("e").id("a\nb"), "control characters"),
        (memory("e").id("a\u{1b}[31mb"), "control characters"),
        (memory("e").ttl(ms(5000)).max_ttl(ms(1000)), "max ttl"),
        (Election::builder("e"), "no store given"),
    ];
    for (builder, expected) in cases {
        let err = build_err(builder).await;
        assert!(matches!(err, Error::Config(_)), "{err:?}");
        assert!(
            err.to_string().contains(expected),
            "{err} should mention {expected:?}"
        );
    }
}

#[tokio::test]
async fn a_short_ttl_is_allowed() {
    let e = memory("fast").ttl(Duration::from_millis(300)).build().await;
    assert!(e.is_ok());
}

#[tokio::test]
async fn a_url_that_is_not_redis_is_a_config_error() {
    let err = build_err(Election::builder("e").redis("http://127.0.0.1:1")).await;
    assert!(matches!(err, Error::Config(_)), "{err:?}");
    assert!(err.to_string().contains("redis://"), "{err}");
}

#[tokio::test]
async fn an_unreachable_redis_is_reported_with_its_address_and_no_password() {
    let port = redis_process::free_port().unwrap();
    let url = format!("redis://user:hunter2@127.0.0.1:{port}");
    let err = build_err(Election::builder("e").redis(&url)).await;
    assert!(matches!(err, Error::Unreachable { .. }), "{err:?}");
    let text = err.to_string();
    assert!(text.contains(&format!("127.0.0.1:{port}")), "{text}");
    assert!(!text.contains("hunter2"), "password leaked: {text}");
}

#[tokio::test]
async fn a_wrong_password_is_an_auth_error() {
    support::init_logs();
    let server = RedisServer::builder()
        .password("right-one")
        .start()
        .unwrap();
    let url = format!("redis://:wrong-one@127.0.0.1:{}", server.port());
    let err = build_err(Election::builder("e").redis(&url)).await;
    assert!(matches!(err, Error::Auth { .. }), "{err:?}");
    assert!(!err.to_string().contains("wrong-one"), "{err}");
    // No password at all.
    let url = format!("redis://127.0.0.1:{}", server.port());
    let err = build_err(Election::builder("e").redis(&url)).await;
    assert!(matches!(err, Error::Auth { .. }), "{err:?}");
    // The right one works.
    Election::builder("e")
        .redis(server.url())
        .build()
        .await
        .unwrap();
}

#[tokio::test]
async fn an_acl_user_with_enough_rights_can_lead_and_one_without_is_told_why() {
    support::init_logs();
    let mut builder = RedisServer::builder();
    let elector = format!("--user elector on >pw {}", tenure::MIN_ACL);
    for rule in [
        elector.as_str(),
        "--user reader on >pw ~* &* +@read +ping +subscribe",
    ] {
        for word in rule.split(' ') {
            builder = builder.arg(word);
        }
    }
    let server = builder.start().unwrap();
    let port = server.port();
    let ok = Election::builder("acl")
        .redis(format!("redis://elector:pw@127.0.0.1:{port}"))
        .ttl(Duration::from_secs(1))
        .build()
        .await
        .unwrap();
    ok.campaign().await.unwrap();
    // A missing permission is named when connecting, not part-way through
    // a lease operation.
    let err = Election::builder("acl")
        .redis(format!("redis://reader:pw@127.0.0.1:{port}"))
        .build()
        .await
        .unwrap_err();
    assert!(matches!(err, Error::NoPermission { .. }), "{err:?}");
}

#[cfg(feature = "tls")]
#[tokio::test]
async fn tls_works_with_the_servers_ca_and_fails_clearly_without_it() {
    support::init_logs();
    let dir = std::env::temp_dir().join(format!("tenure-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let files = make_certs(&dir);
    let server = RedisServer::builder().tls(files.clone()).start().unwrap();
    let url = format!("rediss://127.0.0.1:{}", server.port());

    let e = Election::builder("tls")
        .open(tenure::Store::open(&url).tls_ca_file(&files.ca))
        .ttl(Duration::from_secs(1))
        .build()
        .await
        .unwrap();
    let term = e.campaign().await.unwrap();
    assert!(term.is_leader());
    // The admin connection and the pub/sub connection use TLS too.
    let store = tenure::Store::open(&url)
        .tls_ca_file(&files.ca)
        .connect()
        .await
        .unwrap();
    let leader = store
        .leader_of("tenure", "tls")
        .await
        .unwrap()
        .expect("a leader");
    assert_eq!(leader.token, term.token());
    assert!(
        rustls::crypto::CryptoProvider::get_default().is_none(),
        "tenure installed a process-wide rustls CryptoProvider"
    );

    let err = build_err(Election::builder("tls").redis(&url)).await;
    assert!(matches!(err, Error::Tls { .. }), "{err:?}");

    let plain = format!("redis://127.0.0.1:{}", server.port());
    let err = build_err(Election::builder("tls").redis(&plain)).await;
    assert!(matches!(err, Error::Unreachable { .. }), "{err:?}");

    let err = build_err(
        Election::builder("tls")
            .open(tenure::Store::open(&url).tls_ca_file(dir.join("missing.pem"))),
    )
    .await;
    assert!(err.to_string().contains("missing.pem"), "{err}");

    // A CA file without a certificate (here: the server's private key).
    let err =
        build_err(Election::builder("tls").open(tenure::Store::open(&url).tls_ca_file(&files.key)))
            .await;
    assert!(matches!(err, Error::Tls { .. }), "{err:?}");
    assert!(
        err.to_string()
            .contains("a private key, not a CA certificate"),
        "{err}"
    );

    // rediss:// against a server without TLS.
    let plain_server = RedisServer::start().unwrap();
    let err = build_err(
        Election::builder("tls").open(
            tenure::Store::open(format!("rediss://127.0.0.1:{}", plain_server.port()))
                .tls_ca_file(&files.ca),
        ),
    )
    .await;
    assert!(matches!(err, Error::Tls { .. }), "{err:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[cfg(feature = "tls")]
#[tokio::test]
async fn a_tls_connection_is_opened_again_after_the_server_restarts() {
    support::init_logs();
    let dir = std::env::temp_dir().join(format!("tenure-tls-restart-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let files = make_certs(&dir);
    let mut server = RedisServer::builder().tls(files.clone()).start().unwrap();
    let url = format!("rediss://127.0.0.1:{}", server.port());
    let mut conn = tenure::fence::connect(&url, Some(&files.ca), Duration::from_secs(2))
        .await
        .unwrap();
    server.restart().unwrap();
    // The first call after the restart may fail on the dead connection; a
    // later one must succeed on a new one.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let mut last = None;
    while tokio::time::Instant::now() < deadline {
        match redis::cmd("PING").query_async::<String>(&mut conn).await {
            Ok(pong) => {
                last = Some(Ok(pong));
                break;
            }
            Err(err) => last = Some(Err(err.to_string())),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(last, Some(Ok("PONG".to_string())));
    let _ = std::fs::remove_dir_all(&dir);
}

#[cfg(not(feature = "tls"))]
#[tokio::test]
async fn without_the_tls_feature_tls_settings_are_a_configuration_error() {
    let err = build_err(
        Election::builder("tls")
            .open(tenure::Store::open("rediss://127.0.0.1:1").tls_ca_file("ca.pem")),
    )
    .await;
    assert!(matches!(err, Error::Config(_)), "{err:?}");
    assert!(err.to_string().contains("`tls` feature"), "{err}");
}

#[cfg(feature = "tls")]
fn make_certs(dir: &std::path::Path) -> redis_process::TlsFiles {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let server_key = KeyPair::generate().unwrap();
    let server_params =
        CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()]).unwrap();
    let server_cert = server_params.signed_by(&server_key, &issuer).unwrap();
    let files = redis_process::TlsFiles {
        cert: dir.join("server.pem"),
        key: dir.join("server.key"),
        ca: dir.join("ca.pem"),
    };
    std::fs::write(&files.cert, server_cert.pem()).unwrap();
    std::fs::write(&files.key, server_key.serialize_pem()).unwrap();
    std::fs::write(&files.ca, ca_cert.pem()).unwrap();
    files
}

#[tokio::test]
async fn keys_holding_foreign_data_are_reported_and_left_untouched() {
    let server = redis();
    let url = server.url();
    let mut conn = raw(&url).await;
    let e = Election::builder("foreign")
        .redis(&url)
        .build()
        .await
        .unwrap();

    // A string where the lease hash belongs.
    let _: () = conn
        .set("tenure:{foreign}:lease", "someone else's")
        .await
        .unwrap();
    let err = e.campaign().await.unwrap_err();
    assert!(
        matches!(err, Error::ForeignData { ref key, .. } if key == "tenure:{foreign}:lease"),
        "{err:?}"
    );
    assert!(err.to_string().contains("holds a string"), "{err}");
    let err = e.leader().await.unwrap_err();
    assert!(matches!(err, Error::ForeignData { .. }), "{err:?}");
    let kept: String = conn.get("tenure:{foreign}:lease").await.unwrap();
    assert_eq!(kept, "someone else's");

    // A hash that is not a lease.
    let _: () = conn.del("tenure:{foreign}:lease").await.unwrap();
    let _: () = conn
        .hset("tenure:{foreign}:lease", "colour", "blue")
        .await
        .unwrap();
    let err = e.campaign().await.unwrap_err();
    assert!(
        err.to_string()
            .contains("without exactly the fields of a lease"),
        "{err}"
    );
    let _: () = conn.del("tenure:{foreign}:lease").await.unwrap();

    // A token counter that is not a number, and one of the wrong type.
    let _: () = conn.set("tenure:{foreign}:token", "twelve").await.unwrap();
    let err = e.campaign().await.unwrap_err();
    assert!(
        matches!(err, Error::ForeignData { ref key, .. } if key == "tenure:{foreign}:token"),
        "{err:?}"
    );
    let _: () = conn.del("tenure:{foreign}:token").await.unwrap();
    let _: () = conn.rpush("tenure:{foreign}:token", "x").await.unwrap();
    let err = e.campaign().await.unwrap_err();
    assert!(err.to_string().contains("holds a list"), "{err}");
    let len: usize = conn.llen("tenure:{foreign}:token").await.unwrap();
    assert_eq!(len, 1, "foreign data is never overwritten");

    // A fenced key of the wrong type.
    let _: () = conn.set("app:plain", "x").await.unwrap();
    let err = tenure::FencedKey::new("app:plain")
        .set(&mut conn, 1, "v")
        .await
        .unwrap_err();
    assert!(matches!(err, Error::ForeignData { .. }), "{err:?}");
    let err = tenure::FencedKey::new("app:plain")
        .get(&mut conn)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::ForeignData { .. }), "{err:?}");
}
