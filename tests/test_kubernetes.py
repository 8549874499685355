"""deploy/kubernetes, a kustomize base: every manifest valid against the pinned Kubernetes
version's schemas (``kubernetes-validate``, strict: an unknown field is an error), and what the
manifests say matching what the service does: readiness on /healthz with an allowed Host, one
beat, workers per queue, the autoscaler on metrics /metrics exports, the variables the settings
read, the checkpoint volume read-only where it is read. No cluster here: structure only."""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from test_deploy import settings_env_names

REPO = Path(__file__).resolve().parent.parent
BASE = REPO / "deploy" / "kubernetes"
KUBERNETES_VERSION = "1.33.0"
PROCESS_VARIABLES = {"WEB_CONCURRENCY", "CELERY_CONCURRENCY", "CELERY_WEBHOOK_CONCURRENCY"}


def kustomization() -> dict:
    return yaml.safe_load((BASE / "kustomization.yaml").read_text())


def resources() -> dict[str, dict]:
    """``{"Kind/name": manifest}`` of every resource the kustomization lists."""
    out = {}
    for name in kustomization()["resources"]:
        for doc in yaml.safe_load_all((BASE / name).read_text()):
            out[f"{doc['kind']}/{doc['metadata']['name']}"] = doc
    return out


def container(kind_name: str) -> dict:
    (only,) = resources()[kind_name]["spec"]["template"]["spec"]["containers"]
    return only


def test_the_kustomization_lists_every_manifest_of_the_folder():
    listed = set(kustomization()["resources"])
    present = {p.name for p in BASE.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == present


@pytest.mark.parametrize("name", sorted(p.name for p in BASE.glob("*.yaml")
                                        if p.name != "kustomization.yaml"))
def test_each_manifest_is_valid_for_the_pinned_kubernetes_version(name):
    for doc in yaml.safe_load_all((BASE / name).read_text()):
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_a_manifest_with_an_unknown_field_is_refused():
    """The validation above can fail: a typo in a field is caught."""
    doc = yaml.safe_load((BASE / "web-service.yaml").read_text())
    doc["spec"]["selectr"] = doc["spec"].pop("selector")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_web_is_ready_only_when_healthz_answers_for_an_allowed_host():
    config = resources()["ConfigMap/recoverydash"]["data"]
    probe = container("Deployment/recoverydash-web")["readinessProbe"]["httpGet"]
    assert probe["path"] == "/healthz"
    (host,) = [h["value"] for h in probe["httpHeaders"] if h["name"] == "Host"]
    assert host in config["ALLOWED_HOSTS"].split(",")
    service = resources()["Service/recoverydash-web"]
    web = resources()["Deployment/recoverydash-web"]["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= web.items()


def test_one_beat_and_a_worker_deployment_per_queue():
    beat = resources()["Deployment/recoverydash-beat"]
    assert beat["spec"]["replicas"] == 1 and beat["spec"]["strategy"]["type"] == "Recreate"
    assert container("Deployment/recoverydash-beat")["command"][:4] == [
        "celery", "-A", "workers.celery", "beat"]
    for name, queue in (("worker", "celery"), ("webhooks", "webhooks")):
        command = " ".join(container(f"Deployment/recoverydash-{name}")["command"])
        assert f"celery -A workers.celery worker -Q {queue} " in command, command
    assert container("Job/recoverydash-migrate")["command"] == [
        "python", "manage.py", "migrate", "--noinput"]


def test_the_autoscaler_scales_the_workers_on_metrics_the_service_exports():
    from recoverydash.metrics.collector import METRICS

    hpa = resources()["HorizontalPodAutoscaler/recoverydash-worker"]["spec"]
    assert hpa["scaleTargetRef"]["name"] == "recoverydash-worker"
    names = [m["external"]["metric"]["name"] for m in hpa["metrics"]]
    assert names and set(names) <= set(METRICS)


def test_every_variable_is_one_the_settings_or_the_processes_read():
    known = settings_env_names() | PROCESS_VARIABLES
    config = resources()["ConfigMap/recoverydash"]["data"]
    secret = resources()["Secret/recoverydash"]["stringData"]
    assert set(config) | set(secret) <= known, (set(config) | set(secret)) - known
    assert {"SECRET_KEY", "DATABASE_URL", "CELERY_BROKER_URL"} <= set(secret)
    for kind_name in ("Deployment/recoverydash-web", "Deployment/recoverydash-worker",
                      "Deployment/recoverydash-webhooks", "Deployment/recoverydash-beat",
                      "Job/recoverydash-migrate"):
        sources = {ref.get("configMapRef", ref.get("secretRef"))["name"]
                   for ref in container(kind_name)["envFrom"]}
        assert sources == {"recoverydash"}, kind_name


def test_the_checkpoints_are_mounted_read_only_where_they_are_read():
    claim = resources()["PersistentVolumeClaim/recoverydash-checkpoints"]
    assert claim["spec"]["accessModes"] == ["ReadOnlyMany"]
    for name in ("web", "worker"):
        spec = resources()[f"Deployment/recoverydash-{name}"]["spec"]["template"]["spec"]
        (mount,) = spec["containers"][0]["volumeMounts"]
        assert mount == {"name": "checkpoints", "mountPath": "/data/ckpt", "readOnly": True}
        (volume,) = spec["volumes"]
        assert volume["persistentVolumeClaim"] == {"claimName": "recoverydash-checkpoints",
                                                   "readOnly": True}
