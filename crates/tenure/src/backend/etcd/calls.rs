//! Every gRPC call of the store goes through here: counted, hedged to
//! another member when one is slow to answer, sent again when it never
//! left, checked to come from the cluster first reached, and its error put
//! in tenure's terms. Apart from the operations, which only say what to
//! send.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Client, ConnectOptions, GetOptions, KeyValue, Txn};
use futures_util::future::join_all;
use futures_util::StreamExt;

use super::EtcdStore;
use crate::error::one_line;
use crate::{Error, Result};

/// How many times [`EtcdStore::call`] sends a call that could not connect.
const SENDS: u32 = 4;

impl EtcdStore {
    /// One gRPC call, counted, with its error in tenure's terms. A call
    /// that could not even connect (the client balances over the members
    /// and may pick one that is down) never reached etcd, so it is sent
    /// again, up to [`SENDS`] times in all: with one member of three down,
    /// an operation should not fail on the draw.
    pub(super) async fn call<T, F>(&self, call: impl Fn(Client) -> F) -> Result<T>
    where
        F: std::future::Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        send(&self.clients, &self.requests, self.call_timeout / 3, call)
            .await
            .map_err(|e| classify(e, &self.url))
    }

    /// One transaction.
    pub(super) async fn txn(&self, txn: Txn) -> Result<etcd_client::TxnResponse> {
        let answer = self
            .call(|mut c| {
                let txn = txn.clone();
                async move { c.txn(txn).await }
            })
            .await?;
        self.same_cluster(answer.header().map(|h| h.cluster_id()))?;
        Ok(answer)
    }

    /// The entry of `key`, if any.
    pub(super) async fn get(&self, key: &str) -> Result<Option<KeyValue>> {
        let got = self
            .call(|mut c| async move { c.get(key, None).await })
            .await?;
        self.same_cluster(got.header().map(|h| h.cluster_id()))?;
        Ok(got.kvs().first().cloned())
    }

    /// Refuse an answer from another cluster than the one first reached:
    /// the client balances calls over every endpoint, and one that belongs
    /// to another cluster (a member replaced, an address reused) would
    /// grant a second term beside the first.
    pub(super) fn same_cluster(&self, answered: Option<u64>) -> Result<()> {
        from_cluster(self.cluster_id, answered, &self.url)
    }

    /// Every key under `prefix`, without values.
    pub(super) async fn keys_under(&self, prefix: &str) -> Result<Vec<KeyValue>> {
        let got = self
            .call(|mut c| async move {
                c.get(
                    prefix,
                    Some(GetOptions::new().with_prefix().with_keys_only()),
                )
                .await
            })
            .await?;
        self.same_cluster(got.header().map(|h| h.cluster_id()))?;
        Ok(got.kvs().to_vec())
    }

    /// What etcd says of `lease`: its granted ttl and the time it has left
    /// (-1 when it is gone), from this store's cluster: another cluster's
    /// word that it is gone would let a run be repeated early (the
    /// last-run marker), or a candidate try again at once.
    pub(super) async fn time_to_live(
        &self,
        lease: i64,
    ) -> Result<etcd_client::LeaseTimeToLiveResponse> {
        let answer = self
            .call(|mut c| async move { c.lease_time_to_live(lease, None).await })
            .await?;
        self.same_cluster(answer.header().map(|h| h.cluster_id()))?;
        Ok(answer)
    }
}

pub(super) fn lease_not_found(err: &Error) -> bool {
    matches!(err, Error::Etcd { detail } if detail.contains("requested lease not found"))
}

/// [`EtcdStore::same_cluster`] for a store first reached on cluster
/// `expected` at `url`.
pub(super) fn from_cluster(expected: u64, answered: Option<u64>, url: &str) -> Result<()> {
    match answered {
        Some(id) if expected != 0 && id != 0 && id != expected => Err(Error::Unsafe {
            url: url.to_string(),
            detail: format!(
                "an endpoint answered for etcd cluster {id:x}, not {expected:x}, the cluster \
                 first reached: list the members of one cluster only"
            ),
        }),
        _ => Ok(()),
    }
}

