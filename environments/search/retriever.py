"""Retrievers for the search-QA environment: one batched interface, an embedded BM25 index and an HTTP client.

    retriever = BM25Retriever("corpus.jsonl")                      # or a list of Passage / dicts
    retriever = HTTPRetriever("http://127.0.0.1:8000")             # a Search-R1-style retrieval server
    results = retriever.search(["who founded Quint Works", "Marrowick"], top_k=3)   # list[list[Passage]]

Corpus JSONL format (one passage per line, UTF-8), either of:

* ``{"id": "doc-17", "title": "Marrowick", "text": "Marrowick is a town ..."}`` (``id`` optional: the line
  number, counted from 0, is used when it is missing);
* ``{"id": "17", "contents": "\\"Marrowick\\"\\nMarrowick is a town ..."}`` — the Search-R1 / FlashRAG wiki-18
  layout, where the first line of ``contents`` is the (double-quoted) title and the rest is the text.

HTTP protocol (Search-R1's ``retrieval_server.py``): ``POST <url>/retrieve`` with the JSON body
``{"queries": [...], "topk": k, "return_scores": true}``; the answer is
``{"result": [[{"document": {...corpus row...}, "score": float}, ...], ...]}``, one inner list per query, each
``document`` a corpus row in one of the layouts above.
"""

from __future__ import annotations

import abc
import hashlib
import json
import logging
import math
import re
import threading
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

__all__ = [
    "BM25Retriever",
    "HTTPRetriever",
    "Passage",
    "Retriever",
    "RetrieverError",
    "STOPWORDS",
    "load_corpus_jsonl",
    "passage_from_record",
    "tokenize",
]

logger = logging.getLogger(__name__)

#: Lucene's English stop words (the list ``bm25s`` also ships); dropped from documents and queries.
STOPWORDS = frozenset(
    "a an and are as at be but by for if in into is it no not of on or such that the their then there these they "
    "this to was will with".split()
)
_TOKEN = re.compile(r"\w+", re.UNICODE)


@dataclass(frozen=True)
class Passage:
    """One retrieved (or indexable) passage.

    id: unique passage id within its corpus; title: the passage title (often an entity name); text: the body;
    score: the retriever's relevance score for the query it answered (higher is better; 0.0 in a corpus listing).
    """

    id: str
    title: str
    text: str
    score: float = 0.0


class RetrieverError(RuntimeError):
    """Retrieval failed: a server that cannot be reached, keeps failing or answers in an unknown format.

    Attributes: ``url`` (the endpoint, or None for a local retriever), ``attempts`` (requests made) and
    ``last_error`` (a description of the last failure).
    """

    def __init__(self, message: str, *, url: str | None = None, attempts: int = 0, last_error: str = ""):
        self.url = url
        self.attempts = attempts
        self.last_error = last_error
        super().__init__(message)


def tokenize(text: str) -> list[str]:
    """Lower-case word tokens of ``text`` without stop words: ``"Where was Velora Quint born?"`` ->
    ``["where", "velora", "quint", "born"]``. The same function tokenises documents and queries."""
    return [tok for tok in _TOKEN.findall(text.lower()) if tok not in STOPWORDS]


def _check_queries(queries: Any, top_k: Any) -> list[str]:
    if isinstance(queries, str) or not isinstance(queries, Sequence):
        raise ValueError(f"queries must be a list of strings (a batch), got {type(queries).__name__}: {queries!r:.80}")
    bad = [i for i, q in enumerate(queries) if not isinstance(q, str)]
    if bad:
        raise ValueError(f"queries must all be strings; items {bad[:5]} are not (first: {queries[bad[0]]!r:.80})")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise ValueError(f"top_k must be a positive int, got {top_k!r}")
    return list(queries)


