//! Writing to stdout and stderr without panicking when the reader has gone
//! away (`tenure watch | head`, a log shipper's pipe closing): `println!`
//! and `eprintln!` panic on a closed pipe, and a panic would end `tenure
//! run` without releasing its lease. Every line the CLI writes goes through
//! here, log lines included ([`Stderr`]).

use std::io::Write;

/// Write `text` and a newline; false if stdout is closed.
pub fn line(text: &str) -> bool {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{text}").and_then(|()| out.flush()).is_ok()
}

/// Write `text` as it is; false if stdout is closed.
pub fn text(text: &str) -> bool {
    let mut out = std::io::stdout().lock();
    write!(out, "{text}").and_then(|()| out.flush()).is_ok()
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