/// Ask every endpoint on its own which cluster it belongs to, and refuse a
/// list that spans two, naming them. An endpoint that does not answer now
/// is not counted (every later answer is checked: `same_cluster`). Returns
/// a client of each endpoint that answered, for hedged sends.
pub(super) async fn one_cluster(
    endpoints: &[String],
    options: &ConnectOptions,
    call_timeout: Duration,
    url: &str,
) -> Result<Vec<Client>> {
    let asks = endpoints.iter().map(|endpoint| async move {
        let ask = async {
            let mut client = Client::connect([endpoint.as_str()], Some(options.clone())).await?;
            let status = client.status().await?;
            Ok::<_, etcd_client::Error>((client, status))
        };
        match tokio::time::timeout(call_timeout, ask).await {
            Ok(Ok((client, status))) => (
                endpoint,
                Some(client),
                status.header().map(|h| h.cluster_id()),
            ),
            _ => (endpoint, None, None),
        }
    });
    let mut clusters: Vec<(u64, Vec<&str>)> = Vec::new();
    let mut clients = Vec::new();
    for (endpoint, client, id) in join_all(asks).await {
        clients.extend(client);
        let Some(id) = id else { continue };
        match clusters.iter_mut().find(|(known, _)| *known == id) {
            Some((_, members)) => members.push(endpoint),
            None => clusters.push((id, vec![endpoint])),
        }
    }
    if clusters.len() < 2 {
        return Ok(clients);
    }
    let named: Vec<String> = clusters
        .iter()
        .map(|(id, members)| format!("{} (cluster {id:x})", members.join(", ")))
        .collect();
    Err(Error::Unsafe {
        url: url.to_string(),
        detail: format!(
            "the endpoints belong to different etcd clusters: {}; list the members of one \
             cluster only",
            named.join(" and ")
        ),
    })
}

/// The clients of one store: one balanced over every endpoint, and one
/// per endpoint that answered at connect.
#[derive(Clone)]
pub(super) struct Clients {
    pub(super) balanced: Client,
    pub(super) members: Arc<Vec<Client>>,
    /// The member whose hedge last answered first: the hedges of every
    /// call start there, so that while one member is stopped they go to
    /// one that answers, not to whichever member a counter comes to.
    pub(super) answered: Arc<AtomicUsize>,
    /// [`EtcdBugs::no_hedges`](crate::backend::options::EtcdBugs::no_hedges).
    pub(super) no_hedges: bool,
}

impl Clients {
    /// The balanced client alone (at connect, before the members are known).
    pub(super) fn of(client: &Client, no_hedges: bool) -> Clients {
        Clients {
            balanced: client.clone(),
            members: Arc::new(Vec::new()),
            answered: Arc::new(AtomicUsize::new(0)),
            no_hedges,
        }
    }

    /// The client of the `n`th send of one call whose hedges start at
    /// member `first`, and that member's index: the balanced client first
    /// (no index), then the members in turn from `first`, so that the
    /// hedges of one call go to different members.
    fn for_send(&self, n: u32, first: usize) -> (Option<usize>, Client) {
        if n <= 1 || self.members.is_empty() {
            return (None, self.balanced.clone());
        }
        let i = (first + n as usize - 2) % self.members.len();
        (Some(i), self.members[i].clone())
    }
}

/// [`EtcdStore::call`] without the translation of its error.
///
/// A call that has no answer after `patience` is hedged: sent again while
/// the first stays in flight, and the first answer wins. A member that is
/// stopped (paused, swapping, partitioned without a reset) holds a call
/// forever, which would cost a leader its term although two members answer
/// at once, and the balanced client may well choose it again: so the
/// hedges go to the members in turn, each through a client of its own,
/// starting with the member whose hedge last answered first. Once a
/// stopped member has cost one call a second hedge, the next calls' first
/// hedge goes to a member that answers: a counter shared by the calls
/// instead sent every third call's first hedge to the stopped member too,
/// and that call's answer waited for a second hedge at two thirds of its
/// timeout, late for a renewal on a busy machine. Every operation is safe to send twice: reads and keep-alives
/// change nothing, deletes compare the revision, and a create that ran
/// twice is found under this same attempt and adopted. At most [`SENDS`]
/// are sent.
pub(super) async fn send<T, F>(
    clients: &Clients,
    requests: &AtomicU64,
    patience: Duration,
    call: impl Fn(Client) -> F,
) -> std::result::Result<T, etcd_client::Error>
where
    F: std::future::Future<Output = std::result::Result<T, etcd_client::Error>>,
{
    let client = &clients.balanced;
    let first = clients.answered.load(Ordering::Relaxed);
    let mut in_flight = futures_util::stream::FuturesUnordered::new();
    let mut sends = 0;
    let mut start = |in_flight: &mut futures_util::stream::FuturesUnordered<_>| {
        sends += 1;
        requests.fetch_add(1, Ordering::Relaxed);
        let (member, client) = clients.for_send(sends, first);
        let answer = call(client);
        in_flight.push(async move { (member, answer.await) });
        sends
    };
    let mut sent = start(&mut in_flight);
    loop {
        let hedge = tokio::time::sleep(patience);
        let answer = tokio::select! {
            answer = in_flight.next() => answer,
            _ = hedge, if sent < SENDS && !clients.no_hedges => {
                sent = start(&mut in_flight);
                continue;
            }
        };
        let Some((member, answer)) = answer else {
            // Nothing in flight (every send failed and was not resent).
            sent = start(&mut in_flight);
            continue;
        };
        if let (Some(member), Ok(_)) = (member, &answer) {
            clients.answered.store(member, Ordering::Relaxed);
        }
        match answer {
            Err(err) if never_sent(&err) && sent < SENDS => {
                sent = start(&mut in_flight);
            }
            Err(err) if old_auth_revision(&err) && sent < SENDS => {
                // Every change to users or roles makes the tokens issued
                // before it stale on each member that has applied it (as
                // does a token from a member that had not applied the last
                // one yet); etcd's own client authenticates again and
                // retries. A failed refresh shows in the retry's answer.
                let _ = client.refresh_token().await;
                sent = start(&mut in_flight);
            }
            // Another send may still answer.
            Err(_) if !in_flight.is_empty() => {}
            other => return other,
        }
    }
}

