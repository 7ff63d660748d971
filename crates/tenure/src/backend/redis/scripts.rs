//! tenure's Lua scripts as Redis runs them, and the readers of their
//! replies, side by side: a script's reply layout and its parser change
//! together. Every script is the shared prelude followed by its own file
//! in `scripts/`.

use std::time::Duration;

use redis::{Script, Value};

use crate::backend::RunRecord;
use crate::machine::{AcquireReply, RenewReply};
use crate::term::Holder;
use crate::{Error, Result};

/// A script as sent to Redis: the shared prelude, then the script itself.
macro_rules! script {
    ($file:literal) => {
        concat!(
            include_str!("scripts/prelude.lua"),
            include_str!(concat!("scripts/", $file))
        )
    };
    // A script built on acquire_one.lua's function.
    (acquiring $file:literal) => {
        concat!(
            include_str!("scripts/prelude.lua"),
            include_str!("scripts/acquire_one.lua"),
            include_str!(concat!("scripts/", $file))
        )
    };
}

pub(crate) static ACQUIRE: &str = script!(acquiring "acquire.lua");
pub(crate) static ACQUIRE_MANY: &str = script!(acquiring "acquire_many.lua");
pub(crate) static RENEW: &str = script!("renew.lua");
pub(crate) static RENEW_MANY: &str = script!("renew_many.lua");
pub(crate) static RESIGN: &str = script!("resign.lua");
pub(crate) static INSPECT: &str = script!("inspect.lua");
pub(crate) static LAST_RUN: &str = script!("last_run.lua");
pub(crate) static RECORD_RUN: &str = script!("record_run.lua");
pub(crate) static MEMBERS: &str = script!("members.lua");
pub(crate) static CHECK: &str = script!("check.lua");

pub(crate) struct Scripts {
    pub acquire: Script,
    pub acquire_many: Script,
    pub renew: Script,
    pub renew_many: Script,
    pub resign: Script,
    pub inspect: Script,
    pub members: Script,
    pub last_run: Script,
    pub record_run: Script,
}

impl Scripts {
    pub fn all(&self) -> [&Script; 9] {
        [
            &self.acquire,
            &self.acquire_many,
            &self.renew,
            &self.renew_many,
            &self.resign,
            &self.inspect,
            &self.members,
            &self.last_run,
            &self.record_run,
        ]
    }
}

/// Reads script replies, naming the server in errors.
pub(crate) struct ReplyReader<'a> {
    pub url: &'a str,
}

impl ReplyReader<'_> {
    pub fn unexpected(&self, what: &str) -> Error {
        Error::redis(format!(
            "unexpected reply from Redis: {what} (is {} a Redis server?)",
            self.url
        ))
    }

    pub fn array(&self, value: Value, min_len: usize) -> Result<Vec<Value>> {
        match value {
            Value::Array(items) if items.len() >= min_len => Ok(items),
            other => Err(self.unexpected(&format!("{other:?}"))),
        }
    }

    pub fn int(&self, value: &Value) -> Result<i64> {
        match value {
            Value::Int(n) => Ok(*n),
            other => Err(self.unexpected(&format!("{other:?} where an integer was expected"))),
        }
    }

    pub fn uint(&self, value: &Value) -> Result<u64> {
        let n = self.int(value)?;
        u64::try_from(n).map_err(|_| self.unexpected(&format!("negative number {n}")))
    }

    pub fn text(&self, value: &Value) -> Result<String> {
        match value {
            Value::BulkString(bytes) => Ok(String::from_utf8_lossy(bytes).into_owned()),
            Value::SimpleString(s) => Ok(s.clone()),
            other => Err(self.unexpected(&format!("{other:?} where a string was expected"))),
        }
    }
}

/// Parse the reply of `acquire.lua`.
pub(crate) fn parse_acquire(reply: Value, url: &str) -> Result<AcquireReply> {
    let r = ReplyReader { url };
    let items = r.array(reply, 7)?;
    let won = r.int(&items[0])?;
    let holder = Holder {
        token: r.uint(&items[1])?,
        id: r.text(&items[2])?,
        ttl_left: Duration::from_millis(r.uint(&items[3])?),
        since_ms: r.uint(&items[4])?,
        attempt: r.text(&items[5])?,
        ttl: Duration::from_millis(r.uint(&items[6])?),
    };
    Ok(match won {
        1 => AcquireReply::Won {
            token: holder.token,
        },
        2 => AcquireReply::HoldOff {
            wait: holder.ttl_left,
        },
        _ => AcquireReply::Held(holder),
    })
}

