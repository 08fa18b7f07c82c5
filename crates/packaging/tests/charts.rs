//! The chart test suite: `charts/cozyplane` and `charts/cozyplane-apiserver`
//! rendered by the real helm 3 and helm 4 binaries (helm-unittest is not in
//! any package registry; docs/packaging.md), the documents parsed and
//! asserted. Each test pins one behaviour and says which failure it guards.
//! Also: the Kubernetes OpenAPI schemas (kubernetes-validate, strict) for every
//! version the charts claim, and a checkov scan against the committed list
//! of accepted findings.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use clap::Parser;
use cozyplane_packaging::{fabricip_crd_yaml, Render, RenderError};
use serde_json::{json, Value};

const WORKSPACE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
const CNI: &str = "charts/cozyplane";
const API: &str = "charts/cozyplane-apiserver";

fn path(rel: &str) -> PathBuf {
    Path::new(WORKSPACE).join(rel)
}

/// helm 3 and helm 4, or none (the gate skips visibly, or fails under CI).
fn helms(test: &str) -> Vec<PathBuf> {
    let h3 = cozyplane_testkit::helm(3);
    let h4 = cozyplane_testkit::helm(4);
    let ready = cozyplane_testkit::Needs::new(test)
        .found(&h3)
        .found(&h4)
        .ready();
    if !ready {
        return Vec::new();
    }
    vec![h3.unwrap(), h4.unwrap()]
}

/// Runs `f` with a render of `chart` (default values) by each helm.
fn each_helm(test: &str, mut f: impl FnMut(&Path)) {
    for helm in helms(test) {
        f(&helm);
    }
}

fn render(helm: &Path, chart: &str, set: &[(&str, Value)], files: &[&str]) -> Vec<Value> {
    let chart = path(chart);
    let mut r = Render::new(helm, &chart);
    for f in files {
        r = r.values(path(f));
    }
    for (k, v) in set {
        r = r.set(k, v.clone());
    }
    r.docs()
        .unwrap_or_else(|e| panic!("{}: {e}", helm.display()))
}

fn render_err(helm: &Path, chart: &str, set: &[(&str, Value)]) -> String {
    let chart = path(chart);
    let mut r = Render::new(helm, &chart);
    for (k, v) in set {
        r = r.set(k, v.clone());
    }
    match r.docs() {
        Err(RenderError::Failed { stderr, .. }) => stderr,
        other => panic!(
            "{}: expected a failed render, got {other:?}",
            helm.display()
        ),
    }
}

/// The one document of `kind` named `name`.
fn doc<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    let found: Vec<&Value> = docs
        .iter()
        .filter(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .collect();
    assert_eq!(found.len(), 1, "{kind}/{name}: {} documents", found.len());
    found[0]
}

fn has(docs: &[Value], kind: &str, name: &str) -> bool {
    docs.iter()
        .any(|d| d["kind"] == kind && d["metadata"]["name"] == name)
}

fn container<'a>(workload: &'a Value, name: &str) -> &'a Value {
    workload["spec"]["template"]["spec"]["containers"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["name"] == name))
        .unwrap_or_else(|| panic!("no container {name}"))
}

fn args(c: &Value) -> Vec<String> {
    c["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect()
}

fn env<'a>(c: &'a Value, name: &str) -> Option<&'a Value> {
    c["env"]
        .as_array()
        .and_then(|e| e.iter().find(|v| v["name"] == name))
        .map(|v| &v["value"])
}

fn workloads(docs: &[Value]) -> impl Iterator<Item = &Value> {
    docs.iter()
        .filter(|d| ["DaemonSet", "Deployment"].contains(&d["kind"].as_str().unwrap_or("")))
}

// ---------------------------------------------------------------------------
// One source of truth: the CRD, the roles, the flags.

/// The chart's FabricIP CRD is the one the Rust type generates: a field added
/// to the type and not to the chart would be pruned by kube-apiserver on
/// every write, silently losing it.
#[test]
fn fabricip_crd_is_generated_from_the_rust_type() {
    let file = path("charts/cozyplane/crds/fabricips.yaml");
    let want = fabricip_crd_yaml().unwrap();
    if std::env::var_os("COZYPLANE_BLESS").is_some() {
        std::fs::write(&file, &want).unwrap();
    }
    let got = std::fs::read_to_string(&file).unwrap_or_default();
    assert!(
        got == want,
        "{} differs from the Rust type; run COZYPLANE_BLESS=1 cargo test -p cozyplane-packaging --test charts",
        file.display()
    );
}

/// The bootstrap policy's rules for `name` (the roles the lab gives each
/// component's identity, and every lab test runs under).
fn bootstrap_rules(name: &str) -> Value {
    cozyplane_apiserver::auth::bootstrap::objects()
        .into_iter()
        .map(|(_, o)| o)
        .find(|o| o["metadata"]["name"] == name)
        .map(|o| o["rules"].clone())
        .unwrap_or_else(|| panic!("no bootstrap role {name}"))
}

/// A rule as a comparable value: every list sorted (RBAC's meaning does not
/// depend on order), the rules themselves sorted.
fn canonical(rules: &Value) -> Vec<Value> {
    let mut out: Vec<Value> = rules
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let mut r = r.as_object().unwrap().clone();
            for v in r.values_mut() {
                if let Some(a) = v.as_array_mut() {
                    a.sort_by_key(|x| x.to_string());
                }
            }
            Value::Object(r)
        })
        .collect();
    out.sort_by_key(|r| r.to_string());
    out
}

/// The RBAC the chart gives the agent and the controller is exactly what the
/// lab gives their identities (the API server's bootstrap roles, under which
/// the whole lab suite runs with RBAC enforced): a permission the code needs
/// and the chart lacks fails the lab; one the chart grants and the code does
/// not need fails here.
#[test]
fn component_roles_are_the_roles_the_lab_runs_under() {
    each_helm(&cozyplane_testkit::test_name!(), |helm| {
        let docs = render(helm, CNI, &[], &[]);
        for (kind, name) in [
            ("ClusterRole", "cozyplane:agent"),
            ("ClusterRole", "cozyplane:controller"),
            ("Role", "cozyplane:controller:leader-election"),
        ] {
            let chart = &doc(&docs, kind, name)["rules"];
            assert_eq!(
                canonical(chart),
                canonical(&bootstrap_rules(name)),
                "{kind}/{name}"
            );
        }
        // each bound to its ServiceAccount, nothing else
        for (kind, name, sa) in [
            ("ClusterRoleBinding", "cozyplane:agent", "cozyplane-agent"),
            (
                "ClusterRoleBinding",
                "cozyplane:controller",
                "cozyplane-controller",
            ),
            (
                "RoleBinding",
                "cozyplane:controller:leader-election",
                "cozyplane-controller",
            ),
        ] {
            let b = doc(&docs, kind, name);
            assert_eq!(b["roleRef"]["name"], name);
            assert_eq!(
                b["subjects"],
                json!([{"kind": "ServiceAccount", "name": sa, "namespace": "cozy-cozyplane"}])
            );
        }
    });
}

