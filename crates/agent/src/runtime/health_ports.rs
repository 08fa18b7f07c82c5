//! The `healthCheckNodePort` servers (kube-proxy's contract, `docs/services.md`):
//! for every `type: LoadBalancer` Service with `externalTrafficPolicy: Local`,
//! an HTTP server on its health-check port on every address of this node that
//! answers 200 while the node has a ready endpoint of the Service and 503
//! otherwise, with kube-proxy's JSON body and `X-Load-Balancing-Endpoint-Weight`.
//!
//! The servers follow the compiled [`HealthCheck`]s on every sync: new ports are
//! bound, gone ports closed, counts updated in place. A port that cannot be
//! bound (something else holds it) is retried on the next sync and counted.
//! Each connection gets one request: the head is read within
//! [`HEAD_TIMEOUT`] and [`MAX_HEAD`] bytes, and at most [`MAX_CONNS`]
//! connections per port are served at once (a slow or hostile client holds a
//! slot for at most the timeout), so the probes of a load balancer are never
//! starved by a flood.

use std::collections::{BTreeMap, HashMap};
use std::net::{Ipv6Addr, SocketAddr};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

use crate::compile::services::HealthCheck;

/// How long a client may take to send its request head.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest request head read.
pub const MAX_HEAD: usize = 4096;
/// Connections served at once per port.
pub const MAX_CONNS: usize = 64;

struct Port {
    state: Arc<RwLock<HealthCheck>>,
    task: JoinHandle<()>,
}

/// The health-check servers of this node.
#[derive(Default)]
pub struct HealthPorts {
    ports: HashMap<u16, Port>,
    /// Ports that could not be bound at the last sync.
    pub unbound: Vec<(u16, String)>,
}

impl HealthPorts {
    /// Serves exactly `want`: binds new ports, closes gone ones, updates the
    /// rest. Must run inside a tokio runtime.
    pub fn sync(&mut self, want: &BTreeMap<u16, HealthCheck>) {
        self.ports.retain(|port, p| {
            let keep = want.contains_key(port);
            if !keep {
                p.task.abort();
            }
            keep
        });
        self.unbound.clear();
        for (port, hc) in want {
            if let Some(p) = self.ports.get(port) {
                let mut s = p.state.write().unwrap_or_else(|e| e.into_inner());
                if *s != *hc {
                    *s = hc.clone();
                }
                continue;
            }
            match bind(*port) {
                Ok(listener) => {
                    let state = Arc::new(RwLock::new(hc.clone()));
                    let task = tokio::spawn(serve(listener, Arc::clone(&state)));
                    self.ports.insert(*port, Port { state, task });
                }
                Err(e) => {
                    tracing::warn!(port, error = %e, "healthCheckNodePort cannot be bound; retrying on the next sync");
                    self.unbound.push((*port, e.to_string()));
                }
            }
        }
    }

    /// The ports served now.
    pub fn served(&self) -> Vec<u16> {
        let mut v: Vec<u16> = self.ports.keys().copied().collect();
        v.sort_unstable();
        v
    }
}

impl Drop for HealthPorts {
    fn drop(&mut self) {
        for p in self.ports.values() {
            p.task.abort();
        }
    }
}

/// Every address of the node, both families where the host has IPv6 (a
/// dual-stack `[::]` socket), else IPv4 only.
fn bind(port: u16) -> std::io::Result<TcpListener> {
    let v6 = SocketAddr::from((Ipv6Addr::UNSPECIFIED, port));
    let std_listener = match std::net::TcpListener::bind(v6) {
        Ok(l) => l,
        Err(_) => std::net::TcpListener::bind(SocketAddr::from(([0, 0, 0, 0], port)))?,
    };
    std_listener.set_nonblocking(true)?;
    TcpListener::from_std(std_listener)
}

