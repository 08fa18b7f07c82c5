//! A minimal CRI client: the calls a kubelet makes to run and remove a pod sandbox,
//! which are the calls that make containerd run CNI ADD and DEL.
//!
//! It speaks CRI `runtime.v1` (containerd 1.6 serves both v1 and v1alpha2) through
//! the tonic client that the `k8s-cri` crate generates, over containerd's unix
//! socket. Every call has a deadline, so a wedged runtime fails a test instead of
//! hanging it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use k8s_cri::v1::{
    LinuxPodSandboxConfig, ListPodSandboxRequest, PodSandbox, PodSandboxConfig, PodSandboxMetadata,
    PodSandboxStatus, PodSandboxStatusRequest, RemovePodSandboxRequest, RunPodSandboxRequest,
    StatusRequest, StopPodSandboxRequest, VersionRequest, VersionResponse,
};
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::error::{CriError, Result};

/// The CRI API version a kubelet announces in `Version`.
const KUBELET_API_VERSION: &str = "v1";

/// Deadline of every call. `RunPodSandbox` includes the whole CNI ADD chain and the
/// sandbox start (about 1 s on this machine), so this is generous.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// Identity of a pod sandbox, as a kubelet would send it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodRef {
    /// Pod name (`K8S_POD_NAME` in the plugin's `CNI_ARGS`).
    pub name: String,
    /// Pod namespace (`K8S_POD_NAMESPACE`).
    pub namespace: String,
    /// Pod UID (`K8S_POD_UID`).
    pub uid: String,
}

impl PodRef {
    /// The sandbox config a kubelet would send for this pod (no ports, no DNS
    /// overrides, host cgroup parent chosen by containerd). `log_dir` must exist.
    pub fn sandbox_config(&self, log_dir: &Path) -> PodSandboxConfig {
        PodSandboxConfig {
            metadata: Some(PodSandboxMetadata {
                name: self.name.clone(),
                uid: self.uid.clone(),
                namespace: self.namespace.clone(),
                attempt: 0,
            }),
            hostname: self.name.clone(),
            log_directory: log_dir.to_string_lossy().into_owned(),
            labels: HashMap::from([("app".to_string(), self.name.clone())]),
            linux: Some(LinuxPodSandboxConfig::default()),
            ..PodSandboxConfig::default()
        }
    }
}

/// A connected CRI runtime-service client.
#[derive(Clone, Debug)]
pub struct CriClient {
    inner: RuntimeServiceClient<Channel>,
}