/// Tenant roles aggregate into Cozystack's tenant roles (not Kubernetes'
/// admin/edit/view, which Cozystack tenants are not bound to), grant only
/// namespaced kinds, and are the bootstrap's tenant grants rule for rule.
#[test]
fn tenant_roles_aggregate_to_cozystack_tenants_with_namespaced_kinds_only() {
    each_helm(&cozyplane_testkit::test_name!(), |helm| {
        let docs = render(helm, API, &[], &[]);
        for (name, label, bootstrap) in [
            (
                "cozyplane:tenant:view",
                "rbac.cozystack.io/aggregate-to-tenant-view",
                "cozyplane:aggregate-to-view",
            ),
            (
                "cozyplane:tenant:admin",
                "rbac.cozystack.io/aggregate-to-tenant-admin",
                "cozyplane:aggregate-to-edit",
            ),
        ] {
            let role = doc(&docs, "ClusterRole", name);
            assert_eq!(role["metadata"]["labels"][label], "true", "{name}");
            let labels = role["metadata"]["labels"].as_object().unwrap();
            assert!(
                !labels
                    .keys()
                    .any(|k| k.starts_with("rbac.authorization.k8s.io/")),
                "{name} aggregates into a Kubernetes role"
            );
            assert_eq!(
                canonical(&role["rules"]),
                canonical(&bootstrap_rules(bootstrap))
            );
            for r in role["rules"].as_array().unwrap() {
                for res in r["resources"].as_array().unwrap() {
                    let base = res.as_str().unwrap().split('/').next().unwrap();
                    let info = cozyplane_api::sdn_kinds()
                        .into_iter()
                        .find(|k| k.plural == base)
                        .unwrap_or_else(|| panic!("{base} is not a cozyplane kind"));
                    assert!(info.namespaced, "{name} grants cluster-scoped {base}");
                }
            }
        }
        let off = render(
            helm,
            API,
            &[("tenantRoles", json!({"enabled": false}))],
            &[],
        );
        assert!(!has(&off, "ClusterRole", "cozyplane:tenant:view"));
        assert!(!has(&off, "ClusterRole", "cozyplane:tenant:admin"));
    });
}

/// No RBAC rule anywhere uses a wildcard, and the aggregated server's
/// bindings are the two every aggregated server needs, nothing more.
#[test]
fn no_wildcard_rbac_and_the_aggregated_servers_bindings() {
    each_helm(&cozyplane_testkit::test_name!(), |helm| {
        let mut all = render(helm, CNI, &[], &[]);
        let api = render(helm, API, &[], &[]);
        all.extend(api.iter().cloned());
        for d in all
            .iter()
            .filter(|d| d["kind"] == "ClusterRole" || d["kind"] == "Role")
        {
            for r in d["rules"].as_array().unwrap() {
                for field in ["verbs", "resources", "apiGroups", "nonResourceURLs"] {
                    if let Some(a) = r[field].as_array() {
                        assert!(
                            !a.iter().any(|v| v.as_str().unwrap().contains('*')),
                            "{}: wildcard in {field}",
                            d["metadata"]["name"]
                        );
                    }
                }
            }
        }
        let crb = doc(
            &api,
            "ClusterRoleBinding",
            "cozyplane-apiserver:system:auth-delegator",
        );
        assert_eq!(crb["roleRef"]["name"], "system:auth-delegator");
        let rb = doc(
            &api,
            "RoleBinding",
            "cozyplane-apiserver:extension-apiserver-authentication-reader",
        );
        assert_eq!(rb["metadata"]["namespace"], "kube-system");
        assert_eq!(rb["roleRef"]["kind"], "Role");
        assert_eq!(
            rb["roleRef"]["name"],
            "extension-apiserver-authentication-reader"
        );
        let bindings = api
            .iter()
            .filter(|d| d["kind"].as_str().unwrap_or("").ends_with("Binding"))
            .count();
        assert_eq!(bindings, 2, "the API server's chart binds only those two");
    });
}

#[derive(Parser)]
struct AgentCli {
    #[command(flatten)]
    args: cozyplane_agent::runtime::AgentArgs,
}

#[derive(Parser)]
struct ControllerCli {
    #[command(flatten)]
    args: cozyplane_controller::ControllerArgs,
}

#[derive(Parser)]
struct ApiserverCli {
    #[command(flatten)]
    args: cozyplane_apiserver::ApiserverArgs,
}

/// `cozyplane <subcommand> <args…>` parsed as the binary parses it.
fn parse<P: Parser>(argv: &[String]) -> P {
    let mut full = vec!["cozyplane".to_string()];
    full.extend(argv.iter().skip(1).cloned());
    P::try_parse_from(&full).unwrap_or_else(|e| panic!("{argv:?}: {e}"))
}

