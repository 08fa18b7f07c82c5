//! The etcd v3 backend (production).
//!
//! Every key lives under a configurable prefix (`/registry/…` style), which
//! is stripped from results, so one etcd can serve several stores. Writes are
//! etcd transactions that compare before they act:
//!
//! * create: `create_revision(key) == 0` → put;
//! * update: `create_revision(key) > 0 && mod_revision(key) == expected` → put,
//!   else read the key to tell `NotFound` from `Conflict`;
//! * delete: the same guard (the mod revision only when one is expected).
//!
//! The `create_revision > 0` guard matters: etcd reports mod revision 0 for
//! a missing key, so `expected = 0` would otherwise resurrect it.
//!
//! # TLS
//! An `https://` endpoint is reached over TLS (rustls). The server's
//! certificate must chain to the CA bundle in [`EtcdTls::ca_pem`], or, when
//! no CA is given, to the system's trust roots (as kube-apiserver does with
//! no `--etcd-cafile`); an etcd run with `--client-cert-auth` also needs a
//! client certificate ([`EtcdTls::client`]). [`EtcdTls::from_files`] reads
//! all of it from files, so no key is ever on a command line. TLS applies to
//! every endpoint: TLS settings with an `http://` endpoint, or `http://` and
//! `https://` endpoints mixed, are refused before anything is dialed.
//!
//! # Connecting
//! [`EtcdStore::connect_with`] dials and reads the current revision, all
//! within [`EtcdOptions::connect_timeout`] + [`EtcdOptions::request_timeout`],
//! and reports why it failed as a [`ConnectError`]: a refused or failed TLS
//! handshake (a client certificate etcd does not trust, a server certificate
//! we do not trust) is [`ConnectError::Tls`], not a hang.
//!
//! # Revisions
//! Revisions are etcd's own: one global counter for the whole etcd cluster.
//! They start at 1 (not 0) and, when other clients or other prefixes write
//! to the same etcd, they skip: our writes get strictly increasing, but not
//! necessarily consecutive, revisions. Reads at an old revision and watches
//! from a revision are served by etcd's MVCC history up to its compaction.
//!
//! # Watches
//! A watch is an etcd watch from `after + 1` with `prev_kv`. When the stream
//! has been idle for [`EtcdOptions::progress_interval`] it asks etcd for a
//! progress notification, which becomes [`WatchEvent::Progress`]. A watch
//! on a compacted revision yields [`StoreError::Compacted`] (either from
//! [`Storage::watch`] itself or as the stream's first item) and ends.
//!
//! # Readiness
//! A write that etcd refuses for the storage — its NOSPACE alarm (the
//! backend reached `--quota-backend-bytes`), or etcd unreachable, without a
//! leader or timing out — raises the store's health flag, and
//! [`Storage::ready`] then answers [`StoreError::Unavailable`]. The next
//! write that succeeds lowers it, and so does a probe that `ready` runs at
//! most once a second while it is raised: the alarm list, answered and
//! empty. Otherwise `ready` reads the revision, as every backend does.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use cozyplane_errors::Chain;
use etcd_client::{
    AlarmAction, AlarmType, Certificate, Client, Compare, CompareOp, ConnectOptions, DeleteOptions,
    EventType, GetOptions, Identity, TlsOptions, Txn, TxnOp, TxnOpResponse, TxnResponse,
    WatchOptions, WatchResponse,
};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::health::Health;
use crate::{
    KeyValue, ListOptions, ListResult, Revision, Storage, StoreError, WatchEvent, WatchStream,
};

/// Tuning of an [`EtcdStore`].
#[derive(Debug, Clone)]
pub struct EtcdOptions {
    /// An idle watch asks etcd for a progress notification this often.
    pub progress_interval: Duration,
    /// Timeout to establish a connection.
    pub connect_timeout: Duration,
    /// Timeout of one request (not of a watch stream).
    pub request_timeout: Duration,
    /// Events buffered between a watch task and its consumer.
    pub watch_buffer: usize,
    /// Largest etcd response accepted (the client's default is 4 MiB).
    pub max_response_bytes: usize,
    /// A list asking for more keys than this reads them in several range
    /// requests at one pinned revision, so no response grows unbounded.
    pub list_chunk: usize,
    /// TLS settings for `https://` endpoints (see the [module docs](self#tls)).
    /// `None` with `https://` endpoints: the system's roots, no client
    /// certificate.
    pub tls: Option<EtcdTls>,
}

