from django.apps import AppConfig


class StorageConfig(AppConfig):
    name = "recoverydash.storage"
    label = "storage"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.db import transaction
        from django.db.models.signals import post_save

        from recoverydash.storage.models import StorageLocation

        def location_saved(sender, instance, **kwargs):
            # However it was declared (dashboard, command, admin): what was outside the
            # project's locations, or could not be verified with the old credentials, is
            # looked at again.
            from recoverydash.storage.verification import reverify_outside

            project_id = instance.project_id
            transaction.on_commit(lambda: reverify_outside(project_id))

        post_save.connect(location_saved, sender=StorageLocation, weak=False,
                          dispatch_uid="storage.location_saved")
