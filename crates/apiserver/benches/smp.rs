//! Strategic merge patch at the size of issue #9 (a benchmark, not a test):
//! 300 000 finalizers added to an object that has 300 000, with the merge
//! the server runs (`patch::apply_strategic_merge_patch`) and with the
//! quadratic one it replaced, kept here only for the comparison (a linear
//! search of the list per patch element).
//!
//! `cargo bench -p cozyplane-apiserver --bench smp`. Sizes: `COZYPLANE_BENCH_N`
//! (default 300000) for the current merge; `COZYPLANE_BENCH_OLD_N`, a
//! comma-separated list (default `10000,30000,100000`), for the old one,
//! whose time grows with the square of n (300000 takes minutes).
#![allow(clippy::unwrap_used, clippy::expect_used)] // bench code: a failed step is a failed run

use std::time::{Duration, Instant};

use cozyplane_apiserver::patch::apply_strategic_merge_patch;
use serde_json::{json, Value};

fn finalizers(from: usize, n: usize) -> Value {
    json!({"metadata": {"name": "o", "finalizers":
        (from..from + n).map(|i| format!("example.com/f-{i}")).collect::<Vec<_>>()}})
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// Median of `rounds` runs of `f` on (object, patch) of `n` + `n`.
fn time(n: usize, rounds: usize, f: impl Fn(&Value, &Value) -> Value) -> Duration {
    let (doc, patch) = (finalizers(0, n), finalizers(n, n));
    let mut times = Vec::new();
    for _ in 0..rounds {
        let start = Instant::now();
        let out = f(&doc, &patch);
        times.push(start.elapsed());
        assert_eq!(
            out["metadata"]["finalizers"].as_array().map(Vec::len),
            Some(2 * n)
        );
    }
    median(times)
}

fn env_list(name: &str, default: &str) -> Vec<usize> {
    std::env::var(name)
        .unwrap_or_else(|_| default.to_string())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect()
}

fn main() {
    let n = env_list("COZYPLANE_BENCH_N", "300000")[0];
    let new = time(n, 5, |d, p| apply_strategic_merge_patch(d, p).unwrap());
    println!("smp {n}+{n} finalizers: current merge {new:.2?} (median of 5)");
    for old_n in env_list("COZYPLANE_BENCH_OLD_N", "10000,30000,100000") {
        let now = time(old_n, 3, |d, p| apply_strategic_merge_patch(d, p).unwrap());
        let old = time(old_n, 1, old::apply);
        println!(
            "smp {old_n}+{old_n} finalizers: current merge {now:.2?}, previous merge {old:.2?}"
        );
    }
}

/// The merge of the server before the linear one, reduced to what this
/// benchmark runs (a list of scalars under `metadata`): `contains` per
/// patch element.
mod old {
    use serde_json::{Map, Value};

    pub fn apply(doc: &Value, patch: &Value) -> Value {
        let mut out = doc.clone();
        smp_map(&mut out, patch.as_object().unwrap());
        out
    }

    fn smp_map(target: &mut Value, patch: &Map<String, Value>) {
        let t = target.as_object_mut().unwrap();
        for (k, v) in patch {
            match v {
                Value::Object(po) => {
                    let entry = t
                        .entry(k.clone())
                        .or_insert_with(|| Value::Object(Map::new()));
                    smp_map(entry, po);
                }
                Value::Array(items) if k == "finalizers" => {
                    let mut out: Vec<Value> = t
                        .get(k)
                        .and_then(Value::as_array)
                        .cloned()
                        .unwrap_or_default();
                    for p in items {
                        if !out.contains(p) {
                            out.push(p.clone());
                        }
                    }
                    t.insert(k.clone(), Value::Array(out));
                }
                other => {
                    t.insert(k.clone(), other.clone());
                }
            }
        }
    }
}
