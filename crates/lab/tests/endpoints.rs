//! The lab's EndpointSlice controller as `lab up` runs it, without the rest
//! of the lab: a real `cozyplane apiserver --standalone` process and a real
//! `cozyplane lab endpoints` process on its own least-privilege identity
//! (the lab's roles, created by `identity::create_roles` as `up` does), with
//! at most 2 endpoints per slice so that packing shows. No root, no netns:
//! pods are created bound to Node objects and their status is written as a
//! kubelet would.
//!
//! Checked: slices per Service with kube's labels, owner reference and
//! generateName; endpoints with conditions, nodeName, zone and targetRef;
//! named targetPorts resolved per pod (a pod without the name in a slice of
//! its own); pods without IP, unscheduled or finished left out; a Service
//! selecting nothing gets one empty slice, one without selector none; a
//! readiness change rewrites only the slice holding the pod; a graceful
//! delete marks the endpoint terminating (serving, not ready), the final
//! delete removes it; a node's new zone label reaches its endpoints; a lost
//! selector or a deleted Service deletes the slices; a failed write (a
//! ResourceQuota allowing no slices) is a Warning Event on the Service,
//! recorded once while the sync is retried, and the slice appears once the
//! quota allows it; a restarted controller writes nothing for Services in
//! sync and deletes the slices of a Service deleted while it was down.
//!
//! Run: `cargo test -p cozyplane-lab --test endpoints` (the binary comes
//! from `$COZYPLANE_BIN`, else the test kit builds it).
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use cozyplane_lab::cluster::identity::{self, Ca, Identity};
use cozyplane_testkit::poll_async;
use k8s_openapi::api::core::v1::{Event, Node, Pod, ResourceQuota, Service};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointSlice};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::Api;
use serde_json::{json, Value};

const LIMIT: Duration = Duration::from_secs(30);
const NS: &str = "default";

/// A child process killed (and reaped) when the test ends, however it ends.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn(cmd: &mut Command, log: &Path) -> Proc {
    let out = File::create(log).expect("log");
    let err = out.try_clone().expect("dup log");
    let child = cmd
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
    Proc(child)
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

async fn client(path: &Path) -> kube::Client {
    let kc = kube::config::Kubeconfig::read_from(path).expect("read kubeconfig");
    let cfg = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
        .await
        .expect("kubeconfig");
    kube::Client::try_from(cfg).expect("client")
}

async fn readyz(port: u16) -> Result<(), String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .map_err(|e| e.to_string())?;
    s.write_all(b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .map_err(|e| e.to_string())?;
    let mut out = String::new();
    s.read_to_string(&mut out)
        .await
        .map_err(|e| e.to_string())?;
    if out.starts_with("HTTP/1.1 200") {
        Ok(())
    } else {
        Err(out)
    }
}

/// The API server and the controller, and the admin's client.
struct Cluster {
    bin: PathBuf,
    dir: tempfile::TempDir,
    admin: kube::Client,
    _apiserver: Proc,
    controller: Option<Proc>,
    ctl_log: PathBuf,
    readyz: u16,
}

