//! The audit log: one JSON line per request outcome and per guard trip (I6).
//!
//! Lines carry names, ids, reasons and counts — never prompt or output text, never keys.
//! They go to the configured sink (stderr by default, a file, or nowhere) and the most recent
//! ones are kept in memory for the admin port and tests.

use serde_json::{Map, Value};
use std::collections::VecDeque;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::config::{AuditConfig, AuditSink};

/// How many recent lines are kept in memory.
const RECENT: usize = 1024;

/// The shared audit log.
#[derive(Clone, Debug)]
pub struct AuditLog {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    sink: Mutex<Sink>,
    recent: Mutex<VecDeque<Value>>,
}

#[derive(Debug)]
enum Sink {
    Stderr,
    File(std::fs::File),
    None,
}

impl AuditLog {
    /// Open the configured sink.
    pub fn open(config: &AuditConfig) -> std::io::Result<Self> {
        let sink = match (&config.sink, &config.path) {
            (AuditSink::Stderr, _) => Sink::Stderr,
            (AuditSink::None, _) => Sink::None,
            (AuditSink::File, Some(path)) => Sink::File(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)?,
            ),
            (AuditSink::File, None) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    "audit.sink = \"file\" needs audit.path",
                ))
            }
        };
        Ok(Self {
            inner: Arc::new(Inner {
                sink: Mutex::new(sink),
                recent: Mutex::new(VecDeque::with_capacity(RECENT)),
            }),
        })
    }

    /// Record one event: `fields` plus `ts` and `event`.
    pub fn record(&self, event: &str, fields: Map<String, Value>) {
        let mut line = Map::with_capacity(fields.len() + 2);
        let ts = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or_default();
        line.insert("ts".into(), Value::from(ts));
        line.insert("event".into(), Value::from(event));
        line.extend(fields);
        let line = Value::Object(line);
        if let Ok(mut sink) = self.inner.sink.lock() {
            let text = line.to_string();
            let written = match &mut *sink {
                Sink::Stderr => writeln!(std::io::stderr(), "{text}"),
                Sink::File(f) => writeln!(f, "{text}"),
                Sink::None => Ok(()),
            };
            if let Err(e) = written {
                tracing::warn!(error = %e, "audit line could not be written");
            }
        }
        if let Ok(mut recent) = self.inner.recent.lock() {
            if recent.len() == RECENT {
                recent.pop_front();
            }
            recent.push_back(line);
        }
    }

    /// The most recent lines, oldest first.
    pub fn recent(&self) -> Vec<Value> {
        self.inner
            .recent
            .lock()
            .map(|r| r.iter().cloned().collect())
            .unwrap_or_default()
    }
}
