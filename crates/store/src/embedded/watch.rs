//! Gap-free watches over the change log and the commit broadcast.
//!
//! A watch subscribes to the writer's in-process broadcast *before* it reads
//! the log, so every commit is either already in the log when it reads, or
//! arrives on the broadcast afterwards; events it has already sent are
//! dropped by revision (dedupe), and a batch that does not start right after
//! the last revision seen means something was missed, so it re-reads the log.
//! When a slow consumer makes the broadcast lag, the watch also re-reads the
//! log from the last revision it delivered; only if that history was
//! compacted meanwhile does the stream yield `Compacted` and end, so the
//! client resumes with a relist. Nothing is ever skipped silently.
//!
//! Each watch runs as one task feeding a bounded channel: a consumer that
//! stops reading applies back-pressure to its own task only.

use std::sync::Arc;
use std::time::Duration;

use cozyplane_errors::Chain;
use tokio::sync::{broadcast, mpsc};
use tokio::time::Instant;

use super::read::{read_log, EngineError};
use super::writer::Batch;
use super::DbSlot;
use crate::{Revision, StoreError, WatchEvent, WatchStream};

/// How many log entries one catch-up read fetches at a time.
const LOG_CHUNK: usize = 1024;

pub(super) struct WatchTask {
    pub db: Arc<DbSlot>,
    pub prefix: String,
    /// Every event with a revision <= `last` was handled.
    pub last: Revision,
    pub events: broadcast::Receiver<Batch>,
    pub out: mpsc::Sender<Result<WatchEvent, StoreError>>,
    pub progress_interval: Duration,
}

/// Turn the task's output channel into a [`WatchStream`].
pub(super) fn into_stream(rx: mpsc::Receiver<Result<WatchEvent, StoreError>>) -> WatchStream {
    Box::pin(futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    }))
}

/// Why the task stops.
enum Stop {
    /// The consumer dropped the stream.
    Gone,
    /// An error was sent to the consumer; the stream ends after it.
    Failed,
}

impl WatchTask {
    pub async fn run(mut self) {
        let _ = self.run_inner().await;
    }

    async fn run_inner(&mut self) -> Result<(), Stop> {
        self.catch_up().await?;
        let mut idle_until = Instant::now() + self.progress_interval;
        loop {
            tokio::select! {
                msg = self.events.recv() => match msg {
                    Ok(batch) => {
                        let first = batch.first().map(WatchEvent::revision).unwrap_or(0);
                        if first > self.last.saturating_add(1) {
                            // A gap: the log has the missing commits.
                            self.catch_up().await?;
                        }
                        if self.deliver(&batch).await? {
                            idle_until = Instant::now() + self.progress_interval;
                        }
                    }
                    Err(broadcast::error::RecvError::Lagged(_)) => {
                        self.catch_up().await?;
                    }
                    // The store was dropped: end the stream; clients resume elsewhere.
                    Err(broadcast::error::RecvError::Closed) => return Ok(()),
                },
                () = tokio::time::sleep_until(idle_until) => {
                    self.send(Ok(WatchEvent::Progress { revision: self.last })).await?;
                    idle_until = Instant::now() + self.progress_interval;
                }
                () = self.out.closed() => return Err(Stop::Gone),
            }
        }
    }

    /// Send the events of `batch` after `last` that match the prefix.
    /// Returns whether anything was sent.
    async fn deliver(&mut self, batch: &[WatchEvent]) -> Result<bool, Stop> {
        let mut sent = false;
        for event in batch {
            let rev = event.revision();
            if rev <= self.last {
                continue;
            }
            if event_key(event).starts_with(&self.prefix) {
                self.send(Ok(event.clone())).await?;
                sent = true;
            }
            self.last = rev;
        }
        Ok(sent)
    }

    /// Replay the log from `last + 1` to its head, chunk by chunk.
    async fn catch_up(&mut self) -> Result<(), Stop> {
        loop {
            let db = match self.db.get() {
                Ok(db) => db,
                Err(e) => return Err(self.fail(e).await),
            };
            let from = self.last.saturating_add(1);
            let read = tokio::task::spawn_blocking(move || read_log(&db, from, LOG_CHUNK)).await;
            let (events, heads) = match read {
                Ok(Ok(r)) => r,
                Ok(Err(e)) => return Err(self.fail(StoreError::from(e)).await),
                Err(e) => {
                    return Err(self
                        .fail(StoreError::from(EngineError::from(redb_join(e))))
                        .await)
                }
            };
            if self.last < heads.compacted {
                let err = StoreError::Compacted {
                    requested: self.last,
                    compacted: heads.compacted,
                };
                return Err(self.fail(err).await);
            }
            let complete = events.len() < LOG_CHUNK;
            self.deliver(&events).await?;
            if complete {
                self.last = self.last.max(heads.revision);
                return Ok(());
            }
        }
    }

    async fn send(&self, item: Result<WatchEvent, StoreError>) -> Result<(), Stop> {
        self.out.send(item).await.map_err(|_| Stop::Gone)
    }

    async fn fail(&self, err: StoreError) -> Stop {
        match self.send(Err(err)).await {
            Ok(()) => Stop::Failed,
            Err(stop) => stop,
        }
    }
}

fn redb_join(e: tokio::task::JoinError) -> redb::Error {
    redb::Error::Io(std::io::Error::other(format!(
        "log reader task failed: {}",
        Chain(&e)
    )))
}

/// The key an event is about.
pub(super) fn event_key(event: &WatchEvent) -> &str {
    match event {
        WatchEvent::Put { kv, .. } => &kv.key,
        WatchEvent::Delete { prev, .. } => &prev.key,
        WatchEvent::Progress { .. } => "",
    }
}
