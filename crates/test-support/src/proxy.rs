//! A TCP proxy that injects network faults between a client and a server.
//!
//! Killing or pausing a server tests what a client does when the server
//! fails; what it does when the network between them fails is a different
//! question, with different symptoms: a cut shows up at once as closed
//! connections, a black hole only as silence until some timeout fires, a
//! slow link as every reply late. A client pointed at a [`Proxy`] instead
//! of at the server gets each on demand, without root, `iptables` or
//! network namespaces. Plain threads do the forwarding, so it works from
//! synchronous tests and needs no runtime (and, under one, takes none of
//! its worker threads).
//!
//! The modes ([`Mode`]):
//! - `Pass`: bytes flow;
//! - `Blackhole`: connections stay open (and new ones are accepted) but
//!   nothing is forwarded, a partition that TCP does not notice: calls time
//!   out, and what was sent meanwhile is delivered after a heal, as TCP
//!   retransmits across a partition that heals;
//! - `Drop`: every connection is closed and new ones are closed at once,
//!   a partition that TCP does notice;
//! - `Delay(d)`: every chunk waits `d` before it is forwarded.
//!
//! [`Proxy::retarget`] sends new connections to another port and closes
//! the established ones: an address that another server takes over.
//!
//! ```no_run
//! # fn main() -> std::io::Result<()> {
//! use tenure_test_support::proxy::{Mode, Proxy};
//! let server = std::net::TcpListener::bind(("127.0.0.1", 0))?;
//! let proxy = Proxy::start(server.local_addr()?.port())?;
//! // Point the client at 127.0.0.1:{proxy.port()}, then:
//! proxy.blackhole(); // connections stay open, nothing gets through
//! proxy.cut(); // every connection is closed, new ones are dropped
//! proxy.heal(); // new connections work again
//! proxy.set(Mode::Delay(std::time::Duration::from_millis(50))); // a slow link
//! let other = std::net::TcpListener::bind(("127.0.0.1", 0))?;
//! proxy.retarget(other.local_addr()?.port()); // the address now reaches another server
//! # Ok(()) }
//! ```

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

/// How long the proxy waits to reach its upstream for a new connection; a
/// connection that cannot be made is closed on the client.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// What the proxy does with traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Forward both ways.
    Pass,
    /// Keep connections open (and accept new ones, without connecting them
    /// upstream yet), forward nothing: data waits in the proxy and in the
    /// kernel's buffers, and is delivered after a heal.
    Blackhole,
    /// Close every established connection (when the mode is set) and every
    /// new one as soon as it is accepted.
    Drop,
    /// Forward both ways, each chunk after this long.
    Delay(Duration),
}

#[derive(Debug)]
struct Control {
    mode: Mode,
    /// The port of 127.0.0.1 that new connections are forwarded to.
    upstream: u16,
    /// The proxy was dropped: every thread winds down.
    stopped: bool,
}

#[derive(Debug)]
struct Shared {
    control: Mutex<Control>,
    /// Signalled whenever `control` changes.
    changed: Condvar,
    /// Clones of the sockets of each open connection (the client's, then
    /// the upstream's once made), so that a cut can shut them down from
    /// outside the threads blocked reading them.
    connections: Mutex<HashMap<u64, Vec<TcpStream>>>,
    next_id: AtomicU64,
}

impl Shared {
    fn control(&self) -> MutexGuard<'_, Control> {
        self.control.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn connections(&self) -> MutexGuard<'_, HashMap<u64, Vec<TcpStream>>> {
        self.connections
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Block while the proxy is a black hole; once it forwards, how long
    /// each chunk waits first (zero unless delayed); `None` when it drops
    /// connections or was dropped.
    fn wait_forwarding(&self) -> Option<Duration> {
        let mut control = self.control();
        loop {
            if control.stopped {
                return None;
            }
            match control.mode {
                Mode::Pass => return Some(Duration::ZERO),
                Mode::Delay(delay) => return Some(delay),
                Mode::Drop => return None,
                Mode::Blackhole => {
                    control = self
                        .changed
                        .wait(control)
                        .unwrap_or_else(PoisonError::into_inner);
                }
            }
        }
    }

