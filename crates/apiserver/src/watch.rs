//! Watches: translate store events into kube watch events for one kind,
//! applying label/field selectors (an object that stops matching is sent
//! as DELETED, one that starts matching as ADDED), with bookmarks,
//! timeouts, resumption from a resourceVersion and streaming initial lists
//! (`sendInitialEvents`).
//!
//! Every open watch holds a [`WatchSlot`] for as long as its producer task
//! (and with it the store watch) lives: the slots count open watches (a
//! gauge, and a test hook) and bound them per user. The producer ends as
//! soon as the response body is dropped (the client went away), not at the
//! watch's timeout.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cozyplane_store::{ListOptions, Revision, StoreError, WatchEvent};
use futures::StreamExt;
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::auth::{UserInfo, MASTERS};
use crate::keys;
use crate::registry::{decode_or_skip, parse_rv, KindEntry, Registry};
use crate::selectors::Selectors;
use crate::status::ApiError;

/// One item of a watch response.
#[derive(Debug, Clone, PartialEq)]
pub enum WatchItem {
    /// `ADDED`, `MODIFIED`, `DELETED` or `BOOKMARK` with its object.
    Event { type_: &'static str, object: Value },
    /// An `ERROR` event carrying a `Status` (e.g. 410 Expired).
    Error(Value),
}

/// Parameters of a watch request.
#[derive(Debug, Clone)]
pub struct WatchParams {
    pub selectors: Selectors,
    pub resource_version: Option<String>,
    pub resource_version_match: Option<String>,
    pub send_initial_events: bool,
    pub allow_bookmarks: bool,
    pub timeout: Duration,
    /// How often to send a BOOKMARK when bookmarks are allowed.
    pub bookmark_interval: Duration,
}

/// Page size of the initial list of a watch.
const INITIAL_PAGE: usize = 500;

/// Events buffered per watcher before the producer waits for the client.
const BUFFER: usize = 256;

/// The default of the per-user limit on open watches
/// ([`crate::ServerBuilder::max_watches_per_user`]).
pub const DEFAULT_MAX_WATCHES_PER_USER: usize = 100;

/// How long a client refused by the watch limit is told to wait
/// (`Retry-After`, as kube-apiserver's max-in-flight filter answers).
const RETRY_AFTER_SECONDS: u32 = 1;

/// The open watches of a server, per user, with a per-user limit. Users in
/// `system:masters` are counted but not limited (as kube's API priority and
/// fairness exempts them).
#[derive(Debug)]
pub struct WatchSlots {
    per_user: usize,
    users: Mutex<HashMap<String, usize>>,
    open: AtomicUsize,
    gauge: prometheus_client::metrics::gauge::Gauge,
}

impl WatchSlots {
    /// Slots with at most `per_user` open watches per user, counted in `gauge`.
    pub fn new(per_user: usize, gauge: prometheus_client::metrics::gauge::Gauge) -> Arc<Self> {
        Arc::new(WatchSlots {
            per_user,
            users: Mutex::default(),
            open: AtomicUsize::new(0),
            gauge,
        })
    }

    /// Take a slot for a watch by `user`, or 429 TooManyRequests when the
    /// user already has the most open watches allowed.
    pub fn acquire(self: &Arc<Self>, user: &UserInfo) -> Result<WatchSlot, ApiError> {
        {
            let mut users = self.users.lock().unwrap_or_else(|p| p.into_inner());
            let n = users.entry(user.name.clone()).or_insert(0);
            if *n >= self.per_user && !user.in_group(MASTERS) {
                return Err(ApiError::too_many_requests(
                    format!(
                        "Too many requests: user {:?} has {} open watches, the limit, please try again later",
                        user.name, self.per_user
                    ),
                    RETRY_AFTER_SECONDS,
                ));
            }
            *n += 1;
        }
        self.open.fetch_add(1, Ordering::Relaxed);
        self.gauge.inc();
        Ok(WatchSlot {
            slots: self.clone(),
            user: user.name.clone(),
        })
    }

    /// How many watches are open now.
    pub fn open(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }
}

/// One open watch's place in [`WatchSlots`], given back when dropped.
#[derive(Debug)]
pub struct WatchSlot {
    slots: Arc<WatchSlots>,
    user: String,
}

impl Drop for WatchSlot {
    fn drop(&mut self) {
        {
            let mut users = self.slots.users.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(n) = users.get_mut(&self.user) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    users.remove(&self.user);
                }
            }
        }
        self.slots.open.fetch_sub(1, Ordering::Relaxed);
        self.slots.gauge.dec();
    }
}

/// Where a watch starts.
enum Start {
    /// List at the current revision, send ADDED for each, then follow.
    Initial { bookmark_end: bool },
    /// Follow changes after this revision.
    After(Revision),
}