impl Default for EtcdOptions {
    fn default() -> Self {
        EtcdOptions {
            progress_interval: Duration::from_secs(1),
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(10),
            watch_buffer: 256,
            max_response_bytes: 256 << 20,
            list_chunk: 1000,
            tls: None,
        }
    }
}

/// TLS to etcd: PEM contents, checked to hold what they should.
#[derive(Clone, Default)]
pub struct EtcdTls {
    /// CA bundle the servers' certificates must chain to; `None` trusts
    /// the system's roots.
    pub ca_pem: Option<Vec<u8>>,
    /// Client certificate (chain) and private key shown to etcd.
    pub client: Option<ClientIdentity>,
}

/// A client certificate (chain) and its private key, PEM.
#[derive(Clone)]
pub struct ClientIdentity {
    pub cert_pem: Vec<u8>,
    pub key_pem: Vec<u8>,
}

impl std::fmt::Debug for EtcdTls {
    // Never prints key material.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdTls")
            .field("ca", &self.ca_pem.as_ref().map(|_| "<pem>"))
            .field("client", &self.client.as_ref().map(|_| "<cert and key>"))
            .finish()
    }
}

impl EtcdTls {
    /// Read the CA bundle and the client certificate and key from PEM files
    /// (`--etcd-cafile`, `--etcd-certfile`, `--etcd-keyfile`). `Ok(None)`
    /// when no file is given. A certificate needs its key and the other way
    /// round; each file must hold what it is for.
    pub fn from_files(
        ca: Option<&Path>,
        cert: Option<&Path>,
        key: Option<&Path>,
    ) -> Result<Option<Self>, ConnectError> {
        let client = match (cert, key) {
            (None, None) => None,
            (Some(cert), Some(key)) => {
                let cert_pem = read_pem(cert, PemKind::Certificate)?;
                let key_pem = read_pem(key, PemKind::PrivateKey)?;
                Some(ClientIdentity { cert_pem, key_pem })
            }
            _ => return Err(ConnectError::IncompleteIdentity),
        };
        let ca_pem = ca.map(|p| read_pem(p, PemKind::Certificate)).transpose()?;
        if ca_pem.is_none() && client.is_none() {
            return Ok(None);
        }
        Ok(Some(EtcdTls { ca_pem, client }))
    }
}

/// What a PEM file given for etcd TLS must hold.
#[derive(Debug, Clone, Copy)]
pub enum PemKind {
    Certificate,
    PrivateKey,
}

impl std::fmt::Display for PemKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PemKind::Certificate => "certificate",
            PemKind::PrivateKey => "private key",
        })
    }
}

fn read_pem(path: &Path, kind: PemKind) -> Result<Vec<u8>, ConnectError> {
    let pem = std::fs::read(path).map_err(|source| ConnectError::ReadFile {
        path: path.to_path_buf(),
        source,
    })?;
    let found = match kind {
        PemKind::Certificate => rustls_pemfile::certs(&mut pem.as_slice()).any(|c| c.is_ok()),
        PemKind::PrivateKey => matches!(
            rustls_pemfile::private_key(&mut pem.as_slice()),
            Ok(Some(_))
        ),
    };
    if !found {
        return Err(ConnectError::BadPem {
            path: path.to_path_buf(),
            kind,
        });
    }
    Ok(pem)
}

