//! What a copy tells about itself while it runs: connection steps, the transport, cipher and
//! streams it chose, and warnings. The library never prints; it hands these lines to a
//! [`Log`], and the `fastcp` command prints them on stderr (`-v`, `-vv`; warnings unless
//! `-q`).
//!
//! ```
//! use std::sync::{Arc, Mutex};
//! use fastcp::{Log, LogLevel};
//!
//! let lines = Arc::new(Mutex::new(Vec::new()));
//! let sink = lines.clone();
//! let log = Log::new(move |level, line| sink.lock().unwrap().push((level, line.to_owned())));
//! log.info(|| "connecting".into());
//! assert_eq!(lines.lock().unwrap()[0], (LogLevel::Info, "connecting".to_owned()));
//! Log::default().info(|| unreachable!("a silent log never builds its lines"));
//! ```

use std::fmt;
use std::sync::Arc;

/// How much a line matters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogLevel {
    /// Something the user should know: a fallback, a host key just recorded.
    Warn,
    /// A step or a choice (`fastcp -v`).
    Info,
    /// Detail (`fastcp -vv`).
    Debug,
}

type Sink = dyn Fn(LogLevel, &str) + Send + Sync;

/// Where a copy sends its lines; the default drops them.
#[derive(Clone, Default)]
pub struct Log(Option<Arc<Sink>>);

impl Log {
    /// A log that hands every line to `sink`.
    pub fn new(sink: impl Fn(LogLevel, &str) + Send + Sync + 'static) -> Log {
        Log(Some(Arc::new(sink)))
    }

    /// Sends one line; `line` is only called when someone listens.
    pub fn log(&self, level: LogLevel, line: impl FnOnce() -> String) {
        if let Some(sink) = &self.0 {
            sink(level, &line());
        }
    }

    /// A warning.
    pub fn warn(&self, line: impl FnOnce() -> String) {
        self.log(LogLevel::Warn, line)
    }

    /// A step or choice.
    pub fn info(&self, line: impl FnOnce() -> String) {
        self.log(LogLevel::Info, line)
    }

    /// Detail.
    pub fn debug(&self, line: impl FnOnce() -> String) {
        self.log(LogLevel::Debug, line)
    }

    /// The same log with each line marked as `host`'s (`host: line`), as an error from that
    /// host is: for the lines of one of the two sessions of a copy between two hosts.
    pub(crate) fn for_host(&self, host: &str) -> Log {
        let Some(sink) = self.0.clone() else {
            return Log(None);
        };
        let host = host.to_owned();
        Log::new(move |level, line| sink(level, &format!("{host}: {line}")))
    }
}

impl fmt::Debug for Log {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_some() {
            "Log(..)"
        } else {
            "Log(none)"
        })
    }
}
