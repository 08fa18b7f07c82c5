//! Versioned key-value storage behind the API server.
//!
//! The contract mirrors what the Kubernetes API machinery needs from etcd v3:
//! a single, monotonically increasing store revision; every write gets the
//! next revision; reads report the revision they observed; a watch replays
//! every change after a given revision, in order, with nothing lost or
//! duplicated; and history older than the compaction point answers
//! [`StoreError::Compacted`] (the API server turns that into 410 Gone).
//!
//! Two backends implement [`Storage`]: an embedded crash-safe store (the
//! default for standalone and development) and etcd v3 (production). One
//! conformance suite runs over both.

use std::pin::Pin;

use futures::Stream;

pub mod embedded;
pub mod etcd;
mod health;
#[cfg(feature = "test-util")]
pub mod testing;

pub use embedded::{EmbeddedOptions, EmbeddedStore};
pub use etcd::{EtcdOptions, EtcdStore};
pub use health::Fault;

/// A store revision. Revision 0 means "nothing written yet"; every write
/// increments the store revision by exactly one.
pub type Revision = u64;

/// One stored key with its value and versions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyValue {
    pub key: String,
    pub value: Vec<u8>,
    /// Revision of the write that created this key (the current incarnation).
    pub create_revision: Revision,
    /// Revision of the last write to this key: the object's resourceVersion.
    pub mod_revision: Revision,
}

/// Options of a range read over a key prefix.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListOptions {
    /// Only keys starting with this prefix.
    pub prefix: String,
    /// Resume after this key (exclusive), for pagination.
    pub start_after: Option<String>,
    /// At most this many items; `None` or `Some(0)` means all.
    pub limit: Option<usize>,
    /// Read the state as of this revision; `None` reads the current state.
    /// A revision older than the compaction point is [`StoreError::Compacted`];
    /// one newer than the current revision is [`StoreError::FutureRevision`].
    pub revision: Option<Revision>,
}

/// The result of a range read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListResult {
    /// Items in ascending key order.
    pub items: Vec<KeyValue>,
    /// The revision the read observed (the requested one, or the current one).
    pub revision: Revision,
    /// How many more keys match after the last returned item (0 when complete).
    pub remaining: u64,
}

/// One change seen by a watch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchEvent {
    /// A key was created or updated. `kv.mod_revision` is the event revision.
    Put {
        kv: KeyValue,
        prev: Option<KeyValue>,
    },
    /// A key was deleted at `revision`; `prev` is its last value.
    Delete { prev: KeyValue, revision: Revision },
    /// No change, but the store has reached `revision` (progress notify):
    /// the API server turns this into a BOOKMARK.
    Progress { revision: Revision },
}

impl WatchEvent {
    /// The revision the event carries.
    pub fn revision(&self) -> Revision {
        match self {
            WatchEvent::Put { kv, .. } => kv.mod_revision,
            WatchEvent::Delete { revision, .. } => *revision,
            WatchEvent::Progress { revision } => *revision,
        }
    }
}

/// A stream of watch events. It ends (or yields an error) when the backend
/// can no longer guarantee a gap-free sequence; the caller resumes from the
/// last revision it saw.
pub type WatchStream = Pin<Box<dyn Stream<Item = Result<WatchEvent, StoreError>> + Send>>;

/// Storage errors. Each maps onto one Kubernetes API status.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// create: the key exists (409 AlreadyExists).
    #[error("key {key:?} already exists")]
    AlreadyExists { key: String },
    /// update/delete: the key does not exist (404 NotFound).
    #[error("key {key:?} not found")]
    NotFound { key: String },
    /// update/delete: the key's mod revision is not the expected one
    /// (409 Conflict). `current` is the value now stored.
    #[error("key {key:?} was modified: expected revision {expected}, found {}", current.mod_revision)]
    Conflict {
        key: String,
        expected: Revision,
        current: Box<KeyValue>,
    },
    /// A read or watch asked for history that was compacted away (410 Gone).
    #[error("revision {requested} has been compacted (oldest available is {compacted})")]
    Compacted {
        requested: Revision,
        compacted: Revision,
    },
    /// A read asked for a revision the store has not reached yet (504/500 in kube, "Too large resource version").
    #[error("revision {requested} is newer than the current revision {current}")]
    FutureRevision {
        requested: Revision,
        current: Revision,
    },
    /// The backend is unreachable or failed (503/500).
    #[error("storage backend error: {0}")]
    Backend(String),
    /// The backend refuses writes since a storage fault (disk full, a failed
    /// fsync, etcd's NOSPACE alarm, etcd unreachable) and is recovering: the
    /// API server answers 503 and `/readyz` fails until a write succeeds again.
    #[error("storage unavailable: {0}")]
    Unavailable(Fault),
}

/// The versioned key-value store the API server registry runs on.
#[async_trait::async_trait]
pub trait Storage: Send + Sync + 'static {
    /// Read one key at the current revision.
    async fn get(&self, key: &str) -> Result<Option<KeyValue>, StoreError>;

    /// Range read over a prefix (see [`ListOptions`]).
    async fn list(&self, opts: &ListOptions) -> Result<ListResult, StoreError>;

    /// Count keys under a prefix at the current revision.
    async fn count(&self, prefix: &str) -> Result<u64, StoreError>;

    /// Create `key`; fails with `AlreadyExists` if present. Returns the new revision.
    async fn create(&self, key: &str, value: Vec<u8>) -> Result<Revision, StoreError>;

    /// Replace `key` only if its mod revision is `expected` (compare-and-swap).
    /// Returns the new revision.
    async fn update(
        &self,
        key: &str,
        value: Vec<u8>,
        expected: Revision,
    ) -> Result<Revision, StoreError>;

    /// Delete `key`, optionally only if its mod revision is `expected`.
    /// Returns the deleted value and the revision of the deletion.
    async fn delete(
        &self,
        key: &str,
        expected: Option<Revision>,
    ) -> Result<(KeyValue, Revision), StoreError>;

    /// Watch every change under `prefix` with a revision strictly greater than
    /// `after`. `after = current revision` means "from now". A revision below
    /// the compaction point fails with `Compacted`.
    async fn watch(&self, prefix: &str, after: Revision) -> Result<WatchStream, StoreError>;

    /// The current store revision.
    async fn current_revision(&self) -> Result<Revision, StoreError>;

    /// Discard history up to and including `revision`.
    async fn compact(&self, revision: Revision) -> Result<(), StoreError>;

    /// Whether the backend is ready to serve writes (the API server's
    /// `/readyz`). It must stay cheap: a backend that saw a write or fsync
    /// fail answers [`StoreError::Unavailable`] from a health flag, cleared
    /// by its next successful write or by a probe (at most one a second),
    /// never by writing on every call. The default reads the revision.
    async fn ready(&self) -> Result<(), StoreError> {
        self.current_revision().await.map(|_| ())
    }
}
