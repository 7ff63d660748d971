//! Elections, terms, watches, semaphores and fenced keys, as thin native
//! classes: each method that talks to the store returns an [`Op`].
//!
//! An election connects on first use, not when it is made: constructing
//! one in Python must not block an asyncio loop. Its settings are checked
//! then too, and a failed connection is tried again by the next call (the
//! cell keeps only a success).

use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use futures_util::{Stream, StreamExt};
use pyo3::prelude::*;
use tokio::sync::OnceCell;

use crate::{py_err, seconds, stop_iteration, InRuntime, Op, Out};

/// A leader as Python receives it: (id, token, ttl left in seconds, held
/// since as Unix seconds).
pub(crate) type Leader = (String, u64, f64, Option<f64>);

/// Why a term ended: (kind, message, taken by, taken with token).
pub(crate) type Reason = (String, String, Option<String>, Option<u64>);

fn leader(info: tenure::LeaderInfo) -> Leader {
    let since = info
        .held_since
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map(|d| d.as_secs_f64());
    (info.id, info.token, info.ttl_left.as_secs_f64(), since)
}

fn reason(reason: &tenure::LostReason) -> Reason {
    let (by, token) = match reason {
        tenure::LostReason::Taken { by, token } => (Some(by.clone()), Some(*token)),
        _ => (None, None),
    };
    (reason.label().to_string(), reason.to_string(), by, token)
}

/// The settings every election, semaphore and partition set takes.
#[derive(Clone)]
pub(crate) struct Config {
    pub store: String,
    pub id: String,
    pub ttl: Option<Duration>,
    pub renew_every: Option<Duration>,
    pub margin: Option<Duration>,
    pub call_timeout: Option<Duration>,
    pub prefix: Option<String>,
    pub max_ttl: Option<Duration>,
    pub allow_eviction: bool,
    pub tls_ca_file: Option<PathBuf>,
}

impl Config {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        store: String,
        id: Option<String>,
        ttl: Option<f64>,
        renew_every: Option<f64>,
        margin: Option<f64>,
        call_timeout: Option<f64>,
        prefix: Option<String>,
        max_ttl: Option<f64>,
        allow_eviction: bool,
        tls_ca_file: Option<PathBuf>,
    ) -> PyResult<Config> {
        let secs = |what: &str, value: Option<f64>| value.map(|v| seconds(what, v)).transpose();
        Ok(Config {
            store,
            id: id.unwrap_or_else(tenure::instance_id),
            ttl: secs("ttl", ttl)?,
            renew_every: secs("renew_every", renew_every)?,
            margin: secs("margin", margin)?,
            call_timeout: secs("call_timeout", call_timeout)?,
            prefix,
            max_ttl: secs("max_ttl", max_ttl)?,
            allow_eviction,
            tls_ca_file,
        })
    }

    pub(crate) fn store(&self) -> tenure::StoreBuilder {
        let store = tenure::Store::open(self.store.clone());
        match &self.tls_ca_file {
            Some(path) => store.tls_ca_file(path.clone()),
            None => store,
        }
    }

    fn election(&self, name: &str) -> tenure::ElectionBuilder {
        let mut builder = tenure::Election::builder(name)
            .open(self.store())
            .id(self.id.clone())
            .allow_eviction(self.allow_eviction);
        if let Some(ttl) = self.ttl {
            builder = builder.ttl(ttl);
        }
        if let Some(every) = self.renew_every {
            builder = builder.renew_every(every);
        }
        if let Some(margin) = self.margin {
            builder = builder.margin(margin);
        }
        if let Some(timeout) = self.call_timeout {
            builder = builder.call_timeout(timeout);
        }
        if let Some(prefix) = &self.prefix {
            builder = builder.prefix(prefix.clone());
        }
        if let Some(max_ttl) = self.max_ttl {
            builder = builder.max_ttl(max_ttl);
        }
        builder
    }
}

type Cell<T> = Arc<OnceCell<InRuntime<T>>>;

/// One election, from one instance (see the Python class `Election`).
#[pyclass(module = "tenure._tenure", frozen)]
pub struct Election {
    name: String,
    pub(crate) config: Config,
    inner: Cell<tenure::Election>,
}

