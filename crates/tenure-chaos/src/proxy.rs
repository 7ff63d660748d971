//! A fault-injecting TCP proxy between one instance and the election's
//! store: the workspace's one proxy ([`tenure_test_support::proxy`]), as
//! the harness drives it.
//!
//! Each instance reaches the store only through its own proxies, so the
//! harness can cut one instance off while the others carry on:
//! - `Pass`: bytes flow;
//! - `Blackhole`: connections stay open but nothing is forwarded (a
//!   partition that TCP does not notice; calls time out);
//! - `Drop`: every connection is closed and new ones are closed at once
//!   (a partition that TCP does notice);
//! - `Delay(d)`: every chunk waits `d` before it is forwarded.
//!
//! The wrapper only keeps the harness's way of using it (an awaited
//! `start`, the port as a field); the forwarding runs on the proxy's own
//! threads, not on the runtime.

pub use tenure_test_support::proxy::Mode;

/// A running proxy; dropping it closes its listener and every connection.
pub struct Proxy {
    pub port: u16,
    inner: tenure_test_support::proxy::Proxy,
}

impl Proxy {
    /// Listen on a free loopback port and forward to `127.0.0.1:upstream`.
    pub async fn start(upstream: u16) -> std::io::Result<Proxy> {
        let inner = tenure_test_support::proxy::Proxy::start(upstream)?;
        Ok(Proxy {
            port: inner.port(),
            inner,
        })
    }

    pub fn set(&self, mode: Mode) {
        self.inner.set(mode);
    }

    /// Forward to `127.0.0.1:upstream` from now on, closing every
    /// connection (a store's address taken over by another server).
    pub fn retarget(&self, upstream: u16) {
        self.inner.retarget(upstream);
    }
}