/// Whether etcd refused a call for a token older than its users and roles.
fn old_auth_revision(err: &etcd_client::Error) -> bool {
    matches!(err, etcd_client::Error::GRpcStatus(status)
        if status.message().contains("revision of auth store is old"))
}

/// Whether a call failed before anything reached etcd: the connection to
/// the member it was sent to could not be made.
fn never_sent(err: &etcd_client::Error) -> bool {
    let text = match err {
        etcd_client::Error::GRpcStatus(status) if status.code() == tonic::Code::Unavailable => {
            format!(
                "{} {:?}",
                status.message(),
                std::error::Error::source(status)
            )
        }
        etcd_client::Error::TransportError(err) => format!("{err} {err:?}"),
        _ => return false,
    };
    text.contains("tcp connect error") || text.contains("Connection refused")
}

/// An etcd client error in tenure's terms.
pub(super) fn classify(err: etcd_client::Error, url: &str) -> Error {
    use tonic::Code;
    match &err {
        etcd_client::Error::GRpcStatus(status) => {
            let detail = one_line(status.message());
            match status.code() {
                // etcd answers a wrong user or password with an invalid
                // argument.
                _ if detail.contains("authentication failed") => Error::Auth {
                    url: url.to_string(),
                    detail,
                },
                // Authentication was enabled while this client runs
                // without a user: no retry can pass.
                _ if detail.contains("user name is empty") => Error::Auth {
                    url: url.to_string(),
                    detail: format!(
                        "{detail} (the cluster requires authentication: give the URL a user, \
                         etcd://USER:PASSWORD@HOST:PORT)"
                    ),
                },
                Code::Unauthenticated => Error::Auth {
                    url: url.to_string(),
                    detail,
                },
                Code::PermissionDenied => Error::Auth {
                    url: url.to_string(),
                    detail: format!(
                        "{detail} (the user's role needs read and write on the key prefix)"
                    ),
                },
                Code::DeadlineExceeded => Error::Timeout(Duration::ZERO),
                _ => Error::Etcd { detail },
            }
        }
        etcd_client::Error::TransportError(_) | etcd_client::Error::IoError(_) => {
            Error::Unreachable {
                url: url.to_string(),
                detail: one_line(&with_sources(&err)),
            }
        }
        _ => Error::Etcd {
            detail: one_line(&err.to_string()),
        },
    }
}

/// An error and its sources, `: `-separated (a transport error's own text
/// is only "transport error").
fn with_sources(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let more = cause.to_string();
        if !text.contains(&more) {
            text = format!("{text}: {more}");
        }
        source = cause.source();
    }
    text
}

/// [`classify`] for the first exchange, where a failure to talk at all
/// means the cluster is unreachable (or speaks TLS, or is not etcd).
pub(super) fn classify_connect(err: etcd_client::Error, url: &str) -> Error {
    let tls = url.starts_with("etcds://");
    match classify(err, url) {
        Error::Etcd { detail } | Error::Unreachable { detail, .. }
            if tls && detail.contains("certificate") =>
        {
            Error::Tls {
                url: url.to_string(),
                detail: format!("{detail} (verify the cluster with its CA: --tls-ca, tls_ca_file)"),
            }
        }
        // A cluster that requires a client certificate ends the handshake
        // of a client without one; the client sees it cancelled, or the
        // connection fail.
        Error::Etcd { detail } | Error::Unreachable { detail, .. }
            if tls
                && !detail.contains("tcp connect error")
                && ["canceled", "transport error", "handshake", "alert"]
                    .iter()
                    .any(|word| detail.contains(word)) =>
        {
            Error::Tls {
                url: url.to_string(),
                detail: format!(
                    "{detail} (does the cluster require a client certificate? --tls-cert and \
                     --tls-key, tls_client_cert_file)"
                ),
            }
        }
        Error::Etcd { detail }
            if url.starts_with("etcd://") && !detail.contains("tcp connect error") =>
        {
            Error::Unreachable {
                url: url.to_string(),
                detail: format!("{detail} (is it an etcd cluster without TLS at that address?)"),
            }
        }
        Error::Etcd { detail } => Error::Unreachable {
            url: url.to_string(),
            detail,
        },
        other => other,
    }
}
