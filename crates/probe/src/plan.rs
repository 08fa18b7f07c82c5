//! The plan a probe client runs and the report it writes: the wire format shared with the
//! connectivity test, which builds plans and parses reports with these same types.
//!
//! The report travels through Kubernetes' termination message, which is capped at 4096
//! bytes per container, so [`Report::to_line`] shrinks free-text fields until it fits
//! rather than letting the kubelet cut the JSON in the middle.
use std::collections::HashSet;

use serde::{Deserialize, Serialize};

/// Largest report line, in bytes (Kubernetes' terminationMessage limit).
pub const MAX_REPORT_BYTES: usize = 4096;
/// Longest `answer` kept in a report, in characters.
pub const MAX_ANSWER_CHARS: usize = 64;
/// Longest `error` kept in a report, in characters.
pub const MAX_ERROR_CHARS: usize = 120;
/// Longest timeout a check may ask for: a plan is a one-shot job, not a monitor.
pub const MAX_TIMEOUT_MS: u64 = 10 * 60 * 1000;

/// The checks one client runs, all at once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    /// The checks.
    pub checks: Vec<Check>,
}

/// One check: talk `proto` to `target` and expect `expect` as the answer, or, with
/// `expect_blocked`, expect no answer at all (an isolation check).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Check {
    /// Stable id, e.g. `pod-to-pod/cross-node/tcp` (users and tests grep these).
    pub id: String,
    /// The protocol.
    pub proto: Proto,
    /// `IP:PORT` (or `host:port`, resolved by the client).
    pub target: String,
    /// The answer that makes the check pass; `null` accepts any answer.
    pub expect: Option<String>,
    /// How long the check may retry before it fails (a blocked check: how long it
    /// listens for an answer that must not come).
    pub timeout_ms: u64,
    /// A negative check: it passes when the target does not answer for the whole
    /// timeout (no reply, refused, unreachable) and fails as soon as it answers. Absent
    /// from the JSON when false, so plans without it read and write as before.
    #[serde(default, skip_serializing_if = "is_false")]
    pub expect_blocked: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// The protocol of a check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Proto {
    /// Connect, read to EOF.
    Tcp,
    /// Send `probe`, await one datagram.
    Udp,
    /// `GET /`, status 200, the body is the answer.
    Http,
    /// `GET /peer`, status 200: the body is the server's name and the address the
    /// connection came from (`<name> <ip>`), to check what source a translation left.
    Peer,
    /// One ICMP (ICMPv6) echo request, the target's echo reply is the answer (`echo
    /// reply from <ip>`); the target's port is ignored. Needs CAP_NET_RAW (a raw socket).
    Icmp,
    /// One SCTP INIT, the target's INIT ACK is the answer (its State Cookie, the
    /// server's name: `probe server --sctp-port`). Raw sockets, so it works on kernels
    /// without SCTP; needs CAP_NET_RAW ([`crate::sctp`]).
    Sctp,
}

impl std::fmt::Display for Proto {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Proto::Tcp => "tcp",
            Proto::Udp => "udp",
            Proto::Http => "http",
            Proto::Peer => "peer",
            Proto::Icmp => "icmp",
            Proto::Sctp => "sctp",
        })
    }
}

/// What a client found.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// One outcome per check, in plan order.
    pub results: Vec<Outcome>,
}

/// The outcome of one check.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Outcome {
    /// The check's id.
    pub id: String,
    /// Exchange completed and the answer matched.
    pub ok: bool,
    /// Milliseconds: the successful attempt, or the whole time spent on failure.
    pub ms: f64,
    /// What the target answered (trimmed), if it answered.
    pub answer: Option<String>,
    /// Why the check failed.
    pub error: Option<String>,
}

/// A plan that cannot be run.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// Not valid plan JSON.
    #[error("the plan is not valid JSON for {{\"checks\":[{{\"id\",\"proto\",\"target\",\"expect\",\"timeoutMs\",\"expectBlocked\"?}}]}}")]
    Json(#[from] serde_json::Error),
    /// No checks.
    #[error("the plan has no checks")]
    Empty,
    /// Two checks share an id, so their results could not be told apart.
    #[error("the plan has two checks with id {0:?}")]
    DuplicateId(String),
    /// A check with an empty id or target, or a timeout out of range.
    #[error("check {id:?}: {reason}")]
    BadCheck {
        /// The check.
        id: String,
        /// What is wrong.
        reason: String,
    },
}

