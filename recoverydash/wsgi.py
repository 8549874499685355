"""WSGI entry point (gunicorn recoverydash.wsgi).

After Django is loaded, ``gc.freeze()`` moves every object it made (modules, settings, URL
patterns, models) into the collector's permanent generation: each collection then scans only
what requests made since, never the process's tens of thousands of startup objects again.
"""
import gc
import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "recoverydash.settings")
application = get_wsgi_application()
gc.freeze()
