//! tenure for Python: the native half of the `tenure` package.
//!
//! This module (`tenure._tenure`) is deliberately small and plain: it turns
//! the Rust library's async calls into [`Op`]s, one value that Python can
//! either `await` (on asyncio) or `wait()` for (blocking, with the GIL
//! released). The Pythonic layer, context managers, dataclasses, iterators
//! and the work that is cancelled when a term is lost, lives in
//! `python/tenure/__init__.py`, where it is easy to read and to type.
//!
//! Why the keeper never waits for Python: every future runs on this
//! module's own tokio runtime, whose worker threads never take the GIL.
//! Results cross to Python as plain Rust values, converted by the thread
//! that awaits them (asyncio's loop through `spawn_blocking`, or the
//! blocked caller). So a Python thread stuck in a long computation cannot
//! delay a renewal; it can only act late, which the term's local deadline
//! (`is_leader()` is a clock check) and its fencing token make harmless.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use pyo3::exceptions::{PyException, PyRuntimeError, PyStopAsyncIteration};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use pyo3::IntoPyObjectExt;

mod election;
mod work;

/// How long a blocking wait holds the GIL released before it looks for a
/// signal (Ctrl-C) to raise.
const SIGNAL_CHECK: Duration = Duration::from_millis(50);

/// The runtime, and the process that started it.
static RUNTIME: OnceLock<(tokio::runtime::Runtime, u32)> = OnceLock::new();

/// The runtime every election of this process runs on: two worker threads
/// (renewals are small; more would only compete with Python for the CPU).
/// Started by the first call, not at import, so that a process may import
/// tenure and then fork (a pre-forking server) before it elects.
fn runtime() -> &'static tokio::runtime::Runtime {
    let (runtime, _) = RUNTIME.get_or_init(|| {
        let runtime = match tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("tenure")
            .enable_all()
            .build()
        {
            Ok(runtime) => runtime,
            // Nothing of tenure can run without it; the OS refused a thread
            // or an epoll instance.
            Err(err) => panic!("tenure cannot start its runtime: {err}"),
        };
        (runtime, std::process::id())
    });
    runtime
}

/// A runtime's threads do not survive `fork`: a child that inherited one
/// would wait forever. Say so instead.
pub(crate) fn not_forked() -> PyResult<()> {
    match RUNTIME.get() {
        Some((_, pid)) if *pid != std::process::id() => Err(TenureError::new_err(format!(
            "tenure was started in process {pid}, and this process is a fork of it: a runtime's \
             threads do not survive fork, so create elections only after forking"
        ))),
        _ => Ok(()),
    }
}

