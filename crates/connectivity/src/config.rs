//! Finding the cluster: the kubeconfig (flag, `$KUBECONFIG`, kube's default, in-cluster)
//! and the lab's hint about an external target.
use std::path::Path;

use cozyplane_errors::Chain;
use kube::config::{KubeConfigOptions, Kubeconfig, NamedExtension};
use kube::{Client, Config};
use serde::Deserialize;

use crate::matrix::External;
use crate::ConnectivityError;

/// Name of the kubeconfig extension `lab up` writes into its context.
pub const LAB_EXTENSION: &str = "cozyplane.io/lab";

/// The extension's payload.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct LabExtension {
    external_target: Option<String>,
    external_name: Option<String>,
}

/// A connected client and, when the kubeconfig came from a lab, its external target.
pub struct Cluster {
    /// The API client.
    pub client: Client,
    /// From the current context's `cozyplane.io/lab` extension.
    pub external: Option<External>,
}

/// Loads the kubeconfig from `path`, else `$KUBECONFIG`, else kube's default location,
/// else the in-cluster service account; `context` picks a context other than the current one.
pub async fn connect(
    path: Option<&Path>,
    context: Option<&str>,
) -> Result<Cluster, ConnectivityError> {
    let opts = KubeConfigOptions {
        context: context.map(str::to_string),
        ..KubeConfigOptions::default()
    };
    let (config, kubeconfig) = match path {
        Some(p) => {
            let kc = Kubeconfig::read_from(p).map_err(|source| ConnectivityError::Kubeconfig {
                what: format!("cannot read kubeconfig {}", p.display()),
                source: Box::new(source),
            })?;
            let cfg = Config::from_custom_kubeconfig(kc.clone(), &opts)
                .await
                .map_err(|source| ConnectivityError::Kubeconfig {
                    what: format!("kubeconfig {} is not usable", p.display()),
                    source: Box::new(source),
                })?;
            (cfg, Some(kc))
        }
        None if context.is_some() => {
            let cfg = Config::from_kubeconfig(&opts).await.map_err(|source| {
                ConnectivityError::Kubeconfig {
                    what: "no usable kubeconfig for --context ($KUBECONFIG or ~/.kube/config); pass --kubeconfig".into(),
                    source: Box::new(source),
                }
            })?;
            (cfg, Kubeconfig::read().ok())
        }
        None => {
            let cfg = Config::infer()
                .await
                .map_err(|source| ConnectivityError::Kubeconfig {
                    what: "no usable cluster configuration ($KUBECONFIG, ~/.kube/config or in-cluster); pass --kubeconfig".into(),
                    source: Box::new(source),
                })?;
            // Only for the lab hint; a missing file is fine here (in-cluster).
            (cfg, Kubeconfig::read().ok())
        }
    };
    let external = match &kubeconfig {
        Some(kc) => external_from_kubeconfig(kc, context)?,
        None => None,
    };
    let client = Client::try_from(config).map_err(|source| ConnectivityError::Api {
        action: "creating the Kubernetes client".into(),
        source,
    })?;
    Ok(Cluster { client, external })
}

/// The external target from the lab extension of `context` (default: the current
/// context), or of its cluster.
pub fn external_from_kubeconfig(
    kc: &Kubeconfig,
    context: Option<&str>,
) -> Result<Option<External>, ConnectivityError> {
    let Some(current) = context.or(kc.current_context.as_deref()) else {
        return Ok(None);
    };
    let Some(ctx) = kc
        .contexts
        .iter()
        .find(|c| c.name == current)
        .and_then(|c| c.context.as_ref())
    else {
        return Ok(None);
    };
    let cluster_ext = kc
        .clusters
        .iter()
        .find(|c| c.name == ctx.cluster)
        .and_then(|c| c.cluster.as_ref())
        .and_then(|c| c.extensions.as_ref());
    let found = [ctx.extensions.as_ref(), cluster_ext]
        .into_iter()
        .flatten()
        .flat_map(|v: &Vec<NamedExtension>| v.iter())
        .find(|e| e.name == LAB_EXTENSION);
    let Some(ext) = found else {
        return Ok(None);
    };
    let lab: LabExtension = serde_json::from_value(ext.extension.clone()).map_err(|e| {
        ConnectivityError::BadExternalTarget(format!(
            "the kubeconfig extension {LAB_EXTENSION} is malformed: {}",
            Chain(&e)
        ))
    })?;
    match lab.external_target {
        Some(t) => Ok(Some(External {
            target: parse_target(&t)?,
            name: lab.external_name.filter(|n| !n.is_empty()),
        })),
        None => Ok(None),
    }
}

