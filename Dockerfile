# recoverydash server image: web (gunicorn), Celery worker and beat share it.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    RECOVERYDASH_VAR_DIR=/var/lib/recoverydash \
    STATIC_ROOT=/srv/recoverydash/staticfiles

WORKDIR /srv/recoverydash
# a numeric user, so Kubernetes' runAsNonRoot can check it (deploy/kubernetes)
RUN useradd --system --uid 10001 --home /srv/recoverydash recoverydash \
    && mkdir -p /var/lib/recoverydash && chown recoverydash /var/lib/recoverydash

COPY pyproject.toml README.md ./
COPY recoverydash ./recoverydash
COPY workers ./workers
COPY templates ./templates
COPY static ./static
COPY docs ./docs
COPY manage.py ./
# The server needs no PyTorch: the base (the SDK's pyroaring) and the `server` extra.
RUN pip install ".[server]" && SECRET_KEY=build-only python manage.py collectstatic --noinput

USER 10001
EXPOSE 8000
CMD ["gunicorn", "recoverydash.wsgi", "--bind", "0.0.0.0:8000", "--workers", "3", "--threads", "4", "--access-logfile", "-", "--config", "python:recoverydash.metrics.gunicorn"]
