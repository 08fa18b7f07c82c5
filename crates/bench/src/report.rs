//! The markdown report: figures per variant (medians over rounds), ratios against
//! (a), the issue's targets and the peer's published ratios; VPC pods against net-0
//! pods ((d) ÷ (c)) against issue #10's target; the raw per-round numbers, the
//! datapath's map memory and the bench's own setup times; and writing it into a
//! document between markers, replacing the previous block.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use crate::error::{BenchError, Result};
use crate::runner::{Config, RunResult, Sample, Variant};
use crate::stats::{median, ratio};

/// Start marker of the generated block.
pub const BEGIN: &str = "<!-- datapath-bench:begin -->";
/// End marker of the generated block.
pub const END: &str = "<!-- datapath-bench:end -->";

/// One row of the main table.
struct Row {
    name: &'static str,
    get: fn(&Sample) -> Option<f64>,
    /// Rates: higher is better; latencies: lower is better.
    higher_is_better: bool,
    /// The issue's target for c/a, if any.
    target: Option<f64>,
    /// Issue #10's target for d/c (VPC pods ÷ net-0 pods), if any.
    vpc_target: Option<f64>,
    /// b/a as published in `peer-baselines.md` (medians of 3 runs on this machine type).
    published_peer: Option<f64>,
    decimals: usize,
    /// Whether ratios mean anything (not for retransmit counts, which are noise).
    ratios: bool,
}

const ROWS: &[Row] = &[
    Row {
        name: "TCP 1 stream, Gbit/s",
        get: |s| s.tcp1.map(|t| t.gbps),
        higher_is_better: true,
        target: Some(0.85),
        vpc_target: Some(0.97),
        published_peer: Some(0.718),
        ratios: true,
        decimals: 2,
    },
    Row {
        name: "  retransmits, 1 stream",
        get: |s| s.tcp1.map(|t| t.retransmits as f64),
        higher_is_better: false,
        target: None,
        vpc_target: None,
        published_peer: None,
        ratios: false,
        decimals: 0,
    },
    Row {
        name: "TCP 4 streams, Gbit/s",
        get: |s| s.tcp4.map(|t| t.gbps),
        higher_is_better: true,
        target: None,
        vpc_target: Some(0.97),
        published_peer: Some(0.850),
        ratios: true,
        decimals: 2,
    },
    Row {
        name: "  retransmits, 4 streams",
        get: |s| s.tcp4.map(|t| t.retransmits as f64),
        higher_is_better: false,
        target: None,
        vpc_target: None,
        published_peer: None,
        ratios: false,
        decimals: 0,
    },
    Row {
        name: "TCP_RR 1 B, transactions/s",
        get: |s| s.rr.as_ref().map(|r| r.rate_per_s),
        higher_is_better: true,
        target: Some(0.90),
        vpc_target: Some(0.97),
        published_peer: Some(0.757),
        ratios: true,
        decimals: 0,
    },
    Row {
        name: "TCP_RR p50 µs",
        get: |s| s.rr.as_ref().and_then(|r| r.txn).map(|l| l.p50_us),
        higher_is_better: false,
        target: None,
        vpc_target: None,
        published_peer: Some(1.329),
        ratios: true,
        decimals: 1,
    },
    Row {
        name: "TCP_RR p99 µs",
        get: |s| s.rr.as_ref().and_then(|r| r.txn).map(|l| l.p99_us),
        higher_is_better: false,
        target: None,
        vpc_target: None,
        published_peer: Some(1.239),
        ratios: true,
        decimals: 1,
    },
    Row {
        name: "TCP_CRR 1 B, connections/s",
        get: |s| s.crr.as_ref().map(|r| r.rate_per_s),
        higher_is_better: true,
        target: Some(0.80),
        vpc_target: Some(0.97),
        published_peer: Some(0.592),
        ratios: true,
        decimals: 0,
    },
    Row {
        name: "TCP_CRR connect() p50 µs",
        get: |s| s.crr.as_ref().and_then(|r| r.connect).map(|l| l.p50_us),
        higher_is_better: false,
        target: None,
        vpc_target: None,
        published_peer: Some(1.449),
        ratios: true,
        decimals: 1,
    },
    Row {
        name: "TCP_CRR connect() p99 µs",
        get: |s| s.crr.as_ref().and_then(|r| r.connect).map(|l| l.p99_us),
        higher_is_better: false,
        target: None,
        vpc_target: None,
        published_peer: Some(1.813),
        ratios: true,
        decimals: 1,
    },
    Row {
        name: "TCP_CRR connect+req+resp p50 µs",
        get: |s| s.crr.as_ref().and_then(|r| r.txn).map(|l| l.p50_us),
        higher_is_better: false,
        target: None,
        vpc_target: None,
        published_peer: Some(1.413),
        ratios: true,
        decimals: 1,
    },
    Row {
        name: "TCP_CRR connect+req+resp p99 µs",
        get: |s| s.crr.as_ref().and_then(|r| r.txn).map(|l| l.p99_us),
        higher_is_better: false,
        target: None,
        vpc_target: None,
        published_peer: Some(1.656),
        ratios: true,
        decimals: 1,
    },
];