/// The agent the chart deploys is configured as the lab's agents are: both
/// command lines parse (a flag renamed in the code fails here, not on a
/// user's cluster) and every setting is equal but the places (paths, the
/// kubeconfig, the node), which differ by construction.
#[test]
fn agent_and_controller_flags_are_the_labs() {
    each_helm(&cozyplane_testkit::test_name!(), |helm| {
        let docs = render(helm, CNI, &[], &[]);
        let agent = container(doc(&docs, "DaemonSet", "cozyplane-agent"), "agent");
        let mut chart_argv = args(agent);
        assert_eq!(chart_argv[0], "agent");
        // The node comes from the downward API as NODE_NAME (the flag's env).
        assert_eq!(
            agent["env"][0],
            json!({"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}})
        );
        chart_argv.push("--node-name=n".into());
        let chart = parse::<AgentCli>(&chart_argv).args;
        let tmp = Path::new("/lab");
        let lab_argv: Vec<String> =
            cozyplane_lab::cluster::agent_args(&cozyplane_lab::cluster::AgentPlace {
                node: "n",
                kubeconfig: &tmp.join("kc"),
                dir: tmp,
                cgroup: &tmp.join("cg"),
                apiserver: "10.0.0.1/32",
                kube_proxy_replacement: true,
                service_slots: None,
                cni_plugin: Some(&tmp.join("cni")),
            })
            .into_iter()
            .map(|a| a.into_string().unwrap())
            .collect();
        let lab = parse::<AgentCli>(&lab_argv).args;
        // The settings: equal.
        assert_eq!(chart.cluster_cidr, lab.cluster_cidr);
        assert_eq!(chart.mtu, lab.mtu);
        assert_eq!(
            format!("{:?}", chart.masquerade),
            format!("{:?}", lab.masquerade)
        );
        assert_eq!(chart.metrics_bind, lab.metrics_bind);
        assert_eq!(chart.sync_debounce_ms, lab.sync_debounce_ms);
        assert_eq!(chart.kube_proxy_replacement, lab.kube_proxy_replacement);
        assert_eq!(chart.service_proxy_name, lab.service_proxy_name);
        assert_eq!(chart.cni_conf_name, lab.cni_conf_name);
        assert_eq!(chart.overlay_device, lab.overlay_device);
        assert_eq!(chart.uplink, lab.uplink);
        // The places: the chart's, inside the container.
        assert_eq!(chart.bpffs, Path::new("/sys/fs/bpf"));
        assert_eq!(chart.run_dir, Path::new("/run/cozyplane"));
        assert_eq!(
            chart.cni_plugin.as_deref(),
            Some(Path::new("/usr/local/bin/cozyplane-cni"))
        );
        assert!(
            chart.metrics_bind.ip().is_loopback(),
            "unauthenticated metrics"
        );
        // Every flag the lab sets the chart sets too, but the lab's own
        // (its kubeconfig: in a pod the ServiceAccount; the API server's
        // address: a managed control plane in the lab).
        let flags = |argv: &[String]| -> BTreeSet<String> {
            argv.iter()
                .filter_map(|a| a.strip_prefix("--"))
                .map(|a| a.split('=').next().unwrap().to_string())
                .collect()
        };
        let lab_only: BTreeSet<String> = flags(&lab_argv)
            .difference(&flags(&chart_argv))
            .cloned()
            .collect();
        assert_eq!(
            lab_only,
            BTreeSet::from(["kubeconfig".into(), "service-external-backends".into()])
        );

        let ctl = container(
            doc(&docs, "Deployment", "cozyplane-controller"),
            "controller",
        );
        let chart = parse::<ControllerCli>(&args(ctl)).args;
        let lab_argv: Vec<String> = cozyplane_lab::cluster::controller_args(Path::new("/kc"))
            .into_iter()
            .map(|a| a.into_string().unwrap())
            .collect();
        let lab = parse::<ControllerCli>(&lab_argv).args;
        assert!(chart.leader_elect && lab.leader_elect);
        assert_eq!(chart.lease_name, lab.lease_name);
        assert_eq!(chart.lease_namespace, "cozy-cozyplane");
        assert_eq!(chart.metrics_bind, lab.metrics_bind);
        assert!(chart.metrics_bind.ip().is_loopback());
        assert_eq!(
            (chart.gc_grace, chart.resync, chart.lease_duration),
            (lab.gc_grace, lab.resync, lab.lease_duration)
        );
        // The exec probe asks the loopback endpoint the flag binds.
        let probe = ctl["readinessProbe"]["exec"]["command"].clone();
        assert_eq!(
            probe,
            json!([
                "/usr/local/bin/cozyplane",
                "healthcheck",
                format!("http://{}/readyz", chart.metrics_bind)
            ])
        );

        let api = render(helm, API, &[], &[]);
        let server = container(doc(&api, "Deployment", "cozyplane-apiserver"), "apiserver");
        let a = parse::<ApiserverCli>(&args(server)).args;
        assert!(!a.standalone);
        assert_eq!(format!("{:?}", a.storage), "Etcd");
        assert_eq!(
            a.etcd_endpoints,
            ["https://cozyplane-etcd-client.cozy-cozyplane.svc:2379"]
        );
        // The agents it node-restricts are the CNI chart's DaemonSet's
        // ServiceAccount: a name drifting apart would leave them unrestricted.
        let ds = doc(&docs, "DaemonSet", "cozyplane-agent");
        assert_eq!(
            a.agent_service_account,
            [format!(
                "system:serviceaccount:cozy-cozyplane:{}",
                ds["spec"]["template"]["spec"]["serviceAccountName"]
                    .as_str()
                    .unwrap()
            )]
        );
    });
}

/// A value the chart renders becomes the flag the agent reads.
#[test]
fn values_thread_into_the_agent() {
    each_helm(&cozyplane_testkit::test_name!(), |helm| {
        let docs = render(
            helm,
            CNI,
            &[
                ("podCIDR", json!("10.123.0.0/16,fd00:10:123::/56")),
                ("mtu", json!(1400)),
                ("kubeProxyReplacement", json!(false)),
                ("masquerade", json!("off")),
                ("serviceExternalBackends", json!("192.0.2.0/24")),
                ("cni", json!({"confName": "05-x.conflist"})),
            ],
            &[],
        );
        let mut argv = args(container(
            doc(&docs, "DaemonSet", "cozyplane-agent"),
            "agent",
        ));
        argv.push("--node-name=n".into());
        let a = parse::<AgentCli>(&argv).args;
        assert_eq!(a.cluster_cidr, "10.123.0.0/16,fd00:10:123::/56");
        assert_eq!(a.mtu, Some(1400));
        assert!(!a.kube_proxy_replacement);
        assert_eq!(format!("{:?}", a.masquerade), "Off");
        assert_eq!(a.service_external_backends, "192.0.2.0/24");
        assert_eq!(a.cni_conf_name, "05-x.conflist");
        // mtu 0 (the default) leaves the flag out: the agent derives it
        let docs = render(helm, CNI, &[], &[]);
        let argv = args(container(
            doc(&docs, "DaemonSet", "cozyplane-agent"),
            "agent",
        ));
        assert!(!argv.iter().any(|a| a.starts_with("--mtu")));
        // a value outside the set is refused, naming it
        let e = render_err(helm, CNI, &[("masquerade", json!("nat"))]);
        assert!(e.contains("masquerade must be bpf or off"), "{e}");
    });
}

/// Talos: the agent reaches kube-apiserver through KubePrism (localhost:7445),
/// since without kube-proxy no ClusterIP is served before the agent runs; the
/// controller stays on the in-cluster Service (it is not host-network, and
/// the agent serves the ClusterIP by then).
#[test]
fn talos_overlay_points_the_agent_at_kubeprism() {
    each_helm(&cozyplane_testkit::test_name!(), |helm| {
        let docs = render(
            helm,
            CNI,
            &[],
            &[
                "charts/cozyplane/values.yaml",
                "charts/cozyplane/values-talos.yaml",
            ],
        );
        let agent = container(doc(&docs, "DaemonSet", "cozyplane-agent"), "agent");
        assert_eq!(
            env(agent, "KUBERNETES_SERVICE_HOST"),
            Some(&json!("localhost"))
        );
        assert_eq!(env(agent, "KUBERNETES_SERVICE_PORT"), Some(&json!("7445")));
        assert!(args(agent).contains(&"--cni-conf-name=00-cozyplane.conflist".to_string()));
        let ctl = container(
            doc(&docs, "Deployment", "cozyplane-controller"),
            "controller",
        );
        assert_eq!(env(ctl, "KUBERNETES_SERVICE_HOST"), None);
        // default values: no override at all
        let docs = render(helm, CNI, &[], &[]);
        let agent = container(doc(&docs, "DaemonSet", "cozyplane-agent"), "agent");
        assert_eq!(env(agent, "KUBERNETES_SERVICE_HOST"), None);
        // a host without a port is refused
        let e = render_err(helm, CNI, &[("apiServer", json!({"host": "10.0.0.1"}))]);
        assert!(e.contains("apiServer.port is required"), "{e}");
    });
}

// ---------------------------------------------------------------------------
// Security contexts, resources, replicas, images.

/// The agent runs with named capabilities instead of `privileged`, on a
/// read-only root; every other container is fully restricted. Pinned
/// exactly: a capability added in passing is a review finding.
#[test]
fn security_contexts_are_pinned() {
    each_helm(&cozyplane_testkit::test_name!(), |helm| {
        let docs = render(helm, CNI, &[], &[]);
        let agent = container(doc(&docs, "DaemonSet", "cozyplane-agent"), "agent");
        let sc = &agent["securityContext"];
        assert_eq!(sc["privileged"], false);
        assert_eq!(sc["allowPrivilegeEscalation"], false);
        assert_eq!(sc["readOnlyRootFilesystem"], true);
        assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]));
        assert_eq!(
            sc["capabilities"]["add"],
            json!([
                "BPF",
                "PERFMON",
                "NET_ADMIN",
                "SYS_ADMIN",
                "NET_RAW",
                "SYS_RESOURCE"
            ])
        );
        assert_eq!(sc["seccompProfile"]["type"], "RuntimeDefault");
        let ds = doc(&docs, "DaemonSet", "cozyplane-agent");
        assert_eq!(ds["spec"]["template"]["spec"]["hostNetwork"], true);
        assert!(ds["spec"]["template"]["spec"]["hostPID"].is_null());
        assert_eq!(
            ds["spec"]["template"]["spec"]["priorityClassName"],
            "system-node-critical"
        );
        // The pod network namespaces the runtime names in CNI_NETNS
        // (containerd, CRI-O: /var/run/netns/<id>, or /run/netns) are
        // visible to the agent, including ones made after it started.
        for path in ["/run/netns", "/var/run/netns"] {
            let m = agent["volumeMounts"]
                .as_array()
                .unwrap()
                .iter()
                .find(|m| m["mountPath"] == path)
                .unwrap_or_else(|| panic!("{path} not mounted"));
            assert_eq!(m["mountPropagation"], "HostToContainer", "{path}");
        }
        // Bidirectional propagation needs a privileged container: none here.
        for m in agent["volumeMounts"].as_array().unwrap() {
            assert_ne!(m["mountPropagation"], "Bidirectional", "{m}");
        }
        let restricted = json!({
            "allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true,
            "runAsNonRoot": true, "runAsUser": 65532, "runAsGroup": 65532,
            "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}});
        let ctl = container(
            doc(&docs, "Deployment", "cozyplane-controller"),
            "controller",
        );
        assert_eq!(ctl["securityContext"], restricted);
        let api = render(helm, API, &[], &[]);
        let d = doc(&api, "Deployment", "cozyplane-apiserver");
        let pod_sc = &d["spec"]["template"]["spec"]["securityContext"];
        assert_eq!(pod_sc["runAsNonRoot"], true);
        assert_eq!(pod_sc["seccompProfile"]["type"], "RuntimeDefault");
        let c = container(d, "apiserver");
        assert_eq!(
            c["securityContext"],
            json!({"allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true,
                   "capabilities": {"drop": ["ALL"]}})
        );
    });
}

/// Every container requests CPU and memory and is memory-limited (the Talos
/// OOM handler targets cgroups without memory.max).
#[test]
fn every_container_has_requests_and_a_memory_limit() {
    each_helm(&cozyplane_testkit::test_name!(), |helm| {
        for chart in [CNI, API] {
            let docs = render(helm, chart, &[], &[]);
            for w in workloads(&docs) {
                for c in w["spec"]["template"]["spec"]["containers"]
                    .as_array()
                    .unwrap()
                {
                    let r = &c["resources"];
                    assert!(r["requests"]["cpu"].is_string(), "{}", c["name"]);
                    assert!(r["requests"]["memory"].is_string(), "{}", c["name"]);
                    assert!(r["limits"]["memory"].is_string(), "{}", c["name"]);
                }
            }
        }
    });
}

/// Bytes in a Kubernetes quantity (`Mi`, `Gi`).
fn bytes(q: &str) -> u64 {
    let (n, unit) = q.split_at(q.find(|c: char| !c.is_ascii_digit()).unwrap_or(q.len()));
    let n: u64 = n.parse().unwrap();
    n * match unit {
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "" => 1,
        u => panic!("unit {u}"),
    }
}

/// The agent's memory limit covers every BPF map full (maps are charged to
/// the memory cgroup of the process that creates them, so an agent limited
/// below its maps is OOM-killed when a busy node fills them) plus the
/// process itself, on a node of up to 64 CPUs. Per-entry cost as the kernel
/// allocates it: hash and LRU elements carry a 48-byte header and 8-byte
/// aligned key and value (per-CPU values: one per CPU); LPM trie nodes a
/// 48-byte header; arrays the aligned value.
#[test]
fn agent_memory_limit_covers_full_bpf_maps() {
    use cozyplane_datapath::datapath::MAP_SPECS;
    const CPUS: u64 = 64;
    const PROCESS: u64 = 256 << 20; // the agent's own heap and caches, generous
    let align = |n: u32| (u64::from(n) + 7) & !7;
    let mut maps = 0u64;
    for m in MAP_SPECS {
        let ty = format!("{:?}", m.map_type);
        let entries = u64::from(m.max_entries);
        let per_cpu = if ty.contains("PerCpu") { CPUS } else { 1 };
        let each = if ty.contains("Array") {
            align(m.value_size) * per_cpu
        } else if ty.contains("Lpm") {
            48 + align(m.key_size) + align(m.value_size)
        } else if ty.contains("Hash") || ty.contains("Lru") {
            48 + align(m.key_size) + align(m.value_size) * per_cpu
        } else {
            // ring buffers, prog arrays and the like: value-sized
            align(m.key_size) + align(m.value_size)
        };
        maps += entries * each;
    }
    each_helm(&cozyplane_testkit::test_name!(), |helm| {
        let docs = render(helm, CNI, &[], &[]);
        let agent = container(doc(&docs, "DaemonSet", "cozyplane-agent"), "agent");
        let limit = bytes(agent["resources"]["limits"]["memory"].as_str().unwrap());
        assert!(
            limit >= maps + PROCESS,
            "limit {} MiB < maps {} MiB + process {} MiB",
            limit >> 20,
            maps >> 20,
            PROCESS >> 20
        );
    });
}

/// The controller runs two replicas with leader election on; two replicas
/// without it are refused (two collectors would race). The API server runs
/// two replicas on etcd, one with Recreate on the embedded store, and never
/// on an emptyDir.
#[test]
fn replicas_leader_election_and_durable_storage() {
    each_helm(&cozyplane_testkit::test_name!(), |helm| {
        let docs = render(helm, CNI, &[], &[]);
        let d = doc(&docs, "Deployment", "cozyplane-controller");
        assert_eq!(d["spec"]["replicas"], 2);
        assert!(args(container(d, "controller")).contains(&"--leader-elect=true".to_string()));
        let e = render_err(helm, CNI, &[("controller", json!({"leaderElect": false}))]);
        assert!(
            e.contains("controller.replicas > 1 needs controller.leaderElect"),
            "{e}"
        );
        let one = render(
            helm,
            CNI,
            &[("controller", json!({"leaderElect": false, "replicas": 1}))],
            &[],
        );
        let d = doc(&one, "Deployment", "cozyplane-controller");
        assert!(args(container(d, "controller")).contains(&"--leader-elect=false".to_string()));
        assert!(!has(&one, "Role", "cozyplane:controller:leader-election"));

        let api = render(helm, API, &[], &[]);
        let d = doc(&api, "Deployment", "cozyplane-apiserver");
        assert_eq!(d["spec"]["replicas"], 2);
        assert!(has(&api, "PodDisruptionBudget", "cozyplane-apiserver"));
        let emb = render(helm, API, &[("storage", json!({"type": "embedded"}))], &[]);
        let d = doc(&emb, "Deployment", "cozyplane-apiserver");
        assert_eq!(d["spec"]["replicas"], 1);
        assert_eq!(d["spec"]["strategy"]["type"], "Recreate");
        let pvc = doc(&emb, "PersistentVolumeClaim", "cozyplane-apiserver-data");
        assert_eq!(
            pvc["metadata"]["annotations"]["helm.sh/resource-policy"],
            "keep"
        );
        assert!(args(container(d, "apiserver")).contains(&"--storage=embedded".to_string()));
        assert!(!has(&emb, "EtcdCluster", "cozyplane-etcd"));
        for docs in [&docs, &api, &emb] {
            for w in workloads(docs) {
                for v in w["spec"]["template"]["spec"]["volumes"]
                    .as_array()
                    .into_iter()
                    .flatten()
                {
                    assert!(
                        v["emptyDir"].is_null(),
                        "{}: emptyDir",
                        w["metadata"]["name"]
                    );
                }
            }
        }
        let e = render_err(helm, API, &[("storage", json!({"type": "memory"}))]);
        assert!(e.contains("storage.type must be etcd or embedded"), "{e}");
    });
}

/// The EtcdCluster is what etcd-operator v0.5.4 (v1alpha2) accepts and what
/// Cozystack reviewers asked for: a version, PVC storage with the class left
/// out unless set (an empty string turns provisioning off), TLS by
/// cert-manager on both planes, and the server dials the client Service with
/// a certificate from the client plane's CA.
#[test]
fn etcd_cluster_shape() {
    each_helm(&cozyplane_testkit::test_name!(), |helm| {
        let api = render(helm, API, &[], &[]);
        let e = doc(&api, "EtcdCluster", "cozyplane-etcd");
        assert_eq!(e["apiVersion"], "etcd-operator.cozystack.io/v1alpha2");
        let spec = &e["spec"];
        assert_eq!(spec["version"], "3.6.11");
        assert_eq!(spec["replicas"], 3);
        assert_eq!(spec["storage"]["size"], "4Gi");
        assert!(spec["storage"].get("storageClassName").is_none());
        assert!(spec["storage"].get("medium").is_none());
        assert_eq!(
            spec["tls"]["client"]["certManager"]["serverIssuerRef"]["name"],
            "cozyplane-etcd-client-ca"
        );
        assert_eq!(
            spec["tls"]["peer"]["certManager"]["issuerRef"]["name"],
            "cozyplane-etcd-peer-ca"
        );
        let client = doc(&api, "Certificate", "cozyplane-apiserver-etcd-client");
        assert_eq!(
            client["spec"]["issuerRef"]["name"],
            "cozyplane-etcd-client-ca"
        );
        assert_eq!(client["spec"]["usages"], json!(["client auth"]));
        let with_class = render(
            helm,
            API,
            &[(
                "storage",
                json!({"etcd": {"storageClassName": "replicated"}}),
            )],
            &[],
        );
        let e = doc(&with_class, "EtcdCluster", "cozyplane-etcd");
        assert_eq!(e["spec"]["storage"]["storageClassName"], "replicated");
    });
}

/// The APIService names the Service and gets its CA from cert-manager; the
/// serving certificate names the Service under the cluster domain given.
#[test]
fn apiservice_and_serving_certificate() {
    each_helm(&cozyplane_testkit::test_name!(), |helm| {
        let api = render(helm, API, &[("clusterDomain", json!("cozy.local"))], &[]);
        let s = doc(&api, "APIService", "v1alpha1.sdn.cozystack.io");
        assert_eq!(s["spec"]["group"], "sdn.cozystack.io");
        assert_eq!(s["spec"]["version"], "v1alpha1");
        assert_eq!(
            s["spec"]["service"],
            json!({"name": "cozyplane-apiserver", "namespace": "cozy-cozyplane", "port": 443})
        );
        assert!(s["spec"].get("insecureSkipTLSVerify").is_none());
        assert_eq!(
            s["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
            "cozy-cozyplane/cozyplane-apiserver-ca"
        );
        let cert = doc(&api, "Certificate", "cozyplane-apiserver-serving");
        assert!(cert["spec"]["dnsNames"]
            .as_array()
            .unwrap()
            .contains(&json!("cozyplane-apiserver.cozy-cozyplane.svc.cozy.local")));
    });
}

/// Every image is `repo:tag@sha256:digest` (Cozystack's rule: both halves);
/// a bare tag is refused at render time with the stamping command named.
#[test]
fn images_are_tag_at_digest() {
    let re = |s: &str| {
        let (name, digest) = s.split_once("@sha256:").unwrap_or((s, ""));
        digest.len() == 64
            && digest
                .bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
            && name.rsplit_once(':').is_some_and(|(repo, tag)| {
                !repo.is_empty() && !tag.is_empty() && !tag.contains('/')
            })
    };
    each_helm(&cozyplane_testkit::test_name!(), |helm| {
        for chart in [CNI, API] {
            let docs = render(helm, chart, &[], &[]);
            for w in workloads(&docs) {
                for c in w["spec"]["template"]["spec"]["containers"]
                    .as_array()
                    .unwrap()
                {
                    let image = c["image"].as_str().unwrap();
                    assert!(re(image), "{image}");
                }
            }
            for bad in [
                "ghcr.io/cozystack/cozyplane:0.1.0",
                "ghcr.io/cozystack/cozyplane@sha256:0000000000000000000000000000000000000000000000000000000000000000",
            ] {
                let e = render_err(helm, chart, &[("image", json!(bad))]);
                assert!(e.contains("image must be repo:tag@sha256"), "{e}");
                assert!(e.contains("images/cozyplane/stamp"), "{e}");
            }
        }
    });
}

/// The agent's node restriction: FabricIP claims and pod patches by the
/// agent's ServiceAccount are judged against the node its bound token
/// names (what RBAC cannot say).
#[test]
fn agent_writes_are_restricted_to_its_node() {
    each_helm(&cozyplane_testkit::test_name!(), |helm| {
        let docs = render(helm, CNI, &[], &[]);
        let p = doc(
            &docs,
            "ValidatingAdmissionPolicy",
            "cozyplane-agent-node-restriction",
        );
        assert_eq!(p["spec"]["failurePolicy"], "Fail");
        assert_eq!(
            p["spec"]["matchConditions"][0]["expression"],
            "request.userInfo.username == \"system:serviceaccount:cozy-cozyplane:cozyplane-agent\""
        );
        let b = doc(
            &docs,
            "ValidatingAdmissionPolicyBinding",
            "cozyplane-agent-node-restriction",
        );
        assert_eq!(b["spec"]["validationActions"], json!(["Deny"]));
        assert_eq!(b["spec"]["policyName"], "cozyplane-agent-node-restriction");
    });
}

// ---------------------------------------------------------------------------
// Schemas and the security scan.

/// The variants every schema and scan test renders: default values and
/// Talos for the CNI; etcd and embedded storage for the API server.
/// A chart, `--set-json` values and values files.
type Variant = (&'static str, Vec<(&'static str, Value)>, Vec<&'static str>);

fn variants() -> Vec<Variant> {
    vec![
        (CNI, vec![], vec![]),
        (
            CNI,
            vec![],
            vec![
                "charts/cozyplane/values.yaml",
                "charts/cozyplane/values-talos.yaml",
            ],
        ),
        (API, vec![], vec![]),
        (API, vec![("storage", json!({"type": "embedded"}))], vec![]),
    ]
}

/// Kinds the Kubernetes OpenAPI schemas do not cover (third-party CRDs the
/// API server chart uses): their shape is pinned by `etcd_cluster_shape`
/// and `apiservice_and_serving_certificate`.
const THIRD_PARTY: &[&str] = &[
    "cert-manager.io/v1 Certificate",
    "cert-manager.io/v1 Issuer",
    "etcd-operator.cozystack.io/v1alpha2 EtcdCluster",
];

/// Every rendered document, and the FabricIP CRD, validates in strict mode
/// (unknown fields are errors) against the published OpenAPI schemas of
/// every Kubernetes version the charts claim (>= 1.30, up to the newest
/// kubernetes-validate ships).
#[test]
fn every_document_validates_against_the_kubernetes_schemas() {
    let kv = cozyplane_testkit::packaging_tool("venv/bin/kubernetes-validate", &["--version"]);
    let helm = cozyplane_testkit::helm(4);
    if !cozyplane_testkit::needs!().found(&kv).found(&helm).ready() {
        return;
    }
    let (kv, helm) = (kv.unwrap(), helm.unwrap());
    let dir = tempfile::tempdir().unwrap();
    let mut files = vec![path("charts/cozyplane/crds/fabricips.yaml")];
    for (i, (chart, set, values)) in variants().into_iter().enumerate() {
        let docs = render(&helm, chart, &set, &values);
        let (known, third): (Vec<Value>, Vec<Value>) = docs.into_iter().partition(|d| {
            !THIRD_PARTY.contains(
                &format!(
                    "{} {}",
                    d["apiVersion"].as_str().unwrap(),
                    d["kind"].as_str().unwrap()
                )
                .as_str(),
            )
        });
        assert!(!third.is_empty() || chart == CNI);
        let f = dir.path().join(format!("{i}.yaml"));
        let text: Vec<String> = known
            .iter()
            .map(|d| serde_saphyr::to_string(d).unwrap())
            .collect();
        std::fs::write(&f, text.join("---\n")).unwrap();
        files.push(f);
    }
    for version in [
        "1.30.0", "1.31.0", "1.32.0", "1.33.0", "1.34.0", "1.35.0", "1.36.0", "1.37.0",
    ] {
        let out = std::process::Command::new(&kv)
            .args(["--strict", "--quiet", "-k", version])
            .args(&files)
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "Kubernetes {version}:\n{text}");
        // no document was let through for want of a schema
        assert!(
            !text.contains("Couldn't find schema"),
            "Kubernetes {version}:\n{text}"
        );
    }
}

/// The validator itself refuses what it should (a field no schema has), so a
/// pass above means something.
#[test]
fn the_schema_validator_refuses_an_unknown_field() {
    let kv = cozyplane_testkit::packaging_tool("venv/bin/kubernetes-validate", &["--version"]);
    if !cozyplane_testkit::needs!().found(&kv).ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("bad.yaml");
    std::fs::write(
        &f,
        "apiVersion: apps/v1\nkind: DaemonSet\nmetadata: {name: x}\nspec:\n  selector: {matchLabels: {a: b}}\n  template:\n    metadata: {labels: {a: b}}\n    spec:\n      containers: [{name: a, image: b, privilegd: true}]\n",
    )
    .unwrap();
    let out = std::process::Command::new(kv.unwrap())
        .args(["--strict", "--quiet", "-k", "1.30.0"])
        .arg(&f)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("privilegd"));
}

