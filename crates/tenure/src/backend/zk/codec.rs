//! What tenure writes into its znodes, and how it reads it back. Values are
//! lines of text that start with `tenure/1`, readable in `zkCli.sh`; data
//! that does not parse is [`Error::ForeignData`] and never written over.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::machine::AcquireRequest;
use crate::term::Holder;
use crate::{Error, Result};

pub(super) const MAGIC: &str = "tenure/1";

fn foreign(path: &str, detail: &str) -> Error {
    Error::ForeignData {
        key: path.to_string(),
        detail: detail.to_string(),
    }
}

/// The wall clock in ms since the epoch.
pub(super) fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// A new term's token: above the counter, and above the candidate's clock
/// in ms, so that a restore from an older snapshot (which rolls the
/// counter back) does not hand out earlier tokens again.
pub(super) fn new_token(last: u64) -> u64 {
    last.saturating_add(1).max(wall_ms())
}

/// A lease's data: ttl, start, attempt, owner, token.
pub(super) fn encode_lease(request: &AcquireRequest<'_>, token: u64) -> Vec<u8> {
    format!(
        "{MAGIC}\n{}\n{}\n{}\n{}\n{token}",
        request.ttl_ms,
        wall_ms(),
        request.attempt,
        request.id
    )
    .into_bytes()
}

/// The holder a lease znode names (`ttl_left` is its whole ttl: a
/// session's remaining time is not shown to other clients).
pub(super) fn decode_lease(path: &str, data: &[u8], ephemeral_owner: i64) -> Result<Holder> {
    let text = std::str::from_utf8(data).map_err(|_| foreign(path, "not UTF-8"))?;
    let mut lines = text.splitn(6, '\n');
    if lines.next() != Some(MAGIC) {
        return Err(foreign(path, &format!("it does not start with {MAGIC:?}")));
    }
    let mut number = |what: &str| -> Result<u64> {
        lines
            .next()
            .and_then(|l| l.parse().ok())
            .ok_or_else(|| foreign(path, &format!("no {what}")))
    };
    let ttl = checked_ttl(path, number("ttl")?)?;
    let since_ms = number("start time")?;
    let attempt = lines.next().ok_or_else(|| foreign(path, "no attempt"))?;
    let owner = lines.next().ok_or_else(|| foreign(path, "no owner"))?;
    let token = lines
        .next()
        .and_then(|l| l.parse().ok())
        .ok_or_else(|| foreign(path, "no token"))?;
    if ephemeral_owner == 0 {
        return Err(foreign(path, "it is not an ephemeral znode"));
    }
    Ok(Holder {
        id: owner.to_string(),
        token,
        ttl_left: ttl,
        since_ms,
        attempt: attempt.to_string(),
        ttl,
    })
}

/// A ttl read from a znode, refused beyond any ttl tenure grants: a
/// candidate waits for it, and a foreign one of years (or of `u64::MAX`
/// ms, past what a clock can add) would hold it off for ever.
fn checked_ttl(path: &str, ms: u64) -> Result<Duration> {
    let ttl = Duration::from_millis(ms);
    if ttl > crate::machine::MAX_TTL {
        return Err(foreign(
            path,
            &format!("a ttl of {ms} ms, beyond any tenure grants"),
        ));
    }
    Ok(ttl)
}

/// A witness's data: its term and ttl.
pub(super) fn encode_witness(id: &str, token: u64, ttl_ms: u64) -> Vec<u8> {
    format!("{MAGIC}\nwitness\n{id}\n{token}\n{ttl_ms}").into_bytes()
}

/// The ttl a witness names.
pub(super) fn decode_witness(path: &str, data: &[u8]) -> Result<Duration> {
    let text = std::str::from_utf8(data).map_err(|_| foreign(path, "not UTF-8"))?;
    let lines: Vec<&str> = text.lines().collect();
    match lines.as_slice() {
        [MAGIC, "witness", _id, _token, ttl] => ttl
            .parse()
            .map_err(|_| foreign(path, "a ttl that is not a number"))
            .and_then(|ms| checked_ttl(path, ms)),
        _ => Err(foreign(path, "it is not a tenure witness")),
    }
}

/// The token counter, the data of an election's `{NAME}` znode (empty:
/// none yet).
pub(super) fn decode_counter(path: &str, data: &[u8]) -> Result<u64> {
    if data.is_empty() {
        return Ok(0);
    }
    std::str::from_utf8(data)
        .ok()
        .and_then(|text| {
            text.strip_prefix(MAGIC)?
                .strip_prefix("\ntoken\n")?
                .parse()
                .ok()
        })
        .ok_or_else(|| foreign(path, "it is not a token counter"))
}