/// Facts about the machine and the invocation, printed above the tables.
#[derive(Clone, Debug)]
pub struct Context {
    /// When (UTC, human readable).
    pub when: String,
    /// `uname -r`.
    pub kernel: String,
    /// CPUs available.
    pub cpus: usize,
    /// The command line that produced the report.
    pub command: String,
}

fn median_of(result: &RunResult, v: Variant, get: impl Fn(&Sample) -> Option<f64>) -> Option<f64> {
    let values: Vec<f64> = result
        .rounds
        .iter()
        .filter(|r| r.variant == v)
        .filter_map(|r| get(&r.sample))
        .collect();
    median(&values)
}

/// `v`'s figure ÷ `reference`'s figure in the same round, for every round that has
/// both, sorted: how the ratio itself moves with the machine's noise.
fn paired_ratios(
    result: &RunResult,
    v: Variant,
    reference: Variant,
    get: fn(&Sample) -> Option<f64>,
) -> Vec<f64> {
    let of = |variant: Variant, round: u32| {
        result
            .rounds
            .iter()
            .find(|r| r.variant == variant && r.round == round)
            .and_then(|r| get(&r.sample))
    };
    let mut ratios: Vec<f64> = result
        .rounds
        .iter()
        .filter(|r| r.variant == v)
        .filter_map(|r| ratio(of(v, r.round), of(reference, r.round)))
        .collect();
    ratios.sort_by(f64::total_cmp);
    ratios
}

/// min–max of sorted ratios, or empty.
fn range(sorted: &[f64]) -> String {
    match (sorted.first(), sorted.last()) {
        (Some(lo), Some(hi)) => format!("{lo:.3}–{hi:.3}"),
        _ => String::new(),
    }
}

/// "yes" / "**no**" for a target and the ratios judged against it (all must meet
/// it), or empty when there is no target or no ratio.
fn verdict(target: Option<f64>, higher_is_better: bool, ratios: &[Option<f64>]) -> String {
    let Some(t) = target else {
        return String::new();
    };
    let known: Vec<f64> = ratios.iter().flatten().copied().collect();
    if known.is_empty() {
        return String::new();
    }
    let ok = known
        .iter()
        .all(|&r| if higher_is_better { r >= t } else { r <= t });
    if ok { "yes" } else { "**no**" }.to_string()
}

