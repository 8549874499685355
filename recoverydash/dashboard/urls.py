"""Dashboard URLs (server-rendered pages for on-call people)."""

urlpatterns: list = []
