//! Session leases, like etcd's own `concurrency.Session`: one lease per
//! instance and ttl that all its terms hang on (and a second one for their
//! witnesses), granted when missing, kept alive once per batch, replaced
//! when lapsed; and the transactions that attach a key to them beside a
//! keep-alive. Apart because every operation that writes a key needs them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::Txn;
use futures_util::future::FutureExt;

use super::calls::{classify, from_cluster, lease_not_found, send};
use super::EtcdStore;
use crate::error::copy_error;
use crate::error::one_line;
use crate::{Error, Result};

tokio::task_local! {
    /// The keep-alives sent by the batch being carried out, by lease.
    pub(super) static KEEP_ALIVES: KeepAlives;
}

/// See [`KEEP_ALIVES`].
#[derive(Default)]
pub(super) struct KeepAlives(Mutex<HashMap<i64, KeepAliveAnswer>>);

type KeepAliveAnswer = futures_util::future::Shared<
    futures_util::future::BoxFuture<'static, std::result::Result<KeptAlive, Arc<Error>>>,
>;

/// What [`EtcdStore::on_session`] found.
pub(super) struct Attached {
    pub(super) lease: i64,
    /// Whether the keep-alive found the lease alive: a key the transaction
    /// attached to it lasts a ttl from then.
    pub(super) alive: bool,
    /// The witness session lease the transaction put a witness on, if it
    /// did ([`EtcdStore::on_sessions`]).
    pub(super) witness: Option<i64>,
    pub(super) answer: etcd_client::TxnResponse,
}

/// An open keep-alive stream of one lease, every answer on it read: the
/// next answer is the answer to the next keep-alive sent on it.
pub(super) struct KeptStream {
    keeper: etcd_client::LeaseKeeper,
    answers: etcd_client::LeaseKeepAliveStream,
}

/// The keep-alive streams kept open: a slot per session lease in use,
/// opened when the lease is granted and closed when it is forgotten, that
/// holds its stream between keep-alives.
///
/// A stream is taken out of its slot while a keep-alive is on it and put
/// back only once its answer was read, so a keep-alive cut off (timed out,
/// cancelled, beaten by a hedge) takes its stream with it, and no late
/// answer is ever read as a new one's. A keep-alive still in flight when
/// its lease is forgotten finds no slot, and its stream is dropped.
#[derive(Default, Clone)]
pub(super) struct Streams(Arc<Mutex<HashMap<i64, Option<KeptStream>>>>);

impl Streams {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<i64, Option<KeptStream>>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn open(&self, lease: i64) {
        self.lock().insert(lease, None);
    }

    fn take(&self, lease: i64) -> Option<KeptStream> {
        self.lock().get_mut(&lease).and_then(Option::take)
    }

    fn keep(&self, lease: i64, stream: KeptStream) {
        if let Some(slot) = self.lock().get_mut(&lease) {
            *slot = Some(stream);
        }
    }

    fn close(&self, lease: i64) {
        self.lock().remove(&lease);
    }
}

/// The outcome of one keep-alive: positive when the lease lives on (for
/// its granted ttl from when etcd's leader received it), zero when it is
/// gone.
#[derive(Debug, Clone, Copy)]
pub(super) struct KeptAlive(pub(super) i64);

impl EtcdStore {
    /// The session lease of (`id`, `ttl_ms`), granted now if there is none.
    /// Returns it and whether it was granted by this call (a grant is as
    /// good as a keep-alive sent now).
    pub(super) async fn session(&self, id: &str, ttl_ms: u64) -> Result<(i64, bool)> {
        if let Some(lease) = self.known_session(id, ttl_ms) {
            return Ok((lease, false));
        }
        let _granting = self.granting.lock().await;
        if let Some(lease) = self.known_session(id, ttl_ms) {
            // Granted by another operation meanwhile: not fresh for us.
            return Ok((lease, false));
        }
        let asked = tokio::time::Instant::now();
        let lease = self.grant(ttl_ms).await?;
        self.granted(id, ttl_ms, lease, asked);
        Ok((lease, true))
    }

