//! The Cozystack variant: `packaging/cozystack/packages/core/platform`, our
//! excerpt of Cozystack's platform chart with the `cozyplane` networking
//! variant, rendered by the real helm 3 and helm 4 (helm-unittest is not
//! available from the package registries) and asserted on the parsed
//! documents, in the manner of Cozystack's `bundles_*` and `sources_*` suites:
//! one behaviour per test, each saying which real failure it pins.
//!
//! Every render runs with both helms. A missing helm fails under CI and skips
//! visibly elsewhere (`scripts/install-deps.sh` installs them).
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use cozyplane_packaging::{Render, RenderError};
use cozyplane_testkit::{helm, needs, Needs};
use serde_json::{json, Value};

const PLATFORM: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../packaging/cozystack/packages/core/platform"
);

/// The packages cozyplane replaces: KubeOVN's and Cilium's helpers, and
/// multus, whose master conflist is Cilium's.
const KUBEOVN_CILIUM_SYSTEM_PACKAGES: [&str; 4] = [
    "cozystack.kubeovn-webhook",
    "cozystack.kubeovn-plunger",
    "cozystack.securitygroup-controller",
    "cozystack.multus",
];

/// helm 3 and helm 4, or `None` once the gate has failed (CI) or skipped.
fn helms(needs: Needs) -> Option<[PathBuf; 2]> {
    let helm3 = helm(3);
    let helm4 = needs.found(&helm3).ready_with(helm(4))?;
    Some([helm3.expect("the gate found helm 3"), helm4])
}

/// One render of the platform excerpt as release `cozystack` in
/// `cozy-system`: shipped values files, then `--set-json` overrides.
#[derive(Default)]
struct Case {
    values: Vec<PathBuf>,
    set: Vec<(&'static str, Value)>,
}

impl Case {
    /// The system bundle on, variant isp-full, the networking variant left
    /// to the chart (Cozystack's suites start from the same `set`).
    fn isp_full() -> Self {
        Case::default()
            .set("bundles.system.enabled", json!(true))
            .set("bundles.system.variant", json!("isp-full"))
    }

    /// [`Case::isp_full`] with `bundles.system.networkingVariant: variant`.
    fn networking(variant: &str) -> Self {
        Case::isp_full().set("bundles.system.networkingVariant", json!(variant))
    }

    /// A shipped values file, relative to the chart, loaded unmodified.
    fn values(mut self, file: &str) -> Self {
        self.values.push(Path::new(PLATFORM).join(file));
        self
    }

    fn set(mut self, key: &'static str, value: Value) -> Self {
        self.set.push((key, value));
        self
    }

    fn render(&self, helm: &Path) -> Result<Vec<Value>, RenderError> {
        let chart = Path::new(PLATFORM);
        let render = Render::new(helm, chart).release("cozystack", "cozy-system");
        let render = self.values.iter().fold(render, |r, f| r.values(f));
        let render = self
            .set
            .iter()
            .fold(render, |r, (k, v)| r.set(k, v.clone()));
        render.docs()
    }

    /// The documents each helm rendered, with that helm's name.
    fn docs(&self, helms: &[PathBuf; 2]) -> Vec<(String, Vec<Value>)> {
        helms
            .iter()
            .map(|helm| match self.render(helm) {
                Ok(docs) => (name(helm), docs),
                Err(e) => panic!("{}: {e}", name(helm)),
            })
            .collect()
    }

    /// What each helm printed when it refused to render.
    fn failure(&self, helms: &[PathBuf; 2]) -> Vec<(String, String)> {
        helms
            .iter()
            .map(|helm| match self.render(helm) {
                Err(RenderError::Failed { stderr, .. }) => (name(helm), stderr),
                Err(e) => panic!("{}: expected a refusal, got {e}", name(helm)),
                Ok(_) => panic!("{}: rendered, expected a refusal", name(helm)),
            })
            .collect()
    }
}

fn name(helm: &Path) -> String {
    helm.file_name().unwrap().to_string_lossy().into_owned()
}

/// The document of `kind` named `name`, if rendered.
fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> Option<&'a Value> {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
}

