//! Work the library starts on the leader (a partition's consumer, a
//! periodic tick, a calendar slot, a term's job), handed to Python as
//! [`Job`]s.
//!
//! The library calls a Rust closure when work should start; here that
//! closure sends a job down a channel and waits until Python says the job
//! is done. Python runs it as an asyncio task (or in a thread) and cancels
//! it when the job's term is lost, so the library's rule, work ends the
//! moment leadership does, holds on the Python side too. The library keeps
//! its own rule as well: it drops the waiting closure at the deadline,
//! whatever Python does.

use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use pyo3::prelude::*;
use tokio::sync::{mpsc, oneshot};

use crate::election::{Config, Election, Term};
use crate::{py_err, runtime, seconds, ConfigError, InRuntime, InternalError, Op, Out};

type Reply = oneshot::Sender<Result<(), String>>;

/// One piece of work to run while its term lasts.
#[pyclass(module = "tenure._tenure", frozen)]
pub struct Job {
    partition: Option<String>,
    slot: Option<f64>,
    term: InRuntime<tenure::Leadership>,
    reply: Mutex<Option<Reply>>,
}

impl Job {
    fn new(
        term: tenure::Leadership,
        partition: Option<String>,
        slot: Option<SystemTime>,
    ) -> (Job, oneshot::Receiver<Result<(), String>>) {
        let (reply, done) = oneshot::channel();
        let slot = slot
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map(|d| d.as_secs_f64());
        let job = Job {
            partition,
            slot,
            term: InRuntime::new(term),
            reply: Mutex::new(Some(reply)),
        };
        (job, done)
    }
}

#[pymethods]
impl Job {
    /// The partition this job consumes (partition sets only).
    #[getter]
    fn partition(&self) -> Option<&str> {
        self.partition.as_deref()
    }

    /// The calendar slot, as Unix seconds (cron schedules only).
    #[getter]
    fn slot(&self) -> Option<f64> {
        self.slot
    }

    /// The term the job runs in.
    fn term(&self) -> Term {
        Term::new((*self.term).clone())
    }

    /// The job ended: with `error` (a one-line message) if it failed.
    #[pyo3(signature = (error=None))]
    fn done(&self, error: Option<String>) {
        if let Some(reply) = self.reply.lock().ok().and_then(|mut r| r.take()) {
            let _ = reply.send(error.map_or(Ok(()), Err));
        }
    }
}

/// A running partition set or runner: its jobs, and a way to stop it.
#[pyclass(module = "tenure._tenure", frozen)]
pub struct Running {
    jobs: Arc<tokio::sync::Mutex<mpsc::UnboundedReceiver<Job>>>,
    stop: Mutex<Option<oneshot::Sender<()>>>,
    task: Mutex<Option<tokio::task::JoinHandle<PyResult<()>>>>,
}

impl Running {
    /// Start `run` on the runtime; it stops when [`Running::stop`] is
    /// called or the `Running` is dropped.
    fn start<F, R>(run: F) -> PyResult<Running>
    where
        F: FnOnce(mpsc::UnboundedSender<Job>, oneshot::Receiver<()>) -> R,
        R: std::future::Future<Output = PyResult<()>> + Send + 'static,
    {
        crate::not_forked()?;
        let (jobs_tx, jobs) = mpsc::unbounded_channel();
        let (stop, stopped) = oneshot::channel();
        let task = runtime().spawn(run(jobs_tx, stopped));
        Ok(Running {
            jobs: Arc::new(tokio::sync::Mutex::new(jobs)),
            stop: Mutex::new(Some(stop)),
            task: Mutex::new(Some(task)),
        })
    }
}

#[pymethods]
impl Running {
    /// The next job, or None once the run has ended.
    fn next_job(&self) -> Op {
        let jobs = self.jobs.clone();
        Op::new(async move { Ok(Out::Job(jobs.lock().await.recv().await)) })
    }

    /// Ask the run to stop: running work gets the shutdown grace, then
    /// every lease is released.
    fn stop(&self) {
        if let Some(stop) = self.stop.lock().ok().and_then(|mut s| s.take()) {
            let _ = stop.send(());
        }
    }

