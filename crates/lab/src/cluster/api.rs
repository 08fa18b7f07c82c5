//! The lab's kubeconfigs and a client for its API server.
//!
//! The API server writes one kubeconfig (YAML) naming itself; the lab needs two
//! that differ only in the server URL: the host's (through the relay on
//! `127.0.0.1:<port>`) and the components' (the fabric service address). Both
//! addresses are in the serving certificate (`127.0.0.1` always, the service
//! address through `--tls-san`).

use std::path::Path;

use cozyplane_errors::Chain;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::Api;

use super::error::{ClusterError, ClusterResult};

/// Copies the kubeconfig at `from` to `to` with every cluster's server set to `url`.
pub fn rewrite_kubeconfig(from: &Path, to: &Path, url: &str) -> ClusterResult<()> {
    let bad = |detail: String| ClusterError::BadFile {
        path: from.into(),
        detail,
    };
    let text = std::fs::read(from).map_err(|e| ClusterError::io("read", from, e))?;
    // YAML (what the API server writes) or JSON; written back as JSON, which is YAML too.
    let mut kc: serde_json::Value = serde_saphyr::from_slice(&text)
        .map_err(|e| bad(format!("not a kubeconfig: {}", Chain(&e))))?;
    let clusters = kc
        .get_mut("clusters")
        .and_then(|c| c.as_array_mut())
        .filter(|c| !c.is_empty())
        .ok_or_else(|| bad("no clusters".into()))?;
    for c in clusters {
        let cluster = c
            .get_mut("cluster")
            .and_then(|c| c.as_object_mut())
            .ok_or_else(|| bad("a cluster entry without `cluster`".into()))?;
        cluster.insert("server".into(), serde_json::Value::String(url.into()));
    }
    let out = serde_json::to_vec_pretty(&kc).map_err(|e| bad(Chain(&e).to_string()))?;
    write_private(to, &out)
}

/// Replaces `path` with `data` through a temporary file created owner-only
/// (kubeconfigs carry client keys), then renamed over it.
fn write_private(path: &Path, data: &[u8]) -> ClusterResult<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(&tmp)
        .map_err(|e| ClusterError::io("write", &tmp, e))?;
    f.write_all(data)
        .and_then(|()| f.sync_all())
        .map_err(|e| ClusterError::io("write", &tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| ClusterError::io("rename", path, e))
}

/// A client for the API server named by the kubeconfig at `path`.
pub async fn client(path: &Path) -> ClusterResult<kube::Client> {
    let kc = kube::config::Kubeconfig::read_from(path).map_err(|e| ClusterError::BadFile {
        path: path.into(),
        detail: Chain(&e).to_string(),
    })?;
    let cfg = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
        .await
        .map_err(|e| ClusterError::BadFile {
            path: path.into(),
            detail: Chain(&e).to_string(),
        })?;
    kube::Client::try_from(cfg).map_err(|e| ClusterError::Api(Chain(&e).to_string()))
}

fn api_err(what: &str) -> impl Fn(kube::Error) -> ClusterError + '_ {
    move |e| ClusterError::Api(format!("{what}: {}", Chain(&e)))
}

/// Registers a Node with its underlay address as InternalIP (the agents read
/// their tunnel endpoint there). An existing Node is updated, not an error.
pub async fn register_node(client: &kube::Client, name: &str, ip: &str) -> ClusterResult<()> {
    let api: Api<Node> = Api::all(client.clone());
    let mut node = Node::default();
    node.metadata.name = Some(name.to_string());
    match api.create(&PostParams::default(), &node).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => return Err(api_err("create node")(e)),
    }
    let status = serde_json::json!({"status": {"addresses": [
        {"type": "InternalIP", "address": ip}]}});
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .map_err(api_err("set node address"))?;
    Ok(())
}

/// `(name, InternalIP)` of every Node.
pub async fn nodes(client: &kube::Client) -> ClusterResult<Vec<(String, String)>> {
    let api: Api<Node> = Api::all(client.clone());
    let list = api
        .list(&ListParams::default())
        .await
        .map_err(api_err("list nodes"))?;
    Ok(list
        .items
        .into_iter()
        .map(|n| {
            let ip = n
                .status
                .and_then(|s| s.addresses)
                .and_then(|a| a.into_iter().find(|a| a.type_ == "InternalIP"))
                .map(|a| a.address)
                .unwrap_or_default();
            (n.metadata.name.unwrap_or_default(), ip)
        })
        .collect())
}

/// One pod as `lab status` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodRow {
    /// `namespace/name`.
    pub name: String,
    /// `spec.nodeName` (empty: not scheduled yet).
    pub node: String,
    /// `status.phase` (empty: no status yet).
    pub phase: String,
    /// `status.podIP` (empty: none yet).
    pub ip: String,
}

/// Every Pod in all namespaces, by namespace and name.
pub async fn pods(client: &kube::Client) -> ClusterResult<Vec<PodRow>> {
    let api: Api<Pod> = Api::all(client.clone());
    let list = api
        .list(&ListParams::default())
        .await
        .map_err(api_err("list pods"))?;
    let mut rows: Vec<PodRow> = list
        .items
        .into_iter()
        .map(|p| {
            let status = p.status.unwrap_or_default();
            PodRow {
                name: format!(
                    "{}/{}",
                    p.metadata.namespace.unwrap_or_default(),
                    p.metadata.name.unwrap_or_default()
                ),
                node: p.spec.and_then(|s| s.node_name).unwrap_or_default(),
                phase: status.phase.unwrap_or_default(),
                ip: status.pod_ip.unwrap_or_default(),
            }
        })
        .collect();
    rows.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(rows)
}

