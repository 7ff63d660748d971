//! A routed connection to a Redis store, for the application's own
//! commands: what [`crate::FencedKey`] writes through, and what `tenure
//! status` lists elections with.
//!
//! It is opened the way elections open theirs (same URL forms, TLS, error
//! handling and topology following), so a fenced write on a Sentinel group
//! or a Cluster goes where the election's own scripts go.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{Cmd, ErrorKind, Pipeline, RedisError, RedisFuture, Value};

use super::keys::Keys;
use super::target::{classify, is_read_only, RedisTarget};
use super::topology::{reply_addr, slot_of, Following, Node, Topology};
use crate::Result;

/// A connection to a Redis store opened the way elections open theirs
/// (see [`connect`]): a single server, the primary Redis Sentinel names,
/// or a Redis Cluster, every call bounded by a timeout and a new
/// connection after one drops. Use it with the re-exported
/// [`redis`](crate::redis) crate's commands; it is cheap to clone (clones
/// share the connections).
///
/// Each command goes to the node that serves its first key (for
/// `EVAL`/`EVALSHA`, `KEYS[1]`; a pipeline goes where its first keyed
/// command goes); a command without keys goes to the primary (on a
/// cluster, to any primary), except `SCRIPT LOAD`, which goes to every
/// primary (a script runs where its keys are). On a cluster a `MOVED` or
/// `ASK` reply is followed once. `SCAN` sees one node only:
/// [`crate::Store::elections`] scans every primary.
///
/// ```no_run
/// # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// let mut conn = tenure::fence::connect("redis://127.0.0.1:6379", None, Duration::from_secs(2)).await?;
/// let pong: String = tenure::redis::cmd("PING").query_async(&mut conn).await?;
/// assert_eq!(pong, "PONG");
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Connection {
    topology: Arc<Topology>,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("url", &self.topology.target().redacted())
            .finish_non_exhaustive()
    }
}

impl Connection {
    /// A connection on a store's topology (shared with its elections).
    pub(crate) fn on(topology: Arc<Topology>) -> Connection {
        Connection { topology }
    }
}

/// Commands without a key: they go to the primary (any primary of a
/// cluster).
const KEYLESS: &[&str] = &[
    "PING",
    "TIME",
    "INFO",
    "SCAN",
    "ROLE",
    "CLUSTER",
    "SCRIPT",
    "CLIENT",
    "CONFIG",
    "DBSIZE",
    "ECHO",
    "COMMAND",
    "LASTSAVE",
    "MEMORY",
    "SLOWLOG",
    "LATENCY",
    "ACL",
    "FUNCTION",
    "PUBLISH",
    "PUBSUB",
    "RANDOMKEY",
    "WAIT",
];

/// Whether `cmd` is `SCRIPT LOAD`.
fn is_script_load(cmd: &Cmd) -> bool {
    let mut args = cmd.args_iter().filter_map(|arg| match arg {
        redis::Arg::Simple(bytes) => Some(bytes),
        _ => None,
    });
    args.next()
        .is_some_and(|a| a.eq_ignore_ascii_case(b"SCRIPT"))
        && args.next().is_some_and(|a| a.eq_ignore_ascii_case(b"LOAD"))
}

/// The slot of a command's first key, if it has one.
fn command_slot(cmd: &Cmd) -> Option<u16> {
    let args: Vec<&[u8]> = cmd
        .args_iter()
        .filter_map(|arg| match arg {
            redis::Arg::Simple(bytes) => Some(bytes),
            _ => None,
        })
        .collect();
    let name = String::from_utf8_lossy(args.first()?).to_ascii_uppercase();
    if KEYLESS.contains(&name.as_str()) {
        return None;
    }
    let key = match name.as_str() {
        "EVAL" | "EVALSHA" | "EVAL_RO" | "EVALSHA_RO" | "FCALL" | "FCALL_RO" => {
            let count: u64 = std::str::from_utf8(args.get(2)?).ok()?.parse().ok()?;
            if count == 0 {
                return None;
            }
            args.get(3)?
        }
        _ => args.get(1)?,
    };
    Some(slot_of(&String::from_utf8_lossy(key)))
}

impl Connection {
    /// The node for a command routed by `slot`.
    async fn node(&self, slot: Option<u16>) -> redis::RedisResult<Arc<Node>> {
        let found = match slot {
            Some(slot) => self.topology.node_for(slot).await,
            None => self.topology.primary().await,
        };
        found.map_err(|err| RedisError::from((ErrorKind::Io, "no node", err.to_string())))
    }

    /// After an error from `node`: forget what it says is out of date.
    fn after_error(&self, node: &Node, err: &RedisError) {
        // Also READONLY inside a tenure script (a fenced write).
        let read_only = is_read_only(err);
        if read_only || err.is_io_error() || err.is_timeout() || err.is_connection_dropped() {
            self.topology.failed(node);
        }
    }

