//! How Knitter's daemons log: `tracing` to standard error, filtered by `RUST_LOG` (default
//! `info`), as text — coloured only for a person at a terminal, never into a file or the
//! journal, and never with `NO_COLOR` set — or as one JSON object a line for log
//! collectors (`--log-format json`).

use std::io::IsTerminal;

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
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let fmt = tracing_subscriber::fmt().with_writer(std::io::stderr).with_env_filter(filter);
    match format {
        LogFormat::Text => fmt.with_ansi(colour(std::io::stderr().is_terminal(), std::env::var_os("NO_COLOR"))).init(),
        LogFormat::Json => fmt.json().init(),
    }
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