fn num(x: Option<f64>, decimals: usize) -> String {
    match x {
        Some(x) => format!("{x:.decimals$}"),
        None => "–".into(),
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Renders the whole block, markers included.
pub fn render(cfg: &Config, result: &RunResult, ctx: &Context) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "{BEGIN}");
    let order: Vec<String> = cfg
        .variants
        .iter()
        .map(|v| v.letter().to_string())
        .collect();
    let reversed: Vec<String> = order.iter().rev().cloned().collect();
    let pinning = match cfg.pin {
        Some(p) => format!(
            "every client (iperf3, RR/CRR) pinned to CPU {} and every server to CPU {}",
            p.client, p.server
        ),
        None => "clients and servers not pinned to CPUs".to_string(),
    };
    let _ = writeln!(
        s,
        "Measured {} on kernel {}, {} CPUs; load average (1/5/15 min) {} before, {} after. \
         {} round(s), each building every variant on a freshly built 2-node lab topology of \
         its own (underlay MTU {} through the lab's fabric bridge), then measuring each \
         metric on all of them back to back, in {} order or {} order alternately (by round \
         and metric); {}; iperf3 {} s per run, RR/CRR {} s after a {} s warm-up. Figures are \
         medians over rounds; a ratio is the variant's median ÷ the reference's median \
         ((a); in the VPC and A/A tables, the one named in the ratio's denominator), \"per round\" the median and range of the ratios of \
         the two figures of the same round; a target is met only when both the ratio and \
         the per-round median meet it (for latency rows a ratio above 1 is worse).",
        ctx.when,
        ctx.kernel,
        ctx.cpus,
        result.load_before,
        result.load_after,
        cfg.rounds,
        cfg.underlay_mtu,
        order.join(", "),
        reversed.join(", "),
        pinning,
        cfg.seconds,
        cfg.seconds,
        cfg.warmup,
    );
    let _ = writeln!(s, "\nProduced by:\n\n```\n{}\n```\n", ctx.command);
    main_table(&mut s, cfg, result);
    vpc_table(&mut s, cfg, result);
    control_table(&mut s, cfg, result);
    pair_table(
        &mut s,
        cfg,
        result,
        "tc tunnel against the VXLAN device tunnel (issue #14)",
        (Variant::Cozyplane, Variant::Device),
        false,
    );
    raw_table(&mut s, result);
    setup_table(&mut s, cfg, result);
    memory_table(&mut s, result);
    let _ = write!(s, "{END}");
    s
}

fn main_table(s: &mut String, cfg: &Config, result: &RunResult) {
    let has = |v: Variant| cfg.variants.contains(&v);
    let _ = writeln!(
        s,
        "| metric | {} | {} | {} | b/a | c/a | c/a per round, median | min–max | target c/a | c/a meets it | published b/a |",
        Variant::Limit.label(),
        Variant::Peer.label(),
        Variant::Cozyplane.label()
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|---|");
    for row in ROWS {
        let m = |v: Variant| {
            if has(v) {
                median_of(result, v, row.get)
            } else {
                None
            }
        };
        let (a, b, c) = (m(Variant::Limit), m(Variant::Peer), m(Variant::Cozyplane));
        if a.is_none() && b.is_none() && c.is_none() {
            continue;
        }
        let (ba, ca) = if row.ratios {
            (ratio(b, a), ratio(c, a))
        } else {
            (None, None)
        };
        let paired = if row.ratios {
            paired_ratios(result, Variant::Cozyplane, Variant::Limit, row.get)
        } else {
            Vec::new()
        };
        let paired_median = median(&paired);
        let meets = verdict(row.target, row.higher_is_better, &[ca, paired_median]);
        let target = row.target.map(|t| format!("≥ {t:.2}")).unwrap_or_default();
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            row.name.trim_start(),
            num(a, row.decimals),
            num(b, row.decimals),
            num(c, row.decimals),
            if row.ratios {
                num(ba, 3)
            } else {
                String::new()
            },
            if row.ratios {
                num(ca, 3)
            } else {
                String::new()
            },
            if row.ratios {
                num(paired_median, 3)
            } else {
                String::new()
            },
            range(&paired),
            target,
            meets,
            row.published_peer
                .map(|p| format!("{p:.3}"))
                .unwrap_or_default(),
        );
    }
    let _ = writeln!(s);
}

