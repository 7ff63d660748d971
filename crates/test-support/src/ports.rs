//! Free TCP ports of 127.0.0.1.
//!
//! A port is free "a moment ago": the listener that found it is closed
//! before the caller binds it, so another process may take it in between.
//! Private servers bound to such ports never touch the shared default ones
//! (6379, 2379), so several test binaries run side by side on one machine.

use std::io;
use std::net::TcpListener;

/// A TCP port of 127.0.0.1 that was free a moment ago, not one of `avoid`.
pub fn free_port(avoid: &[u16]) -> io::Result<u16> {
    Ok(free_ports(1, avoid)?[0])
}

/// `count` distinct ports of 127.0.0.1 that were free a moment ago, none
/// of them in `avoid` (well-known ports a shared server may be using, such
/// as etcd's 2379 and 2380, in case the system's ephemeral range contains
/// them): every listener is held until all are chosen, so none is handed
/// out twice.
pub fn free_ports(count: usize, avoid: &[u16]) -> io::Result<Vec<u16>> {
    let mut listeners = Vec::with_capacity(count + avoid.len());
    let mut ports = Vec::with_capacity(count);
    while ports.len() < count {
        let listener = TcpListener::bind(("127.0.0.1", 0))?;
        let port = listener.local_addr()?.port();
        if !avoid.contains(&port) {
            ports.push(port);
        }
        // Held even when avoided, so the next bind cannot return it again.
        listeners.push(listener);
    }
    Ok(ports)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_distinct_and_avoid_what_they_are_told_to() {
        let first = free_port(&[]).unwrap();
        let ports = free_ports(8, &[first]).unwrap();
        assert_eq!(ports.len(), 8);
        assert!(!ports.contains(&first), "{first} in {ports:?}");
        let mut unique = ports.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), ports.len(), "{ports:?}");
    }
}
