//! Binary encoding of the embedded store's records.
//!
//! A hand-written, length-prefixed little-endian format: it is tiny, has no
//! dependency, and decoding a corrupt record yields an error instead of a
//! panic. Layouts (all integers little-endian):
//!
//! * current state value: `create_rev u64 | mod_rev u64 | value bytes…`
//! * log entry: `tag u8 | key_len u32 | key | …` where the tag says whether
//!   the entry is a put without a previous value (1), a put over an existing
//!   value (2) or a delete (3). A put carries `create_rev u64 | len u32 |
//!   value`; a previous value is `create_rev u64 | mod_rev u64 | len u32 |
//!   value`. The entry's own revision is the log table key.

use crate::{KeyValue, Revision, WatchEvent};

/// A record could not be decoded: the file is corrupt or from another format.
#[derive(Debug, thiserror::Error)]
#[error("corrupt {0} record in the embedded store")]
pub(crate) struct CorruptRecord(&'static str);

/// The current state of one key, as stored in the `kv` table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Record {
    pub create_revision: Revision,
    pub mod_revision: Revision,
    pub value: Vec<u8>,
}

impl Record {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(16 + self.value.len());
        out.extend_from_slice(&self.create_revision.to_le_bytes());
        out.extend_from_slice(&self.mod_revision.to_le_bytes());
        out.extend_from_slice(&self.value);
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, CorruptRecord> {
        let mut r = Reader {
            bytes,
            what: "state",
        };
        let create_revision = r.u64()?;
        let mod_revision = r.u64()?;
        Ok(Record {
            create_revision,
            mod_revision,
            value: r.bytes.to_vec(),
        })
    }

    pub fn into_kv(self, key: String) -> KeyValue {
        KeyValue {
            key,
            value: self.value,
            create_revision: self.create_revision,
            mod_revision: self.mod_revision,
        }
    }
}

const TAG_CREATE: u8 = 1;
const TAG_UPDATE: u8 = 2;
const TAG_DELETE: u8 = 3;

/// Encode the log entry of `event` (a `Put` or `Delete`; never `Progress`).
pub(crate) fn encode_event(event: &WatchEvent) -> Vec<u8> {
    let mut out = Vec::new();
    match event {
        WatchEvent::Put { kv, prev } => {
            out.push(if prev.is_some() {
                TAG_UPDATE
            } else {
                TAG_CREATE
            });
            put_bytes(&mut out, kv.key.as_bytes());
            out.extend_from_slice(&kv.create_revision.to_le_bytes());
            put_bytes(&mut out, &kv.value);
            if let Some(prev) = prev {
                put_prev(&mut out, prev);
            }
        }
        WatchEvent::Delete { prev, .. } => {
            out.push(TAG_DELETE);
            put_bytes(&mut out, prev.key.as_bytes());
            put_prev(&mut out, prev);
        }
        // Progress is never logged; an empty entry would fail to decode loudly.
        WatchEvent::Progress { .. } => {}
    }
    out
}

/// Decode the log entry stored at `revision`.
pub(crate) fn decode_event(revision: Revision, bytes: &[u8]) -> Result<WatchEvent, CorruptRecord> {
    let mut r = Reader { bytes, what: "log" };
    let tag = r.u8()?;
    let key = r.string()?;
    match tag {
        TAG_CREATE | TAG_UPDATE => {
            let create_revision = r.u64()?;
            let value = r.len_bytes()?.to_vec();
            let prev = if tag == TAG_UPDATE {
                Some(r.prev(key.clone())?)
            } else {
                None
            };
            let kv = KeyValue {
                key,
                value,
                create_revision,
                mod_revision: revision,
            };
            Ok(WatchEvent::Put { kv, prev })
        }
        TAG_DELETE => Ok(WatchEvent::Delete {
            prev: r.prev(key)?,
            revision,
        }),
        _ => Err(CorruptRecord("log")),
    }
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    // Writes are checked against `max_value_bytes` (< 4 GiB) before they
    // get here, so the length always fits.
    let len = u32::try_from(bytes.len()).unwrap_or(u32::MAX);
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(bytes);
}

fn put_prev(out: &mut Vec<u8>, prev: &KeyValue) {
    out.extend_from_slice(&prev.create_revision.to_le_bytes());
    out.extend_from_slice(&prev.mod_revision.to_le_bytes());
    put_bytes(out, &prev.value);
}

struct Reader<'a> {
    bytes: &'a [u8],
    what: &'static str,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], CorruptRecord> {
        if self.bytes.len() < n {
            return Err(CorruptRecord(self.what));
        }
        let (head, tail) = self.bytes.split_at(n);
        self.bytes = tail;
        Ok(head)
    }

    fn u8(&mut self) -> Result<u8, CorruptRecord> {
        Ok(self.take(1)?[0])
    }

    fn u64(&mut self) -> Result<u64, CorruptRecord> {
        let b: [u8; 8] = self
            .take(8)?
            .try_into()
            .map_err(|_| CorruptRecord(self.what))?;
        Ok(u64::from_le_bytes(b))
    }

    fn len_bytes(&mut self) -> Result<&'a [u8], CorruptRecord> {
        let b: [u8; 4] = self
            .take(4)?
            .try_into()
            .map_err(|_| CorruptRecord(self.what))?;
        self.take(u32::from_le_bytes(b) as usize)
    }

    fn string(&mut self) -> Result<String, CorruptRecord> {
        let what = self.what;
        String::from_utf8(self.len_bytes()?.to_vec()).map_err(|_| CorruptRecord(what))
    }

    fn prev(&mut self, key: String) -> Result<KeyValue, CorruptRecord> {
        let create_revision = self.u64()?;
        let mod_revision = self.u64()?;
        let value = self.len_bytes()?.to_vec();
        Ok(KeyValue {
            key,
            value,
            create_revision,
            mod_revision,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(key: &str, value: &str, c: u64, m: u64) -> KeyValue {
        KeyValue {
            key: key.into(),
            value: value.as_bytes().to_vec(),
            create_revision: c,
            mod_revision: m,
        }
    }

    #[test]
    fn events_round_trip() {
        let cases = [
            WatchEvent::Put {
                kv: kv("a/b", "v1", 7, 7),
                prev: None,
            },
            WatchEvent::Put {
                kv: kv("a/b", "v2", 7, 9),
                prev: Some(kv("a/b", "v1", 7, 7)),
            },
            WatchEvent::Delete {
                prev: kv("a/b", "", 7, 9),
                revision: 12,
            },
        ];
        for event in cases {
            let bytes = encode_event(&event);
            let decoded = decode_event(event.revision(), &bytes).unwrap();
            assert_eq!(decoded, event);
        }
    }

    #[test]
    fn record_round_trip() {
        let r = Record {
            create_revision: 3,
            mod_revision: 5,
            value: b"xyz".to_vec(),
        };
        let bytes = r.encode();
        assert_eq!(Record::decode(&bytes).unwrap(), r);
    }

    #[test]
    fn truncated_records_are_errors_not_panics() {
        let bytes = encode_event(&WatchEvent::Put {
            kv: kv("k", "value", 1, 2),
            prev: Some(kv("k", "old", 1, 1)),
        });
        for cut in 0..bytes.len() {
            assert!(
                decode_event(2, &bytes[..cut]).is_err(),
                "cut at {cut} decoded"
            );
        }
        assert!(Record::decode(&[1, 2, 3]).is_err());
        assert!(
            decode_event(1, &[9, 0, 0, 0, 0]).is_err(),
            "unknown tag accepted"
        );
    }
}
