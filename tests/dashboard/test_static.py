"""Static files: hashed names, gzip and brotli copies, cached for ever (WhiteNoise over
``recoverydash.dashboard.staticfiles``); before anything was collected, the plain names served
from the finders."""

from __future__ import annotations

import gzip

import brotli
import pytest
from django.test import Client, override_settings

# the dashboard's own files only: plotly.min.js takes tens of seconds to brotli
OWN = ["django.contrib.staticfiles.finders.FileSystemFinder"]


@pytest.fixture
def collected(tmp_path):
    from recoverydash.dashboard.staticfiles import collect_if_changed

    with override_settings(STATIC_ROOT=tmp_path / "static", STATICFILES_FINDERS=OWN):
        assert collect_if_changed() is True
        assert collect_if_changed() is False  # nothing changed: nothing collected again
        yield tmp_path / "static"


def _css_url(html: str) -> str:
    import re

    return re.search(r'href="(/static/dashboard/dashboard[^"]*\.css)"', html).group(1)


@pytest.mark.django_db
def test_pages_name_hashed_files_served_compressed_and_cached_for_ever(collected):
    c = Client()
    url = _css_url(c.get("/login/").content.decode())
    assert url != "/static/dashboard/dashboard.css" and len(url.split(".")) == 3  # name.hash.css
    source = collected.glob("dashboard/dashboard.*.css")
    plain = next(p for p in source if not p.name.endswith((".gz", ".br"))).read_bytes()
    br = c.get(url, HTTP_ACCEPT_ENCODING="gzip, deflate, br")
    assert br["Content-Encoding"] == "br"
    assert br["Cache-Control"] == "max-age=315360000, public, immutable"
    assert brotli.decompress(b"".join(br.streaming_content)) == plain
    gz = c.get(url, HTTP_ACCEPT_ENCODING="gzip")
    assert gz["Content-Encoding"] == "gzip"
    assert gzip.decompress(b"".join(gz.streaming_content)) == plain
    assert len(b"".join(c.get(url, HTTP_ACCEPT_ENCODING="br").streaming_content)) < \
        len(plain) / 3


@pytest.mark.django_db
def test_before_anything_is_collected_pages_name_the_plain_files(tmp_path):
    with override_settings(STATIC_ROOT=tmp_path / "empty"):
        (tmp_path / "empty").mkdir()
        c = Client()
        url = _css_url(c.get("/login/").content.decode())
        assert url == "/static/dashboard/dashboard.css"
        assert c.get(url).status_code == 200


def test_plotly_is_found_alone_of_its_package():
    from django.contrib.staticfiles import finders

    from recoverydash.dashboard.staticfiles import PlotlyFinder

    finder = PlotlyFinder()
    assert [name for name, _ in finder.list(None)] == ["plotly.min.js"]
    assert finders.find("vendor/plotly/plotly.min.js").endswith("package_data/plotly.min.js")
    assert finders.find("vendor/plotly/widgetbundle.js") is None


@pytest.mark.django_db
def test_a_new_collection_compresses_only_the_files_that_changed(tmp_path, settings):
    import os
    import shutil

    from recoverydash.dashboard.staticfiles import collect_if_changed

    source = tmp_path / "src"
    shutil.copytree(settings.BASE_DIR / "static", source)
    root = tmp_path / "static"
    with override_settings(STATIC_ROOT=root, STATICFILES_FINDERS=OWN,
                           STATICFILES_DIRS=[source]):
        assert collect_if_changed() is True
        (css_br,) = root.glob("dashboard/dashboard.*.css.br")
        (live_br,) = root.glob("dashboard/live.*.js.br")
        os.utime(css_br, (1, 1))
        os.utime(live_br, (1, 1))
        with open(source / "dashboard" / "live.js", "a") as f:
            f.write("\n/* changed */\n")
        assert collect_if_changed() is True
        assert css_br.stat().st_mtime == 1  # unchanged content: not compressed again
        (new_live_br,) = [p for p in root.glob("dashboard/live.*.js.br") if p != live_br]
        assert new_live_br.stat().st_mtime > 1
