//! Health probes inside a lab namespace: a plain HTTP/1.1 GET on a component's
//! `/readyz`, from a socket created in that namespace (the components listen on
//! their namespace's loopback, which the host cannot otherwise reach).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use cozyplane_datapath::netlink::{named_netns_path, Netns};

/// The status code of `GET <path>` at `addr` inside the named namespace;
/// `None` when nothing answers (not listening, namespace gone, garbage reply).
pub fn http_status_in(netns_name: &str, addr: SocketAddr, path: &str) -> Option<u16> {
    let ns = Netns::open(named_netns_path(netns_name)).ok()?;
    http_status(&ns, addr, path)
}

/// [`http_status_in`] with an open namespace.
pub fn http_status(ns: &Netns, addr: SocketAddr, path: &str) -> Option<u16> {
    let stream = ns
        .run(move || TcpStream::connect_timeout(&addr, Duration::from_secs(2)))
        .ok()?
        .ok()?;
    get(stream, path)
}

fn get(mut s: TcpStream, path: &str) -> Option<u16> {
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    // One write: `write!` would send the request in pieces.
    let req = format!("GET {path} HTTP/1.1\r\nHost: lab\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    parse_status(&text)
}

/// The code of an HTTP status line (`HTTP/1.1 200 OK`).
fn parse_status(reply: &str) -> Option<u16> {
    let line = reply.lines().next()?;
    let mut parts = line.split(' ');
    if !parts.next()?.starts_with("HTTP/") {
        return None;
    }
    parts.next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_lines_parse_and_garbage_does_not() {
        assert_eq!(parse_status("HTTP/1.1 200 OK\r\n\r\nok"), Some(200));
        assert_eq!(
            parse_status("HTTP/1.0 503 Service Unavailable\r\n"),
            Some(503)
        );
        assert_eq!(parse_status("SSH-2.0-OpenSSH\r\n"), None);
        assert_eq!(parse_status(""), None);
    }

    #[test]
    fn a_real_server_answers_and_a_missing_namespace_does_not() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let server = std::thread::spawn(move || {
            if let Ok((mut s, _)) = listener.accept() {
                // Read the whole request: closing with unread data would reset the
                // connection and lose the reply.
                let mut req = Vec::new();
                let mut buf = [0u8; 512];
                while !req.ends_with(b"\r\n\r\n") {
                    match s.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => req.extend_from_slice(&buf[..n]),
                    }
                }
                let _ =
                    s.write_all(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n");
            }
        });
        let own = Netns::current().expect("own netns");
        assert_eq!(http_status(&own, addr, "/readyz"), Some(503));
        server.join().expect("server thread");
        assert_eq!(http_status_in("cp-no-such-ns", addr, "/readyz"), None);
    }
}