/// The name of the kubeconfig context extension `lab up` writes.
pub const LAB_EXTENSION: &str = "cozyplane.io/lab";

/// Adds to the current context of the kubeconfig at `path` the extension
/// [`LAB_EXTENSION`] with `value` (replacing an earlier one), so tools such
/// as `cozyplane connectivity test` learn about the lab (its external
/// target) from the kubeconfig alone. `contexts[].context.extensions` is part
/// of the kubeconfig format; kubectl keeps and ignores it.
pub fn add_context_extension(path: &Path, value: serde_json::Value) -> ClusterResult<()> {
    let bad = |detail: String| ClusterError::BadFile {
        path: path.into(),
        detail,
    };
    let text = std::fs::read(path).map_err(|e| ClusterError::io("read", path, e))?;
    let mut kc: serde_json::Value = serde_saphyr::from_slice(&text)
        .map_err(|e| bad(format!("not a kubeconfig: {}", Chain(&e))))?;
    let current = kc
        .get("current-context")
        .and_then(|c| c.as_str())
        .map(str::to_string)
        .ok_or_else(|| bad("no current-context".into()))?;
    let ctx = kc
        .get_mut("contexts")
        .and_then(|c| c.as_array_mut())
        .and_then(|list| {
            list.iter_mut()
                .find(|c| c.get("name").and_then(|n| n.as_str()) == Some(current.as_str()))
        })
        .and_then(|c| c.get_mut("context"))
        .and_then(|c| c.as_object_mut())
        .ok_or_else(|| bad(format!("no context named {current:?}")))?;
    let ext = ctx
        .entry("extensions")
        .or_insert_with(|| serde_json::json!([]));
    let list = ext
        .as_array_mut()
        .ok_or_else(|| bad("context extensions is not a list".into()))?;
    list.retain(|e| e.get("name").and_then(|n| n.as_str()) != Some(LAB_EXTENSION));
    list.push(serde_json::json!({"name": LAB_EXTENSION, "extension": value}));
    let out = serde_json::to_vec_pretty(&kc).map_err(|e| bad(Chain(&e).to_string()))?;
    write_private(path, &out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rewrites_only_the_server() {
        let dir = tempfile::tempdir().expect("tempdir");
        let from = dir.path().join("in.json");
        let to = dir.path().join("out.json");
        let kc = serde_json::json!({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "c", "cluster": {"server": "https://0.0.0.0:6443",
                "certificate-authority-data": "Q0E="}}],
            "users": [{"name": "u", "user": {"token": "t"}}],
        });
        let yaml = serde_saphyr::to_string(&kc).expect("yaml");
        std::fs::write(&from, yaml).expect("write");
        rewrite_kubeconfig(&from, &to, "https://127.0.0.1:1234").expect("rewrite");
        let out: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&to).expect("read")).expect("json");
        assert_eq!(
            out["clusters"][0]["cluster"]["server"],
            "https://127.0.0.1:1234"
        );
        assert_eq!(
            out["clusters"][0]["cluster"]["certificate-authority-data"],
            "Q0E="
        );
        assert_eq!(out["users"], kc["users"]);

        std::fs::write(&from, "{\"clusters\": []}").expect("write");
        assert!(matches!(
            rewrite_kubeconfig(&from, &to, "x"),
            Err(ClusterError::BadFile { .. })
        ));
    }

    #[tokio::test]
    async fn the_lab_extension_lands_in_the_current_context_and_kube_still_reads_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("kubeconfig");
        let kc = serde_json::json!({
            "apiVersion": "v1", "kind": "Config", "current-context": "b",
            "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
            "users": [{"name": "u", "user": {"token": "t"}}],
            "contexts": [{"name": "a", "context": {"cluster": "c", "user": "u"}},
                         {"name": "b", "context": {"cluster": "c", "user": "u"}}],
        });
        std::fs::write(&path, serde_saphyr::to_string(&kc).expect("yaml")).expect("write");
        let value =
            serde_json::json!({"externalTarget": "198.19.0.2:8000", "externalName": "external"});
        add_context_extension(&path, value.clone()).expect("add");
        add_context_extension(&path, value.clone()).expect("add again replaces");
        let out: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).expect("read")).expect("json");
        assert!(out["contexts"][0]["context"].get("extensions").is_none());
        let ext = out["contexts"][1]["context"]["extensions"]
            .as_array()
            .expect("list");
        assert_eq!(ext.len(), 1);
        assert_eq!(ext[0]["name"], LAB_EXTENSION);
        assert_eq!(ext[0]["extension"], value);
        // kube's own kubeconfig reader accepts it (kubectl is checked by tests/kubelet.rs).
        let parsed = kube::config::Kubeconfig::read_from(&path).expect("kube reads it");
        assert_eq!(parsed.current_context.as_deref(), Some("b"));

        std::fs::write(&path, "{\"contexts\": []}").expect("write");
        assert!(matches!(
            add_context_extension(&path, value),
            Err(ClusterError::BadFile { .. })
        ));
    }
}