impl Cluster {
    async fn start() -> Cluster {
        let bin = cozyplane_testkit::cozyplane_bin();
        let dir = tempfile::tempdir().expect("tempdir");
        let kc = dir.path().join("admin.kubeconfig");
        let apiserver = spawn(
            Command::new(&bin)
                .args([
                    "apiserver",
                    "--standalone",
                    "--bind-address",
                    "127.0.0.1",
                    "--port",
                    "0",
                ])
                .arg("--data-dir")
                .arg(dir.path().join("data"))
                .arg("--cert-dir")
                .arg(dir.path().join("certs"))
                .arg("--write-kubeconfig")
                .arg(&kc),
            &dir.path().join("apiserver.log"),
        );
        // The kubeconfig appears (atomically) once the server serves.
        let kc_ref = &kc;
        poll_async("the API server's kubeconfig", LIMIT, || async move {
            kube::config::Kubeconfig::read_from(kc_ref)
                .map(|_| ())
                .map_err(|e| e.to_string())
        })
        .await
        .unwrap_or_else(|e| panic!("{e}"));
        let admin = client(&kc).await;
        identity::create_roles(&admin)
            .await
            .expect("the lab's roles");
        let url = kube::config::Kubeconfig::read_from(&kc)
            .expect("kubeconfig")
            .clusters[0]
            .cluster
            .as_ref()
            .and_then(|c| c.server.clone())
            .expect("server");
        let ca = Ca::load(&dir.path().join("certs")).expect("the API server's CA");
        let ekc = dir.path().join("endpoints.kubeconfig");
        ca.write_kubeconfig(&ekc, &url, &Identity::endpoints())
            .expect("kubeconfig");
        let mut c = Cluster {
            bin,
            ctl_log: dir.path().join("endpoints.log"),
            dir,
            admin,
            _apiserver: apiserver,
            controller: None,
            readyz: free_port(),
        };
        c.start_controller().await;
        c
    }

    async fn start_controller(&mut self) {
        let log = self.ctl_log.clone();
        let port = self.readyz.to_string();
        let mut cmd = Command::new(&self.bin);
        cmd.args(["lab", "endpoints", "--kubeconfig"])
            .arg(self.dir.path().join("endpoints.kubeconfig"))
            .args(["--readyz-bind", &format!("127.0.0.1:{port}")])
            .args(["--max-endpoints-per-slice", "2"]);
        // Appending, so the log of an earlier run stays readable.
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .expect("log");
        let err = out.try_clone().expect("dup");
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .expect("spawn");
        self.controller = Some(Proc(child));
        let p = self.readyz;
        poll_async("the controller's /readyz", LIMIT, || readyz(p))
            .await
            .unwrap_or_else(|e| panic!("{e}\n{}", self.log()));
    }

    fn stop_controller(&mut self) {
        self.controller = None;
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.ctl_log).unwrap_or_default()
    }
}

fn obj<K: serde::de::DeserializeOwned>(v: Value) -> K {
    serde_json::from_value(v).expect("object")
}

/// A pod bound to `node` with container port `http` = `http` (none if 0).
fn pod(name: &str, app: &str, node: Option<&str>, http: i32) -> Pod {
    let ports = if http == 0 {
        json!([])
    } else {
        json!([{"name": "http", "containerPort": http}])
    };
    obj(
        json!({"metadata": {"name": name, "namespace": NS, "labels": {"app": app}},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "probe", "ports": ports}]}}),
    )
}

/// Writes the pod's status as a kubelet does.
async fn set_status(c: &kube::Client, name: &str, phase: &str, ip: Option<&str>, ready: bool) {
    let api: Api<Pod> = Api::namespaced(c.clone(), NS);
    let ready = if ready { "True" } else { "False" };
    let mut status = json!({"phase": phase,
        "conditions": [{"type": "Ready", "status": ready}, {"type": "PodScheduled", "status": "True"}]});
    if let Some(ip) = ip {
        status["podIP"] = json!(ip);
        status["podIPs"] = json!([{"ip": ip}]);
    }
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": status})),
    )
    .await
    .unwrap_or_else(|e| panic!("status of {name}: {e}"));
}

fn service(name: &str, selector: Option<Value>, ports: Value) -> Service {
    obj(
        json!({"metadata": {"name": name, "namespace": NS, "labels": {"team": "lab"}},
        "spec": {"selector": selector, "ports": ports,
                 "ipFamilyPolicy": "SingleStack", "ipFamilies": ["IPv4"]}}),
    )
}

async fn slices(c: &kube::Client, ns: &str, svc: &str) -> Vec<EndpointSlice> {
    let api: Api<EndpointSlice> = Api::namespaced(c.clone(), ns);
    let lp = ListParams::default().labels(&format!("kubernetes.io/service-name={svc}"));
    let mut v = api.list(&lp).await.expect("list slices").items;
    v.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    v
}

