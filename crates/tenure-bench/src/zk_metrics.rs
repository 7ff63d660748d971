//! Requests counted where they arrive, on ZooKeeper: the library counts the
//! requests of a partition set but not of one election, and a ZooKeeper
//! client sends pings of its own that no library counter sees. Two
//! four-letter words, asked of every member over plain TCP on its client
//! port:
//!
//! - `mntr`'s `zk_packets_received`: every packet the member received from
//!   its clients (requests, pings, connection requests), summed over the
//!   members. The figure the section reports. A four-letter word counts as
//!   one packet too: between two readings each member has counted the
//!   earlier reading's `cons` and the later one's `mntr`, two packets that
//!   [`Snapshot::since`] takes off (the section checks this with a window
//!   in which nothing else is connected: it counts 0).
//! - `cons`: each connection's session id, packets received (`recved`) and
//!   last client xid (`lcxid`). Every request carries the next xid of its
//!   session, while pings and the other session packets carry fixed
//!   negative ones that the member does not record, so a session's
//!   `lcxid` advances by its requests and its `recved` by requests and
//!   pings: the split of the packets between the two, and the number of
//!   sessions.
//!
//! A leaf: the ZooKeeper section and the scale child both count with it.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

type Result<T> = std::result::Result<T, String>;

/// The members' `HOST:PORT`s of a `zk://` URL, `None` for any other store.
pub(crate) fn members_of(url: &str) -> Option<Vec<String>> {
    let rest = url.strip_prefix("zk://")?;
    let rest = rest.rsplit_once('@').map_or(rest, |(_, hosts)| hosts);
    let hosts = rest.split_once('/').map_or(rest, |(hosts, _)| hosts);
    Some(hosts.split(',').map(str::to_string).collect())
}

/// One session's connection, as `cons` shows it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Connection {
    /// Packets received on it.
    recved: f64,
    /// The last client xid it answered (0 before the first request).
    lcxid: f64,
}

/// What the members had counted at one instant.
#[derive(Debug, Default, Clone)]
pub(crate) struct Snapshot {
    /// The members asked.
    members: usize,
    /// `zk_packets_received`, summed over the members.
    packets: f64,
    /// The sessions connected to any member, by session id.
    sessions: BTreeMap<String, Connection>,
}

/// What the members received during a window (or per interval of it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Counts {
    /// Packets received (`zk_packets_received`, summed): what is reported.
    pub packets: f64,
    /// Of the sessions connected at the window's end: their requests...
    pub requests: f64,
    /// ...and their pings (and other session packets).
    pub pings: f64,
    /// Sessions connected at the window's end, over all members.
    pub sessions: usize,
}

impl Counts {
    pub(crate) fn scaled(&self, by: f64) -> Counts {
        Counts {
            packets: self.packets * by,
            requests: self.requests * by,
            pings: self.pings * by,
            sessions: self.sessions,
        }
    }

    /// `minus` what a window of the same length counted with nothing of
    /// tenure's running (its sessions stay those of `self`).
    pub(crate) fn minus(&self, baseline: &Counts) -> Counts {
        Counts {
            packets: self.packets - baseline.packets,
            requests: self.requests - baseline.requests,
            pings: self.pings - baseline.pings,
            sessions: self.sessions,
        }
    }

    /// `5.33 packets (1.00 requests, 4.33 pings)`.
    pub(crate) fn describe(&self) -> String {
        format!(
            "{:.2} packets ({:.2} requests, {:.2} pings and other session packets, by `cons`)",
            self.packets, self.requests, self.pings
        )
    }
}

impl Snapshot {
    /// Ask every member of `members` (`HOST:PORT`s) for `mntr` and `cons`.
    pub(crate) async fn read(members: &[String]) -> Result<Snapshot> {
        let members = members.to_vec();
        tokio::task::spawn_blocking(move || {
            let mut snapshot = Snapshot {
                members: members.len(),
                ..Snapshot::default()
            };
            for member in &members {
                snapshot.packets += packets_received(&four_letter(member, "mntr")?)
                    .ok_or_else(|| format!("{member}: no zk_packets_received in mntr"))?;
                snapshot
                    .sessions
                    .extend(connections(&four_letter(member, "cons")?));
            }
            Ok(snapshot)
        })
        .await
        .map_err(|e| e.to_string())?
    }

    /// What was received since `earlier`, less the four-letter words of the
    /// two readings (see the module doc). A session new since then counts
    /// from zero; one gone since is in `packets` only.
    pub(crate) fn since(&self, earlier: &Snapshot) -> Counts {
        let (mut requests, mut received) = (0.0, 0.0);
        for (sid, now) in &self.sessions {
            let before = earlier.sessions.get(sid).copied().unwrap_or_default();
            requests += now.lcxid - before.lcxid;
            received += now.recved - before.recved;
        }
        Counts {
            packets: self.packets - earlier.packets - 2.0 * self.members as f64,
            requests,
            pings: received - requests,
            sessions: self.sessions.len(),
        }
    }
}

