"""Kubernetes' "restricted" Pod Security Standard, checked on a pod spec (the operator's pod from
the chart, the pods the operator creates)."""

from __future__ import annotations

RESTRICTED_VOLUMES = {"emptyDir", "configMap", "secret", "projected", "downwardAPI",
                      "persistentVolumeClaim", "ephemeral", "csi"}


def assert_restricted(pod: dict) -> None:
    """Every check of the restricted profile that applies to the fields lakeslot sets."""
    assert not any(pod.get(k) for k in ("hostNetwork", "hostPID", "hostIPC"))
    assert all(set(volume) - {"name"} <= RESTRICTED_VOLUMES for volume in pod.get("volumes", []))
    pod_security = pod.get("securityContext", {})
    for container in pod["containers"] + pod.get("initContainers", []):
        security = container.get("securityContext") or {}
        assert security.get("runAsNonRoot", pod_security.get("runAsNonRoot")) is True
        assert security.get("runAsUser", pod_security.get("runAsUser")) != 0
        seccomp = security.get("seccompProfile", pod_security.get("seccompProfile"))
        assert seccomp is not None and seccomp["type"] in ("RuntimeDefault", "Localhost")
        assert security.get("allowPrivilegeEscalation") is False
        assert not security.get("privileged")
        capabilities = security.get("capabilities") or {}
        assert capabilities.get("drop") == ["ALL"] and not capabilities.get("add")
        assert all("hostPort" not in port for port in container.get("ports", []))