/// Log the library's events to standard error when `TENURE_LOG` is set
/// (`warn`, `info`, `debug`, or a tracing filter such as `tenure=debug`).
fn init_logging() {
    let Ok(filter) = std::env::var("TENURE_LOG") else {
        return;
    };
    let filter = tracing_subscriber::EnvFilter::try_new(&filter)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

pyo3::create_exception!(
    _tenure,
    TenureError,
    PyException,
    "Every error tenure raises. Its message is one line and never holds a secret."
);
pyo3::create_exception!(
    _tenure,
    ConfigError,
    TenureError,
    "Invalid configuration: a name, a URL, a duration, a schedule."
);
pyo3::create_exception!(
    _tenure,
    TransientError,
    TenureError,
    "A failure that may pass by itself: an unreachable store, a timeout, a store error. Worth retrying."
);
pyo3::create_exception!(
    _tenure,
    UnreachableError,
    TransientError,
    "The store could not be reached."
);
pyo3::create_exception!(
    _tenure,
    StoreTimeoutError,
    TransientError,
    "The store did not answer in time."
);
pyo3::create_exception!(
    _tenure,
    StoreError,
    TransientError,
    "The store answered with an error."
);
pyo3::create_exception!(
    _tenure,
    InternalError,
    TransientError,
    "A bug in tenure; please report it."
);
pyo3::create_exception!(
    _tenure,
    NotTheStoreError,
    TenureError,
    "The server at the URL does not speak the store's protocol."
);
pyo3::create_exception!(
    _tenure,
    AuthError,
    TenureError,
    "The store rejected the credentials."
);
pyo3::create_exception!(_tenure, TlsError, TenureError, "TLS to the store failed.");
pyo3::create_exception!(
    _tenure,
    NoPermissionError,
    TenureError,
    "The store's user may not run a command tenure needs (an ACL)."
);
pyo3::create_exception!(
    _tenure,
    UnsafeStoreError,
    TenureError,
    "The store is not safe for leases (for example, Redis may evict keys)."
);
pyo3::create_exception!(
    _tenure,
    ForeignDataError,
    TenureError,
    "A key holds data tenure did not write; tenure never touches it."
);
pyo3::create_exception!(
    _tenure,
    NotLeaderError,
    TenureError,
    "The term is over: this instance may no longer act as leader."
);

/// The exception class of each of the library's error kinds, with the
/// library's own one-line message (URLs in it are already redacted).
pub(crate) fn py_err(err: tenure::Error) -> PyErr {
    let message = err.to_string();
    match err {
        tenure::Error::Config(_) => ConfigError::new_err(message),
        tenure::Error::Unreachable { .. } => UnreachableError::new_err(message),
        tenure::Error::NotTheStore { .. } => NotTheStoreError::new_err(message),
        tenure::Error::Auth { .. } => AuthError::new_err(message),
        tenure::Error::Tls { .. } => TlsError::new_err(message),
        tenure::Error::NoPermission { .. } => NoPermissionError::new_err(message),
        tenure::Error::Unsafe { .. } => UnsafeStoreError::new_err(message),
        tenure::Error::ForeignData { .. } => ForeignDataError::new_err(message),
        tenure::Error::Timeout(_) => StoreTimeoutError::new_err(message),
        tenure::Error::Internal(_) => InternalError::new_err(message),
        tenure::Error::NotLeader(_) => NotLeaderError::new_err(message),
        other if other.is_transient() => StoreError::new_err(message),
        _ => TenureError::new_err(message),
    }
}

/// A duration given in seconds by Python: finite and not negative.
pub(crate) fn seconds(what: &str, value: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(value).map_err(|_| {
        ConfigError::new_err(format!(
            "invalid configuration: {what} must be a finite, non-negative number of seconds (got {value})"
        ))
    })
}

/// What an [`Op`] ends with, as Rust values: Python objects are made only
/// by the thread that receives them, never on the runtime's workers.
pub(crate) enum Out {
    None,
    Bool(bool),
    Float(f64),
    Leader(Option<election::Leader>),
    Leaders(Vec<Option<election::Leader>>),
    Reason(election::Reason),
    Term(election::Term),
    OptTerm(Option<election::Term>),
    Written(bool, Option<u64>),
    Fenced(Option<(u64, Vec<u8>)>),
    Job(Option<work::Job>),
    Names(Vec<String>),
}

impl<'py> IntoPyObject<'py> for Out {
    type Target = PyAny;
    type Output = Bound<'py, PyAny>;
    type Error = PyErr;

    fn into_pyobject(self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        match self {
            Out::None => Ok(py.None().into_bound(py)),
            Out::Bool(value) => value.into_bound_py_any(py),
            Out::Float(value) => value.into_bound_py_any(py),
            Out::Leader(leader) => leader.into_bound_py_any(py),
            Out::Leaders(leaders) => leaders.into_bound_py_any(py),
            Out::Reason(reason) => reason.into_bound_py_any(py),
            Out::Term(term) => term.into_bound_py_any(py),
            Out::OptTerm(term) => term.into_bound_py_any(py),
            Out::Written(accepted, highest) => (accepted, highest).into_bound_py_any(py),
            Out::Fenced(None) => Ok(py.None().into_bound(py)),
            Out::Fenced(Some((token, value))) => {
                (token, PyBytes::new(py, &value)).into_bound_py_any(py)
            }
            Out::Job(job) => job.into_bound_py_any(py),
            Out::Names(names) => names.into_bound_py_any(py),
        }
    }
}

type OpFuture = BoxFuture<'static, PyResult<Out>>;

/// One call into the library, not started yet: `await op` runs it on the
/// runtime for asyncio (cancelling the task drops the call, as dropping a
/// Rust future does), `op.wait(timeout)` runs it while the calling thread
/// waits with the GIL released. Either can happen once.
#[pyclass(module = "tenure._tenure", frozen)]
pub struct Op {
    future: Mutex<Option<OpFuture>>,
}

impl Op {
    pub(crate) fn new(future: impl Future<Output = PyResult<Out>> + Send + 'static) -> Op {
        Op {
            future: Mutex::new(Some(future.boxed())),
        }
    }

    fn take(&self) -> PyResult<OpFuture> {
        not_forked()?;
        self.future
            .lock()
            .ok()
            .and_then(|mut slot| slot.take())
            .ok_or_else(|| PyRuntimeError::new_err("this call was awaited or waited for already"))
    }
}

#[pymethods]
impl Op {
    fn __await__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let future = self.take()?;
        let event_loop = py.import("asyncio")?.call_method0("get_running_loop")?;
        let awaited = event_loop.call_method0("create_future")?;
        let deliver_to = (event_loop.clone().unbind(), awaited.clone().unbind());
        let task = runtime().spawn(async move {
            let out = future.await;
            // Python objects are made by the loop's thread; this one only
            // hands the value over, on a blocking thread, never a worker.
            tokio::task::spawn_blocking(move || deliver(deliver_to, out));
        });
        // Cancelling the asyncio future drops the call, as dropping a Rust
        // future does.
        awaited.call_method1(
            "add_done_callback",
            (Canceller {
                task: task.abort_handle(),
            },),
        )?;
        awaited.call_method0("__await__")
    }

    /// Run the call to its end, or until `timeout` seconds have passed
    /// (then the call is dropped, and `TimeoutError` raised). Ctrl-C
    /// interrupts it.
    #[pyo3(signature = (timeout=None))]
    fn wait<'py>(&self, py: Python<'py>, timeout: Option<f64>) -> PyResult<Bound<'py, PyAny>> {
        let limit = timeout.map(|t| seconds("timeout", t)).transpose()?;
        let future = self.take()?;
        block_on(py, future, limit)?
            .ok_or_else(|| {
                pyo3::exceptions::PyTimeoutError::new_err(format!(
                    "the call did not end within {}s",
                    timeout.unwrap_or_default()
                ))
            })?
            .into_pyobject(py)
    }
}

