"""Brain: a small per-agent knowledge store in Redis (pages with id, title and text).

Storage (one hash per agent, so an agent's pages never mix with another's):

- ``brain:{<agent_id>}:pages`` hash ``page_id`` -> JSON ``{"id", "title",
  "text", "updated_at"}`` (orjson). ``updated_at`` is epoch seconds.

Pages are written by the control plane (``BrainStore.add_page``,
``control.workflow.WorkflowClient.add_brain_page``, or ``python -m
control.workflow_cli brain-add``); agents only read them through the read-only
``recall`` and ``get_page`` tools (``worker.tools.brain``).

Ranking (``BrainStore.search``), BM25 (Robertson/Sparck Jones; the variant
Lucene uses) over each page's title and text:

- tokens: lower-cased ``\\w+`` runs (Unicode letters and digits), English
  stop words dropped (``STOP_WORDS``); the query is tokenized the same way and
  repeated query terms count once;
- the title weighs ``TITLE_WEIGHT`` (= 2) times the text: a page's term
  frequency is ``2 * tf(title) + tf(text)`` and its length is
  ``2 * len(title) + len(text)`` in tokens;
- ``score(page) = sum over query terms t of idf(t) * tf * (k1 + 1) /
  (tf + k1 * (1 - b + b * len / avg_len))`` with ``k1 = 1.2`` and ``b = 0.75``,
  ``idf(t) = ln(1 + (N - df + 0.5) / (df + 0.5))`` (always positive);
- pages with score 0 (no query term) are left out; ties are broken by the
  number of distinct query terms matched, then by title, then by id, so the
  order is deterministic.

The store is meant for small knowledge bases: a search reads every page of
the agent (at most ``MAX_PAGES``, each at most ``MAX_PAGE_CHARS`` characters).
"""

from __future__ import annotations

import math
import re
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from typing import Any

import orjson
import redis

from worker.errors import AgentRuntimeError

MAX_PAGES = 2_000
MAX_PAGE_CHARS = 1_000_000
MAX_TITLE_CHARS = 300
TITLE_WEIGHT = 2
BM25_K1 = 1.2
BM25_B = 0.75
SNIPPET_CHARS = 240
PAGE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")
_TOKEN = re.compile(r"\w+", re.UNICODE)
STOP_WORDS = frozenset(
    "a an and are as at be but by for from has have how in is it its of on or that the this to was what when "
    "where which who why will with".split()
)


class BrainError(AgentRuntimeError, ValueError):
    """A bad page (id, title or size) or a store over its page limit."""


def brain_key(agent_id: str) -> str:
    """Redis key of an agent's pages hash."""
    return f"brain:{{{agent_id}}}:pages"


def tokenize(text: str) -> list[str]:
    """Lower-cased word tokens of ``text`` without stop words: ``"The Tide, tides!"`` -> ``["tide", "tides"]``."""
    return [t for t in _TOKEN.findall(text.lower()) if t not in STOP_WORDS]


@dataclass(frozen=True)
class Page:
    """One Brain page."""

    id: str
    title: str
    text: str
    updated_at: float = 0.0

    def to_json(self) -> dict[str, Any]:
        """JSON form (id, title, text, timestamps)."""
        return {"id": self.id, "title": self.title, "text": self.text, "updated_at": self.updated_at}


@dataclass(frozen=True)
class Hit:
    """A search result: the page's id and title, its BM25 score, matched terms and a snippet of its text."""

    id: str
    title: str
    score: float
    matched: tuple[str, ...]
    snippet: str
    chars: int

    def to_json(self) -> dict[str, Any]:
        """JSON form of a search hit (id, title, snippet, score)."""
        return {
            "id": self.id,
            "title": self.title,
            "score": round(self.score, 4),
            "matched": list(self.matched),
            "snippet": self.snippet,
            "chars": self.chars,
        }


