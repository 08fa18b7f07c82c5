//! Crash-test helper: writes to an embedded store until killed.
//!
//! `store-crash-writer <path> <tag> [writers]` opens the store at `path` and
//! runs `writers` concurrent loops (default 8). Each loop creates
//! `<tag>/<writer>/<n>` with value `v<n>`, then updates it to `u<n>`, and
//! prints `C <key>` / `U <key>` on stdout only AFTER the store acknowledged
//! the write. The crash test kill -9's this process mid-stream and checks
//! that every printed write survived.

use std::io::Write;
use std::process::ExitCode;

use cozyplane_store::{EmbeddedStore, Storage};

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let (Some(path), Some(tag)) = (args.get(1), args.get(2)) else {
        eprintln!("usage: store-crash-writer <path> <tag> [writers]");
        return ExitCode::from(2);
    };
    let writers: usize = match args.get(3).map(|w| w.parse()) {
        None => 8,
        Some(Ok(w)) if w > 0 => w,
        Some(_) => {
            eprintln!("writers must be a positive number");
            return ExitCode::from(2);
        }
    };
    let store = match EmbeddedStore::open(path) {
        Ok(s) => std::sync::Arc::new(s),
        Err(e) => {
            eprintln!("cannot open {path}: {e}");
            return ExitCode::FAILURE;
        }
    };
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    for w in 0..writers {
        let (store, tx, tag) = (store.clone(), tx.clone(), tag.clone());
        tokio::spawn(async move {
            for n in 0u64.. {
                let key = format!("{tag}/{w}/{n:08}");
                let Ok(rev) = store.create(&key, format!("v{n}").into_bytes()).await else {
                    break;
                };
                if tx.send(format!("C {key}")).is_err() {
                    break;
                }
                if store
                    .update(&key, format!("u{n}").into_bytes(), rev)
                    .await
                    .is_err()
                {
                    break;
                }
                if tx.send(format!("U {key}")).is_err() {
                    break;
                }
            }
        });
    }
    drop(tx);
    println!("ready");
    let mut out = std::io::stdout().lock();
    while let Some(line) = rx.recv().await {
        if writeln!(out, "{line}").and_then(|()| out.flush()).is_err() {
            break;
        }
    }
    eprintln!("a writer failed; stopping");
    ExitCode::FAILURE
}
