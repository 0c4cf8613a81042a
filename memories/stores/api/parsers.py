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


def yaml_load(text: str) -> Any:
    """One YAML document (the API's and the admin's store configuration)."""
    return yaml.load(text, Loader=_Loader)  # noqa: S506  (a safe loader)


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
