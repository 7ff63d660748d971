//! The values tenure writes on etcd and how they are read back: an
//! election's key (its holder), a witness, a token counter; and the
//! tagged-value check shared with the last-run marker. Apart so that the
//! format is in one place (the book's *Keys* page documents it).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use etcd_client::{KeyValue, TxnOpResponse};

use crate::machine::AcquireRequest;
use crate::term::Holder;
use crate::{Error, Result};

/// The first line of every value tenure writes.
pub(super) const MAGIC: &str = "tenure/1";

/// Whether `kv` is the key created by term `token`, unchanged since, on
/// `lease`.
/// Whether `kv` is the key of the term `token`, unchanged since it was
/// created, on `lease`.
pub(super) fn is_term(kv: &KeyValue, token: u64, lease: i64) -> bool {
    kv.mod_revision() == kv.create_revision() && kv.lease() == lease && token_in(kv) == Some(token)
}

/// The token an election key names: its last line, or (keys written
/// before tokens were counted apart from revisions) its creating revision.
fn token_in(kv: &KeyValue) -> Option<u64> {
    let text = std::str::from_utf8(kv.value()).ok()?;
    match text.split('\n').nth(5) {
        Some(token) => token.parse().ok(),
        None => u64::try_from(kv.create_revision()).ok(),
    }
}

/// Whether `kv` is the witness of the term `token` on the witness session
/// lease `witness` (created with the term's key, never modified).
pub(super) fn is_witness_of(kv: &KeyValue, token: u64, witness: i64) -> bool {
    kv.lease() == witness
        && std::str::from_utf8(kv.value())
            .ok()
            .and_then(|text| text.split('\n').nth(3))
            .and_then(|t| t.parse().ok())
            == Some(token)
}

/// The entry the `n`th operation of a transaction (a get) found.
pub(super) fn nth_kv(txn: &etcd_client::TxnResponse, n: usize) -> Option<KeyValue> {
    match txn.op_responses().into_iter().nth(n)? {
        TxnOpResponse::Get(got) => got.kvs().first().cloned(),
        _ => None,
    }
}

/// The value of a witness: it names its owner and its term's token.
pub(super) fn witness_value(id: &str, token: u64) -> String {
    format!("{MAGIC}\nwitness\n{id}\n{token}")
}

/// The token of a new term: above the last one counted, and at least the
/// candidate's clock in ms, so that tokens keep rising when the counter
/// is rolled back (a restore from an older snapshot) or deleted.
pub(super) fn new_token(last: u64) -> u64 {
    last.saturating_add(1).max(wall_ms())
}

/// The value of an election's token counter.
pub(super) fn decode_counter(key: &str, kv: &KeyValue) -> Result<u64> {
    std::str::from_utf8(kv.value())
        .ok()
        .and_then(|text| text.parse().ok())
        .ok_or_else(|| Error::ForeignData {
            key: key.to_string(),
            detail: "it is not a token counter (a decimal number)".into(),
        })
}

pub(super) fn first_kv(txn: &etcd_client::TxnResponse) -> Option<KeyValue> {
    txn.op_responses().into_iter().find_map(|r| match r {
        TxnOpResponse::Get(got) => got.kvs().first().cloned(),
        _ => None,
    })
}

pub(super) fn token_of(revision: i64, key: &str) -> Result<u64> {
    u64::try_from(revision)
        .ok()
        .filter(|r| *r > 0)
        .ok_or_else(|| Error::Etcd {
            detail: format!("the transaction on {key} answered without a revision"),
        })
}

/// The lines of `kv` after its first two, if it is a value tenure wrote
/// of the kind `tag` (`witness`, `last-run`) on a lease; else an error
/// naming the key.
pub(super) fn tagged<'a>(key: &str, kv: &'a KeyValue, tag: &str) -> Result<std::str::Lines<'a>> {
    let foreign = |detail: &str| Error::ForeignData {
        key: key.to_string(),
        detail: detail.to_string(),
    };
    let text = std::str::from_utf8(kv.value()).map_err(|_| foreign("not UTF-8"))?;
    let mut lines = text.lines();
    if lines.next() != Some(MAGIC) || lines.next() != Some(tag) {
        return Err(foreign(&format!(
            "it does not start with {MAGIC:?} and {tag:?}"
        )));
    }
    if kv.lease() == 0 {
        return Err(foreign("it has no lease"));
    }
    Ok(lines)
}

/// Check that `kv` is a witness tenure wrote (on a lease).
pub(super) fn decode_witness(key: &str, kv: &KeyValue) -> Result<()> {
    tagged(key, kv, "witness").map(|_| ())
}

/// The host's clock in ms since the epoch (0 before it).
pub(super) fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

pub(super) fn encode(request: &AcquireRequest<'_>, token: u64) -> String {
    let since_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    format!(
        "{MAGIC}\n{}\n{since_ms}\n{}\n{}\n{token}",
        request.ttl_ms, request.attempt, request.id
    )
}

/// The holder described by `kv` (its ttl left still to be asked), or an
/// error naming the key when tenure did not write it.
pub(super) fn decode(key: &str, kv: &KeyValue) -> Result<Holder> {
    let foreign = |detail: &str| Error::ForeignData {
        key: key.to_string(),
        detail: detail.to_string(),
    };
    let text = std::str::from_utf8(kv.value()).map_err(|_| foreign("not UTF-8"))?;
    let mut lines = text.splitn(6, '\n');
    if lines.next() != Some(MAGIC) {
        return Err(foreign(&format!("it does not start with {MAGIC:?}")));
    }
    let ttl_ms: u64 = lines
        .next()
        .and_then(|l| l.parse().ok())
        .ok_or_else(|| foreign("no ttl"))?;
    let since_ms: u64 = lines
        .next()
        .and_then(|l| l.parse().ok())
        .ok_or_else(|| foreign("no start time"))?;
    let attempt = lines.next().ok_or_else(|| foreign("no attempt"))?;
    let owner = lines.next().ok_or_else(|| foreign("no owner"))?;
    if kv.lease() == 0 {
        return Err(foreign("it has no lease"));
    }
    // Keys written before tokens were counted apart from revisions have
    // no token line: their token is their creating revision.
    let token = match lines.next() {
        Some(line) => line
            .parse()
            .map_err(|_| foreign("a token that is not a number"))?,
        None => u64::try_from(kv.create_revision()).map_err(|_| foreign("bad revision"))?,
    };
    Ok(Holder {
        id: owner.to_string(),
        token,
        ttl_left: Duration::ZERO,
        since_ms,
        attempt: attempt.to_string(),
        ttl: Duration::from_millis(ttl_ms),
    })
}
