"""The v1 API (django-ninja). Being built: see issue 2."""
from ninja import NinjaAPI

api = NinjaAPI(title="recoverydash API", version="1", urls_namespace="api-v1")
