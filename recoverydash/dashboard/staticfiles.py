"""The dashboard's static files: hashed names and compressed copies, served far-future cached.

``collectstatic`` (run by ``python -m recoverydash.serve`` and the demo when the files changed,
:func:`collect_if_changed`; by the Docker build) writes each file under a name carrying a hash of
its content (``plotly.min.<hash>.js``), with a gzip copy and, where the ``brotli`` package is
installed, a brotli one beside it. WhiteNoise serves the hashed names with ``Cache-Control:
max-age=315360000, public, immutable`` and the smallest copy the browser accepts
(``Accept-Encoding``): plotly.min.js is 4.8 MB as is, about 1.4 MB gzipped and 1 MB with brotli.

Before anything was collected (a test, ``runserver``), ``{% static %}`` names the file as it is
and WhiteNoise serves it from the finders, uncompressed, as before.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from django.contrib.staticfiles.finders import BaseFinder
from django.core.files.storage import FileSystemStorage
from whitenoise.storage import CompressedManifestStaticFilesStorage

#: Beside the collected files: the fingerprint of the sources they were collected from.
STAMP = ".sources-fingerprint"


class StaticStorage(CompressedManifestStaticFilesStorage):
    """WhiteNoise's compressed, hashed storage that falls back to a file's own name when it was
    not collected (no manifest yet, or a file added since): a page never fails on a missing
    manifest entry."""

    manifest_strict = False

    def compress_files(self, paths):
        """WhiteNoise's compression of ``paths`` (hashed names), leaving out each file whose
        compressed copies are there already: a hashed name's content never changes, so a
        collection after one file changed compresses that file, not plotly.min.js again (its
        brotli copy costs tens of CPU seconds)."""
        from whitenoise.compress import brotli_installed

        suffixes = [".gz"] + ([".br"] if brotli_installed else [])
        fresh = [p for p in paths
                 if not all(self.exists(p + suffix) for suffix in suffixes)]
        yield from super().compress_files(fresh)

    def stored_name(self, name: str) -> str:
        try:
            return super().stored_name(name)
        except ValueError:  # not collected: the finders serve it under its own name
            return name


class PlotlyFinder(BaseFinder):
    """``vendor/plotly/plotly.min.js``: the plotly.js bundle of the installed plotly package
    (the dashboard never loads anything from a CDN), and nothing else of that package's data
    (its 5 MB widget bundle and templates are not the dashboard's)."""

    NAME = "plotly.min.js"
    PREFIX = "vendor/plotly"

    def __init__(self, *args, **kwargs):
        from importlib.util import find_spec

        super().__init__(*args, **kwargs)
        folder = Path(find_spec("plotly").submodule_search_locations[0]) / "package_data"
        self.storage = FileSystemStorage(location=folder)
        self.storage.prefix = self.PREFIX

    def find(self, path, find_all=False, **kwargs):
        found = (self.storage.path(self.NAME) if path == f"{self.PREFIX}/{self.NAME}"
                 else None)
        if find_all:
            return [found] if found else []
        return found or []

    def list(self, ignore_patterns):
        yield self.NAME, self.storage


def sources_fingerprint() -> str:
    """A digest of every static source file's path, size and modification time (what the
    finders would collect), in hex."""
    from django.contrib.staticfiles import finders

    digest = hashlib.sha256()
    for finder in finders.get_finders():
        for path, storage in sorted(finder.list(None), key=lambda item: item[0]):
            full = storage.path(path)
            st = os.stat(full)
            digest.update(f"{getattr(storage, 'prefix', '') or ''}/{path}\0{st.st_size}\0"
                          f"{st.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def collect_if_changed(stdout=None) -> bool:
    """Run ``collectstatic`` when the sources changed since the last collection into
    ``STATIC_ROOT`` (their fingerprint is kept beside the collected files); returns True when it
    ran. A few seconds the first time (brotli of plotly.min.js), milliseconds after."""
    from django.conf import settings
    from django.core.management import call_command

    root = Path(settings.STATIC_ROOT)
    stamp = root / STAMP
    wanted = sources_fingerprint()
    if stamp.exists() and stamp.read_text().strip() == wanted and \
            (root / "staticfiles.json").exists():
        return False
    call_command("collectstatic", interactive=False, verbosity=0, stdout=stdout)
    stamp.write_text(wanted + "\n")
    return True
