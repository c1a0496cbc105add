"""deploy/k8s protects the data plane (issue 32 item 11): every pod of the manifests mounts
the Secret reflow-tls where the jobs' ``REFLOW_TLS_*`` variables point, with the keys the
documented ``kubectl create secret`` makes, and networkpolicy.yaml selects the pods the
manifests label (what KubeRay adds included) and admits only what docs/guide/deployment.md
says. The YAML is parsed here; the schemas are checked by tests/unit/test_deploy.py
(kubernetes-validate covers the NetworkPolicies, check-kuberay-manifests the clusters)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import yaml

from engine import JobConfig
from engine.dataflow.config import TLS_ENV
from engine.errors import ConfigError
from engine.wire.transport import tls_contexts
from tests.tls import self_signed

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
SECRET = "reflow-tls"


def _docs() -> list[tuple[str, dict]]:
    return [(p.name, d) for p in sorted(K8S.glob("*.yaml"))
            for d in yaml.safe_load_all(p.read_text()) if d]


def _clusters() -> list[tuple[str, dict, dict[str, str]]]:
    """(file, RayCluster spec, the environment its jobs' drivers get) of every manifest: a
    RayJob's runtime env, or a RayCluster's head container (where job drivers run)."""
    out = []
    for f, d in _docs():
        if d["kind"] == "RayJob":
            env = yaml.safe_load(d["spec"]["runtimeEnvYAML"])["env_vars"]
            out.append((f, d["spec"]["rayClusterSpec"], env))
        elif d["kind"] == "RayCluster":
            head = d["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
            out.append((f, d["spec"], {e["name"]: e["value"] for e in head.get("env", [])}))
    return out


def _pods() -> list[tuple[str, str, dict]]:
    """(file, node type, pod template with the labels KubeRay gives the pod) of every Ray
    pod the manifests make: heads, workers, and, for a cluster with GCS fault tolerance, the
    Job KubeRay runs from the head's template to clean Redis when the cluster is deleted."""
    out = []
    for f, spec, _ in _clusters():
        groups = [("head", spec["headGroupSpec"]["template"])]
        groups += [("worker", g["template"]) for g in spec["workerGroupSpecs"]]
        if "gcsFaultToleranceOptions" in spec:
            groups.append(("redis-cleanup", spec["headGroupSpec"]["template"]))
        for node_type, template in groups:
            labels = {**template["metadata"]["labels"], "ray.io/node-type": node_type}
            out.append((f, node_type, {**template, "metadata": {"labels": labels}}))
    return out


def _matches(selector: dict, labels: dict[str, str]) -> bool:
    """A Kubernetes label selector (matchLabels, matchExpressions) against ``labels``."""
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for e in selector.get("matchExpressions", []):
        value, op = labels.get(e["key"]), e["operator"]
        if op == "In":
            ok = value in e["values"]
        elif op == "NotIn":
            ok = value not in e["values"]
        elif op in ("Exists", "DoesNotExist"):
            ok = (value is not None) == (op == "Exists")
        else:
            raise AssertionError(f"unknown selector operator {op!r}")
        if not ok:
            return False
    return True


def _policies() -> dict[str, dict]:
    return {d["metadata"]["name"]: d["spec"] for f, d in _docs()
            if d["kind"] == "NetworkPolicy" and f == "networkpolicy.yaml"}


def _admits(policy: dict, peer: dict[str, str], same_namespace: bool = True) -> set | None:
    """The ports (None: every port) on which ``policy`` admits a pod labelled ``peer``
    (one rule per peer kind here: the union of the rules that admit it)."""
    ports: set = set()
    for rule in policy.get("ingress", []):
        peers = rule.get("from")
        ok = peers is None or any(
            ("podSelector" in p and _matches(p["podSelector"], peer))
            and ("namespaceSelector" in p or same_namespace)
            and "ipBlock" not in p
            for p in peers)
        if ok:
            if "ports" not in rule:
                return None
            ports |= {int(p["port"]) for p in rule["ports"]}
    return ports


def _container_ports(template: dict) -> dict[str, int]:
    c = template["spec"]["containers"][0]
    return {p["name"]: p["containerPort"] for p in c.get("ports", [])}


def _documented_secret_keys() -> set[str]:
    """The keys ``kubectl create secret generic reflow-tls`` in the deployment guide makes
    (``--from-file=PATH`` makes key PATH's base name, ``--from-file=KEY=PATH`` makes KEY)."""
    text = (ROOT / "docs" / "guide" / "deployment.md").read_text().replace("\\\n", " ")
    found = re.findall(rf"^kubectl create secret generic {SECRET} (.*)$", text, re.M)
    assert len(found) == 1, found
    keys = {arg.removeprefix("--from-file=").split("=")[0]
            for arg in found[0].split() if arg.startswith("--from-file=")}
    return {os.path.basename(k) for k in keys}


# -------------------------------------------------------------------------------- TLS

def test_every_pod_mounts_the_secret_where_the_jobs_variables_point():
    keys = _documented_secret_keys()
    assert keys == {"tls.crt", "tls.key", "ca.crt"}
    assert len(_clusters()) == 3
    mounts = {}
    for f, node_type, pod in _pods():
        volumes = {v["name"]: v for v in pod["spec"].get("volumes", [])}
        container = pod["spec"]["containers"][0]
        mine = [m for m in container.get("volumeMounts", [])
                if volumes.get(m["name"], {}).get("secret", {}).get("secretName") == SECRET]
        assert len(mine) == 1, (f, node_type, container.get("volumeMounts"))
        assert mine[0]["readOnly"] is True, (f, node_type)
        secret = volumes[mine[0]["name"]]["secret"]
        # the files are the group's, read-only, and the ray user is in the pod's fsGroup
        assert secret["defaultMode"] == 0o440, (f, node_type, secret)
        assert pod["spec"]["securityContext"]["fsGroup"] == 100, (f, node_type)
        assert not secret.get("optional", False), (f, node_type)  # no Secret: no pod
        mounts.setdefault(f, set()).add(mine[0]["mountPath"])
    for f, _, env in _clusters():
        assert len(mounts[f]) == 1, (f, mounts[f])  # one path on every pod
        mount = mounts[f].pop()
        for name, key in zip(TLS_ENV, ("tls.crt", "tls.key", "ca.crt"), strict=True):
            assert env[name] == f"{mount}/{key}", (f, name, env.get(name))
            assert key in keys


def test_the_manifests_variables_make_a_tls_jobconfig(monkeypatch, tmp_path):
    """The jobs' variables, with the Secret materialised at another path, give the TLS the
    tasks load; at the manifests' own path (absent here) the job fails at its start,
    naming the variable."""
    _, _, env = _clusters()[0]
    mount = os.path.dirname(env[TLS_ENV[0]])
    pair = self_signed(tmp_path / "made")
    secret = tmp_path / "mnt"
    secret.mkdir()
    for key, source in (("tls.crt", pair.cert_file), ("tls.key", pair.key_file),
                        ("ca.crt", pair.cert_file)):
        (secret / key).write_bytes(Path(source).read_bytes())
    for name in TLS_ENV:
        monkeypatch.setenv(name, env[name].replace(mount, str(secret)))
    cfg = JobConfig()
    assert cfg.tls is not None and cfg.tls.ca == str(secret / "ca.crt")
    tls_contexts(cfg.tls)
    if os.path.exists(mount):
        pytest.skip(f"{mount} exists on this machine")
    for name in TLS_ENV:
        monkeypatch.setenv(name, env[name])
    with pytest.raises(ConfigError, match=rf"^JobConfig: {TLS_ENV[0]}='{mount}/tls.crt' "
                                          "names no file on this node"):
        JobConfig()


# ------------------------------------------------------------------------ NetworkPolicy

def test_every_policy_restricts_ingress_and_every_pod_is_selected():
    policies = _policies()
    assert set(policies) == {"reflow", "reflow-head-clients", "reflow-redis"}
    assert all(p["policyTypes"] == ["Ingress"] for p in policies.values())
    redis = next(d for f, d in _docs() if f == "redis.yaml" and d["kind"] == "Deployment")
    pods = [(f, t, p["metadata"]["labels"]) for f, t, p in _pods()]
    pods.append(("redis.yaml", "redis", redis["spec"]["template"]["metadata"]["labels"]))
    for f, node_type, labels in pods:
        assert any(_matches(p["podSelector"], labels) for p in policies.values()), \
            (f, node_type, labels)


def test_the_reflow_pods_reach_each_other_on_any_port():
    """The tasks' data ports are ephemeral (DataServer binds port 0) and Ray's are many: the
    cluster's pods admit each other by label, on every port."""
    policy = _policies()["reflow"]
    for f, node_type, pod in _pods():
        labels = pod["metadata"]["labels"]
        assert _matches(policy["podSelector"], labels), (f, node_type)
        for g, other_type, other in _pods():
            assert _admits(policy, other["metadata"]["labels"]) is None, \
                (f, node_type, "from", g, other_type)
    # and nothing else gets every port: not a stranger, not Prometheus
    assert _admits(policy, {"app": "something-else"}) == set()
    assert _admits(policy, {"app.kubernetes.io/name": "prometheus"}, same_namespace=False) \
        == {8080, 9400}


def test_prometheus_reaches_exactly_the_metrics_ports_the_manifests_open():
    policy = _policies()["reflow"]
    allowed = _admits(policy, {"app.kubernetes.io/name": "prometheus"}, same_namespace=False)
    monitor = next(d for _, d in _docs() if d["kind"] == "PodMonitor")
    for f, node_type, pod in _pods():
        ports = _container_ports(pod)
        if node_type == "head":
            assert ports[monitor["spec"]["podMetricsEndpoints"][0]["port"]] == 9400, f
        if "metrics" in ports:
            assert ports["metrics"] == 8080, (f, node_type)
    for f, spec, env in _clusters():
        assert int(env["REFLOW_METRICS_PORT"]) in allowed, f
        assert int(spec["headGroupSpec"]["rayStartParams"]["metrics-export-port"]) in allowed, f
    assert allowed == {8080, 9400}


def test_clients_reach_only_the_heads_dashboard_and_ray_client_ports():
    policy = _policies()["reflow-head-clients"]
    for f, node_type, pod in _pods():
        selected = _matches(policy["podSelector"], pod["metadata"]["labels"])
        assert selected == (node_type == "head"), (f, node_type)
        if node_type == "head":
            ports = _container_ports(pod)
            assert _admits(policy, {}, same_namespace=False) == {
                ports["dashboard"], ports["client"]} == {8265, 10001}, f
    assert all("from" not in rule for rule in policy["ingress"])  # anyone, with Ray's token


def test_the_gcs_redis_admits_only_the_heads_and_the_cleanup_job():
    policy = _policies()["reflow-redis"]
    docs = {(f, d["kind"]): d for f, d in _docs()}
    redis = docs["redis.yaml", "Deployment"]["spec"]["template"]
    assert _matches(policy["podSelector"], redis["metadata"]["labels"])
    port = _container_ports(redis)["redis"]
    ft = docs["raycluster.yaml", "RayCluster"]["spec"]["gcsFaultToleranceOptions"]
    assert int(ft["redisAddress"].split(":")[1]) == port
    for f, node_type, pod in _pods():
        admitted = _admits(policy, pod["metadata"]["labels"])
        expected = {port} if node_type in ("head", "redis-cleanup") else set()
        assert admitted == expected, (f, node_type, admitted)
    assert any(t == "redis-cleanup" for _, t, _ in _pods())
    assert _admits(policy, {"app.kubernetes.io/name": "prometheus"}) == set()


def test_the_policies_select_no_pod_of_another_application():
    stranger = {"app.kubernetes.io/name": "something-else", "ray.io/node-type": "head"}
    assert not any(_matches(p["podSelector"], stranger) for p in _policies().values())