/// Set by the interpreter's exit (`_shutdown`, registered with `atexit`):
/// from then on no runtime thread takes the GIL. A thread that asks for the
/// GIL while the interpreter finalizes is ended by CPython with
/// `pthread_exit`, which a Rust thread does not survive.
static FINALIZING: AtomicBool = AtomicBool::new(false);

/// Hand-overs to asyncio under way (holding or waiting for the GIL).
static DELIVERING: AtomicUsize = AtomicUsize::new(0);

/// Give an awaited call's result to its asyncio future, on the loop's
/// thread.
fn deliver(to: (Py<PyAny>, Py<PyAny>), out: PyResult<Out>) {
    DELIVERING.fetch_add(1, Ordering::SeqCst);
    if FINALIZING.load(Ordering::SeqCst) {
        // Too late for Python: keep the references rather than touch an
        // interpreter that is going away.
        std::mem::forget(to);
        std::mem::forget(out);
        DELIVERING.fetch_sub(1, Ordering::SeqCst);
        return;
    }
    Python::attach(|py| {
        let (event_loop, awaited) = to;
        let (ok, value) = match out.and_then(|out| out.into_pyobject(py)) {
            Ok(value) => (true, value.unbind()),
            Err(err) => (false, err.into_value(py).into_any()),
        };
        let set = wrap_pyfunction!(set_outcome, py).and_then(|set| {
            event_loop
                .bind(py)
                .call_method1("call_soon_threadsafe", (set, awaited, ok, value))
        });
        // The loop is closed: nobody awaits the result any more.
        drop(set);
    });
    DELIVERING.fetch_sub(1, Ordering::SeqCst);
}

/// On the loop's thread: the result, unless the future was cancelled.
#[pyfunction]
fn set_outcome(awaited: &Bound<'_, PyAny>, ok: bool, value: Bound<'_, PyAny>) -> PyResult<()> {
    if awaited.call_method0("done")?.is_truthy()? {
        return Ok(());
    }
    if ok {
        awaited.call_method1("set_result", (value,))?;
    } else {
        awaited.call_method1("set_exception", (value,))?;
    }
    Ok(())
}

/// The asyncio future's done-callback: a cancelled await aborts its call.
#[pyclass(module = "tenure._tenure", frozen)]
struct Canceller {
    task: tokio::task::AbortHandle,
}

#[pymethods]
impl Canceller {
    fn __call__(&self, awaited: &Bound<'_, PyAny>) -> PyResult<()> {
        if awaited.call_method0("cancelled")?.is_truthy()? {
            self.task.abort();
        }
        Ok(())
    }
}

/// At interpreter exit: no runtime thread takes the GIL from now on; wait
/// (a little, with the GIL released) for the hand-overs under way.
#[pyfunction]
fn _shutdown(py: Python<'_>) {
    FINALIZING.store(true, Ordering::SeqCst);
    py.detach(|| {
        let until = std::time::Instant::now() + Duration::from_secs(1);
        while DELIVERING.load(Ordering::SeqCst) > 0 && std::time::Instant::now() < until {
            std::thread::sleep(Duration::from_millis(1));
        }
    });
}

