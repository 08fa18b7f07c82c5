//! Calling the real CNI plugin, as a container runtime does: the node's
//! conflist (the one the agent writes), the plugin binary from the node's CNI
//! bin dir, the CNI environment and the network config on stdin.
//!
//! Plugins run in the conflist's order for ADD (each gets the previous
//! result as `prevResult`) and in reverse for DEL. The stdin of each is its
//! plugin entry with the list's `name` and `cniVersion` injected. The
//! building and parsing parts are pure and unit-tested; [`Cni::add`] and
//! [`Cni::del`] are exercised by the lab's integration test.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use cozyplane_errors::Chain;
use serde_json::Value;
use tokio::io::AsyncWriteExt;

/// How long one plugin invocation may take (the plugin's own agent timeout is 60 s).
const PLUGIN_TIMEOUT: Duration = Duration::from_secs(90);

/// A CNI failure, with the plugin's own error text when it gave one.
#[derive(Debug, thiserror::Error)]
pub enum CniError {
    /// No usable conflist in the conf dir (the agent has not written it yet).
    #[error("no CNI network config in {dir}: {detail} (is the node's agent running and ready?)")]
    NoConfig {
        /// The conf dir.
        dir: PathBuf,
        /// What is wrong.
        detail: String,
    },
    /// The plugin binary is missing.
    #[error("CNI plugin {plugin:?} not found in {}", dir.display())]
    NoPlugin {
        /// The plugin type.
        plugin: String,
        /// The bin dir.
        dir: PathBuf,
    },
    /// Running the plugin failed.
    #[error("CNI {command} ({plugin}): {detail}")]
    Exec {
        /// ADD or DEL.
        command: &'static str,
        /// The plugin type.
        plugin: String,
        /// What happened.
        detail: String,
    },
    /// The plugin returned a CNI error.
    #[error("CNI {command} ({plugin}) failed with code {code}: {msg}{}", if details.is_empty() { String::new() } else { format!(": {details}") })]
    Plugin {
        /// ADD or DEL.
        command: &'static str,
        /// The plugin type.
        plugin: String,
        /// CNI error code (11 = try again later).
        code: u64,
        /// Its message.
        msg: String,
        /// Its details.
        details: String,
    },
}

impl CniError {
    /// True for CNI code 11 ("try again later"): the agent is restarting.
    pub fn is_transient(&self) -> bool {
        matches!(self, CniError::Plugin { code: 11, .. })
    }
}

/// A parsed conflist.
#[derive(Debug, Clone, PartialEq)]
pub struct NetConfList {
    /// The network name.
    pub name: String,
    /// The spec version.
    pub cni_version: String,
    /// The plugin entries.
    pub plugins: Vec<Value>,
}

/// Why a conflist is unusable.
#[derive(Debug, thiserror::Error)]
pub enum ConflistError {
    /// The text is not JSON.
    #[error("not JSON")]
    NotJson(#[source] serde_json::Error),
    /// A required string field is missing.
    #[error("no {0}")]
    Missing(&'static str),
    /// `plugins` is missing or empty.
    #[error("no plugins")]
    NoPlugins,
    /// A plugin entry has no `type`.
    #[error("a plugin without a type")]
    UntypedPlugin,
}

/// Parses a conflist's text.
pub fn parse_conflist(text: &[u8]) -> Result<NetConfList, ConflistError> {
    let v: Value = serde_json::from_slice(text).map_err(ConflistError::NotJson)?;
    let s = |k: &'static str| {
        v.get(k)
            .and_then(Value::as_str)
            .map(str::to_string)
            .ok_or(ConflistError::Missing(k))
    };
    let plugins = v
        .get("plugins")
        .and_then(Value::as_array)
        .filter(|p| !p.is_empty())
        .cloned()
        .ok_or(ConflistError::NoPlugins)?;
    if plugins
        .iter()
        .any(|p| p.get("type").and_then(Value::as_str).is_none())
    {
        return Err(ConflistError::UntypedPlugin);
    }
    Ok(NetConfList {
        name: s("name")?,
        cni_version: s("cniVersion")?,
        plugins,
    })
}

/// The stdin of plugin `i`: its entry with name, cniVersion (and prevResult) injected.
pub fn plugin_stdin(list: &NetConfList, i: usize, prev: Option<&Value>) -> Value {
    let mut conf = list.plugins.get(i).cloned().unwrap_or(Value::Null);
    if let Some(m) = conf.as_object_mut() {
        m.insert("name".into(), Value::String(list.name.clone()));
        m.insert("cniVersion".into(), Value::String(list.cni_version.clone()));
        if let Some(p) = prev {
            m.insert("prevResult".into(), p.clone());
        }
    }
    conf
}

/// The addresses of a CNI result (`ips[].address`, prefix length dropped), IPv4 first.
pub fn result_ips(result: &Value) -> Vec<IpAddr> {
    let mut ips: Vec<IpAddr> = result
        .get("ips")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|ip| ip.get("address").and_then(Value::as_str))
        .filter_map(|a| a.split('/').next().and_then(|a| a.parse().ok()))
        .collect();
    ips.sort_by_key(|ip| !ip.is_ipv4());
    ips
}

