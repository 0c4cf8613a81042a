from django.urls import path

from memories.stores.api import views

urlpatterns = [
    path("memory-store-types", views.StoreTypesView.as_view(), name="memory-store-types"),
    path("memory-stores", views.StoreListView.as_view(), name="memory-store-list"),
    path(
        "memory-stores/<uuid:store_id>",
        views.StoreDetailView.as_view(),
        name="memory-store-detail",
    ),
    path(
        "memory-stores/<uuid:store_id>/load",
        views.StoreLoadView.as_view(),
        name="memory-store-load",
    ),
    path(
        "memory-stores/<uuid:store_id>/items",
        views.StoreItemsView.as_view(),
        name="memory-store-items",
    ),
    path(
        "memory-stores/<uuid:store_id>/items/<int:item_id>",
        views.StoreItemDetailView.as_view(),
        name="memory-store-item",
    ),
    path("memory-config", views.MemoryConfigView.as_view(), name="memory-config"),
    path(
        "flows/<uuid:flow_id>/nodes/<str:node_id>/memory",
        views.NodeMemoryView.as_view(),
        name="node-memory-attachments",
    ),
    path(
        "flows/<uuid:flow_id>/nodes/<str:node_id>/memory/retrieve",
        views.NodeMemoryRetrieveView.as_view(),
        name="node-memory-retrieve",
    ),
    path(
        "flows/<uuid:flow_id>/nodes/<str:node_id>/memory/write",
        views.NodeMemoryWriteView.as_view(),
        name="node-memory-write",
    ),
]
