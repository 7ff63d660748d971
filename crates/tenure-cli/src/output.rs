//! Writing to stdout and stderr without panicking when the reader has gone
//! away (`tenure watch | head`, a log shipper's pipe closing): `println!`
//! and `eprintln!` panic on a closed pipe, and a panic would end `tenure
//! run` without releasing its lease. Every line the CLI writes goes through
//! here, log lines included ([`Stderr`]).
//!
//! A write that fails for any other reason than a reader gone (a full
//! disk, `/dev/full`, an I/O error) must not pass for success: the first
//! such error is kept, and [`exit`] turns it into one line on stderr and
//! exit status 74 (sysexits' EX_IOERR), whatever the command would have
//! exited with. `tenure status --json > f` on a full disk then fails
//! instead of leaving an empty `f` behind a 0.

use std::io::Write;
use std::sync::OnceLock;

/// The first error writing to stdout, other than a closed pipe.
static FAILED_WRITE: OnceLock<String> = OnceLock::new();

/// Write `text` and a newline; false if it could not be written.
pub fn line(text: &str) -> bool {
    let mut out = std::io::stdout().lock();
    checked(writeln!(out, "{text}").and_then(|()| out.flush()))
}

/// Write `text` as it is; false if it could not be written.
pub fn text(text: &str) -> bool {
    let mut out = std::io::stdout().lock();
    checked(write!(out, "{text}").and_then(|()| out.flush()))
}

/// Keep `result`'s error for [`exit`], unless it says the reader went
/// away: that ends `tenure watch | head -1` as intended.
pub fn checked(result: std::io::Result<()>) -> bool {
    match result {
        Ok(()) => true,
        Err(err) if err.kind() == std::io::ErrorKind::BrokenPipe => false,
        Err(err) => {
            let _ = FAILED_WRITE.set(err.to_string());
            false
        }
    }
}

/// End the process with `code`, or with 74 and one line on stderr if a
/// write to stdout failed (see the module doc).
pub fn exit(code: i32) -> ! {
    let flushed = std::io::stdout().lock().flush();
    checked(flushed);
    if let Some(err) = FAILED_WRITE.get() {
        err_line(&format!("tenure: cannot write to stdout: {err}"));
        std::process::exit(crate::exit::CANNOT_WRITE);
    }
    std::process::exit(code)
}

/// Resolves once stdout is a pipe whose reader has gone (`tenure watch |
/// head -1`). A command that writes only when something happens would
/// otherwise learn it at its next line, which may be hours away. The kernel
/// flags the pipe's write end with an error as soon as the last reader
/// closes it; this waits for that flag without writing. Never resolves when
/// stdout is a file or a terminal, which have no reader to lose.
pub async fn stdout_closed() {
    let (closed, wait) = tokio::sync::oneshot::channel();
    // A thread of its own that blocks in poll(2): it holds up neither the
    // runtime nor its shutdown, and ends with the process.
    let watcher = std::thread::Builder::new()
        .name("stdout-watch".into())
        .spawn(move || {
            use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
            let stdout = std::io::stdout();
            // No events asked for: poll reports only an error or a hang-up.
            let mut fds = [PollFd::new(
                std::os::fd::AsFd::as_fd(&stdout),
                PollFlags::empty(),
            )];
            loop {
                match poll(&mut fds, PollTimeout::NONE) {
                    Err(nix::errno::Errno::EINTR) => continue,
                    Ok(_) if fds[0].any() == Some(true) => break,
                    // A file or terminal, or poll failing: never "closed".
                    _ => return,
                }
            }
            let _ = closed.send(());
        });
    if watcher.is_ok() && wait.await.is_ok() {
        return;
    }
    std::future::pending::<()>().await;
}

/// Write `text` and a newline to stderr; a closed stderr is ignored.
pub fn err_line(text: &str) {
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "{text}");
}

/// Stderr for `tracing`: a log line that cannot be written is dropped.
/// (tracing-subscriber reports a failed write with `eprintln!`, which
/// panics when stderr is the thing that failed.)
pub struct Stderr;

impl Write for Stderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let _ = std::io::stderr().write_all(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let _ = std::io::stderr().flush();
        Ok(())
    }
}

/// `println!` that ignores a closed stdout (the demo keeps going so that it
/// still cleans up after itself).
#[macro_export]
macro_rules! say {
    ($($arg:tt)*) => {{
        let _ = $crate::output::line(&format!($($arg)*));
    }};
}

/// `eprintln!` that ignores a closed stderr.
#[macro_export]
macro_rules! complain {
    ($($arg:tt)*) => {{
        $crate::output::err_line(&format!($($arg)*));
    }};
}