    /// Add a socket to connection `id`: `false` (and the socket shut down)
    /// when the proxy drops connections or was dropped, or (for a socket to
    /// `upstream`) was retargeted, so that no connection escapes a cut or a
    /// retarget that began while it was being set up.
    fn register(&self, id: u64, socket: &TcpStream, upstream: Option<u16>) -> bool {
        let mut connections = self.connections();
        let open = {
            let control = self.control();
            !control.stopped
                && control.mode != Mode::Drop
                && upstream.is_none_or(|port| port == control.upstream)
        };
        match socket.try_clone() {
            Ok(clone) if open => {
                connections.entry(id).or_default().push(clone);
                true
            }
            _ => {
                let _ = socket.shutdown(Shutdown::Both);
                false
            }
        }
    }

    /// Shut down both sockets of every open connection.
    fn close_all(&self) {
        for sockets in self.connections().values() {
            for socket in sockets {
                let _ = socket.shutdown(Shutdown::Both);
            }
        }
    }
}

/// A TCP proxy on a free port of 127.0.0.1 that forwards every connection
/// to a port of 127.0.0.1 (the upstream), until told to fail.
///
/// [`Proxy::set`] changes the [`Mode`]; [`Proxy::cut`],
/// [`Proxy::blackhole`] and [`Proxy::heal`] name the common ones.
/// [`Proxy::retarget`] sends new connections to another port and closes
/// the established ones. Dropping the proxy closes its listener and every
/// connection.
#[derive(Debug)]
pub struct Proxy {
    port: u16,
    shared: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
}

impl Proxy {
    /// Listen on a free port of 127.0.0.1 and forward connections to
    /// `upstream_port` on 127.0.0.1, one upstream connection per client
    /// connection.
    pub fn start(upstream_port: u16) -> io::Result<Proxy> {
        let context = |what: &str| {
            let what = what.to_string();
            move |e: io::Error| io::Error::new(e.kind(), format!("{what}: {e}"))
        };
        let listener =
            TcpListener::bind(("127.0.0.1", 0)).map_err(context("binding the proxy's port"))?;
        let port = listener
            .local_addr()
            .map_err(context("binding the proxy's port"))?
            .port();
        let shared = Arc::new(Shared {
            control: Mutex::new(Control {
                mode: Mode::Pass,
                upstream: upstream_port,
                stopped: false,
            }),
            changed: Condvar::new(),
            connections: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
        });
        let accept_shared = Arc::clone(&shared);
        let accept = std::thread::Builder::new()
            .name(format!("proxy-{port}"))
            .spawn(move || accept_loop(listener, accept_shared))
            .map_err(context("starting the proxy's thread"))?;
        Ok(Proxy {
            port,
            shared,
            accept: Some(accept),
        })
    }

    /// The port clients connect to (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The port new connections are forwarded to (127.0.0.1).
    pub fn upstream_port(&self) -> u16 {
        self.shared.control().upstream
    }

    /// How many client connections are open through the proxy now
    /// (including those a cut has shut down but whose threads have not yet
    /// finished).
    pub fn connections(&self) -> usize {
        self.shared.connections().len()
    }

    /// Treat traffic as `mode` says from now on: held connections resume
    /// (or wait, or are closed) where they are.
    pub fn set(&self, mode: Mode) {
        self.shared.control().mode = mode;
        self.shared.changed.notify_all();
        if mode == Mode::Drop {
            self.shared.close_all();
        }
    }

    /// [`Mode::Drop`]: close every established connection (both sockets
    /// shut down, so the client reads end-of-file) and, until the mode
    /// changes, close every new connection as soon as it is accepted.
    pub fn cut(&self) {
        self.set(Mode::Drop);
    }

    /// [`Mode::Blackhole`]: forward nothing, in either direction, on
    /// established or new connections, while keeping them open: the
    /// client's writes succeed (until buffers fill) and its reads wait.
    /// What was sent meanwhile is delivered after [`Proxy::heal`].
    pub fn blackhole(&self) {
        self.set(Mode::Blackhole);
    }

