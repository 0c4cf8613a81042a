"""Django's PostgreSQL backend, with the embedded server started on first connection.

``ENGINE: "core.db_backend"`` (settings use it when ``DATABASE_URL`` is unset): see
``base.py``.
"""