def passage_from_record(record: Mapping[str, Any], *, default_id: str | None = None, score: float = 0.0) -> Passage:
    """Build a :class:`Passage` from a corpus row in either documented layout (``title``/``text`` or Search-R1's
    ``contents``). The id is ``record["id"]`` (also ``doc_id``, ``docid`` or ``_id``), else ``default_id``, else a
    content hash ``"sha1:<16 hex>"`` so that the same passage always gets the same id.

    Raises:
        ValueError: the row is not a mapping, or has neither ``title``/``text`` nor ``contents`` strings.
    """
    if not isinstance(record, Mapping):
        raise ValueError(f"a corpus row must be a JSON object, got {type(record).__name__}: {record!r:.80}")
    if isinstance(record.get("text"), str):
        title = record.get("title", "")
        if not isinstance(title, str):
            raise ValueError(f"corpus row field 'title' must be a string, got {type(title).__name__}")
        text = record["text"]
    elif isinstance(record.get("contents"), str):
        head, _, text = record["contents"].partition("\n")
        title = head.strip().strip('"')
    else:
        raise ValueError(
            f"corpus row needs 'title' and 'text' strings (or Search-R1's 'contents'), got keys {sorted(record)}"
        )
    doc_id = next((record[k] for k in ("id", "doc_id", "docid", "_id") if record.get(k) is not None), default_id)
    if doc_id is None:
        doc_id = "sha1:" + hashlib.sha1(f"{title}\n{text}".encode()).hexdigest()[:16]
    return Passage(id=str(doc_id), title=title, text=text, score=float(score))