/// (d) against (c): the same datapath and topology, the pods in one VPC instead of on
/// net 0. Only when both ran.
fn vpc_table(s: &mut String, cfg: &Config, result: &RunResult) {
    pair_table(
        s,
        cfg,
        result,
        "VPC pods against net-0 pods, cross node (issue #10)",
        (Variant::Vpc, Variant::Cozyplane),
        true,
    );
}

/// (e) against (c), and (d) against (e): the A/A control. (e) is (c) built again after
/// (d), so e/c shows what the method itself makes of two identical datapaths (build
/// order, placement, noise), and d/e is the VPC cost against the later-built net 0.
fn control_table(s: &mut String, cfg: &Config, result: &RunResult) {
    pair_table(
        s,
        cfg,
        result,
        "A/A control: net 0 built again after the VPC variant",
        (Variant::Control, Variant::Cozyplane),
        false,
    );
    pair_table(
        s,
        cfg,
        result,
        "VPC pods against the A/A control's net-0 pods",
        (Variant::Vpc, Variant::Control),
        true,
    );
}

/// `v` against `reference`, both run in every round: medians, the ratio of medians and
/// the per-round paired ratios; judged against the VPC targets when `judged`. Only when
/// both ran.
fn pair_table(
    s: &mut String,
    cfg: &Config,
    result: &RunResult,
    title: &str,
    (v, reference): (Variant, Variant),
    judged: bool,
) {
    if !(cfg.variants.contains(&v) && cfg.variants.contains(&reference)) {
        return;
    }
    let (vl, rl) = (v.letter(), reference.letter());
    let _ = writeln!(s, "{title}:\n");
    let _ = writeln!(
        s,
        "| metric | {} | {} | {vl}/{rl} | {vl}/{rl} per round, median | min–max | target {vl}/{rl} | {vl}/{rl} meets it |",
        reference.label(),
        v.label()
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|");
    for row in ROWS {
        let r = median_of(result, reference, row.get);
        let x = median_of(result, v, row.get);
        if r.is_none() && x.is_none() {
            continue;
        }
        let xr = if row.ratios { ratio(x, r) } else { None };
        let paired = if row.ratios {
            paired_ratios(result, v, reference, row.get)
        } else {
            Vec::new()
        };
        let paired_median = median(&paired);
        let target = row.vpc_target.filter(|_| judged);
        let meets = verdict(target, row.higher_is_better, &[xr, paired_median]);
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            row.name.trim_start(),
            num(r, row.decimals),
            num(x, row.decimals),
            if row.ratios {
                num(xr, 3)
            } else {
                String::new()
            },
            if row.ratios {
                num(paired_median, 3)
            } else {
                String::new()
            },
            range(&paired),
            target.map(|t| format!("≥ {t:.2}")).unwrap_or_default(),
            meets,
        );
    }
    let _ = writeln!(s);
}

