"""deploy/: the chart, its rendered manifests, the compose file, the image and the dashboard
agree with each other and with the metrics the orchestrator exports."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from stepline_server.metrics import Metrics

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
CHART = DEPLOY / "helm" / "stepline"


def _values() -> dict[str, Any]:
    return yaml.safe_load((CHART / "values.yaml").read_text())  # type: ignore[no-any-return]


def _templates() -> str:
    return "\n".join(p.read_text() for p in sorted((CHART / "templates").glob("*")))


def _rendered() -> dict[str, dict[str, Any]]:
    docs = yaml.safe_load_all((DEPLOY / "kubernetes" / "stepline.yaml").read_text())
    return {doc["kind"]: doc for doc in docs if doc}


def test_every_value_the_templates_use_is_in_values_and_every_value_is_used() -> None:
    """The chart's templates read only values that values.yaml defines (and documents), and
    values.yaml has nothing no template reads."""
    values, text = _values(), _templates()
    used = set(re.findall(r"\.Values\.([A-Za-z0-9_.]+)", text))
    for path in used:
        node: Any = values
        for part in path.split("."):
            assert isinstance(node, dict) and part in node, f".Values.{path} is not in values.yaml"
            node = node[part]
    assert {path.split(".")[0] for path in used} == set(values)


def test_the_rendered_manifests_have_every_kind_and_the_default_values() -> None:
    """deploy/kubernetes/stepline.yaml is the chart rendered with its defaults: each kind of
    resource, the replicas, probes, resources, security and environment of values.yaml."""
    values, rendered = _values(), _rendered()
    kinds = set(re.findall(r"^kind: (\w+)", _templates(), re.M))
    optional = {"ServiceMonitor"}  # off by default
    assert set(rendered) == kinds - optional
    deployment = rendered["Deployment"]["spec"]
    assert deployment["replicas"] == values["replicaCount"]
    pod = deployment["template"]["spec"]
    [container] = pod["containers"]
    assert container["args"] == ["stepline", "serve", "--workers", str(values["workers"])]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    for probe in ("liveness", "readiness"):
        got = container[f"{probe}Probe"]
        assert {k: got[k] for k in values["probes"][probe]} == values["probes"][probe]
    assert container["resources"] == values["resources"]
    assert container["securityContext"] == values["securityContext"]
    assert pod["securityContext"] == values["podSecurityContext"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert {k: env[k] for k in values["env"]} == values["env"]
    assert rendered["Secret"]["stringData"]["DATABASE_URL"] == values["secret"]["databaseUrl"]
    job = rendered["Job"]["spec"]["template"]
    assert job["spec"]["containers"][0]["args"] == ["stepline", "migrate"]
    # The migration pod is not one the Service or the disruption budget selects.
    selector = rendered["Service"]["spec"]["selector"]
    assert job["metadata"]["labels"] != selector
    assert rendered["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"] == selector
    assert (
        rendered["PodDisruptionBudget"]["spec"]["minAvailable"]
        == (values["podDisruptionBudget"]["minAvailable"])
    )


def test_the_migration_job_and_its_secret_are_hooks_in_order() -> None:
    """Migrations run as a pre-install/pre-upgrade hook, after the Secret they read."""
    job = (CHART / "templates" / "migration-job.yaml").read_text()
    secret = (CHART / "templates" / "secret.yaml").read_text()
    assert '"helm.sh/hook": pre-install,pre-upgrade' in job
    assert '"helm.sh/hook": pre-install,pre-upgrade' in secret
    weight = re.compile(r'"helm.sh/hook-weight": "(-?\d+)"')
    assert int(weight.findall(secret)[0]) < int(weight.findall(job)[0])


def test_compose_runs_postgres_migrations_two_orchestrators_and_the_app() -> None:
    """The compose file: PostgreSQL with a volume and a health check, migrations once, two
    orchestrators after them, the example app."""
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services = compose["services"]
    assert set(services) == {"postgres", "migrate", "orchestrator-1", "orchestrator-2", "app"}
    assert "healthcheck" in services["postgres"] and "pgdata" in compose["volumes"]
    assert services["migrate"]["command"] == ["stepline", "migrate"]
    for name in ("orchestrator-1", "orchestrator-2"):
        after = services[name]["depends_on"]["migrate"]["condition"]
        assert after == "service_completed_successfully"
        assert services[name]["environment"]["DATABASE_URL"].startswith("postgresql://")


def test_the_image_is_non_root_serves_and_checks_readiness() -> None:
    """The Containerfile: base an argument (an official slim Python by default), a non-root
    user, `stepline serve` as its command, a health check on /readyz."""
    text = (DEPLOY / "Containerfile").read_text()
    assert re.search(r"^ARG BASE=docker.io/library/python:3\.\d+-slim", text, re.M)
    assert "FROM ${BASE}" in text
    assert re.search(r"^USER 10001", text, re.M)
    assert "/readyz" in text.split("HEALTHCHECK", 1)[1]
    assert text.rstrip().endswith('CMD ["stepline", "serve"]')


def test_the_dashboard_uses_only_metrics_the_orchestrator_exports() -> None:
    """Every metric a Grafana panel queries is one that /metrics has."""
    dashboard = json.loads((DEPLOY / "grafana" / "stepline.json").read_text())
    exported = {"stepline_runs_due", "stepline_runs_due_oldest_seconds"}  # read at scrape
    for family in Metrics().registry.collect():
        exported |= {sample.name for sample in family.samples}
        suffix = {"counter": "_total", "histogram": ""}.get(family.type, "")
        exported.add(family.name + suffix)
        if family.type == "histogram":
            exported |= {family.name + s for s in ("_bucket", "_sum", "_count")}
    queried = {
        name
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for name in re.findall(r"\bstepline_[a-z_]+", target["expr"])
    }
    assert queried and queried <= exported, queried - exported
    assert len(dashboard["panels"]) >= 8
    # p95 of a workflow's runs, schedule start lag, and every histogram narrowed by workflow.
    assert {
        "stepline_run_duration_seconds_bucket",
        "stepline_schedule_start_lag_seconds_bucket",
    } <= queried
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert "workflow" in variables
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            if "_seconds_bucket" in target["expr"] and "timer_lateness" not in target["expr"]:
                assert 'workflow=~"$workflow"' in target["expr"], target["expr"]