    /// [`EtcdStore::session`] of `first` and of `second`: when both are
    /// missing, they are granted together, in one round trip (a follower
    /// whose two leases lapsed while it waited needs both at once, when the
    /// key it waited for is released), `first`'s request sent first.
    pub(super) async fn session_pair(
        &self,
        (first, second): (&str, &str),
        ttl_ms: u64,
    ) -> Result<((i64, bool), (i64, bool))> {
        let both = (
            self.known_session(first, ttl_ms),
            self.known_session(second, ttl_ms),
        );
        if let (Some(a), Some(b)) = both {
            return Ok(((a, false), (b, false)));
        }
        let _granting = self.granting.lock().await;
        // Granted by another operation meanwhile: not fresh for us.
        let both = (
            self.known_session(first, ttl_ms),
            self.known_session(second, ttl_ms),
        );
        let asked = tokio::time::Instant::now();
        let grant = |known: Option<i64>| async move {
            match known {
                Some(lease) => Ok((lease, false)),
                None => self.grant(ttl_ms).await.map(|lease| (lease, true)),
            }
        };
        let (a, b) = tokio::join!(biased; grant(both.0), grant(both.1));
        // A lease granted is kept even when the other's grant failed: the
        // next operation uses it rather than leave it to lapse.
        for (id, answer) in [(first, &a), (second, &b)] {
            if let Ok((lease, true)) = answer {
                self.granted(id, ttl_ms, *lease, asked);
            }
        }
        Ok((a?, b?))
    }

    /// Note the lease just granted to (`id`, `ttl_ms`), asked for at `asked`.
    fn granted(&self, id: &str, ttl_ms: u64, lease: i64, asked: tokio::time::Instant) {
        self.refreshed_lock().insert(lease, asked);
        self.streams.open(lease);
        self.sessions_lock().insert((id.to_string(), ttl_ms), lease);
    }

    /// The session lease of (`id`, `ttl_ms`) if this store has one that
    /// is not about to lapse (one that is, is forgotten).
    fn known_session(&self, id: &str, ttl_ms: u64) -> Option<i64> {
        let ttl = Duration::from_millis(ttl_ms);
        let lease = self
            .sessions_lock()
            .get(&(id.to_string(), ttl_ms))
            .copied()?;
        let refreshed = self.refreshed_lock().get(&lease).copied();
        // With a tenth of the ttl to spare for the keep-alive's trip.
        let lapsing = refreshed.is_none_or(|at| tokio::time::Instant::now() + ttl / 10 >= at + ttl);
        if lapsing {
            self.forget(id, ttl_ms, lease);
            return None;
        }
        Some(lease)
    }

