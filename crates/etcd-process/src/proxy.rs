//! A TCP proxy that injects network faults between a client and a server.
//!
//! Killing or pausing a member tests what a client does when etcd fails;
//! what it does when the network between them fails is a different
//! question, with different symptoms: a cut shows up at once as closed
//! connections, a black hole only as silence until some timeout fires. A
//! client pointed at a [`Proxy`] instead of at etcd gets both on demand,
//! without root, `iptables` or network namespaces. Plain threads do the
//! forwarding, so it works from synchronous tests and needs no runtime.
//!
//! ```no_run
//! let cluster = etcd_process::EtcdCluster::start()?;
//! let proxy = etcd_process::Proxy::start(cluster.client_port(0))?;
//! // Point the client at 127.0.0.1:{proxy.port()}, then:
//! proxy.blackhole(); // connections stay open, nothing gets through
//! proxy.cut(); // every connection is closed, new ones are dropped
//! proxy.heal(); // new connections work again
//! let other = etcd_process::EtcdCluster::start()?;
//! proxy.retarget(other.client_port(0)); // the address now reaches another server
//! # Ok::<(), etcd_process::Error>(())
//! ```

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::{io_err, Error};

/// How long the proxy waits to reach its upstream for a new connection; a
/// connection that cannot be made is closed on the client.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// What the proxy does with traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Forward both ways.
    Forward,
    /// Keep connections open, forward nothing (data waits in the proxy and
    /// in the kernel's buffers, and is delivered after a heal, as TCP
    /// retransmits across a partition that heals).
    Blackhole,
    /// Accept and close new connections at once; established ones were
    /// closed when the cut began.
    Cut,
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

    fn set_mode(&self, mode: Mode) {
        self.control().mode = mode;
        self.changed.notify_all();
    }

    /// Block while the proxy is a black hole; `true` once it forwards,
    /// `false` when it is cut or dropped.
    fn wait_forwarding(&self) -> bool {
        let mut control = self.control();
        loop {
            if control.stopped {
                return false;
            }
            match control.mode {
                Mode::Forward => return true,
                Mode::Cut => return false,
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
    /// when the proxy is cut or dropped, or (for a socket to `upstream`)
    /// retargeted, so that no connection escapes a cut or a retarget that
    /// began while it was being set up.
    fn register(&self, id: u64, socket: &TcpStream, upstream: Option<u16>) -> bool {
        let mut connections = self.connections();
        let open = {
            let control = self.control();
            !control.stopped
                && control.mode != Mode::Cut
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
/// [`Proxy::cut`] closes every connection and closes new ones as soon as
/// they are accepted; [`Proxy::blackhole`] keeps connections open (and
/// accepts new ones) but forwards nothing in either direction;
/// [`Proxy::heal`] forwards again. [`Proxy::retarget`] sends new
/// connections to another port and closes the established ones. Dropping
/// the proxy closes its listener and every connection.
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
    pub fn start(upstream_port: u16) -> Result<Proxy, Error> {
        let listener =
            TcpListener::bind(("127.0.0.1", 0)).map_err(io_err("binding the proxy's port"))?;
        let port = listener
            .local_addr()
            .map_err(io_err("binding the proxy's port"))?
            .port();
        let shared = Arc::new(Shared {
            control: Mutex::new(Control {
                mode: Mode::Forward,
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
            .map_err(io_err("starting the proxy's thread"))?;
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

    /// Close every established connection (both sockets shut down, so the
    /// client reads end-of-file) and, until [`Proxy::heal`] or
    /// [`Proxy::blackhole`], close every new connection as soon as it is
    /// accepted.
    pub fn cut(&self) {
        self.shared.set_mode(Mode::Cut);
        self.shared.close_all();
    }

    /// Forward nothing, in either direction, on established or new
    /// connections, while keeping them open: the client's writes succeed
    /// (until buffers fill) and its reads wait. What was sent meanwhile is
    /// delivered after [`Proxy::heal`].
    pub fn blackhole(&self) {
        self.shared.set_mode(Mode::Blackhole);
    }

    /// Forward again: after a cut, new connections get through; after a
    /// black hole, held connections resume where they stopped.
    pub fn heal(&self) {
        self.shared.set_mode(Mode::Forward);
    }

    /// Forward new connections to `upstream_port` instead, and close every
    /// established one (as [`Proxy::cut`] does, without refusing new ones),
    /// so that clients connect again and reach the new upstream: an address
    /// that another server takes over (a member replaced, an address
    /// reused). The mode (forwarding, black hole, cut) is unchanged.
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
        if mode == Mode::Cut {
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
    if !shared.wait_forwarding() {
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

/// Copy `from` to `to` while the proxy forwards. At end-of-file the write
/// side of `to` is shut down (a half-close passed on); on an error or a cut
/// both sockets are shut down, which ends the other direction too.
fn pump(mut from: TcpStream, mut to: TcpStream, shared: &Shared) {
    let mut buf = [0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => {
                let _ = to.shutdown(Shutdown::Write);
                return;
            }
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        if !shared.wait_forwarding() || to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}