/// Whether the Package `name` was rendered.
fn emitted(docs: &[Value], name: &str) -> bool {
    find(docs, "Package", name).is_some()
}

/// The Package `name`, which must have been rendered.
fn package<'a>(helm: &str, docs: &'a [Value], name: &str) -> &'a Value {
    find(docs, "Package", name).unwrap_or_else(|| panic!("{helm}: no Package {name}"))
}

/// The variant `variant` of the PackageSource `name`.
fn source_variant<'a>(helm: &str, docs: &'a [Value], name: &str, variant: &str) -> &'a Value {
    let source = find(docs, "PackageSource", name)
        .unwrap_or_else(|| panic!("{helm}: no PackageSource {name}"));
    source["spec"]["variants"]
        .as_array()
        .and_then(|vs| vs.iter().find(|v| v["name"] == variant))
        .unwrap_or_else(|| panic!("{helm}: PackageSource {name} has no variant {variant}"))
}

/// Every string in `value` that is an address prefix (`a.b.c.d/n`,
/// `x::/n`), comma lists split.
fn cidrs(value: &Value) -> Vec<String> {
    match value {
        Value::String(s) => s
            .split(',')
            .map(str::trim)
            .filter(|c| {
                c.split_once('/').is_some_and(|(addr, len)| {
                    addr.parse::<IpAddr>().is_ok() && len.parse::<u8>().is_ok()
                })
            })
            .map(String::from)
            .collect(),
        Value::Array(items) => items.iter().flat_map(cidrs).collect(),
        Value::Object(map) => map.values().flat_map(cidrs).collect(),
        _ => Vec::new(),
    }
}

// A cluster whose values never mention the new key (every cluster installed
// before it, and one whose operator nulls it to clear an override) must keep
// KubeOVN + Cilium: falling to anything else on upgrade replaces the CNI of a
// running cluster.
#[test]
fn networking_variant_defaults_to_kubeovn_cilium() {
    let Some(helms) = helms(needs!()) else { return };
    for case in [
        Case::isp_full(),
        Case::isp_full().set("bundles.system.networkingVariant", Value::Null),
    ] {
        for (helm, docs) in case.docs(&helms) {
            let networking = package(&helm, &docs, "cozystack.networking");
            assert_eq!(networking["spec"]["variant"], "kubeovn-cilium", "{helm}");
        }
    }
}

// The prior integration left the cozyplane chart on its hardcoded
// 10.244.0.0/16 whatever networking.podCIDR said, so a cluster installed with
// another pod CIDR got pods addressed outside it. A non-default CIDR must
// arrive in the chart's podCIDR.
#[test]
fn cozyplane_selects_its_variant_and_threads_pod_cidr() {
    let Some(helms) = helms(needs!()) else { return };
    let case = Case::networking("cozyplane").set("networking.podCIDR", json!("10.123.0.0/16"));
    for (helm, docs) in case.docs(&helms) {
        let spec = &package(&helm, &docs, "cozystack.networking")["spec"];
        assert_eq!(spec["variant"], "cozyplane", "{helm}");
        assert_eq!(
            spec["components"]["cozyplane"]["values"]["podCIDR"], "10.123.0.0/16",
            "{helm}"
        );
    }
}

// The API server and its etcd name their Services under the cluster domain;
// a cluster not on cozy.local must not get certificates and endpoints for a
// domain that does not resolve.
#[test]
fn cozyplane_threads_cluster_domain_into_the_apiserver() {
    let Some(helms) = helms(needs!()) else { return };
    let case =
        Case::networking("cozyplane").set("networking.clusterDomain", json!("example.internal"));
    for (helm, docs) in case.docs(&helms) {
        let apiserver = package(&helm, &docs, "cozystack.cozyplane-apiserver");
        assert_eq!(
            apiserver["spec"]["components"]["cozyplane-apiserver"]["values"]["clusterDomain"],
            "example.internal",
            "{helm}"
        );
    }
}

