from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from core.views import healthz, metrics
from memories.tools.mcp_http import MCPSlashView, MCPView

urlpatterns = [
    path("admin/", admin.site.urls),
    path("healthz", healthz, name="healthz"),
    path("metrics", metrics, name="metrics"),
    path("", include("memories.proxy.api.urls")),
    path("mcp", MCPView.as_view(), name="mcp"),
    path("mcp/", MCPSlashView.as_view()),
    path("api/v1/", include("memories.facts.api.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="swagger-ui"),
    path("api/v1/", include("core.api.urls")),
    path("api/v1/", include("knowledge.api.urls")),
    path("api/v1/", include("memories.conversations.api.urls")),
    path("api/v1/", include("memories.bases.api.urls")),
    path("api/v1/", include("memories.stores.api.urls")),
    path("api/v1/", include("memories.engine.api.urls")),
    path("api/v1/", include("memories.tools.api.urls")),
    path("api/v1/", include("ingestion.api.urls")),
    path("api/v1/engine/", include("memories.engine.api.background_urls")),
]

handler400 = "core.api.errors.json_400"
handler404 = "core.api.errors.json_404"
handler500 = "core.api.errors.json_500"
