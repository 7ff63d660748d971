//! The fenced resource: an in-memory stand-in for the Redis server that
//! [`tenure::FencedKey`] talks to.
//!
//! [`FencedKey::set`](tenure::FencedKey::set) is the real client code: it
//! invokes its script (`EVALSHA`) on any `redis` connection and parses the
//! reply. [`Resource`] is such a connection; it answers the script's call
//! the way `fenced_set.lua` does (write if the token is not older than the
//! highest accepted, else `{0, highest}`), so the harness can check what the
//! resource accepted without a Redis server. It is a model of the Lua
//! script, not the script itself: the Redis tests cover the script.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use tenure::redis::aio::ConnectionLike;
use tenure::redis::{Arg, Cmd, ErrorKind, Pipeline, RedisError, RedisFuture, Value};

/// Each fenced key's highest accepted token and its value, by key.
type Keys = BTreeMap<Vec<u8>, (u64, Vec<u8>)>;

/// Fenced keys by name: the highest token accepted and its value.
#[derive(Clone, Default, Debug)]
pub struct Resource {
    keys: Arc<Mutex<Keys>>,
}

impl Resource {
    fn eval(&self, cmd: &Cmd) -> Result<Value, RedisError> {
        let args: Vec<&[u8]> = cmd
            .args_iter()
            .filter_map(|arg| match arg {
                Arg::Simple(bytes) => Some(bytes),
                _ => None,
            })
            .collect();
        let malformed = || {
            RedisError::from((
                ErrorKind::Client,
                "the simulated resource only runs the fenced-set script",
            ))
        };
        // EVALSHA sha 1 key token value
        let [command, _sha, _one, key, token, value] = args.as_slice() else {
            return Err(malformed());
        };
        if !command.eq_ignore_ascii_case(b"EVALSHA") {
            return Err(malformed());
        }
        let token: u64 = std::str::from_utf8(token)
            .ok()
            .and_then(|t| t.parse().ok())
            .ok_or_else(malformed)?;
        let mut keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        let highest = keys.get(*key).map_or(0, |(highest, _)| *highest);
        if token < highest {
            return Ok(Value::Array(vec![
                Value::Int(0),
                Value::Int(highest as i64),
            ]));
        }
        keys.insert(key.to_vec(), (token, value.to_vec()));
        Ok(Value::Array(vec![Value::Int(1)]))
    }
}

impl ConnectionLike for Resource {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        let reply = self.eval(cmd);
        Box::pin(async move { reply })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        _pipeline: &'a Pipeline,
        _offset: usize,
        _count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async {
            Err(RedisError::from((
                ErrorKind::Client,
                "the simulated resource takes no pipelines",
            )))
        })
    }

    fn get_db(&self) -> i64 {
        0
    }
}
