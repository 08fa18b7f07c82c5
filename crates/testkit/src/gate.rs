//! The gate: run, fail under CI, or skip visibly (see the crate docs).

use cozyplane_errors::Chain;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

/// The environment variable naming the file skipped tests are appended to.
pub const SKIP_LOG: &str = "COZYPLANE_SKIP_LOG";

/// Whether this runs under CI: `CI` is set to anything but empty, `0` or
/// `false`. Under CI a test that cannot run fails instead of skipping.
pub fn in_ci() -> bool {
    ci_value_means_ci(std::env::var("CI").ok().as_deref())
}

fn ci_value_means_ci(value: Option<&str>) -> bool {
    value.is_some_and(|v| {
        let v = v.trim();
        !(v.is_empty() || v == "0" || v.eq_ignore_ascii_case("false"))
    })
}

/// Whether the effective uid is 0.
pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// A command-line tool a test runs, probed by running it.
#[derive(Debug, Clone, Copy)]
pub struct Tool {
    /// The program (looked up on `PATH`).
    pub bin: &'static str,
    /// Arguments that make it print its version and exit 0.
    pub probe: &'static [&'static str],
    /// Where it comes from, for the message (`iproute2`, …).
    pub package: &'static str,
}

impl Tool {
    pub const fn new(
        bin: &'static str,
        probe: &'static [&'static str],
        package: &'static str,
    ) -> Self {
        Tool {
            bin,
            probe,
            package,
        }
    }

    /// Whether `<bin> <probe…>` runs and exits 0.
    pub fn present(&self) -> bool {
        Command::new(self.bin)
            .args(self.probe)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    fn describe(&self) -> String {
        format!("`{}` ({})", self.bin, self.package)
    }
}

/// The tools the tests use.
pub mod tools {
    use super::Tool;

    pub const IP: Tool = Tool::new("ip", &["-V"], "iproute2");
    pub const BRIDGE: Tool = Tool::new("bridge", &["-V"], "iproute2");
    pub const SS: Tool = Tool::new("ss", &["-V"], "iproute2");
    pub const PING: Tool = Tool::new("ping", &["-V"], "iputils-ping");
    pub const IPTABLES_RESTORE: Tool = Tool::new("iptables-restore", &["--version"], "iptables");
    /// What network-namespace tests drive: `ip` and `ping`.
    pub const NETNS: &[Tool] = &[IP, PING];
}

/// What one test needs before it can run; [`Needs::ready`] decides.
/// Build it with [`crate::needs!`] (the test's own name) or [`Needs::new`].
#[must_use = "nothing is checked until `.ready()`"]
#[derive(Debug)]
pub struct Needs {
    test: String,
    missing: Vec<String>,
}

impl Needs {
    /// Needs of the test called `test` (as libtest names it).
    pub fn new(test: impl Into<String>) -> Self {
        Needs {
            test: test.into(),
            missing: Vec::new(),
        }
    }

    /// Root (the effective uid is 0).
    pub fn root(self) -> Self {
        self.that(is_root(), "root")
    }

    /// A tool, probed by running it.
    pub fn tool(self, tool: &Tool) -> Self {
        let describe = tool.describe();
        self.that(tool.present(), describe)
    }

    /// Each of `tools`.
    pub fn tools(self, tools: &[Tool]) -> Self {
        tools.iter().fold(self, |n, t| n.tool(t))
    }

    /// A file or directory at `path`; `what` says what it is.
    pub fn file(self, path: impl AsRef<Path>, what: &str) -> Self {
        let path = path.as_ref();
        let describe = format!("{what} at {}", path.display());
        self.that(path.exists(), describe)
    }

    /// Anything else: `what` is missing unless `ok`.
    pub fn that(mut self, ok: bool, what: impl Into<String>) -> Self {
        if !ok {
            self.missing.push(what.into());
        }
        self
    }

    /// A fixture or a finder's answer: its error, if any, is what is missing
    /// (described with its whole chain of causes).
    pub fn found<T, E: std::error::Error>(self, found: &Result<T, E>) -> Self {
        match found {
            Ok(_) => self,
            Err(e) => {
                let describe = Chain(e).to_string();
                self.that(false, describe)
            }
        }
    }

    /// What is missing so far.
    pub fn missing(&self) -> &[String] {
        &self.missing
    }

    /// The verdict: `true` when everything is here. Otherwise panics under
    /// CI, and elsewhere prints and logs `SKIP <test>: …` and answers `false`
    /// (the test returns early).
    pub fn ready(self) -> bool {
        match verdict(&self.test, &self.missing, in_ci()) {
            Verdict::Run => true,
            Verdict::Fail(message) => panic!("{message}"),
            Verdict::Skip(line) => {
                report_skip(&line);
                false
            }
        }
    }