    fn refreshed_lock(&self) -> std::sync::MutexGuard<'_, HashMap<i64, tokio::time::Instant>> {
        self.refreshed.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn sessions_lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, u64), i64>> {
        self.sessions.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Forget a session lease that is gone, so that the next operation
    /// grants a new one.
    pub(super) fn forget(&self, id: &str, ttl_ms: u64, lease: i64) {
        let mut sessions = self.sessions_lock();
        let key = (id.to_string(), ttl_ms);
        if sessions.get(&key) == Some(&lease) {
            sessions.remove(&key);
            self.refreshed_lock().remove(&lease);
            self.streams.close(lease);
        }
    }

    /// A new lease of `ttl_ms`, which must be whole seconds (checked when
    /// the election is built). A cluster whose minimum lease ttl (1.5
    /// election timeouts) is longer grants more than asked: that lease is
    /// revoked and the ttl refused, since our deadlines would be wrong.
    pub(super) async fn grant(&self, ttl_ms: u64) -> Result<i64> {
        let seconds = i64::try_from(ttl_ms / 1000).unwrap_or(i64::MAX);
        let granted = self.lease_grant(seconds).await?;
        if granted.ttl() != seconds {
            let lease = granted.id();
            let _ = self
                .call(|mut c| async move { c.lease_revoke(lease).await })
                .await;
            return Err(Error::Config(format!(
                "ttl {seconds} s is shorter than the smallest lease {} grants ({} s, 1.5 times \
                 its election timeout): use a ttl of at least {} s",
                self.url,
                granted.ttl(),
                granted.ttl()
            )));
        }
        Ok(granted.id())
    }

    /// One lease of `seconds`, as etcd granted it (which may be longer).
    pub(super) async fn lease_grant(
        &self,
        seconds: i64,
    ) -> Result<etcd_client::LeaseGrantResponse> {
        let granted = self
            .call(|mut c| async move { c.lease_grant(seconds, None).await })
            .await?;
        // A grant counts as a keep-alive of the new lease: it must be one
        // of this cluster's leases.
        self.same_cluster(granted.header().map(|h| h.cluster_id()))?;
        if !granted.error().is_empty() {
            return Err(Error::Etcd {
                detail: one_line(granted.error()),
            });
        }
        Ok(granted)
    }

    /// Send one keep-alive of `lease` and wait for its answer.
    ///
    /// Within a [`EtcdStore::batch`], one keep-alive per lease is sent and
    /// its answer shared.
    pub(super) async fn keep_alive(&self, lease: i64) -> Result<KeptAlive> {
        let shared = KEEP_ALIVES.try_with(|batch| {
            batch
                .0
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .entry(lease)
                .or_insert_with(|| self.send_keep_alive(lease).boxed().shared())
                .clone()
        });
        let asked = tokio::time::Instant::now();
        let answer = match shared {
            Ok(shared) => shared.await,
            Err(_) => self.send_keep_alive(lease).await,
        };
        if let Ok(KeptAlive(ttl)) = answer {
            if ttl > 0 {
                if let Some(at) = self.refreshed_lock().get_mut(&lease) {
                    *at = (*at).max(asked);
                }
            }
        }
        answer.map_err(|err| copy_error(&err))
    }

    /// One keep-alive of `lease`, sent now: on the lease's kept stream if
    /// it has one, else on a new stream, which is kept for the next.
    ///
    /// Why a stream is kept, and how: opening one costs a message of its
    /// own. The client sends a keep-alive when it opens a stream and reads
    /// its answer itself, showing only whether the lease lives, not which
    /// cluster answered; so a second keep-alive must follow on the stream
    /// and its answer's cluster be checked. Another cluster can have a
    /// lease of the same id (a restore of this cluster's snapshot under a
    /// new cluster token keeps the leases): its keep-alive renews nothing
    /// here and must not count as a renewal. A stream per renewal was two
    /// keep-alives per lease and renewal; a kept stream is one. Every
    /// answer on it names its cluster, and is checked.
    ///
    /// The answer read must be the answer to this keep-alive: etcd answers
    /// the keep-alives of a stream one by one, in order, and a stream is
    /// used again only when every answer on it was read ([`Streams`]).
    ///
    /// The kept stream is the first send of a hedged call, in the place of
    /// the balanced client's; hedges open streams of their own to the
    /// members in turn, as for any call. Only a first send's stream is
    /// kept: one that a hedge opened is on the member the next call's first
    /// hedge goes to, and were that member stopped, the kept stream and the
    /// first hedge would both wait on it. So a stopped member costs a
    /// keep-alive one hedge's patience, as it did with a stream per
    /// keep-alive.
    ///
    /// A lease the first answer of a new stream finds gone counts as gone,
    /// whichever cluster said so (the client reads that answer itself and
    /// does not say; it only ends a term). Every other answer is checked
    /// for its cluster first. A lease found gone gives up its stream.
    fn send_keep_alive(
        &self,
        lease: i64,
    ) -> impl std::future::Future<Output = std::result::Result<KeptAlive, Arc<Error>>> + Send + 'static
    {
        let (clients, requests, url, cluster_id, streams) = (
            self.clients.clone(),
            self.requests.clone(),
            self.url.clone(),
            self.cluster_id,
            self.streams.clone(),
        );
        let patience = self.call_timeout / 3;
        async move {
            // The first send takes the outer `Some`: the kept stream, if
            // any. Hedges find `None` and open streams of their own.
            let kept = Mutex::new(Some(streams.take(lease)));
            let sent = send(&clients, &requests, patience, |mut c| {
                let first_send = kept.lock().unwrap_or_else(|p| p.into_inner()).take();
                let first = first_send.is_some();
                let stream = first_send.flatten();
                async move {
                    if let Some(mut stream) = stream {
                        // A stream whose connection ended since (a member
                        // restarted, a connection reset) fails at once:
                        // then a new stream is opened, in the same send.
                        if stream.keeper.keep_alive().await.is_ok() {
                            if let Ok(Some(answer)) = stream.answers.message().await {
                                return Ok(Some((answer, stream, first)));
                            }
                        }
                    }
                    let (keeper, answers) = c.lease_keep_alive(lease).await?;
                    let mut stream = KeptStream { keeper, answers };
                    stream.keeper.keep_alive().await?;
                    let answer = stream.answers.message().await?;
                    Ok(answer.map(|answer| (answer, stream, first)))
                }
            });
            match sent.await {
                Ok(Some((answer, stream, first))) => {
                    let answered = answer.header().map(|h| h.cluster_id());
                    from_cluster(cluster_id, answered, &url).map_err(Arc::new)?;
                    if answer.ttl() > 0 && first {
                        streams.keep(lease, stream);
                    }
                    Ok(KeptAlive(answer.ttl().max(0)))
                }
                Ok(None) => Err(Arc::new(Error::Etcd {
                    detail: "the keep-alive stream ended before its answer".into(),
                })),
                Err(etcd_client::Error::LeaseKeepAliveError(why)) if why.contains("not found") => {
                    Ok(KeptAlive(0))
                }
                Err(err) => Err(Arc::new(classify(err, &url))),
            }
        }
    }

    /// At most how long `lease` has left, `None` when it is gone. etcd
    /// answers in whole seconds, rounded down (0 for the last second, and
    /// for an expired lease its leader has not removed yet: it does so on a
    /// 500 ms tick), so one second is added: a follower that slept on the
    /// time rounded down would ask again and again in the last second. The
    /// watch on the key wakes it as soon as the key is gone anyway.
    pub(super) async fn ttl_left(&self, lease: i64) -> Result<Option<Duration>> {
        let answer = self.time_to_live(lease).await?;
        Ok(u64::try_from(answer.ttl())
            .ok()
            .map(|secs| Duration::from_secs(secs.saturating_add(1))))
    }

    /// Run the transaction `txn(lease)` that attaches a key to the
    /// session lease of (`id`, `ttl_ms`), beside a keep-alive of that lease
    /// (or right after granting it). `None` when the transaction found the
    /// lease gone; a lease the keep-alive found gone is reported as not
    /// `alive`. Either way it is forgotten: the next try grants a new one.
    ///
    /// If the keep-alive finds the lease alive, the lease was alive when
    /// the key was attached (an expired lease never comes back), and lasts
    /// a ttl from when the keep-alive reached etcd, after the caller's
    /// send instant.
    pub(super) async fn on_session(
        &self,
        id: &str,
        ttl_ms: u64,
        txn: impl Fn(i64) -> Txn,
    ) -> Result<Option<Attached>> {
        let (lease, fresh) = self.session(id, ttl_ms).await?;
        let sent = self.txn(txn(lease));
        let (alive, sent) = if fresh {
            (Ok(KeptAlive(1)), sent.await)
        } else {
            tokio::join!(self.keep_alive(lease), sent)
        };
        let answer = match sent {
            Err(err) if lease_not_found(&err) => {
                self.forget(id, ttl_ms, lease);
                return Ok(None);
            }
            other => other?,
        };
        let alive = alive?.0 > 0;
        if !alive {
            // Granted anew by the next operation that needs it.
            self.forget(id, ttl_ms, lease);
        }
        Ok(Some(Attached {
            lease,
            alive,
            witness: None,
            answer,
        }))
    }

    /// [`EtcdStore::on_session`] for a transaction `txn(lease, witness)`
    /// that also puts a term's witness on `id`'s witness session lease: a
    /// second lease, kept alive with the first, so that a revoke of the
    /// first (by hand) leaves the witness behind. `alive` only when both
    /// keep-alives found their lease alive.
    ///
    /// The witness's lease is never refreshed after the key's: the two are
    /// granted together, the witness's request sent first, and kept alive
    /// together, the witness's keep-alive sent first. etcd's leader revokes
    /// expired leases in passes, every 500 ms. When a holder crashes, its
    /// key and its witness go with their two leases. When the key's lease
    /// was granted first and the witness's a round trip later, the
    /// witness's expired that much later, and in one crash of several just
    /// after a pass: the key went, and the witness, which rightly holds the
    /// follower off, only at the next pass, half a second later (the
    /// bench's etcd takeover p99 was 506 ms after the key's delete). Sent
    /// together, witness first, the witness's lease expires after the key's
    /// by no more than the two requests' skew in flight (well under a
    /// millisecond): it goes in the same pass as the key, or one before,
    /// but for a crash in the few microseconds of that skew before a pass.
    /// Safety does not depend on the order: each lease is refreshed after
    /// the instant a term's deadline counts from.
    pub(super) async fn on_sessions(
        &self,
        id: &str,
        ttl_ms: u64,
        txn: impl Fn(i64, i64) -> Txn,
    ) -> Result<Option<Attached>> {
        let witness_id = witness_session(id);
        // The witness's lease first, in the grants and in the keep-alives
        // (see above).
        let ((witness, witness_fresh), (lease, fresh)) =
            self.session_pair((&witness_id, id), ttl_ms).await?;
        let kept = |lease, fresh| async move {
            if fresh {
                Ok(KeptAlive(1))
            } else {
                self.keep_alive(lease).await
            }
        };
        // `biased`: polled in this order (join! otherwise rotates).
        let (witness_alive, alive, sent) = tokio::join!(
            biased;
            kept(witness, witness_fresh),
            kept(lease, fresh),
            self.txn(txn(lease, witness))
        );
        let (alive, witness_alive) = (alive?.0 > 0, witness_alive?.0 > 0);
        // Granted anew by the next operation that needs them.
        if !alive {
            self.forget(id, ttl_ms, lease);
        }
        if !witness_alive {
            self.forget(&witness_id, ttl_ms, witness);
        }
        let answer = match sent {
            // One of the two leases is gone: the one a keep-alive found
            // gone is forgotten; if neither did, it expired in between,
            // and the next try's keep-alive finds it.
            Err(err) if lease_not_found(&err) => return Ok(None),
            other => other?,
        };
        Ok(Some(Attached {
            lease,
            alive: alive && witness_alive,
            witness: Some(witness),
            answer,
        }))
    }
}

/// The session key of an instance's witness lease: a second session of
/// the instance, beside its own (ids contain no control characters).
pub(super) fn witness_session(id: &str) -> String {
    format!("{id}\u{1}witness")
}
