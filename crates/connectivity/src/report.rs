//! Turning client reports into the PASS/FAIL/SKIP matrix (pure; printed by the caller).
use std::collections::HashMap;

use cozyplane_probe::{Proto, Report};

use crate::matrix::{Matrix, Runner};

/// The verdict of one row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The check passed.
    Pass,
    /// It failed (or its client gave no report).
    Fail,
    /// It was not run.
    Skip,
}

impl Verdict {
    fn label(self) -> &'static str {
        match self {
            Verdict::Pass => "PASS",
            Verdict::Fail => "FAIL",
            Verdict::Skip => "SKIP",
        }
    }
}

/// One line of the result.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// Verdict.
    pub verdict: Verdict,
    /// Check id.
    pub id: String,
    /// `client → echo-b 10.244.2.3:8000`.
    pub path: String,
    /// Time, for checks that ran.
    pub ms: Option<f64>,
    /// Error (FAIL) or reason (SKIP).
    pub detail: Option<String>,
}

/// What came back from one client pod.
#[derive(Debug, Clone)]
pub enum ClientResult {
    /// A parsed report.
    Report(Report),
    /// No usable report; the text says what the pod's state was.
    Missing(String),
}

/// Matches the reports against the matrix: every row gets a verdict.
///
/// A blocked ICMP row passes only if its control (a row of the same client expecting an
/// echo reply, [`crate::matrix::PlannedCheck::control`]) passed too: silence from a probe
/// that could not ping anything proves no isolation.
pub fn rows(matrix: &Matrix, results: &HashMap<Runner, ClientResult>) -> Vec<Row> {
    let mut rows = plain_rows(matrix, results);
    let passed: HashMap<String, bool> = rows
        .iter()
        .map(|r| (r.id.clone(), r.verdict == Verdict::Pass))
        .collect();
    for (row, c) in rows.iter_mut().zip(&matrix.checks) {
        if row.verdict != Verdict::Pass || !(c.expect_blocked && c.proto == Proto::Icmp) {
            continue;
        }
        let why = match &c.control {
            None => "no control row: nothing in this run shows the probe can ping".to_string(),
            Some(id) if passed.get(id).copied() == Some(true) => continue,
            Some(id) => format!(
                "inconclusive: its control {id} got no echo reply in this run, so the \
                 silence may be the probe's, not the network's"
            ),
        };
        row.verdict = Verdict::Fail;
        row.detail = Some(why);
    }
    rows
}

fn plain_rows(matrix: &Matrix, results: &HashMap<Runner, ClientResult>) -> Vec<Row> {
    matrix
        .checks
        .iter()
        .map(|c| {
            // `↛`: a blocked check (it passes when the target does not answer).
            let arrow = if c.expect_blocked { "↛" } else { "→" };
            let path = match &c.target {
                Some(t) => format!("{} {arrow} {} {t}", c.runner.pod_name(), c.to),
                None => format!("{} {arrow} {}", c.runner.pod_name(), c.to),
            };
            let (verdict, ms, detail) = if let Some(reason) = &c.skip {
                (Verdict::Skip, None, Some(reason.clone()))
            } else {
                match results.get(&c.runner) {
                    Some(ClientResult::Report(r)) => {
                        match r.results.iter().find(|o| o.id == c.id) {
                            // A row the test judged itself says what it measured.
                            Some(o) if o.ok => (
                                Verdict::Pass,
                                Some(o.ms),
                                c.target.is_none().then(|| o.answer.clone()).flatten(),
                            ),
                            Some(o) => (
                                Verdict::Fail,
                                Some(o.ms),
                                Some(o.error.clone().unwrap_or_else(|| "failed".into())),
                            ),
                            None => (
                                Verdict::Fail,
                                None,
                                Some(format!("missing from {}'s report", c.runner.pod_name())),
                            ),
                        }
                    }
                    // The pod's state is printed once, above the matrix, not on every row.
                    Some(ClientResult::Missing(_)) => (
                        Verdict::Fail,
                        None,
                        Some(format!(
                            "no report from pod {} (its state is printed above)",
                            c.runner.pod_name()
                        )),
                    ),
                    None => (
                        Verdict::Fail,
                        None,
                        Some(format!("pod {} did not run", c.runner.pod_name())),
                    ),
                }
            };
            Row {
                verdict,
                id: c.id.clone(),
                path,
                ms,
                detail,
            }
        })
        .collect()
}

/// Counts (passed, failed, skipped).
pub fn counts(rows: &[Row]) -> (usize, usize, usize) {
    let n = |v| rows.iter().filter(|r| r.verdict == v).count();
    (n(Verdict::Pass), n(Verdict::Fail), n(Verdict::Skip))
}

