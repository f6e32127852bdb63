//! Reloading certificate files: when they change on disk (polled on
//! `server.tls_watch_interval`), and all at once on SIGHUP or `POST /reload`.

use serde_json::{json, Value};
use std::path::Path;
use std::sync::{Arc, Mutex};

use super::files::FileStamp;
use super::{EngineTls, ServerCert, TlsError};
use crate::metrics;

/// Every certificate of the process and what its files looked like when last read.
#[derive(Debug)]
pub struct CertWatch {
    server: Option<Arc<ServerCert>>,
    engines: Arc<EngineTls>,
    seen: Mutex<Seen>,
}

#[derive(Debug, Default)]
struct Seen {
    server: Vec<Option<FileStamp>>,
    engines: Vec<Option<FileStamp>>,
}

/// What one reload did: `None` where nothing was read again.
#[derive(Debug, Default)]
pub struct Reloaded {
    pub server: Option<Result<(), TlsError>>,
    pub engines: Option<Result<(), TlsError>>,
}

impl Reloaded {
    /// The first failure, if any.
    pub fn error(&self) -> Option<&TlsError> {
        [&self.server, &self.engines]
            .into_iter()
            .find_map(|r| r.as_ref().and_then(|r| r.as_ref().err()))
    }

    /// For the admin port's reload answer.
    pub fn to_json(&self) -> Value {
        let one = |r: &Option<Result<(), TlsError>>| match r {
            None => Value::from("not configured"),
            Some(Ok(())) => Value::from("reloaded"),
            Some(Err(e)) => json!({"error": e.to_string()}),
        };
        json!({"server": one(&self.server), "engines": one(&self.engines)})
    }
}

fn stamps(files: &[&Path]) -> Vec<Option<FileStamp>> {
    files.iter().map(|f| FileStamp::of(f)).collect()
}

impl CertWatch {
    /// Watch the data port's certificate (if TLS is on) and the engines' TLS files.
    pub fn new(server: Option<Arc<ServerCert>>, engines: Arc<EngineTls>) -> Self {
        let seen = Seen {
            server: server
                .as_ref()
                .map(|s| stamps(&s.files()))
                .unwrap_or_default(),
            engines: stamps(&engines.files()),
        };
        Self {
            server,
            engines,
            seen: Mutex::new(seen),
        }
    }

    /// Read again whatever changed since it was last read. A file that fails to load is
    /// reported once; it is tried again when it changes again.
    pub fn reload_changed(&self) -> Reloaded {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        let mut done = Reloaded::default();
        if let Some(server) = &self.server {
            let now = stamps(&server.files());
            if now != seen.server {
                seen.server = now;
                done.server = Some(report("server", server.reload()));
            }
        }
        let now = stamps(&self.engines.files());
        if now != seen.engines {
            seen.engines = now;
            done.engines = Some(report("engines", self.engines.reload()));
        }
        done
    }

    /// Read every certificate file (SIGHUP, `POST /reload`) without using any yet: all of
    /// them load, or none is used (the failure is logged and counted).
    pub fn read_all(&self) -> Result<ReadCertificates, TlsError> {
        let server = match &self.server {
            Some(s) => Some(s.read().map_err(|e| report_failure("server", e))?),
            None => None,
        };
        let engines = if self.engines.files().is_empty() {
            None
        } else {
            Some(
                self.engines
                    .read()
                    .map_err(|e| report_failure("engines", e))?,
            )
        };
        Ok(ReadCertificates { server, engines })
    }

    /// Use what [`Self::read_all`] read, for new connections from now on.
    pub fn install(&self, read: ReadCertificates) -> Reloaded {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        let mut done = Reloaded::default();
        if let (Some(server), Some(identity)) = (&self.server, read.server) {
            server.install(identity);
            seen.server = stamps(&server.files());
            done.server = Some(report("server", Ok(())));
        }
        if let Some(material) = read.engines {
            self.engines.install(material);
            seen.engines = stamps(&self.engines.files());
            done.engines = Some(report("engines", Ok(())));
        }
        done
    }
}

/// Certificates read for a reload, not yet in use.
#[derive(Debug)]
pub struct ReadCertificates {
    server: Option<Arc<rustls::sign::CertifiedKey>>,
    engines: Option<super::engines::EngineMaterial>,
}

/// Log and count a failed read; the error passes through.
fn report_failure(target: &'static str, error: TlsError) -> TlsError {
    let _ = report(target, Err(error.clone()));
    error
}

/// Log and count one reload.
fn report(target: &'static str, result: Result<(), TlsError>) -> Result<(), TlsError> {
    ::metrics::counter!(
        metrics::TLS_RELOADS_TOTAL,
        "target" => target,
        "result" => if result.is_ok() { "ok" } else { "error" }
    )
    .increment(1);
    match &result {
        Ok(()) => tracing::info!(
            target_certificates = target,
            "TLS certificates reloaded: new connections use them, open ones go on"
        ),
        Err(e) => tracing::error!(
            target_certificates = target,
            error = %e,
            "TLS certificates not reloaded: the running ones are kept"
        ),
    }
    result
}
