from django.apps import AppConfig


class StorageConfig(AppConfig):
    name = "recoverydash.storage"
    label = "storage"
    default_auto_field = "django.db.models.BigAutoField"