fn raw_table(s: &mut String, result: &RunResult) {
    let _ = writeln!(s, "Per round:\n");
    let _ = writeln!(
        s,
        "| round | variant | TCP 1 Gbit/s (retr) | TCP 4 Gbit/s (retr) | RR tps | RR p50/p99 µs | CRR conn/s | connect p50/p99 µs | txn p50/p99 µs | datapath drops | VPC metered packets out / in |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|---|");
    for r in &result.rounds {
        let x = &r.sample;
        let tp = |t: Option<crate::measure::Throughput>| match t {
            Some(t) => format!("{:.2} ({})", t.gbps, t.retransmits),
            None => "–".into(),
        };
        let pair = |l: Option<crate::rr::Latency>| match l {
            Some(l) => format!("{:.1} / {:.1}", l.p50_us, l.p99_us),
            None => "–".into(),
        };
        let rate = |r: Option<&crate::rr::RrReport>| match r {
            Some(r) if r.errors > 0 => format!("{:.0} ({} errors)", r.rate_per_s, r.errors),
            Some(r) => format!("{:.0}", r.rate_per_s),
            None => "–".into(),
        };
        let drops = if !r.variant.is_cozyplane() {
            String::new()
        } else if x.drops.is_empty() {
            "none".into()
        } else {
            x.drops
                .iter()
                .map(|(k, v)| format!("{k}: {v}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let metered = match x.metered {
            Some(m) => format!("{} / {}", m.egress_packets, m.ingress_packets),
            None => String::new(),
        };
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            r.round,
            r.variant,
            tp(x.tcp1),
            tp(x.tcp4),
            rate(x.rr.as_ref()),
            pair(x.rr.as_ref().and_then(|r| r.txn)),
            rate(x.crr.as_ref()),
            pair(x.crr.as_ref().and_then(|r| r.connect)),
            pair(x.crr.as_ref().and_then(|r| r.txn)),
            drops,
            metered,
        );
    }
    let _ = writeln!(s);
}

fn setup_table(s: &mut String, cfg: &Config, result: &RunResult) {
    let _ = writeln!(
        s,
        "The bench's own setup times, ms (medians over rounds):\n"
    );
    let _ = writeln!(
        s,
        "| variant | lab topology build | pod network setup | of which datapath load (2 nodes) | until first ping | teardown |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|");
    for &v in &cfg.variants {
        let m = |get: fn(&Sample) -> Duration| num(median_of(result, v, |x| Some(ms(get(x)))), 1);
        let load = if v.is_cozyplane() {
            m(|x| x.setup.datapath_load)
        } else {
            "–".into()
        };
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} |",
            v.label(),
            m(|x| x.setup.topology),
            m(|x| x.setup.network),
            load,
            m(|x| x.setup.first_ping),
            m(|x| x.setup.teardown),
        );
    }
    let _ = writeln!(s);
}

fn memory_table(s: &mut String, result: &RunResult) {
    if result.map_stats.is_empty() {
        return;
    }
    let _ = writeln!(s, "Datapath map memory per node (`memlock` from fdinfo):\n");
    let _ = writeln!(s, "| map | bytes | KiB |");
    let _ = writeln!(s, "|---|---|---|");
    let mut total = 0u64;
    for m in &result.map_stats {
        total += m.memlock_bytes;
        let _ = writeln!(
            s,
            "| `{}` | {} | {:.1} |",
            m.name,
            m.memlock_bytes,
            m.memlock_bytes as f64 / 1024.0
        );
    }
    let _ = writeln!(
        s,
        "| **total** | {total} | {:.1} |\n",
        total as f64 / 1024.0
    );
}

/// Replaces the block between [`BEGIN`] and [`END`] in `doc` with `block` (which
/// carries its own markers), or appends it when `doc` has none. A document with only
/// one marker, or with them out of order, is refused rather than guessed at.
pub fn splice(doc: &str, block: &str) -> Result<String> {
    splice_between(doc, block, BEGIN, END)
}

/// [`splice`] with other markers (the Services benchmark has its own block).
pub fn splice_between(doc: &str, block: &str, begin: &str, end_marker: &str) -> Result<String> {
    match (doc.find(begin), doc.find(end_marker)) {
        (Some(b), Some(e)) if b < e => {
            let end = e + end_marker.len();
            Ok(format!("{}{}{}", &doc[..b], block, &doc[end..]))
        }
        (None, None) => {
            let mut out = doc.to_string();
            if !out.is_empty() && !out.ends_with('\n') {
                out.push('\n');
            }
            if !out.is_empty() {
                out.push('\n');
            }
            out.push_str(block);
            out.push('\n');
            Ok(out)
        }
        _ => Err(BenchError::Invalid(format!(
            "the document has a broken marker pair (want {begin} … {end_marker}); not touching it"
        ))),
    }
}