impl Election {
    /// The connected election, connecting first if no call has yet.
    pub(crate) fn connected(
        &self,
    ) -> impl std::future::Future<Output = PyResult<tenure::Election>> + Send + 'static {
        let cell = self.inner.clone();
        let config = self.config.clone();
        let name = self.name.clone();
        async move {
            let election = cell
                .get_or_try_init(|| async {
                    config
                        .election(&name)
                        .build()
                        .await
                        .map(InRuntime::new)
                        .map_err(py_err)
                })
                .await?;
            Ok((**election).clone())
        }
    }
}

#[pymethods]
impl Election {
    #[new]
    #[pyo3(signature = (name, store, *, id=None, ttl=None, renew_every=None, margin=None,
        call_timeout=None, prefix=None, max_ttl=None, allow_eviction=false, tls_ca_file=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        name: String,
        store: String,
        id: Option<String>,
        ttl: Option<f64>,
        renew_every: Option<f64>,
        margin: Option<f64>,
        call_timeout: Option<f64>,
        prefix: Option<String>,
        max_ttl: Option<f64>,
        allow_eviction: bool,
        tls_ca_file: Option<PathBuf>,
    ) -> PyResult<Election> {
        let config = Config::new(
            store,
            id,
            ttl,
            renew_every,
            margin,
            call_timeout,
            prefix,
            max_ttl,
            allow_eviction,
            tls_ca_file,
        )?;
        tenure::validate_name(
            config.prefix.as_deref().unwrap_or(tenure::DEFAULT_PREFIX),
            &name,
        )
        .map_err(py_err)?;
        Ok(Election {
            name,
            config,
            inner: Arc::default(),
        })
    }

    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    #[getter]
    fn id(&self) -> &str {
        &self.config.id
    }

    /// Connect and check the store now (every other call does so first).
    /// Ends with the ttl in seconds.
    fn connect(&self) -> Op {
        let connected = self.connected();
        Op::new(async move { Ok(Out::Float(connected.await?.ttl().as_secs_f64())) })
    }

    /// The renew interval in seconds, once connected.
    fn renew_every(&self) -> Op {
        let connected = self.connected();
        Op::new(async move { Ok(Out::Float(connected.await?.renew_every().as_secs_f64())) })
    }

    fn campaign(&self) -> Op {
        let connected = self.connected();
        Op::new(async move {
            let term = connected.await?.campaign().await.map_err(py_err)?;
            Ok(Out::Term(Term::new(term)))
        })
    }

    fn try_campaign(&self) -> Op {
        let connected = self.connected();
        Op::new(async move {
            let term = connected.await?.try_campaign().await.map_err(py_err)?;
            Ok(Out::OptTerm(term.map(Term::new)))
        })
    }

    fn campaign_timeout(&self, wait: f64) -> PyResult<Op> {
        let wait = seconds("wait", wait)?;
        let connected = self.connected();
        Ok(Op::new(async move {
            let term = connected
                .await?
                .campaign_timeout(wait)
                .await
                .map_err(py_err)?;
            Ok(Out::OptTerm(term.map(Term::new)))
        }))
    }

    fn leader(&self) -> Op {
        let connected = self.connected();
        Op::new(async move {
            let info = connected.await?.leader().await.map_err(py_err)?;
            Ok(Out::Leader(info.map(leader)))
        })
    }

    fn release_if_held(&self) -> Op {
        let connected = self.connected();
        Op::new(async move {
            let released = connected.await?.release_if_held().await.map_err(py_err)?;
            Ok(Out::Bool(released))
        })
    }

    fn watch(slf: Py<Self>) -> Watch {
        Watch {
            election: slf,
            stream: Arc::default(),
        }
    }
}

type LeaderStream = Pin<Box<dyn Stream<Item = tenure::Result<Option<tenure::LeaderInfo>>> + Send>>;

/// The leader now, then each time it changes (see `Election.watch`).
#[pyclass(module = "tenure._tenure", frozen)]
pub struct Watch {
    election: Py<Election>,
    stream: Arc<tokio::sync::Mutex<Option<InRuntime<LeaderStream>>>>,
}