impl Plan {
    /// Parses and validates a plan.
    pub fn parse(json: &str) -> Result<Self, PlanError> {
        let plan: Plan = serde_json::from_str(json)?;
        plan.validate()?;
        Ok(plan)
    }

    /// Checks the invariants the client relies on.
    pub fn validate(&self) -> Result<(), PlanError> {
        if self.checks.is_empty() {
            return Err(PlanError::Empty);
        }
        let mut seen = HashSet::new();
        for c in &self.checks {
            let bad = |reason: &str| PlanError::BadCheck {
                id: c.id.clone(),
                reason: reason.to_string(),
            };
            if c.id.trim().is_empty() {
                return Err(bad("empty id"));
            }
            if c.target.trim().is_empty() {
                return Err(bad("empty target"));
            }
            if c.timeout_ms == 0 || c.timeout_ms > MAX_TIMEOUT_MS {
                return Err(bad(&format!(
                    "timeoutMs must be between 1 and {MAX_TIMEOUT_MS}, got {}",
                    c.timeout_ms
                )));
            }
            if c.expect_blocked && c.expect.is_some() {
                return Err(bad(
                    "expectBlocked and expect exclude each other (a blocked check expects no answer)",
                ));
            }
            if !seen.insert(c.id.as_str()) {
                return Err(PlanError::DuplicateId(c.id.clone()));
            }
        }
        Ok(())
    }

    /// The plan as one compact JSON string (what goes into a pod's args).
    pub fn to_json(&self) -> Result<String, serde_json::Error> {
        serde_json::to_string(self)
    }
}

impl Report {
    /// Parses a report line (a termination message or the last stdout line).
    pub fn parse(text: &str) -> Result<Self, serde_json::Error> {
        serde_json::from_str(text.trim())
    }

    /// The failed outcomes.
    pub fn failures(&self) -> impl Iterator<Item = &Outcome> {
        self.results.iter().filter(|o| !o.ok)
    }

    /// One compact JSON line of at most [`MAX_REPORT_BYTES`] bytes.
    ///
    /// Fields are first capped at [`MAX_ANSWER_CHARS`]/[`MAX_ERROR_CHARS`]; if the line is
    /// still too long, errors and then answers are shortened step by step (ids, `ok` and
    /// `ms` are never touched: they are what the reader needs most).
    pub fn to_line(&self) -> Result<String, serde_json::Error> {
        let mut r = self.clone();
        for o in &mut r.results {
            o.ms = (o.ms * 1000.0).round() / 1000.0;
        }
        let steps: [(usize, usize); 6] = [
            (MAX_ANSWER_CHARS, MAX_ERROR_CHARS),
            (MAX_ANSWER_CHARS, 80),
            (32, 60),
            (16, 40),
            (8, 20),
            (0, 0),
        ];
        let mut line = String::new();
        for (answer_max, error_max) in steps {
            for o in &mut r.results {
                cap(&mut o.answer, answer_max);
                cap(&mut o.error, error_max);
            }
            line = serde_json::to_string(&r)?;
            if line.len() <= MAX_REPORT_BYTES {
                break;
            }
        }
        Ok(line)
    }
}

/// Shortens `field` to `max` characters, marking the cut with `…`; `max == 0` drops it.
fn cap(field: &mut Option<String>, max: usize) {
    if max == 0 {
        *field = None;
        return;
    }
    if let Some(s) = field {
        if s.chars().count() > max {
            let kept: String = s.chars().take(max - 1).collect();
            *s = format!("{kept}…");
        }
    }
}

