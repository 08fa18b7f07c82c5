//! The embedded store: a crash-safe, single-file store on [redb].
//!
//! # Why redb
//! redb is a pure-Rust, copy-on-write B-tree database with ACID
//! transactions: a commit with the default (`Immediate`) durability is
//! fsync'd before it returns, and a crash at any point leaves either the old
//! or the new state, never a torn one. It needs no C toolchain and no
//! separate process, which is exactly what standalone mode wants. Readers
//! get MVCC snapshots and never block the writer.
//!
//! # Layout
//! Three tables (see `read.rs`): `kv` holds the current state (key → value,
//! create and mod revision), `log` holds one entry per revision (the change
//! with the key's previous value), and `meta` holds the current and the
//! compacted revision. A write updates all three in one transaction.
//!
//! # Revisions, point-in-time reads and compaction
//! The store revision starts at 0 and every successful write adds exactly
//! one. A list at an older revision replays the log backwards (see
//! `read.rs`). The log keeps the last [`EmbeddedOptions::history`]
//! revisions: each commit also trims older entries (a bounded chunk at a
//! time), and [`Storage::compact`] trims explicitly. Reads and watches
//! older than the trimmed point answer [`StoreError::Compacted`].
//!
//! # Writes
//! One writer thread, group commit: see `writer.rs`.
//!
//! # Storage faults
//! redb latches the first I/O error of a file (a full disk, a failed fsync)
//! and refuses every later read and write of it until it is reopened. The
//! writer therefore reopens the file itself: after a commit fails for the
//! storage, [`Storage::ready`] answers [`StoreError::Unavailable`], writes
//! fail at once with it, and about once a second the writer drops the
//! database, opens the file again (redb recovers it to its last commit, so
//! every acknowledged write is there and the failed batch is not) and
//! commits a tiny probe write; once that succeeds — with at least
//! [`EmbeddedOptions::recovery_free_bytes`] free on the file system — writes
//! are served again. Readers take the current database from a slot that
//! the writer swaps ([`DbSlot`]); while it is empty they answer
//! `Unavailable` too.
//!
//! # Watches
//! Subscribe-then-read, dedupe by revision, re-read on lag: see `watch.rs`.
//! An idle watch yields [`crate::WatchEvent::Progress`] every
//! [`EmbeddedOptions::progress_interval`] so the API server can send bookmarks.

mod codec;
mod read;
mod watch;
mod writer;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::Duration;

use cozyplane_errors::Chain;
use redb::{Database, ReadableDatabase};
use tokio::sync::{broadcast, mpsc, oneshot};

use crate::health::Health;
use crate::{KeyValue, ListOptions, ListResult, Revision, Storage, StoreError, WatchStream};
use read::{EngineError, Listed};
use writer::{Op, Reply, Request, Writer};

/// Tuning of an [`EmbeddedStore`]. `Default` suits production use.
#[derive(Debug, Clone)]
pub struct EmbeddedOptions {
    /// How many revisions of history (watch resume, old reads) to keep.
    pub history: u64,
    /// An idle watch yields a `Progress` event this often.
    pub progress_interval: Duration,
    /// At most this many writes share one commit (one fsync).
    pub max_batch: usize,
    /// Commits buffered per watch before it falls back to re-reading the log.
    pub watch_lag: usize,
    /// Events buffered between a watch task and its consumer.
    pub watch_buffer: usize,
    /// Largest key plus value accepted by a write (the API server limits
    /// request bodies far below this; the record format caps it at 4 GiB).
    pub max_value_bytes: usize,
    /// After a storage fault, writes resume only once the file system has
    /// this much free space (and a probe write succeeded), so a disk that
    /// is still nearly full does not flap between ready and failing.
    pub recovery_free_bytes: u64,
}

impl Default for EmbeddedOptions {
    fn default() -> Self {
        EmbeddedOptions {
            history: 100_000,
            progress_interval: Duration::from_secs(1),
            max_batch: 1024,
            watch_lag: 1024,
            watch_buffer: 256,
            max_value_bytes: 64 << 20,
            recovery_free_bytes: 16 << 20,
        }
    }
}

/// Revision bookkeeping and write health shared by the writer and the readers.
pub(crate) struct Shared {
    revision: AtomicU64,
    compacted: AtomicU64,
    health: Health,
}

/// The open database, which the writer replaces when it reopens the file
/// after a storage fault (empty meanwhile). Readers take a clone per read
/// and drop it after, so the writer can close the old one.
pub(crate) struct DbSlot {
    path: PathBuf,
    db: RwLock<Option<Arc<Database>>>,
    shared: Arc<Shared>,
}

