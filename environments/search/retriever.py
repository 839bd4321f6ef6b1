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
import http.client
import json
import logging
import math
import re
import socket
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

        logging.getLogger("bm25s").setLevel(logging.WARNING)  # bm25s sets DEBUG at import: its indexing chatter

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


class _Transient(Exception):
    """One attempt failed in a way worth retrying (connection, deadline, 429/5xx); ``str`` says how."""


class _Stale(Exception):
    """A kept-alive connection failed before any answer: the server closed it meanwhile."""


class HTTPRetriever(Retriever):
    """Client of a Search-R1-style retrieval server (``POST <url>/retrieve``; protocol in the module docstring).

    Deadlines are real: ``timeout`` bounds each whole attempt (connecting, sending, the status line, the headers
    and the whole body), not each socket read, so a server that drips its answer byte by byte cannot hold a
    request longer than ``timeout``; ``total_timeout`` bounds one :meth:`search` call, retries and backoff
    included. At an attempt's deadline its socket is shut down from a timer thread, which wakes any blocked read.
    Connection errors, deadlines and HTTP 429/5xx are retried ``max_retries`` times with exponential backoff
    (``backoff * 2**i`` seconds, at most ``backoff_max``) while the total budget lasts; after that, or at once for
    other HTTP errors and malformed answers (including non-finite scores and bodies over ``max_response_bytes``),
    a :class:`RetrieverError` names the URL, the attempts, the time waited and the last error.

    One keep-alive connection per thread (``http.client``; proxies from the environment are not used: a
    retrieval server is contacted directly).

    Args:
        url: the server, ``http(s)://host:port`` (``/retrieve`` is appended) or the full ``.../retrieve`` endpoint.
        timeout: seconds per attempt, everything included.
        max_retries: retries after the first attempt (0 = try once).
        backoff: first retry delay in seconds; backoff_max: the largest delay.
        total_timeout: seconds for one search, retries and backoff included; None = every attempt's full
            ``timeout`` plus every backoff delay.
        max_response_bytes: the largest answer accepted (default 64 MiB).
    """

    def __init__(
        self,
        url: str,
        *,
        timeout: float = 30.0,
        max_retries: int = 3,
        backoff: float = 0.5,
        backoff_max: float = 8.0,
        total_timeout: float | None = None,
        max_response_bytes: int = 64 * 2**20,
    ):
        match = re.fullmatch(r"(https?)://([^/\s?#]+)(/[^\s]*)?", url) if isinstance(url, str) else None
        if match is None:
            raise ValueError(f"retriever url must look like 'http://host:port', got {url!r}")
        for name, value in (("timeout", timeout), ("backoff", backoff), ("backoff_max", backoff_max)):
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a non-negative number of seconds, got {value!r}")
        if timeout == 0:
            raise ValueError("timeout must be positive (seconds per attempt)")
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
            raise ValueError(f"max_retries must be a non-negative int, got {max_retries!r}")
        delays = [min(float(backoff_max), float(backoff) * 2**i) for i in range(max_retries)]
        if total_timeout is None:
            total_timeout = (1 + max_retries) * float(timeout) + sum(delays)
        elif (
            isinstance(total_timeout, bool)
            or not isinstance(total_timeout, int | float)
            or not math.isfinite(total_timeout)
            or total_timeout <= 0
        ):
            raise ValueError(f"total_timeout must be a positive number of seconds or None, got {total_timeout!r}")
        if isinstance(max_response_bytes, bool) or not isinstance(max_response_bytes, int) or max_response_bytes < 1:
            raise ValueError(f"max_response_bytes must be a positive int, got {max_response_bytes!r}")
        base = url.rstrip("/")
        self.url = base if base.endswith("/retrieve") else base + "/retrieve"
        self._scheme, self._netloc = match.group(1), match.group(2)
        self._path = self.url[len(f"{self._scheme}://{self._netloc}") :] or "/retrieve"
        self.timeout = float(timeout)
        self.total_timeout = float(total_timeout)
        self.max_retries = max_retries
        self.backoff = float(backoff)
        self.backoff_max = float(backoff_max)
        self.max_response_bytes = max_response_bytes
        self._local = threading.local()
        self._connections: list[Any] = []
        self._lock = threading.Lock()

    def search(self, queries: list[str], top_k: int) -> list[list[Passage]]:
        """Send one batched request for all ``queries``; return the parsed passages (at most ``top_k`` each)."""
        queries = _check_queries(queries, top_k)
        if not queries:
            return []
        body, attempts = self._post({"queries": queries, "topk": top_k, "return_scores": True})
        return self._parse(body, len(queries), top_k, attempts)

    def _post(self, payload: dict[str, Any]) -> tuple[Any, int]:
        """POST ``payload`` with retries within the deadlines; returns ``(decoded JSON body, attempts made)``."""
        data = json.dumps(payload).encode("utf-8")
        start = time.monotonic()
        budget_end = start + self.total_timeout
        attempts = 1 + self.max_retries
        last_error = ""
        attempt = 0
        for attempt in range(1, attempts + 1):
            deadline = min(time.monotonic() + self.timeout, budget_end)
            try:
                status, text = self._attempt(data, deadline)
            except _Transient as exc:
                last_error = str(exc)
            else:
                if status < 400:
                    try:
                        return json.loads(text), attempt
                    except ValueError as exc:  # JSONDecodeError and invalid UTF-8 are ValueErrors
                        raise RetrieverError(
                            f"retrieval server {self.url} answered with invalid JSON ({exc}): {text[:200]!r}",
                            url=self.url,
                            attempts=attempt,
                            last_error=str(exc),
                        ) from exc
                last_error = f"HTTP {status}: {text[:200]!r}"
                if status not in _RETRYABLE_STATUS:
                    raise RetrieverError(
                        f"retrieval server {self.url} rejected the request ({last_error}); check that it speaks the "
                        "Search-R1 protocol (POST /retrieve with queries/topk/return_scores)",
                        url=self.url,
                        attempts=attempt,
                        last_error=last_error,
                    )
            if attempt == attempts:
                break
            delay = min(self.backoff_max, self.backoff * 2 ** (attempt - 1))
            if time.monotonic() + delay >= budget_end:
                break  # no time left for another attempt
            logger.warning(
                "retrieval server %s: attempt %d/%d failed (%s); retrying in %.2f s",
                self.url,
                attempt,
                attempts,
                last_error,
                delay,
            )
            time.sleep(delay)
        waited = time.monotonic() - start
        raise RetrieverError(
            f"retrieval server {self.url} failed after {attempt} attempt(s) in {waited:.2f} s (deadline "
            f"{self.timeout:g} s per attempt, {self.total_timeout:g} s in all); last error: {last_error}. Is the "
            "server running, reachable and answering in time?",
            url=self.url,
            attempts=attempt,
            last_error=last_error,
        )

    # ------------------------------------------------------------------ one attempt
    def _connection(self) -> Any:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            cls = http.client.HTTPSConnection if self._scheme == "https" else http.client.HTTPConnection
            conn = cls(self._netloc, timeout=self.timeout)
            self._local.conn = conn
            with self._lock:
                self._connections.append(conn)
        return conn

    def _drop_connection(self, conn: Any, response: Any = None) -> None:
        """Close ``conn`` (and ``response``, which holds its socket open otherwise) and forget it."""
        if response is not None:
            response.close()
        conn.close()
        self._local.conn = None
        with self._lock:
            if conn in self._connections:
                self._connections.remove(conn)

    def _attempt(self, data: bytes, deadline: float) -> tuple[int, str]:
        """One POST that ends by ``deadline`` (``time.monotonic()``); returns ``(status, body text)``.

        A kept-alive connection that the server has closed meanwhile fails before any answer; the request is then
        sent once more on a fresh connection, within the same deadline.

        Raises:
            _Transient: connection failures, the deadline, an incomplete answer (all retryable).
            RetrieverError: an answer larger than ``max_response_bytes``.
        """
        began = time.monotonic()
        try:
            return self._exchange(self._connection(), data, deadline, began)
        except _Stale:
            return self._exchange(self._connection(), data, deadline, began)  # a fresh connection: never stale

    def _exchange(self, conn: Any, data: bytes, deadline: float, began: float) -> tuple[int, str]:
        """Send ``data`` on ``conn`` and read the whole answer by ``deadline`` (see :meth:`_attempt`)."""
        expired = threading.Event()
        sockets: list[socket.socket] = []  # the connection's socket (the response keeps using it after
        # http.client's conn.close(), e.g. on an HTTP/1.0 answer, so it is held here)

        def expire() -> None:  # runs in the timer thread at the deadline: wake up whatever read is blocked
            expired.set()
            for sock in sockets:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass  # already closed: nothing is blocked on it

        def left() -> float:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or expired.is_set():
                raise TimeoutError
            return remaining

        def timed_out() -> _Transient:
            return _Transient(
                f"timed out: no complete answer within the {deadline - began:.3g} s deadline (waited "
                f"{time.monotonic() - began:.2f} s, {received} body bytes received)"
            )

        reused = conn.sock is not None
        timer = threading.Timer(max(0.0, deadline - time.monotonic()), expire)
        timer.daemon = True
        timer.start()
        received = 0
        response = None
        try:
            conn.timeout = left()
            if conn.sock is None:
                conn.connect()
            sock = conn.sock
            sockets.append(sock)
            if expired.is_set():  # the timer fired during connect, before the socket was known
                raise TimeoutError
            sock.settimeout(left())
            conn.request("POST", self._path, body=data, headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            chunks = []
            while True:
                sock.settimeout(left())
                piece = response.read1(65536)
                if not piece:
                    break
                received += len(piece)
                if received > self.max_response_bytes:
                    self._drop_connection(conn, response)
                    raise RetrieverError(
                        f"retrieval server {self.url} sent more than max_response_bytes={self.max_response_bytes} "
                        "bytes; lower topk or raise max_response_bytes",
                        url=self.url,
                        attempts=1,
                        last_error="answer too large",
                    )
                chunks.append(piece)
            if expired.is_set():
                raise TimeoutError
            if response.length:  # http.client counts the Content-Length down: bytes are missing
                raise http.client.IncompleteRead(b"".join(chunks), response.length)
            # read1 does not mark a body read to its Content-Length as finished; until the response is closed,
            # http.client refuses the next request on this connection (ResponseNotReady). Closing it releases the
            # response's file only; the socket stays with the connection.
            response.close()
            if response.will_close:
                self._drop_connection(conn)
            return response.status, b"".join(chunks).decode("utf-8", errors="replace")
        except TimeoutError:
            self._drop_connection(conn, response)
            raise timed_out() from None
        except (OSError, http.client.HTTPException) as exc:
            self._drop_connection(conn, response)
            if expired.is_set():  # the timer shut the socket down under a read
                raise timed_out() from None
            if reused and response is None and isinstance(exc, ConnectionError | http.client.RemoteDisconnected):
                raise _Stale from None
            kind = "ConnectionError" if isinstance(exc, OSError) else type(exc).__name__
            raise _Transient(f"{kind}: {exc!r}") from None
        finally:
            timer.cancel()

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
                    value = float(score)
                except (TypeError, ValueError) as exc:
                    raise bad(f"result[{q}][{r}]: score {score!r:.40} is not a number") from exc
                if not math.isfinite(value):
                    raise bad(f"result[{q}][{r}]: score {value} is not finite")
                try:
                    passages.append(passage_from_record(doc, score=value))
                except (TypeError, ValueError) as exc:
                    raise bad(f"result[{q}][{r}]: {exc}") from exc
            out.append(passages)
        return out

    def close(self) -> None:
        """Close the HTTP connections of every thread that used this retriever."""
        with self._lock:
            connections, self._connections = self._connections, []
        for conn in connections:
            conn.close()
        self._local = threading.local()


def _has_document(item: Any) -> bool:
    return isinstance(item, Mapping) and isinstance(item.get("document"), Mapping)
