//! A port another process took is never mistaken for our server: whoever
//! answers on it must be the process we started.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use redis_process::{find_redis_server, Error, RedisServer, SentinelGroup};

/// A `redis-server` of nobody's, on `port`, with `password` if any; killed
/// by PID when dropped.
struct Foreign(Child, std::path::PathBuf);

impl Foreign {
    fn start(port: u16, password: Option<&str>) -> Foreign {
        let dir = std::env::temp_dir().join(format!("redis-process-foreign-{port}"));
        std::fs::create_dir_all(&dir).unwrap();
        let mut command = Command::new(find_redis_server().unwrap());
        if let Some(password) = password {
            command.args(["--requirepass", password]);
        }
        let child = command
            .current_dir(&dir)
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let foreign = Foreign(child, dir);
        let started = Instant::now();
        while !answers(port) {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "the foreign server on {port} never answered"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        foreign
    }
}

impl Drop for Foreign {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
        let _ = std::fs::remove_dir_all(&self.1);
    }
}

/// Whether an inline `PING` on `port` gets `+PONG`, or `-NOAUTH` from a
/// server with a password.
fn answers(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    if stream.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut line = String::new();
    BufReader::new(stream).read_line(&mut line).is_ok()
        && (line.starts_with("+PONG") || line.starts_with("-NOAUTH"))
}

#[test]
fn a_server_does_not_resume_on_a_port_another_process_took() {
    let mut server = RedisServer::start().unwrap();
    let port = server.port();
    server.kill();
    let foreign = Foreign::start(port, None);
    match server.resume() {
        Err(Error::PortTaken { port: taken }) => assert_eq!(taken, port),
        other => panic!("resumed on another process's port: {other:?}"),
    }
    assert_eq!(server.pid(), None);
    drop(foreign);
}

#[test]
fn a_node_does_not_resume_on_a_port_another_process_took() {
    let group = SentinelGroup::start().unwrap();
    let replica = group
        .data_nodes()
        .iter()
        .find(|n| n.port() != group.primary_port().unwrap())
        .unwrap();
    replica.kill();
    // With a password of its own: it answers our PING with NOAUTH.
    let foreign = Foreign::start(replica.port(), Some("not-ours"));
    match replica.resume() {
        Err(Error::PortTaken { port }) => assert_eq!(port, replica.port()),
        other => panic!("resumed on another process's port: {other:?}"),
    }
    assert!(!replica.is_running());
    drop(foreign);
}
