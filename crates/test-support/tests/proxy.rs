//! The fault proxy in front of a small echo server: forwarding, cuts, black
//! holes, delays, healing, retargeting.

use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use tenure_test_support::proxy::{Mode, Proxy};

const DEADLINE: Duration = Duration::from_secs(10);

/// An echo server on a free port: every connection gets back what it sends.
fn echo_server() -> u16 {
    let listener = TcpListener::bind(("127.0.0.1", 0)).unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            std::thread::spawn(move || {
                let mut buf = [0u8; 1024];
                while let Ok(n @ 1..) = stream.read(&mut buf) {
                    if stream.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            });
        }
    });
    port
}

/// A server on a free port that greets every connection with `name` and
/// then closes it.
fn greeter(name: &'static [u8]) -> u16 {
    let listener = TcpListener::bind(("127.0.0.1", 0)).unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let _ = stream.write_all(name);
        }
    });
    port
}

/// What a greeter behind the proxy says to a new connection.
fn greeting(proxy: &Proxy) -> Vec<u8> {
    let mut stream = connect(proxy);
    let mut said = Vec::new();
    stream.read_to_end(&mut said).unwrap();
    said
}

fn connect(proxy: &Proxy) -> TcpStream {
    let stream = TcpStream::connect(("127.0.0.1", proxy.port())).unwrap();
    stream.set_read_timeout(Some(DEADLINE)).unwrap();
    stream
}

fn round_trip(stream: &mut TcpStream, message: &[u8]) {
    stream.write_all(message).unwrap();
    let mut reply = vec![0u8; message.len()];
    stream.read_exact(&mut reply).unwrap();
    assert_eq!(reply, message);
}

/// Whether the connection is closed: a read ends with end-of-file or an
/// error (a reset) rather than data or the deadline.
fn is_closed(stream: &mut TcpStream) -> bool {
    let mut buf = [0u8; 16];
    match stream.read(&mut buf) {
        Ok(0) => true,
        Ok(n) => panic!("read {n} bytes from a connection that should be closed"),
        Err(e) => {
            assert!(
                !matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut),
                "the connection stayed open for {DEADLINE:?}"
            );
            true
        }
    }
}

fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let started = Instant::now();
    while !check() {
        assert!(
            started.elapsed() < DEADLINE,
            "timed out waiting until {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn cut_closes_connections_until_healed() {
    let upstream = echo_server();
    let proxy = Proxy::start(upstream).unwrap();
    assert_eq!(proxy.upstream_port(), upstream);
    let mut first = connect(&proxy);
    let mut second = connect(&proxy);
    round_trip(&mut first, b"hello");
    round_trip(&mut second, b"world");
    assert_eq!(proxy.connections(), 2);

    proxy.cut();
    assert!(is_closed(&mut first));
    assert!(is_closed(&mut second));
    eventually("the proxy has let go of both connections", || {
        proxy.connections() == 0
    });
    // New connections are accepted, then closed at once.
    let mut refused = connect(&proxy);
    assert!(is_closed(&mut refused));

    proxy.heal();
    let mut third = connect(&proxy);
    round_trip(&mut third, b"again");
}

#[test]
fn blackhole_holds_traffic_until_healed() {
    let proxy = Proxy::start(echo_server()).unwrap();
    let mut stream = connect(&proxy);
    round_trip(&mut stream, b"before");

    proxy.blackhole();
    let mut late = connect(&proxy);
    stream.write_all(b"during").unwrap();
    late.write_all(b"late").unwrap();
    // Nothing comes back while the hole lasts (the wait is the length of
    // the check, not a guess at how long something takes).
    stream
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let mut buf = [0u8; 16];
    let err = stream.read(&mut buf).unwrap_err();
    assert!(matches!(
        err.kind(),
        ErrorKind::WouldBlock | ErrorKind::TimedOut
    ));
    stream.set_read_timeout(Some(DEADLINE)).unwrap();

    proxy.heal();
    let mut reply = [0u8; 6];
    stream.read_exact(&mut reply).unwrap();
    assert_eq!(&reply, b"during");
    let mut reply = [0u8; 4];
    late.read_exact(&mut reply).unwrap();
    assert_eq!(&reply, b"late");

    // A cut also ends connections held in a black hole.
    proxy.blackhole();
    proxy.cut();
    assert!(is_closed(&mut stream));
    assert!(is_closed(&mut late));
}

#[test]
fn dropping_the_proxy_closes_everything() {
    let proxy = Proxy::start(echo_server()).unwrap();
    let port = proxy.port();
    let mut stream = connect(&proxy);
    round_trip(&mut stream, b"ping");
    drop(proxy);
    assert!(is_closed(&mut stream));
    assert!(TcpStream::connect(("127.0.0.1", port)).is_err());
}

#[test]
fn retarget_sends_new_connections_elsewhere_and_closes_the_old_ones() {
    let (first, second) = (echo_server(), greeter(b"second"));
    let proxy = Proxy::start(first).unwrap();
    let mut before = connect(&proxy);
    round_trip(&mut before, b"first");

    proxy.retarget(second);
    assert_eq!(proxy.upstream_port(), second);
    assert!(is_closed(&mut before));
    assert_eq!(greeting(&proxy), b"second");
    eventually("the proxy has let go of the old connection", || {
        proxy.connections() == 0
    });

    // Faults still apply, to the new upstream.
    proxy.cut();
    let mut refused = connect(&proxy);
    assert!(is_closed(&mut refused));
    proxy.heal();
    proxy.retarget(first);
    let mut after = connect(&proxy);
    round_trip(&mut after, b"back");
}

#[test]
fn a_delay_holds_every_chunk_then_forwards_it() {
    let delay = Duration::from_millis(150);
    let proxy = Proxy::start(echo_server()).unwrap();
    let mut stream = connect(&proxy);
    round_trip(&mut stream, b"fast");

    proxy.set(Mode::Delay(delay));
    let sent = Instant::now();
    round_trip(&mut stream, b"slow");
    // There and back: each direction waits once.
    assert!(sent.elapsed() >= delay * 2, "{:?}", sent.elapsed());
    let mut late = connect(&proxy);
    round_trip(&mut late, b"new");

    proxy.set(Mode::Pass);
    round_trip(&mut stream, b"fast again");
    // A cut ends delayed connections too.
    proxy.set(Mode::Delay(delay));
    proxy.set(Mode::Drop);
    assert!(is_closed(&mut stream));
    assert!(is_closed(&mut late));
}