def snippet(text: str, terms: set[str], width: int = SNIPPET_CHARS) -> str:
    """About ``width`` characters of ``text`` around the first occurrence of any of ``terms``.

    Whitespace is collapsed; ``…`` marks a cut at either end. Without a match
    the text's beginning is returned.
    """
    flat = " ".join(text.split())
    start = 0
    for m in _TOKEN.finditer(flat):
        if m.group(0).lower() in terms:
            start = max(0, m.start() - width // 3)
            break
    if start > 0:  # start on a word boundary
        space = flat.find(" ", start)
        start = space + 1 if 0 <= space < start + 20 else start
    end = min(len(flat), start + width)
    if end < len(flat):
        space = flat.rfind(" ", start, end)
        end = space if space > start + width // 2 else end
    out = flat[start:end]
    return ("…" if start > 0 else "") + out + ("…" if end < len(flat) else "")


class BrainStore:
    """An agent's pages in Redis. ``redis`` is a ``redis.Redis`` client (bytes responses)."""

    def __init__(self, redis: redis.Redis, agent_id: str):
        self.r = redis
        self.agent_id = agent_id
        self.key = brain_key(agent_id)

    # ----- writing (control plane) ---------------------------------------
    def add_page(self, title: str, text: str, page_id: str | None = None) -> Page:
        """Create or replace a page; returns it. ``page_id`` defaults to a new ``p_<hex>`` id.

        Raises ``BrainError`` when the id breaks ``PAGE_ID``, the title is empty
        or longer than ``MAX_TITLE_CHARS``, the text is longer than
        ``MAX_PAGE_CHARS``, or a new page would exceed ``MAX_PAGES``.
        """
        pid = page_id or f"p_{uuid.uuid4().hex[:12]}"
        if not PAGE_ID.match(pid):
            raise BrainError(f"page id {pid!r} must match {PAGE_ID.pattern}")
        title = " ".join((title or "").split())
        if not title or len(title) > MAX_TITLE_CHARS:
            raise BrainError(f"page title must have 1 to {MAX_TITLE_CHARS} characters")
        if len(text) > MAX_PAGE_CHARS:
            raise BrainError(f"page text has {len(text)} characters; the limit is {MAX_PAGE_CHARS}")
        if not self.r.hexists(self.key, pid) and self.r.hlen(self.key) >= MAX_PAGES:
            raise BrainError(f"agent {self.agent_id!r} already has {MAX_PAGES} Brain pages")
        page = Page(pid, title, text, time.time())
        self.r.hset(self.key, pid, orjson.dumps(page.to_json()))
        return page

    def delete_page(self, page_id: str) -> bool:
        """Remove a page; True if it existed."""
        return bool(self.r.hdel(self.key, page_id))

    # ----- reading ----------------------------------------------------------
    def get(self, page_id: str) -> Page | None:
        """The page with that id, or ``None``."""
        raw = self.r.hget(self.key, page_id)
        if not raw:
            return None
        d = orjson.loads(raw)
        return Page(d["id"], d["title"], d["text"], d.get("updated_at", 0.0))

    def pages(self) -> list[Page]:
        """All pages, ordered by id."""
        out = []
        for raw in self.r.hvals(self.key):
            d = orjson.loads(raw)
            out.append(Page(d["id"], d["title"], d["text"], d.get("updated_at", 0.0)))
        return sorted(out, key=lambda p: p.id)

    def count(self) -> int:
        """How many pages the agent's Brain holds."""
        return int(self.r.hlen(self.key))

    def search(self, query: str, limit: int = 5) -> list[Hit]:
        """Rank the agent's pages for ``query`` (BM25 over title + text; see the module docstring).

        Returns at most ``limit`` hits, best first; ``[]`` when the query has no
        searchable term or nothing matches.
        """
        return rank(self.pages(), query, limit)


def rank(pages: list[Page], query: str, limit: int = 5) -> list[Hit]:
    """BM25 ranking of ``pages`` for ``query`` (pure function; rules in the module docstring)."""
    terms = list(dict.fromkeys(tokenize(query)))
    if not terms or not pages:
        return []
    docs: list[tuple[Page, Counter[str], int]] = []
    for page in pages:
        title_tokens = tokenize(page.title)
        text_tokens = tokenize(page.text)
        tf: Counter[str] = Counter(text_tokens)
        for t in title_tokens:
            tf[t] += TITLE_WEIGHT
        docs.append((page, tf, TITLE_WEIGHT * len(title_tokens) + len(text_tokens)))
    n = len(docs)
    avg_len = sum(length for _, _, length in docs) / n or 1.0
    df = {t: sum(1 for _, tf, _ in docs if tf.get(t)) for t in terms}
    idf = {t: math.log(1 + (n - df[t] + 0.5) / (df[t] + 0.5)) for t in terms}
    scored: list[tuple[float, int, Page, tuple[str, ...]]] = []
    for page, tf, length in docs:
        score = 0.0
        matched = []
        norm = BM25_K1 * (1 - BM25_B + BM25_B * length / avg_len)
        for t in terms:
            f = tf.get(t, 0)
            if f:
                matched.append(t)
                score += idf[t] * f * (BM25_K1 + 1) / (f + norm)
        if score > 0:
            scored.append((score, len(matched), page, tuple(matched)))
    scored.sort(key=lambda s: (-s[0], -s[1], s[2].title.lower(), s[2].id))
    return [
        Hit(p.id, p.title, score, matched, snippet(p.text, set(matched)), len(p.text))
        for score, _, p, matched in scored[: max(0, limit)]
    ]
