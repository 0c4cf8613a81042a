"""YAML in and out for the configuration endpoint (``application/yaml``)."""

from __future__ import annotations

import json
import re
from typing import Any

import yaml
from rest_framework.exceptions import ParseError
from rest_framework.parsers import BaseParser
from rest_framework.renderers import BaseRenderer
from rest_framework.utils.encoders import JSONEncoder

from core.api.parsers import check_parsed, too_deep


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader, reading ``5e-1`` and ``1e3`` as numbers (YAML 1.2 and JSON
    do; PyYAML's YAML 1.1 wants a dot, and took them for text, which a number field
    refuses)."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


# Values aliases may repeat, in all. An alias costs nothing to parse and everything to
# expand: seven levels of ten aliases each (a 428-byte body) made ten million values, which
# the checks and the validation then walked for 37 s ("billion laughs"). Room for a large
# config's shared anchors (an 11-value embedding block named by 500 stores is 5,000).
YAML_MAX_ALIASED = 20000


def _expanded_size(node: yaml.Node, sizes: dict[int, int], open_: set[int]) -> int:
    """How many values ``node`` stands for with its aliases expanded (memoized per node:
    an aliased node is one object however often it is named)."""
    key = id(node)
    if key in sizes:
        return sizes[key]
    if key in open_:
        raise yaml.YAMLError("A YAML alias may not refer to a node that contains it.")
    open_.add(key)
    children: list[yaml.Node] = []
    if isinstance(node, yaml.SequenceNode):
        children = node.value
    elif isinstance(node, yaml.MappingNode):
        children = [part for pair in node.value for part in pair]
    sizes[key] = 1 + sum(_expanded_size(child, sizes, open_) for child in children)
    open_.discard(key)
    return sizes[key]


def _refuse_alias_bombs(node: yaml.Node) -> None:
    sizes: dict[int, int] = {}
    expanded = _expanded_size(node, sizes, set())
    repeated = expanded - len(sizes)  # values written once count once
    if repeated > YAML_MAX_ALIASED:
        raise yaml.YAMLError(
            f"YAML aliases may repeat at most {YAML_MAX_ALIASED:,} values in all;"
            f" these repeat {repeated:,}."
        )


def yaml_load(text: str) -> Any:
    """One YAML document (the API's, the admin's and ``load_memory_config``'s store
    configuration). Its aliases are counted on the parsed nodes, before anything is
    built from them: past ``YAML_MAX_ALIASED`` repeated values it raises ``YAMLError``."""
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _refuse_alias_bombs(node)
        return loader.construct_document(node)
    finally:
        loader.dispose()


class YAMLParser(BaseParser):
    media_type = "application/yaml"

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        try:
            data = yaml_load(stream.read().decode("utf-8"))
        except (yaml.YAMLError, UnicodeDecodeError) as exc:
            raise ParseError(f"YAML parse error: {exc}") from exc
        except RecursionError:
            raise too_deep() from None
        return check_parsed(data)


class TextYAMLParser(YAMLParser):
    media_type = "text/yaml"


class XYAMLParser(YAMLParser):
    media_type = "application/x-yaml"


class YAMLRenderer(BaseRenderer):
    media_type = "application/yaml"
    format = "yaml"
    charset = "utf-8"

    def render(
        self, data: Any, accepted_media_type: Any = None, renderer_context: Any = None
    ) -> bytes:
        if data is None:
            return b""
        # Plain types first: error answers carry DRF's ErrorDetail (a str subclass
        # yaml cannot represent), and UUIDs or dates would be tagged Python objects.
        plain = json.loads(json.dumps(data, cls=JSONEncoder))
        return yaml.safe_dump(plain, sort_keys=False, allow_unicode=True).encode("utf-8")
