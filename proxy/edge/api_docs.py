"""The API docs page at ``/schema``: a plain HTML rendering of the OpenAPI document.

Litestar's own pages (Redoc, Swagger UI, Stoplight Elements, RapiDoc) load their scripts,
styles and fonts from CDNs, so they are blank on an offline or locked-down host. This page
is a single self-contained document: no script, inline CSS only, no URL off the host (every
link is a path on this server or an in-page anchor). Every text taken from the document is
escaped.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from litestar.openapi import OpenAPIConfig
from litestar.openapi.plugins import JsonRenderPlugin, OpenAPIRenderPlugin, YamlRenderPlugin

from proxy.dialects import Door

if TYPE_CHECKING:
    from litestar.connection import Request

METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")

_STYLE = """
body { font: 15px/1.45 system-ui, sans-serif; margin: 0 auto; max-width: 64rem; padding: 1rem 1.5rem;
  color: #1d1d1f; background: #fff; }
h1 { margin-bottom: .2rem; } h2 { border-bottom: 1px solid #ccc; margin-top: 2.2rem; }
code, .mono { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: .92em; }
.op { border: 1px solid #ddd; border-radius: 6px; padding: .2rem 1rem .8rem; margin: 1rem 0; }
.op h3 { font-size: 1.05rem; }
.method { display: inline-block; min-width: 4.2em; text-align: center; border-radius: 4px;
  padding: 0 .4em; color: #fff; background: #555; font-weight: 600; }
.get { background: #1f6feb; } .post { background: #1a7f37; } .put, .patch { background: #9a6700; }
.delete { background: #cf222e; } .head, .options { background: #6e7781; }
.desc { white-space: pre-line; } .deprecated { color: #cf222e; font-weight: 600; }
.muted { color: #57606a; }
table { border-collapse: collapse; margin: .3rem 0 .6rem; }
th, td { border: 1px solid #ddd; padding: .25rem .6rem; text-align: left; vertical-align: top; }
th { background: #f6f8fa; }
"""


def esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def anchor(index: int, method: str, path: str) -> str:
    """A unique element id made of letters, digits and dashes only (safe in ``id`` and ``href``)."""
    return f"op{index}-" + re.sub(r"[^A-Za-z0-9]+", "-", f"{method}-{path}").strip("-").lower()


def resolve(document: Mapping[str, Any], node: Any) -> Any:
    """Follow a local ``$ref`` (``#/components/...``); anything else comes back as it is."""
    seen = 0
    while isinstance(node, Mapping) and isinstance(node.get("$ref"), str) and seen < 20:
        ref: str = node["$ref"]
        if not ref.startswith("#/"):
            return node
        target: Any = document
        for key in ref[2:].split("/"):
            key = key.replace("~1", "/").replace("~0", "~")
            target = target.get(key) if isinstance(target, Mapping) else None
        if target is None:
            return node
        node, seen = target, seen + 1
    return node


def schema_type(schema: Any, depth: int = 0) -> str:
    """A short type text for a JSON Schema: ``string``, ``integer | null``, ``array of Foo``."""
    if not isinstance(schema, Mapping) or depth > 4:
        return "any"
    if isinstance(schema.get("$ref"), str):
        return str(schema["$ref"]).rsplit("/", 1)[-1]
    for key in ("oneOf", "anyOf"):
        if isinstance(schema.get(key), list):
            return " | ".join(dict.fromkeys(schema_type(s, depth + 1) for s in schema[key]))
    if isinstance(schema.get("allOf"), list):
        return " & ".join(schema_type(s, depth + 1) for s in schema["allOf"])
    kind = schema.get("type")
    kinds = [str(k) for k in kind] if isinstance(kind, list) else [str(kind)] if kind else []
    if "array" in kinds and isinstance(schema.get("items"), Mapping):
        kinds[kinds.index("array")] = f"array of {schema_type(schema['items'], depth + 1)}"
    text = " | ".join(kinds) or ("object" if "properties" in schema else "any")
    if isinstance(schema.get("enum"), list):
        text += " (one of: " + ", ".join(str(v) for v in schema["enum"]) + ")"
    if "default" in schema:
        text += f", default {schema['default']!r}"
    return text


def operations(document: Mapping[str, Any]) -> list[tuple[str, str, Mapping[str, Any]]]:
    """``(path, method, operation)`` in the document's order."""
    found = []
    paths = document.get("paths")
    for path, item in paths.items() if isinstance(paths, Mapping) else ():
        item = resolve(document, item)
        if not isinstance(item, Mapping):
            continue
        for method in METHODS:
            operation = item.get(method)
            if isinstance(operation, Mapping):
                found.append((str(path), method, operation))
    return found


def grouped(
    ops: list[tuple[str, str, Mapping[str, Any]]],
) -> dict[str, list[tuple[str, str, Mapping[str, Any]]]]:
    """By first tag when the document has tags, otherwise by path."""
    tagged = any(op.get("tags") for _, _, op in ops)
    groups: dict[str, list[tuple[str, str, Mapping[str, Any]]]] = {}
    for path, method, op in ops:
        tags = op.get("tags")
        key = (str(tags[0]) if tags else "Other") if tagged else path
        groups.setdefault(key, []).append((path, method, op))
    return groups


def parameters_table(document: Mapping[str, Any], path_item: Any, op: Mapping[str, Any]) -> str:
    params: dict[tuple[str, str], Mapping[str, Any]] = {}
    shared = path_item.get("parameters") if isinstance(path_item, Mapping) else None
    for raw in [*(shared or []), *(op.get("parameters") or [])]:
        param = resolve(document, raw)
        if isinstance(param, Mapping):
            params[(str(param.get("name")), str(param.get("in")))] = param
    if not params:
        return ""
    rows = "".join(
        f"<tr><td><code>{esc(name)}</code></td><td>{esc(where)}</td>"
        f"<td>{'yes' if p.get('required') else 'no'}</td>"
        f"<td class=mono>{esc(schema_type(p.get('schema')))}</td>"
        f"<td class=desc>{esc(p.get('description', ''))}</td></tr>"
        for (name, where), p in params.items()
    )
    return (
        "<h4>Parameters</h4><table><tr><th>Name</th><th>In</th><th>Required</th><th>Type</th>"
        f"<th>Description</th></tr>{rows}</table>"
    )


def content_rows(content: Any) -> Iterable[tuple[str, str]]:
    for media, body in content.items() if isinstance(content, Mapping) else ():
        schema = body.get("schema") if isinstance(body, Mapping) else None
        yield str(media), schema_type(schema) if schema else ""


def body_section(document: Mapping[str, Any], op: Mapping[str, Any]) -> str:
    body = resolve(document, op.get("requestBody"))
    if not isinstance(body, Mapping):
        return ""
    required = "required" if body.get("required") else "optional"
    items = "".join(
        f"<li><code>{esc(media)}</code> <span class=mono>{esc(kind)}</span></li>"
        for media, kind in content_rows(body.get("content"))
    )
    description = f"<p class=desc>{esc(body['description'])}</p>" if body.get("description") else ""
    return f"<h4>Request body <span class=muted>({required})</span></h4>{description}<ul>{items}</ul>"


def responses_table(document: Mapping[str, Any], op: Mapping[str, Any]) -> str:
    responses = op.get("responses")
    if not isinstance(responses, Mapping) or not responses:
        return ""
    rows = []
    for code, raw in responses.items():
        response = resolve(document, raw)
        response = response if isinstance(response, Mapping) else {}
        media = ", ".join(
            f"{media} ({kind})" if kind else media for media, kind in content_rows(response.get("content"))
        )
        rows.append(
            f"<tr><td><code>{esc(code)}</code></td><td class=desc>{esc(response.get('description', ''))}"
            f"</td><td class=mono>{esc(media)}</td></tr>"
        )
    return (
        "<h4>Responses</h4><table><tr><th>Code</th><th>Description</th><th>Content</th></tr>"
        + "".join(rows)
        + "</table>"
    )


def operation_section(
    document: Mapping[str, Any], ident: str, path: str, method: str, op: Mapping[str, Any]
) -> str:
    path_item = resolve(document, document["paths"][path])
    summary = f" &mdash; {esc(op['summary'])}" if op.get("summary") else ""
    deprecated = " <span class=deprecated>deprecated</span>" if op.get("deprecated") else ""
    description = f"<p class=desc>{esc(op['description'])}</p>" if op.get("description") else ""
    return (
        f'<section class=op id="{ident}">'
        f"<h3><span class='method {esc(method)}'>{esc(method.upper())}</span> "
        f"<code>{esc(path)}</code>{summary}{deprecated}</h3>{description}"
        + parameters_table(document, path_item, op)
        + body_section(document, op)
        + responses_table(document, op)
        + "</section>"
    )


def render_page(
    document: Mapping[str, Any],
    *,
    schema_links: Sequence[tuple[str, str]],
    forwarded: Mapping[str, str] | None = None,
) -> str:
    """The whole page. ``schema_links``: (label, same-host path) of the machine-readable
    documents; ``forwarded``: paths served outside the OpenAPI document (path -> what)."""
    raw_info = document.get("info")
    info: Mapping[str, Any] = raw_info if isinstance(raw_info, Mapping) else {}
    title = str(info.get("title") or "API")
    version = str(info.get("version") or "")
    ops = operations(document)
    ids = {(path, method): anchor(i, method, path) for i, (path, method, _) in enumerate(ops)}
    links = " &middot; ".join(f'<a href="{esc(href)}">{esc(label)}</a>' for label, href in schema_links)
    toc = "".join(
        f'<li><a href="#{ids[path, method]}"><code>{esc(method.upper())} {esc(path)}</code></a>'
        + (f" &mdash; {esc(op['summary'])}" if op.get("summary") else "")
        + "</li>"
        for path, method, op in ops
    )
    parts = [
        "<!DOCTYPE html><html lang=en><head><meta charset=utf-8>",
        "<meta name=viewport content='width=device-width, initial-scale=1'>",
        "<link rel=icon href='data:,'>",
        f"<title>{esc(title)} API</title><style>{_STYLE}</style></head><body>",
        f"<h1>{esc(title)} API</h1><p class=muted>Version {esc(version)} &middot; OpenAPI "
        f"{esc(document.get('openapi', ''))}</p>",
        f"<p>Machine-readable document: {links}</p>" if links else "",
        f"<p class=desc>{esc(info['description'])}</p>" if info.get("description") else "",
        f"<h2>Operations</h2><ul>{toc}</ul>" if toc else "<p>No operations.</p>",
    ]
    for group, members in grouped(ops).items():
        parts.append(f"<h2>{esc(group)}</h2>")
        parts.extend(
            operation_section(document, ids[path, method], path, method, op) for path, method, op in members
        )
    if forwarded:
        rows = "".join(
            f"<tr><td><code>{esc(path)}</code></td><td>{esc(what)}</td></tr>"
            for path, what in forwarded.items()
        )
        parts.append(
            "<h2>Forwarded upstream</h2><p>These paths are not in the OpenAPI document: their requests "
            "and responses are the upstream API's.</p>"
            f"<table><tr><th>Path</th><th>Handling</th></tr>{rows}</table>"
        )
    parts.append("</body></html>")
    return "".join(parts)


class PlainDocsRenderPlugin(OpenAPIRenderPlugin):
    """Serves :func:`render_page` (by default at the schema root, ``/schema``)."""

    def __init__(
        self,
        *,
        path: str | Sequence[str] = "/",
        alternates: Sequence[tuple[str, str]] = (),
        forwarded: Mapping[str, str] | None = None,
    ) -> None:
        """``alternates``: (label, file name next to ``openapi.json``), e.g.
        ``("YAML", "openapi.yaml")``; ``forwarded``: see :func:`render_page`."""
        super().__init__(path=path, favicon="", style="")
        self.alternates = list(alternates)
        self.forwarded = dict(forwarded or {})

    def render(self, request: Request[Any, Any, Any], openapi_schema: dict[str, Any]) -> bytes:
        json_path = self.get_openapi_json_route(request)
        base = json_path.rpartition("/")[0]
        links = [("JSON", json_path)] + [(label, f"{base}/{name}") for label, name in self.alternates]
        return render_page(openapi_schema, schema_links=links, forwarded=self.forwarded).encode()


def data_plane(doors: Sequence[Door]) -> dict[str, str]:
    """The forwarded paths for the page: the compacted routes, then everything else."""
    found = {
        door.path.decode(): f"{door.method.decode()}: {door.title}, compacted, then forwarded"
        for door in doors
    }
    found["/v1/*"] = "Any other method or /v1 path (except /v1/compaction/): forwarded unchanged"
    return found


def openapi_config(version: str, doors: Sequence[Door]) -> OpenAPIConfig:
    """The OpenAPI document at ``/schema/openapi.json`` (and ``.yaml``/``.yml``) and the plain
    page at ``/schema``. Only these: the CDN-based pages (Redoc, Swagger UI, ...) are off."""
    return OpenAPIConfig(
        title="compaction-proxy",
        version=version,
        path="/schema",
        use_handler_docstrings=True,
        render_plugins=[
            PlainDocsRenderPlugin(
                path="/", alternates=[("YAML", "openapi.yaml")], forwarded=data_plane(doors)
            ),
            JsonRenderPlugin(path="/openapi.json"),
            YamlRenderPlugin(path=["/openapi.yaml", "/openapi.yml"]),
        ],
    )