/// Why [`EtcdStore::connect_with`] failed.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("etcd: no endpoint given")]
    NoEndpoint,
    #[error("etcd: cannot read {path}")]
    ReadFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("etcd: {path}: no {kind} found in PEM")]
    BadPem { path: PathBuf, kind: PemKind },
    #[error("etcd: a client certificate needs its key, and a key its certificate")]
    IncompleteIdentity,
    /// TLS is in use (TLS files given, or another endpoint is `https://`)
    /// but this endpoint is not `https://`.
    #[error("etcd: endpoint {endpoint:?} is not https:// but TLS is in use (TLS files given or another endpoint is https://)")]
    PlainEndpoint { endpoint: String },
    /// The endpoints or TLS material were refused by the client library
    /// (a malformed URL, a key that does not match its certificate, no
    /// system roots to trust).
    #[error("etcd: invalid connection settings")]
    Settings(#[source] etcd_client::Error),
    /// The TLS handshake failed: etcd refused our client certificate (or
    /// its absence), or its certificate is not one we trust.
    #[error("etcd: TLS handshake with {endpoints} failed: {detail}")]
    Tls { endpoints: String, detail: String },
    /// No answer: nothing listens, or the network drops packets.
    #[error("etcd: cannot reach {endpoints}: {detail}")]
    Unreachable { endpoints: String, detail: String },
    /// No answer within the connect and request timeouts.
    #[error("etcd: {endpoints} did not answer within {timeout:?}")]
    Timeout {
        endpoints: String,
        timeout: Duration,
    },
    /// Connected, but the first read failed.
    #[error("etcd: the first read failed")]
    Read(#[source] StoreError),
}

impl From<ConnectError> for StoreError {
    fn from(e: ConnectError) -> Self {
        StoreError::Backend(Chain(&e).to_string())
    }
}

/// The etcd [`Storage`] backend. See the [module docs](self).
#[derive(Clone)]
pub struct EtcdStore {
    client: Client,
    prefix: String,
    options: EtcdOptions,
    health: Arc<Health>,
}

impl EtcdStore {
    /// Connect to etcd at `endpoints` (e.g. `http://127.0.0.1:2379`) and keep
    /// every key under `prefix`. Fails unless etcd answers a read.
    ///
    /// The prefix is a directory: a `/` is appended when it does not end in
    /// one, so stores on `/a` and `/a2` can never see each other's keys.
    pub async fn connect<E: AsRef<str>>(
        endpoints: &[E],
        prefix: &str,
    ) -> Result<Self, ConnectError> {
        Self::connect_with(endpoints, prefix, EtcdOptions::default()).await
    }

    /// [`EtcdStore::connect`] with explicit options (TLS among them). Gives
    /// up after `connect_timeout + request_timeout` (see the
    /// [module docs](self#connecting)).
    pub async fn connect_with<E: AsRef<str>>(
        endpoints: &[E],
        prefix: &str,
        options: EtcdOptions,
    ) -> Result<Self, ConnectError> {
        if endpoints.is_empty() {
            return Err(ConnectError::NoEndpoint);
        }
        let mut connect = ConnectOptions::new()
            .with_connect_timeout(options.connect_timeout)
            .with_timeout(options.request_timeout);
        // What TLS is in use (an https:// endpoint with no settings: system
        // roots, no client certificate), to explain a failure.
        let mut tls = None;
        if let Some(tls_options) = tls_options(endpoints, options.tls.as_ref())? {
            connect = connect.with_tls(tls_options);
            tls = Some(options.tls.clone().unwrap_or_default());
        }
        let names = endpoints
            .iter()
            .map(AsRef::as_ref)
            .collect::<Vec<_>>()
            .join(",");
        let bound = options.connect_timeout + options.request_timeout;
        let attempt = async {
            let client = Client::connect(endpoints, Some(connect))
                .await
                .map_err(ConnectError::Settings)?;
            let store = EtcdStore {
                client,
                prefix: dir_prefix(prefix),
                options,
                health: Arc::default(),
            };
            match store.count_all().await {
                Ok(resp) => header_revision(resp.header())
                    .map(|_| store)
                    .map_err(ConnectError::Read),
                Err(e) => Err(connect_error(e, &names, tls.as_ref())),
            }
        };
        match tokio::time::timeout(bound, attempt).await {
            Ok(result) => result,
            Err(_) => Err(ConnectError::Timeout {
                endpoints: names,
                timeout: bound,
            }),
        }
    }

    /// Count the keys of this store: the cheapest read that reports the
    /// current revision.
    async fn count_all(&self) -> Result<etcd_client::GetResponse, etcd_client::Error> {
        let full = self.full("");
        let get = GetOptions::new()
            .with_range(prefix_end(full.as_bytes()))
            .with_count_only();
        self.kv().get(full, Some(get)).await
    }

    /// The key prefix every key of this store lives under.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    fn kv(&self) -> etcd_client::KvClient {
        self.client
            .kv_client()
            .max_decoding_message_size(self.options.max_response_bytes)
    }

    fn full(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    fn convert(&self, kv: &etcd_client::KeyValue) -> Result<KeyValue, StoreError> {
        let key = std::str::from_utf8(kv.key())
            .ok()
            .and_then(|k| k.strip_prefix(self.prefix.as_str()))
            .ok_or_else(|| {
                StoreError::Backend(format!(
                    "etcd: key {:?} outside prefix {:?}",
                    kv.key(),
                    self.prefix
                ))
            })?;
        Ok(KeyValue {
            key: key.to_owned(),
            value: kv.value().to_vec(),
            create_revision: rev(kv.create_revision()),
            mod_revision: rev(kv.mod_revision()),
        })
    }

    /// Run a write transaction, keeping the health flag (see the module docs).
    async fn write(&self, txn: Txn) -> Result<TxnResponse, StoreError> {
        match self.kv().txn(txn).await {
            Ok(resp) => {
                self.health.recovered();
                Ok(resp)
            }
            Err(e) => {
                if refuses_writes(&e) {
                    self.health.failed("etcd", Chain(&e).to_string());
                }
                Err(backend(e))
            }
        }
    }

    /// The probe of a raised health flag: etcd answers and has no alarm.
    async fn probe(&self) {
        match self
            .client
            .maintenance_client()
            .alarm(AlarmAction::Get, AlarmType::None, None)
            .await
        {
            Ok(resp) if resp.alarms().is_empty() => self.health.recovered(),
            Ok(resp) => {
                let alarms: Vec<String> = resp
                    .alarms()
                    .iter()
                    .map(|a| format!("{:?} on member {:x}", a.alarm(), a.member_id()))
                    .collect();
                self.health
                    .failed("etcd", format!("alarm raised: {}", alarms.join(", ")));
            }
            Err(e) => self.health.failed("etcd", Chain(&e).to_string()),
        }
    }

    /// Map a failed guarded write: read the key to tell NotFound from Conflict.
    fn guard_failed(&self, key: &str, expected: Revision, resp: &TxnResponse) -> StoreError {
        let current = resp.op_responses().into_iter().find_map(|op| match op {
            TxnOpResponse::Get(g) => g.kvs().first().map(|kv| self.convert(kv)),
            _ => None,
        });
        match current {
            None => StoreError::NotFound {
                key: key.to_owned(),
            },
            Some(Err(e)) => e,
            Some(Ok(current)) => StoreError::Conflict {
                key: key.to_owned(),
                expected,
                current: Box::new(current),
            },
        }
    }

    /// Map an error of a read at `requested`.
    async fn revision_error(&self, e: etcd_client::Error, requested: Revision) -> StoreError {
        match classify(&e) {
            Some(RevisionError::Compacted) => {
                // etcd does not say where it compacted: `requested + 1` is a lower bound.
                StoreError::Compacted {
                    requested,
                    compacted: requested + 1,
                }
            }
            Some(RevisionError::Future) => match self.current_revision().await {
                Ok(current) => StoreError::FutureRevision { requested, current },
                Err(err) => err,
            },
            None => backend(e),
        }
    }
}

/// `prefix` as a directory (ending in `/`); empty stays empty (the whole keyspace).
fn dir_prefix(prefix: &str) -> String {
    if prefix.is_empty() || prefix.ends_with('/') {
        prefix.to_owned()
    } else {
        format!("{prefix}/")
    }
}

fn rev(r: i64) -> Revision {
    Revision::try_from(r).unwrap_or(0)
}

/// The TLS options for `endpoints`: `None` when every endpoint is plain
/// `http://` and no TLS is configured.
fn tls_options<E: AsRef<str>>(
    endpoints: &[E],
    tls: Option<&EtcdTls>,
) -> Result<Option<TlsOptions>, ConnectError> {
    let https = endpoints.iter().any(|e| e.as_ref().starts_with("https://"));
    if !https && tls.is_none() {
        return Ok(None);
    }
    if let Some(plain) = endpoints
        .iter()
        .find(|e| !e.as_ref().starts_with("https://"))
    {
        return Err(ConnectError::PlainEndpoint {
            endpoint: plain.as_ref().to_owned(),
        });
    }
    let mut options = TlsOptions::new();
    match tls.and_then(|t| t.ca_pem.as_ref()) {
        Some(ca) => options = options.ca_certificate(Certificate::from_pem(ca)),
        None => options = options.with_enabled_roots(),
    }
    if let Some(id) = tls.and_then(|t| t.client.as_ref()) {
        options = options.identity(Identity::from_pem(&id.cert_pem, &id.key_pem));
    }
    Ok(Some(options))
}

/// Classify the failure of the first request on a new connection.
fn connect_error(e: etcd_client::Error, endpoints: &str, tls: Option<&EtcdTls>) -> ConnectError {
    let endpoints = endpoints.to_owned();
    let (etcd_client::Error::GRpcStatus(status), Some(tls)) = (&e, tls) else {
        return ConnectError::Unreachable {
            endpoints,
            detail: Chain(&e).to_string(),
        };
    };
    // What a refused client certificate means, for the cases below.
    let refused = if tls.client.is_some() {
        "etcd refuses the client certificate: is it signed by a CA in etcd's --trusted-ca-file?"
    } else {
        "etcd requires a client certificate (--client-cert-auth) and none was given"
    };
    let detail = match tls_failure(status) {
        // Our side of the handshake failed: rustls says why.
        Some(TlsFailure::Rustls(err @ rustls::Error::InvalidCertificate(_))) => format!(
            "etcd's certificate is not trusted ({err}); its CA belongs in the CA file{}",
            if tls.ca_pem.is_some() {
                ""
            } else {
                " (none was given, so only the system's roots are trusted)"
            }
        ),
        Some(TlsFailure::Rustls(err @ rustls::Error::AlertReceived(_))) => {
            format!("{err}: {refused}")
        }
        Some(TlsFailure::Rustls(err)) => err.to_string(),
        // etcd's alert, passed on as text by the HTTP/2 client.
        Some(TlsFailure::Text(text)) => format!("{text}: {refused}"),
        // With TLS 1.3 our side of the handshake is done before etcd checks
        // the client certificate; its refusal then often reaches us only as
        // the connection closed under our first request (the HTTP/2 client
        // cancels it, or its write finds a broken pipe or a reset), the
        // alert lost.
        Some(TlsFailure::Closed) => format!(
            "etcd closed the connection right after the TLS handshake, as it does when {refused}"
        ),
        None if status.code() == tonic::Code::Cancelled => format!(
            "etcd closed the connection right after the TLS handshake, as it does when {refused}"
        ),
        None => {
            return ConnectError::Unreachable {
                endpoints,
                detail: Chain(&e).to_string(),
            }
        }
    };
    ConnectError::Tls { endpoints, detail }
}

enum TlsFailure<'a> {
    Rustls(&'a rustls::Error),
    /// An `InvalidData` I/O error: rustls's error (etcd's alert) after the
    /// HTTP/2 client kept only its text.
    Text(String),
    /// The established connection was closed under us.
    Closed,
}

/// The TLS failure somewhere in `status`'s sources (tonic and hyper wrap
/// rustls's error in an `io::Error`; h2 keeps only its kind and text).
fn tls_failure(status: &tonic::Status) -> Option<TlsFailure<'_>> {
    let mut next: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(status);
    while let Some(err) = next {
        if let Some(found) = err.downcast_ref::<rustls::Error>() {
            return Some(TlsFailure::Rustls(found));
        }
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            if let Some(found) = io.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) {
                return Some(TlsFailure::Rustls(found));
            }
            use std::io::ErrorKind::*;
            match io.kind() {
                InvalidData => return Some(TlsFailure::Text(io.to_string())),
                BrokenPipe | ConnectionReset | ConnectionAborted | UnexpectedEof => {
                    return Some(TlsFailure::Closed)
                }
                _ => {}
            }
        }
        next = err.source();
    }
    None
}