impl DbSlot {
    /// The current database, or `Unavailable` while the writer reopens it.
    pub(crate) fn get(&self) -> Result<Arc<Database>, StoreError> {
        let db = self
            .db
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match &*db {
            Some(db) => Ok(db.clone()),
            None => Err(self.unavailable()),
        }
    }

    fn unavailable(&self) -> StoreError {
        match self.shared.health.fault() {
            Some(f) => StoreError::Unavailable(f),
            None => StoreError::Backend("embedded store: the database is being reopened".into()),
        }
    }

    /// Take the database out (readers get `Unavailable` until [`DbSlot::put`]).
    fn take(&self) -> Option<Arc<Database>> {
        self.db
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
    }

    fn put(&self, db: Arc<Database>) {
        *self
            .db
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(db);
    }
}

/// The embedded [`Storage`] backend. See the [module docs](self).
pub struct EmbeddedStore {
    db: Arc<DbSlot>,
    shared: Arc<Shared>,
    requests: mpsc::Sender<Request>,
    events: broadcast::Sender<writer::Batch>,
    writer: Mutex<Option<JoinHandle<()>>>,
    options: EmbeddedOptions,
}

impl EmbeddedStore {
    /// Open (or create) the store file at `path` with default options.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        Self::open_with(path, EmbeddedOptions::default())
    }

    /// Open (or create) the store file at `path`.
    pub fn open_with(path: impl AsRef<Path>, options: EmbeddedOptions) -> Result<Self, StoreError> {
        let path = path.as_ref();
        let db = Database::create(path).map_err(|e| {
            StoreError::Backend(format!(
                "embedded store: cannot open {}: {}",
                path.display(),
                Chain(&e)
            ))
        })?;
        let heads = init_tables(&db)?;
        let shared = Arc::new(Shared {
            revision: AtomicU64::new(heads.revision),
            compacted: AtomicU64::new(heads.compacted),
            health: Health::default(),
        });
        let db = Arc::new(DbSlot {
            path: path.to_owned(),
            db: RwLock::new(Some(Arc::new(db))),
            shared: shared.clone(),
        });
        let (events, _) = broadcast::channel(options.watch_lag.max(1));
        let (requests, rx) = mpsc::channel(options.max_batch.max(1) * 4);
        let w = Writer {
            db: db.clone(),
            shared: shared.clone(),
            events: events.clone(),
            max_batch: options.max_batch.max(1),
            history: options.history.max(1),
            recovery_free_bytes: options.recovery_free_bytes,
        };
        let writer = std::thread::Builder::new()
            .name("store-writer".into())
            .spawn(move || w.run(rx))
            .map_err(|e| {
                StoreError::Backend(format!(
                    "embedded store: cannot start writer thread: {}",
                    Chain(&e)
                ))
            })?;
        Ok(EmbeddedStore {
            db,
            shared,
            requests,
            events,
            writer: Mutex::new(Some(writer)),
            options,
        })
    }

    /// Stop the writer (after it finishes queued writes) and close the file.
    /// Watches still open end. Dropping the store does the same without waiting.
    pub fn close(self) -> Result<(), StoreError> {
        let handle = self.writer.lock().ok().and_then(|mut w| w.take());
        drop(self.requests);
        drop(self.events);
        if let Some(handle) = handle {
            handle.join().map_err(|_| {
                StoreError::Backend("embedded store: writer thread panicked".into())
            })?;
        }
        Ok(())
    }

    /// The compaction point: history up to this revision is gone.
    pub fn compacted_revision(&self) -> Revision {
        self.shared.compacted.load(Ordering::Acquire)
    }

    /// Refuse oversized writes before they reach the writer.
    fn check_size(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        let limit = self.options.max_value_bytes.min(u32::MAX as usize);
        if key.len() + value.len() > limit {
            return Err(StoreError::Backend(format!(
                "embedded store: key {key:?} with a value of {} bytes exceeds the limit of {limit} bytes",
                value.len()
            )));
        }
        Ok(())
    }

    async fn submit(&self, op: Op) -> Result<Reply, StoreError> {
        let (reply, rx) = oneshot::channel();
        self.requests
            .send(Request { op, reply })
            .await
            .map_err(|_| writer_gone())?;
        rx.await.map_err(|_| writer_gone())?
    }

    async fn read<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Database) -> Result<T, EngineError> + Send + 'static,
    {
        let db = self.db.get()?;
        tokio::task::spawn_blocking(move || f(&db))
            .await
            .map_err(|e| {
                StoreError::Backend(format!("embedded store: read task failed: {}", Chain(&e)))
            })?
            .map_err(StoreError::from)
    }
}