    /// Ends when the run has: with its error, if it failed.
    fn finished(&self) -> PyResult<Op> {
        let task = self
            .task
            .lock()
            .ok()
            .and_then(|mut t| t.take())
            .ok_or_else(|| {
                pyo3::exceptions::PyRuntimeError::new_err("finished() was called already")
            })?;
        Ok(Op::new(async move {
            match task.await {
                Ok(result) => result.map(|()| Out::None),
                Err(err) => Err(InternalError::new_err(format!(
                    "internal error (a bug in tenure; please report it): the run ended abnormally: {err}"
                ))),
            }
        }))
    }
}

/// Send a job and wait until Python says it is done.
async fn dispatch(
    jobs: &mpsc::UnboundedSender<Job>,
    term: tenure::Leadership,
    partition: Option<String>,
    slot: Option<SystemTime>,
) -> Result<(), String> {
    let (job, done) = Job::new(term, partition, slot);
    if jobs.send(job).is_err() {
        return Err("the run is stopping".to_string());
    }
    match done.await {
        Ok(outcome) => outcome,
        Err(_) => Err("the job was dropped before it reported its end".to_string()),
    }
}

async fn stopped(signal: oneshot::Receiver<()>) {
    let _ = signal.await;
}

/// Run `work` on the election's leader as a [`tenure::Runner`] does.
fn run_with(
    election: &Election,
    grace: Option<f64>,
    work: impl FnOnce(tenure::Runner, mpsc::UnboundedSender<Job>) -> tenure::Runner + Send + 'static,
) -> PyResult<Running> {
    let grace = grace.map(|g| seconds("shutdown_grace", g)).transpose()?;
    let connected = election.connected();
    Running::start(move |jobs, stop| async move {
        let election = connected.await?;
        let mut runner = work(election.runner(), jobs);
        if let Some(grace) = grace {
            runner = runner.shutdown_grace(grace);
        }
        runner.run_until(stopped(stop)).await.map_err(py_err)
    })
}

/// `Runner.every`: a tick at most once per `period` on the leader.
#[pyfunction]
#[pyo3(signature = (election, period, shutdown_grace=None))]
pub fn run_every(
    election: &Election,
    period: f64,
    shutdown_grace: Option<f64>,
) -> PyResult<Running> {
    let period = seconds("period", period)?;
    if period.is_zero() {
        return Err(ConfigError::new_err(
            "invalid configuration: a runner's period must be more than 0 seconds",
        ));
    }
    run_with(election, shutdown_grace, move |runner, jobs| {
        runner.every(period, move |term| {
            let jobs = jobs.clone();
            async move { dispatch(&jobs, term, None, None).await }
        })
    })
}

/// `Runner.cron`: each slot of a calendar schedule, at most once.
#[pyfunction]
#[pyo3(signature = (election, schedule, shutdown_grace=None))]
pub fn run_cron(
    election: &Election,
    schedule: &Schedule,
    shutdown_grace: Option<f64>,
) -> PyResult<Running> {
    let schedule = schedule.inner.clone();
    run_with(election, shutdown_grace, move |runner, jobs| {
        runner.cron(schedule, move |term, slot| {
            let jobs = jobs.clone();
            async move { dispatch(&jobs, term, None, Some(slot)).await }
        })
    })
}

/// `Runner.lead`: one job per term.
#[pyfunction]
#[pyo3(signature = (election, shutdown_grace=None))]
pub fn run_lead(election: &Election, shutdown_grace: Option<f64>) -> PyResult<Running> {
    run_with(election, shutdown_grace, move |runner, jobs| {
        runner.lead(move |term| {
            let jobs = jobs.clone();
            async move {
                // A failed term's work is logged by Python; the runner
                // itself only needs to know it ended.
                let _ = dispatch(&jobs, term, None, None).await;
            }
        })
    })
}

/// A cron expression in a time zone (see the Python class `Schedule`).
#[pyclass(module = "tenure._tenure", frozen)]
pub struct Schedule {
    inner: tenure::Schedule,
}

