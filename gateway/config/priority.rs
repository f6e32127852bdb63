//! A request's priority class: which requests a saturated pool's queue serves first and
//! which it sheds (`[[tenants]] priority` / `max_priority`, the `x-kvgate-priority` header).

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// A priority class, lowest first: a queue serves every `Critical` request before any
/// `Standard` one, and sheds `Sheddable` ones first when it is full.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize, Serialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Priority {
    /// Batch and background work: queued last, shed first.
    Sheddable,
    /// Interactive work (the default).
    #[default]
    Standard,
    /// Never queued behind a lower class.
    Critical,
}

impl Priority {
    /// Every class, lowest first.
    pub const ALL: [Priority; 3] = [Priority::Sheddable, Priority::Standard, Priority::Critical];

    /// The name used in config, in the header and in metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Priority::Sheddable => "sheddable",
            Priority::Standard => "standard",
            Priority::Critical => "critical",
        }
    }

    /// Position in [`Priority::ALL`] (0 = lowest), for per-class arrays.
    pub fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for Priority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A value that names no class.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not a priority; use one of sheddable, standard, critical")]
pub struct PriorityError(pub String);

impl FromStr for Priority {
    type Err = PriorityError;

    /// The exact lowercase names, surrounding whitespace ignored (header values).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "sheddable" => Ok(Priority::Sheddable),
            "standard" => Ok(Priority::Standard),
            "critical" => Ok(Priority::Critical),
            other => Err(PriorityError(other.to_owned())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_order_parse_and_print() {
        assert!(Priority::Sheddable < Priority::Standard);
        assert!(Priority::Standard < Priority::Critical);
        for p in Priority::ALL {
            assert_eq!(p.as_str().parse::<Priority>(), Ok(p));
            assert_eq!(Priority::ALL[p.index()], p);
        }
        assert_eq!(" critical ".parse::<Priority>(), Ok(Priority::Critical));
        assert!("Critical".parse::<Priority>().is_err());
        assert!("".parse::<Priority>().is_err());
        assert_eq!(Priority::default(), Priority::Standard);
    }
}
