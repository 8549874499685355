"""recoverydash: the truth about recovery for large training jobs.

This package's ``__init__`` imports nothing heavy on purpose: ``recoverydash.sdk`` and
``recoverydash.recovery`` must work inside a trainer that has neither Django nor Celery installed.
"""

__version__ = "0.1.0"
