//! What the install takes from the code, and the renderer its tests use.
//!
//! * [`fabricip_crd_yaml`]: the `fabricips.local.sdn.cozystack.io` CRD the
//!   `cozyplane` chart ships, rendered from the Rust type (the chart's copy is
//!   compared with it by a test, and rewritten by `COZYPLANE_BLESS=1`).
//! * [`render`]: `helm template` with the real helm binary, parsed into one
//!   JSON value per document, for the chart test suite (helm-unittest is not
//!   available from the package registries; docs/packaging.md).

use std::path::{Path, PathBuf};
use std::process::Command;

use kube::core::CustomResourceExt;
use serde_json::Value;

/// A chart could not be rendered or its output not read.
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    /// helm could not be started.
    #[error("cannot run {helm}: {source}")]
    Spawn {
        /// The helm binary.
        helm: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// helm refused to render (a `fail` in a template, a bad value): its stderr.
    #[error("helm template {chart} failed: {stderr}")]
    Failed {
        /// The chart directory.
        chart: PathBuf,
        /// What helm printed on stderr.
        stderr: String,
    },
    /// helm's output is not YAML.
    #[error("helm template {chart}: output is not YAML: {detail}")]
    Yaml {
        /// The chart directory.
        chart: PathBuf,
        /// The parser's message.
        detail: String,
    },
}

/// One `helm template` invocation.
#[derive(Debug, Clone)]
pub struct Render<'a> {
    /// The helm binary.
    pub helm: &'a Path,
    /// The chart directory.
    pub chart: &'a Path,
    /// The release name.
    pub release: &'a str,
    /// The release namespace.
    pub namespace: &'a str,
    /// Values files, in order (`-f`).
    pub values: Vec<PathBuf>,
    /// `--set-json key=json` overrides, in order.
    pub set_json: Vec<(String, Value)>,
    /// `--kube-version` (helm's default follows its own build).
    pub kube_version: &'a str,
}

impl<'a> Render<'a> {
    /// A render of `chart` with its default values, release `cozyplane` in
    /// `cozy-cozyplane`, for Kubernetes 1.33.
    pub fn new(helm: &'a Path, chart: &'a Path) -> Self {
        Render {
            helm,
            chart,
            release: "cozyplane",
            namespace: "cozy-cozyplane",
            values: Vec::new(),
            set_json: Vec::new(),
            kube_version: "1.33.0",
        }
    }

    /// Adds a values file.
    pub fn values(mut self, file: impl Into<PathBuf>) -> Self {
        self.values.push(file.into());
        self
    }

    /// Adds `--set-json key=value`.
    pub fn set(mut self, key: &str, value: Value) -> Self {
        self.set_json.push((key.to_string(), value));
        self
    }

    /// The release name and namespace.
    pub fn release(mut self, name: &'a str, namespace: &'a str) -> Self {
        self.release = name;
        self.namespace = namespace;
        self
    }

    /// Renders, returning helm's text output.
    pub fn text(&self) -> Result<String, RenderError> {
        let mut cmd = Command::new(self.helm);
        cmd.arg("template")
            .arg(self.release)
            .arg(self.chart)
            .args(["--namespace", self.namespace])
            .args(["--kube-version", self.kube_version]);
        for f in &self.values {
            cmd.arg("-f").arg(f);
        }
        for (k, v) in &self.set_json {
            cmd.arg("--set-json").arg(format!("{k}={v}"));
        }
        let out = cmd.output().map_err(|source| RenderError::Spawn {
            helm: self.helm.to_path_buf(),
            source,
        })?;
        if !out.status.success() {
            return Err(RenderError::Failed {
                chart: self.chart.to_path_buf(),
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Renders and parses: one value per non-empty document, in helm's order.
    pub fn docs(&self) -> Result<Vec<Value>, RenderError> {
        let text = self.text()?;
        parse_documents(&text).map_err(|detail| RenderError::Yaml {
            chart: self.chart.to_path_buf(),
            detail,
        })
    }
}

/// The documents of a multi-document YAML stream, without the empty ones
/// (helm emits a document per template, empty when a template renders
/// nothing).
pub fn parse_documents(text: &str) -> Result<Vec<Value>, String> {
    let docs: Vec<Value> = serde_saphyr::from_multiple(text).map_err(|e| e.to_string())?;
    Ok(docs.into_iter().filter(|d| !d.is_null()).collect())
}

/// The FabricIP CRD (`fabricips.local.sdn.cozystack.io`) as the chart ships
/// it: the CRD the derive on [`cozyplane_api::local::FabricIP`] generates, as
/// YAML, under a header that says where it comes from.
pub fn fabricip_crd_yaml() -> Result<String, serde_saphyr::ser_error::Error> {
    let crd = cozyplane_api::local::FabricIP::crd();
    let body = serde_saphyr::to_string(&crd)?;
    Ok(format!("{CRD_HEADER}{body}"))
}

/// The first lines of the generated CRD file.
pub const CRD_HEADER: &str = "\
# Generated from the Rust type cozyplane_api::local::FabricIP (crates/api/src/local.rs).
# Do not edit: `COZYPLANE_BLESS=1 cargo test -p cozyplane-packaging --test charts` rewrites it,
# and the chart tests fail while it differs from the type.
";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_documents_are_dropped() {
        let docs = parse_documents("---\n# Source: x\n---\na: 1\n---\n").unwrap();
        assert_eq!(docs, vec![serde_json::json!({"a": 1})]);
    }

    #[test]
    fn the_crd_names_the_group_and_kind() {
        let text = fabricip_crd_yaml().unwrap();
        let docs = parse_documents(&text).unwrap();
        assert_eq!(docs.len(), 1);
        assert_eq!(
            docs[0]["metadata"]["name"],
            "fabricips.local.sdn.cozystack.io"
        );
        assert_eq!(docs[0]["spec"]["scope"], "Cluster");
    }
}
