//! A fault-injecting TCP proxy between one instance and Redis.
//!
//! Each instance reaches the election's Redis only through its own proxy,
//! so the harness can cut one instance off while the others carry on:
//! - `Pass`: bytes flow;
//! - `Blackhole`: connections stay open but nothing is forwarded (a
//!   partition that TCP does not notice; calls time out);
//! - `Drop`: every connection is closed and new ones are closed at once
//!   (a partition that TCP does notice);
//! - `Delay(d)`: every chunk waits `d` before it is forwarded.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Pass,
    Blackhole,
    Drop,
    Delay(Duration),
}

/// A running proxy; dropping it stops accepting (open connections end with
/// the runtime).
pub struct Proxy {
    pub port: u16,
    mode: watch::Sender<Mode>,
    accept: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// Listen on a free loopback port and forward to `127.0.0.1:upstream`.
    pub async fn start(upstream: u16) -> std::io::Result<Proxy> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let port = listener.local_addr()?.port();
        let (mode, modes) = watch::channel(Mode::Pass);
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let modes = modes.clone();
                tokio::spawn(async move {
                    if *modes.borrow() == Mode::Drop {
                        return;
                    }
                    if let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)).await {
                        relay(client, server, modes).await;
                    }
                });
            }
        });
        Ok(Proxy { port, mode, accept })
    }

    pub fn set(&self, mode: Mode) {
        self.mode.send_replace(mode);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

async fn relay(client: TcpStream, server: TcpStream, modes: watch::Receiver<Mode>) {
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    tokio::select! {
        _ = pump(client_read, server_write, modes.clone()) => {}
        _ = pump(server_read, client_write, modes) => {}
    }
}

/// Copy one direction, obeying the mode for every chunk.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut modes: watch::Receiver<Mode>,
) {
    let mut buffer = vec![0u8; 16 * 1024];
    loop {
        let read = tokio::select! {
            read = from.read(&mut buffer) => read,
            // A switch to Drop closes idle connections too.
            _ = wait_for_drop(&mut modes) => return,
        };
        let n = match read {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        loop {
            let mode = *modes.borrow_and_update();
            match mode {
                Mode::Pass => break,
                Mode::Drop => return,
                Mode::Delay(delay) => {
                    tokio::time::sleep(delay).await;
                    break;
                }
                Mode::Blackhole => {
                    if modes.changed().await.is_err() {
                        return;
                    }
                }
            }
        }
        if to.write_all(&buffer[..n]).await.is_err() {
            return;
        }
    }
}

async fn wait_for_drop(modes: &mut watch::Receiver<Mode>) {
    loop {
        if *modes.borrow_and_update() == Mode::Drop {
            return;
        }
        if modes.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}
