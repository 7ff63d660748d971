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