/// The aligned lines of the matrix, then the summary line.
pub fn format(rows: &[Row]) -> Vec<String> {
    let id_w = rows.iter().map(|r| r.id.chars().count()).max().unwrap_or(0);
    let path_w = rows
        .iter()
        .map(|r| r.path.chars().count())
        .max()
        .unwrap_or(0);
    let mut out: Vec<String> = rows
        .iter()
        .map(|r| {
            let ms = r.ms.map(format_ms).unwrap_or_default();
            let mut line = format!(
                "{}  {:<id_w$}  {:<path_w$}  {:>9}",
                r.verdict.label(),
                r.id,
                r.path,
                ms
            );
            if let Some(d) = &r.detail {
                line.push_str("  ");
                line.push_str(d);
            }
            line.trim_end().to_string()
        })
        .collect();
    let (p, f, s) = counts(rows);
    out.push(format!("{p} passed, {f} failed, {s} skipped"));
    out
}

/// `1.2 ms`, `3000 ms`: one decimal below a second, whole milliseconds above.
pub fn format_ms(ms: f64) -> String {
    if ms < 1000.0 {
        format!("{ms:.1} ms")
    } else {
        format!("{ms:.0} ms")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::matrix::{build, External, Layout, NodeInfo};
    use cozyplane_probe::Outcome;

    fn layout() -> Layout {
        Layout {
            node_a: NodeInfo {
                name: "a".into(),
                internal_ip: "198.18.0.11".parse().expect("ip"),
            },
            node_b: None,
            node_c: None,
            echo_a_ip: "10.244.1.5".parse().expect("ip"),
            echo_b_ip: None,
            external: Some(External {
                target: "198.19.0.2:8000".into(),
                name: Some("external".into()),
            }),
            check_timeout_ms: 3000,
            tenancy: None,
            services: None,
            no_services: false,
            policy_echo_ip: None,
        }
    }

    fn outcome(id: &str, ok: bool, ms: f64, error: Option<&str>) -> Outcome {
        Outcome {
            id: id.into(),
            ok,
            ms,
            answer: None,
            error: error.map(str::to_string),
        }
    }

    #[test]
    fn pass_fail_skip_and_missing_rows() {
        let m = build(&layout());
        let client = Report {
            results: vec![
                outcome("pod-to-pod/same-node/tcp", true, 1.23, None),
                outcome(
                    "pod-to-pod/same-node/udp",
                    false,
                    3001.0,
                    Some("udp 10.244.1.5:8000: no answer"),
                ),
                // http and the others are absent from the report.
                outcome("pod-to-node/same-node/tcp", true, 0.5, None),
            ],
        };
        let mut results = HashMap::new();
        results.insert(Runner::Client, ClientResult::Report(client));
        results.insert(
            Runner::HostClient,
            ClientResult::Missing("phase Failed, exit code 2, message \"\"".into()),
        );
        let rows = rows(&m, &results);
        let get = |id: &str| rows.iter().find(|r| r.id == id).expect(id);

        let pass = get("pod-to-pod/same-node/tcp");
        assert_eq!(pass.verdict, Verdict::Pass);
        assert_eq!(pass.path, "client → echo-a 10.244.1.5:8000");
        assert_eq!(pass.ms, Some(1.23));

        let fail = get("pod-to-pod/same-node/udp");
        assert_eq!(fail.verdict, Verdict::Fail);
        assert_eq!(
            fail.detail.as_deref(),
            Some("udp 10.244.1.5:8000: no answer")
        );

        let absent = get("pod-to-pod/same-node/http");
        assert_eq!(absent.verdict, Verdict::Fail);
        assert!(absent
            .detail
            .as_deref()
            .is_some_and(|d| d.contains("missing from client's report")));

        let skipped = get("pod-to-pod/cross-node/tcp");
        assert_eq!(skipped.verdict, Verdict::Skip);
        assert_eq!(skipped.path, "client → echo-b");

        let no_report = get("node-to-pod/same-node/tcp");
        assert_eq!(no_report.verdict, Verdict::Fail);
        assert!(no_report
            .detail
            .as_deref()
            .is_some_and(|d| d.starts_with("no report from pod host-client (")));

        // 29 rows: 2 pass; cross-node (3+2+3) and the services group (14, no
        // Services in this layout) skipped; the rest (5) fail.
        assert_eq!(counts(&rows), (2, 5, 22));
    }

    #[test]
    fn a_silent_icmp_row_passes_only_if_its_control_got_a_reply() {
        use crate::matrix::{PlannedCheck, Slot, TenancyLayout, VpcEchoes};
        use crate::tenancy::Tenant;
        let mut l = layout();
        l.tenancy = Some(TenancyLayout {
            t1: VpcEchoes {
                echo_a: "10.250.0.2".parse().expect("ip"),
                echo_b: None,
                echo_c: None,
            },
            t2: VpcEchoes {
                echo_a: "10.250.0.7".parse().expect("ip"),
                echo_b: None,
                echo_c: None,
            },
            t3: VpcEchoes {
                echo_a: "10.251.0.2".parse().expect("ip"),
                echo_b: None,
                echo_c: None,
            },
            sg_api: "10.250.0.9".parse().expect("ip"),
        });
        let m = build(&l);
        // t1's second client on node A runs the ICMP isolation rows.
        let pinger = Runner::Member(Tenant::T1, Slot::A);
        let blocked = "tenancy/vpc-to-default/same-node/icmp";
        let c: &PlannedCheck = m.checks.iter().find(|c| c.id == blocked).expect("row");
        assert_eq!(
            c.control.as_deref(),
            Some("tenancy/same-vpc/t1/a-to-a/icmp")
        );
        // Every check of t1-client-a passes, the ICMP control included …
        let report = |control_ok: bool| Report {
            results: m
                .checks
                .iter()
                .filter(|c| c.runner == pinger)
                .map(|c| {
                    let ok = control_ok || c.id != "tenancy/same-vpc/t1/a-to-a/icmp";
                    outcome(&c.id, ok, 1.0, (!ok).then_some("icmp: no answer"))
                })
                .collect(),
        };
        let verdict = |control_ok: bool| {
            let results = HashMap::from([(pinger, ClientResult::Report(report(control_ok)))]);
            rows(&m, &results)
                .into_iter()
                .find(|r| r.id == blocked)
                .expect("row")
        };
        assert_eq!(verdict(true).verdict, Verdict::Pass);
        // … but without an echo reply on the control, silence proves nothing.
        let r = verdict(false);
        assert_eq!(r.verdict, Verdict::Fail);
        assert!(
            r.detail.as_deref().is_some_and(|d| d.starts_with(
                "inconclusive: its control tenancy/same-vpc/t1/a-to-a/icmp got no echo reply"
            )),
            "{r:?}"
        );
        // A blocked TCP row has no control and is judged on its own.
        let tcp = m
            .checks
            .iter()
            .find(|c| c.id == "tenancy/vpc-to-default/same-node/tcp")
            .expect("row");
        assert_eq!(tcp.control, None);
        // A blocked ICMP row without any control cannot pass.
        let mut lone = m.clone();
        for c in &mut lone.checks {
            c.control = None;
        }
        let results = HashMap::from([(pinger, ClientResult::Report(report(true)))]);
        let r = rows(&lone, &results)
            .into_iter()
            .find(|r| r.id == blocked)
            .expect("row");
        assert_eq!(r.verdict, Verdict::Fail);
        assert!(r
            .detail
            .as_deref()
            .is_some_and(|d| d.starts_with("no control row")));
    }

    #[test]
    fn formatted_lines_are_aligned_and_end_with_a_summary() {
        let rows = vec![
            Row {
                verdict: Verdict::Pass,
                id: "pod-to-pod/cross-node/tcp".into(),
                path: "client → echo-b 10.244.2.3:8000".into(),
                ms: Some(1.23),
                detail: None,
            },
            Row {
                verdict: Verdict::Fail,
                id: "pod-to-pod/cross-node/udp".into(),
                path: "client → echo-b 10.244.2.3:8000".into(),
                ms: Some(3000.4),
                detail: Some("no answer".into()),
            },
            Row {
                verdict: Verdict::Skip,
                id: "pod-to-external/tcp".into(),
                path: "client → external".into(),
                ms: None,
                detail: Some("no external target".into()),
            },
        ];
        let lines = format(&rows);
        assert_eq!(
            lines,
            vec![
                "PASS  pod-to-pod/cross-node/tcp  client → echo-b 10.244.2.3:8000     1.2 ms",
                "FAIL  pod-to-pod/cross-node/udp  client → echo-b 10.244.2.3:8000    3000 ms  no answer",
                "SKIP  pod-to-external/tcp        client → external                           no external target",
                "1 passed, 1 failed, 1 skipped",
            ]
        );
        // Details start in the same column whether or not a time is shown.
        let col = |line: &str, needle: &str| line.find(needle).map(|b| line[..b].chars().count());
        assert_eq!(
            col(&lines[1], "no answer"),
            col(&lines[2], "no external target")
        );
    }
}