    /// [`Mode::Pass`]: forward again. After a cut, new connections get
    /// through; after a black hole, held connections resume where they
    /// stopped.
    pub fn heal(&self) {
        self.set(Mode::Pass);
    }

    /// Forward new connections to `upstream_port` instead, and close every
    /// established one (as [`Proxy::cut`] does, without refusing new ones),
    /// so that clients connect again and reach the new upstream: an address
    /// that another server takes over (a member replaced, an address
    /// reused). The mode is unchanged.
    pub fn retarget(&self, upstream_port: u16) {
        self.shared.control().upstream = upstream_port;
        self.shared.close_all();
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shared.control().stopped = true;
        self.shared.changed.notify_all();
        self.shared.close_all();
        // Wake the accept thread, blocked in accept(), so it sees the flag.
        let addr = SocketAddr::from(([127, 0, 0, 1], self.port));
        let woke = TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT).is_ok();
        if let Some(accept) = self.accept.take() {
            // If the wake-up connection failed the thread may never return:
            // leave it rather than hang.
            if woke {
                let _ = accept.join();
            }
        }
    }
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    for incoming in listener.incoming() {
        let (stopped, mode) = {
            let control = shared.control();
            (control.stopped, control.mode)
        };
        if stopped {
            return;
        }
        let Ok(client) = incoming else {
            // Out of file descriptors and the like: give the system a moment.
            std::thread::sleep(Duration::from_millis(10));
            continue;
        };
        if mode == Mode::Drop {
            let _ = client.shutdown(Shutdown::Both);
            continue;
        }
        let shared = Arc::clone(&shared);
        // A connection whose thread cannot start is dropped, hence closed.
        let _ = std::thread::Builder::new()
            .name("proxy-connection".into())
            .spawn(move || serve(client, &shared));
    }
}

/// Forward one client connection until either side closes it or the proxy
/// cuts it.
fn serve(client: TcpStream, shared: &Shared) {
    let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
    if shared.register(id, &client, None) {
        forward(&client, id, shared);
    }
    shared.connections().remove(&id);
}

fn forward(client: &TcpStream, id: u64, shared: &Shared) {
    // In a black hole, the connection does not reach the upstream either.
    // (A delay applies to data, not to connecting.)
    if shared.wait_forwarding().is_none() {
        let _ = client.shutdown(Shutdown::Both);
        return;
    }
    let upstream = shared.control().upstream;
    let addr = SocketAddr::from(([127, 0, 0, 1], upstream));
    let Ok(server) = TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT) else {
        let _ = client.shutdown(Shutdown::Both);
        return;
    };
    if !shared.register(id, &server, Some(upstream)) {
        let _ = client.shutdown(Shutdown::Both);
        return;
    }
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (Ok(client_in), Ok(client_out), Ok(server_in)) =
        (client.try_clone(), client.try_clone(), server.try_clone())
    else {
        let _ = client.shutdown(Shutdown::Both);
        let _ = server.shutdown(Shutdown::Both);
        return;
    };
    std::thread::scope(|scope| {
        let back = std::thread::Builder::new()
            .name("proxy-connection".into())
            .spawn_scoped(scope, || pump(server_in, client_out, shared));
        if back.is_ok() {
            pump(client_in, server, shared);
        } else {
            let _ = client.shutdown(Shutdown::Both);
            let _ = server.shutdown(Shutdown::Both);
        }
    });
}

/// Copy `from` to `to` while the proxy forwards, each chunk after the
/// mode's delay. At end-of-file the write side of `to` is shut down (a
/// half-close passed on); on an error or a cut both sockets are shut down,
/// which ends the other direction too.
fn pump(mut from: TcpStream, mut to: TcpStream, shared: &Shared) {
    let mut buf = [0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => {
                let _ = to.shutdown(Shutdown::Write);
                return;
            }
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        let Some(delay) = shared.wait_forwarding() else {
            break;
        };
        if !delay.is_zero() {
            std::thread::sleep(delay);
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}
