//! `cozyplane healthcheck <url>`: the exec probe of containers whose health
//! endpoints are bound to the pod's loopback (unauthenticated, so never on
//! the pod network). One plain-HTTP GET, 2 s budget; exit 0 on a 2xx.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(2);

/// Flags of `cozyplane healthcheck`.
#[derive(Debug, clap::Args)]
pub struct HealthcheckArgs {
    /// `http://<host>:<port>/<path>` (plain HTTP only).
    pub url: String,
}

/// Asks `url`; `Ok(status line)` on a 2xx, `Err(why)` otherwise.
pub fn check(url: &str) -> Result<String, String> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| format!("{url}: only http:// URLs are supported"))?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let addr: SocketAddr = authority
        .to_socket_addrs()
        .map_err(|e| format!("{authority}: {e}"))?
        .next()
        .ok_or_else(|| format!("{authority}: no address"))?;
    let mut s =
        TcpStream::connect_timeout(&addr, TIMEOUT).map_err(|e| format!("connect {addr}: {e}"))?;
    s.set_read_timeout(Some(TIMEOUT))
        .and_then(|()| s.set_write_timeout(Some(TIMEOUT)))
        .map_err(|e| format!("{addr}: {e}"))?;
    // One write: `write!` sends each piece of the format on its own, and a
    // server that answers after the first segment and closes resets the rest.
    let request = format!("GET {path} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n\r\n");
    s.write_all(request.as_bytes())
        .map_err(|e| format!("send to {addr}: {e}"))?;
    let mut head = Vec::new();
    // The status line is all that is read (bounded: a hostile peer cannot
    // make the probe buffer more than 4 KiB).
    let _ = s.take(4096).read_to_end(&mut head);
    let text = String::from_utf8_lossy(&head);
    let line = text.lines().next().unwrap_or_default().to_string();
    let code = line.split_whitespace().nth(1).unwrap_or_default();
    if code.len() == 3 && code.starts_with('2') {
        Ok(line)
    } else if line.is_empty() {
        Err(format!("{url}: no answer"))
    } else {
        Err(format!("{url}: {line}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    fn serve_once(answer: &'static str) -> String {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        std::thread::spawn(move || {
            let (mut c, _) = l.accept().unwrap();
            // the whole request, as a server would, before answering
            let mut req = Vec::new();
            let mut buf = [0u8; 512];
            while !req.ends_with(b"\r\n\r\n") {
                match c.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => req.extend_from_slice(&buf[..n]),
                }
            }
            c.write_all(answer.as_bytes()).unwrap();
        });
        format!("http://127.0.0.1:{port}/readyz")
    }

    #[test]
    fn a_2xx_passes_anything_else_fails() {
        assert!(check(&serve_once("HTTP/1.1 200 OK\r\n\r\nok")).is_ok());
        let err = check(&serve_once("HTTP/1.1 503 Service Unavailable\r\n\r\n")).unwrap_err();
        assert!(err.contains("503"), "{err}");
        assert!(check("https://127.0.0.1:1/").is_err());
        // nothing listens on port 1
        assert!(check("http://127.0.0.1:1/readyz").is_err());
    }
}
