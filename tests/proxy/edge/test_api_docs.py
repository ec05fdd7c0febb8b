"""The API docs work offline: ``/schema`` is a plain HTML page that loads nothing (no script,
no stylesheet, font or image from anywhere), ``/schema/openapi.json`` is the document, and
litestar's CDN-based pages (Redoc, Swagger UI, Stoplight Elements, RapiDoc) are not served.

Every request here goes through the in-process ASGI transport with every socket connection
and name lookup refused."""

from __future__ import annotations

import re
import socket
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from proxy import package_version
from proxy.app import create_app
from proxy.config.settings import load_settings
from proxy.edge.api_docs import render_page

CDN_HOSTS = ("cdn.jsdelivr.net", "fonts.googleapis.com", "unpkg.com", "cdnjs.cloudflare.com")
# Every src=/href=/action= value and CSS url(...)/@import in the page.
ATTRIBUTE = re.compile(
    r"""\b(?:src|href|action|srcset|poster)\s*=\s*(?:"([^"]*)"|'([^']*)'|([^\s>]+))""", re.I
)
CSS_URL = re.compile(r"""url\(|@import""", re.I)


def off_host_references(page: str) -> list[str]:
    """References that would make the browser fetch something from another host."""
    found = []
    for match in ATTRIBUTE.finditer(page):
        value = next(group for group in match.groups() if group is not None).strip()
        if value.startswith("//") or not value.startswith(("/", "#", "data:")):
            found.append(value)
    found.extend(m.group(0) for m in CSS_URL.finditer(page))
    found.extend(re.findall(r"(?:https?:)?//[a-z0-9.-]+\.[a-z]{2,}", page, re.I))
    return found


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise OSError("the network is disabled in this test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)


async def client_for(overrides: dict[str, Any]) -> AsyncIterator[httpx.AsyncClient]:
    settings = load_settings(env={}, overrides={"upstream.base_url": "http://upstream.test/v1", **overrides})
    app = create_app(settings)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as c:
        yield c
    await app.state.upstream.aclose()


@pytest.fixture
async def client(no_network: None) -> AsyncIterator[httpx.AsyncClient]:
    async for c in client_for({}):
        yield c


def test_the_reference_check_catches_the_cdn_pages() -> None:
    redoc = (
        "<link href='https://fonts.googleapis.com/css?family=Montserrat' rel='stylesheet'>"
        '<script src="https://cdn.jsdelivr.net/npm/redoc@next/bundles/redoc.standalone.js"></script>'
    )
    assert len(off_host_references(redoc)) >= 2
    assert off_host_references('<a href="//cdn.example/x">x</a>')
    assert off_host_references("<style>body { background: url(/x.png) }</style>")
    assert off_host_references('<a href="/schema/openapi.json">JSON</a><a href="#op0">x</a>') == []


async def test_schema_is_a_self_contained_html_page(client: httpx.AsyncClient) -> None:
    for path in ("/schema", "/schema/"):
        response = await client.get(path)
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/html")
        page = response.text
        assert "<script" not in page.lower()
        assert "<iframe" not in page.lower() and "<img" not in page.lower()
        assert not any(host in page for host in CDN_HOSTS)
        assert off_host_references(page) == []
        assert '<a href="/schema/openapi.json">' in page
        assert '<a href="/schema/openapi.yaml">' in page


async def test_the_page_lists_every_operation_and_the_forwarded_routes(client: httpx.AsyncClient) -> None:
    page = (await client.get("/schema")).text
    document = (await client.get("/schema/openapi.json")).json()
    for path, item in document["paths"].items():
        for method in item:
            assert f"<span class='method {method}'>{method.upper()}</span> <code>{path}</code>" in page
    for path in ("/healthz", "/readyz", "/metrics", "/v1/compaction/events"):
        assert f"<code>{path}</code>" in page
    # the compaction events API: its parameters and response codes, its docstring
    for name in ("session", "policy", "since", "limit", "tenant"):
        assert f"<td><code>{name}</code></td><td>query</td><td>no</td>" in page
    assert "<td class=mono>integer, default 100</td>" in page
    assert "<code>400</code>" in page and "With an admin token configured" in page
    # the data plane is not in the document, but the page says where it goes
    for path in ("/v1/chat/completions", "/v1/responses", "/v1/messages"):
        assert path not in document["paths"]
        assert f"<code>{path}</code>" in page
    assert package_version() in page


async def test_the_openapi_document_is_served_as_json_and_yaml(client: httpx.AsyncClient) -> None:
    response = await client.get("/schema/openapi.json")
    assert response.status_code == 200
    assert "json" in response.headers["content-type"]
    document = response.json()
    assert document["openapi"].startswith("3.")
    assert document["info"] == {"title": "compaction-proxy", "version": package_version()}
    assert {"/", "/healthz", "/readyz", "/metrics", "/v1/compaction/events"} <= set(document["paths"])
    assert document["paths"]["/healthz"]["get"]["description"] == "Liveness: the process answers."
    for path in ("/schema/openapi.yaml", "/schema/openapi.yml"):
        yaml = await client.get(path)
        assert yaml.status_code == 200
        assert "openapi: 3." in yaml.text and "/healthz:" in yaml.text


@pytest.mark.parametrize(
    "path",
    [
        "/schema/redoc",
        "/schema/swagger",
        "/schema/elements",
        "/schema/rapidoc",
        "/schema/oauth2-redirect.html",
    ],
)
async def test_the_cdn_pages_are_not_served(client: httpx.AsyncClient, path: str) -> None:
    response = await client.get(path)
    assert response.status_code == 404
    assert "<script" not in response.text.lower()
    assert not any(host in response.text for host in CDN_HOSTS)


async def test_the_admin_token_does_not_gate_the_docs(no_network: None) -> None:
    """As before: the docs and the document are public; only the events API wants the token."""
    async for c in client_for({"server.admin_token": "secret"}):
        assert (await c.get("/schema")).status_code == 200
        assert (await c.get("/schema/openapi.json")).status_code == 200
        assert (await c.get("/v1/compaction/events")).status_code == 401


def test_every_text_of_the_document_is_escaped() -> None:
    hostile = "<script>alert(1)</script>\"'><b onclick=x>"
    document: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {"title": hostile, "version": hostile, "description": hostile},
        "paths": {
            "/items/{id}": {
                "parameters": [{"$ref": "#/components/parameters/Id"}],
                "post": {
                    "tags": [hostile],
                    "summary": hostile,
                    "description": hostile,
                    "deprecated": True,
                    "parameters": [{"name": hostile, "in": "query", "schema": {"enum": [hostile]}}],
                    "requestBody": {
                        "required": True,
                        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Item"}}},
                    },
                    "responses": {
                        "201": {"description": hostile},
                        "404": {"$ref": "#/components/responses/Missing"},
                    },
                },
            }
        },
        "components": {
            "parameters": {
                "Id": {"name": "id", "in": "path", "required": True, "schema": {"type": "integer"}}
            },
            "responses": {"Missing": {"description": "No such item"}},
            "schemas": {"Item": {"type": "object"}},
        },
    }
    page = render_page(
        document, schema_links=[("JSON", "/schema/openapi.json")], forwarded={hostile: hostile}
    )
    assert "<script" not in page and "<b " not in page and "onclick" not in page.replace("onclick=x&gt;", "")
    assert "&lt;script&gt;alert(1)&lt;/script&gt;&quot;&#x27;&gt;&lt;b onclick=x&gt;" in page
    assert off_host_references(page) == []
    # $refs resolved: the path-level parameter, the body schema, the shared response
    assert "<td><code>id</code></td><td>path</td><td>yes</td><td class=mono>integer</td>" in page
    assert "<code>application/json</code> <span class=mono>Item</span>" in page
    assert "No such item" in page and "(required)" in page and "deprecated" in page
