//! Blocking reads over one redb read transaction (a consistent snapshot).
//!
//! Point-in-time reads: the `kv` table only holds the current state, so a
//! list at an older revision `r` reads the change log from `r + 1` to the
//! head and, for every key touched there, takes the value *before* its first
//! change after `r` (each log entry carries the previous value). That overlay
//! is merged with the current range in key order. Cost: one pass over the
//! current range plus one pass over the log tail, so recent revisions are
//! cheap and anything older than the retained history is `Compacted`.

use std::collections::BTreeMap;
use std::ops::Bound;

use cozyplane_errors::Chain;
use redb::{Database, ReadTransaction, ReadableDatabase, TableDefinition};

use super::codec::{decode_event, CorruptRecord, Record};
use crate::{KeyValue, ListOptions, ListResult, Revision, StoreError, WatchEvent};

/// Current state: key -> encoded [`Record`].
pub(super) const KV: TableDefinition<&str, &[u8]> = TableDefinition::new("kv");
/// Change log: revision -> encoded event (with the previous value).
pub(super) const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("log");
/// Store metadata: [`META_REVISION`], [`META_COMPACTED`], [`META_PROBE`].
pub(super) const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
pub(super) const META_REVISION: &str = "revision";
pub(super) const META_COMPACTED: &str = "compacted";
/// Count of the writer's recovery probes (see `writer.rs`): the one write
/// that tells a reopened file takes writes again, without a new revision.
pub(super) const META_PROBE: &str = "probe";

