"""docs/api.md is the reference page of the OpenAPI document the current broker serves.

Regenerate it after changing a route or schema:
    PVISOR_API_DOCS_BLESS=1 <clients venv>/bin/python -m pytest tests/clients/test_api_docs.py
"""

from __future__ import annotations

import importlib.util
import os

from conftest import REPO_ROOT

PAGE = REPO_ROOT / "docs" / "api.md"


def generator():
    spec = importlib.util.spec_from_file_location("api_docs", REPO_ROOT / "scripts" / "api_docs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_api_reference_page_matches_the_served_document(server, api):
    r = api.get("/openapi.json")
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["paths"], "the broker serves an OpenAPI document with paths"
    page = generator().render(doc)
    if os.environ.get("PVISOR_API_DOCS_BLESS"):
        PAGE.parent.mkdir(exist_ok=True)
        PAGE.write_text(page)
    assert PAGE.is_file(), f"{PAGE} is missing: run with PVISOR_API_DOCS_BLESS=1"
    assert PAGE.read_text() == page, (
        f"{PAGE} differs from what the broker serves at /openapi.json: regenerate it with "
        f"PVISOR_API_DOCS_BLESS=1 (see this file's docstring)"
    )
    for op in ("POST /v1/sandboxes", "GET /v1/sandboxes/{id}", "DELETE /v1/sandboxes/{id}"):
        assert f"### `{op}`" in page, op