fn to_i64(r: Revision) -> Result<i64, StoreError> {
    i64::try_from(r).map_err(|_| StoreError::Backend(format!("etcd: revision {r} out of range")))
}

fn backend(e: etcd_client::Error) -> StoreError {
    StoreError::Backend(format!("etcd: {}", Chain(&e)))
}

/// Whether a failed write says etcd takes no writes at all (rather than
/// refusing this one request): the NOSPACE or CORRUPT alarm, or etcd
/// unreachable, leaderless or timing out.
fn refuses_writes(e: &etcd_client::Error) -> bool {
    use etcd_client::Error as E;
    match e {
        E::GRpcStatus(status) => {
            let msg = status.message();
            matches!(
                status.code(),
                tonic::Code::Unavailable | tonic::Code::DeadlineExceeded
            ) || msg.contains("database space exceeded")
                || msg.contains("corrupt cluster")
        }
        E::TransportError(_) | E::IoError(_) => true,
        _ => false,
    }
}

enum RevisionError {
    Compacted,
    Future,
}

fn classify(e: &etcd_client::Error) -> Option<RevisionError> {
    let etcd_client::Error::GRpcStatus(status) = e else {
        return None;
    };
    let msg = status.message();
    if msg.contains("required revision has been compacted") {
        Some(RevisionError::Compacted)
    } else if msg.contains("required revision is a future revision") {
        Some(RevisionError::Future)
    } else {
        None
    }
}

