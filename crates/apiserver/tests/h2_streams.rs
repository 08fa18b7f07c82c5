//! A panic in one request handler never resets the other streams of its
//! HTTP/2 connection (issue #9, "Hardening"): the panicking request gets a
//! 500 Status, and a watch and new requests on the same connection go on.
//! kube's client speaks HTTP/1.1 only, so this uses hyper's HTTP/2 client
//! over the server's TLS with ALPN `h2`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

#[macro_use]
mod support;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use cozyplane_apiserver::auth::{Attributes, Authorizer, Decision, UserInfo};
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::Value;
use support::{Backend, Harness};

/// Panics in the authorizer for any path containing `boom`: a stand-in for
/// a handler bug.
struct PanicOnBoom;

#[async_trait::async_trait]
impl Authorizer for PanicOnBoom {
    async fn authorize(&self, _user: &UserInfo, attrs: &Attributes) -> Decision {
        assert!(!attrs.path.contains("boom"), "injected handler panic");
        Decision::Allow
    }
}

/// One HTTP/2 connection to the server (ALPN must pick `h2`).
async fn h2(h: &Harness) -> SendRequest<Full<Bytes>> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pemfile::certs(&mut h.server.ca_pem.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let mut cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    let tcp = tokio::net::TcpStream::connect(h.server.addr).await.unwrap();
    let name = rustls::pki_types::ServerName::IpAddress(h.server.addr.ip().into());
    let tls = tokio_rustls::TlsConnector::from(Arc::new(cfg))
        .connect(name, tcp)
        .await
        .unwrap();
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let (send, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
            .await
            .unwrap();
    tokio::spawn(conn);
    send
}

fn request(h: &Harness, method: &str, path: &str, body: Option<&Value>) -> Request<Full<Bytes>> {
    let mut b = Request::builder()
        .method(method)
        .uri(format!("{}{path}", h.server.url))
        .header(
            http::header::AUTHORIZATION,
            format!("Bearer {}", h.server.token),
        );
    if body.is_some() {
        b = b.header(http::header::CONTENT_TYPE, "application/json");
    }
    let bytes = body.map(|v| Bytes::from(v.to_string())).unwrap_or_default();
    b.body(Full::new(bytes)).unwrap()
}

async fn call(send: &mut SendRequest<Full<Bytes>>, req: Request<Full<Bytes>>) -> (u16, Value) {
    send.ready().await.unwrap();
    let resp = send.send_request(req).await.unwrap();
    let status = resp.status().as_u16();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_panic_resets_no_other_http2_stream() {
    let h = support::start_with(Backend::Embedded, "h2_panic", |b| {
        b.authorizer(Arc::new(PanicOnBoom))
    })
    .await
    .expect("the embedded store is always available");
    let ns = support::vpcs("default");
    let mut send = h2(&h).await;
    // A watch open on the connection, read as events arrive.
    send.ready().await.unwrap();
    let watch = send
        .send_request(request(&h, "GET", &format!("{ns}?watch=true"), None))
        .await
        .unwrap();
    assert_eq!(watch.status(), 200);
    let mut events = watch.into_body();
    // A request in flight on another stream while the handler panics.
    let mut other = send.clone();
    let slow = tokio::spawn({
        let req = request(
            &h,
            "GET",
            &format!("{ns}?watch=true&timeoutSeconds=2"),
            None,
        );
        async move { call(&mut other, req).await.0 }
    });
    for _ in 0..3 {
        let (status, body) = call(&mut send, request(&h, "GET", &format!("{ns}/boom"), None)).await;
        assert_eq!(status, 500, "{body}");
        assert_eq!(body["reason"], "InternalError");
    }
    let (status, body) = call(
        &mut send,
        request(&h, "POST", &ns, Some(&support::vpc("after", "10.9.0.0/16"))),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let mut seen = Vec::new();
    let added = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(frame) = events.frame().await {
            let frame = frame.expect("the watch stream is not reset");
            if let Some(data) = frame.data_ref() {
                seen.extend_from_slice(data);
                if String::from_utf8_lossy(&seen).contains("\"after\"") {
                    return true;
                }
            }
        }
        false
    })
    .await;
    assert_eq!(added, Ok(true), "{}", String::from_utf8_lossy(&seen));
    assert_eq!(slow.await.unwrap(), 200, "the concurrent stream completes");
    h.server.shutdown().await;
}
