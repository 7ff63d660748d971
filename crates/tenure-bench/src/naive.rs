//! The naive baseline: the design of the seed documents, done as well as
//! that design allows. Acquire is `SET key id NX PX ttl`; renew and release
//! are owner-checked scripts; followers poll every ttl/3; there is no
//! release notification and no local deadline; each election has its own
//! task and one command per tick.

use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::Script;

const RENEW: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end return 0";
const RELEASE: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";

#[derive(Clone)]
pub struct NaiveElection {
    conn: MultiplexedConnection,
    key: String,
    id: String,
    ttl: Duration,
    renew: Script,
    release: Script,
}

impl NaiveElection {
    pub fn new(conn: MultiplexedConnection, name: &str, id: &str, ttl: Duration) -> Self {
        NaiveElection {
            conn,
            key: format!("naive:{name}"),
            id: id.to_string(),
            ttl,
            renew: Script::new(RENEW),
            release: Script::new(RELEASE),
        }
    }

    pub fn key(&self) -> &str {
        &self.key
    }

    pub async fn acquire(&self) -> redis::RedisResult<bool> {
        let set: Option<String> = redis::cmd("SET")
            .arg(&self.key)
            .arg(&self.id)
            .arg("NX")
            .arg("PX")
            .arg(self.ttl.as_millis() as u64)
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(set.is_some())
    }

    pub async fn renew(&self) -> redis::RedisResult<bool> {
        let renewed: i64 = self
            .renew
            .key(&self.key)
            .arg(&self.id)
            .arg(self.ttl.as_millis() as u64)
            .invoke_async(&mut self.conn.clone())
            .await?;
        Ok(renewed == 1)
    }

    pub async fn release(&self) -> redis::RedisResult<bool> {
        let released: i64 = self
            .release
            .key(&self.key)
            .arg(&self.id)
            .invoke_async(&mut self.conn.clone())
            .await?;
        Ok(released == 1)
    }

    pub async fn leader(&self) -> redis::RedisResult<Option<String>> {
        redis::cmd("GET")
            .arg(&self.key)
            .query_async(&mut self.conn.clone())
            .await
    }

    /// Poll every ttl/3 until acquired.
    pub async fn campaign(&self) -> redis::RedisResult<()> {
        loop {
            if self.acquire().await? {
                return Ok(());
            }
            tokio::time::sleep(self.ttl / 3).await;
        }
    }

    /// Renew every ttl/3 forever (the seed's heartbeat thread).
    pub async fn keep(&self) {
        loop {
            tokio::time::sleep(self.ttl / 3).await;
            if !matches!(self.renew().await, Ok(true)) {
                return;
            }
        }
    }
}