/// A slice's endpoints (`null` and `[]` alike).
fn eps(s: &EndpointSlice) -> &[Endpoint] {
    s.endpoints.as_deref().unwrap_or_default()
}

/// `(pod, ready, serving, terminating)` of an endpoint.
fn conds(e: &Endpoint) -> (String, bool, bool, bool) {
    let c = e.conditions.clone().unwrap_or_default();
    (
        e.target_ref
            .as_ref()
            .and_then(|r| r.name.clone())
            .unwrap_or_default(),
        c.ready.unwrap_or(false),
        c.serving.unwrap_or(false),
        c.terminating.unwrap_or(false),
    )
}

/// Per port list: how many slices, and their endpoints (sorted). Which
/// endpoints share a slice depends on the order the controller saw them in.
type Shape = BTreeMap<Vec<(String, i32)>, (usize, Vec<(String, bool, bool, bool)>)>;

fn shape(ss: &[EndpointSlice]) -> Shape {
    let mut v = Shape::new();
    for s in ss {
        let ports = s
            .ports
            .iter()
            .flatten()
            .map(|p| (p.name.clone().unwrap_or_default(), p.port.unwrap_or(0)))
            .collect();
        let entry = v.entry(ports).or_default();
        entry.0 += 1;
        entry.1.extend(eps(s).iter().map(conds));
        entry.1.sort();
    }
    v
}

