//! Just enough HTTP/1.1 to ask an etcd member things on its client port.
//!
//! etcd serves `/health` and a JSON gateway to its gRPC API (`/v3/...`) on
//! the same plain-HTTP port as its clients. One request per connection,
//! closed by the server after the reply (`Connection: close`), keeps the
//! client to a few dozen lines: no keep-alive, no pipelining, a body that
//! ends where the connection does (or is chunked). That is all the crate
//! needs, and it keeps `etcdctl` and async runtimes out of it.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use crate::{io_err, Error};

/// A reply: its status code and its body as text.
#[derive(Debug)]
pub(crate) struct Response {
    pub(crate) status: u16,
    pub(crate) body: String,
}

/// Send `method path` to 127.0.0.1:`port` with a JSON `body` and read the
/// whole reply, all within `timeout`.
pub(crate) fn request(
    port: u16,
    method: &str,
    path: &str,
    body: &str,
    timeout: Duration,
) -> Result<Response, Error> {
    let deadline = Instant::now() + timeout;
    let what = format!("{method} {path} on 127.0.0.1:{port}");
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut stream = TcpStream::connect_timeout(&addr, timeout)
        .map_err(io_err(format!("{what}: connecting")))?;
    // Small requests: do not wait for Nagle.
    let _ = stream.set_nodelay(true);
    stream
        .set_write_timeout(Some(timeout))
        .map_err(io_err(format!("{what}: setting a timeout")))?;
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream
        .write_all(request.as_bytes())
        .map_err(io_err(format!("{what}: sending")))?;
    let mut raw = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Error::Io {
                context: format!("{what}: no complete reply within {timeout:?}"),
                source: std::io::ErrorKind::TimedOut.into(),
            });
        }
        stream
            .set_read_timeout(Some(left))
            .map_err(io_err(format!("{what}: setting a timeout")))?;
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => raw.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(io_err(format!("{what}: reading the reply"))(e)),
        }
    }
    parse(&raw).ok_or_else(|| {
        Error::Http(format!(
            "{what}: not an HTTP reply: {:?}",
            String::from_utf8_lossy(&raw[..raw.len().min(200)])
        ))
    })
}

/// Status and body of a complete reply, or `None` when it is malformed.
fn parse(raw: &[u8]) -> Option<Response> {
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&raw[..end]).ok()?;
    let mut lines = head.split("\r\n");
    let status = lines.next()?.split_whitespace().nth(1)?.parse().ok()?;
    let chunked = lines.any(|line| {
        line.split_once(':').is_some_and(|(name, value)| {
            name.trim().eq_ignore_ascii_case("transfer-encoding")
                && value.trim().eq_ignore_ascii_case("chunked")
        })
    });
    let body = &raw[end + 4..];
    let body = if chunked {
        dechunk(body)?
    } else {
        body.to_vec()
    };
    Some(Response {
        status,
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}

/// The payload of a chunked body.
fn dechunk(mut body: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let line_end = body.windows(2).position(|w| w == b"\r\n")?;
        let size_field = std::str::from_utf8(&body[..line_end]).ok()?;
        let size_hex = size_field.split(';').next()?.trim();
        let size = usize::from_str_radix(size_hex, 16).ok()?;
        body = &body[line_end + 2..];
        if size == 0 {
            return Some(out);
        }
        out.extend_from_slice(body.get(..size)?);
        body = body.get(size + 2..)?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_plain_and_chunked_replies() {
        let plain = parse(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}").unwrap();
        assert_eq!((plain.status, plain.body.as_str()), (200, "{}"));
        let chunked = parse(
            b"HTTP/1.1 400 Bad Request\r\nTransfer-Encoding: chunked\r\n\r\n\
              3\r\n{\"a\r\n4;x=y\r\n\":1}\r\n0\r\n\r\n",
        )
        .unwrap();
        assert_eq!((chunked.status, chunked.body.as_str()), (400, "{\"a\":1}"));
        assert!(parse(b"HTTP/1.1 200 OK\r\n").is_none());
        assert!(parse(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab").is_none());
    }
}
