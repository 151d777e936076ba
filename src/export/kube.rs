//! Kubernetes identity from a cgroup path: a pod's containers live under
//! `kubepods[.slice]/…/pod<uid>/<container id>` (cgroupfs driver) or
//! `kubepods.slice/kubepods-<qos>.slice/kubepods-<qos>-pod<uid_with_underscores>.slice/
//! <runtime>-<container id>.scope` (systemd driver), with cgroup v1 and v2 alike.
//!
//! Only what the path itself says is derived: the pod UID, the container ID and the QoS
//! class. Namespace, pod and container *names* are not in the path (they need the
//! kubelet's API); join on `pod_uid` with kube-state-metrics' `kube_pod_info{uid}` for them.

/// What a pod's cgroup path says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodRef {
    pub pod_uid: String,
    /// The container's runtime ID (64 hex digits); `None` for the pod's own cgroup.
    pub container_id: Option<String>,
    /// `guaranteed`, `burstable` or `besteffort`.
    pub qos: &'static str,
}

fn is_uid(s: &str) -> bool {
    s.len() >= 32 && s.chars().all(|c| c.is_ascii_hexdigit() || c == '-')
}

fn container_id(seg: &str) -> Option<String> {
    let seg = seg.strip_suffix(".scope").unwrap_or(seg);
    // `cri-containerd-<id>`, `crio-<id>`, `docker-<id>`, or the bare ID (cgroupfs).
    let id = seg.rsplit('-').next().unwrap_or(seg);
    (id.len() == 64 && id.chars().all(|c| c.is_ascii_hexdigit())).then(|| id.to_string())
}

/// The pod (and container) a cgroup path belongs to; `None` for any other cgroup.
pub fn pod_ref(cgroup: &str) -> Option<PodRef> {
    let segs: Vec<&str> = cgroup.split('/').filter(|s| !s.is_empty()).collect();
    let kube = segs.iter().position(|s| s.contains("kubepods"))?;
    let mut qos = "guaranteed";
    for (i, seg) in segs.iter().enumerate().skip(kube) {
        let bare = seg.strip_suffix(".slice").unwrap_or(seg);
        if bare.ends_with("besteffort") {
            qos = "besteffort";
        } else if bare.ends_with("burstable") {
            qos = "burstable";
        }
        let uid = if let Some(u) = bare.strip_prefix("pod") {
            u.to_string()
        } else if let Some(at) = bare.rfind("-pod") {
            bare[at + 4..].replace('_', "-")
        } else {
            continue;
        };
        if !is_uid(&uid) {
            continue;
        }
        return Some(PodRef {
            pod_uid: uid,
            container_id: segs.get(i + 1).and_then(|s| container_id(s)),
            qos,
        });
    }
    None
}

/// The extra labels of a cgroup: `pod_uid`, `container_id` (when known) and `qos_class`.
pub fn labels(cgroup: &str) -> Vec<(String, String)> {
    let Some(p) = pod_ref(cgroup) else {
        return Vec::new();
    };
    let mut l = vec![("pod_uid".to_string(), p.pod_uid)];
    if let Some(c) = p.container_id {
        l.push(("container_id".to_string(), c));
    }
    l.push(("qos_class".to_string(), p.qos.to_string()));
    l
}

#[cfg(test)]
mod tests {
    use super::*;

    const CID: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn cgroupfs_driver() {
        let p = pod_ref(&format!(
            "/kubepods/burstable/pod6f0e1c1a-2b3c-4d5e-8f90-123456789abc/{CID}"
        ))
        .unwrap();
        assert_eq!(p.pod_uid, "6f0e1c1a-2b3c-4d5e-8f90-123456789abc");
        assert_eq!(p.container_id.as_deref(), Some(CID));
        assert_eq!(p.qos, "burstable");
    }

    #[test]
    fn systemd_driver() {
        let p = pod_ref(&format!(
            "/kubepods.slice/kubepods-besteffort.slice/\
             kubepods-besteffort-pod6f0e1c1a_2b3c_4d5e_8f90_123456789abc.slice/\
             cri-containerd-{CID}.scope"
        ))
        .unwrap();
        assert_eq!(p.pod_uid, "6f0e1c1a-2b3c-4d5e-8f90-123456789abc");
        assert_eq!(p.container_id.as_deref(), Some(CID));
        assert_eq!(p.qos, "besteffort");
    }

    #[test]
    fn guaranteed_pod_cgroup_without_container() {
        let p = pod_ref("/kubepods.slice/kubepods-pod6f0e1c1a_2b3c_4d5e_8f90_123456789abc.slice")
            .unwrap();
        assert_eq!(p.qos, "guaranteed");
        assert_eq!(p.container_id, None);
    }

    #[test]
    fn other_cgroups_are_not_pods() {
        assert_eq!(pod_ref("/system.slice/llama.service"), None);
        assert_eq!(pod_ref("/kubepods.slice/kubepods-burstable.slice"), None);
        assert!(labels("/user.slice").is_empty());
    }
}