/// Checks an `IP:PORT` target (a clear error now rather than a FAIL later).
pub fn parse_target(t: &str) -> Result<String, ConnectivityError> {
    t.parse::<std::net::SocketAddr>()
        .map(|a| a.to_string())
        .map_err(|_| {
            ConnectivityError::BadExternalTarget(format!(
                "external target {t:?} is not IP:PORT (e.g. 198.19.0.2:8000 or [2001:db8::1]:443)"
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    const KC: &str = r#"
apiVersion: v1
kind: Config
current-context: lab
clusters:
- name: lab
  cluster:
    server: https://127.0.0.1:6443
contexts:
- name: other
  context:
    cluster: lab
    user: admin
    extensions:
    - name: cozyplane.io/lab
      extension: {"externalTarget": "192.0.2.9:1", "externalName": "wrong"}
- name: lab
  context:
    cluster: lab
    user: admin
    extensions:
    - name: cozyplane.io/lab
      extension: {"externalTarget": "198.19.0.2:8000", "externalName": "external"}
users:
- name: admin
  user:
    token: x
"#;

    #[test]
    fn reads_the_current_contexts_lab_extension() {
        let kc = Kubeconfig::from_yaml(KC).expect("yaml");
        let ext = external_from_kubeconfig(&kc, None)
            .expect("ok")
            .expect("present");
        assert_eq!(ext.target, "198.19.0.2:8000");
        assert_eq!(ext.name.as_deref(), Some("external"));
    }

    #[test]
    fn an_explicit_context_is_read_instead_of_the_current_one() {
        let kc = Kubeconfig::from_yaml(KC).expect("yaml");
        let ext = external_from_kubeconfig(&kc, Some("other"))
            .expect("ok")
            .expect("present");
        assert_eq!(ext.target, "192.0.2.9:1");
        assert_eq!(ext.name.as_deref(), Some("wrong"));
        assert_eq!(
            external_from_kubeconfig(&kc, Some("absent")).expect("ok"),
            None
        );
    }

    #[test]
    fn no_extension_means_no_external_target() {
        let kc =
            Kubeconfig::from_yaml(&KC.replace("current-context: lab", "current-context: none"))
                .expect("yaml");
        assert_eq!(external_from_kubeconfig(&kc, None).expect("ok"), None);
        let kc =
            Kubeconfig::from_yaml(&KC.replace("cozyplane.io/lab", "example.com/x")).expect("yaml");
        assert_eq!(external_from_kubeconfig(&kc, None).expect("ok"), None);
    }

    #[tokio::test]
    async fn an_unknown_context_is_a_clear_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("kubeconfig");
        std::fs::write(&path, KC).expect("write");
        let e = connect(Some(&path), Some("absent"))
            .await
            .err()
            .expect("unknown context refused");
        let e = Chain(&e).to_string();
        assert!(e.contains("not usable") && e.contains("absent"), "{e}");
        assert!(connect(Some(&path), Some("other")).await.is_ok());
    }

    #[test]
    fn malformed_extension_is_a_clear_error() {
        let kc =
            Kubeconfig::from_yaml(&KC.replace("198.19.0.2:8000", "not-an-address")).expect("yaml");
        let e = external_from_kubeconfig(&kc, None)
            .expect_err("bad target")
            .to_string();
        assert!(e.contains("not-an-address") && e.contains("IP:PORT"), "{e}");
    }

    #[test]
    fn targets_are_validated() {
        assert_eq!(
            parse_target("198.19.0.2:8000").expect("ok"),
            "198.19.0.2:8000"
        );
        assert_eq!(
            parse_target("[2001:db8::1]:443").expect("ok"),
            "[2001:db8::1]:443"
        );
        assert!(parse_target("example.com").is_err());
    }

    #[tokio::test]
    async fn a_missing_kubeconfig_names_the_file_and_the_os_error_once() {
        let err = connect(Some(Path::new("/nonexistent/kubeconfig")), None)
            .await
            .err()
            .unwrap();
        assert_eq!(
            err.to_string(),
            "cannot read kubeconfig /nonexistent/kubeconfig"
        );
        let text = Chain(&err).to_string();
        assert!(
            text.starts_with("cannot read kubeconfig /nonexistent/kubeconfig: "),
            "{text}"
        );
        assert_eq!(
            text.matches("No such file or directory").count(),
            1,
            "{text}"
        );
    }
}