// The prior integration hardcoded 10.244.0.0/16 and 10.96.0.0/16 in the CNI's
// values. The only address prefix the platform may hand the cozyplane
// components is the threaded podCIDR: not serviceCIDR (the agent reads
// Services from the API), and no default that outlives a changed value.
#[test]
fn cozyplane_values_carry_no_cidr_but_the_pod_cidr() {
    let Some(helms) = helms(needs!()) else { return };
    let case = Case::networking("cozyplane")
        .set("networking.podCIDR", json!("10.123.0.0/16"))
        .set("networking.serviceCIDR", json!("10.124.0.0/16"));
    for (helm, docs) in case.docs(&helms) {
        let mut found = cidrs(&package(&helm, &docs, "cozystack.networking")["spec"]["components"]);
        found.extend(cidrs(
            &package(&helm, &docs, "cozystack.cozyplane-apiserver")["spec"]["components"],
        ));
        assert_eq!(found, ["10.123.0.0/16"], "{helm}");
    }
}

// A typo in the variant must stop the render naming the allowed values, not
// silently fall back to one stack or emit half of each.
#[test]
fn an_unknown_networking_variant_fails_naming_the_allowed_values() {
    let Some(helms) = helms(needs!()) else { return };
    for (helm, stderr) in Case::networking("calico").failure(&helms) {
        assert!(
            stderr.contains(
                r#"bundles.system.networkingVariant must be "kubeovn-cilium" (the default) or "cozyplane", got "calico""#
            ),
            "{helm}: {stderr}"
        );
    }
}

// cozyplane's PackageSource variant installs the Talos values (KubePrism on
// localhost:7445); on isp-hosted, which manages no CNI, or isp-full-generic
// it would half-replace a stack it cannot run on.
#[test]
fn cozyplane_outside_isp_full_fails() {
    let Some(helms) = helms(needs!()) else { return };
    for variant in ["isp-hosted", "isp-full-generic"] {
        let case = Case::networking("cozyplane").set("bundles.system.variant", json!(variant));
        for (helm, stderr) in case.failure(&helms) {
            let expected = format!(
                r#"bundles.system.networkingVariant "cozyplane" needs bundles.system.variant "isp-full" (its package installs the Talos values), got "{variant}""#
            );
            assert!(stderr.contains(&expected), "{helm}: {stderr}");
        }
    }
}

// networking.encryption.enabled turns on KubeOVN IPsec; cozyplane has no
// east-west encryption, so accepting the key would leave traffic the operator
// asked to encrypt in the clear without a word.
#[test]
fn cozyplane_with_encryption_fails() {
    let Some(helms) = helms(needs!()) else { return };
    let case = Case::networking("cozyplane").set("networking.encryption.enabled", json!(true));
    for (helm, stderr) in case.failure(&helms) {
        assert!(
            stderr.contains("networking.encryption.enabled is not supported with bundles.system.networkingVariant \"cozyplane\""),
            "{helm}: {stderr}"
        );
    }
}

// With cozyplane there is no KubeOVN and no Cilium: their webhook, plunger,
// the SecurityGroup labeller and multus (chained after Cilium's conflist)
// would crash-loop or sit unready on every node. With kubeovn-cilium they must
// all stay, and with either the variant-neutral common packages stay (the
// gate must not swallow the whole list).
#[test]
fn kubeovn_cilium_system_packages_follow_the_variant() {
    let Some(helms) = helms(needs!()) else { return };
    for (variant, expected) in [("kubeovn-cilium", true), ("cozyplane", false)] {
        for (helm, docs) in Case::networking(variant).docs(&helms) {
            for name in KUBEOVN_CILIUM_SYSTEM_PACKAGES {
                assert_eq!(
                    emitted(&docs, name),
                    expected,
                    "{helm}, {variant}: Package {name}"
                );
            }
            package(&helm, &docs, "cozystack.metallb");
            package(&helm, &docs, "cozystack.snapshot-controller");
        }
    }
}