#[pymethods]
impl Schedule {
    #[new]
    #[pyo3(signature = (expression, *, time_zone=None, starting_deadline=None))]
    fn new(
        expression: &str,
        time_zone: Option<&str>,
        starting_deadline: Option<f64>,
    ) -> PyResult<Schedule> {
        let mut inner = tenure::Schedule::cron(expression).map_err(py_err)?;
        if let Some(zone) = time_zone {
            inner = inner.time_zone(zone).map_err(py_err)?;
        }
        if let Some(deadline) = starting_deadline {
            inner = inner.starting_deadline(seconds("starting_deadline", deadline)?);
        }
        Ok(Schedule { inner })
    }

    #[getter]
    fn expression(&self) -> &str {
        self.inner.expression()
    }

    #[getter]
    fn time_zone(&self) -> &str {
        self.inner.time_zone_name()
    }

    #[getter]
    fn starting_deadline(&self) -> f64 {
        self.inner.deadline().as_secs_f64()
    }

    /// The first slot after `time` (Unix seconds), or None if there is none.
    fn next_after(&self, time: f64) -> PyResult<Option<f64>> {
        let at = UNIX_EPOCH + seconds("time", time)?;
        Ok(self
            .inner
            .next_after(at)
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map(|d| d.as_secs_f64()))
    }
}

/// A group of partitions spread over the members that run it (see the
/// Python class `PartitionSet`).
#[pyclass(module = "tenure._tenure", frozen)]
pub struct PartitionSet {
    group: String,
    partitions: Vec<String>,
    config: Config,
}

#[pymethods]
impl PartitionSet {
    #[new]
    #[pyo3(signature = (group, partitions, store, *, id=None, ttl=None, renew_every=None,
        margin=None, call_timeout=None, prefix=None, max_ttl=None, tls_ca_file=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        group: String,
        partitions: Vec<String>,
        store: String,
        id: Option<String>,
        ttl: Option<f64>,
        renew_every: Option<f64>,
        margin: Option<f64>,
        call_timeout: Option<f64>,
        prefix: Option<String>,
        max_ttl: Option<f64>,
        tls_ca_file: Option<std::path::PathBuf>,
    ) -> PyResult<PartitionSet> {
        let config = Config::new(
            store,
            id,
            ttl,
            renew_every,
            margin,
            call_timeout,
            prefix,
            max_ttl,
            false,
            tls_ca_file,
        )?;
        let prefix = config.prefix.as_deref().unwrap_or(tenure::DEFAULT_PREFIX);
        tenure::validate_name(prefix, &group).map_err(py_err)?;
        for partition in &partitions {
            tenure::validate_name(prefix, partition).map_err(py_err)?;
        }
        Ok(PartitionSet {
            group,
            partitions,
            config,
        })
    }

    #[getter]
    fn group(&self) -> &str {
        &self.group
    }

    #[getter]
    fn id(&self) -> &str {
        &self.config.id
    }

    #[getter]
    fn partitions(&self) -> Vec<String> {
        self.partitions.clone()
    }

    /// Join the group and take a fair share of its partitions: one job per
    /// partition held, until stopped.
    fn run(&self) -> PyResult<Running> {
        let config = self.config.clone();
        let group = self.group.clone();
        let partitions = self.partitions.clone();
        Running::start(move |jobs, stop| async move {
            let mut builder = tenure::PartitionSet::builder(group, partitions)
                .open(config.store())
                .id(config.id.clone());
            if let Some(ttl) = config.ttl {
                builder = builder.ttl(ttl);
            }
            if let Some(every) = config.renew_every {
                builder = builder.renew_every(every);
            }
            if let Some(margin) = config.margin {
                builder = builder.margin(margin);
            }
            if let Some(timeout) = config.call_timeout {
                builder = builder.call_timeout(timeout);
            }
            if let Some(prefix) = &config.prefix {
                builder = builder.prefix(prefix.clone());
            }
            if let Some(max_ttl) = config.max_ttl {
                builder = builder.max_ttl(max_ttl);
            }
            let set = builder.build().await.map_err(py_err)?;
            let work = move |partition: String, term: tenure::Leadership| {
                let jobs = jobs.clone();
                async move {
                    let _ = dispatch(&jobs, term, Some(partition), None).await;
                }
            };
            set.run(work, stopped(stop)).await.map_err(py_err)
        })
    }
}