/// `zk_packets_received` of an `mntr` answer.
fn packets_received(mntr: &str) -> Option<f64> {
    mntr.lines()
        .find_map(|l| l.strip_prefix("zk_packets_received"))
        .and_then(|v| v.trim().parse().ok())
}

/// The sessions of a `cons` answer: lines such as
/// ` /127.0.0.1:5[1](queued=0,recved=7,sent=7,sid=0x1000,lop=PING,...,lcxid=0x3,...)`;
/// connections without a session (the four-letter word's own) are left out.
fn connections(cons: &str) -> BTreeMap<String, Connection> {
    let mut sessions = BTreeMap::new();
    for line in cons.lines() {
        let Some((_, fields)) = line.split_once('(') else {
            continue;
        };
        let field = |name: &str| {
            fields
                .trim()
                .trim_end_matches(')')
                .split(',')
                .find_map(|f| f.strip_prefix(name)?.strip_prefix('='))
        };
        let (Some(sid), Some(recved)) = (field("sid"), field("recved")) else {
            continue;
        };
        // A session's lcxid is -1 (0xffffffffffffffff) until its first request.
        let lcxid = field("lcxid")
            .and_then(|x| u64::from_str_radix(x.trim_start_matches("0x"), 16).ok())
            .map_or(0.0, |x| (x as i64).max(0) as f64);
        if sid == "0x0" {
            continue;
        }
        if let Ok(recved) = recved.parse() {
            sessions.insert(sid.to_string(), Connection { recved, lcxid });
        }
    }
    sessions
}

/// A four-letter word's answer from the member at `host_port`.
fn four_letter(host_port: &str, word: &str) -> Result<String> {
    use std::io::{Read, Write};
    let mut stream =
        std::net::TcpStream::connect(host_port).map_err(|e| format!("{host_port}: {e}"))?;
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| e.to_string())?;
    stream
        .write_all(word.as_bytes())
        .map_err(|e| format!("{host_port}: {e}"))?;
    let mut answer = String::new();
    stream
        .read_to_string(&mut answer)
        .map_err(|e| format!("{host_port} {word}: {e}"))?;
    Ok(answer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cons_splits_each_sessions_packets_into_requests_and_pings() {
        let before = Snapshot {
            members: 1,
            packets: 100.0,
            sessions: connections(
                " /127.0.0.1:40000[1](queued=0,recved=10,sent=10,sid=0x100000a,lop=PING,\
                 est=1,to=1000,lcxid=0x4,lzxid=0x1f,lresp=2,llat=0,minlat=0,avglat=0,maxlat=1)\n\
                 /127.0.0.1:40001[0](queued=0,recved=1,sent=0)\n",
            ),
        };
        let after = Snapshot {
            members: 1,
            packets: 132.0,
            sessions: connections(
                " /127.0.0.1:40000[1](queued=0,recved=20,sent=20,sid=0x100000a,lop=MULT,\
                 est=1,to=1000,lcxid=0x7,lzxid=0x2f,lresp=2,llat=0,minlat=0,avglat=0,maxlat=1)\n\
                 /127.0.0.1:40002[1](queued=0,recved=3,sent=3,sid=0x200000b,lop=PING,\
                 est=1,to=1000,lcxid=0xffffffffffffffff,lzxid=0xffffffffffffffff)\n",
            ),
        };
        let counts = after.since(&before);
        assert_eq!(counts.packets, 30.0, "less the two four-letter words");
        assert_eq!(counts.requests, 3.0, "0x4 to 0x7; none yet on the new one");
        assert_eq!(counts.pings, 10.0, "13 received, 3 of them requests");
        assert_eq!(counts.sessions, 2, "the four-letter word's own is left out");
    }

    #[test]
    fn mntr_gives_the_packets_received_and_only_zk_urls_name_members() {
        let mntr = "zk_version\t3.8.0\nzk_packets_received\t1234\nzk_packets_sent\t99\n";
        assert_eq!(packets_received(mntr), Some(1234.0));
        assert_eq!(
            members_of("zk://u:p@127.0.0.1:1,127.0.0.1:2/chroot"),
            Some(vec!["127.0.0.1:1".to_string(), "127.0.0.1:2".to_string()])
        );
        assert_eq!(members_of("zk://h:3"), Some(vec!["h:3".to_string()]));
        assert_eq!(members_of("etcd://h:3"), None);
    }
}