// The VirtualPrivateCloud application is KubeOVN VPCs over multus; with
// cozyplane its Package would wait forever on cozystack.multus. Loaded from
// the shipped isp-full preset unmodified (IaaS on), so a regression in the
// preset itself shows here too.
#[test]
fn vpc_application_follows_the_variant() {
    let Some(helms) = helms(needs!()) else { return };
    let preset = || Case::default().values("values-isp-full.yaml");
    for (case, variant, expected) in [
        (preset(), "kubeovn-cilium", true),
        (
            preset().set("bundles.system.networkingVariant", json!("cozyplane")),
            "cozyplane",
            false,
        ),
    ] {
        for (helm, docs) in case.docs(&helms) {
            let networking = package(&helm, &docs, "cozystack.networking");
            assert_eq!(networking["spec"]["variant"], variant, "{helm}");
            let vpc = emitted(&docs, "cozystack.virtualprivatecloud-application");
            assert_eq!(vpc, expected, "{helm}, {variant}");
            package(&helm, &docs, "cozystack.kubevirt");
        }
    }
}

// The API server is part of the cozyplane stack only: on a kubeovn-cilium
// cluster it would install an etcd and an APIService for kinds nothing
// serves. With cozyplane it must be there, or no tenant network API exists.
#[test]
fn cozyplane_apiserver_is_emitted_only_for_cozyplane() {
    let Some(helms) = helms(needs!()) else { return };
    for (variant, expected) in [("kubeovn-cilium", false), ("cozyplane", true)] {
        for (helm, docs) in Case::networking(variant).docs(&helms) {
            let apiserver = find(&docs, "Package", "cozystack.cozyplane-apiserver");
            assert_eq!(apiserver.is_some(), expected, "{helm}, {variant}");
            if let Some(apiserver) = apiserver {
                assert_eq!(apiserver["spec"]["variant"], "default", "{helm}");
            }
        }
    }
}

// bundles.disabledPackages is how an operator keeps a package off; the
// apiserver Package must honour it like every other, while the CNI stays.
#[test]
fn disabled_packages_drop_the_cozyplane_apiserver() {
    let Some(helms) = helms(needs!()) else { return };
    let case = Case::networking("cozyplane").set(
        "bundles.disabledPackages",
        json!(["cozystack.cozyplane-apiserver"]),
    );
    for (helm, docs) in case.docs(&helms) {
        assert!(!emitted(&docs, "cozystack.cozyplane-apiserver"), "{helm}");
        let networking = package(&helm, &docs, "cozystack.networking");
        assert_eq!(networking["spec"]["variant"], "cozyplane", "{helm}");
    }
}

// networking: null (an operator clearing the block) must render, not die on
// a nil pointer; the charts' own defaults then apply, so no values are passed.
#[test]
fn networking_null_renders_for_both_variants() {
    let Some(helms) = helms(needs!()) else { return };
    for variant in ["kubeovn-cilium", "cozyplane"] {
        let case = Case::networking(variant).set("networking", Value::Null);
        for (helm, docs) in case.docs(&helms) {
            let networking = package(&helm, &docs, "cozystack.networking");
            assert_eq!(networking["spec"]["variant"], variant, "{helm}");
            assert!(
                networking["spec"].get("components").is_none(),
                "{helm}: {networking}"
            );
        }
    }
}

