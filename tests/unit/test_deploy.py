"""deploy/: the KubeRay manifests against KubeRay's own CRD schemas (strictly), the plain
Kubernetes objects with kubernetes-validate, the Prometheus config and alert rules with
promtool, every dashboard query's PromQL with promtool, and the checked-in Grafana JSON
against what ``engine.observability.dashboards`` generates. (That every query returns data from a real
Prometheus scraping a real job: tests/integration/test_observability.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from engine.observability import dashboards as dash
from tests.system import require

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = sorted((DEPLOY / "k8s").glob("*.yaml"))
# ../shared beside the checkout (CI, /work/main), or beside its parent (a worktree)
KUBERAY_CHECK = next((p for p in (ROOT.parent / "shared" / "tools" / "check-kuberay-manifests",
                                  ROOT.parents[1] / "shared" / "tools" / "check-kuberay-manifests")
                      if p.exists()), ROOT.parent / "shared" / "tools" / "check-kuberay-manifests")
KUBERAY_KINDS = {"RayCluster", "RayJob"}
CRD_KINDS = KUBERAY_KINDS | {"PodMonitor"}  # kubernetes-validate has no schema for these


def _docs() -> list[tuple[str, dict]]:
    return [(p.name, d) for p in K8S for d in yaml.safe_load_all(p.read_text()) if d]


def _promtool() -> str:
    return require("promtool", "prometheus")


def _run(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=120)


# ---------------------------------------------------------------- Kubernetes

def test_kuberay_manifests_pass_the_strict_crd_check():
    if not KUBERAY_CHECK.exists():
        pytest.skip(f"{KUBERAY_CHECK} is absent (the shared tools sit beside the checkout "
                    "on the project's machines); it checks KubeRay manifests against "
                    "KubeRay's CRD schemas")
    proc = _run(sys.executable, str(KUBERAY_CHECK), *map(str, K8S))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    checked = [d for _, d in _docs() if d["kind"] in KUBERAY_KINDS]
    assert f"{len(checked)}/{len(checked)} KubeRay documents valid" in proc.stdout
    assert {d["kind"] for d in checked} == KUBERAY_KINDS


def test_plain_kubernetes_objects_are_valid():
    import kubernetes_validate

    plain = [(f, d) for f, d in _docs() if d["kind"] not in CRD_KINDS]
    assert plain, "deploy/k8s has plain objects (the metrics Service)"
    for _, d in plain:
        kubernetes_validate.validate(d, "1.33.0", strict=True)  # raises when invalid


def _clusters() -> list[tuple[str, dict]]:
    """(file, RayCluster spec) of every manifest, a RayJob's cluster included."""
    out = []
    for f, d in _docs():
        if d["kind"] == "RayCluster":
            out.append((f, d["spec"]))
        elif d["kind"] == "RayJob":
            out.append((f, d["spec"]["rayClusterSpec"]))
    return out


def test_every_cluster_has_token_auth_and_exposes_the_metrics_port():
    monitor = next(d for _, d in _docs() if d["kind"] == "PodMonitor")
    port = monitor["spec"]["podMetricsEndpoints"][0]["port"]
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert monitor["spec"]["podMetricsEndpoints"][0]["honorLabels"] is True
    assert len(_clusters()) == 3
    for f, spec in _clusters():
        assert spec["authOptions"] == {"mode": "token"}, f
        head = spec["headGroupSpec"]["template"]
        labels = {**head["metadata"]["labels"], "ray.io/node-type": "head"}
        assert all(labels.get(k) == v for k, v in selector.items()), f
        container = head["spec"]["containers"][0]
        assert port in {p.get("name") for p in container["ports"]}, f


