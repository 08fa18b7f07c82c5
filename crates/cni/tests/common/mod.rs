//! Test harness: a test double of the node agent on a real unix socket
//! (served with the library's own `serve_connection`), and a runner that
//! execs the real plugin binary with a clean environment and stdin.

#![allow(dead_code)] // each test binary uses a different subset

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use cozyplane_cni::proto::{Request, Response};
use cozyplane_cni::server::{bind_atomic, serve_connection};
use serde_json::Value;

type Handler = dyn Fn(&Request) -> Response + Send + Sync;

/// A fake agent: records every request and answers with `handler`.
pub struct FakeAgent {
    pub socket: PathBuf,
    pub requests: Arc<Mutex<Vec<Request>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl FakeAgent {
    pub fn start(
        dir: &Path,
        handler: impl Fn(&Request) -> Response + Send + Sync + 'static,
    ) -> Self {
        let socket = dir.join("agent.sock");
        let listener = bind_atomic(&socket).expect("bind fake agent socket");
        let requests = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let handler: Arc<Handler> = Arc::new(handler);
        let (reqs, stop2) = (requests.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            for conn in listener.incoming() {
                if stop2.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                let (reqs, handler) = (reqs.clone(), handler.clone());
                // one thread per connection, like a real agent serving concurrent ADDs
                // The request is recorded *before* the answer is written: the plugin
                // exits as soon as it has its answer, and a test may look at the
                // requests right after that.
                std::thread::spawn(move || {
                    let _ = serve_connection(&conn, |r| {
                        reqs.lock().expect("lock").push(r.clone());
                        handler(r)
                    });
                });
            }
        });
        FakeAgent {
            socket,
            requests,
            stop,
            thread: Some(thread),
        }
    }

    pub fn requests(&self) -> Vec<Request> {
        self.requests.lock().expect("lock").clone()
    }
}

impl Drop for FakeAgent {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = UnixStream::connect(&self.socket); // wake the accept loop
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// What one plugin execution produced.
#[derive(Debug)]
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| {
            panic!(
                "stdout is not JSON ({e}): {:?}\nstderr: {}",
                self.stdout, self.stderr
            )
        })
    }

    /// Asserts a spec error with `code` and returns its JSON.
    pub fn expect_error(&self, code: u64) -> Value {
        assert_ne!(self.code, 0, "expected failure, got success: {self:?}");
        let v = self.json();
        assert_eq!(v["code"].as_u64(), Some(code), "{self:?}");
        assert!(v["msg"].is_string(), "{self:?}");
        assert!(v["cniVersion"].is_string(), "{self:?}");
        v
    }

    pub fn expect_silent_success(&self) {
        assert_eq!(self.code, 0, "{self:?}");
        assert_eq!(self.stdout, "", "{self:?}");
    }
}

/// Executes the plugin binary with only `env` set and `stdin` piped in.
pub fn exec_plugin(env: &[(&str, &str)], stdin: &str) -> Run {
    let mut child = Command::new(env!("CARGO_BIN_EXE_cozyplane-cni"))
        .env_clear()
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn plugin");
    if let Some(mut si) = child.stdin.take() {
        // the plugin may exit before reading (e.g. a bad env); ignore EPIPE
        let _ = si.write_all(stdin.as_bytes());
    }
    let out = child.wait_with_output().expect("wait plugin");
    Run {
        code: out.status.code().expect("plugin killed by a signal"),
        stdout: String::from_utf8(out.stdout).expect("utf8 stdout"),
        stderr: String::from_utf8(out.stderr).expect("utf8 stderr"),
    }
}

/// A stand-in for a sandbox's netns path: the plugin only checks that it
/// exists and is not its own namespace; the agent is the one that enters it.
pub fn fake_netns(dir: &Path, name: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, b"").expect("create netns stand-in");
    p.to_str().expect("utf8 path").to_owned()
}
