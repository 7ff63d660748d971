//! A runtime that can crash.

use std::future::Future;

/// A tokio runtime of its own (one worker thread) for an instance under
/// test, so that it can vanish as a killed process does: [`Crashable::crash`]
/// drops every task on it without running another step of any, so nothing
/// is resigned or released and its connections close. Dropping it crashes
/// it too.
#[derive(Debug)]
pub struct Crashable {
    runtime: Option<tokio::runtime::Runtime>,
}

impl Crashable {
    /// A new runtime with every driver (time, I/O) enabled.
    ///
    /// # Panics
    /// If the runtime cannot be built (out of threads or file descriptors).
    pub fn start() -> Crashable {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a runtime can be built");
        Crashable {
            runtime: Some(runtime),
        }
    }

    /// Run `task` on the runtime, in the background, until it ends or the
    /// runtime crashes. Nothing happens once crashed.
    pub fn spawn<F>(&self, task: F)
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        if let Some(runtime) = &self.runtime {
            drop(runtime.spawn(task));
        }
    }

    /// Run `future` on the runtime and wait for it, from any thread,
    /// including a task of another runtime (`block_on` cannot run there; a
    /// plain thread of its own can).
    ///
    /// # Panics
    /// If it has crashed, or `future` panics.
    pub fn block_on<F>(&self, future: F) -> F::Output
    where
        F: Future + Send,
        F::Output: Send,
    {
        let runtime = self.runtime.as_ref().expect("not crashed");
        std::thread::scope(|scope| {
            scope
                .spawn(|| runtime.block_on(future))
                .join()
                .expect("the crashable runtime's thread does not panic")
        })
    }

    /// Whether [`Crashable::crash`] has run.
    pub fn crashed(&self) -> bool {
        self.runtime.is_none()
    }

    /// Crash: drop every task without running any more of them (at once;
    /// a task busy on the worker thread finishes its current step in the
    /// background). Again after a crash: nothing.
    pub fn crash(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

impl Drop for Crashable {
    fn drop(&mut self) {
        self.crash();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn a_crash_stops_every_task_before_its_next_step() {
        let mut crashable = Crashable::start();
        let stepped_after = Arc::new(AtomicBool::new(false));
        let started = crashable.block_on(async { 7 });
        assert_eq!(started, 7);
        let flag = stepped_after.clone();
        crashable.spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            flag.store(true, Ordering::SeqCst);
        });
        crashable.crash();
        assert!(crashable.crashed());
        std::thread::sleep(Duration::from_millis(150));
        assert!(!stepped_after.load(Ordering::SeqCst));
        crashable.crash();
    }
}