/// A CNI error result (`{"code":…,"msg":…,"details":…}`), if `out` is one.
pub fn parse_error(out: &[u8]) -> Option<(u64, String, String)> {
    let v: Value = serde_json::from_slice(out).ok()?;
    let code = v.get("code")?.as_u64()?;
    let field = |k| {
        v.get(k)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    Some((code, field("msg"), field("details")))
}

/// The `CNI_ARGS` a kubelet passes.
pub fn cni_args(namespace: &str, name: &str, uid: &str, container_id: &str) -> String {
    format!(
        "IgnoreUnknown=1;K8S_POD_NAMESPACE={namespace};K8S_POD_NAME={name};\
         K8S_POD_INFRA_CONTAINER_ID={container_id};K8S_POD_UID={uid}"
    )
}

/// One attachment: the pod it is for and where.
#[derive(Debug, Clone)]
pub struct Attachment<'a> {
    /// The CNI container id.
    pub container_id: &'a str,
    /// The netns path (`None` on a DEL whose netns is gone).
    pub netns: Option<&'a Path>,
    /// Pod namespace.
    pub namespace: &'a str,
    /// Pod name.
    pub name: &'a str,
    /// Pod uid.
    pub uid: &'a str,
}

/// The node's CNI setup.
#[derive(Debug, Clone)]
pub struct Cni {
    /// Where the agent writes its conflist.
    pub conf_dir: PathBuf,
    /// Where the agent installs the plugin.
    pub bin_dir: PathBuf,
}

impl Cni {
    /// The first `*.conflist` in the conf dir, by name (skipping dot files, as runtimes do).
    pub fn load(&self) -> Result<NetConfList, CniError> {
        let no = |detail: String| CniError::NoConfig {
            dir: self.conf_dir.clone(),
            detail,
        };
        let mut names: Vec<PathBuf> = std::fs::read_dir(&self.conf_dir)
            .map_err(|e| no(Chain(&e).to_string()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.extension().is_some_and(|x| x == "conflist")
                    && !p
                        .file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.starts_with('.'))
            })
            .collect();
        names.sort();
        let first = names.first().ok_or_else(|| no("no *.conflist".into()))?;
        let text =
            std::fs::read(first).map_err(|e| no(format!("{}: {}", first.display(), Chain(&e))))?;
        parse_conflist(&text).map_err(|e| no(format!("{}: {}", first.display(), Chain(&e))))
    }

    /// ADD through every plugin; returns the final result.
    pub async fn add(&self, a: &Attachment<'_>) -> Result<Value, CniError> {
        let list = self.load()?;
        let mut prev: Option<Value> = None;
        for i in 0..list.plugins.len() {
            let stdin = plugin_stdin(&list, i, prev.as_ref());
            let out = self.exec("ADD", &stdin, a).await?;
            prev = Some(serde_json::from_slice(&out).map_err(|e| CniError::Exec {
                command: "ADD",
                plugin: plugin_type(&stdin),
                detail: format!("unparsable result: {}", Chain(&e)),
            })?);
        }
        prev.ok_or_else(|| CniError::NoConfig {
            dir: self.conf_dir.clone(),
            detail: "no plugins".into(),
        })
    }

    /// DEL through every plugin, last first; `prev` is the ADD result if known.
    pub async fn del(&self, a: &Attachment<'_>, prev: Option<&Value>) -> Result<(), CniError> {
        let list = self.load()?;
        for i in (0..list.plugins.len()).rev() {
            let stdin = plugin_stdin(&list, i, prev);
            self.exec("DEL", &stdin, a).await?;
        }
        Ok(())
    }

    async fn exec(
        &self,
        command: &'static str,
        stdin: &Value,
        a: &Attachment<'_>,
    ) -> Result<Vec<u8>, CniError> {
        let plugin = plugin_type(stdin);
        let bin = self.bin_dir.join(&plugin);
        if plugin.contains('/') || !bin.is_file() {
            return Err(CniError::NoPlugin {
                plugin,
                dir: self.bin_dir.clone(),
            });
        }
        let exec_err = |detail: String| CniError::Exec {
            command,
            plugin: plugin.clone(),
            detail,
        };
        let mut cmd = tokio::process::Command::new(&bin);
        cmd.env_clear()
            .env("CNI_COMMAND", command)
            .env("CNI_CONTAINERID", a.container_id)
            .env("CNI_IFNAME", "eth0")
            .env("CNI_PATH", &self.bin_dir)
            .env(
                "CNI_ARGS",
                cni_args(a.namespace, a.name, a.uid, a.container_id),
            )
            .env(
                "CNI_NETNS",
                a.netns.map(Path::as_os_str).unwrap_or_default(),
            )
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = cmd.spawn().map_err(|e| exec_err(Chain(&e).to_string()))?;
        let input = serde_json::to_vec(stdin).map_err(|e| exec_err(Chain(&e).to_string()))?;
        if let Some(mut s) = child.stdin.take() {
            s.write_all(&input)
                .await
                .map_err(|e| exec_err(format!("writing stdin: {}", Chain(&e))))?;
        }
        let out = tokio::time::timeout(PLUGIN_TIMEOUT, child.wait_with_output())
            .await
            .map_err(|_| exec_err(format!("no answer in {PLUGIN_TIMEOUT:?}")))?
            .map_err(|e| exec_err(Chain(&e).to_string()))?;
        if out.status.success() {
            return Ok(out.stdout);
        }
        match parse_error(&out.stdout) {
            Some((code, msg, details)) => Err(CniError::Plugin {
                command,
                plugin,
                code,
                msg,
                details,
            }),
            None => Err(exec_err(format!(
                "exited with {}: {}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout).trim(),
                String::from_utf8_lossy(&out.stderr).trim()
            ))),
        }
    }
}

