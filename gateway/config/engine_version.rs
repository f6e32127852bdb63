//! Engine versions as the engines report them, ordered so `min_engine_version` can be
//! enforced.
//!
//! SGLang and vLLM are Python packages and report PEP 440 style strings ("0.5.22",
//! "0.5.3.post1", "0.6.0rc1", "0.6.4.dev12+g1a2b3c"), sometimes with a leading `v` or a
//! local tag after `-` or `+` (the simulator's "0.5.22-sim"). Semver parsers reject most of
//! these, so the order is written out here: release numbers first (missing parts are 0),
//! then `dev` < `a` < `b` < `rc` < the release < `post`. A local tag does not order.

use std::cmp::Ordering;
use std::fmt;

/// Where a version stands relative to its release numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Phase {
    Dev(u64),
    Alpha(u64),
    Beta(u64),
    Candidate(u64),
    Release,
    Post(u64),
}

/// A parsed engine version.
#[derive(Debug, Clone)]
pub struct EngineVersion {
    release: Vec<u64>,
    phase: Phase,
    text: String,
}

/// A version string that cannot be ordered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not an engine version; write e.g. \"0.5.22\" or \"0.5.3.post1\"")]
pub struct VersionError(pub String);

impl EngineVersion {
    /// Parse `text` (see the module docs for what is accepted).
    pub fn parse(text: &str) -> Result<Self, VersionError> {
        let invalid = || VersionError(text.to_owned());
        let trimmed = text.trim();
        let body = trimmed
            .strip_prefix(['v', 'V'])
            .unwrap_or(trimmed)
            // A local tag ("-sim", "+cu124") says how it was built, not which release.
            .split(['+', '-'])
            .next()
            .unwrap_or_default()
            .to_ascii_lowercase();
        let digits_end = body
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(body.len());
        let (numbers, rest) = body.split_at(digits_end);
        let release = numbers
            .trim_end_matches('.')
            .split('.')
            .map(|n| n.parse::<u64>().map_err(|_| invalid()))
            .collect::<Result<Vec<_>, _>>()?;
        let rest = rest.trim_start_matches('.');
        let phase = if rest.is_empty() {
            Phase::Release
        } else {
            let split = rest
                .find(|c: char| c.is_ascii_digit())
                .unwrap_or(rest.len());
            let (tag, n) = rest.split_at(split);
            // Only the first number counts: "dev12.post3" never occurs in practice.
            let n: u64 = n
                .split(|c: char| !c.is_ascii_digit())
                .next()
                .filter(|s| !s.is_empty())
                .map_or(Ok(0), str::parse)
                .map_err(|_| invalid())?;
            match tag.trim_matches(['.', '_']) {
                "dev" => Phase::Dev(n),
                "a" | "alpha" => Phase::Alpha(n),
                "b" | "beta" => Phase::Beta(n),
                "rc" | "c" | "pre" | "preview" => Phase::Candidate(n),
                "post" | "rev" | "r" => Phase::Post(n),
                _ => return Err(invalid()),
            }
        };
        Ok(Self {
            release,
            phase,
            text: trimmed.to_owned(),
        })
    }

    /// The text as reported or configured.
    pub fn as_str(&self) -> &str {
        &self.text
    }
}

impl fmt::Display for EngineVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl PartialEq for EngineVersion {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for EngineVersion {}

impl PartialOrd for EngineVersion {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for EngineVersion {
    fn cmp(&self, other: &Self) -> Ordering {
        let len = self.release.len().max(other.release.len());
        let part = |v: &[u64], i: usize| v.get(i).copied().unwrap_or(0);
        (0..len)
            .map(|i| part(&self.release, i).cmp(&part(&other.release, i)))
            .find(|o| o.is_ne())
            .unwrap_or(Ordering::Equal)
            .then(self.phase.cmp(&other.phase))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> EngineVersion {
        EngineVersion::parse(s).unwrap()
    }

    #[test]
    fn release_numbers_order_numerically_not_as_text() {
        assert!(v("0.5.22") > v("0.5.19"));
        assert!(v("0.5.9") < v("0.5.10"));
        assert!(v("0.6") > v("0.5.99"));
        assert_eq!(v("0.5"), v("0.5.0"));
        assert_eq!(v("v0.5.22"), v("0.5.22"));
    }

    #[test]
    fn pre_and_post_releases_sit_around_their_release() {
        let ordered = [
            "0.6.0.dev3",
            "0.6.0a1",
            "0.6.0b2",
            "0.6.0rc1",
            "0.6.0rc2",
            "0.6.0",
            "0.6.0.post1",
            "0.6.1",
        ];
        for pair in ordered.windows(2) {
            assert!(v(pair[0]) < v(pair[1]), "{} < {}", pair[0], pair[1]);
        }
    }

    #[test]
    fn local_tags_do_not_order() {
        assert_eq!(v("0.5.22-sim"), v("0.5.22"));
        assert_eq!(v("0.6.4.dev12+g1a2b3c"), v("0.6.4.dev12"));
        assert_eq!(v("0.5.22-sim").as_str(), "0.5.22-sim");
    }

    #[test]
    fn nonsense_is_refused() {
        for bad in ["", "latest", "0.5.x", "0.5.22banana"] {
            assert!(EngineVersion::parse(bad).is_err(), "{bad}");
        }
    }
}