/// checkov's findings on every rendered variant are exactly the accepted
/// ones in charts/checkov-accepted.yaml, each with its reason: a new finding
/// fails, and so does an accepted entry that no longer fires.
#[test]
fn security_scan_findings_are_fixed_or_justified() {
    let checkov = cozyplane_testkit::packaging_tool("venv/bin/checkov", &["--version"]);
    let helm = cozyplane_testkit::helm(4);
    if !cozyplane_testkit::needs!()
        .found(&checkov)
        .found(&helm)
        .ready()
    {
        return;
    }
    let (checkov, helm) = (checkov.unwrap(), helm.unwrap());
    let accepted_text = std::fs::read_to_string(path("charts/checkov-accepted.yaml")).unwrap();
    let accepted: Vec<Value> = serde_saphyr::from_str(&accepted_text).unwrap();
    let mut allowed: BTreeMap<(String, String), bool> = BTreeMap::new();
    for a in &accepted {
        assert!(
            a["why"].as_str().is_some_and(|w| w.len() > 20),
            "{a}: no reason"
        );
        for r in a["resources"].as_array().unwrap() {
            let key = (
                a["check"].as_str().unwrap().to_string(),
                r.as_str().unwrap().to_string(),
            );
            allowed.insert(key, false);
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let mut unexpected = Vec::new();
    for (i, (chart, set, values)) in variants().into_iter().enumerate() {
        let text = {
            let chart = path(chart);
            let mut r = Render::new(&helm, &chart);
            for f in &values {
                r = r.values(path(f));
            }
            for (k, v) in &set {
                r = r.set(k, v.clone());
            }
            r.text().unwrap()
        };
        let f = dir.path().join(format!("{i}.yaml"));
        std::fs::write(&f, text).unwrap();
        let out = std::process::Command::new(&checkov)
            .args([
                "--framework",
                "kubernetes",
                "--quiet",
                "--compact",
                "-o",
                "json",
                "-f",
            ])
            .arg(&f)
            .output()
            .unwrap();
        let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "checkov output: {e}: {}",
                String::from_utf8_lossy(&out.stdout)
            )
        });
        let failed = report["results"]["failed_checks"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        for f in failed {
            let id = f["check_id"].as_str().unwrap().to_string();
            // "<Kind>.<namespace>.<name>[.<labels>…]" → "<Kind>/<name>"
            let res = f["resource"].as_str().unwrap();
            let mut parts = res.splitn(3, '.');
            let kind = parts.next().unwrap();
            let _ns = parts.next();
            let name = parts
                .next()
                .unwrap_or("")
                .split(".app.kubernetes.io")
                .next()
                .unwrap();
            let key = (id, format!("{kind}/{name}"));
            match allowed.get_mut(&key) {
                Some(seen) => *seen = true,
                None => unexpected.push(format!("{} {} ({chart})", key.0, key.1)),
            }
        }
    }
    assert!(
        unexpected.is_empty(),
        "findings neither fixed nor accepted: {unexpected:#?}"
    );
    let stale: Vec<_> = allowed
        .iter()
        .filter(|(_, seen)| !**seen)
        .map(|(k, _)| k)
        .collect();
    assert!(
        stale.is_empty(),
        "accepted findings that no longer fire: {stale:?}"
    );
}

