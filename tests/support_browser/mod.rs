//! A real headless browser for tests: Debian's `chromium` (or `chromium-browser`), run once
//! per call with a fresh profile in a temp dir and a hard deadline, so it can never hang a
//! test or reuse state between runs. Install it with `apt-get install -y chromium`.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How long one browser run may take (start, load, render, exit).
const DEADLINE: Duration = Duration::from_secs(60);

/// The browser binary.
#[derive(Debug, Clone)]
pub struct Browser {
    binary: &'static str,
}

impl Browser {
    /// `chromium` or `chromium-browser`; fails the test when neither runs.
    pub fn find() -> Self {
        for binary in ["chromium", "chromium-browser"] {
            let runs = Command::new(binary)
                .arg("--version")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if runs {
                return Self { binary };
            }
        }
        panic!("no headless browser: neither `chromium` nor `chromium-browser` runs; apt-get install -y chromium");
    }

    /// The DOM of `url` after it loaded, as the browser serializes it.
    pub fn dump_dom(&self, url: &str) -> String {
        let run = self.run(&["--dump-dom".to_owned(), url.to_owned()]);
        String::from_utf8_lossy(&run).into_owned()
    }

    /// A PNG of `url` at `width` × `height`, written to `path`.
    pub fn screenshot(&self, url: &str, path: &Path, width: u32, height: u32) {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).expect("create the screenshot's directory");
        }
        let _ = std::fs::remove_file(path);
        self.run(&[
            format!("--screenshot={}", path.display()),
            format!("--window-size={width},{height}"),
            "--hide-scrollbars".to_owned(),
            url.to_owned(),
        ]);
        let png = std::fs::read(path).unwrap_or_else(|e| {
            panic!("the browser wrote no screenshot at {}: {e}", path.display())
        });
        assert!(
            png.starts_with(b"\x89PNG"),
            "{} is not a PNG",
            path.display()
        );
    }

    /// Run the browser with `args` in a fresh profile; its stdout. Killed at the deadline.
    fn run(&self, args: &[String]) -> Vec<u8> {
        let dir = fresh_dir();
        let stdout_path = dir.join("stdout");
        let stderr_path = dir.join("stderr");
        // Output goes to files, so a chatty browser never blocks on a full pipe.
        let stdout = std::fs::File::create(&stdout_path).expect("create stdout file");
        let stderr = std::fs::File::create(&stderr_path).expect("create stderr file");
        let mut child = Command::new(self.binary)
            .args([
                "--headless",
                // Tests run as root in containers, where the sandbox cannot start.
                "--no-sandbox",
                "--disable-gpu",
                // Containers often have a tiny /dev/shm.
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--no-default-browser-check",
                "--disable-extensions",
                "--disable-background-networking",
            ])
            .arg(format!("--user-data-dir={}", dir.join("profile").display()))
            .args(args)
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", self.binary));
        let started = Instant::now();
        let status = loop {
            if let Some(status) = child.try_wait().expect("wait for the browser") {
                break status;
            }
            if started.elapsed() > DEADLINE {
                let _ = child.kill();
                let _ = child.wait();
                let log = std::fs::read_to_string(&stderr_path).unwrap_or_default();
                let _ = std::fs::remove_dir_all(&dir);
                panic!(
                    "{} did not finish within {DEADLINE:?} ({args:?}); its log:\n{log}",
                    self.binary
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let out = std::fs::read(&stdout_path).unwrap_or_default();
        let log = std::fs::read_to_string(&stderr_path).unwrap_or_default();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(
            status.success(),
            "{} {args:?} failed ({status}); its log:\n{log}",
            self.binary
        );
        out
    }
}

/// A new empty directory under the system temp dir, unique in this process and across runs.
fn fresh_dir() -> PathBuf {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let dir = std::env::temp_dir().join(format!(
        "kvgate-browser-{}-{nanos}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).expect("create the browser's temp dir");
    dir
}