fn bookmark(kind: &KindEntry, rev: Revision, initial_end: bool) -> WatchItem {
    let mut metadata = json!({"resourceVersion": rev.to_string()});
    if initial_end {
        metadata["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    WatchItem::Event {
        type_: "BOOKMARK",
        object: json!({"kind": kind.info.kind, "apiVersion": kind.api_version(), "metadata": metadata}),
    }
}

fn plan(params: &WatchParams) -> Result<Start, ApiError> {
    let rv = params.resource_version.as_deref().filter(|s| !s.is_empty());
    let rv_match = params
        .resource_version_match
        .as_deref()
        .filter(|s| !s.is_empty());
    if params.send_initial_events {
        if rv_match != Some("NotOlderThan") {
            return Err(ApiError::bad_request(
                "sendInitialEvents requires resourceVersionMatch=NotOlderThan",
            ));
        }
        if !params.allow_bookmarks {
            return Err(ApiError::bad_request(
                "sendInitialEvents requires allowWatchBookmarks=true",
            ));
        }
        if let Some(r) = rv {
            parse_rv(r)?;
        }
        return Ok(Start::Initial { bookmark_end: true });
    }
    if let Some(m) = rv_match {
        return Err(ApiError::bad_request(format!(
            "resourceVersionMatch {m:?} is only allowed for watch with sendInitialEvents"
        )));
    }
    match rv {
        None | Some("0") => Ok(Start::Initial {
            bookmark_end: false,
        }),
        Some(r) => Ok(Start::After(parse_rv(r)?)),
    }
}

/// Start a watch. Errors before the stream starts are returned directly:
/// a resourceVersion newer than the store's is 504 Too large resource
/// version, as for lists; a compacted one is reported as an `ERROR` event
/// (410), as kube-apiserver does. `closer` ends every open watch when it
/// changes (server shutdown, and a test hook that forces watch breaks).
/// `slot` is held until the watch ends.
pub async fn watch(
    registry: &Registry,
    kind: Arc<KindEntry>,
    namespace: Option<String>,
    params: WatchParams,
    mut closer: tokio::sync::watch::Receiver<u64>,
    slot: WatchSlot,
) -> Result<ReceiverStream<WatchItem>, ApiError> {
    let start = plan(&params)?;
    let store = registry.store().clone();
    let requested = match &start {
        Start::After(rev) => Some(*rev),
        Start::Initial { .. } => params
            .resource_version
            .as_deref()
            .filter(|r| !r.is_empty())
            .map(parse_rv)
            .transpose()?,
    };
    if let Some(rev) = requested {
        let current = store
            .current_revision()
            .await
            .map_err(ApiError::from_store)?;
        if rev > current {
            return Err(ApiError::too_large_resource_version(rev, current));
        }
    }
    let prefix = keys::collection_prefix(&kind.info, namespace.as_deref());
    let (tx, rx) = mpsc::channel(BUFFER);

    let mut initial = Vec::new();
    let (from, bookmark_end) = match start {
        Start::After(rev) => (rev, false),
        Start::Initial { bookmark_end } => {
            let mut start_after = None;
            let mut revision = None;
            loop {
                let page = store
                    .list(&ListOptions {
                        prefix: prefix.clone(),
                        start_after: start_after.clone(),
                        limit: Some(INITIAL_PAGE),
                        revision,
                    })
                    .await
                    .map_err(ApiError::from_store)?;
                revision = Some(page.revision);
                for kv in &page.items {
                    let Some(obj) = decode_or_skip(kv) else {
                        continue;
                    };
                    if params.selectors.matches(&obj) {
                        initial.push(WatchItem::Event {
                            type_: "ADDED",
                            object: obj,
                        });
                    }
                    start_after = Some(kv.key.clone());
                }
                if page.remaining == 0 || page.items.is_empty() {
                    break;
                }
            }
            let rev = match revision {
                Some(r) => r,
                None => store
                    .current_revision()
                    .await
                    .map_err(ApiError::from_store)?,
            };
            (rev, bookmark_end)
        }
    };
    let events = match store.watch(&prefix, from).await {
        Ok(s) => Some(s),
        Err(StoreError::Compacted {
            requested,
            compacted,
        }) => {
            let status = ApiError::expired(format!(
                "too old resource version: {requested} ({compacted})"
            ))
            .to_status();
            let _ = tx.send(WatchItem::Error(status)).await;
            None
        }
        Err(e) => return Err(ApiError::from_store(e)),
    };
    let Some(mut events) = events else {
        return Ok(ReceiverStream::new(rx));
    };
    closer.borrow_and_update();

    tokio::spawn(async move {
        let _slot = slot;
        for item in initial {
            if tx.send(item).await.is_err() {
                return;
            }
        }
        if bookmark_end && tx.send(bookmark(&kind, from, true)).await.is_err() {
            return;
        }
        let mut last_rev = from;
        let deadline = tokio::time::sleep(params.timeout);
        tokio::pin!(deadline);
        let mut ticker = tokio::time::interval(params.bookmark_interval);
        ticker.tick().await;
        loop {
            let item = tokio::select! {
                _ = &mut deadline => return,
                _ = closer.changed() => return,
                // The response body was dropped: the client went away.
                () = tx.closed() => return,
                _ = ticker.tick() => {
                    if params.allow_bookmarks { Some(bookmark(&kind, last_rev, false)) } else { None }
                }
                ev = events.next() => match ev {
                    None => return,
                    Some(Err(StoreError::Compacted { requested, compacted })) => {
                        let status = ApiError::expired(format!("too old resource version: {requested} ({compacted})")).to_status();
                        let _ = tx.send(WatchItem::Error(status)).await;
                        return;
                    }
                    Some(Err(e)) => {
                        let status = ApiError::from_store(e).to_status();
                        let _ = tx.send(WatchItem::Error(status)).await;
                        return;
                    }
                    Some(Ok(ev)) => {
                        last_rev = last_rev.max(ev.revision());
                        match translate(&ev, &params.selectors) {
                            Ok(item) => item,
                            Err(e) => {
                                let _ = tx.send(WatchItem::Error(e.to_status())).await;
                                return;
                            }
                        }
                    }
                }
            };
            if let Some(item) = item {
                if tx.send(item).await.is_err() {
                    return;
                }
            }
        }
    });
    Ok(ReceiverStream::new(rx))
}

/// Turn one store event into at most one watch event for this selection.
fn translate(ev: &WatchEvent, sel: &Selectors) -> Result<Option<WatchItem>, ApiError> {
    Ok(match ev {
        WatchEvent::Put { kv, prev } => {
            let Some(obj) = decode_or_skip(kv) else {
                return Ok(None);
            };
            let now = sel.matches(&obj);
            // A previous value that cannot be decoded was never delivered.
            let before = prev
                .as_ref()
                .and_then(decode_or_skip)
                .map(|p| sel.matches(&p));
            let type_ = match (before, now) {
                (None, true) | (Some(false), true) => "ADDED",
                (Some(true), true) => "MODIFIED",
                (Some(true), false) => "DELETED",
                _ => return Ok(None),
            };
            Some(WatchItem::Event { type_, object: obj })
        }
        WatchEvent::Delete { prev, revision } => {
            let Some(mut obj) = decode_or_skip(prev) else {
                return Ok(None);
            };
            if !sel.matches(&obj) {
                return Ok(None);
            }
            if let Some(m) = crate::meta::meta_mut(&mut obj) {
                m.insert(
                    "resourceVersion".into(),
                    Value::String(revision.to_string()),
                );
            }
            Some(WatchItem::Event {
                type_: "DELETED",
                object: obj,
            })
        }
        WatchEvent::Progress { .. } => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::selectors::LabelSelector;
    use cozyplane_store::KeyValue;

    fn kv(rev: Revision, app: &str) -> KeyValue {
        let v = json!({"metadata": {"name": "a", "labels": {"app": app}}});
        KeyValue {
            key: "/g/x/a".into(),
            value: v.to_string().into_bytes(),
            create_revision: 1,
            mod_revision: rev,
        }
    }

    fn sel(s: &str) -> Selectors {
        Selectors {
            labels: LabelSelector::parse(s).unwrap_or_default(),
            ..Default::default()
        }
    }

    fn type_of(i: Option<WatchItem>) -> Option<&'static str> {
        match i {
            Some(WatchItem::Event { type_, .. }) => Some(type_),
            _ => None,
        }
    }

    #[test]
    fn selection_transitions() {
        let s = sel("app=web");
        let put = |new: &str, prev: Option<&str>| WatchEvent::Put {
            kv: kv(5, new),
            prev: prev.map(|p| kv(4, p)),
        };
        assert_eq!(
            type_of(translate(&put("web", None), &s).ok().flatten()),
            Some("ADDED")
        );
        assert_eq!(
            type_of(translate(&put("web", Some("web")), &s).ok().flatten()),
            Some("MODIFIED")
        );
        assert_eq!(
            type_of(translate(&put("db", Some("web")), &s).ok().flatten()),
            Some("DELETED")
        );
        assert_eq!(
            type_of(translate(&put("web", Some("db")), &s).ok().flatten()),
            Some("ADDED")
        );
        assert_eq!(
            type_of(translate(&put("db", Some("db")), &s).ok().flatten()),
            None
        );
        let del = WatchEvent::Delete {
            prev: kv(4, "web"),
            revision: 9,
        };
        match translate(&del, &s).ok().flatten() {
            Some(WatchItem::Event { type_, object }) => {
                assert_eq!(type_, "DELETED");
                assert_eq!(object["metadata"]["resourceVersion"], "9");
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn plan_validates_streaming_lists() {
        let base = WatchParams {
            selectors: Selectors::default(),
            resource_version: None,
            resource_version_match: None,
            send_initial_events: true,
            allow_bookmarks: true,
            timeout: Duration::from_secs(1),
            bookmark_interval: Duration::from_secs(1),
        };
        assert_eq!(plan(&base).err().map(|e| e.code), Some(400));
        let ok = WatchParams {
            resource_version_match: Some("NotOlderThan".into()),
            ..base.clone()
        };
        assert!(matches!(
            plan(&ok),
            Ok(Start::Initial { bookmark_end: true })
        ));
        let resume = WatchParams {
            send_initial_events: false,
            resource_version: Some("17".into()),
            ..base
        };
        assert!(matches!(plan(&resume), Ok(Start::After(17))));
    }
}