/// Any failure inside the embedded store's storage engine.
#[derive(Debug, thiserror::Error)]
pub(super) enum EngineError {
    #[error(transparent)]
    Redb(#[from] redb::Error),
    #[error(transparent)]
    Corrupt(#[from] CorruptRecord),
}

macro_rules! redb_from {
    ($($t:ty),*) => {$(
        impl From<$t> for EngineError {
            fn from(e: $t) -> Self {
                EngineError::Redb(e.into())
            }
        }
    )*};
}
redb_from!(
    redb::StorageError,
    redb::TableError,
    redb::TransactionError,
    redb::CommitError,
    redb::DatabaseError
);

impl EngineError {
    /// Whether the storage may have failed, as opposed to a bad record or an
    /// oversized value: those make the writer reopen the file. Deliberately
    /// broad — an I/O error reaches us as `Io`, as a backend error, as a
    /// transaction poisoned part way, or latched as `PreviousIo`, depending
    /// on where redb met it — since a reopen that was not needed costs one
    /// open and one probe write.
    pub(super) fn is_storage_fault(&self) -> bool {
        match self {
            EngineError::Redb(redb::Error::ValueTooLarge(_)) => false,
            EngineError::Redb(_) => true,
            EngineError::Corrupt(_) => false,
        }
    }
}

impl From<EngineError> for StoreError {
    fn from(e: EngineError) -> Self {
        StoreError::Backend(format!("embedded store: {}", Chain(&e)))
    }
}

/// The revision bookkeeping of one snapshot.
#[derive(Debug, Clone, Copy)]
pub(super) struct Heads {
    pub revision: Revision,
    pub compacted: Revision,
}

pub(super) fn heads(txn: &ReadTransaction) -> Result<Heads, EngineError> {
    let meta = txn.open_table(META)?;
    let get = |k| -> Result<u64, EngineError> { Ok(meta.get(k)?.map(|g| g.value()).unwrap_or(0)) };
    Ok(Heads {
        revision: get(META_REVISION)?,
        compacted: get(META_COMPACTED)?,
    })
}

pub(super) fn get(db: &Database, key: &str) -> Result<Option<KeyValue>, EngineError> {
    let txn = db.begin_read()?;
    let kv = txn.open_table(KV)?;
    let found = kv.get(key)?;
    match found {
        Some(g) => Ok(Some(Record::decode(g.value())?.into_kv(key.to_owned()))),
        None => Ok(None),
    }
}

pub(super) fn count(db: &Database, prefix: &str) -> Result<u64, EngineError> {
    let txn = db.begin_read()?;
    let kv = txn.open_table(KV)?;
    let mut n = 0;
    for item in kv.range::<&str>(prefix..)? {
        let (k, _) = item?;
        if !k.value().starts_with(prefix) {
            break;
        }
        n += 1;
    }
    Ok(n)
}

/// Up to `max` log entries with revision >= `from`, plus the snapshot heads.
pub(super) fn read_log(
    db: &Database,
    from: Revision,
    max: usize,
) -> Result<(Vec<WatchEvent>, Heads), EngineError> {
    let txn = db.begin_read()?;
    let heads = heads(&txn)?;
    let log = txn.open_table(LOG)?;
    let mut out = Vec::new();
    for item in log.range(from..)?.take(max) {
        let (rev, bytes) = item?;
        out.push(decode_event(rev.value(), bytes.value())?);
    }
    Ok((out, heads))
}

/// The list outcome before the revision checks are mapped to errors.
pub(super) enum Listed {
    Ok(ListResult),
    Compacted {
        requested: Revision,
        compacted: Revision,
    },
    Future {
        requested: Revision,
        current: Revision,
    },
}

pub(super) fn list(db: &Database, opts: &ListOptions) -> Result<Listed, EngineError> {
    let txn = db.begin_read()?;
    let heads = heads(&txn)?;
    let at = opts.revision.unwrap_or(heads.revision);
    if at > heads.revision {
        return Ok(Listed::Future {
            requested: at,
            current: heads.revision,
        });
    }
    if at < heads.compacted {
        return Ok(Listed::Compacted {
            requested: at,
            compacted: heads.compacted,
        });
    }
    let prefix = opts.prefix.as_str();
    let start_after = opts.start_after.as_deref().filter(|s| *s >= prefix);
    let in_range = |k: &str| k.starts_with(prefix) && start_after.is_none_or(|s| k > s);

    // Keys changed after `at`, with their state as of `at` (None: absent).
    let mut overlay: BTreeMap<String, Option<KeyValue>> = BTreeMap::new();
    if at < heads.revision {
        let log = txn.open_table(LOG)?;
        for item in log.range((at + 1)..)? {
            let (rev, bytes) = item?;
            let (key, before) = match decode_event(rev.value(), bytes.value())? {
                WatchEvent::Put { kv, prev } => (kv.key, prev),
                WatchEvent::Delete { prev, .. } => (prev.key.clone(), Some(prev)),
                WatchEvent::Progress { .. } => continue,
            };
            if in_range(&key) {
                overlay.entry(key).or_insert(before);
            }
        }
    }

    let mut page = Page {
        items: Vec::new(),
        remaining: 0,
        limit: opts.limit.filter(|l| *l > 0).unwrap_or(usize::MAX),
    };

    let kv_table = txn.open_table(KV)?;
    let lower = match start_after {
        Some(s) => Bound::Excluded(s),
        None => Bound::Included(prefix),
    };
    let mut current = kv_table.range::<&str>((lower, Bound::Unbounded))?;
    let mut overlay = overlay.into_iter().peekable();
    loop {
        let next = current.next().transpose()?;
        let next = next.filter(|(k, _)| k.value().starts_with(prefix));
        let Some((key, value)) = next else { break };
        let key = key.value();
        // Overlay keys before this one no longer exist now but did at `at`.
        while let Some((ok, _)) = overlay.peek() {
            if ok.as_str() >= key {
                break;
            }
            if let Some((_, old)) = overlay.next() {
                page.push(old);
            }
        }
        if overlay.peek().is_some_and(|(ok, _)| ok == key) {
            if let Some((_, old)) = overlay.next() {
                page.push(old);
            }
            continue;
        }
        if page.full() {
            // Past the limit only the count matters: skip decoding the value.
            page.remaining += 1;
        } else {
            page.push(Some(Record::decode(value.value())?.into_kv(key.to_owned())));
        }
    }
    for (_, old) in overlay {
        page.push(old);
    }
    Ok(Listed::Ok(ListResult {
        items: page.items,
        revision: at,
        remaining: page.remaining,
    }))
}

/// Collects up to `limit` items and counts the rest.
struct Page {
    items: Vec<KeyValue>,
    remaining: u64,
    limit: usize,
}

impl Page {
    fn full(&self) -> bool {
        self.items.len() >= self.limit
    }

    fn push(&mut self, kv: Option<KeyValue>) {
        if let Some(kv) = kv {
            if self.full() {
                self.remaining += 1;
            } else {
                self.items.push(kv);
            }
        }
    }
}
