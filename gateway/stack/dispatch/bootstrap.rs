//! Prefill/decode bootstrap fields: the decode worker finds the prompt's KV on the prefill
//! worker's bootstrap server under a room id that both sides receive.

use serde_json::{Map, Value};

use crate::fleet::Worker;
use crate::secure_random;

/// A fresh room id from the CSPRNG, non-negative as an i64 (SGLang's router uses
/// `u64 & i64::MAX`): a guessable room would let a request read another's KV transfer.
pub fn new_room() -> u64 {
    secure_random::u64() & (i64::MAX as u64)
}

/// Add `bootstrap_host`, `bootstrap_port` and `bootstrap_room` for `prefill` to `body`:
/// scalars for one prompt, lists of `batch` entries (one room per sample) for a batch.
/// Returns the rooms.
pub fn inject(body: &mut Map<String, Value>, prefill: &Worker, batch: usize) -> Vec<u64> {
    let rooms: Vec<u64> = (0..batch.max(1)).map(|_| new_room()).collect();
    let host = Value::from(prefill.bootstrap_host.clone());
    let port = prefill
        .bootstrap_port()
        .map(Value::from)
        .unwrap_or(Value::Null);
    if batch > 1 {
        body.insert("bootstrap_host".into(), Value::Array(vec![host; batch]));
        body.insert("bootstrap_port".into(), Value::Array(vec![port; batch]));
        body.insert(
            "bootstrap_room".into(),
            Value::Array(rooms.iter().map(|&r| Value::from(r)).collect()),
        );
    } else {
        body.insert("bootstrap_host".into(), host);
        body.insert("bootstrap_port".into(), port);
        body.insert("bootstrap_room".into(), Value::from(rooms[0]));
    }
    rooms
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn rooms_are_unique_and_fit_in_i64() {
        let rooms: HashSet<u64> = (0..10_000).map(|_| new_room()).collect();
        assert_eq!(rooms.len(), 10_000);
        assert!(rooms.iter().all(|&r| r <= i64::MAX as u64));
    }
}
