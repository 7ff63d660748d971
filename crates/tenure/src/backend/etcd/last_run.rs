//! The last-run marker (see the module docs of `backend::etcd`): put on an
//! etcd lease of its own, its age read from that lease and the recorder's
//! clock. Apart from the terms, whose leases it does not share.

use std::time::Duration;

use etcd_client::{Compare, CompareOp, KeyValue, PutOptions, Txn, TxnOp};

use super::codec::{decode, first_kv, tagged, wall_ms, MAGIC};
use super::layout::{last_run_key, lease_key};
use super::{Address, EtcdStore};
use crate::backend::RunRecord;
use crate::{Error, Result};

/// How far apart the hosts' clocks may be for a last-run marker's age by
/// the recorder's clock to be trusted (see [`EtcdStore::last_run`]).
const CLOCK_SLACK: Duration = Duration::from_secs(1);

impl EtcdStore {
    /// The age of the last-run marker (see the module docs), `None` when
    /// there is none or its lease has run out.
    pub(super) async fn last_run(&self, at: Address<'_>) -> Result<Option<RunRecord>> {
        let key = last_run_key(at)?;
        let Some(kv) = self.get(&key).await? else {
            return Ok(None);
        };
        let marker = decode_marker(&key, &kv)?;
        let answer = self.time_to_live(kv.lease()).await?;
        let (Ok(left), Ok(granted)) = (
            u64::try_from(answer.ttl()),
            u64::try_from(answer.granted_ttl()),
        ) else {
            // -1: the lease has expired.
            return Ok(None);
        };
        let by_lease = Duration::from_secs(granted.saturating_sub(left).saturating_sub(1));
        // An etcd leader change renews every lease, so the lease alone can
        // make a marker look younger than it is, and a period be skipped.
        // The recorder's clock says how old it is across that, less
        // CLOCK_SLACK for hosts whose clocks disagree: never older than it
        // is while they agree that closely.
        let by_clock = marker.recorded_ms.map_or(Duration::ZERO, |at| {
            Duration::from_millis(wall_ms().saturating_sub(at)).saturating_sub(CLOCK_SLACK)
        });
        Ok(Some(RunRecord {
            age: by_lease.max(by_clock).min(Duration::from_secs(granted)),
            slot: marker.slot,
        }))
    }

    /// Put the last-run marker on a new lease of `keep_ms` (rounded up to
    /// whole seconds), in a transaction that checks the election's key is
    /// still term (`id`, `token`)'s and the marker is the one read (so a
    /// slot is claimed only after the one recorded); the previous
    /// marker's lease is revoked.
    pub(super) async fn record_run(
        &self,
        at: Address<'_>,
        id: &str,
        token: u64,
        keep_ms: u64,
        slot: Option<u64>,
    ) -> Result<bool> {
        let key = lease_key(at)?;
        let marker = last_run_key(at)?;
        // The owner is read first; the transaction goes ahead only if the
        // key has not changed since (its mod_revision is still the one that
        // created the term).
        let Some(kv) = self.get(&key).await? else {
            return Ok(false);
        };
        let holder = decode(&key, &kv)?;
        if holder.token != token || holder.id != id || kv.mod_revision() != kv.create_revision() {
            return Ok(false);
        }
        let revision = kv.mod_revision();
        // The marker as it is now: its slot is kept (or must be passed),
        // and the write goes ahead only if it has not changed since.
        let previous = self.get(&marker).await?;
        let kept_slot = match &previous {
            Some(kv) => decode_marker(&marker, kv)?.slot,
            None => None,
        };
        if let (Some(new), Some(old)) = (slot, kept_slot) {
            if new <= old {
                return Ok(false);
            }
        }
        let marker_unchanged = match &previous {
            Some(kv) => Compare::mod_revision(marker.clone(), CompareOp::Equal, kv.mod_revision()),
            None => Compare::version(marker.clone(), CompareOp::Equal, 0),
        };
        let seconds = i64::try_from(keep_ms.div_ceil(1000).max(1)).unwrap_or(i64::MAX);
        // A cluster whose minimum lease ttl is longer grants more: the
        // marker is then kept longer, and its age still counts right.
        let granted = self.lease_grant(seconds).await?;
        let lease = granted.id();
        let mut value = format!("{MAGIC}\nlast-run\n{token}\n{id}\n{}", wall_ms());
        if let Some(slot) = slot.or(kept_slot) {
            value.push_str(&format!("\n{slot}"));
        }
        let txn = Txn::new()
            .when([
                Compare::mod_revision(key.clone(), CompareOp::Equal, revision),
                marker_unchanged,
            ])
            .and_then([
                TxnOp::get(marker.clone(), None),
                TxnOp::put(
                    marker.clone(),
                    value,
                    Some(PutOptions::new().with_lease(lease)),
                ),
            ]);
        let previous_lease = previous.as_ref().map_or(0, KeyValue::lease);
        match self.txn(txn).await {
            Ok(txn) if txn.succeeded() => {
                if let Some(previous) = first_kv(&txn).filter(|kv| kv.lease() != lease) {
                    self.revoke_marker_lease(previous.lease()).await;
                }
                Ok(true)
            }
            Ok(_) => {
                self.settle_refused_claim(&marker, lease, previous_lease)
                    .await
            }
            Err(err) => match self
                .settle_refused_claim(&marker, lease, previous_lease)
                .await
            {
                Ok(true) => Ok(true),
                _ => Err(err),
            },
        }
    }