// The API server needs cert-manager (its serving and etcd certificates) and
// etcd-operator (its EtcdCluster), and a CNI for its pods: a missing edge
// makes its HelmRelease race them and fail on absent CRDs.
#[test]
fn apiserver_source_depends_on_networking_cert_manager_and_etcd_operator() {
    let Some(helms) = helms(needs!()) else { return };
    for (helm, docs) in Case::default().docs(&helms) {
        let variant = source_variant(&helm, &docs, "cozystack.cozyplane-apiserver", "default");
        let depends: Vec<&str> = variant["dependsOn"]
            .as_array()
            .unwrap_or_else(|| panic!("{helm}: no dependsOn"))
            .iter()
            .filter_map(Value::as_str)
            .collect();
        for edge in [
            "cozystack.networking",
            "cozystack.cert-manager",
            "cozystack.etcd-operator",
        ] {
            assert!(depends.contains(&edge), "{helm}: {depends:?} lacks {edge}");
        }
        let component = &variant["components"][0];
        assert_eq!(component["path"], "system/cozyplane-apiserver", "{helm}");
        assert_eq!(
            component["install"]["namespace"], "cozy-cozyplane",
            "{helm}"
        );
        assert_eq!(
            component["install"]["releaseName"], "cozyplane-apiserver",
            "{helm}"
        );
    }
}

// The agent loads eBPF programs and writes the host's CNI directories from a
// hostNetwork DaemonSet: without privileged the operator leaves
// cozy-cozyplane under the default Pod Security level and no agent pod is
// admitted, so no pod anywhere gets a network. Pinned exactly.
#[test]
fn networking_source_installs_cozyplane_privileged_in_cozy_cozyplane() {
    let Some(helms) = helms(needs!()) else { return };
    for (helm, docs) in Case::default().docs(&helms) {
        let variant = source_variant(&helm, &docs, "cozystack.networking", "cozyplane");
        assert_eq!(
            *variant,
            json!({
                "name": "cozyplane",
                "dependsOn": ["cozystack.gateway-api-crds"],
                "components": [{
                    "name": "cozyplane",
                    "path": "system/cozyplane",
                    "valuesFiles": ["values.yaml", "values-talos.yaml"],
                    "install": {
                        "privileged": true,
                        "namespace": "cozy-cozyplane",
                        "releaseName": "cozyplane",
                        "dependsOn": []
                    }
                }]
            }),
            "{helm}"
        );
    }
}

// A dependsOn naming a Package the platform never emits (a misspelling, or a
// package the variant turned off) leaves the dependant in
// DependenciesNotReady forever with nothing naming the cause. Every edge of
// the cozyplane stack must be a Package the cozyplane render emits.
#[test]
fn every_cozyplane_dependency_is_an_emitted_package() {
    let Some(helms) = helms(needs!()) else { return };
    for (helm, docs) in Case::networking("cozyplane").docs(&helms) {
        for (source, variant) in [
            ("cozystack.networking", "cozyplane"),
            ("cozystack.cozyplane-apiserver", "default"),
        ] {
            let depends = source_variant(&helm, &docs, source, variant)["dependsOn"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            for dep in depends {
                let dep = dep.as_str().unwrap_or_else(|| panic!("{helm}: {dep}"));
                assert!(emitted(&docs, dep), "{helm}: {source} needs {dep}");
            }
        }
    }
}

// One owner per group-version (docs/api-groups.md): with cozyplane,
// cozystack-api must not register v1alpha1.sdn.cozystack.io, or the two
// charts fight over one APIService and the group routes to whichever wrote
// last; with kubeovn-cilium cozystack-api keeps it (no value passed).
#[test]
fn cozystack_api_hands_the_sdn_group_to_cozyplane_only_on_its_variant() {
    let Some(helms) = helms(needs!()) else { return };
    for (helm, docs) in Case::networking("cozyplane").docs(&helms) {
        let engine = package(&helm, &docs, "cozystack.cozystack-engine");
        assert_eq!(
            engine["spec"]["components"]["cozystack-api"]["values"]["cozystackAPI"]["serveSDN"],
            false,
            "{helm}"
        );
    }
    for (helm, docs) in Case::networking("kubeovn-cilium").docs(&helms) {
        let engine = package(&helm, &docs, "cozystack.cozystack-engine");
        assert!(
            engine["spec"]["components"].get("cozystack-api").is_none(),
            "{helm}: {}",
            engine["spec"]
        );
    }
}
