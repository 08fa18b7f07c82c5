//! One async mutex per attachment key, created on demand and dropped when
//! nobody holds or waits for it, so the table stays as small as the number
//! of attachments in flight.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard};

/// See the module docs.
#[derive(Debug, Default)]
pub(crate) struct KeyedLocks {
    table: Mutex<HashMap<String, Arc<AsyncMutex<()>>>>,
}

impl KeyedLocks {
    /// Waits for and takes the lock of `key`.
    pub(crate) async fn lock(&self, key: &str) -> OwnedMutexGuard<()> {
        let m = {
            let mut table = self.table.lock().unwrap_or_else(|e| e.into_inner());
            // Drop entries nobody holds or waits for (only the table's Arc left).
            table.retain(|_, m| Arc::strong_count(m) > 1);
            Arc::clone(table.entry(key.to_string()).or_default())
        };
        m.lock_owned().await
    }

    /// How many keys the table holds (tests).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.table.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn same_key_serializes_other_keys_do_not() {
        let locks = Arc::new(KeyedLocks::default());
        let a = locks.lock("a").await;
        // another key is free
        let b = tokio::time::timeout(Duration::from_secs(1), locks.lock("b")).await;
        assert!(b.is_ok());
        // the same key waits until released
        let l2 = Arc::clone(&locks);
        let waiter = tokio::spawn(async move { l2.lock("a").await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished());
        drop(a);
        let held = tokio::time::timeout(Duration::from_secs(1), waiter)
            .await
            .unwrap()
            .unwrap();
        drop(held);
        drop(b);
        // a later lock call prunes the idle entries
        let _c = locks.lock("c").await;
        assert_eq!(locks.len(), 1);
    }
}
