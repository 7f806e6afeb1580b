//! How Knitter's daemons log: `tracing` to standard error, filtered by `RUST_LOG` (default
//! `info`), as text — coloured only for a person at a terminal, never into a file or the
//! journal, and never with `NO_COLOR` set — or as one JSON object a line for log
//! collectors (`--log-format json`). The filter can be changed while the process runs
//! ([`set_filter`]: `knitterctl log set`, as `ovs-appctl vlog/set`).

use std::io::IsTerminal;
use std::sync::{Mutex, OnceLock};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Registry, reload};

/// The running filter, changeable, and its directives as last set.
static FILTER: OnceLock<(reload::Handle<EnvFilter, Registry>, Mutex<String>)> = OnceLock::new();

/// Why a filter was refused.
#[derive(Debug, thiserror::Error)]
pub enum FilterError {
    #[error("filter {0:?}: {1}")]
    Parse(String, String),
    #[error("logging was not set up with a changeable filter")]
    NotInstalled,
    #[error("the filter could not be changed: {0}")]
    Reload(String),
}

/// The shape of log lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

impl std::str::FromStr for LogFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<LogFormat, String> {
        match s {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            _ => Err(format!("unknown log format {s:?} (text or json)")),
        }
    }
}

impl std::fmt::Display for LogFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LogFormat::Text => "text",
            LogFormat::Json => "json",
        })
    }
}

/// Installs the process's subscriber (once, at the start of `main`).
pub fn init(format: LogFormat) {
    let directives = std::env::var("RUST_LOG")
        .ok()
        .filter(|d| EnvFilter::try_new(d).is_ok())
        .unwrap_or_else(|| "info".into());
    let (filter, handle) = reload::Layer::new(EnvFilter::new(&directives));
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let installed = match format {
        LogFormat::Text => {
            tracing_subscriber::registry()
                .with(filter)
                .with(fmt.with_ansi(colour(
                    std::io::stderr().is_terminal(),
                    std::env::var_os("NO_COLOR"),
                )))
                .try_init()
        }
        LogFormat::Json => tracing_subscriber::registry().with(filter).with(fmt.json()).try_init(),
    };
    if installed.is_ok() {
        let _ = FILTER.set((handle, Mutex::new(directives)));
    }
}

/// The filter's directives now (`info`, `knitter_vhost=debug,info`).
pub fn filter() -> Result<String, FilterError> {
    let (_, current) = FILTER.get().ok_or(FilterError::NotInstalled)?;
    Ok(current.lock().unwrap_or_else(|e| e.into_inner()).clone())
}

/// Whether `s` names a level (`error`, `warn`, `info`, `debug`, `trace`, `off`).
pub fn is_level(s: &str) -> bool {
    s.parse::<tracing_subscriber::filter::LevelFilter>().is_ok()
}

/// Replaces the filter with `directives` (`RUST_LOG`'s syntax: `debug`,
/// `knitter_vhost=trace,info`); refused, and the old one kept, when they do not parse.
pub fn set_filter(directives: &str) -> Result<(), FilterError> {
    // RUST_LOG reads a bare word as a module to log everything of, and the rest not at all:
    // a mistyped level (`debgu`) would silence the daemon. A bare word must be a level.
    if let Some(d) = directives.split(',').map(str::trim).find(|d| !d.contains('=') && !is_level(d))
    {
        return Err(FilterError::Parse(
            directives.into(),
            format!(
                "{d:?} is not a level (error, warn, info, debug, trace, off); one module's level is MODULE=LEVEL"
            ),
        ));
    }
    let parsed = EnvFilter::try_new(directives)
        .map_err(|e| FilterError::Parse(directives.into(), e.to_string()))?;
    let (handle, current) = FILTER.get().ok_or(FilterError::NotInstalled)?;
    let mut current = current.lock().unwrap_or_else(|e| e.into_inner());
    handle.reload(parsed).map_err(|e| FilterError::Reload(e.to_string()))?;
    *current = directives.to_string();
    Ok(())
}

/// Colour for a terminal only, and not when `NO_COLOR` is set to anything but "" (no-color.org).
fn colour(terminal: bool, no_color: Option<std::ffi::OsString>) -> bool {
    terminal && no_color.is_none_or(|v| v.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        assert!(colour(true, None));
        assert!(colour(true, Some("".into())));
        assert!(!colour(true, Some("1".into())));
        assert!(!colour(false, None));
    }

    #[test]
    fn formats_parse_and_print() {
        assert_eq!("json".parse::<LogFormat>(), Ok(LogFormat::Json));
        assert_eq!(LogFormat::Text.to_string(), "text");
        assert!("xml".parse::<LogFormat>().unwrap_err().contains("text or json"));
    }
}