    async fn command(&self, cmd: &Cmd) -> redis::RedisResult<Value> {
        if is_script_load(cmd) {
            return self.on_every_primary(cmd).await;
        }
        let node = self.node(command_slot(cmd)).await?;
        let result = node.conn().req_packed_command(cmd).await;
        let err = match result {
            Ok(value) => return Ok(value),
            Err(err) => err,
        };
        self.after_error(&node, &err);
        let Some((addr, slot)) = err.redirect_node() else {
            return Err(err);
        };
        let asking = err.kind() == ErrorKind::Server(redis::ServerErrorKind::Ask);
        let addr = reply_addr(addr, &node.addr);
        let target = if asking {
            self.topology.node_at(&addr)
        } else {
            self.topology.moved(slot, &addr)
        }
        .map_err(|e| RedisError::from((ErrorKind::Io, "redirect", e.to_string())))?;
        if asking {
            let mut pipe = redis::pipe();
            pipe.cmd("ASKING").ignore().add_command(cmd.clone());
            let mut values: Vec<Value> = pipe.query_async(&mut target.conn()).await?;
            return values
                .pop()
                .ok_or_else(|| RedisError::from((ErrorKind::Io, "no reply after ASKING")));
        }
        target.conn().req_packed_command(cmd).await
    }

    /// A script must be loaded on the node that will run it, which on a
    /// cluster is the one its keys live on: load it on every primary.
    async fn on_every_primary(&self, cmd: &Cmd) -> redis::RedisResult<Value> {
        let primaries = self
            .topology
            .primaries()
            .await
            .map_err(|e| RedisError::from((ErrorKind::Io, "no node", e.to_string())))?;
        let mut last = Err(RedisError::from((ErrorKind::Io, "no primary")));
        for node in primaries {
            last = node.conn().req_packed_command(cmd).await;
            if let Err(err) = &last {
                self.after_error(&node, err);
                return last;
            }
        }
        last
    }

    async fn commands(
        &self,
        pipeline: &Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisResult<Vec<Value>> {
        let slot = pipeline.cmd_iter().find_map(command_slot);
        let node = self.node(slot).await?;
        let result = node
            .conn()
            .req_packed_commands(pipeline, offset, count)
            .await;
        if let Err(err) = &result {
            self.after_error(&node, err);
        }
        result
    }
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(self.command(cmd))
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(self.commands(pipeline, offset, count))
    }

    fn get_db(&self) -> i64 {
        0
    }
}

/// Connect to a Redis store the way elections do: a `redis://`/`rediss://`
/// URL for one server, `redis+sentinel://`/`rediss+sentinel://` for
/// Sentinel, `redis+cluster://`/`rediss+cluster://` for a Cluster, an
/// optional CA file, every call bounded by `call_timeout`. Checked: the
/// server answers a PING, the sentinels name a primary that says it is
/// one, or a cluster node answers `CLUSTER SLOTS`.
///
/// ```no_run
/// # #[tokio::main] async fn main() -> tenure::Result<()> {
/// use std::time::Duration;
/// let mut conn = tenure::fence::connect("redis://127.0.0.1:6379", None, Duration::from_secs(2)).await?;
/// let marker = tenure::FencedKey::new("reports:{daily}:marker");
/// marker.set(&mut conn, 7, "done").await?;
/// # Ok(()) }
/// ```
pub async fn connect(
    url: &str,
    tls_ca: Option<&Path>,
    call_timeout: Duration,
) -> Result<Connection> {
    let target = RedisTarget {
        url: url.to_string(),
        tls_ca: tls_ca.map(Path::to_path_buf),
    };
    Ok(Connection {
        topology: Topology::connect(target, call_timeout, Following::Every).await?,
    })
}

/// Every primary (`host:port`; the single server, the sentinels' primary,
/// or each cluster node that serves a slot) with the names of the
/// elections it holds under `prefix`, sorted, or why they could not be read.
/// The primaries are scanned at once, so a silent node costs one call
/// timeout and hides nothing of the others.
///
pub(crate) async fn list_elections_by_node(
    conn: &Connection,
    prefix: &str,
) -> Result<Vec<(String, Result<Vec<String>>)>> {
    let scans = conn
        .topology
        .primaries()
        .await?
        .into_iter()
        .map(|node| async move {
            let names = scan_node(conn, &node, prefix).await;
            (node.addr.clone(), names)
        });
    Ok(futures_util::future::join_all(scans).await)
}

/// The elections under `prefix` on one node, sorted.
async fn scan_node(conn: &Connection, node: &Arc<Node>, prefix: &str) -> Result<Vec<String>> {
    let pattern = Keys::lease_pattern(prefix);
    let url = conn.topology.target().redacted();
    let mut node_conn = node.conn();
    let mut names = Vec::new();
    let mut cursor: u64 = 0;
    loop {
        let scanned: redis::RedisResult<(u64, Vec<String>)> = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(500)
            .query_async(&mut node_conn)
            .await;
        let (next, batch) = scanned.map_err(|e| {
            conn.after_error(node, &e);
            classify(e, &url)
        })?;
        names.extend(
            batch
                .iter()
                .filter_map(|key| Keys::name_of_lease(prefix, key)),
        );
        if next == 0 {
            break;
        }
        cursor = next;
    }
    names.sort();
    names.dedup();
    Ok(names)
}