/// The first key after every key starting with `prefix` (etcd's range end).
/// `[0]` means "to the end of the keyspace" (empty or all-0xff prefix).
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// The first key after `key` (for "start after" ranges).
fn after_key(key: impl Into<Vec<u8>>) -> Vec<u8> {
    let mut k = key.into();
    k.push(0);
    k
}

fn header_revision(h: Option<&etcd_client::ResponseHeader>) -> Result<Revision, StoreError> {
    h.map(|h| rev(h.revision()))
        .ok_or_else(|| StoreError::Backend("etcd: response without header".into()))
}

#[async_trait::async_trait]
impl Storage for EtcdStore {
    async fn get(&self, key: &str) -> Result<Option<KeyValue>, StoreError> {
        let resp = self.kv().get(self.full(key), None).await.map_err(backend)?;
        resp.kvs().first().map(|kv| self.convert(kv)).transpose()
    }

    async fn list(&self, opts: &ListOptions) -> Result<ListResult, StoreError> {
        let full_prefix = self.full(&opts.prefix);
        let end = prefix_end(full_prefix.as_bytes());
        let mut start = match opts
            .start_after
            .as_deref()
            .filter(|s| *s >= opts.prefix.as_str())
        {
            Some(after) => after_key(self.full(after)),
            None => full_prefix.into_bytes(),
        };
        let want = opts.limit.filter(|l| *l > 0).unwrap_or(usize::MAX);
        let chunk = self.options.list_chunk.max(1);
        // etcd reads "revision 0" as "latest"; the state at 0 (before any
        // write) is the state at 1, etcd's empty first revision.
        let mut pinned = match opts.revision {
            Some(r) => Some(to_i64(r.max(1))?),
            None => None,
        };
        let mut items = Vec::new();
        loop {
            let limit = (want - items.len()).min(chunk);
            let mut get = GetOptions::new()
                .with_range(end.clone())
                .with_limit(i64::try_from(limit).unwrap_or(i64::MAX));
            if let Some(r) = pinned {
                get = get.with_revision(r);
            }
            let resp = match self.kv().get(start.clone(), Some(get)).await {
                Ok(r) => r,
                Err(e) => return Err(self.revision_error(e, opts.revision.unwrap_or(0)).await),
            };
            if pinned.is_none() {
                // Later chunks read the same snapshot as the first one.
                pinned = Some(to_i64(header_revision(resp.header())?)?);
            }
            let got = resp.kvs().len();
            let remaining = u64::try_from(resp.count())
                .unwrap_or(0)
                .saturating_sub(got as u64);
            for kv in resp.kvs() {
                items.push(self.convert(kv)?);
            }
            match resp.kvs().last() {
                Some(last) if remaining > 0 && items.len() < want => {
                    start = after_key(last.key().to_vec())
                }
                _ => {
                    let revision = opts.revision.unwrap_or_else(|| rev(pinned.unwrap_or(0)));
                    return Ok(ListResult {
                        items,
                        revision,
                        remaining,
                    });
                }
            }
        }
    }