def test_jobs_open_metrics_and_data_sockets_on_the_pod_network():
    for f, d in _docs():
        if d["kind"] == "RayJob":
            env = yaml.safe_load(d["spec"]["runtimeEnvYAML"])["env_vars"]
            assert d["spec"]["entrypoint"].startswith("python examples/"), f
        elif d["kind"] == "RayCluster":
            container = d["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
            env = {e["name"]: e["value"] for e in container["env"]}
        else:
            continue
        assert env["REFLOW_METRICS_HOST"] == "0.0.0.0", f
        assert env["REFLOW_METRICS_PORT"] == "9400", f
        assert env["REFLOW_DATA_HOST"] == "0.0.0.0", f


def test_the_long_running_cluster_keeps_its_gcs_in_the_redis_of_redis_yaml():
    """GCS fault tolerance (docs/guide/high-availability.md): raycluster.yaml's
    gcsFaultToleranceOptions name redis.yaml's Service and the Secret its Redis reads."""
    docs = {(f, d["kind"]): d for f, d in _docs()}
    ft = docs["raycluster.yaml", "RayCluster"]["spec"]["gcsFaultToleranceOptions"]
    service = docs["redis.yaml", "Service"]
    host, port = ft["redisAddress"].split(":")
    assert host == service["metadata"]["name"], ft
    assert int(port) in {p["port"] for p in service["spec"]["ports"]}, ft
    redis = docs["redis.yaml", "Deployment"]["spec"]["template"]["spec"]["containers"][0]
    secret = next(e["valueFrom"]["secretKeyRef"] for e in redis["env"]
                  if e["name"] == "REDIS_PASSWORD")
    assert ft["redisPassword"] == {"valueFrom": {"secretKeyRef": secret}}, ft
    assert '"$REDIS_PASSWORD"' in " ".join(redis["args"]), redis["args"]


def test_jobconfig_reads_the_deployment_variables(monkeypatch):
    from engine import JobConfig
    from engine.errors import ConfigError

    assert (JobConfig().metrics_host, JobConfig().metrics_port) == ("127.0.0.1", 0)
    monkeypatch.setenv("REFLOW_METRICS_HOST", "0.0.0.0")
    monkeypatch.setenv("REFLOW_METRICS_PORT", "9400")
    monkeypatch.setenv("REFLOW_DATA_HOST", "0.0.0.0")
    c = JobConfig()
    assert (c.metrics_host, c.metrics_port, c.data_host) == ("0.0.0.0", 9400, "0.0.0.0")
    assert JobConfig(metrics_port=None).metrics_port is None  # an explicit value wins
    monkeypatch.setenv("REFLOW_METRICS_PORT", "ninety")
    with pytest.raises(ConfigError, match="metrics_port must be an integer or None; got "
                                          "'ninety'"):
        JobConfig()


# ---------------------------------------------------------------- Prometheus

def test_prometheus_config_and_rules_pass_promtool():
    promtool = _promtool()
    proc = _run(promtool, "check", "config", "deploy/prometheus/prometheus.yml")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = _run(promtool, "check", "rules", "--lint=all", "deploy/prometheus/rules.yml")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS: 5 rules found" in proc.stdout + proc.stderr


def test_every_dashboard_query_is_valid_promql(tmp_path):
    """Each query, with Grafana's variables expanded, as a recording rule: promtool parses
    them all (the integration test runs them)."""
    promtool = _promtool()
    rules = [{"record": f"check:q{i}", "expr": dash.expand(q.expr, "some-job-1234", "1m")}
             for i, (_, q) in enumerate(q for d in dash.DASHBOARDS.values() for q in d.queries())]
    path = tmp_path / "queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    proc = _run(promtool, "check", "rules", str(path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(rules)} rules found" in proc.stdout + proc.stderr


# ---------------------------------------------------------------- Grafana

def test_checked_in_dashboards_are_the_generated_ones(tmp_path):
    written = dash.write(str(tmp_path))
    for path in written:
        name = os.path.basename(path)
        shipped = DEPLOY / "grafana" / "dashboards" / name
        assert shipped.exists(), f"{shipped} is missing: python -m engine.observability.dashboards"
        assert json.loads(shipped.read_text()) == json.loads(Path(path).read_text()), (
            f"{shipped} differs from engine/dashboards.py: regenerate it with "
            "`python -m engine.observability.dashboards deploy/grafana/dashboards`")
    assert sorted(p.name for p in (DEPLOY / "grafana" / "dashboards").glob("*.json")) == \
        sorted(os.path.basename(p) for p in written)


def test_dashboards_have_what_the_issue_asks_for():
    overview = {p.title for p in dash.OVERVIEW.panels}
    assert {"Records in per second", "Records out per second", "End-to-end latency",
            "Useful share", "Backpressured share", "Idle share", "Queued frames",
            "Watermark lag", "State bytes per task", "Key groups per task"} <= overview
    rows = {r.title: {p.title for p in r.panels} for r in dash.OVERVIEW.rows}
    assert rows["Checkpoints"] == {"Checkpoints by outcome", "Checkpoint duration",
                                   "Checkpoint size", "Checkpoint alignment per task",
                                   "Job restarts"}
    assert rows["Controllers"] == {"Controller decisions", "Controller decisions per minute"}
    rescaling = {p.title for p in dash.RESCALING.panels}
    assert {"Rescale phase", "Key groups moved", "Bytes moved", "Subscales",
            "Re-routed records", "Suspension", "Propagation delay"} <= rescaling
    assert dash.RESCALING.annotations and dash.OVERVIEW.annotations
    model = dash.to_grafana(dash.RESCALING)
    assert [v["name"] for v in model["templating"]["list"]] == ["datasource", "job"]
    graphs = [p for p in model["panels"] if p["type"] != "row"]
    assert len(graphs) == len(dash.RESCALING.panels)
    assert all('job=~"$job"' in t["expr"] for p in graphs for t in p["targets"])
    ids = [p["id"] for p in model["panels"]]
    assert len(set(ids)) == len(ids)
    assert model["annotations"]["list"][1]["expr"].startswith("changes(reflow_rescales_total")


def test_grafana_rows_head_their_panels_which_never_overlap():
    model = dash.to_grafana(dash.OVERVIEW)
    heads = [(p["title"], p["gridPos"]["y"]) for p in model["panels"] if p["type"] == "row"]
    assert [t for t, _ in heads] == [r.title for r in dash.OVERVIEW.rows]
    cells = set()
    for p in model["panels"]:
        g = p["gridPos"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"])
                for y in range(g["y"], g["y"] + g["h"])}
        assert not mine & cells, p["title"]
        cells |= mine
    # each row's panels lie between its header and the next one's
    for (_, y0), (_, y1) in zip(heads, heads[1:] + [("end", 10**6)], strict=True):
        inside = [p for p in model["panels"] if p["type"] != "row" and y0 < p["gridPos"]["y"] < y1]
        row = next(r for r in dash.OVERVIEW.rows if (r.title, y0) in heads)
        assert [p["title"] for p in inside] == [p.title for p in row.panels]


def test_a_dashboard_refuses_duplicate_titles_and_empty_panels():
    q = (dash.Query("up"),)
    with pytest.raises(ValueError, match="panel titles used twice"):
        dash.Dashboard("x", "x", "", (dash.Row("r", (dash.Panel("a", q),)),
                                      dash.Row("s", (dash.Panel("a", q),))))
    with pytest.raises(ValueError, match="row 'r' has no panel"):
        dash.Row("r", ())
    with pytest.raises(ValueError, match="has no query"):
        dash.Panel("a", ())
    with pytest.raises(KeyError, match="no dashboard 'nope'; known: overview, rescaling"):
        dash.dashboard("nope")
    assert dash.dashboard("reflow-rescaling") is dash.RESCALING