    /// [`Needs::ready`] with one more need that carries a value (etcd's
    /// endpoint, kubectl's path): the value when the test can run.
    pub fn ready_with<T, E: std::error::Error>(self, found: Result<T, E>) -> Option<T> {
        let ready = self.found(&found).ready();
        match found {
            Ok(value) if ready => Some(value),
            _ => None,
        }
    }
}

#[derive(Debug, PartialEq)]
enum Verdict {
    Run,
    /// The panic message.
    Fail(String),
    /// The `SKIP …` line, without its newline.
    Skip(String),
}

fn verdict(test: &str, missing: &[String], ci: bool) -> Verdict {
    if missing.is_empty() {
        return Verdict::Run;
    }
    let missing = missing.join("; ");
    if ci {
        Verdict::Fail(format!("{test}: cannot run under CI, missing: {missing}"))
    } else {
        Verdict::Skip(format!("SKIP {test}: missing {missing}"))
    }
}

/// Writes `line` to the stderr file descriptor (not through `eprintln!`,
/// which libtest captures) and appends it to `$COZYPLANE_SKIP_LOG`.
fn report_skip(line: &str) {
    let line = format!("{line}\n");
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
    if let Some(log) = std::env::var_os(SKIP_LOG) {
        if let Err(e) = append(Path::new(&log), &line) {
            // The script asked to count skips; an uncounted skip is a silent one.
            panic!(
                "cannot append to {SKIP_LOG}={}: {e}",
                Path::new(&log).display()
            );
        }
    }
}

/// One `write` on an `O_APPEND` file: lines from parallel tests and test
/// processes do not interleave.
fn append(path: &Path, line: &str) -> std::io::Result<()> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?
        .write_all(line.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ci_is_any_value_but_empty_zero_or_false() {
        for (value, ci) in [
            (None, false),
            (Some(""), false),
            (Some("0"), false),
            (Some("false"), false),
            (Some("FALSE"), false),
            (Some("true"), true),
            (Some("1"), true),
            (Some("yes"), true),
        ] {
            assert_eq!(ci_value_means_ci(value), ci, "CI={value:?}");
        }
    }

    #[test]
    fn everything_here_runs_in_and_out_of_ci() {
        assert_eq!(verdict("t", &[], true), Verdict::Run);
        assert_eq!(verdict("t", &[], false), Verdict::Run);
    }

    #[test]
    fn something_missing_fails_under_ci_naming_all_of_it() {
        let missing = ["root".to_string(), "`ip` (iproute2)".to_string()];
        let Verdict::Fail(msg) = verdict("mod::t", &missing, true) else {
            panic!("must fail under CI");
        };
        assert!(
            msg.starts_with("mod::t: cannot run under CI")
                && msg.ends_with("root; `ip` (iproute2)"),
            "{msg}"
        );
    }

    #[test]
    fn something_missing_skips_with_one_line_outside_ci() {
        let missing = ["root".to_string()];
        assert_eq!(
            verdict("mod::t", &missing, false),
            Verdict::Skip("SKIP mod::t: missing root".into())
        );
    }

    #[test]
    fn skip_lines_are_appended() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("skips");
        append(&log, "SKIP a: missing root\n").unwrap();
        append(&log, "SKIP b: missing root\n").unwrap();
        assert_eq!(
            std::fs::read_to_string(&log).unwrap(),
            "SKIP a: missing root\nSKIP b: missing root\n"
        );
    }

    #[test]
    fn needs_collect_what_is_missing() {
        let n = Needs::new("t")
            .that(true, "here")
            .that(false, "gone")
            .file("/nonexistent/cozyplane", "a file")
            .tool(&Tool::new("/nonexistent/tool", &["-V"], "nowhere"))
            .found(&Err::<(), _>(std::io::Error::other("etcd not found")));
        assert_eq!(
            n.missing(),
            [
                "gone",
                "a file at /nonexistent/cozyplane",
                "`/nonexistent/tool` (nowhere)",
                "etcd not found"
            ]
        );
    }

    #[test]
    fn a_tool_is_present_when_its_probe_exits_zero() {
        assert!(Tool::new("sh", &["-c", "exit 0"], "dash").present());
        assert!(!Tool::new("sh", &["-c", "exit 1"], "dash").present());
    }

    #[test]
    fn ready_with_hands_out_the_value_when_all_is_here() {
        let v = Needs::new("t").ready_with(Ok::<_, std::io::Error>(7));
        assert_eq!(v, Some(7));
    }
}