/// Drive `future` on the runtime from a Python thread, with the GIL
/// released, looking for signals every [`SIGNAL_CHECK`]. `None` if `limit`
/// passed first; the future is dropped then, or when a signal raises.
fn block_on<T: Send>(
    py: Python<'_>,
    future: impl Future<Output = PyResult<T>> + Send,
    limit: Option<Duration>,
) -> PyResult<Option<T>> {
    let started = std::time::Instant::now();
    let mut future = std::pin::pin!(future);
    loop {
        let slice = match limit {
            Some(limit) => {
                let left = limit.saturating_sub(started.elapsed());
                if left.is_zero() {
                    return Ok(None);
                }
                left.min(SIGNAL_CHECK)
            }
            None => SIGNAL_CHECK,
        };
        let step = py.detach(|| {
            runtime().block_on(async { tokio::time::timeout(slice, future.as_mut()).await })
        });
        match step {
            Ok(result) => return result.map(Some),
            Err(_elapsed) => py.check_signals()?,
        }
    }
}

/// A value whose drop may touch the runtime (a connection's task, a
/// term's release): it is dropped inside the runtime's context, whichever
/// Python thread lets it go.
pub(crate) struct InRuntime<T>(pub Option<T>);

impl<T> InRuntime<T> {
    pub(crate) fn new(value: T) -> Self {
        InRuntime(Some(value))
    }
}

impl<T> std::ops::Deref for InRuntime<T> {
    type Target = T;
    fn deref(&self) -> &T {
        match &self.0 {
            Some(value) => value,
            None => unreachable!("taken only by drop"),
        }
    }
}

impl<T> Drop for InRuntime<T> {
    fn drop(&mut self) {
        let _context = runtime().enter();
        drop(self.0.take());
    }
}

/// The next item of a stream, as an [`Op`]; `StopAsyncIteration` at its
/// end (the blocking iterator turns that into `StopIteration`).
pub(crate) fn stop_iteration() -> PyErr {
    PyStopAsyncIteration::new_err(())
}

/// A fresh instance id: this host's name, a dash, and 128 random bits.
#[pyfunction]
fn instance_id() -> String {
    tenure::instance_id()
}

/// Check an election name and a key prefix as every election checks them.
#[pyfunction]
#[pyo3(signature = (name, prefix=tenure::DEFAULT_PREFIX))]
fn validate_name(name: &str, prefix: &str) -> PyResult<()> {
    tenure::validate_name(prefix, name).map_err(py_err)
}

/// Hide a URL's password, as every message of tenure does.
#[pyfunction]
fn redact_url(url: &str) -> String {
    tenure::redact_url(url)
}

#[pymodule]
fn _tenure(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    init_logging();
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("DEFAULT_PREFIX", tenure::DEFAULT_PREFIX)?;
    m.add("DEFAULT_TTL", tenure::DEFAULT_TTL.as_secs_f64())?;
    m.add("MAX_PERMITS", tenure::MAX_PERMITS)?;
    for (name, class) in [
        ("TenureError", py.get_type::<TenureError>()),
        ("ConfigError", py.get_type::<ConfigError>()),
        ("TransientError", py.get_type::<TransientError>()),
        ("UnreachableError", py.get_type::<UnreachableError>()),
        ("StoreTimeoutError", py.get_type::<StoreTimeoutError>()),
        ("StoreError", py.get_type::<StoreError>()),
        ("InternalError", py.get_type::<InternalError>()),
        ("NotTheStoreError", py.get_type::<NotTheStoreError>()),
        ("AuthError", py.get_type::<AuthError>()),
        ("TlsError", py.get_type::<TlsError>()),
        ("NoPermissionError", py.get_type::<NoPermissionError>()),
        ("UnsafeStoreError", py.get_type::<UnsafeStoreError>()),
        ("ForeignDataError", py.get_type::<ForeignDataError>()),
        ("NotLeaderError", py.get_type::<NotLeaderError>()),
    ] {
        m.add(name, class)?;
    }
    m.add_class::<Op>()?;
    m.add_class::<election::Election>()?;
    m.add_class::<election::Term>()?;
    m.add_class::<election::Watch>()?;
    m.add_class::<election::Semaphore>()?;
    m.add_class::<election::FencedKey>()?;
    m.add_class::<work::Schedule>()?;
    m.add_class::<work::PartitionSet>()?;
    m.add_class::<work::Running>()?;
    m.add_class::<work::Job>()?;
    m.add_function(wrap_pyfunction!(work::run_every, m)?)?;
    m.add_function(wrap_pyfunction!(work::run_cron, m)?)?;
    m.add_function(wrap_pyfunction!(work::run_lead, m)?)?;
    m.add_function(wrap_pyfunction!(instance_id, m)?)?;
    m.add_function(wrap_pyfunction!(_shutdown, m)?)?;
    m.add_class::<Canceller>()?;
    py.import("atexit")?
        .call_method1("register", (m.getattr("_shutdown")?,))?;
    m.add_function(wrap_pyfunction!(validate_name, m)?)?;
    m.add_function(wrap_pyfunction!(redact_url, m)?)?;
    Ok(())
}
