//! `--password-file`: the Redis password from a file, so that it appears
//! neither on the command line (`ps`, shell history) nor in the environment
//! (which `/proc/PID/environ` and crash reporters show).
//!
//! The password is put into the URL, percent-encoded, right after the
//! command line is read: from then on it is where every other part of tenure
//! already expects a password, and where [`tenure::redact_url`] hides it in
//! every message. CMD never sees the URL (see `crate::supervisor`).

use std::path::Path;

use crate::exit::{self, Failure};

/// `url` with the password read from `file` in it (`redis://user:PASSWORD@…`,
/// or `redis+unix://…?pass=PASSWORD`); `url` as it is without a file.
///
/// The file holds the password alone; one trailing newline (`\n` or
/// `\r\n`) is not part of it. A URL that already carries a password is an
/// error: which one was meant cannot be guessed.
pub fn apply(url: &str, file: Option<&Path>) -> Result<String, Failure> {
    let Some(file) = file else {
        return Ok(url.to_string());
    };
    let usage = |message: String| Failure::new(exit::USAGE, message);
    let bytes = std::fs::read(file).map_err(|err| {
        usage(format!(
            "cannot read the password file {}: {err}",
            file.display()
        ))
    })?;
    let text = String::from_utf8(bytes)
        .map_err(|_| usage(format!("the password file {} is not UTF-8", file.display())))?;
    let password = text
        .strip_suffix("\r\n")
        .or_else(|| text.strip_suffix('\n'))
        .unwrap_or(&text);
    if password.is_empty() {
        return Err(usage(format!(
            "the password file {} is empty",
            file.display()
        )));
    }
    let url = with_password(url, &encode(password)).map_err(|why| {
        usage(format!(
            "--password-file cannot be used with {}: {why}",
            tenure::redact_url(url)
        ))
    })?;
    // Only about a file that is used: an unusable one gets its one line.
    warn_if_world_readable("--password-file", file);
    Ok(url)
}

/// One line on stderr when every user may read the secret in `file` (as
/// ssh says of a private key): it still works, but should not.
pub fn warn_if_world_readable(flag: &str, file: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let Ok(metadata) = std::fs::metadata(file) else {
        return;
    };
    let mode = metadata.permissions().mode() & 0o777;
    if mode & 0o004 != 0 {
        crate::output::err_line(&format!(
            "tenure: warning: {flag} {} is readable by every user (mode {mode:04o}); \
             restrict it, e.g. chmod 600",
            file.display()
        ));
    }
}

/// Put an already percent-encoded password into `url`.
fn with_password(url: &str, encoded: &str) -> Result<String, &'static str> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err("it is not a URL");
    };
    match scheme {
        "redis" | "rediss" | "redis+sentinel" | "rediss+sentinel" | "redis+cluster"
        | "rediss+cluster" | "etcd" | "etcds" | "zk" | "postgres" | "postgresql" => {
            if rest
                .split_once('?')
                .is_some_and(|(_, query)| query.split('&').any(|p| p.starts_with("password=")))
            {
                return Err("the URL has a password (password=) already");
            }
            // The authority ends at the path or the query.
            let end = rest.find(['/', '?']).unwrap_or(rest.len());
            let (authority, tail) = rest.split_at(end);
            let (user, host) = match authority.rsplit_once('@') {
                Some((userinfo, host)) => match userinfo.split_once(':') {
                    Some((_, password)) if !password.is_empty() => {
                        return Err("the URL has a password already");
                    }
                    Some((user, _)) => (user, host),
                    None => (userinfo, host),
                },
                None => ("", authority),
            };
            Ok(format!("{scheme}://{user}:{encoded}@{host}{tail}"))
        }
        "redis+unix" | "unix" => {
            let (path, query) = match rest.split_once('?') {
                Some((path, query)) => (path, Some(query)),
                None => (rest, None),
            };
            match query {
                Some(query) => {
                    let has_password = query
                        .split('&')
                        .any(|param| param.split('=').next() == Some("pass"));
                    if has_password {
                        return Err("the URL has a password (pass=) already");
                    }
                    Ok(format!("{scheme}://{path}?{query}&pass={encoded}"))
                }
                None => Ok(format!("{scheme}://{path}?pass={encoded}")),
            }
        }
        _ => Err(
            "it works with redis://, rediss://, redis+unix://, redis+sentinel://, \
             redis+cluster://, etcd:// and zk:// URLs",
        ),
    }
}

/// Percent-encode everything but RFC 3986's unreserved characters, so any
/// password survives both the authority and a query string.
fn encode(password: &str) -> String {
    let mut out = String::with_capacity(password.len());
    for byte in password.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_password_goes_where_the_redis_client_reads_it() {
        assert_eq!(
            with_password("redis://127.0.0.1:6379/2", "pw").as_deref(),
            Ok("redis://:pw@127.0.0.1:6379/2")
        );
        assert_eq!(
            with_password("rediss://app@db:6380", "pw").as_deref(),
            Ok("rediss://app:pw@db:6380")
        );
        assert_eq!(
            with_password("redis+sentinel://s1:26379,s2:26379/svc/1", "pw").as_deref(),
            Ok("redis+sentinel://:pw@s1:26379,s2:26379/svc/1")
        );
        assert_eq!(
            with_password("rediss+cluster://app@a:7000,b:7001", "pw").as_deref(),
            Ok("rediss+cluster://app:pw@a:7000,b:7001")
        );
        assert_eq!(
            with_password("redis+unix:///run/redis.sock", "pw").as_deref(),
            Ok("redis+unix:///run/redis.sock?pass=pw")
        );
        assert_eq!(
            with_password("redis+unix:///run/redis.sock?db=1", "pw").as_deref(),
            Ok("redis+unix:///run/redis.sock?db=1&pass=pw")
        );
    }

    #[test]
    fn the_password_goes_where_the_postgres_client_reads_it() {
        assert_eq!(
            with_password("postgres://app@db:5432/jobs?sslmode=require", "p%40w").as_deref(),
            Ok("postgres://app:p%40w@db:5432/jobs?sslmode=require")
        );
        assert_eq!(
            with_password("postgresql://app@db/jobs", "pw").as_deref(),
            Ok("postgresql://app:pw@db/jobs")
        );
    }

    #[test]
    fn a_url_with_a_password_of_its_own_is_refused() {
        assert!(with_password("redis://:other@db", "pw").is_err());
        assert!(with_password("redis://app:other@db", "pw").is_err());
        assert!(with_password("redis+unix:///s.sock?pass=other", "pw").is_err());
        assert!(with_password("postgres://app@db/x?password=other", "pw").is_err());
        assert!(with_password("postgres://app:other@db/x", "pw").is_err());
        assert!(with_password("db:6379", "pw").is_err());
    }

    #[test]
    fn any_character_of_a_password_is_encoded() {
        assert_eq!(encode("a-Z_9.~"), "a-Z_9.~");
        assert_eq!(
            encode("p@ss:w/rd?&=+ %é"),
            "p%40ss%3Aw%2Frd%3F%26%3D%2B%20%25%C3%A9"
        );
    }
}