    /// A record's transaction was refused, or its answer lost, yet a copy
    /// of it may have committed: every call is hedged to a second member,
    /// and the copy that lost the race is refused by the very marker the
    /// other wrote (or times out). So the marker is read before `lease`,
    /// the new marker's, is revoked: revoking it then would delete the
    /// record just made, and a slot or period would run again with no
    /// data lost by the store. `Ok(true)`: the record was made (the
    /// previous marker's lease is revoked as after a success).
    pub(super) async fn settle_refused_claim(
        &self,
        marker: &str,
        lease: i64,
        previous_lease: i64,
    ) -> Result<bool> {
        let now = match self.get(marker).await {
            Ok(now) => now,
            Err(err) => {
                // Unknown: keep the lease (it runs out by itself) rather
                // than risk deleting a record that was made.
                tracing::debug!(lease, error = %err, "cannot read the last-run marker after a refused record; its lease is kept");
                return Err(err);
            }
        };
        if now.as_ref().is_some_and(|kv| kv.lease() == lease) {
            if previous_lease != lease {
                self.revoke_marker_lease(previous_lease).await;
            }
            return Ok(true);
        }
        self.revoke_marker_lease(lease).await;
        Ok(false)
    }

    /// Revoke a last-run marker's lease (0: none), logging a failure: the
    /// lease runs out by itself.
    async fn revoke_marker_lease(&self, lease: i64) {
        if lease == 0 {
            return;
        }
        let revoked = self
            .call(|mut c| async move { c.lease_revoke(lease).await })
            .await;
        if let Err(err) = revoked {
            tracing::debug!(lease, error = %err, "cannot revoke a last-run marker's lease; it runs out by itself");
        }
    }
}

/// A last-run marker as read.
struct Marker {
    /// The recorder's clock (ms) at the record, if it says (markers
    /// written before it did, do not).
    recorded_ms: Option<u64>,
    /// The last slot claimed, if any.
    slot: Option<u64>,
}

/// Check that `kv` is a last-run marker tenure wrote (on a lease), and
/// read it.
fn decode_marker(key: &str, kv: &KeyValue) -> Result<Marker> {
    let mut lines = tagged(key, kv, "last-run")?;
    let (_token, _owner) = (lines.next(), lines.next());
    let mut number = |what: &str| -> Result<Option<u64>> {
        match lines.next() {
            None => Ok(None),
            Some(line) => line.parse().map(Some).map_err(|_| Error::ForeignData {
                key: key.to_string(),
                detail: format!("{what} that is not a number"),
            }),
        }
    };
    let recorded_ms = number("a record time")?;
    let slot = number("a slot")?;
    Ok(Marker { recorded_ms, slot })
}
