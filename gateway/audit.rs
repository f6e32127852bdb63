//! The audit log: one JSON line per request outcome and per guard trip (I6).
//!
//! Lines carry names, ids, reasons and counts — never prompt or output text, never keys.
//! They go to the configured sink (stderr by default, a file, or nowhere) and the most recent
//! ones are kept in memory for the admin port and tests.
//!
//! No request waits on the sink, nor wakes anyone: lines are handed to a dedicated writer
//! thread over a bounded queue ([`QUEUE_LINES`]) that the writer drains every few
//! milliseconds ([`BUSY_PAUSE`], [`IDLE_PAUSE`] when quiet) instead of sleeping on it, so a
//! request's line costs one uncontended queue push, not a futex wake and a context switch.
//! Should the sink fall that far behind, further lines are counted in
//! `kvgate_audit_lines_dropped_total` instead of stalling the request path.

use serde_json::{Map, Value};
use std::collections::VecDeque;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::config::{AuditConfig, AuditSink};

/// How many recent lines are kept in memory.
const RECENT: usize = 1024;

/// Lines waiting for the writer thread at most.
pub const QUEUE_LINES: usize = 65_536;

/// The writer's pause after a drain that wrote lines: how late a line may reach the sink.
pub const BUSY_PAUSE: std::time::Duration = std::time::Duration::from_millis(5);
/// The writer's pause after a drain that found nothing.
pub const IDLE_PAUSE: std::time::Duration = std::time::Duration::from_millis(50);

/// The shared audit log.
#[derive(Clone, Debug)]
pub struct AuditLog {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// To the writer thread; `None` for the `none` sink.
    queue: Option<std::sync::mpsc::SyncSender<Arc<str>>>,
    writer: Option<std::thread::JoinHandle<()>>,
    /// The latest lines as written (parsed again only when read).
    recent: Mutex<VecDeque<Arc<str>>>,
}

impl Drop for Inner {
    /// The last handle is gone (the process is stopping): let the writer write what is
    /// queued before the process exits.
    fn drop(&mut self) {
        self.queue.take();
        if let Some(writer) = self.writer.take() {
            let _ = writer.join();
        }
    }
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
        let (queue, writer) = match sink {
            Sink::None => (None, None),
            sink => {
                let (tx, handle) = spawn_writer(sink)?;
                (Some(tx), Some(handle))
            }
        };
        Ok(Self {
            inner: Arc::new(Inner {
                queue,
                writer,
                recent: Mutex::new(VecDeque::with_capacity(RECENT)),
            }),
        })
    }

    /// Record one event: `fields` plus `ts` and `event`.
    pub fn record(&self, event: &str, fields: Map<String, Value>) {
        self.record_with(event, &fields, &[]);
    }

    /// Record one event: `ts`, `event`, then `base` and `extra` (a field in both is written
    /// once, from `extra`). Serialised straight into the line: no map is built for it.
    pub fn record_with(&self, event: &str, base: &Map<String, Value>, extra: &[(&str, Value)]) {
        let ts = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or_default();
        let mut out = Vec::with_capacity(256);
        out.extend_from_slice(b"{\"ts\":");
        let put = |out: &mut Vec<u8>, key: &str, value: &Value| {
            // Strings and values always serialise into a Vec.
            let _ = serde_json::to_writer(&mut *out, key);
            out.push(b':');
            let _ = serde_json::to_writer(&mut *out, value);
        };
        let _ = serde_json::to_writer(&mut out, &Value::from(ts));
        out.push(b',');
        put(&mut out, "event", &Value::from(event));
        for (key, value) in base {
            if key != "ts" && key != "event" && !extra.iter().any(|(k, _)| k == key) {
                out.push(b',');
                put(&mut out, key, value);
            }
        }
        for (key, value) in extra {
            out.push(b',');
            put(&mut out, key, value);
        }
        out.push(b'}');
        let Ok(line) = String::from_utf8(out) else {
            return;
        };
        // One allocation shared by the queue and the ring.
        let line: Arc<str> = line.into();
        if let Some(queue) = &self.inner.queue {
            if queue.try_send(Arc::clone(&line)).is_err() {
                ::metrics::counter!(crate::metrics::AUDIT_LINES_DROPPED_TOTAL).increment(1);
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
            .map(|r| {
                r.iter()
                    .filter_map(|line| serde_json::from_str(line).ok())
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// The writer thread: drains the queue into `sink`, flushes, pauses; ends when every sender
/// is gone and the queue is empty.
type Writer = (
    std::sync::mpsc::SyncSender<Arc<str>>,
    std::thread::JoinHandle<()>,
);

fn spawn_writer(sink: Sink) -> std::io::Result<Writer> {
    let (tx, rx) = std::sync::mpsc::sync_channel::<Arc<str>>(QUEUE_LINES);
    let handle = std::thread::Builder::new()
        .name("kvgate-audit".into())
        .spawn(move || {
            let out: Box<dyn Write> = match sink {
                Sink::Stderr => Box::new(std::io::stderr()),
                Sink::File(f) => Box::new(f),
                Sink::None => Box::new(std::io::sink()),
            };
            let mut out = std::io::BufWriter::new(out);
            loop {
                let mut wrote = false;
                let open = loop {
                    match rx.try_recv() {
                        Ok(text) => {
                            wrote = true;
                            if let Err(e) = writeln!(out, "{text}") {
                                tracing::warn!(error = %e, "audit line could not be written");
                            }
                        }
                        Err(std::sync::mpsc::TryRecvError::Empty) => break true,
                        Err(std::sync::mpsc::TryRecvError::Disconnected) => break false,
                    }
                };
                if wrote {
                    if let Err(e) = out.flush() {
                        tracing::warn!(error = %e, "audit lines could not be flushed");
                    }
                }
                if !open {
                    return;
                }
                std::thread::sleep(if wrote { BUSY_PAUSE } else { IDLE_PAUSE });
            }
        })?;
    Ok((tx, handle))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_writer_drains_on_its_own_while_the_log_stays_open() {
        let path =
            std::env::temp_dir().join(format!("kvgate-audit-open-{}.jsonl", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let config = AuditConfig {
            sink: AuditSink::File,
            path: Some(path.clone()),
        };
        let log = AuditLog::open(&config).unwrap();
        for i in 0..10 {
            let mut fields = Map::new();
            fields.insert("n".into(), Value::from(i));
            log.record("request", fields);
        }
        // No request wakes the writer: it finds the lines on its next pass.
        let mut lines = 0;
        for _ in 0..200 {
            lines = std::fs::read_to_string(&path)
                .map(|t| t.lines().count())
                .unwrap_or(0);
            if lines == 10 {
                break;
            }
            std::thread::sleep(BUSY_PAUSE);
        }
        assert_eq!(lines, 10);
        assert_eq!(log.recent()[9]["n"], 9);
        drop(log);
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn lines_reach_the_file_by_the_time_the_log_is_dropped() {
        let path = std::env::temp_dir().join(format!("kvgate-audit-{}.jsonl", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let config = AuditConfig {
            sink: AuditSink::File,
            path: Some(path.clone()),
        };
        let log = AuditLog::open(&config).unwrap();
        let copy = log.clone();
        for i in 0..100 {
            let mut fields = Map::new();
            fields.insert("n".into(), Value::from(i));
            copy.record("request", fields);
        }
        assert_eq!(log.recent().len(), 100);
        drop(copy);
        drop(log);
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 100);
        assert!(text.lines().all(|l| l.contains("\"event\":\"request\"")));
        let _ = std::fs::remove_file(&path);
    }
}