    async fn count(&self, prefix: &str) -> Result<u64, StoreError> {
        let full = self.full(prefix);
        let get = GetOptions::new()
            .with_range(prefix_end(full.as_bytes()))
            .with_count_only();
        let resp = self.kv().get(full, Some(get)).await.map_err(backend)?;
        Ok(u64::try_from(resp.count()).unwrap_or(0))
    }

    async fn create(&self, key: &str, value: Vec<u8>) -> Result<Revision, StoreError> {
        let full = self.full(key);
        let txn = Txn::new()
            .when([Compare::create_revision(full.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(full, value, None)]);
        let resp = self.write(txn).await?;
        if !resp.succeeded() {
            return Err(StoreError::AlreadyExists {
                key: key.to_owned(),
            });
        }
        header_revision(resp.header())
    }

    async fn update(
        &self,
        key: &str,
        value: Vec<u8>,
        expected: Revision,
    ) -> Result<Revision, StoreError> {
        let full = self.full(key);
        let txn = Txn::new()
            .when([
                Compare::create_revision(full.clone(), CompareOp::Greater, 0),
                Compare::mod_revision(full.clone(), CompareOp::Equal, to_i64(expected)?),
            ])
            .and_then([TxnOp::put(full.clone(), value, None)])
            .or_else([TxnOp::get(full, None)]);
        let resp = self.write(txn).await?;
        if !resp.succeeded() {
            return Err(self.guard_failed(key, expected, &resp));
        }
        header_revision(resp.header())
    }

    async fn delete(
        &self,
        key: &str,
        expected: Option<Revision>,
    ) -> Result<(KeyValue, Revision), StoreError> {
        let full = self.full(key);
        let mut guard = vec![Compare::create_revision(
            full.clone(),
            CompareOp::Greater,
            0,
        )];
        if let Some(expected) = expected {
            guard.push(Compare::mod_revision(
                full.clone(),
                CompareOp::Equal,
                to_i64(expected)?,
            ));
        }
        let txn = Txn::new()
            .when(guard)
            .and_then([TxnOp::delete(
                full.clone(),
                Some(DeleteOptions::new().with_prev_key()),
            )])
            .or_else([TxnOp::get(full, None)]);
        let resp = self.write(txn).await?;
        if !resp.succeeded() {
            return Err(self.guard_failed(key, expected.unwrap_or(0), &resp));
        }
        let prev = resp.op_responses().into_iter().find_map(|op| match op {
            TxnOpResponse::Delete(d) => d.prev_kvs().first().map(|kv| self.convert(kv)),
            _ => None,
        });
        match prev {
            Some(prev) => Ok((prev?, header_revision(resp.header())?)),
            None => Err(StoreError::NotFound {
                key: key.to_owned(),
            }),
        }
    }

    async fn watch(&self, prefix: &str, after: Revision) -> Result<WatchStream, StoreError> {
        let full = self.full(prefix);
        let opts = WatchOptions::new()
            .with_range(prefix_end(full.as_bytes()))
            .with_start_revision(to_i64(after.saturating_add(1))?)
            .with_prev_key()
            .with_progress_notify();
        let mut stream = self
            .client
            .watch_client()
            .max_decoding_message_size(self.options.max_response_bytes)
            .watch(full, Some(opts))
            .await
            .map_err(backend)?;
        // The first answer confirms the watch, or refuses a compacted start.
        let first = stream.message().await.map_err(backend)?;
        if let Some(resp) = &first {
            if resp.compact_revision() > 0 {
                return Err(StoreError::Compacted {
                    requested: after,
                    compacted: rev(resp.compact_revision()),
                });
            }
        }
        let (out, rx) = mpsc::channel(self.options.watch_buffer.max(1));
        let task = EtcdWatch {
            store: self.clone(),
            after,
            out,
            pending: first,
        };
        tokio::spawn(task.run(stream));
        Ok(Box::pin(futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|item| (item, rx))
        })))
    }

    async fn current_revision(&self) -> Result<Revision, StoreError> {
        let resp = self.count_all().await.map_err(backend)?;
        header_revision(resp.header())
    }

    async fn ready(&self) -> Result<(), StoreError> {
        if self.health.fault().is_some() {
            if self.health.probe_due() {
                self.probe().await;
            }
            if let Some(fault) = self.health.fault() {
                return Err(StoreError::Unavailable(fault));
            }
        }
        self.current_revision().await.map(|_| ())
    }

    async fn compact(&self, revision: Revision) -> Result<(), StoreError> {
        match self.kv().compact(to_i64(revision)?, None).await {
            Ok(_) => Ok(()),
            Err(e) => match self.revision_error(e, revision).await {
                // Compacting an already compacted revision is a no-op, as in the embedded store.
                StoreError::Compacted { .. } => Ok(()),
                other => Err(other),
            },
        }
    }
}

