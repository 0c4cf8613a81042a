import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "memoryproject.settings")
application = get_asgi_application()

from core.db import limit_web_statements  # noqa: E402 (after the apps are ready)

limit_web_statements()  # a request's statement cannot hold a connection for minutes
