//! Reading PEM certificates and keys, and noticing that a file changed.

use rustls::crypto::CryptoProvider;
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::path::Path;
use std::sync::Arc;
use std::time::SystemTime;

use super::TlsError;

/// Every certificate of a PEM file (at least one).
pub(super) fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let fail = |reason: String| TlsError::Cert {
        path: path.display().to_string(),
        reason,
    };
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| fail(e.to_string()))?;
    if certs.is_empty() {
        return Err(fail("no CERTIFICATE block found".into()));
    }
    Ok(certs)
}

/// A certificate chain and its private key as one identity; a key that does not belong
/// to the chain's first certificate is refused here rather than at the first handshake.
pub(super) fn identity(
    cert: &Path,
    key: &Path,
    provider: &CryptoProvider,
) -> Result<Arc<CertifiedKey>, TlsError> {
    let chain = certificates(cert)?;
    let der = PrivateKeyDer::from_pem_file(key).map_err(|e| TlsError::Key {
        path: key.display().to_string(),
        reason: e.to_string(),
    })?;
    let identity = CertifiedKey::from_der(chain, der, provider)
        .map_err(|e| TlsError::Config(format!("{} with {}: {e}", cert.display(), key.display())))?;
    Ok(Arc::new(identity))
}

/// What a file looked like when it was last read. Kubernetes swaps a mounted Secret's
/// files through a symlink, so the stamp follows links.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct FileStamp {
    modified: Option<SystemTime>,
    len: u64,
}

impl FileStamp {
    /// The file's stamp now (None: it cannot be read, e.g. in the middle of a swap).
    pub fn of(path: &Path) -> Option<Self> {
        let meta = std::fs::metadata(path).ok()?;
        Some(Self {
            modified: meta.modified().ok(),
            len: meta.len(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir() -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "kvgate-tls-files-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn an_identity_needs_a_key_that_belongs_to_its_certificate() {
        let dir = dir();
        let a = rcgen::generate_simple_self_signed(vec!["a.test".into()]).unwrap();
        let b = rcgen::generate_simple_self_signed(vec!["b.test".into()]).unwrap();
        let (cert, key, other_key) = (dir.join("a.pem"), dir.join("a.key"), dir.join("b.key"));
        std::fs::write(&cert, a.cert.pem()).unwrap();
        std::fs::write(&key, a.signing_key.serialize_pem()).unwrap();
        std::fs::write(&other_key, b.signing_key.serialize_pem()).unwrap();
        let provider = super::super::provider();
        assert!(identity(&cert, &key, &provider).is_ok());
        let mismatch = identity(&cert, &other_key, &provider).unwrap_err();
        assert!(matches!(mismatch, TlsError::Config(_)), "{mismatch}");
        let not_a_cert = identity(&key, &key, &provider).unwrap_err();
        assert!(
            not_a_cert.to_string().contains("no CERTIFICATE block"),
            "{not_a_cert}"
        );
        assert!(matches!(
            identity(&cert, &dir.join("missing.key"), &provider),
            Err(TlsError::Key { .. })
        ));
    }

    #[test]
    fn a_stamp_changes_with_the_file() {
        let dir = dir();
        let path = dir.join("stamp.pem");
        std::fs::write(&path, "one").unwrap();
        let first = FileStamp::of(&path);
        std::fs::write(&path, "two, longer").unwrap();
        assert_ne!(FileStamp::of(&path), first);
        assert_eq!(FileStamp::of(&dir.join("absent")), None);
    }
}