#[pymethods]
impl Watch {
    fn next(&self) -> Op {
        let election = self.election.get().connected();
        let stream = self.stream.clone();
        Op::new(async move {
            let mut stream = stream.lock().await;
            if stream.is_none() {
                let election = election.await?;
                *stream = Some(InRuntime::new(Box::pin(election.watch()) as LeaderStream));
            }
            let Some(InRuntime(Some(items))) = stream.as_mut() else {
                return Err(stop_iteration());
            };
            match items.next().await {
                Some(Ok(info)) => Ok(Out::Leader(info.map(leader))),
                Some(Err(err)) => Err(py_err(err)),
                None => Err(stop_iteration()),
            }
        })
    }
}

/// One term of leadership (or one permit): what `campaign` returns.
#[pyclass(module = "tenure._tenure", frozen)]
pub struct Term {
    inner: InRuntime<tenure::Leadership>,
}

impl Term {
    pub(crate) fn new(term: tenure::Leadership) -> Term {
        Term {
            inner: InRuntime::new(term),
        }
    }

    pub(crate) fn leadership(&self) -> tenure::Leadership {
        (*self.inner).clone()
    }
}

#[pymethods]
impl Term {
    #[getter]
    fn token(&self) -> u64 {
        self.inner.token()
    }

    #[getter]
    fn election(&self) -> &str {
        self.inner.election()
    }

    #[getter]
    fn id(&self) -> &str {
        self.inner.id()
    }

    /// A clock check, no store call: true until the local deadline or the
    /// moment the term is lost.
    fn is_leader(&self) -> bool {
        self.inner.is_leader()
    }

    /// Seconds left until the local deadline (0 once past it).
    fn remaining(&self) -> f64 {
        self.inner.remaining().as_secs_f64()
    }

    fn lost_reason(&self) -> Option<Reason> {
        self.inner.lost_reason().as_ref().map(reason)
    }

    fn lost(&self) -> Op {
        let term = self.leadership();
        Op::new(async move { Ok(Out::Reason(reason(&term.lost().await))) })
    }

    fn confirm(&self) -> Op {
        let term = self.leadership();
        Op::new(async move {
            let left = term.confirm().await.map_err(py_err)?;
            Ok(Out::Float(left.as_secs_f64()))
        })
    }

    fn resign(&self) -> Op {
        let term = self.leadership();
        Op::new(async move {
            term.resign().await.map_err(py_err)?;
            Ok(Out::None)
        })
    }

    fn __repr__(&self) -> String {
        format!(
            "Term(election={:?}, id={:?}, token={}, leader={})",
            self.inner.election(),
            self.inner.id(),
            self.inner.token(),
            if self.inner.is_leader() {
                "True"
            } else {
                "False"
            }
        )
    }
}

/// N permits of one name (see the Python class `Semaphore`).
#[pyclass(module = "tenure._tenure", frozen)]
pub struct Semaphore {
    name: String,
    permits: usize,
    config: Config,
    inner: Cell<tenure::Semaphore>,
}

impl Semaphore {
    fn connected(
        &self,
    ) -> impl std::future::Future<Output = PyResult<tenure::Semaphore>> + Send + 'static {
        let cell = self.inner.clone();
        let config = self.config.clone();
        let name = self.name.clone();
        let permits = self.permits;
        async move {
            let semaphore = cell
                .get_or_try_init(|| async {
                    config
                        .election(&name)
                        .semaphore(permits)
                        .await
                        .map(InRuntime::new)
                        .map_err(py_err)
                })
                .await?;
            Ok((**semaphore).clone())
        }
    }
}

