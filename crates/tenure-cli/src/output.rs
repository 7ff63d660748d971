//! Writing to stdout without panicking when the reader has gone away
//! (`tenure watch | head`): `println!` panics on a closed pipe.

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

/// `println!` that ignores a closed stdout (the demo keeps going so that it
/// still cleans up after itself).
#[macro_export]
macro_rules! say {
    ($($arg:tt)*) => {{
        let _ = $crate::output::line(&format!($($arg)*));
    }};
}