/// Writes `block` into the file at `path` (see [`splice`]), atomically: a temporary
/// file next to it is renamed over it, so a failure leaves the old file intact.
pub fn write_block(path: &Path, block: &str) -> Result<()> {
    write_block_between(path, block, BEGIN, END)
}

/// [`write_block`] with other markers.
pub fn write_block_between(path: &Path, block: &str, begin: &str, end: &str) -> Result<()> {
    let doc = match std::fs::read_to_string(path) {
        Ok(d) => d,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(BenchError::io(format!("read {}", path.display()), e)),
    };
    let new = splice_between(&doc, block, begin, end)?;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = std::path::PathBuf::from(tmp);
    std::fs::write(&tmp, new)
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            BenchError::io(format!("write {}", path.display()), e)
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::measure::Throughput;
    use crate::rr::{Latency, Mode, RrReport};
    use crate::runner::{Metered, Metric, RoundResult};

    fn block(x: &str) -> String {
        format!("{BEGIN}\n{x}\n{END}")
    }

    #[test]
    fn splicing_replaces_only_the_old_block() {
        let doc = format!("# Benchmarks\n\nintro\n\n{}\n\nafter\n", block("old"));
        let out = splice(&doc, &block("new")).unwrap();
        assert_eq!(
            out,
            format!("# Benchmarks\n\nintro\n\n{}\n\nafter\n", block("new"))
        );
        // Idempotent on its own output.
        assert_eq!(splice(&out, &block("new")).unwrap(), out);
    }

    #[test]
    fn splicing_appends_to_a_document_without_markers() {
        assert_eq!(
            splice("", &block("x")).unwrap(),
            format!("{}\n", block("x"))
        );
        assert_eq!(
            splice("# T\ntext", &block("x")).unwrap(),
            format!("# T\ntext\n\n{}\n", block("x"))
        );
    }

    #[test]
    fn broken_markers_are_refused_and_the_file_is_kept() {
        assert!(splice(&format!("{BEGIN} only"), &block("x")).is_err());
        assert!(splice(&format!("{END} {BEGIN}"), &block("x")).is_err());
        let dir = std::env::temp_dir().join(format!("cpbench-report-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("doc.md");
        let original = format!("keep me {END}");
        std::fs::write(&path, &original).unwrap();
        assert!(write_block(&path, &block("x")).is_err());
        assert_eq!(std::fs::read_to_string(&path).unwrap(), original);
        std::fs::write(&path, format!("head\n{}\n", block("old"))).unwrap();
        write_block(&path, &block("new")).unwrap();
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            format!("head\n{}\n", block("new"))
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_target_is_met_only_by_both_ratios() {
        assert_eq!(verdict(Some(0.97), true, &[Some(0.98), Some(0.99)]), "yes");
        // The ratio of medians meets it, the median of the per-round ratios does not.
        assert_eq!(
            verdict(Some(0.97), true, &[Some(0.98), Some(0.96)]),
            "**no**"
        );
        assert_eq!(
            verdict(Some(0.97), true, &[Some(0.96), Some(0.98)]),
            "**no**"
        );
        // Latency rows: lower is better.
        assert_eq!(verdict(Some(1.1), false, &[Some(1.0), Some(1.05)]), "yes");
        assert_eq!(verdict(Some(1.1), false, &[Some(1.0), Some(1.2)]), "**no**");
        // What is unknown is not judged; nothing known, no verdict.
        assert_eq!(verdict(Some(0.97), true, &[Some(0.98), None]), "yes");
        assert_eq!(verdict(Some(0.97), true, &[None, None]), "");
        assert_eq!(verdict(None, true, &[Some(0.5)]), "");
    }

    fn rr(rate: f64, p50: f64) -> RrReport {
        let lat = Latency {
            p50_us: p50,
            p90_us: p50,
            p99_us: 2.0 * p50,
            mean_us: p50,
            max_us: 3.0 * p50,
        };
        RrReport {
            mode: Mode::Rr,
            n: 1,
            errors: 0,
            elapsed_s: 1.0,
            rate_per_s: rate,
            txn: Some(lat),
            connect: None,
        }
    }

    #[test]
    fn the_table_shows_medians_ratios_and_targets() {
        let cfg = Config {
            rounds: 3,
            seconds: 1,
            warmup: 1.0,
            variants: Variant::ALL.to_vec(),
            metrics: vec![Metric::Tcp1, Metric::Rr],
            tool: "/bin/true".into(),
            prefix: "cb1".into(),
            underlay_mtu: 1500,
            pin: Some(crate::runner::Pinning {
                client: 0,
                server: 1,
            }),
        };
        let mut result = RunResult::default();
        // (a) RR 100/200/300 → median 200; (c) 170/180/190 → 180 = 0.9 × (a): meets.
        // (b) 100 → 0.5 × (a). TCP: a = 10, c = 8 → 0.8, misses 0.85.
        // (d) RR 170/180/171 → 171 = 0.95 × (c): misses 0.97; per round 1.0, 0.947,
        // 0.95. TCP: d = 7.8 → 0.975 × (c): meets.
        // (e), the A/A control: RR 171/190/180 → 180 = 1.0 × (c), per round 1.006, 1.0,
        // 1.0; (d) against it 171/180 = 0.95, per round 0.994, 0.947, 0.95.
        for (round, (a, b, c, d, e)) in [
            (100.0, 100.0, 170.0, 170.0, 171.0),
            (300.0, 100.0, 190.0, 180.0, 190.0),
            (200.0, 100.0, 180.0, 171.0, 180.0),
        ]
        .into_iter()
        .enumerate()
        {
            for (variant, rate, gbps) in [
                (Variant::Limit, a, 10.0),
                (Variant::Peer, b, 5.0),
                (Variant::Cozyplane, c, 8.0),
                (Variant::Vpc, d, 7.8),
                (Variant::Control, e, 8.0),
                (Variant::Device, e, 6.4),
            ] {
                result.rounds.push(RoundResult {
                    round: round as u32 + 1,
                    variant,
                    sample: Sample {
                        rr: Some(rr(rate, 20.0)),
                        tcp1: Some(Throughput {
                            gbps,
                            retransmits: 3,
                        }),
                        metered: (variant == Variant::Vpc).then_some(Metered {
                            egress_packets: 5,
                            ingress_packets: 6,
                        }),
                        ..Sample::default()
                    },
                });
            }
        }
        let ctx = Context {
            when: "now".into(),
            kernel: "6.18".into(),
            cpus: 2,
            command: "cozyplane-bench --rounds 3".into(),
        };
        let out = render(&cfg, &result, &ctx);
        assert!(out.starts_with(BEGIN) && out.ends_with(END), "{out}");
        assert!(out.contains("cozyplane-bench --rounds 3"), "{out}");
        // The method: alternating order, pinning.
        assert!(
            out.contains("in a, b, c, d, e, f order or f, e, d, c, b, a order alternately"),
            "{out}"
        );
        assert!(
            out.contains("pinned to CPU 0 and every server to CPU 1"),
            "{out}"
        );
        // (c) against (f): tc against the device tunnel, 8 / 6.4 Gbit/s.
        let tc = out
            .split("tc tunnel against the VXLAN device tunnel")
            .nth(1)
            .unwrap_or_else(|| panic!("no tc/device table: {out}"));
        assert!(
            tc.lines()
                .any(|l| l.starts_with("| TCP 1 stream") && l.contains("| 1.250 |")),
            "{tc}"
        );
        // The main table's row, and the VPC table's (the second of that name).
        let nth_line = |name: &str, n: usize| {
            out.lines()
                .filter(|l| l.starts_with(&format!("| {name} |")))
                .nth(n)
                .unwrap_or_else(|| panic!("no row {name} #{n}: {out}"))
                .to_string()
        };
        let line = |name: &str| nth_line(name, 0);
        let vpc_line = |name: &str| nth_line(name, 1);
        assert_eq!(
            line("TCP_RR 1 B, transactions/s"),
            "| TCP_RR 1 B, transactions/s | 200 | 100 | 180 | 0.500 | 0.900 | 0.900 | 0.633–1.700 | ≥ 0.90 | yes | 0.757 |"
        );
        assert_eq!(
            line("TCP 1 stream, Gbit/s"),
            "| TCP 1 stream, Gbit/s | 10.00 | 5.00 | 8.00 | 0.500 | 0.800 | 0.800 | 0.800–0.800 | ≥ 0.85 | **no** | 0.718 |"
        );
        // Retransmit counts get figures but no ratios.
        assert_eq!(
            line("retransmits, 1 stream"),
            "| retransmits, 1 stream | 3 | 3 | 3 |  |  |  |  |  |  |  |"
        );
        // Metrics that were not measured get no row.
        assert!(!out.contains("| TCP_CRR 1 B"), "{out}");
        // VPC pods ÷ net-0 pods, against issue #10's 0.97.
        assert_eq!(
            vpc_line("TCP_RR 1 B, transactions/s"),
            "| TCP_RR 1 B, transactions/s | 180 | 171 | 0.950 | 0.950 | 0.947–1.000 | ≥ 0.97 | **no** |"
        );
        assert_eq!(
            vpc_line("TCP 1 stream, Gbit/s"),
            "| TCP 1 stream, Gbit/s | 8.00 | 7.80 | 0.975 | 0.975 | 0.975–0.975 | ≥ 0.97 | yes |"
        );
        assert_eq!(
            vpc_line("TCP_RR p50 µs"),
            "| TCP_RR p50 µs | 20.0 | 20.0 | 1.000 | 1.000 | 1.000–1.000 |  |  |"
        );
        assert_eq!(
            vpc_line("retransmits, 1 stream"),
            "| retransmits, 1 stream | 3 | 3 |  |  |  |  |  |"
        );
        // The A/A control: (e) against (c), judged against nothing, then (d) against (e),
        // judged against the VPC target.
        assert_eq!(
            nth_line("TCP_RR 1 B, transactions/s", 2),
            "| TCP_RR 1 B, transactions/s | 180 | 180 | 1.000 | 1.000 | 1.000–1.006 |  |  |"
        );
        assert_eq!(
            nth_line("TCP_RR 1 B, transactions/s", 3),
            "| TCP_RR 1 B, transactions/s | 180 | 171 | 0.950 | 0.950 | 0.947–0.994 | ≥ 0.97 | **no** |"
        );
        assert!(
            out.contains(
                "| metric | (c) cozyplane eBPF | (e) cozyplane eBPF again [A/A control] | e/c |"
            ),
            "{out}"
        );
        // Raw rows: one per (round, variant); (c) and (d) show drops, (d) its meter.
        assert_eq!(
            out.lines().filter(|l| l.starts_with("| 2 | c |")).count(),
            1
        );
        assert!(
            nth_line("2 | c", 0).ends_with("| none |  |"),
            "{}",
            nth_line("2 | c", 0)
        );
        assert!(
            nth_line("2 | d", 0).ends_with("| none | 5 / 6 |"),
            "{}",
            nth_line("2 | d", 0)
        );

        // Without (d) there is no VPC table.
        let cfg = Config {
            variants: vec![Variant::Limit, Variant::Cozyplane],
            ..cfg
        };
        let out = render(&cfg, &result, &ctx);
        assert!(!out.contains("VPC pods against net-0 pods"), "{out}");
        assert!(!out.contains("A/A control"), "{out}");
    }
}
