//! The shapes of a shared prefix stream on the wire: the entries of an `XREAD` reply, the
//! ids of an `XREVRANGE` one, and stream ids in Redis's order.

use redis::Value;

/// A stream id `ms-seq` as numbers, ordered as Redis orders ids.
pub(super) fn parse_id(id: &str) -> Option<(u64, u64)> {
    let (ms, seq) = id.split_once('-')?;
    Some((ms.parse().ok()?, seq.parse().ok()?))
}

/// The ids of an `XRANGE`/`XREVRANGE` reply.
pub(super) fn stream_ids(reply: Value) -> Vec<String> {
    let Value::Array(items) = reply else {
        return Vec::new();
    };
    items
        .into_iter()
        .filter_map(|item| match item {
            Value::Array(mut pair) if !pair.is_empty() => match pair.swap_remove(0) {
                Value::BulkString(b) => String::from_utf8(b).ok(),
                Value::SimpleString(s) => Some(s),
                _ => None,
            },
            _ => None,
        })
        .collect()
}

/// One stream entry as another replica wrote it.
#[derive(Debug, Default)]
pub(super) struct Entry {
    pub(super) id: String,
    pub(super) replica: Vec<u8>,
    pub(super) worker: Vec<u8>,
    pub(super) keys: Vec<u8>,
}

impl Entry {
    /// When Redis added it (the id's milliseconds).
    pub(super) fn millis(&self) -> u64 {
        self.id
            .split('-')
            .next()
            .and_then(|ms| ms.parse().ok())
            .unwrap_or(0)
    }
}

/// The entries of an `XREAD` reply of one stream (RESP2 arrays or RESP3 maps), and how
/// many items did not read as one (left out: no id, not the replica, worker and whole keys
/// a replica writes).
pub(super) fn entries(reply: Value) -> (Vec<Entry>, usize) {
    let streams: Vec<Value> = match reply {
        Value::Array(streams) => streams
            .into_iter()
            .filter_map(|s| match s {
                Value::Array(mut pair) if pair.len() == 2 => pair.pop(),
                _ => None,
            })
            .collect(),
        Value::Map(streams) => streams.into_iter().map(|(_, v)| v).collect(),
        _ => return (Vec::new(), 0),
    };
    let bytes = |v: Value| match v {
        Value::BulkString(b) => Some(b),
        Value::SimpleString(s) => Some(s.into_bytes()),
        _ => None,
    };
    let mut out = Vec::new();
    let mut bad = 0;
    for stream in streams {
        let Value::Array(list) = stream else {
            bad += 1;
            continue;
        };
        for item in list {
            let Value::Array(mut pair) = item else {
                bad += 1;
                continue;
            };
            let (Some(Value::Array(fields)), Some(id)) = (pair.pop(), pair.pop()) else {
                bad += 1;
                continue;
            };
            let Some(id) = bytes(id).and_then(|b| String::from_utf8(b).ok()) else {
                bad += 1;
                continue;
            };
            let mut entry = Entry {
                id,
                ..Entry::default()
            };
            let mut fields = fields.into_iter();
            while let (Some(name), Some(value)) = (fields.next(), fields.next()) {
                let (Some(name), Some(value)) = (bytes(name), bytes(value)) else {
                    continue;
                };
                match name.as_slice() {
                    b"r" => entry.replica = value,
                    b"w" => entry.worker = value,
                    b"k" => entry.keys = value,
                    _ => {}
                }
            }
            let whole = !entry.replica.is_empty()
                && !entry.worker.is_empty()
                && !entry.keys.is_empty()
                && entry.keys.len() % 8 == 0;
            if !whole {
                bad += 1;
                // Still read past: the cursor moves on over it.
                entry.replica.clear();
                entry.keys.clear();
            }
            out.push(entry);
        }
    }
    (out, bad)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xread_replies_are_read_as_entries_and_anything_else_left_out() {
        let bulk = |s: &[u8]| Value::BulkString(s.to_vec());
        let entry = |id: &str, r: &[u8]| {
            Value::Array(vec![
                bulk(id.as_bytes()),
                Value::Array(vec![
                    bulk(b"r"),
                    bulk(r),
                    bulk(b"w"),
                    bulk(b"10.0.0.1:30000"),
                    bulk(b"k"),
                    bulk(&[1, 0, 0, 0, 0, 0, 0, 0]),
                    bulk(b"odd"),
                ]),
            ])
        };
        let reply = Value::Array(vec![Value::Array(vec![
            bulk(b"kvgate:prefix:p"),
            Value::Array(vec![
                entry("1700000000000-0", b"a"),
                Value::Int(3),
                entry("1700000000001-4", b"b"),
            ]),
        ])]);
        let (read, bad) = entries(reply);
        assert_eq!(bad, 1, "the number in the list");
        assert_eq!(read.len(), 2);
        assert_eq!(read[0].id, "1700000000000-0");
        assert_eq!(read[0].millis(), 1_700_000_000_000);
        assert_eq!(read[1].replica, b"b");
        assert_eq!(read[1].worker, b"10.0.0.1:30000");
        assert_eq!(read[1].keys.len(), 8);
        assert!(entries(Value::Nil).0.is_empty());
        assert!(entries(Value::Okay).0.is_empty());
    }

    #[test]
    fn an_entry_without_whole_keys_is_bad_but_read_past() {
        let bulk = |s: &[u8]| Value::BulkString(s.to_vec());
        let reply = Value::Array(vec![Value::Array(vec![
            bulk(b"kvgate:prefix:p"),
            Value::Array(vec![Value::Array(vec![
                bulk(b"1700000000000-0"),
                Value::Array(vec![
                    bulk(b"r"),
                    bulk(b"a"),
                    bulk(b"w"),
                    bulk(b"x:1"),
                    bulk(b"k"),
                    bulk(&[1, 2, 3]),
                ]),
            ])]),
        ])]);
        let (read, bad) = entries(reply);
        assert_eq!(bad, 1);
        assert_eq!(read.len(), 1, "the cursor still moves past it");
        assert!(read[0].keys.is_empty());
    }

    #[test]
    fn stream_ids_order_as_redis_orders_them() {
        assert!(parse_id("1700000000000-10") > parse_id("1700000000000-9"));
        assert!(parse_id("1800000000000-0") > parse_id("1700000000000-99"));
        assert_eq!(parse_id("nonsense"), None);
        let bulk = |s: &[u8]| Value::BulkString(s.to_vec());
        let reply = Value::Array(vec![Value::Array(vec![bulk(b"5-1"), Value::Array(vec![])])]);
        assert_eq!(stream_ids(reply), vec!["5-1".to_owned()]);
        assert!(stream_ids(Value::Nil).is_empty());
    }
}