impl CriClient {
    /// Connects to the CRI socket at `socket` (fails if nothing accepts there);
    /// tonic reconnects through the same connector if the connection drops.
    pub async fn connect(socket: &Path) -> Result<CriClient> {
        let path: PathBuf = socket.to_path_buf();
        // The URI is required by tonic but unused: the connector always dials the socket.
        let channel =
            Endpoint::try_from("http://[::1]:0")?
                .timeout(CALL_TIMEOUT)
                .connect_timeout(Duration::from_secs(5))
                .connect_with_connector(tower::service_fn(move |_: Uri| {
                    let path = path.clone();
                    async move {
                        Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?))
                    }
                }))
                .await?;
        Ok(CriClient {
            inner: RuntimeServiceClient::new(channel),
        })
    }

    /// `Version`: the runtime's name and version.
    pub async fn version(&mut self) -> Result<VersionResponse> {
        let req = VersionRequest {
            version: KUBELET_API_VERSION.to_string(),
        };
        let resp = self.inner.version(req).await.map_err(rpc("Version"))?;
        Ok(resp.into_inner())
    }

    /// `Status`: the runtime's conditions as `(type, status, message)`, e.g.
    /// `("NetworkReady", false, "cni config load failed: …")`.
    pub async fn status(&mut self) -> Result<Vec<(String, bool, String)>> {
        let resp = self
            .inner
            .status(StatusRequest { verbose: false })
            .await
            .map_err(rpc("Status"))?
            .into_inner();
        let status = resp.status.ok_or(CriError::Missing {
            call: "Status",
            field: "status",
        })?;
        Ok(status
            .conditions
            .into_iter()
            .map(|c| (c.r#type, c.status, c.message))
            .collect())
    }

    /// True when the runtime reports both `RuntimeReady` and `NetworkReady` (the
    /// latter needs a loadable CNI config).
    pub async fn ready(&mut self) -> Result<bool> {
        let conditions = self.status().await?;
        let is = |t: &str| conditions.iter().any(|(ty, ok, _)| ty == t && *ok);
        Ok(is("RuntimeReady") && is("NetworkReady"))
    }

    /// `RunPodSandbox` with the default runtime handler; returns the sandbox id.
    /// containerd runs CNI ADD inside this call and fails it if ADD fails.
    pub async fn run_pod_sandbox(&mut self, config: PodSandboxConfig) -> Result<String> {
        let req = RunPodSandboxRequest {
            config: Some(config),
            runtime_handler: String::new(),
        };
        let resp = self
            .inner
            .run_pod_sandbox(req)
            .await
            .map_err(rpc("RunPodSandbox"))?;
        Ok(resp.into_inner().pod_sandbox_id)
    }

    /// `PodSandboxStatus`.
    pub async fn pod_sandbox_status(&mut self, id: &str) -> Result<PodSandboxStatus> {
        let req = PodSandboxStatusRequest {
            pod_sandbox_id: id.to_string(),
            verbose: false,
        };
        let resp = self
            .inner
            .pod_sandbox_status(req)
            .await
            .map_err(rpc("PodSandboxStatus"))?;
        resp.into_inner().status.ok_or(CriError::Missing {
            call: "PodSandboxStatus",
            field: "status",
        })
    }

    /// The pod's primary IP from `PodSandboxStatus` (the first IP of the CNI result).
    pub async fn pod_ip(&mut self, id: &str) -> Result<String> {
        let status = self.pod_sandbox_status(id).await?;
        match status.network {
            Some(net) if !net.ip.is_empty() => Ok(net.ip),
            _ => Err(CriError::Missing {
                call: "PodSandboxStatus",
                field: "network.ip",
            }),
        }
    }

    /// `StopPodSandbox`: containerd runs CNI DEL (with `prevResult`) and stops the
    /// sandbox.
    pub async fn stop_pod_sandbox(&mut self, id: &str) -> Result<()> {
        let req = StopPodSandboxRequest {
            pod_sandbox_id: id.to_string(),
        };
        self.inner
            .stop_pod_sandbox(req)
            .await
            .map_err(rpc("StopPodSandbox"))?;
        Ok(())
    }

    /// `RemovePodSandbox`: containerd runs CNI DEL again (no netns, no
    /// `prevResult`), removes the netns and forgets the sandbox.
    pub async fn remove_pod_sandbox(&mut self, id: &str) -> Result<()> {
        let req = RemovePodSandboxRequest {
            pod_sandbox_id: id.to_string(),
        };
        self.inner
            .remove_pod_sandbox(req)
            .await
            .map_err(rpc("RemovePodSandbox"))?;
        Ok(())
    }

    /// `ListPodSandbox` without a filter.
    pub async fn list_pod_sandbox(&mut self) -> Result<Vec<PodSandbox>> {
        let resp = self
            .inner
            .list_pod_sandbox(ListPodSandboxRequest { filter: None })
            .await
            .map_err(rpc("ListPodSandbox"))?;
        Ok(resp.into_inner().items)
    }

    /// Stops and removes every sandbox the runtime knows: what a test's cleanup
    /// does before it stops containerd, so no shim or netns outlives it.
    /// Returns how many were removed.
    pub async fn remove_all_sandboxes(&mut self) -> Result<usize> {
        let items = self.list_pod_sandbox().await?;
        for item in &items {
            self.stop_pod_sandbox(&item.id).await?;
            self.remove_pod_sandbox(&item.id).await?;
        }
        Ok(items.len())
    }
}

fn rpc(call: &'static str) -> impl Fn(tonic::Status) -> CriError {
    move |status| CriError::Rpc {
        call,
        status: Box::new(status),
    }
}
