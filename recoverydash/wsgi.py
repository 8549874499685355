"""WSGI entry point (gunicorn recoverydash.wsgi)."""
import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "recoverydash.settings")
application = get_wsgi_application()