fn plugin_type(conf: &Value) -> String {
    conf.get("type")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIST: &str = r#"{"cniVersion":"1.0.0","name":"cozyplane",
        "plugins":[{"type":"cozyplane","agentSocket":"/run/a.sock"},{"type":"tuning"}]}"#;

    #[test]
    fn conflists_parse_and_plugin_stdin_carries_name_version_and_prev_result() {
        let list = parse_conflist(LIST.as_bytes()).expect("parse");
        assert_eq!(
            (list.name.as_str(), list.cni_version.as_str()),
            ("cozyplane", "1.0.0")
        );
        let s = plugin_stdin(&list, 0, None);
        assert_eq!(s["type"], "cozyplane");
        assert_eq!(s["agentSocket"], "/run/a.sock");
        assert_eq!(s["name"], "cozyplane");
        assert_eq!(s["cniVersion"], "1.0.0");
        assert!(s.get("prevResult").is_none());
        let prev = serde_json::json!({"ips": []});
        assert_eq!(plugin_stdin(&list, 1, Some(&prev))["prevResult"], prev);
        for bad in [
            r#"{"name":"x","cniVersion":"1.0.0","plugins":[]}"#,
            r#"{"plugins":[{"type":"a"}]}"#,
            "[",
            r#"{"name":"x","cniVersion":"1.0.0","plugins":[{"noType":1}]}"#,
        ] {
            assert!(parse_conflist(bad.as_bytes()).is_err(), "{bad}");
        }
        let e = parse_conflist(b"[").expect_err("not JSON");
        assert_eq!(e.to_string(), "not JSON");
        assert!(
            Chain(&e)
                .to_string()
                .starts_with("not JSON: EOF while parsing"),
            "{}",
            Chain(&e)
        );
    }

    #[test]
    fn results_and_errors_parse() {
        let r = serde_json::json!({"ips": [
            {"address": "fd00::5/128"}, {"address": "10.244.1.5/32", "interface": 0}]});
        let ips = result_ips(&r);
        assert_eq!(
            ips,
            [
                "10.244.1.5".parse::<IpAddr>().expect("ip"),
                "fd00::5".parse().expect("ip")
            ]
        );
        assert!(result_ips(&serde_json::json!({})).is_empty());
        assert_eq!(
            parse_error(
                br#"{"cniVersion":"1.0.0","code":11,"msg":"try again","details":"agent busy"}"#
            ),
            Some((11, "try again".into(), "agent busy".into()))
        );
        assert_eq!(parse_error(b"garbage"), None);
        let e = CniError::Plugin {
            command: "ADD",
            plugin: "cozyplane".into(),
            code: 11,
            msg: "m".into(),
            details: String::new(),
        };
        assert!(e.is_transient());
        assert_eq!(e.to_string(), "CNI ADD (cozyplane) failed with code 11: m");
    }

    #[test]
    fn cni_args_name_the_pod() {
        let a = cni_args("ns", "p", "u-1", "c1");
        assert!(a.starts_with("IgnoreUnknown=1;"));
        for part in [
            "K8S_POD_NAMESPACE=ns",
            "K8S_POD_NAME=p",
            "K8S_POD_UID=u-1",
            "K8S_POD_INFRA_CONTAINER_ID=c1",
        ] {
            assert!(a.split(';').any(|x| x == part), "{a}");
        }
    }

    #[test]
    fn a_missing_config_or_plugin_is_a_clear_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cni = Cni {
            conf_dir: dir.path().join("net.d"),
            bin_dir: dir.path().join("bin"),
        };
        let err = cni.load().expect_err("no dir");
        assert!(err.to_string().contains("agent running"), "{err}");
        std::fs::create_dir_all(&cni.conf_dir).expect("mkdir");
        std::fs::write(cni.conf_dir.join(".10-x.conflist.tmp"), LIST).expect("write");
        assert!(cni.load().is_err(), "dot files are skipped");
        std::fs::write(cni.conf_dir.join("10-x.conflist"), LIST).expect("write");
        assert_eq!(cni.load().expect("load").plugins.len(), 2);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("rt");
        let a = Attachment {
            container_id: "c",
            netns: None,
            namespace: "n",
            name: "p",
            uid: "u",
        };
        let err = rt.block_on(cni.add(&a)).expect_err("no plugin binary");
        assert!(matches!(err, CniError::NoPlugin { .. }), "{err}");
    }
}