/// Shortens text to at most `max` characters (for fields built by the client).
pub fn truncate_chars(s: &str, max: usize) -> String {
    let mut f = Some(s.to_string());
    cap(&mut f, max);
    f.unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_contract_example() {
        let plan = Plan::parse(
            r#"{"checks":[{"id":"pod-to-pod/cross-node/tcp","proto":"tcp","target":"10.244.2.3:8000","expect":"echo-b","timeoutMs":3000},
                {"id":"x","proto":"udp","target":"1.2.3.4:1","expect":null,"timeoutMs":1}]}"#,
        )
        .expect("valid");
        assert_eq!(plan.checks.len(), 2);
        assert_eq!(plan.checks[0].proto, Proto::Tcp);
        assert_eq!(plan.checks[0].expect.as_deref(), Some("echo-b"));
        assert_eq!(plan.checks[0].timeout_ms, 3000);
        assert_eq!(plan.checks[1].expect, None);
        // Round trip through the compact form keeps everything, with the contract's keys.
        let json = plan.to_json().expect("json");
        assert!(json.contains(r#""timeoutMs":3000"#), "{json}");
        assert!(json.contains(r#""expect":null"#), "{json}");
        assert_eq!(Plan::parse(&json).expect("round trip"), plan);
    }

    #[test]
    fn rejects_bad_plans_with_reasons() {
        let err = |s: &str| Plan::parse(s).expect_err(s).to_string();
        assert!(err("{}").contains("not valid JSON"));
        assert!(err(r#"{"checks":[]}"#).contains("no checks"));
        let c = |id: &str, proto: &str, t: u64| {
            format!(
                r#"{{"id":"{id}","proto":"{proto}","target":"1.2.3.4:5","expect":null,"timeoutMs":{t}}}"#
            )
        };
        assert!(err(&format!(r#"{{"checks":[{}]}}"#, c("a", "dccp", 1))).contains("not valid JSON"));
        assert!(err(&format!(r#"{{"checks":[{}]}}"#, c("a", "tcp", 0))).contains("timeoutMs"));
        assert!(err(&format!(r#"{{"checks":[{}]}}"#, c(" ", "tcp", 5))).contains("empty id"));
        let dup = err(&format!(
            r#"{{"checks":[{},{}]}}"#,
            c("a", "tcp", 5),
            c("a", "udp", 5)
        ));
        assert!(dup.contains("two checks with id \"a\""), "{dup}");
    }

    #[test]
    fn report_line_uses_contract_keys_and_round_trips() {
        let r = Report {
            results: vec![Outcome {
                id: "pod-to-pod/same-node/tcp".into(),
                ok: true,
                ms: 1.234_567,
                answer: Some("echo-a".into()),
                error: None,
            }],
        };
        let line = r.to_line().expect("line");
        assert_eq!(
            line,
            r#"{"results":[{"id":"pod-to-pod/same-node/tcp","ok":true,"ms":1.235,"answer":"echo-a","error":null}]}"#
        );
        let back = Report::parse(&format!("{line}\n")).expect("parse");
        assert_eq!(back.results[0].ms, 1.235);
        assert_eq!(back.failures().count(), 0);
    }

    /// Worst case: 20 failed checks with long ids, maximal answers and errors, multi-byte text.
    #[test]
    fn report_of_twenty_worst_case_checks_fits_4096_bytes() {
        let results = (0..20)
            .map(|i| Outcome {
                id: format!("node-to-pod/cross-node/http-with-a-long-suffix-{i:02}"),
                ok: false,
                ms: 123_456.789,
                answer: Some("é".repeat(500)),
                error: Some("connection refused ".repeat(30)),
            })
            .collect();
        let r = Report { results };
        let line = r.to_line().expect("line");
        assert!(line.len() <= MAX_REPORT_BYTES, "{} bytes", line.len());
        let back = Report::parse(&line).expect("still valid JSON");
        assert_eq!(back.results.len(), 20);
        assert!(back
            .results
            .iter()
            .all(|o| !o.ok && o.id.starts_with("node-to-pod/")));
        // Something of the error survives for the reader.
        assert!(back.results[0]
            .error
            .as_deref()
            .is_some_and(|e| e.starts_with("connection")));
    }

    #[test]
    fn typical_report_keeps_full_fields() {
        let o = Outcome {
            id: "x".into(),
            ok: false,
            ms: 1.0,
            answer: Some("a".repeat(100)),
            error: Some("b".repeat(200)),
        };
        let line = Report { results: vec![o] }.to_line().expect("line");
        let back = Report::parse(&line).expect("parse");
        assert_eq!(
            back.results[0].answer.as_ref().map(|a| a.chars().count()),
            Some(MAX_ANSWER_CHARS)
        );
        assert_eq!(
            back.results[0].error.as_ref().map(|e| e.chars().count()),
            Some(MAX_ERROR_CHARS)
        );
    }
}