pub(super) fn encode_counter(token: u64) -> Vec<u8> {
    format!("{MAGIC}\ntoken\n{token}").into_bytes()
}

/// A last-run marker: how long it is kept (ms), and the recording term.
pub(super) fn encode_marker(keep_ms: u64, id: &str, token: u64, slot: Option<u64>) -> Vec<u8> {
    let mut text = format!("{MAGIC}\nlast-run\n{keep_ms}\n{id}\n{token}");
    if let Some(slot) = slot {
        text.push_str(&format!("\n{slot}"));
    }
    text.into_bytes()
}

/// The keep time a marker names, and the last slot claimed, if any.
pub(super) fn decode_marker(path: &str, data: &[u8]) -> Result<(Duration, Option<u64>)> {
    let text = std::str::from_utf8(data).map_err(|_| foreign(path, "not UTF-8"))?;
    let lines: Vec<&str> = text.lines().collect();
    let (keep, slot) = match lines.as_slice() {
        [MAGIC, "last-run", keep, _id, _token] => (keep, None),
        [MAGIC, "last-run", keep, _id, _token, slot] => (keep, Some(slot)),
        _ => return Err(foreign(path, "it is not a tenure last-run marker")),
    };
    let keep = keep
        .parse()
        .map(Duration::from_millis)
        .map_err(|_| foreign(path, "a keep time that is not a number"))?;
    let slot = slot
        .map(|slot| slot.parse())
        .transpose()
        .map_err(|_| foreign(path, "a slot that is not a number"))?;
    Ok((keep, slot))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_round_trip_and_foreign_data_is_named() {
        let request = AcquireRequest {
            id: "host-1",
            attempt: "a1",
            ttl_ms: 3000,
            hold_off_ms: 3000,
        };
        let holder = decode_lease("/t/x", &encode_lease(&request, 77), 42).expect("ours");
        assert_eq!((holder.id.as_str(), holder.token), ("host-1", 77));
        assert_eq!(holder.attempt, "a1");
        let err = decode_lease("/t/x", &encode_lease(&request, 77), 0).expect_err("no");
        assert!(matches!(err, Error::ForeignData { .. }), "{err}");
        assert!(decode_lease("/t/x", b"hello", 42).is_err());
        let ttl = decode_witness("/w", &encode_witness("h", 3, 2000)).expect("witness");
        assert_eq!(ttl, Duration::from_millis(2000));
        assert_eq!(
            decode_counter("/c", &encode_counter(9)).expect("counter"),
            9
        );
        assert_eq!(decode_counter("/c", b"").expect("empty"), 0);
        assert!(decode_counter("/c", b"12").is_err());
        let marker = decode_marker("/m", &encode_marker(60_000, "h", 3, None)).expect("marker");
        assert_eq!(marker, (Duration::from_secs(60), None));
        let marker = decode_marker("/m", &encode_marker(1, "h", 3, Some(9))).expect("marker");
        assert_eq!(marker, (Duration::from_millis(1), Some(9)));
        assert!(decode_marker("/m", b"tenure/1\nlast-run\n1\nh\n3\nx").is_err());
        assert!(new_token(5) > 5 && new_token(u64::MAX) == u64::MAX);
    }

    /// A candidate waits out the ttl a lease or witness names: a foreign
    /// one past any tenure grants is refused, not waited for (and
    /// `u64::MAX` ms would overflow the clock it is added to).
    #[test]
    fn a_foreign_ttl_beyond_any_tenure_grants_is_foreign_data() {
        for ms in [u64::MAX, 10u64.pow(12)] {
            let witness = format!("{MAGIC}\nwitness\nh\n1\n{ms}");
            let err = decode_witness("/w", witness.as_bytes()).expect_err("refused");
            assert!(matches!(err, Error::ForeignData { .. }), "{err}");
            let lease = format!("{MAGIC}\n{ms}\n0\na1\nh\n1");
            let err = decode_lease("/l", lease.as_bytes(), 42).expect_err("refused");
            assert!(matches!(err, Error::ForeignData { .. }), "{err}");
        }
        let day = crate::machine::MAX_TTL.as_millis();
        let witness = format!("{MAGIC}\nwitness\nh\n1\n{day}");
        assert_eq!(
            decode_witness("/w", witness.as_bytes()).ok(),
            Some(crate::machine::MAX_TTL)
        );
    }
}