fn writer_gone() -> StoreError {
    StoreError::Backend("embedded store: the writer thread has stopped".into())
}

/// Create missing tables and read the revision heads.
fn init_tables(db: &Database) -> Result<read::Heads, StoreError> {
    let init = || -> Result<read::Heads, EngineError> {
        let txn = db.begin_write()?;
        txn.open_table(read::KV)?;
        txn.open_table(read::LOG)?;
        txn.open_table(read::META)?;
        txn.commit()?;
        read::heads(&db.begin_read()?)
    };
    Ok(init()?)
}

#[async_trait::async_trait]
impl Storage for EmbeddedStore {
    async fn get(&self, key: &str) -> Result<Option<KeyValue>, StoreError> {
        let key = key.to_owned();
        self.read(move |db| read::get(db, &key)).await
    }

    async fn list(&self, opts: &ListOptions) -> Result<ListResult, StoreError> {
        let opts = opts.clone();
        match self.read(move |db| read::list(db, &opts)).await? {
            Listed::Ok(r) => Ok(r),
            Listed::Compacted {
                requested,
                compacted,
            } => Err(StoreError::Compacted {
                requested,
                compacted,
            }),
            Listed::Future { requested, current } => {
                Err(StoreError::FutureRevision { requested, current })
            }
        }
    }

    async fn count(&self, prefix: &str) -> Result<u64, StoreError> {
        let prefix = prefix.to_owned();
        self.read(move |db| read::count(db, &prefix)).await
    }

    async fn create(&self, key: &str, value: Vec<u8>) -> Result<Revision, StoreError> {
        self.check_size(key, &value)?;
        match self
            .submit(Op::Create {
                key: key.to_owned(),
                value,
            })
            .await?
        {
            Reply::Written(rev) => Ok(rev),
            _ => Err(unexpected_reply()),
        }
    }

    async fn update(
        &self,
        key: &str,
        value: Vec<u8>,
        expected: Revision,
    ) -> Result<Revision, StoreError> {
        self.check_size(key, &value)?;
        match self
            .submit(Op::Update {
                key: key.to_owned(),
                value,
                expected,
            })
            .await?
        {
            Reply::Written(rev) => Ok(rev),
            _ => Err(unexpected_reply()),
        }
    }

    async fn delete(
        &self,
        key: &str,
        expected: Option<Revision>,
    ) -> Result<(KeyValue, Revision), StoreError> {
        match self
            .submit(Op::Delete {
                key: key.to_owned(),
                expected,
            })
            .await?
        {
            Reply::Deleted(kv, rev) => Ok((kv, rev)),
            _ => Err(unexpected_reply()),
        }
    }

    async fn watch(&self, prefix: &str, after: Revision) -> Result<WatchStream, StoreError> {
        // Subscribe first: see watch.rs for why the order matters.
        let events = self.events.subscribe();
        let compacted = self.compacted_revision();
        if after < compacted {
            return Err(StoreError::Compacted {
                requested: after,
                compacted,
            });
        }
        let (out, rx) = mpsc::channel(self.options.watch_buffer.max(1));
        let task = watch::WatchTask {
            db: self.db.clone(),
            prefix: prefix.to_owned(),
            last: after,
            events,
            out,
            progress_interval: self.options.progress_interval,
        };
        tokio::spawn(task.run());
        Ok(watch::into_stream(rx))
    }

    async fn current_revision(&self) -> Result<Revision, StoreError> {
        Ok(self.shared.revision.load(Ordering::Acquire))
    }

    async fn compact(&self, revision: Revision) -> Result<(), StoreError> {
        match self.submit(Op::Compact { revision }).await? {
            Reply::Compacted => Ok(()),
            _ => Err(unexpected_reply()),
        }
    }

    /// The health flag only (the writer probes while it is raised).
    async fn ready(&self) -> Result<(), StoreError> {
        match self.shared.health.fault() {
            Some(f) => Err(StoreError::Unavailable(f)),
            None => Ok(()),
        }
    }
}

fn unexpected_reply() -> StoreError {
    StoreError::Backend("embedded store: writer answered with the wrong reply kind".into())
}