/// Forwards one etcd watch to a [`WatchStream`].
struct EtcdWatch {
    store: EtcdStore,
    after: Revision,
    out: mpsc::Sender<Result<WatchEvent, StoreError>>,
    pending: Option<WatchResponse>,
}

impl EtcdWatch {
    async fn run(mut self, mut stream: etcd_client::WatchStream) {
        let interval = self.store.options.progress_interval;
        let mut idle_until = Instant::now() + interval;
        if let Some(first) = self.pending.take() {
            if !self.forward(first).await {
                return;
            }
        }
        loop {
            tokio::select! {
                msg = stream.message() => {
                    let resp = match msg {
                        Ok(Some(resp)) => resp,
                        Ok(None) => {
                            let _ = self.out.send(Err(StoreError::Backend("etcd: watch stream closed".into()))).await;
                            return;
                        }
                        Err(e) => {
                            let _ = self.out.send(Err(backend(e))).await;
                            return;
                        }
                    };
                    if !self.forward(resp).await {
                        return;
                    }
                    idle_until = Instant::now() + interval;
                }
                () = tokio::time::sleep_until(idle_until) => {
                    if let Err(e) = stream.request_progress().await {
                        let _ = self.out.send(Err(backend(e))).await;
                        return;
                    }
                    idle_until = Instant::now() + interval;
                }
                () = self.out.closed() => return,
            }
        }
    }