async fn serve(listener: TcpListener, state: Arc<RwLock<HealthCheck>>) {
    let slots = Arc::new(Semaphore::new(MAX_CONNS));
    loop {
        let Ok(permit) = Arc::clone(&slots).acquire_owned().await else {
            return;
        };
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(_) => {
                // EMFILE and friends: back off instead of spinning.
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let hc = state.read().unwrap_or_else(|e| e.into_inner()).clone();
        tokio::spawn(async move {
            let _ = answer(stream, &hc).await;
            drop(permit);
        });
    }
}

/// The response kube-proxy's health-check server gives: 200 with local
/// endpoints, 503 without, a JSON body naming the Service.
pub fn response(hc: &HealthCheck) -> String {
    let (status, reason) = if hc.local_endpoints > 0 {
        (200, "OK")
    } else {
        (503, "Service Unavailable")
    };
    let body = serde_json::json!({
        "service": {"namespace": hc.namespace, "name": hc.name},
        "localEndpoints": hc.local_endpoints,
        "serviceProxyHealthy": true,
    })
    .to_string();
    format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n\
         X-Content-Type-Options: nosniff\r\nX-Load-Balancing-Endpoint-Weight: {}\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        hc.local_endpoints,
        body.len()
    )
}

async fn answer(mut stream: TcpStream, hc: &HealthCheck) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(256);
    let mut chunk = [0u8; 512];
    let read = async {
        while head.len() < MAX_HEAD {
            let n = stream.read(&mut chunk).await?;
            if n == 0 {
                break;
            }
            head.extend_from_slice(&chunk[..n]);
            if head.windows(4).any(|w| w == b"\r\n\r\n") || head.windows(2).any(|w| w == b"\n\n") {
                break;
            }
        }
        Ok::<(), std::io::Error>(())
    };
    if tokio::time::timeout(HEAD_TIMEOUT, read).await.is_err() {
        return Ok(()); // too slow: closed without an answer
    }
    stream.write_all(response(hc).as_bytes()).await?;
    stream.shutdown().await
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn hc(n: usize) -> HealthCheck {
        HealthCheck {
            namespace: "shop".into(),
            name: "web".into(),
            local_endpoints: n,
        }
    }

    async fn get(port: u16) -> String {
        let mut s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    }

    fn free_port() -> u16 {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    }

    #[tokio::test]
    async fn answers_follow_the_local_endpoints_and_ports_come_and_go() {
        let port = free_port();
        let mut h = HealthPorts::default();
        h.sync(&[(port, hc(2))].into_iter().collect());
        assert_eq!(h.served(), [port]);
        let r = get(port).await;
        assert!(r.starts_with("HTTP/1.1 200 OK\r\n"), "{r}");
        assert!(r.contains("X-Load-Balancing-Endpoint-Weight: 2\r\n"), "{r}");
        let body: serde_json::Value =
            serde_json::from_str(r.split("\r\n\r\n").nth(1).unwrap()).unwrap();
        assert_eq!(body["service"]["name"], "web");
        assert_eq!(body["localEndpoints"], 2);

        // The last local endpoint goes: 503, same listener.
        h.sync(&[(port, hc(0))].into_iter().collect());
        let r = get(port).await;
        assert!(r.starts_with("HTTP/1.1 503 "), "{r}");

        // The Service goes: the port is closed.
        h.sync(&BTreeMap::new());
        assert!(h.served().is_empty());
        let mut closed = false;
        for _ in 0..50 {
            if TcpStream::connect(("127.0.0.1", port)).await.is_err() {
                closed = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(closed, "the listener is gone");
    }

    #[tokio::test]
    async fn a_port_held_by_someone_else_is_reported_and_retried() {
        let taken = std::net::TcpListener::bind("[::]:0")
            .or_else(|_| std::net::TcpListener::bind("0.0.0.0:0"))
            .unwrap();
        let port = taken.local_addr().unwrap().port();
        let mut h = HealthPorts::default();
        h.sync(&[(port, hc(1))].into_iter().collect());
        assert_eq!(h.unbound.len(), 1, "{:?}", h.unbound);
        assert!(h.served().is_empty());
        drop(taken);
        h.sync(&[(port, hc(1))].into_iter().collect());
        assert!(h.unbound.is_empty());
        assert_eq!(h.served(), [port]);
    }

    #[tokio::test]
    async fn a_silent_client_does_not_hold_the_port() {
        let port = free_port();
        let mut h = HealthPorts::default();
        h.sync(&[(port, hc(1))].into_iter().collect());
        // Many clients that never send a byte...
        let mut idle = Vec::new();
        for _ in 0..MAX_CONNS / 2 {
            idle.push(TcpStream::connect(("127.0.0.1", port)).await.unwrap());
        }
        // ... while a real probe is still answered.
        let r = get(port).await;
        assert!(r.starts_with("HTTP/1.1 200 OK"), "{r}");
    }
}
