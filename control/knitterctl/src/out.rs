//! knitterctl's standard output: a line at a time, and a quiet end (status 141, what a
//! shell reports for SIGPIPE) when the reader has gone; tables, JSON and YAML.

use crate::Output;
use anyhow::Result;
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

/// Prints rows as aligned columns.
pub(crate) fn table(head: &[&str], rows: Vec<Vec<String>>) {
    let mut w: Vec<usize> = head.iter().map(|h| h.len()).collect();
    for r in &rows {
        for (i, c) in r.iter().enumerate() {
            w[i] = w[i].max(c.len());
        }
    }
    let line = |cells: Vec<String>| {
        let s: Vec<String> =
            cells.iter().enumerate().map(|(i, c)| format!("{c:<0$}", w[i])).collect();
        println!("{}", s.join("  ").trim_end());
    };
    line(head.iter().map(|h| h.to_uppercase()).collect());
    rows.into_iter().for_each(line);
}

pub(crate) fn opt<T: ToString>(v: Option<T>) -> String {
    v.map_or("-".into(), |v| v.to_string())
}

/// Prints `v` as `-o json` or `-o yaml` asks.
pub(crate) fn structured<T: serde::Serialize>(out: Output, v: &T) -> Result<()> {
    match out {
        Output::Yaml => line(format_args!("{}", knitter_api::yaml::to_string(v)?.trim_end())),
        _ => line(format_args!("{}", serde_json::to_string_pretty(v)?)),
    }
    Ok(())
}

/// Prints one record of a stream (events, captured frames): a line of JSON, or a YAML
/// document of its own (`---` first).
pub(crate) fn record<T: serde::Serialize>(out: Output, v: &T) -> Result<()> {
    match out {
        Output::Yaml => line(format_args!("---\n{}", knitter_api::yaml::to_string(v)?.trim_end())),
        _ => line(format_args!("{}", serde_json::to_string(v)?)),
    }
    Ok(())
}
