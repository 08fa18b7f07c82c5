//! The real kubectl against a standalone server, using the kubeconfig the
//! server wrote, asserting on what kubectl prints.
//!
//! kubectl: the test kit's finder (`$COZYPLANE_KUBECTL`, else gcloud's pinned
//! `/usr/lib/google-cloud-sdk/bin/kubectl.1.33`, what `/usr/bin/kubectl`, a
//! version dispatcher, would pick for our server's 1.33 /version, else
//! `/usr/bin/kubectl`). Missing kubectl fails under CI, skips elsewhere.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

mod support;

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use cozyplane_testkit::{kubectl as find_kubectl, needs, Needs};
use support::{Backend, Harness};
use tokio::io::{AsyncBufReadExt, BufReader};

type Out = support::KubectlOut;

/// kubectl with the harness's admin kubeconfig.
async fn kubectl(bin: &Path, h: &Harness, args: &[&str]) -> Out {
    support::kubectl_as(bin, h, &h.kubeconfig, args).await
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    if let Err(e) = std::fs::write(&p, text) {
        panic!("write {}: {e}", p.display());
    }
    p.display().to_string()
}

const VPC_YAML: &str = "apiVersion: sdn.cozystack.io/v1alpha1
kind: VPC
metadata:
  name: x
  labels:
    team: blue
