//! knitterctl's standard output: a line at a time, and a quiet end (status 141, what a
//! shell reports for SIGPIPE) when the reader has gone.

use std::io::Write;

/// The status a shell gives a process that SIGPIPE ended.
pub const CLOSED_PIPE: i32 = 141;

/// Writes one line to standard output; exits with [`CLOSED_PIPE`] if the reader closed it,
/// with 1 and the reason for any other write error.
pub fn line(args: std::fmt::Arguments) {
    if let Err(e) = writeln!(std::io::stdout().lock(), "{args}") {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(CLOSED_PIPE);
        }
        eprintln!("knitterctl: writing to standard output: {e}");
        std::process::exit(1);
    }
}