/// Waits until the slices of `svc` have `want`'s shape; returns them.
async fn until_shape(
    c: &kube::Client,
    svc: &str,
    want: &Shape,
    log: impl Fn() -> String,
) -> Vec<EndpointSlice> {
    poll_async(&format!("the slices of {svc}"), LIMIT, || async move {
        let ss = slices(c, NS, svc).await;
        if shape(&ss) == *want {
            Ok(ss)
        } else {
            Err(format!("{:?}", shape(&ss)))
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\ncontroller log:\n{}", log()))
}

fn rvs(ss: &[EndpointSlice]) -> BTreeMap<String, String> {
    ss.iter()
        .map(|s| {
            (
                s.metadata.name.clone().unwrap_or_default(),
                s.metadata.resource_version.clone().unwrap_or_default(),
            )
        })
        .collect()
}

fn ep(pod: &str, ready: bool, serving: bool, terminating: bool) -> (String, bool, bool, bool) {
    (pod.to_string(), ready, serving, terminating)
}

fn ports(list: &[(&str, i32)]) -> Vec<(String, i32)> {
    list.iter().map(|(n, p)| (n.to_string(), *p)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slices_follow_services_pods_and_nodes() {
    let mut k = Cluster::start().await;
    let c = k.admin.clone();
    let cl = &c; // for the polls' `async move` blocks
    let pp = PostParams::default();
    let nodes: Api<Node> = Api::all(c.clone());
    nodes
        .create(&pp, &obj(json!({"metadata": {"name": "n1", "labels": {"topology.kubernetes.io/zone": "zone-a"}}})))
        .await
        .expect("node n1");
    nodes
        .create(&pp, &obj(json!({"metadata": {"name": "n2"}})))
        .await
        .expect("node n2");

    let pods: Api<Pod> = Api::namespaced(c.clone(), NS);
    for p in [
        pod("web-a", "web", Some("n1"), 8080),
        pod("web-b", "web", Some("n2"), 8080),
        pod("web-f", "web", Some("n1"), 8080),
        pod("web-c", "web", Some("n1"), 0), // no port named http
        pod("web-d", "web", None, 8080),    // unscheduled
        pod("web-e", "web", Some("n2"), 8080),
        pod("web-g", "web", Some("n2"), 8080), // no IP yet
    ] {
        pods.create(&pp, &p).await.expect("pod");
    }
    set_status(&c, "web-a", "Running", Some("10.244.1.10"), true).await;
    set_status(&c, "web-b", "Running", Some("10.244.2.10"), false).await;
    set_status(&c, "web-f", "Running", Some("10.244.1.12"), true).await;
    set_status(&c, "web-c", "Running", Some("10.244.1.11"), true).await;
    set_status(&c, "web-e", "Succeeded", Some("10.244.2.11"), false).await;
    set_status(&c, "web-g", "Pending", None, false).await;

    let svcs: Api<Service> = Api::namespaced(c.clone(), NS);
    let web = svcs
        .create(
            &pp,
            &service(
                "web",
                Some(json!({"app": "web"})),
                json!([{"name": "http", "port": 80, "targetPort": "http"},
                       {"name": "metrics", "port": 9090, "targetPort": 9090}]),
            ),
        )
        .await
        .expect("service web");
    svcs.create(
        &pp,
        &service("empty", Some(json!({"app": "none"})), json!([{"port": 80}])),
    )
    .await
    .expect("service empty");
    svcs.create(&pp, &service("manual", None, json!([{"port": 80}])))
        .await
        .expect("service manual");

    // a, b, f resolve http to 8080 (two slices of at most 2); c only the metrics port.
    let full = ports(&[("http", 8080), ("metrics", 9090)]);
    let log = || k.log();
    let metrics = ports(&[("metrics", 9090)]);
    let c_only = (1, vec![ep("web-c", true, true, false)]);
    let mut want: Shape = BTreeMap::from([
        (metrics.clone(), c_only.clone()),
        (
            full.clone(),
            (
                2,
                vec![
                    ep("web-a", true, true, false),
                    ep("web-b", false, false, false),
                    ep("web-f", true, true, false),
                ],
            ),
        ),
    ]);
    let ss = until_shape(&c, "web", &want, log).await;
    assert!(ss.iter().all(|s| eps(s).len() <= 2), "at most 2 per slice");
    for s in &ss {
        let m = &s.metadata;
        assert_eq!(s.address_type, "IPv4");
        assert_eq!(m.generate_name.as_deref(), Some("web-"));
        assert!(
            m.name.as_deref().is_some_and(|n| n.starts_with("web-")),
            "{m:?}"
        );
        let labels = m.labels.clone().unwrap_or_default();
        assert_eq!(
            labels.get("kubernetes.io/service-name").map(String::as_str),
            Some("web")
        );
        assert_eq!(
            labels
                .get("endpointslice.kubernetes.io/managed-by")
                .map(String::as_str),
            Some("endpointslice-controller.k8s.io")
        );
        assert_eq!(
            labels.get("team").map(String::as_str),
            Some("lab"),
            "the Service's labels are copied"
        );
        let owners = m.owner_references.clone().unwrap_or_default();
        assert_eq!(owners.len(), 1, "{owners:?}");
        assert_eq!(
            (
                owners[0].kind.as_str(),
                owners[0].name.as_str(),
                owners[0].controller
            ),
            ("Service", "web", Some(true))
        );
        assert_eq!(Some(&owners[0].uid), web.metadata.uid.as_ref());
        for e in eps(s) {
            let pod = e.target_ref.as_ref().expect("targetRef");
            let live = pods
                .get(pod.name.as_deref().expect("name"))
                .await
                .expect("pod");
            assert_eq!(pod.uid, live.metadata.uid);
            assert_eq!(pod.kind.as_deref(), Some("Pod"));
            let node = live.spec.as_ref().and_then(|s| s.node_name.clone());
            assert_eq!(e.node_name, node);
            let zone = (node.as_deref() == Some("n1")).then(|| "zone-a".to_string());
            assert_eq!(e.zone, zone, "{e:?}");
            let ip = live
                .status
                .as_ref()
                .and_then(|s| s.pod_ip.clone())
                .expect("ip");
            assert_eq!(e.addresses, [ip]);
        }
    }

    // Selecting nothing: one empty slice. No selector: none.
    let empty = poll_async("the placeholder of empty", LIMIT, || async move {
        let ss = slices(cl, NS, "empty").await;
        match ss.as_slice() {
            [s] if eps(s).is_empty() => Ok(s.clone()),
            _ => Err(format!("{:?}", shape(&ss))),
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(empty.ports.unwrap_or_default().is_empty());

    // web-b turns Ready: only its slice is written.
    let before = rvs(&ss);
    set_status(&c, "web-b", "Running", Some("10.244.2.10"), true).await;
    want.insert(
        full.clone(),
        (
            2,
            vec![
                ep("web-a", true, true, false),
                ep("web-b", true, true, false),
                ep("web-f", true, true, false),
            ],
        ),
    );
    let ss = until_shape(&c, "web", &want, log).await;
    let after = rvs(&ss);
    let holder = ss
        .iter()
        .find(|s| eps(s).iter().any(|e| conds(e).0 == "web-b"))
        .and_then(|s| s.metadata.name.clone())
        .expect("b's slice");
    for (name, rv) in &before {
        if *name == holder {
            assert_ne!(after.get(name), Some(rv), "{name} was not rewritten");
        } else {
            assert_eq!(
                after.get(name),
                Some(rv),
                "{name} was rewritten though nothing in it changed"
            );
        }
    }
    assert!(
        slices(&c, NS, "manual").await.is_empty(),
        "no selector, no slices"
    );

    // A graceful delete (the pod is bound, no kubelet finishes it): terminating, serving, not ready.
    pods.delete("web-a", &DeleteParams::default())
        .await
        .expect("delete web-a");
    want.insert(
        full.clone(),
        (
            2,
            vec![
                ep("web-a", false, true, true),
                ep("web-b", true, true, false),
                ep("web-f", true, true, false),
            ],
        ),
    );
    until_shape(&c, "web", &want, log).await;
    // The kubelet's final delete: gone from its slice.
    pods.delete(
        "web-a",
        &DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        },
    )
    .await
    .expect("final delete");
    // Its slice keeps the other endpoint (or goes, if a was alone in it).
    let (fr, mr, cr) = (&full, &metrics, &c_only);
    let ss = poll_async("web-a gone from web's slices", LIMIT, || async move {
        let ss = slices(cl, NS, "web").await;
        let sh = shape(&ss);
        let rest = sh.get(fr).map(|(_, e)| e.clone()).unwrap_or_default();
        if rest
            == [
                ep("web-b", true, true, false),
                ep("web-f", true, true, false),
            ]
            && sh.get(mr) == Some(cr)
        {
            Ok(ss)
        } else {
            Err(format!("{sh:?}"))
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", k.log()));
    let web_slices = ss.len();

    // n2 gets a zone: web-b's endpoint carries it.
    nodes
        .patch(
            "n2",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"labels": {"topology.kubernetes.io/zone": "zone-b"}}}),
            ),
        )
        .await
        .expect("label n2");
    poll_async("web-b's zone", LIMIT, || async move {
        let ss = slices(cl, NS, "web").await;
        let zone = ss
            .iter()
            .flat_map(|s| eps(s).iter())
            .find(|e| conds(e).0 == "web-b")
            .and_then(|e| e.zone.clone());
        if zone.as_deref() == Some("zone-b") {
            Ok(())
        } else {
            Err(format!("{zone:?}"))
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));

    // A write that fails (a quota allowing no slices) is a Warning Event on the
    // Service, recorded once while the controller retries; the slice comes once allowed.
    let quota_api: Api<ResourceQuota> = Api::namespaced(c.clone(), NS);
    quota_api
        .create(
            &pp,
            &obj(json!({"metadata": {"name": "no-slices", "namespace": NS},
                "spec": {"hard": {"count/endpointslices.discovery.k8s.io": (web_slices + 1).to_string()}}})),
        )
        .await
        .expect("quota");
    // Every slice there is (web's and empty's placeholder) and no more: a new Service's slice is refused.
    let blocked = svcs
        .create(
            &pp,
            &service(
                "blocked",
                Some(json!({"app": "web"})),
                json!([{"name": "metrics", "port": 9090}]),
            ),
        )
        .await
        .expect("service blocked");
    let log_ref = &k.ctl_log;
    poll_async("two failed syncs of blocked", LIMIT, || async move {
        let log = std::fs::read_to_string(log_ref).unwrap_or_default();
        let n = log
            .lines()
            .filter(|l| l.contains("default/blocked: creating a slice"))
            .count();
        if n >= 2 {
            Ok(())
        } else {
            Err(format!("{n} failures logged"))
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let events: Api<Event> = Api::namespaced(c.clone(), NS);
    let warnings = |list: Vec<Event>| -> Vec<Event> {
        list.into_iter()
            .filter(|e| e.involved_object.name.as_deref() == Some("blocked"))
            .collect()
    };
    let evs = warnings(
        events
            .list(&ListParams::default())
            .await
            .expect("events")
            .items,
    );
    assert_eq!(evs.len(), 1, "one Event for repeated failures: {evs:?}");
    let ev = &evs[0];
    assert_eq!(ev.type_.as_deref(), Some("Warning"));
    assert_eq!(ev.reason.as_deref(), Some("FailedToUpdateEndpointSlices"));
    assert_eq!(ev.involved_object.kind.as_deref(), Some("Service"));
    assert_eq!(ev.involved_object.uid, blocked.metadata.uid);
    assert!(
        ev.message
            .as_deref()
            .is_some_and(|m| m.contains("default/blocked")),
        "{ev:?}"
    );
    quota_api
        .patch(
            "no-slices",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"spec": {"hard": {"count/endpointslices.discovery.k8s.io": "10"}}}),
            ),
        )
        .await
        .expect("raise quota");
    poll_async(
        "blocked's slices after the quota allows them",
        LIMIT,
        || async move {
            // web-b, web-c, web-f on the metrics port: two slices of at most 2.
            let n = slices(cl, NS, "blocked").await.len();
            if n == 2 {
                Ok(())
            } else {
                Err(format!("{n} slices"))
            }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", k.log()));

    // A restart writes nothing for Services in sync, and deletes the slices of
    // one deleted while it was down.
    let web_before = rvs(&slices(&c, NS, "web").await);
    let empty_before = rvs(&slices(&c, NS, "empty").await);
    k.stop_controller();
    svcs.delete("blocked", &DeleteParams::default())
        .await
        .expect("delete blocked");
    k.start_controller().await; // ready = its first pass is done
    assert_eq!(
        rvs(&slices(&c, NS, "web").await),
        web_before,
        "web rewritten after a restart"
    );
    assert_eq!(
        rvs(&slices(&c, NS, "empty").await),
        empty_before,
        "empty rewritten after a restart"
    );
    assert!(
        slices(&c, NS, "blocked").await.is_empty(),
        "the deleted Service's slice is gone"
    );

    // The selector removed: every slice of web goes. A deleted Service: its placeholder goes.
    let mut w = svcs.get("web").await.expect("web");
    w.spec.as_mut().expect("spec").selector = None;
    svcs.replace("web", &pp, &w)
        .await
        .expect("drop the selector");
    svcs.delete("empty", &DeleteParams::default())
        .await
        .expect("delete empty");
    poll_async("the slices of web and empty to go", LIMIT, || async move {
        let (a, b) = (
            slices(cl, NS, "web").await.len(),
            slices(cl, NS, "empty").await.len(),
        );
        if a + b == 0 {
            Ok(())
        } else {
            Err(format!("web {a}, empty {b}"))
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", k.log()));
}