#[pymethods]
impl Semaphore {
    #[new]
    #[pyo3(signature = (name, permits, store, *, id=None, ttl=None, renew_every=None, margin=None,
        call_timeout=None, prefix=None, max_ttl=None, allow_eviction=false, tls_ca_file=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        name: String,
        permits: usize,
        store: String,
        id: Option<String>,
        ttl: Option<f64>,
        renew_every: Option<f64>,
        margin: Option<f64>,
        call_timeout: Option<f64>,
        prefix: Option<String>,
        max_ttl: Option<f64>,
        allow_eviction: bool,
        tls_ca_file: Option<PathBuf>,
    ) -> PyResult<Semaphore> {
        let config = Config::new(
            store,
            id,
            ttl,
            renew_every,
            margin,
            call_timeout,
            prefix,
            max_ttl,
            allow_eviction,
            tls_ca_file,
        )?;
        if permits == 0 || permits > tenure::MAX_PERMITS {
            return Err(crate::ConfigError::new_err(format!(
                "invalid configuration: a semaphore has 1 to {} permits (got {permits})",
                tenure::MAX_PERMITS
            )));
        }
        tenure::validate_name(
            config.prefix.as_deref().unwrap_or(tenure::DEFAULT_PREFIX),
            &name,
        )
        .map_err(py_err)?;
        Ok(Semaphore {
            name,
            permits,
            config,
            inner: Arc::default(),
        })
    }

    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    #[getter]
    fn permits(&self) -> usize {
        self.permits
    }

    #[getter]
    fn id(&self) -> &str {
        &self.config.id
    }

    /// The elections of the permits, in order.
    fn elections(&self) -> Op {
        let connected = self.connected();
        Op::new(async move {
            let semaphore = connected.await?;
            let names = semaphore
                .elections()
                .iter()
                .map(|e| e.name().to_string())
                .collect();
            Ok(Out::Names(names))
        })
    }

    fn acquire(&self) -> Op {
        let connected = self.connected();
        Op::new(async move {
            let term = connected.await?.acquire().await.map_err(py_err)?;
            Ok(Out::Term(Term::new(term)))
        })
    }

    fn try_acquire(&self) -> Op {
        let connected = self.connected();
        Op::new(async move {
            let term = connected.await?.try_acquire().await.map_err(py_err)?;
            Ok(Out::OptTerm(term.map(Term::new)))
        })
    }

    fn holders(&self) -> Op {
        let connected = self.connected();
        Op::new(async move {
            let holders = connected.await?.holders().await.map_err(py_err)?;
            Ok(Out::Leaders(
                holders.into_iter().map(|h| h.map(leader)).collect(),
            ))
        })
    }
}

/// A Redis key written only with a token at least as large as every token
/// it has seen (see the Python class `FencedKey`).
#[pyclass(module = "tenure._tenure", frozen)]
pub struct FencedKey {
    key: tenure::FencedKey,
    store: String,
    tls_ca_file: Option<PathBuf>,
    call_timeout: Duration,
    connection: Cell<tenure::fence::Connection>,
}

impl FencedKey {
    fn connected(
        &self,
    ) -> impl std::future::Future<Output = PyResult<tenure::fence::Connection>> + Send + 'static
    {
        let cell = self.connection.clone();
        let store = self.store.clone();
        let tls_ca = self.tls_ca_file.clone();
        let timeout = self.call_timeout;
        async move {
            let connection = cell
                .get_or_try_init(|| async {
                    tenure::fence::connect(&store, tls_ca.as_deref(), timeout)
                        .await
                        .map(InRuntime::new)
                        .map_err(py_err)
                })
                .await?;
            Ok((**connection).clone())
        }
    }
}

#[pymethods]
impl FencedKey {
    #[new]
    #[pyo3(signature = (key, store, *, call_timeout=2.0, tls_ca_file=None))]
    fn new(
        key: String,
        store: String,
        call_timeout: f64,
        tls_ca_file: Option<PathBuf>,
    ) -> PyResult<FencedKey> {
        if key.is_empty() {
            return Err(crate::ConfigError::new_err(
                "invalid configuration: a fenced key's name must not be empty",
            ));
        }
        Ok(FencedKey {
            key: tenure::FencedKey::new(key),
            store,
            tls_ca_file,
            call_timeout: seconds("call_timeout", call_timeout)?,
            connection: Arc::default(),
        })
    }

    #[getter]
    fn key(&self) -> &str {
        self.key.key()
    }

    /// Ends with (accepted, the highest token seen if refused).
    fn set(&self, token: u64, value: Vec<u8>) -> Op {
        let connected = self.connected();
        let key = self.key.clone();
        Op::new(async move {
            let mut connection = connected.await?;
            match key
                .set(&mut connection, token, value)
                .await
                .map_err(py_err)?
            {
                tenure::FencedWrite::Rejected { highest } => Ok(Out::Written(false, Some(highest))),
                _ => Ok(Out::Written(true, None)),
            }
        })
    }

    /// Ends with (token, value) of the last accepted write, or None.
    fn get(&self) -> Op {
        let connected = self.connected();
        let key = self.key.clone();
        Op::new(async move {
            let mut connection = connected.await?;
            Ok(Out::Fenced(key.get(&mut connection).await.map_err(py_err)?))
        })
    }
}