spec:
  cidrs:
  - 10.50.0.0/16
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_end_to_end() {
    let Some(bin) = needs!().ready_with(find_kubectl()) else {
        return;
    };
    let Some(h) = support::start(Backend::Embedded, "kubectl_end_to_end").await else {
        return;
    };
    let version = kubectl(&bin, &h, &["version", "--client"]).await;
    eprintln!(
        "using {}: {}",
        bin.display(),
        version.stdout.lines().next().unwrap_or("")
    );

    // api-resources: our kinds with short names, from aggregated discovery
    let ar = kubectl(&bin, &h, &["api-resources"]).await;
    assert!(ar.ok, "{}", ar.stderr);
    let line = |name: &str| {
        ar.stdout
            .lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .unwrap_or("")
            .to_string()
    };
    let vpcb = line("vpcbindings");
    assert!(
        vpcb.contains("vpcb")
            && vpcb.contains("sdn.cozystack.io/v1alpha1")
            && vpcb.contains("true")
            && vpcb.contains("VPCBinding"),
        "{}",
        ar.stdout
    );
    assert!(line("fabricips").contains("fip"), "{}", ar.stdout);
    assert!(line("pods").contains("po"), "{}", ar.stdout);
    assert!(line("vpcs").contains("VPC"), "{}", ar.stdout);

    // apply twice: created, then configured, then unchanged
    let file = write(h.dir.path(), "vpc.yaml", VPC_YAML);
    let a1 = kubectl(&bin, &h, &["apply", "-f", &file]).await;
    assert!(a1.ok, "{}", a1.stderr);
    assert_eq!(a1.stdout.trim(), "vpc.sdn.cozystack.io/x created");
    let file2 = write(
        h.dir.path(),
        "vpc2.yaml",
        &format!("{VPC_YAML}  mtu: 1400\n"),
    );
    let a2 = kubectl(&bin, &h, &["apply", "-f", &file2]).await;
    assert!(a2.ok, "{}", a2.stderr);
    assert_eq!(a2.stdout.trim(), "vpc.sdn.cozystack.io/x configured");
    let a3 = kubectl(&bin, &h, &["apply", "-f", &file2]).await;
    assert_eq!(
        a3.stdout.trim(),
        "vpc.sdn.cozystack.io/x unchanged",
        "{}",
        a3.stderr
    );

    // invalid objects are refused with the server's message
    let bad = write(
        h.dir.path(),
        "bad.yaml",
        &VPC_YAML
            .replace("name: x", "name: bad")
            .replace("10.50.0.0/16", "10.50.0.1/16"),
    );
    let b = kubectl(&bin, &h, &["apply", "-f", &bad]).await;
    assert!(!b.ok);
    assert!(
        b.stderr.contains("is invalid") && b.stderr.contains("spec.cidrs"),
        "{}",
        b.stderr
    );

    // get -o wide / -o yaml
    let wide = kubectl(&bin, &h, &["get", "vpcs", "-o", "wide"]).await;
    assert!(wide.ok, "{}", wide.stderr);
    let header = wide.stdout.lines().next().unwrap_or("");
    assert!(
        header.starts_with("NAME") && header.contains("AGE"),
        "{}",
        wide.stdout
    );
    assert!(
        wide.stdout
            .lines()
            .nth(1)
            .is_some_and(|l| l.starts_with("x ")),
        "{}",
        wide.stdout
    );
    let yaml = kubectl(&bin, &h, &["get", "vpc", "x", "-o", "yaml"]).await;
    assert!(
        yaml.stdout.contains("name: x")
            && yaml.stdout.contains("mtu: 1400")
            && yaml.stdout.contains("- 10.50.0.0/16"),
        "{}",
        yaml.stdout
    );

    // patch
    let p = kubectl(
        &bin,
        &h,
        &[
            "patch",
            "vpc",
            "x",
            "--type",
            "merge",
            "-p",
            r#"{"spec":{"mtu":1450}}"#,
        ],
    )
    .await;
    assert_eq!(
        p.stdout.trim(),
        "vpc.sdn.cozystack.io/x patched",
        "{}",
        p.stderr
    );
    let jp = kubectl(&bin, &h, &["get", "vpc", "x", "-o", "jsonpath={.spec.mtu}"]).await;
    assert_eq!(jp.stdout, "1450");
    let label = kubectl(&bin, &h, &["label", "vpc", "x", "env=prod"]).await;
    assert_eq!(
        label.stdout.trim(),
        "vpc.sdn.cozystack.io/x labeled",
        "{}",
        label.stderr
    );
    let sel = kubectl(&bin, &h, &["get", "vpcs", "-l", "env=prod", "-o", "name"]).await;
    assert_eq!(sel.stdout.trim(), "vpc.sdn.cozystack.io/x");

    // get -w: read the first lines, then a change, then stop kubectl
    let mut child = match tokio::process::Command::new(&bin)
        .arg("--kubeconfig")
        .arg(&h.kubeconfig)
        .args(["get", "vpcs", "-w", "--output-watch-events"])
        .env("HOME", h.dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
    {
        Ok(c) => c,
        Err(e) => panic!("spawn kubectl -w: {e}"),
    };
    let Some(stdout) = child.stdout.take() else {
        panic!("no stdout")
    };
    let mut lines = BufReader::new(stdout).lines();
    let mut next_line =
        async || match tokio::time::timeout(Duration::from_secs(20), lines.next_line()).await {
            Ok(Ok(Some(l))) => l,
            other => panic!("kubectl -w: {other:?}"),
        };
    let head = next_line().await;
    assert!(head.starts_with("EVENT") && head.contains("NAME"), "{head}");
    let first = next_line().await;
    assert!(
        first.starts_with("ADDED") && first.contains(" x "),
        "{first}"
    );
    let p2 = kubectl(
        &bin,
        &h,
        &[
            "patch",
            "vpc",
            "x",
            "--type",
            "merge",
            "-p",
            r#"{"spec":{"mtu":1500}}"#,
        ],
    )
    .await;
    assert!(p2.ok);
    let modified = next_line().await;
    assert!(
        modified.starts_with("MODIFIED") && modified.contains(" x "),
        "{modified}"
    );
    let _ = child.kill().await;

    // explain: field descriptions from OpenAPI v3
    let ex = kubectl(&bin, &h, &["explain", "vpc.spec"]).await;
    assert!(ex.ok, "{}", ex.stderr);
    assert!(
        ex.stdout.contains("cidrs") && ex.stdout.contains("canonical CIDR form"),
        "{}",
        ex.stdout
    );
    let ex_pod = kubectl(&bin, &h, &["explain", "pods.spec.nodeName"]).await;
    assert!(ex_pod.stdout.contains("NodeName"), "{}", ex_pod.stdout);

    // delete
    let d = kubectl(&bin, &h, &["delete", "vpc", "x"]).await;
    assert_eq!(
        d.stdout.trim(),
        "vpc.sdn.cozystack.io \"x\" deleted",
        "{}",
        d.stderr
    );
    let gone = kubectl(&bin, &h, &["get", "vpc", "x"]).await;
    assert!(
        !gone.ok && gone.stderr.contains("NotFound"),
        "{}",
        gone.stderr
    );

    // core kinds in standalone mode (through apply: kubectl's typed
    // `create namespace` sends protobuf, which this server does not speak)
    let ns_file = write(
        h.dir.path(),
        "ns.yaml",
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: tenant-a\n",
    );
    let ns = kubectl(&bin, &h, &["apply", "-f", &ns_file]).await;
    assert_eq!(
        ns.stdout.trim(),
        "namespace/tenant-a created",
        "{}",
        ns.stderr
    );
    let nss = kubectl(&bin, &h, &["get", "ns", "-o", "name"]).await;
    assert!(
        nss.stdout.contains("namespace/default") && nss.stdout.contains("namespace/tenant-a"),
        "{}",
        nss.stdout
    );

    // a `kind: List`, validation on: kubectl validates its items on the
    // client against /openapi/v2 in protobuf (the server cannot validate a
    // List), so a bad item is caught by our definitions before any write
    let list = "apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: ConfigMap
  metadata: {name: listed, namespace: tenant-a}
  data: {x: \"1\"}
- apiVersion: v1
  kind: Service
  metadata: {name: listed, namespace: tenant-a}
  spec:
    selector: {app: listed}
    ports: [{port: 80PORT}]
";
    let bad_list = write(
        h.dir.path(),
        "bad-list.yaml",
        &list.replace("PORT", ", portz: 1"),
    );
    let b = kubectl(&bin, &h, &["apply", "-f", &bad_list]).await;
    assert!(
        !b.ok
            && b.stderr.contains("unknown field \"portz\"")
            && b.stderr.contains("io.k8s.api.core.v1.Service"),
        "{}{}",
        b.stdout,
        b.stderr
    );
    let none = kubectl(&bin, &h, &["get", "configmap", "listed", "-n", "tenant-a"]).await;
    assert!(
        !none.ok,
        "nothing of a rejected List is written: {}",
        none.stdout
    );
    let list_file = write(h.dir.path(), "list.yaml", &list.replace("PORT", ""));
    let l = kubectl(&bin, &h, &["apply", "-f", &list_file]).await;
    assert_eq!(
        l.stdout.trim(),
        "configmap/listed created\nservice/listed created",
        "{}",
        l.stderr
    );
    h.server.shutdown().await;
}

/// `kubectl delete pod` of a bound running pod waits like on a real
/// cluster: the server only marks the pod, kubectl keeps waiting while it
/// exists, and returns once "the kubelet" (this test) deletes it with
/// grace 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_delete_pod_waits_for_the_kubelet() {
    let test = "kubectl_delete_pod_waits_for_the_kubelet";
    let Some(bin) = Needs::new(test).ready_with(find_kubectl()) else {
        return;
    };
    let Some(h) = support::start(Backend::Embedded, test).await else {
        return;
    };
    let pods = "/api/v1/namespaces/default/pods";
    let pod = serde_json::json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "w"},
        "spec": {"nodeName": "node1", "containers": [{"name": "c", "image": "x"}]}});
    let c = h.post(pods, &pod).await;
    assert_eq!(c.status, 201, "{}", c.text);
    let uid = c.body["metadata"]["uid"].as_str().unwrap_or("").to_string();
    let mut watch = h
        .stream(&format!(
            "{pods}?watch=true&resourceVersion={}",
            c.body["metadata"]["resourceVersion"].as_str().unwrap_or("")
        ))
        .await;

    let mut child = match tokio::process::Command::new(&bin)
        .arg("--kubeconfig")
        .arg(&h.kubeconfig)
        .args(["delete", "pod", "w", "--timeout=60s"])
        .env("HOME", h.dir.path())
        .env("KUBECACHEDIR", h.dir.path().join("cache"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
    {
        Ok(c) => c,
        Err(e) => panic!("kubectl delete: {e}"),
    };
    // The server marks the pod; kubectl is still waiting for it to go.
    let ev = watch
        .next_change(Duration::from_secs(30))
        .await
        .unwrap_or_default();
    assert_eq!(ev["type"], "MODIFIED", "{ev}");
    assert_eq!(ev["object"]["metadata"]["deletionGracePeriodSeconds"], 30);
    assert_eq!(h.get(&format!("{pods}/w")).await.status, 200);
    assert!(
        matches!(child.try_wait(), Ok(None)),
        "kubectl delete returned while the pod still exists"
    );
    // kubectl get shows the pod as Terminating meanwhile
    let get = kubectl(&bin, &h, &["get", "pod", "w"]).await;
    assert!(get.ok && get.stdout.contains("w"), "{}", get.stderr);

    // The kubelet's final delete: grace 0 with a UID precondition.
    let fin = h
        .call(
            "DELETE",
            &format!("{pods}/w"),
            Some("application/json"),
            serde_json::json!({"gracePeriodSeconds": 0, "preconditions": {"uid": uid}})
                .to_string()
                .into_bytes(),
            None,
        )
        .await;
    assert_eq!(fin.status, 200, "{}", fin.text);
    let out = match tokio::time::timeout(Duration::from_secs(30), child.wait_with_output()).await {
        Ok(Ok(o)) => o,
        Ok(Err(e)) => panic!("kubectl delete: {e}"),
        Err(_) => panic!("kubectl delete did not return after the pod went"),
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("pod \"w\" deleted"),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    h.server.shutdown().await;
}

const CNP_YAML: &str = "apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata:
  name: web
  namespace: default
spec:
  endpointSelector:
    matchLabels:
      app: web
  ingress:
  - fromEndpoints:
    - matchLabels:
        k8s:io.kubernetes.pod.namespace: default
    toPorts:
    - ports:
      - port: \"80\"
        protocol: TCP
  egress:
  - toFQDNs:
    - matchName: example.com
---
apiVersion: cilium.io/v2
kind: CiliumClusterwideNetworkPolicy
metadata:
  name: host-fw
spec:
  nodeSelector: {}
  ingressDeny:
  - fromEntities: [world]
    toPorts:
    - ports:
      - port: \"2379\"
";

/// The Cilium policy kinds Cozystack writes are served (so its charts
/// apply): short names, stored as written (fields outside the subset the
/// agent enforces kept, for it to report), and malformed rules refused with
/// field causes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_applies_cilium_policies() {
    let Some(bin) = needs!().ready_with(find_kubectl()) else {
        return;
    };
    let Some(h) = support::start(Backend::Embedded, "kubectl_applies_cilium_policies").await else {
        return;
    };
    let file = write(h.dir.path(), "cnp.yaml", CNP_YAML);
    let a = kubectl(&bin, &h, &["apply", "-f", &file]).await;
    assert!(a.ok, "{}", a.stderr);
    assert!(
        a.stdout
            .contains("ciliumnetworkpolicy.cilium.io/web created")
            && a.stdout
                .contains("ciliumclusterwidenetworkpolicy.cilium.io/host-fw created"),
        "{}",
        a.stdout
    );
    let got = kubectl(
        &bin,
        &h,
        &["get", "cnp", "web", "-n", "default", "-o", "json"],
    )
    .await;
    assert!(got.ok, "{}", got.stderr);
    let v: serde_json::Value = serde_json::from_str(&got.stdout).unwrap();
    assert_eq!(
        v["spec"]["egress"][0]["toFQDNs"][0]["matchName"], "example.com",
        "{v}"
    );
    assert_eq!(
        v["spec"]["ingress"][0]["toPorts"][0]["ports"][0]["port"],
        "80"
    );
    let ccnp = kubectl(&bin, &h, &["get", "ccnp", "-o", "name"]).await;
    assert_eq!(
        ccnp.stdout.trim(),
        "ciliumclusterwidenetworkpolicy.cilium.io/host-fw",
        "{}",
        ccnp.stderr
    );
    // a rule list that is not a list: 422 naming the field
    let bad = write(
        h.dir.path(),
        "bad.yaml",
        "apiVersion: cilium.io/v2\nkind: CiliumNetworkPolicy\nmetadata:\n  name: bad\n  namespace: default\nspec:\n  ingress: everything\n",
    );
    let b = kubectl(&bin, &h, &["apply", "-f", &bad]).await;
    assert!(!b.ok, "{}", b.stdout);
    assert!(
        b.stderr.contains("is invalid") && b.stderr.contains("spec.ingress"),
        "{}",
        b.stderr
    );
    let none = kubectl(&bin, &h, &["get", "cnp", "bad", "-n", "default"]).await;
    assert!(
        !none.ok && none.stderr.contains("NotFound"),
        "{}",
        none.stderr
    );
}
