//! Test fixtures (feature `test-util`): a throw-away etcd server.
//!
//! [`EtcdServer::start`] runs `/usr/bin/etcd` (or `$COZYPLANE_ETCD_BIN`) on
//! free loopback ports with a temporary data dir and waits until it reports
//! healthy. The server runs under a tiny `sh` guard that holds a pipe from
//! this process: when the pipe closes (the fixture is dropped, or this
//! process exits or is killed — even from a `static`), the guard kill -9's
//! etcd and removes its data dir, so no test leaves a daemon behind.
//!
//! [`EtcdServer::start_tls`] starts one that speaks only TLS and requires a
//! client certificate (`--client-cert-auth`), with certificates from a
//! [`TestCa`] made for it; [`TestCa`] also makes "another CA" for tests
//! that must be refused.
//!
//! Tests that need etcd hand the fixture's result to the test gate
//! (`cozyplane_testkit::Needs::ready_with`): under CI a missing etcd is a test
//! failure, elsewhere the test is skipped with a `SKIP` line.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// Why a fixture could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum FixtureError {
    #[error(
        "etcd binary not found at {0} (install Debian's etcd-server or set COZYPLANE_ETCD_BIN)"
    )]
    NoEtcd(PathBuf),
    #[error("fixture I/O")]
    Io(#[from] std::io::Error),
    #[error("generating test certificates")]
    Cert(#[from] rcgen::Error),
    #[error("etcd did not become healthy within {timeout:?}; its log:\n{log}")]
    NotHealthy { timeout: Duration, log: String },
    /// The process-wide etcd of [`shared_etcd`] failed to start (once; every
    /// later call gets the same error).
    #[error("the shared test etcd could not be started")]
    Shared(#[source] Arc<FixtureError>),
}

/// The etcd binary the fixtures run.
pub fn etcd_binary() -> PathBuf {
    std::env::var_os("COZYPLANE_ETCD_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/etcd"))
}

/// An etcd endpoint shared by every test of this process: the one named by
/// `COZYPLANE_TEST_ETCD` if set, else one [`EtcdServer`] started on first use
/// (it dies with the process). Use a unique key prefix per test.
pub fn shared_etcd() -> Result<String, FixtureError> {
    if let Ok(endpoint) = std::env::var("COZYPLANE_TEST_ETCD") {
        return Ok(endpoint);
    }
    static SHARED: OnceLock<Result<EtcdServer, Arc<FixtureError>>> = OnceLock::new();
    match SHARED.get_or_init(|| EtcdServer::start().map_err(Arc::new)) {
        Ok(server) => Ok(server.endpoint()),
        Err(e) => Err(FixtureError::Shared(e.clone())),
    }
}

/// A TLS etcd requiring client certificates ([`EtcdServer::start_tls`]),
/// shared by every test of this process like [`shared_etcd`]: its endpoint
/// (`https://…`) and the client files it accepts.
pub fn shared_tls_etcd() -> Result<(String, ClientTlsFiles), FixtureError> {
    static SHARED: OnceLock<Result<EtcdServer, Arc<FixtureError>>> = OnceLock::new();
    let started = SHARED.get_or_init(|| {
        TestCa::new("cozyplane-test-etcd-ca")
            .and_then(|ca| EtcdServer::start_tls(&ca))
            .map_err(Arc::new)
    });
    match started {
        Ok(server) => match server.client_tls() {
            Some(files) => Ok((server.endpoint(), files.clone())),
            None => Err(FixtureError::Io(std::io::Error::other(
                "TLS etcd without client files",
            ))),
        },
        Err(e) => Err(FixtureError::Shared(e.clone())),
    }
}

/// A key prefix unique to this process and call, for sharing one etcd.
pub fn unique_prefix(test: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "/cozyplane-test/{}-{}-{test}/",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// How long to wait for etcd to become healthy.
const HEALTH_TIMEOUT: Duration = Duration::from_secs(20);

/// The guard script: run etcd in the background, then wait on stdin. A
/// line "kill" kill -9's etcd and keeps the data (crash tests restart on
/// it); end of input kill -9's etcd and removes the data dir.
const GUARD: &str = r#"
"$0" "$@" >>"$ETCD_LOG" 2>&1 &
pid=$!
if read -r _cmd; then
  kill -9 "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; exit 0
fi
kill -9 "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; rm -rf "$ETCD_DIR"
"#;

/// A certificate authority for TLS fixtures (rcgen, ECDSA P-256).
pub struct TestCa {
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    cert_pem: String,
}

/// A certificate and its private key, PEM.
#[derive(Clone)]
pub struct TestCert {
    pub cert_pem: String,
    pub key_pem: String,
}

impl TestCa {
    /// A new self-signed CA named `name`.
    pub fn new(name: &str) -> Result<Self, FixtureError> {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params.self_signed(&key)?;
        Ok(TestCa {
            issuer: rcgen::Issuer::new(params, key),
            cert_pem: cert.pem(),
        })
    }

    /// The CA certificate (PEM).
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// A certificate with common name `cn` for `127.0.0.1`, `::1` and
    /// `localhost`, good for both server and client authentication (etcd
    /// uses its serving certificate as a client too).
    pub fn issue(&self, cn: &str) -> Result<TestCert, FixtureError> {
        use rcgen::{
            CertificateParams, DnType, ExtendedKeyUsagePurpose, KeyPair, KeyUsagePurpose, SanType,
        };
        let mut params = CertificateParams::new(vec!["localhost".to_owned()])?;
        params.distinguished_name.push(DnType::CommonName, cn);
        params.subject_alt_names.extend([
            SanType::IpAddress([127, 0, 0, 1].into()),
            SanType::IpAddress(std::net::Ipv6Addr::LOCALHOST.into()),
        ]);
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(TestCert {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

/// Files a TLS client of [`EtcdServer::start_tls`] uses: the CA that signed
/// the server's certificate and a client certificate etcd accepts.
#[derive(Debug, Clone)]
pub struct ClientTlsFiles {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// A running etcd server owned by a test. Dropping it kills the server.
pub struct EtcdServer {
    dir: tempfile::TempDir,
    client: SocketAddr,
    peer: SocketAddr,
    /// Extra etcd flags ([`EtcdServer::start_with`]), kept for restarts.
    args: Vec<String>,
    /// With TLS: the plain-HTTP metrics listener that answers `/health`.
    health: SocketAddr,
    tls: Option<ClientTlsFiles>,
    guard: Option<(Child, ChildStdin)>,
}

impl EtcdServer {
    /// Start a fresh single-node etcd on free loopback ports.
    pub fn start() -> Result<Self, FixtureError> {
        Self::start_with(&[])
    }

    /// [`EtcdServer::start`] with extra etcd flags, e.g.
    /// `["--quota-backend-bytes", "8388608"]`.
    pub fn start_with(args: &[&str]) -> Result<Self, FixtureError> {
        let bin = etcd_binary();
        if !bin.exists() {
            return Err(FixtureError::NoEtcd(bin));
        }
        let dir = tempfile::Builder::new()
            .prefix("cozyplane-etcd-")
            .tempdir()?;
        let client = free_port()?;
        let mut server = EtcdServer {
            dir,
            client,
            peer: free_port()?,
            args: args.iter().map(|a| a.to_string()).collect(),
            health: client,
            tls: None,
            guard: None,
        };
        server.spawn_fresh()?;
        Ok(server)
    }

    /// Start a fresh single-node etcd that serves clients only over TLS
    /// and requires a client certificate (`--client-cert-auth`): its
    /// serving certificate and the trusted client CA are both `ca`'s.
    /// [`EtcdServer::client_tls`] names a CA file and a client certificate
    /// (common name `client`) it accepts.
    pub fn start_tls(ca: &TestCa) -> Result<Self, FixtureError> {
        let bin = etcd_binary();
        if !bin.exists() {
            return Err(FixtureError::NoEtcd(bin));
        }
        let dir = tempfile::Builder::new()
            .prefix("cozyplane-etcd-tls-")
            .tempdir()?;
        let write = |name: &str, data: &str| -> Result<PathBuf, FixtureError> {
            let path = dir.path().join(name);
            std::fs::write(&path, data)?;
            Ok(path)
        };
        let server_cert = ca.issue("etcd")?;
        write("server.crt", &server_cert.cert_pem)?;
        write("server.key", &server_cert.key_pem)?;
        let client_cert = ca.issue("client")?;
        let tls = ClientTlsFiles {
            ca: write("ca.crt", ca.cert_pem())?,
            cert: write("client.crt", &client_cert.cert_pem)?,
            key: write("client.key", &client_cert.key_pem)?,
        };
        let mut server = EtcdServer {
            dir,
            client: free_port()?,
            peer: free_port()?,
            args: Vec::new(),
            health: free_port()?,
            tls: Some(tls),
            guard: None,
        };
        server.spawn_fresh()?;
        Ok(server)
    }

    /// The client URL, e.g. `http://127.0.0.1:40123` (`https://` with TLS).
    pub fn endpoint(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://{}", self.client)
    }

    /// With [`EtcdServer::start_tls`]: the CA file and a client certificate
    /// and key this server accepts.
    pub fn client_tls(&self) -> Option<&ClientTlsFiles> {
        self.tls.as_ref()
    }

    /// The data directory (it survives [`EtcdServer::kill`]).
    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// kill -9 the server and wait until it is gone; the data dir stays.
    pub fn kill(&mut self) -> Result<(), FixtureError> {
        if let Some((mut child, mut stdin)) = self.guard.take() {
            stdin.write_all(b"kill\n")?;
            drop(stdin);
            child.wait()?;
        }
        Ok(())
    }

    /// Start the server again on the same data dir and ports.
    pub fn restart(&mut self) -> Result<(), FixtureError> {
        self.kill()?;
        self.spawn()
    }

    /// Spawns a new server. `free_port` only probes: another process may
    /// bind a picked port before etcd does (CI saw it: "bind: address
    /// already in use"), so then new ports are picked and the spawn tried
    /// again on an emptied data dir.
    fn spawn_fresh(&mut self) -> Result<(), FixtureError> {
        let mut attempts = 1;
        loop {
            match self.spawn() {
                Err(FixtureError::NotHealthy { log, .. })
                    if attempts < 4 && log.contains("address already in use") =>
                {
                    attempts += 1;
                    let data = self.data_dir();
                    if data.exists() {
                        std::fs::remove_dir_all(&data)?;
                    }
                    self.client = free_port()?;
                    self.peer = free_port()?;
                    self.health = if self.tls.is_some() {
                        free_port()?
                    } else {
                        self.client
                    };
                }
                other => return other,
            }
        }
    }

    fn spawn(&mut self) -> Result<(), FixtureError> {
        let client = self.endpoint();
        let peer = format!("http://{}", self.peer);
        let log = self.dir.path().join("etcd.log");
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg(GUARD)
            .arg(etcd_binary())
            .args(["--name", "test", "--data-dir"])
            .arg(self.data_dir())
            .args([
                "--listen-client-urls",
                &client,
                "--advertise-client-urls",
                &client,
            ])
            .args([
                "--listen-peer-urls",
                &peer,
                "--initial-advertise-peer-urls",
                &peer,
            ])
            .args([
                "--initial-cluster",
                &format!("test={peer}"),
                "--initial-cluster-state",
                "new",
            ])
            .args(&self.args);
        if self.tls.is_some() {
            let file = |name: &str| self.dir.path().join(name);
            cmd.arg("--client-cert-auth")
                .arg("--trusted-ca-file")
                .arg(file("ca.crt"))
                .arg("--cert-file")
                .arg(file("server.crt"))
                .arg("--key-file")
                .arg(file("server.key"))
                // plain-HTTP /health for the readiness probe below
                .arg("--listen-metrics-urls")
                .arg(format!("http://{}", self.health));
        }
        let mut child = cmd
            .env("ETCD_LOG", &log)
            .env("ETCD_DIR", self.dir.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        let stdin = child
            .stdin
            .take()
            .ok_or_else(|| std::io::Error::other("guard stdin missing"))?;
        self.guard = Some((child, stdin));
        let deadline = Instant::now() + HEALTH_TIMEOUT;
        while Instant::now() < deadline {
            if healthy(self.health) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let log = std::fs::read_to_string(&log).unwrap_or_default();
        self.kill()?;
        Err(FixtureError::NotHealthy {
            timeout: HEALTH_TIMEOUT,
            log: tail(&log, 40),
        })
    }

    /// The server's log so far (for diagnostics).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("etcd.log")).unwrap_or_default()
    }

    /// The directory holding the data dir and the log.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        // Closing the guard's stdin kills etcd; wait so ports are free again.
        if let Some((mut child, stdin)) = self.guard.take() {
            drop(stdin);
            let _ = child.wait();
        }
    }
}

fn free_port() -> Result<SocketAddr, FixtureError> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?)
}

/// etcd's `/health` answers `{"health":"true"}` once it has a leader.
fn healthy(addr: SocketAddr) -> bool {
    let probe = || -> std::io::Result<bool> {
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_millis(200))?;
        s.set_read_timeout(Some(Duration::from_secs(1)))?;
        s.write_all(b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")?;
        let mut body = String::new();
        s.read_to_string(&mut body)?;
        Ok(body.contains("\"health\":\"true\""))
    };
    probe().unwrap_or(false)
}

fn tail(s: &str, lines: usize) -> String {
    let all: Vec<&str> = s.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Helpers for benchmarks (this crate's and the API server's), so both
/// measure the raw backend read the same way.
pub mod bench {
    use std::time::{Duration, Instant};

    use crate::{ListOptions, Storage, StoreError};

    /// Percentiles of a set of timings.
    #[derive(Debug, Clone, Copy, PartialEq)]
    pub struct Summary {
        pub p50: Duration,
        pub p99: Duration,
        pub mean: Duration,
        pub samples: usize,
    }

    /// Summarize `samples` (nearest-rank percentiles). `None` when empty.
    pub fn summarize(samples: &mut [Duration]) -> Option<Summary> {
        if samples.is_empty() {
            return None;
        }
        samples.sort_unstable();
        let rank = |p: f64| {
            let r = ((p / 100.0) * samples.len() as f64).ceil() as usize;
            samples[r.clamp(1, samples.len()) - 1]
        };
        let total: Duration = samples.iter().sum();
        Some(Summary {
            p50: rank(50.0),
            p99: rank(99.0),
            mean: total / samples.len() as u32,
            samples: samples.len(),
        })
    }

    /// Time `reps` full reads of `opts` (following pages when `opts.limit`
    /// is set, pinned to the first page's revision, as a paginated client
    /// would). Returns the summary and the number of items per read.
    pub async fn time_list(
        store: &dyn Storage,
        opts: &ListOptions,
        reps: usize,
    ) -> Result<(Option<Summary>, usize), StoreError> {
        let mut samples = Vec::with_capacity(reps);
        let mut items = 0;
        for _ in 0..reps {
            let start = Instant::now();
            let mut page = store.list(opts).await?;
            items = page.items.len();
            let mut next = opts.clone();
            next.revision = Some(page.revision);
            while page.remaining > 0 {
                next.start_after = page.items.last().map(|kv| kv.key.clone());
                page = store.list(&next).await?;
                items += page.items.len();
            }
            samples.push(start.elapsed());
        }
        Ok((summarize(&mut samples), items))
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn nearest_rank_percentiles() {
            let mut s: Vec<Duration> = (1..=100).rev().map(Duration::from_millis).collect();
            let sum = summarize(&mut s).unwrap();
            assert_eq!(
                (sum.p50, sum.p99, sum.samples),
                (Duration::from_millis(50), Duration::from_millis(99), 100)
            );
            assert_eq!(sum.mean, Duration::from_micros(50_500));
            assert_eq!(summarize(&mut []), None);
            let mut one = [Duration::from_millis(7)];
            assert_eq!(summarize(&mut one).unwrap().p99, Duration::from_millis(7));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A client port another process took between the probe and etcd's
    /// listen: the fixture moves to new ports instead of failing the test
    /// that asked for a server.
    #[test]
    fn a_port_taken_before_etcd_binds_it_is_replaced() {
        if !etcd_binary().exists() {
            assert!(
                std::env::var_os("CI").is_none(),
                "etcd is missing under CI: {}",
                etcd_binary().display()
            );
            return;
        }
        let taken = TcpListener::bind("127.0.0.1:0").unwrap();
        let dir = tempfile::Builder::new()
            .prefix("cozyplane-etcd-taken-")
            .tempdir()
            .unwrap();
        let mut server = EtcdServer {
            dir,
            client: taken.local_addr().unwrap(),
            peer: free_port().unwrap(),
            args: Vec::new(),
            health: taken.local_addr().unwrap(),
            tls: None,
            guard: None,
        };
        server.spawn_fresh().unwrap();
        assert_ne!(server.client, taken.local_addr().unwrap());
        assert!(healthy(server.health), "serving on its new port");
    }
}