def load_corpus_jsonl(path: str | Path) -> list[Passage]:
    """Read a corpus JSONL file (format in the module docstring); blank lines are skipped.

    Raises:
        FileNotFoundError: no such file.
        ValueError: a line that is not JSON or not a valid row (the message names the line), or duplicate ids.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"corpus file {path} does not exist (expected JSONL with id/title/text per line)")
    passages = []
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                passages.append(passage_from_record(record, default_id=str(lineno - 1)))
            except (json.JSONDecodeError, ValueError) as exc:
                raise ValueError(f"{path}:{lineno}: invalid corpus row: {exc}") from exc
    return passages


class Retriever(abc.ABC):
    """Batched passage retrieval, as Search-R1's retrieval server: ``search(queries, top_k)`` returns, for each
    query, at most ``top_k`` passages, best first.

    ``order_invariant`` is True for retrievers whose results ignore word order and letter case (bag-of-words
    scoring); the environment uses it to build checker paths.
    """

    order_invariant: ClassVar[bool] = False

    @abc.abstractmethod
    def search(self, queries: list[str], top_k: int) -> list[list[Passage]]:
        """Return ``len(queries)`` lists of at most ``top_k`` passages each, best first.

        Raises:
            ValueError: ``queries`` is not a list of strings or ``top_k`` is not a positive int.
            RetrieverError: the backend failed.
        """

    def close(self) -> None:
        """Release connections or other resources. Safe to call twice."""
        return None


class BM25Retriever(Retriever):
    """BM25 over a local corpus, embedded (the ``bm25s`` engine); the index is built once, in the constructor.

    Scoring is Lucene BM25 (``k1``, ``b``) over :func:`tokenize` tokens of ``title + " " + text``. A query is a bag
    of tokens: word order and case do not change its results. Ties are broken by corpus position, so results are
    deterministic; passages with score 0 (no query token in common) are never returned, so a query may return
    fewer than ``top_k`` passages (none at all when it has no known token). The index is read-only after the
    constructor, so one instance can be shared by many environments and threads. Suited to corpora up to a few
    million passages; for Wikipedia-scale dense retrieval, run a retrieval server and use :class:`HTTPRetriever`.

    Args:
        corpus: a sequence of :class:`Passage` or of corpus-row mappings, or the path of a corpus JSONL file.
        k1, b: BM25 parameters (Lucene defaults).
    """

    order_invariant: ClassVar[bool] = True

    def __init__(self, corpus: Sequence[Passage | Mapping[str, Any]] | str | Path, *, k1: float = 1.5, b: float = 0.75):
        import bm25s  # local import: the module is importable (for HTTPRetriever) without bm25s

        if isinstance(corpus, str | Path):
            passages = load_corpus_jsonl(corpus)
        elif isinstance(corpus, Sequence):
            passages = [
                p if isinstance(p, Passage) else passage_from_record(p, default_id=str(i)) for i, p in enumerate(corpus)
            ]
        else:
            raise ValueError(f"corpus must be a list of passages or a JSONL path, got {type(corpus).__name__}")
        if not passages:
            raise ValueError("the corpus is empty: BM25Retriever needs at least one passage")
        ids = [p.id for p in passages]
        if len(set(ids)) != len(ids):
            dups = sorted(i for i, n in Counter(ids).items() if n > 1)
            raise ValueError(f"passage ids must be unique; duplicated: {dups[:5]}")
        self.passages: tuple[Passage, ...] = tuple(Passage(p.id, p.title, p.text, 0.0) for p in passages)
        self._bm25 = bm25s.BM25(k1=k1, b=b)
        self._bm25.index([tokenize(f"{p.title} {p.text}") for p in self.passages], show_progress=False)
        self._vocab: dict[str, int] = self._bm25.vocab_dict

    def __len__(self) -> int:
        return len(self.passages)

    def scores(self, query: str) -> np.ndarray:
        """BM25 score of every passage for ``query``: float32 array of shape ``(len(self),)``.

        ``score(q, d) = sum_{t in q} idf(t) * tf(t, d) * (k1 + 1) / (tf(t, d) + k1 * (1 - b + b * |d| / avgdl))``.
        Query token ids are summed in sorted order, so any permutation of the query gives bit-identical scores.
        """
        token_ids = sorted(self._vocab[t] for t in tokenize(query) if t in self._vocab)
        if not token_ids:
            return np.zeros(len(self.passages), dtype=np.float32)
        return np.asarray(self._bm25.get_scores_from_ids(token_ids), dtype=np.float32)

    def search(self, queries: list[str], top_k: int) -> list[list[Passage]]:
        """Top ``top_k`` passages per query with a positive score, best first (ties: earlier corpus position)."""
        queries = _check_queries(queries, top_k)
        out = []
        for query in queries:
            scores = self.scores(query)
            positive = np.flatnonzero(scores > 0)
            # order by (-score, position): exact and deterministic, even with ties at the cut
            order = positive[np.lexsort((positive, -scores[positive]))][:top_k]
            out.append([self._with_score(int(i), float(scores[i])) for i in order])
        return out

    def _with_score(self, index: int, score: float) -> Passage:
        p = self.passages[index]
        return Passage(p.id, p.title, p.text, score)


_RETRYABLE_STATUS = frozenset({429, 500, 502, 503, 504})


class HTTPRetriever(Retriever):
    """Client of a Search-R1-style retrieval server (``POST <url>/retrieve``; protocol in the module docstring).

    Each request has a ``timeout`` (seconds, connect and read). Connection errors, timeouts and HTTP 429/5xx are
    retried ``max_retries`` times with exponential backoff (``backoff * 2**i`` seconds, at most ``backoff_max``);
    after that, or at once for other HTTP errors and malformed answers, a :class:`RetrieverError` names the URL,
    the number of attempts and the last error. One ``requests.Session`` per thread (sessions are not thread-safe).

    Args:
        url: the server, ``http://host:port`` (``/retrieve`` is appended) or the full ``.../retrieve`` endpoint.
        timeout: seconds per request.
        max_retries: retries after the first attempt (0 = try once).
        backoff: first retry delay in seconds; backoff_max: the largest delay.
    """

    def __init__(
        self, url: str, *, timeout: float = 30.0, max_retries: int = 3, backoff: float = 0.5, backoff_max: float = 8.0
    ):
        import requests  # noqa: F401 - fail early, with the import error, when requests is missing

        if not isinstance(url, str) or not re.match(r"https?://[^/\s]+", url):
            raise ValueError(f"retriever url must look like 'http://host:port', got {url!r}")
        for name, value in (("timeout", timeout), ("backoff", backoff), ("backoff_max", backoff_max)):
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a non-negative number of seconds, got {value!r}")
        if timeout == 0:
            raise ValueError("timeout must be positive (seconds per request)")
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
            raise ValueError(f"max_retries must be a non-negative int, got {max_retries!r}")
        base = url.rstrip("/")
        self.url = base if base.endswith("/retrieve") else base + "/retrieve"
        self.timeout = float(timeout)
        self.max_retries = max_retries
        self.backoff = float(backoff)
        self.backoff_max = float(backoff_max)
        self._local = threading.local()
        self._sessions: list[Any] = []
        self._lock = threading.Lock()

    def _session(self) -> Any:
        import requests

        session = getattr(self._local, "session", None)
        if session is None:
            session = requests.Session()
            self._local.session = session
            with self._lock:
                self._sessions.append(session)
        return session

    def search(self, queries: list[str], top_k: int) -> list[list[Passage]]:
        """Send one batched request for all ``queries``; return the parsed passages (at most ``top_k`` each)."""
        queries = _check_queries(queries, top_k)
        if not queries:
            return []
        body, attempts = self._post({"queries": queries, "topk": top_k, "return_scores": True})
        return self._parse(body, len(queries), top_k, attempts)

    def _post(self, payload: dict[str, Any]) -> tuple[Any, int]:
        """POST ``payload`` with retries; returns ``(decoded JSON body, attempts made)``."""
        import requests

        transient = (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError)
        attempts = 1 + self.max_retries
        last_error = ""
        cause: BaseException | None = None
        for attempt in range(1, attempts + 1):
            try:
                response = self._session().post(self.url, json=payload, timeout=self.timeout)
            except transient as exc:
                last_error, cause = f"{type(exc).__name__}: {exc}", exc
            except requests.RequestException as exc:  # not transient (bad URL, redirect loop...): do not retry
                raise RetrieverError(
                    f"retrieval server {self.url}: request failed ({type(exc).__name__}: {exc})",
                    url=self.url,
                    attempts=attempt,
                    last_error=f"{type(exc).__name__}: {exc}",
                ) from exc
            else:
                if response.status_code < 400:
                    try:
                        return response.json(), attempt
                    except ValueError as exc:  # requests' JSONDecodeError is a ValueError
                        raise RetrieverError(
                            f"retrieval server {self.url} answered with invalid JSON ({exc}): {response.text[:200]!r}",
                            url=self.url,
                            attempts=attempt,
                            last_error=str(exc),
                        ) from exc
                last_error, cause = f"HTTP {response.status_code}: {response.text[:200]!r}", None
                if response.status_code not in _RETRYABLE_STATUS:
                    raise RetrieverError(
                        f"retrieval server {self.url} rejected the request ({last_error}); check that it speaks the "
                        "Search-R1 protocol (POST /retrieve with queries/topk/return_scores)",
                        url=self.url,
                        attempts=attempt,
                        last_error=last_error,
                    )
            if attempt < attempts:
                delay = min(self.backoff_max, self.backoff * 2 ** (attempt - 1))
                logger.warning(
                    "retrieval server %s: attempt %d/%d failed (%s); retrying in %.2f s",
                    self.url,
                    attempt,
                    attempts,
                    last_error,
                    delay,
                )
                time.sleep(delay)
        raise RetrieverError(
            f"retrieval server {self.url} failed after {attempts} attempt(s) (timeout {self.timeout:g} s each); "
            f"last error: {last_error}. Is the server running and reachable?",
            url=self.url,
            attempts=attempts,
            last_error=last_error,
        ) from cause

    def _parse(self, body: Any, n_queries: int, top_k: int, attempts: int) -> list[list[Passage]]:
        def bad(why: str) -> RetrieverError:
            return RetrieverError(
                f"retrieval server {self.url} answered in an unexpected format ({why}); expected "
                '{"result": [[{"document": {...}, "score": float}, ...], ...]}',
                url=self.url,
                attempts=attempts,
                last_error=why,
            )

        if not isinstance(body, Mapping):
            raise bad(f"the body is a JSON {type(body).__name__}, not an object")
        if not isinstance(body.get("result"), list):
            error = f", error: {str(body['error'])[:200]}" if body.get("error") else ""
            raise bad(f"no 'result' list; keys {sorted(body)}{error}")
        result = body["result"]
        if len(result) != n_queries:
            raise bad(f"{len(result)} result lists for {n_queries} queries")
        out = []
        for q, items in enumerate(result):
            if not isinstance(items, list):
                raise bad(f"result[{q}] is {type(items).__name__}, not a list")
            passages = []
            for r, item in enumerate(items[:top_k]):
                doc, score = (item["document"], item.get("score", 0.0)) if _has_document(item) else (item, 0.0)
                try:
                    passages.append(passage_from_record(doc, score=float(score)))
                except (TypeError, ValueError) as exc:
                    raise bad(f"result[{q}][{r}]: {exc}") from exc
            out.append(passages)
        return out

    def close(self) -> None:
        """Close the HTTP sessions of every thread that used this retriever."""
        with self._lock:
            sessions, self._sessions = self._sessions, []
        for session in sessions:
            session.close()
        self._local = threading.local()


def _has_document(item: Any) -> bool:
    return isinstance(item, Mapping) and isinstance(item.get("document"), Mapping)
