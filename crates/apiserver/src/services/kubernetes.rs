//! The `kubernetes` Service in namespace `default` and its EndpointSlice,
//! kept by the server as kube-apiserver keeps them: the Service has the
//! first address of the primary service range and port 443 (`https`, TCP)
//! to the server's secure port, no selector; the EndpointSlice (`kubernetes`,
//! label `kubernetes.io/service-name: kubernetes`) points at the address
//! the server listens on. Written at start and re-asserted every
//! [`RECONCILE_INTERVAL`] (kube's endpoint reconciler interval), so a
//! deleted or edited one comes back. A server bound to an unspecified
//! address (`0.0.0.0`) has no address to advertise: it keeps the Service
//! and writes no EndpointSlice (with a warning).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use super::alloc::IpRange;
use super::ServiceCidrs;
use crate::registry::{Registry, WriteOptions};
use crate::status::ApiError;

/// How often the Service and EndpointSlice are re-asserted.
pub const RECONCILE_INTERVAL: Duration = Duration::from_secs(10);
const NAMESPACE: &str = "default";
const NAME: &str = "kubernetes";

/// The Service's cluster IP: the first address of the primary range.
pub fn service_ip(cidrs: &ServiceCidrs) -> Option<IpAddr> {
    cidrs.cidrs().first().and_then(|c| IpRange::new(*c).nth(0))
}

fn want_ports(port: u16) -> Value {
    json!([{"name": "https", "port": 443, "protocol": "TCP", "targetPort": port}])
}

/// Create or correct the Service and its EndpointSlice once.
pub async fn reconcile(
    registry: &Registry,
    cidrs: &ServiceCidrs,
    serving: SocketAddr,
) -> Result<(), ApiError> {
    reconcile_service(registry, cidrs, serving.port()).await?;
    if serving.ip().is_unspecified() {
        return Ok(());
    }
    reconcile_slice(registry, serving).await
}

async fn reconcile_service(
    registry: &Registry,
    cidrs: &ServiceCidrs,
    port: u16,
) -> Result<(), ApiError> {
    let Some(kind) = registry.find("", "v1", "services") else {
        return Ok(());
    };
    let ports = want_ports(port);
    match registry.get(&kind, Some(NAMESPACE), NAME).await {
        Ok(mut have) => {
            if have.pointer("/spec/ports") == Some(&ports)
                && have.pointer("/spec/type").and_then(Value::as_str) == Some("ClusterIP")
            {
                return Ok(());
            }
            have["spec"]["ports"] = ports;
            have["spec"]["type"] = json!("ClusterIP");
            registry
                .update(
                    &kind,
                    Some(NAMESPACE),
                    NAME,
                    have,
                    false,
                    &WriteOptions::default(),
                )
                .await
                .map(|_| ())
        }
        Err(e) if e.code == 404 => {
            let ip = service_ip(cidrs)
                .map(|ip| ip.to_string())
                .unwrap_or_default();
            let svc = json!({
                "apiVersion": "v1", "kind": "Service",
                "metadata": {"name": NAME, "namespace": NAMESPACE,
                             "labels": {"component": "apiserver", "provider": "kubernetes"}},
                "spec": {"type": "ClusterIP", "clusterIP": ip, "ports": ports,
                         "sessionAffinity": "None", "ipFamilyPolicy": "SingleStack"},
            });
            match registry
                .create(&kind, Some(NAMESPACE), svc, &WriteOptions::default())
                .await
            {
                Ok(_) => Ok(()),
                Err(e) if e.reason == "AlreadyExists" => Ok(()),
                Err(e) => Err(e),
            }
        }
        Err(e) => Err(e),
    }
}

async fn reconcile_slice(registry: &Registry, serving: SocketAddr) -> Result<(), ApiError> {
    let Some(kind) = registry.find("discovery.k8s.io", "v1", "endpointslices") else {
        return Ok(());
    };
    let family = match serving.ip() {
        IpAddr::V4(_) => "IPv4",
        IpAddr::V6(_) => "IPv6",
    };
    let endpoints =
        json!([{"addresses": [serving.ip().to_string()], "conditions": {"ready": true}}]);
    let ports = json!([{"name": "https", "port": serving.port(), "protocol": "TCP"}]);
    let label = json!({"kubernetes.io/service-name": NAME});
    match registry.get(&kind, Some(NAMESPACE), NAME).await {
        Ok(mut have) => {
            if have.get("addressType").and_then(Value::as_str) == Some(family)
                && have.get("endpoints") == Some(&endpoints)
                && have.get("ports") == Some(&ports)
                && have.pointer("/metadata/labels/kubernetes.io~1service-name")
                    == Some(&json!(NAME))
            {
                return Ok(());
            }
            have["addressType"] = json!(family);
            have["endpoints"] = endpoints;
            have["ports"] = ports;
            if let Some(m) = crate::meta::meta_mut(&mut have) {
                let labels = m.entry("labels").or_insert_with(|| json!({}));
                if let Some(l) = labels.as_object_mut() {
                    l.insert("kubernetes.io/service-name".into(), json!(NAME));
                }
            }
            registry
                .update(
                    &kind,
                    Some(NAMESPACE),
                    NAME,
                    have,
                    false,
                    &WriteOptions::default(),
                )
                .await
                .map(|_| ())
        }
        Err(e) if e.code == 404 => {
            let slice = json!({
                "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                "metadata": {"name": NAME, "namespace": NAMESPACE, "labels": label},
                "addressType": family, "endpoints": endpoints, "ports": ports,
            });
            match registry
                .create(&kind, Some(NAMESPACE), slice, &WriteOptions::default())
                .await
            {
                Ok(_) => Ok(()),
                Err(e) if e.reason == "AlreadyExists" => Ok(()),
                Err(e) => Err(e),
            }
        }
        Err(e) => Err(e),
    }
}

/// Run [`reconcile`] now and then every [`RECONCILE_INTERVAL`].
pub fn spawn(
    registry: Arc<Registry>,
    cidrs: ServiceCidrs,
    serving: SocketAddr,
) -> tokio::task::JoinHandle<()> {
    if serving.ip().is_unspecified() {
        tracing::warn!(%serving, "listening on an unspecified address: the kubernetes Service gets no EndpointSlice (bind a specific address)");
    }
    tokio::spawn(async move {
        let mut last_error = None;
        loop {
            match reconcile(&registry, &cidrs, serving).await {
                Ok(()) => last_error = None,
                Err(e) => {
                    if last_error.as_ref() != Some(&e.message) {
                        tracing::warn!(error = %e.message, "could not keep the kubernetes Service and its EndpointSlice");
                    }
                    last_error = Some(e.message);
                }
            }
            tokio::time::sleep(RECONCILE_INTERVAL).await;
        }
    })
}
