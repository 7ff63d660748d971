//! What tenure says when `--redis` or `--tls-ca` points at the wrong thing:
//! one line that names the likely mistake, and exit 69.

use crate::support;
use crate::support::{foreign_server, one_line, tenure_output, tls_files, RedisServer, Scratch};

/// `run --once`, `status` and `watch` against `url`, each with `extra`.
fn every_command(url: &str, extra: &[&str]) -> Vec<std::process::Output> {
    let runs: [Vec<&str>; 3] = [
        vec!["run", "--redis", url, "--election", "e", "--once"],
        vec!["status", "--redis", url],
        vec!["watch", "e", "--redis", url],
    ];
    runs.into_iter()
        .map(|mut args| {
            args.extend(extra);
            if args[0] == "run" {
                args.extend(["--", "true"]);
            }
            tenure_output(&args)
        })
        .collect()
}

#[test]
fn a_server_that_is_not_redis_does_not_speak_the_redis_protocol() {
    for (what, port) in [
        ("an SSH server", foreign_server("SSH-2.0-OpenSSH_9.6\r\n")),
        ("a web server", foreign_server("")),
    ] {
        let url = format!("redis://127.0.0.1:{port}");
        for out in every_command(&url, &[]) {
            let stderr = one_line(&out.stderr);
            assert_eq!(out.status.code(), Some(69), "{what}: {stderr}");
            assert!(
                stderr.contains("does not speak the Redis protocol"),
                "{what}: {stderr}"
            );
        }
    }
}

#[test]
fn a_tls_mismatch_is_named() {
    let scratch = Scratch::new("tls-mismatch");
    let files = tls_files(&scratch);
    let ca = files.ca.to_string_lossy().into_owned();
    let tls = RedisServer::builder()
        .tls(files)
        .start()
        .unwrap_or_else(|err| panic!("cannot start redis-server: {err}"));
    let plain = support::redis();

    // The TLS server works with its CA, so what follows is the scheme alone.
    let good = tenure_output(&[
        "status",
        "--redis",
        &format!("rediss://127.0.0.1:{}", tls.port()),
        "--tls-ca",
        &ca,
    ]);
    assert_eq!(good.status.code(), Some(0), "{good:?}");

    let plain_to_tls = format!("redis://127.0.0.1:{}", tls.port());
    for out in every_command(&plain_to_tls, &[]) {
        let stderr = one_line(&out.stderr);
        assert_eq!(out.status.code(), Some(69), "{stderr}");
        assert!(stderr.contains("use rediss://"), "{stderr}");
    }
    let tls_to_plain = format!("rediss://127.0.0.1:{}", plain.port());
    for out in every_command(&tls_to_plain, &["--tls-ca", &ca]) {
        let stderr = one_line(&out.stderr);
        assert_eq!(out.status.code(), Some(69), "{stderr}");
        assert!(
            stderr.contains("TLS") && stderr.contains("use redis://"),
            "{stderr}"
        );
    }
}

#[test]
fn a_tls_ca_that_is_not_a_pem_certificate_is_an_error() {
    let scratch = Scratch::new("tls-ca");
    let files = tls_files(&scratch);
    let tls = RedisServer::builder()
        .tls(files.clone())
        .start()
        .unwrap_or_else(|err| panic!("cannot start redis-server: {err}"));
    let url = format!("rediss://127.0.0.1:{}", tls.port());
    let not_pem = scratch.path("not-pem.txt");
    std::fs::write(&not_pem, "just some text\n").expect("write");
    for (file, expected) in [
        (not_pem, "no PEM certificate"),
        (files.key.clone(), "a private key, not a CA certificate"),
    ] {
        let file = file.to_string_lossy().into_owned();
        for out in every_command(&url, &["--tls-ca", &file]) {
            let stderr = one_line(&out.stderr);
            assert_eq!(out.status.code(), Some(69), "{stderr}");
            assert!(
                stderr.contains(&file) && stderr.contains(expected),
                "{stderr}"
            );
        }
    }
}
