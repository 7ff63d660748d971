//! Just enough RESP2 to drive a private server from a test: send a command
//! as an array of bulk strings, read one reply.
//!
//! Replies are kept structured ([`Value`]) because Sentinel and Cluster
//! answer with nested arrays (one map per replica, one entry per slot range)
//! whose boundaries are lost once flattened to text; [`render`] flattens a
//! reply to the text form that [`crate::RedisServer::command`] has always
//! returned.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use crate::{io_err, Error};

/// One RESP2 reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Value {
    /// `+OK`, and integers (`:1`) as their decimal text.
    Simple(String),
    /// A bulk string; `None` is the null bulk string (`$-1`).
    Bulk(Option<String>),
    /// An array; the null array (`*-1`) is an empty one.
    Array(Vec<Value>),
    /// An error reply (`-ERR ...`), without the leading `-`.
    Error(String),
}

impl Value {
    /// The text of a simple or bulk string (empty for null).
    pub(crate) fn text(&self) -> Option<&str> {
        match self {
            Value::Simple(s) | Value::Bulk(Some(s)) => Some(s),
            Value::Bulk(None) => Some(""),
            _ => None,
        }
    }

    /// The items of an array (empty for anything else).
    pub(crate) fn items(&self) -> &[Value] {
        match self {
            Value::Array(items) => items,
            _ => &[],
        }
    }

    /// The value of `name` in a flat `[field, value, field, value, ...]`
    /// array, which is how Sentinel describes an instance.
    pub(crate) fn field(&self, name: &str) -> Option<&str> {
        self.items()
            .chunks(2)
            .find(|pair| pair.len() == 2 && pair[0].text() == Some(name))
            .and_then(|pair| pair[1].text())
    }
}

/// Render a reply as text, array items one per line (nested arrays
/// flattened); an error reply, even inside an array, becomes
/// [`Error::Reply`].
pub(crate) fn render(value: Value) -> Result<String, Error> {
    match value {
        Value::Simple(s) | Value::Bulk(Some(s)) => Ok(s),
        Value::Bulk(None) => Ok(String::new()),
        Value::Error(e) => Err(Error::Reply(e)),
        Value::Array(items) => {
            let lines = items
                .into_iter()
                .map(render)
                .collect::<Result<Vec<_>, _>>()?;
            Ok(lines.join("\n"))
        }
    }
}

/// Connect to `127.0.0.1:port`, `AUTH` when a password is given, send one
/// command and return its reply (an error reply is a [`Value::Error`], not an
/// `Err`; a failed `AUTH` is an `Err`).
pub(crate) fn call(
    port: u16,
    password: Option<&str>,
    args: &[&str],
    timeout: Duration,
) -> Result<Value, Error> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))
        .map_err(io_err(format!("connecting to 127.0.0.1:{port}")))?;
    stream
        .set_read_timeout(Some(timeout))
        .map_err(io_err("setting a read timeout"))?;
    stream
        .set_write_timeout(Some(timeout))
        .map_err(io_err("setting a write timeout"))?;
    let mut reader = BufReader::new(stream.try_clone().map_err(io_err("cloning a TCP stream"))?);
    if let Some(password) = password {
        send(&mut stream, &["AUTH", password])?;
        if let Value::Error(e) = read_value(&mut reader)? {
            return Err(Error::Reply(e));
        }
    }
    send(&mut stream, args)?;
    read_value(&mut reader)
}

fn send(stream: &mut TcpStream, args: &[&str]) -> Result<(), Error> {
    let mut frame = format!("*{}\r\n", args.len());
    for arg in args {
        frame.push_str(&format!("${}\r\n{}\r\n", arg.len(), arg));
    }
    stream
        .write_all(frame.as_bytes())
        .map_err(io_err("writing a command"))
}

/// Reads one RESP2 reply.
fn read_value(reader: &mut BufReader<TcpStream>) -> Result<Value, Error> {
    let mut line = String::new();
    let read = reader
        .read_line(&mut line)
        .map_err(io_err("reading a reply"))?;
    if read == 0 {
        return Err(Error::Io {
            context: "reading a reply".into(),
            source: std::io::ErrorKind::UnexpectedEof.into(),
        });
    }
    let line = line.trim_end_matches(['\r', '\n']);
    let (kind, rest) = line.split_at(line.len().min(1));
    match kind {
        "+" | ":" => Ok(Value::Simple(rest.to_string())),
        "-" => Ok(Value::Error(rest.to_string())),
        "$" => {
            let len: i64 = rest.parse().unwrap_or(-1);
            if len < 0 {
                return Ok(Value::Bulk(None));
            }
            let mut body = vec![0u8; len as usize + 2];
            reader
                .read_exact(&mut body)
                .map_err(io_err("reading a reply"))?;
            body.truncate(len as usize);
            Ok(Value::Bulk(Some(
                String::from_utf8_lossy(&body).into_owned(),
            )))
        }
        "*" => {
            let count: i64 = rest.parse().unwrap_or(0);
            let mut items = Vec::new();
            for _ in 0..count.max(0) {
                items.push(read_value(reader)?);
            }
            Ok(Value::Array(items))
        }
        _ => Err(Error::Reply(format!("unexpected reply line {line:?}"))),
    }
}