/// Every documented value not covered by a test above reaches the field it
/// documents (a value renamed in `values.yaml` and not in the template would
/// silently do nothing).
#[test]
fn every_other_documented_value_reaches_its_field() {
    // (chart, value key, value, kind, name, JSON pointer, expected: equal,
    // or for an object the fields named, or for a list an element)
    let cases: Vec<(&str, &str, Value, &str, &str, &str, Value)> = vec![
        (
            CNI,
            "imagePullPolicy",
            json!("Always"),
            "DaemonSet",
            "cozyplane-agent",
            "/spec/template/spec/containers/0/imagePullPolicy",
            json!("Always"),
        ),
        (
            CNI,
            "imagePullPolicy",
            json!("Always"),
            "Deployment",
            "cozyplane-controller",
            "/spec/template/spec/containers/0/imagePullPolicy",
            json!("Always"),
        ),
        (
            CNI,
            "imagePullSecrets",
            json!([{"name": "reg"}]),
            "DaemonSet",
            "cozyplane-agent",
            "/spec/template/spec/imagePullSecrets",
            json!([{"name": "reg"}]),
        ),
        (
            CNI,
            "imagePullSecrets",
            json!([{"name": "reg"}]),
            "Deployment",
            "cozyplane-controller",
            "/spec/template/spec/imagePullSecrets",
            json!([{"name": "reg"}]),
        ),
        (
            CNI,
            "cni",
            json!({"confDir": "/etc/kubernetes/cni/net.d"}),
            "DaemonSet",
            "cozyplane-agent",
            "/spec/template/spec/volumes/4/hostPath/path",
            json!("/etc/kubernetes/cni/net.d"),
        ),
        (
            CNI,
            "cni",
            json!({"binDir": "/usr/libexec/cni"}),
            "DaemonSet",
            "cozyplane-agent",
            "/spec/template/spec/volumes/5/hostPath/path",
            json!("/usr/libexec/cni"),
        ),
        (
            CNI,
            "host",
            json!({"bpffs": "/run/bpf"}),
            "DaemonSet",
            "cozyplane-agent",
            "/spec/template/spec/volumes/0/hostPath/path",
            json!("/run/bpf"),
        ),
        (
            CNI,
            "host",
            json!({"cgroupRoot": "/sys/fs/cgroup/unified"}),
            "DaemonSet",
            "cozyplane-agent",
            "/spec/template/spec/volumes/1/hostPath/path",
            json!("/sys/fs/cgroup/unified"),
        ),
        (
            CNI,
            "agent",
            json!({"priorityClassName": "x"}),
            "DaemonSet",
            "cozyplane-agent",
            "/spec/template/spec/priorityClassName",
            json!("x"),
        ),
        (
            CNI,
            "agent",
            json!({"resources": {"limits": {"memory": "3Gi"}}}),
            "DaemonSet",
            "cozyplane-agent",
            "/spec/template/spec/containers/0/resources/limits/memory",
            json!("3Gi"),
        ),
        (
            CNI,
            "agent",
            json!({"tolerations": [{"key": "k", "operator": "Exists"}]}),
            "DaemonSet",
            "cozyplane-agent",
            "/spec/template/spec/tolerations",
            json!([{"key": "k", "operator": "Exists"}]),
        ),
        (
            CNI,
            "agent",
            json!({"nodeSelector": {"a": "b"}}),
            "DaemonSet",
            "cozyplane-agent",
            "/spec/template/spec/nodeSelector/a",
            json!("b"),
        ),
        (
            CNI,
            "agent",
            json!({"extraArgs": ["--sync-debounce-ms=20"]}),
            "DaemonSet",
            "cozyplane-agent",
            "/spec/template/spec/containers/0/args",
            json!("--sync-debounce-ms=20"),
        ),
        (
            CNI,
            "agent",
            json!({"metricsPort": 9500}),
            "DaemonSet",
            "cozyplane-agent",
            "/spec/template/spec/containers/0/readinessProbe/httpGet/port",
            json!(9500),
        ),
        (
            CNI,
            "controller",
            json!({"replicas": 3}),
            "Deployment",
            "cozyplane-controller",
            "/spec/replicas",
            json!(3),
        ),
        (
            CNI,
            "controller",
            json!({"priorityClassName": "y"}),
            "Deployment",
            "cozyplane-controller",
            "/spec/template/spec/priorityClassName",
            json!("y"),
        ),
        (
            CNI,
            "controller",
            json!({"resources": {"limits": {"memory": "1Gi"}}}),
            "Deployment",
            "cozyplane-controller",
            "/spec/template/spec/containers/0/resources/limits/memory",
            json!("1Gi"),
        ),
        (
            CNI,
            "controller",
            json!({"nodeSelector": {"c": "d"}}),
            "Deployment",
            "cozyplane-controller",
            "/spec/template/spec/nodeSelector/c",
            json!("d"),
        ),
        (
            CNI,
            "controller",
            json!({"tolerations": []}),
            "Deployment",
            "cozyplane-controller",
            "/spec/template/spec/tolerations",
            Value::Null,
        ),
        (
            CNI,
            "controller",
            json!({"extraArgs": ["--gc-grace=30"]}),
            "Deployment",
            "cozyplane-controller",
            "/spec/template/spec/containers/0/args",
            json!("--gc-grace=30"),
        ),
        (
            CNI,
            "controller",
            json!({"metricsPort": 9600}),
            "Deployment",
            "cozyplane-controller",
            "/spec/template/spec/containers/0/args",
            json!("--metrics-bind=127.0.0.1:9600"),
        ),
        (
            API,
            "imagePullPolicy",
            json!("Always"),
            "Deployment",
            "cozyplane-apiserver",
            "/spec/template/spec/containers/0/imagePullPolicy",
            json!("Always"),
        ),
        (
            API,
            "imagePullSecrets",
            json!([{"name": "reg"}]),
            "Deployment",
            "cozyplane-apiserver",
            "/spec/template/spec/imagePullSecrets",
            json!([{"name": "reg"}]),
        ),
        (
            API,
            "replicas",
            json!(3),
            "Deployment",
            "cozyplane-apiserver",
            "/spec/replicas",
            json!(3),
        ),
        (
            API,
            "resources",
            json!({"limits": {"memory": "2Gi"}}),
            "Deployment",
            "cozyplane-apiserver",
            "/spec/template/spec/containers/0/resources/limits/memory",
            json!("2Gi"),
        ),
        (
            API,
            "nodeSelector",
            json!({"e": "f"}),
            "Deployment",
            "cozyplane-apiserver",
            "/spec/template/spec/nodeSelector/e",
            json!("f"),
        ),
        (
            API,
            "tolerations",
            json!([{"operator": "Exists"}]),
            "Deployment",
            "cozyplane-apiserver",
            "/spec/template/spec/tolerations",
            json!([{"operator": "Exists"}]),
        ),
        (
            API,
            "apiService",
            json!({"groupPriorityMinimum": 2000}),
            "APIService",
            "v1alpha1.sdn.cozystack.io",
            "/spec/groupPriorityMinimum",
            json!(2000),
        ),
        (
            API,
            "apiService",
            json!({"versionPriority": 20}),
            "APIService",
            "v1alpha1.sdn.cozystack.io",
            "/spec/versionPriority",
            json!(20),
        ),
        (
            API,
            "storage",
            json!({"etcd": {"name": "e2"}}),
            "EtcdCluster",
            "e2",
            "/metadata/name",
            json!("e2"),
        ),
        (
            API,
            "storage",
            json!({"etcd": {"name": "e2"}}),
            "Deployment",
            "cozyplane-apiserver",
            "/spec/template/spec/containers/0/args",
            json!("--etcd-endpoints=https://e2-client.cozy-cozyplane.svc:2379"),
        ),
        (
            API,
            "storage",
            json!({"etcd": {"version": "3.6.12", "replicas": 5, "size": "8Gi"}}),
            "EtcdCluster",
            "cozyplane-etcd",
            "/spec",
            json!({"version": "3.6.12", "replicas": 5, "storage": {"size": "8Gi"}}),
        ),
        (
            API,
            "storage",
            json!({"type": "embedded", "embedded": {"size": "5Gi", "storageClassName": "fast"}}),
            "PersistentVolumeClaim",
            "cozyplane-apiserver-data",
            "/spec",
            json!({"resources": {"requests": {"storage": "5Gi"}}, "storageClassName": "fast"}),
        ),
    ];
    each_helm(&cozyplane_testkit::test_name!(), |helm| {
        for (chart, key, value, kind, name, pointer, want) in &cases {
            let docs = render(helm, chart, &[(key, value.clone())], &[]);
            let got = doc(&docs, kind, name)
                .pointer(pointer)
                .cloned()
                .unwrap_or(Value::Null);
            // An object expectation is a subset: the named fields only.
            let ok = match (want, &got) {
                (Value::Object(w), Value::Object(g)) => w.iter().all(|(k, v)| {
                    g.get(k).is_some_and(|gv| match (v, gv) {
                        (Value::Object(vo), Value::Object(go)) => {
                            vo.iter().all(|(k2, v2)| go.get(k2) == Some(v2))
                        }
                        _ => gv == v,
                    })
                }),
                // A string expected in a list: contained (command-line flags).
                (Value::String(_), Value::Array(a)) => a.contains(want),
                _ => &got == want,
            };
            assert!(
                ok,
                "{chart} {key}={value}: {kind}/{name}{pointer} = {got}, want {want}"
            );
        }
    });
}