/// Parse the reply of `renew.lua`.
pub(crate) fn parse_renew(reply: Value, url: &str) -> Result<RenewReply> {
    let r = ReplyReader { url };
    let items = r.array(reply, 1)?;
    if r.int(&items[0])? == 1 {
        return Ok(RenewReply::Renewed);
    }
    if items.len() < 4 {
        return Ok(RenewReply::NotOwner(None));
    }
    Ok(RenewReply::NotOwner(Some(Holder {
        id: r.text(&items[1])?,
        token: r.uint(&items[2])?,
        ttl_left: Duration::from_millis(r.uint(&items[3])?),
        since_ms: 0,
        attempt: String::new(),
        ttl: Duration::ZERO,
    })))
}

/// Parse the reply of `renew_many.lua`: one result per term, in order; an
/// entry about foreign data becomes that term's [`Error::ForeignData`].
pub(crate) fn parse_renew_many(
    reply: Value,
    terms: usize,
    url: &str,
) -> Result<Vec<Result<RenewReply>>> {
    let r = ReplyReader { url };
    let items = r.array(reply, terms)?;
    if items.len() != terms {
        return Err(r.unexpected(&format!("{} results for {terms} renewals", items.len())));
    }
    items
        .into_iter()
        .map(|item| {
            let entry = match &item {
                Value::Int(1) => return Ok(Ok(RenewReply::Renewed)),
                Value::Int(0) => return Ok(Ok(RenewReply::NotOwner(None))),
                Value::Array(entry) => entry,
                other => {
                    return Err(r.unexpected(&format!("{other:?} where a renewal was expected")))
                }
            };
            match entry.first().map(|code| r.int(code)).transpose()? {
                Some(-1) => {
                    let text = |i: usize| entry.get(i).map(|v| r.text(v)).transpose();
                    Ok(Err(Error::ForeignData {
                        key: text(1)?.unwrap_or_default(),
                        detail: text(2)?.unwrap_or_default(),
                    }))
                }
                // An entry that cannot be read fails its own term only.
                _ => Ok(parse_renew(item, url)),
            }
        })
        .collect()
}

/// Parse the reply of `members.lua`: the live members and the number of
/// phantom entries.
pub(crate) fn parse_members(reply: Value, url: &str) -> Result<(Vec<String>, u64)> {
    let r = ReplyReader { url };
    let mut items = r.array(reply, 2)?;
    let phantoms = r.uint(&items[1])?;
    let members = match items.swap_remove(0) {
        Value::Array(members) => members
            .iter()
            .map(|member| r.text(member))
            .collect::<Result<Vec<_>>>()?,
        other => return Err(r.unexpected(&format!("{other:?} where the members were expected"))),
    };
    Ok((members, phantoms))
}

/// Parse the reply of `last_run.lua`: the age of the last run, if any.
pub(crate) fn parse_last_run(reply: Value, url: &str) -> Result<Option<RunRecord>> {
    let r = ReplyReader { url };
    let items = r.array(reply, 0)?;
    let Some(age) = items.first() else {
        return Ok(None);
    };
    let slot = match items.get(2) {
        Some(Value::Int(-1)) | None => None,
        Some(slot) => Some(r.uint(slot)?),
    };
    Ok(Some(RunRecord {
        age: Duration::from_millis(r.uint(age)?),
        slot,
    }))
}

/// Parse the reply of `inspect.lua`.
pub(crate) fn parse_inspect(reply: Value, url: &str) -> Result<Option<Holder>> {
    let r = ReplyReader { url };
    let items = r.array(reply, 0)?;
    if items.is_empty() {
        return Ok(None);
    }
    if items.len() < 6 {
        return Err(r.unexpected("an inspect reply with fewer than 6 items"));
    }
    Ok(Some(Holder {
        id: r.text(&items[0])?,
        token: r.uint(&items[1])?,
        ttl_left: Duration::from_millis(r.uint(&items[2])?),
        since_ms: r.uint(&items[3])?,
        attempt: r.text(&items[4])?,
        ttl: Duration::from_millis(r.uint(&items[5])?),
    }))
}
