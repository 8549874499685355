"""docker-compose.yml, Dockerfile and .env.example checked against the settings (no Docker
engine here to run them): every service, command and variable must exist and make sense."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
SETTINGS = (REPO / "recoverydash" / "settings.py").read_text()


def compose() -> dict:
    return yaml.safe_load((REPO / "docker-compose.yml").read_text())


def settings_env_names() -> set[str]:
    """Every environment variable recoverydash.settings reads."""
    return set(re.findall(r'(?:environ\.get|env(?:bool|int|float|list))\(\s*"([A-Z_]+)"',
                          SETTINGS))


def test_it_defines_the_production_services_with_health_checks():
    services = compose()["services"]
    assert set(services) == {"postgres", "redis", "migrate", "web", "proxy", "worker",
                             "webhooks", "beat"}
    for name in ("postgres", "redis", "web", "worker", "webhooks"):
        assert "healthcheck" in services[name], name
    assert services["postgres"]["volumes"] == ["pgdata:/var/lib/postgresql/data"]
    assert set(compose()["volumes"]) == {"pgdata", "redisdata", "beatdata"}


def test_it_runs_the_right_commands():
    services = compose()["services"]
    # the shell of the container reads the process counts from .env ($$ is compose's $)
    assert services["web"]["command"][:2] == ["sh", "-c"]
    assert services["web"]["command"][2].startswith("exec gunicorn recoverydash.wsgi ")
    assert '--workers "$${WEB_CONCURRENCY:-3}"' in services["web"]["command"][2]
    for name, queue, variable in (("worker", "celery", "CELERY_CONCURRENCY"),
                                  ("webhooks", "webhooks", "CELERY_WEBHOOK_CONCURRENCY")):
        command = services[name]["command"][2]
        assert command.startswith(f"exec celery -A workers.celery worker -Q {queue} "), command
        assert f'--concurrency "$${{{variable}:-4}}"' in command, command
    assert services["beat"]["command"][:4] == ["celery", "-A", "workers.celery", "beat"]
    assert services["migrate"]["command"] == ["python", "manage.py", "migrate", "--noinput"]
    for name in ("web", "worker", "webhooks", "beat"):
        assert services[name]["depends_on"]["migrate"]["condition"] == \
            "service_completed_successfully"
    assert services["web"]["healthcheck"]["test"][-1].count("/healthz") == 1


def test_it_points_the_app_at_postgres_and_redis_through_settings_variables():
    services = compose()["services"]
    known = settings_env_names()
    for name in ("web", "worker", "webhooks", "beat", "migrate"):
        env = services[name]["environment"]
        assert set(env) <= known, set(env) - known
        assert env["DATABASE_URL"].startswith("postgres://") and "@postgres:5432/" in \
            env["DATABASE_URL"]
        assert env["CELERY_BROKER_URL"].startswith("redis://redis:6379/")
        assert services[name]["env_file"] == ".env"
    # the app services wait for migrate, which waits for healthy postgres and redis
    for dependency in ("postgres", "redis"):
        assert services["migrate"]["depends_on"][dependency]["condition"] == "service_healthy"


def test_it_mounts_the_trainers_checkpoints_read_only_into_web_and_worker():
    services = compose()["services"]
    for name in ("web", "worker"):
        (mount,) = services[name]["volumes"]
        assert mount == {"type": "bind", "source": "${CHECKPOINTS_DIR:-./checkpoints}",
                         "target": "/data/ckpt", "read_only": True,
                         "bind": {"create_host_path": True}}, name
    assert "volumes" not in services["migrate"]
    # the README and the operator guide say how to declare it, mapping the trainers' path to
    # the mount
    readme = (REPO / "README.md").read_text() + (REPO / "docs" / "operator-guide.md").read_text()
    assert "--uri file:///data/ckpt --trainer-uri file:///mnt/ckpt" in readme
    assert "CHECKPOINTS_DIR" in (REPO / ".env.example").read_text()


def test_it_documents_only_variables_the_settings_read():
    example = (REPO / ".env.example").read_text()
    names = set(re.findall(r"^#?\s*([A-Z][A-Z0-9_]+)=", example, re.M))
    compose_only = {"POSTGRES_PASSWORD", "CHECKPOINTS_DIR", "PORT", "WEB_CONCURRENCY",
                    "CELERY_CONCURRENCY", "CELERY_WEBHOOK_CONCURRENCY"}
    assert names - compose_only <= settings_env_names(), names - compose_only - settings_env_names()
    assert "SECRET_KEY" in names and "ALLOWED_HOSTS" in names


def test_it_builds_an_image_with_the_server_and_its_assets():
    dockerfile = (REPO / "Dockerfile").read_text()
    for path in ("recoverydash", "workers", "templates", "static", "docs", "manage.py"):
        assert f"COPY {path}" in dockerfile, path
        assert (REPO / path).exists(), path
    assert "collectstatic" in dockerfile and "torch" not in dockerfile.split("RUN pip")[1][:80]


def test_web_scales_behind_one_published_port():
    """``--scale web=N`` cannot publish one host port N times: only the proxy publishes, and
    its nginx configuration sends every request to the web service's containers."""
    services = compose()["services"]
    published = {name for name, svc in services.items() if svc.get("ports")}
    assert published == {"proxy"}
    assert services["proxy"]["ports"] == ["${PORT:-8000}:8080"]
    assert services["web"]["expose"] == ["8000"]
    (mount,) = services["proxy"]["volumes"]
    conf = (REPO / mount["source"]).read_text()
    assert "listen 8080;" in conf and "set $web http://web:8000;" in conf
    assert "resolver 127.0.0.11" in conf  # re-resolved: containers added later get requests
    assert services["proxy"]["depends_on"]["web"]["condition"] == "service_healthy"


def test_the_build_context_leaves_out_the_venv_secrets_and_state():
    ignored = (REPO / ".dockerignore").read_text().split()
    for name in (".venv", ".env", "var", ".git", "*.sqlite3"):
        assert name in ignored, name
    assert "!.env.example" in ignored
    dockerfile = (REPO / "Dockerfile").read_text()
    for copied in re.findall(r"^COPY (\S+)", dockerfile, re.M):
        assert copied not in ignored, copied


def test_the_operator_guide_documents_every_variable_the_settings_read():
    guide = (REPO / "docs" / "operator-guide.md").read_text()
    table = guide[guide.index("## Configuration"):guide.index("## Storage locations")]
    names = settings_env_names() | set(re.findall(r'os\.environ\[\s*"([A-Z_]+)"', SETTINGS))
    missing = sorted(n for n in names if f"`{n}`" not in table)
    assert not missing, missing
