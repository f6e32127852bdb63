//! Files the config names: resolved against the config file's folder, and checked to exist
//! at load so a typo stops the start instead of the first request that needs the file.

use std::path::{Path, PathBuf};

use super::invalid::Invalid;

/// `path` resolved against `base` (the config file's folder), if that file exists.
pub(super) fn existing_file(base: &Path, path: &Path) -> Result<PathBuf, String> {
    let resolved = if path.is_absolute() {
        path.to_owned()
    } else {
        base.join(path)
    };
    if resolved.is_file() {
        Ok(resolved)
    } else {
        Err(format!(
            "file {} does not exist (relative paths are resolved against the config file's folder)",
            resolved.display()
        ))
    }
}

/// Replace `path` by its resolved form, or name `key` as the file that is missing.
pub(super) fn resolve(base: &Path, path: &mut PathBuf, key: &str) -> Result<(), Invalid> {
    *path = existing_file(base, path).map_err(|reason| Invalid::new(key, reason))?;
    Ok(())
}
