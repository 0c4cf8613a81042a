"""The registry of memory store types and the strict config classes they validate with.

A type is a name, a config class (a DRF serializer; ``StrictConfig`` refuses unknown
keys), a factory that builds the store's backend, a one-line summary and whether it is
read-only. ``register_memory_store`` is the one way in; a name registered twice raises.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rest_framework import serializers
from rest_framework.exceptions import ErrorDetail
from rest_framework.fields import empty

if TYPE_CHECKING:
    from memories.stores.backends.base import StoreBackend
    from memories.stores.models import MemoryStore

Factory = Callable[["MemoryStore", dict[str, Any]], "StoreBackend"]


class StrictConfig(serializers.Serializer):
    """A config serializer that refuses keys it does not declare (a typo in a YAML
    file is an error, not a silently ignored setting). Nested ``StrictConfig``
    fields are strict too."""

    def to_internal_value(self, data: Any) -> Any:
        unknown: dict[str, list[str]] = {}
        if isinstance(data, Mapping):
            unknown = {str(key): ["unknown field"] for key in data if key not in self.fields}
        try:
            value = super().to_internal_value(data)
        except serializers.ValidationError as exc:
            if unknown and isinstance(exc.detail, dict):
                raise serializers.ValidationError({**exc.detail, **unknown}) from exc
            raise
        if unknown:
            raise serializers.ValidationError(unknown)
        return value


@dataclass(frozen=True)
class StoreType:
    name: str
    config_cls: type[serializers.Serializer]
    factory: Factory
    summary: str
    read_only: bool = False

    @property
    def embeds(self) -> bool:
        """A type whose config has an ``embedding`` field embeds (and records its model)."""
        return "embedding" in self.config_cls().fields

    def validate(self, config: Any) -> tuple[dict[str, Any] | None, dict[str, list[str]]]:
        """(validated config, {} ) or (None, {dotted path: [messages]})."""
        serializer = self.config_cls(data=config if config is not None else {})
        if serializer.is_valid():
            return _plain(serializer.validated_data), {}
        return None, flatten_errors(serializer.errors)

    def field_specs(self) -> list[dict[str, Any]]:
        return field_specs(self.config_cls())


class StoreTypeError(ValueError):
    pass


_registry: dict[str, StoreType] = {}


def register_memory_store(
    name: str,
    *,
    config_cls: type[serializers.Serializer],
    factory: Factory,
    summary: str,
    read_only: bool = False,
) -> StoreType:
    """Register a store type. Raises ``StoreTypeError`` if ``name`` is taken."""
    if name in _registry:
        raise StoreTypeError(f"memory store type {name!r} is already registered")
    store_type = StoreType(name, config_cls, factory, summary, read_only)
    _registry[name] = store_type
    return store_type


def unregister_memory_store(name: str) -> None:
    """Remove a type (tests, plugins being unloaded); stores of it stop working."""
    _registry.pop(name, None)


def store_type(name: str) -> StoreType | None:
    return _registry.get(name)


def store_types() -> list[StoreType]:
    return sorted(_registry.values(), key=lambda t: t.name)


# --- helpers ------------------------------------------------------------------------
def _plain(value: Any) -> Any:
    """Validated data as plain JSON values (dicts, lists, str, numbers, bools)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _walk_errors(detail: Any, path: str) -> Iterator[tuple[str, str]]:
    if isinstance(detail, Mapping):
        for key, sub in detail.items():
            if key == "non_field_errors":
                yield from _walk_errors(sub, path)
            elif isinstance(key, int):  # ListField and many=True report {index: errors}
                yield from _walk_errors(sub, f"{path}[{key}]")
            else:
                yield from _walk_errors(sub, f"{path}.{key}" if path else str(key))
    elif (
        isinstance(detail, list)
        and detail
        and not all(isinstance(d, str | ErrorDetail) for d in detail)
    ):
        for index, sub in enumerate(detail):
            if sub:  # valid entries of a list come back as {}
                yield from _walk_errors(sub, f"{path}[{index}]")
    elif isinstance(detail, list):
        for message in detail:
            yield path, str(message)
    else:
        yield path, str(detail)


def flatten_errors(detail: Any, prefix: str = "") -> dict[str, list[str]]:
    """DRF's nested error detail as {"a.b[2].c": [messages]}, prefixed with ``prefix``."""
    out: dict[str, list[str]] = {}
    for path, message in _walk_errors(detail, ""):
        full = prefix + ("." + path if prefix and path else path)
        out.setdefault(full or prefix, []).append(message)
    return out


_TYPES = {
    serializers.BooleanField: "boolean",
    serializers.IntegerField: "integer",
    serializers.FloatField: "number",
    serializers.ChoiceField: "choice",
    serializers.DictField: "object",
    serializers.JSONField: "json",
    serializers.CharField: "string",
}


def _spec(name: str, field: serializers.Field) -> dict[str, Any]:
    spec: dict[str, Any] = {"name": name, "required": bool(field.required)}
    if isinstance(field, serializers.ListSerializer):
        child = field.child
        assert isinstance(child, serializers.Serializer)
        spec.update(type="list", fields=field_specs(child))
    elif isinstance(field, serializers.Serializer):
        spec.update(type="object", fields=field_specs(field))
    elif isinstance(field, serializers.ListField):
        spec.update(type="list", items=_spec("item", field.child)["type"])
    else:
        spec["type"] = next((t for cls, t in _TYPES.items() if isinstance(field, cls)), "string")
    if isinstance(field, serializers.ChoiceField):
        spec["choices"] = list(field.choices)
    if field.default is not empty:
        default = field.default() if callable(field.default) else field.default
        spec["default"] = _plain(default)
    for attr in ("min_value", "max_value"):
        if getattr(field, attr, None) is not None:
            spec[attr] = getattr(field, attr)
    if field.help_text:
        spec["help"] = str(field.help_text)
    return spec


def field_specs(serializer: serializers.Serializer) -> list[dict[str, Any]]:
    """What a UI needs to offer a config: name, type, required, default, choices, help."""
    return [_spec(name, field) for name, field in serializer.fields.items()]