    /// Forward one etcd response; false when the stream must end.
    async fn forward(&mut self, resp: WatchResponse) -> bool {
        if resp.compact_revision() > 0 {
            let err = StoreError::Compacted {
                requested: self.after,
                compacted: rev(resp.compact_revision()),
            };
            let _ = self.out.send(Err(err)).await;
            return false;
        }
        if resp.canceled() {
            let reason = format!("etcd: watch canceled: {}", resp.cancel_reason());
            let _ = self.out.send(Err(StoreError::Backend(reason))).await;
            return false;
        }
        if resp.events().is_empty() {
            // The creation answer carries the current revision before any
            // replay, so only later empty answers are progress notifications.
            if resp.created() {
                return true;
            }
            return match header_revision(resp.header()) {
                Ok(revision) => self
                    .out
                    .send(Ok(WatchEvent::Progress { revision }))
                    .await
                    .is_ok(),
                Err(e) => {
                    let _ = self.out.send(Err(e)).await;
                    false
                }
            };
        }
        for event in resp.events() {
            let item = self.convert(event);
            let failed = item.is_err();
            if self.out.send(item).await.is_err() || failed {
                return false;
            }
        }
        true
    }

    fn convert(&self, event: &etcd_client::Event) -> Result<WatchEvent, StoreError> {
        let kv = event
            .kv()
            .ok_or_else(|| StoreError::Backend("etcd: watch event without key".into()))?;
        let prev = event.prev_kv().map(|p| self.store.convert(p)).transpose()?;
        match event.event_type() {
            EventType::Put => Ok(WatchEvent::Put {
                kv: self.store.convert(kv)?,
                prev,
            }),
            EventType::Delete => {
                let prev = prev.ok_or_else(|| {
                    StoreError::Backend(
                        "etcd: delete event without its previous value (compacted?)".into(),
                    )
                })?;
                Ok(WatchEvent::Delete {
                    prev,
                    revision: rev(kv.mod_revision()),
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::prefix_end;

    #[test]
    fn store_prefixes_are_directories() {
        assert_eq!(super::dir_prefix("/registry"), "/registry/");
        assert_eq!(super::dir_prefix("/registry/"), "/registry/");
        assert_eq!(super::dir_prefix(""), "");
    }

    #[test]
    fn prefix_end_increments_the_last_byte() {
        assert_eq!(prefix_end(b"/reg/a/"), b"/reg/a0".to_vec());
        assert_eq!(prefix_end(b"ab\xff"), b"ac".to_vec());
        assert_eq!(prefix_end(b"\xff\xff"), vec![0]);
        assert_eq!(prefix_end(b""), vec![0]);
    }
}
