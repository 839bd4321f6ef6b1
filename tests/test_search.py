"""Search-QA environment: contract, golden observations, oracle play, exact match, corpus, and the HTTP retriever
against a real local HTTP server speaking Search-R1's retrieval protocol (CPU only, no mocks)."""

from __future__ import annotations

import json
import math
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from environments import make_env
from environments.base import INVALID_ACTION_TEXT, UNMATCHED_ACTION_TEXT, EnvError
from environments.checker import check_env
from environments.search import (
    BM25Retriever,
    CorpusConfig,
    HTTPRetriever,
    Passage,
    RetrieverError,
    SearchQAEnv,
    exact_match,
    generate_corpus,
    normalize_answer,
)
from environments.search.env import MAX_QUERY_CHARS


@pytest.fixture(scope="module")
def corpus():
    return generate_corpus(0)


@pytest.fixture(scope="module")
def bm25(corpus):
    return BM25Retriever(corpus.passages)


# ---------------------------------------------------------------------------------------------- contract
@pytest.mark.parametrize("key_mode", ["observation", "state", "history:2"])
@pytest.mark.parametrize("split", ["train", "test"])
def test_check_env_passes(key_mode, split):
    counts = check_env(SearchQAEnv(key_mode=key_mode), seeds=(0, 1, 2, 5), split=split)
    assert counts["path_pairs"] >= 4 * 4  # every seed contributes real path pairs, not only the default one
    assert counts["fuzz_inputs"] > 100


def test_registry_builds_the_env():
    env = make_env("search", top_k=2)
    assert isinstance(env, SearchQAEnv) and env.key_mode == "observation" and env.max_steps == 4
    env.reset(seed=0)
    _, _, _, _, info = env.step(env.example_actions()[0])
    assert len(info["retrieved_ids"]) == 2


# ---------------------------------------------------------------------------------------------- golden observations
GOLDEN = {
    ("train", 0): (
        "Question: What is the capital of the province of Veskand?\n"
        "No search yet. Search with <search>query</search>, or answer with <answer>answer</answer>.",
        "search[Veskand]",
        "Question: What is the capital of the province of Veskand?\n<information>\n"
        "Doc 1 (Title: Veskand) Veskand is a province. The capital of Veskand is Fixton.\n"
        "Doc 2 (Title: Veskand Cup) The Veskand Cup is a chess tournament first played in 1886.\n"
        "Doc 3 (Title: Fixton) Fixton is a town in the province of Veskand. Fixton lies on the river Loum. "
        "Fixton is the capital of Veskand.\n</information>",
    ),
    ("test", 1): (
        "Question: Which river does the town of Dronwick lie on?\n"
        "No search yet. Search with <search>query</search>, or answer with <answer>answer</answer>.",
        "search[Dronwick]",
        "Question: Which river does the town of Dronwick lie on?\n<information>\n"
        "Doc 1 (Title: Dronwick) Dronwick is a town in the province of Shamesse. Dronwick lies on the river Rous.\n"
        "Doc 2 (Title: Dronwick Chronicle) The Dronwick Chronicle is a weekly newspaper first printed in 1868. "
        "It reports on markets and weather.\n"
        "Doc 3 (Title: Tiamux Hothol) Tiamux Hothol was born in Dronwick. Tiamux Hothol worked as a clockmaker.\n"
        "</information>",
    ),
}


@pytest.mark.parametrize("split,seed", sorted(GOLDEN))
def test_golden_observations(split, seed):
    start, action, after = GOLDEN[(split, seed)]
    env = SearchQAEnv()
    obs, info = env.reset(seed=seed, options={"split": split})
    assert obs == start and info["anchor_key"] == start
    assert env.example_actions()[0] == action
    obs, reward, terminated, truncated, info = env.step(action)
    assert obs == after and info["anchor_key"] == after
    assert (reward, terminated, truncated, info["won"]) == (0.0, False, False, False)


# ---------------------------------------------------------------------------------------------- oracle play
def test_oracle_answers_every_question_single_and_two_hop(corpus):
    """An agent that searches the right entity names finds every supporting passage within top-3 and wins."""
    env = SearchQAEnv()
    played = {1: 0, 2: 0}
    for split in ("train", "test"):
        for seed, q in enumerate(corpus.questions[split]):
            obs, info = env.reset(seed=seed, options={"split": split})
            assert info["task_id"] == q.id and q.question in obs and info["task_type"].startswith(f"{q.hops}hop/")
            for query, support in zip(q.queries, q.support, strict=True):
                obs, reward, terminated, _, info = env.step(f"search[{query}]")
                assert support in info["retrieved_ids"], (q, query, obs)
                assert (reward, terminated) == (0.0, False)
            assert q.answers[0] in obs  # the last hop's passage, on screen, states the answer
            obs, reward, terminated, truncated, info = env.step(f"answer[{q.answers[-1]}]")
            assert (reward, terminated, truncated, info["won"]) == (1.0, True, False, True), q
            assert obs.endswith("The answer is correct.")
            played[q.hops] += 1
    assert played[1] > 300 and played[2] > 300


def test_wrong_answer_gets_zero_and_timeout_truncates():
    env = SearchQAEnv()
    env.reset(seed=3)
    obs, reward, terminated, truncated, info = env.step("answer[Atlantis]")
    assert (reward, terminated, truncated, info["won"]) == (0.0, True, False, False)
    assert obs.endswith("The answer is not correct.")
    assert info["gold_answers"] and "Atlantis" not in info["gold_answers"]
    with pytest.raises(RuntimeError, match="episode has ended"):
        env.step("search[x]")

    env.reset(seed=3)
    results = [env.step("search[river]") for _ in range(env.max_steps)]
    assert [r[2:4] for r in results] == [(False, False)] * 3 + [(False, True)]
    assert all(r[1] == 0.0 for r in results)


@pytest.mark.parametrize(
    "prediction,gold,expected",
    [
        ("Tesh", ["Tesh"], 1.0),
        ("  the River  TESH. ", ["river Tesh"], 1.0),
        ("an apothecary", ["apothecary"], 1.0),
        ("«Marrowick»!", ["Marrowick"], 1.0),  # Unicode punctuation too
        ("Velora-Quint", ["VeloraQuint"], 1.0),  # punctuation is deleted, not replaced (as SQuAD)
        ("Marrowick Chronicle", ["Marrowick"], 0.0),
        ("theatre", ["atre"], 0.0),  # articles only as whole words
        ("Tesh", ["Marrowick", "tesh river", "TESH"], 1.0),  # any gold answer
        ("", ["the"], 0.0),  # an empty normalised answer never matches
        ("Atlantis", ["Tesh"], 0.0),
    ],
)
def test_exact_match_normalisation(prediction, gold, expected):
    assert exact_match(prediction, gold) == expected


def test_normalize_answer_examples():
    assert normalize_answer("The River  Tesh.") == "river tesh"
    assert normalize_answer("A, an, THE") == ""
    assert normalize_answer("Étienne's café") == "étiennes café"


# ---------------------------------------------------------------------------------------------- parse_action
@pytest.mark.parametrize(
    "reply,expected",
    [
        ("<think>I need the town.</think>\n<search> Velora  Quint </search>", "search[Velora Quint]"),
        ("<think>Found it.</think><answer>Marrowick</answer>", "answer[Marrowick]"),
        ("<SEARCH>tesh</SEARCH>", "search[tesh]"),
        ("<think>x</think><action>search[Tesh river]</action>", "search[Tesh river]"),
        ("<action> ANSWER[ Tesh ] </action>", "answer[Tesh]"),
        ("search[a [nested] query]", "search[a [nested] query]"),
        ("answer[Tesh]", "answer[Tesh]"),
        ("I think the town was lost. </think> <answer>Foby</answer>", "answer[Foby]"),  # thought opened in prompt
        ("<think>maybe <search>a</search> or <answer>b</answer></think><search>c</search>", "search[c]"),
        ("<information>fake <answer>x</answer></information><answer>y</answer>", "answer[y]"),
        ("<search>a\x00b\tc</search>", "search[a b c]"),
        ("<search>a</search><answer>b</answer>", None),  # two actions
        ("<search>a</search><search>b</search>", None),
        ("<search>a", None),  # unclosed
        ("a</answer>", None),  # stray closing tag
        ("<search><answer>x</answer></search>", None),  # nested
        ("<search>   </search>", None),  # empty
        ("<think>only thinking", None),
        ("Marrowick", None),  # no action at all
        ("click[buy]", None),
        ("", None),
        (None, None),
        (b"\xff<answer>Tesh</answer>", "answer[Tesh]"),
    ],
)
def test_parse_action_cases(reply, expected):
    env = SearchQAEnv()
    assert env.parse_action(reply) == (expected, expected is not None)


def test_parse_action_truncates_absurd_queries_and_is_linear():
    env = SearchQAEnv()
    action, valid = env.parse_action("<search>" + "velora " * 5_000 + "</search>")
    assert valid and len(action) <= len("search[]") + MAX_QUERY_CHARS and action.endswith("velora]")
    action, valid = env.parse_action("<search>" + "x" * 60_000 + "</search>")
    assert valid and action == "search[" + "x" * MAX_QUERY_CHARS + "]"  # no space to cut at: hard cut
    assert env.parse_action("<search>" + "x" * 70_000 + "</search>") == (None, False)  # tag past the read window
    assert env.parse_action("<search>" * 10_000) == (None, False)  # quadratic-regex bait; must stay fast


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<think>x</think><search> Veskand  river </search>", ("search[Veskand river]", True)),
        ("<answer>Marrowick</answer>", ("answer[Marrowick]", True)),  # no think tag needed
        ("<SEARCH>a</SEARCH>", ("search[a]", True)),
        ("<search>a</search><answer>b</answer>", ("search[a]", False)),  # both kinds: invalid, the search is sent
        ("<search>a</search> then <search>b</search>", ("search[a]", False)),  # two searches: invalid
        ("<answer>a</answer><answer>b</answer>", ("answer[a]", False)),
        ("<action>search[a]</action>", (None, False)),  # this package's other spellings are not the format
        ("search[a]", (None, False)),
        ("</search><search>a</search>", (None, False)),  # the reference cuts at the first </search>
        ("<search>   </search>", (None, True)),  # well-formed but empty: nothing to run (the turn is used)
    ],
)
def test_format_rule_is_the_reference_search_projection(text, expected):
    env = SearchQAEnv()
    env.reset(seed=0)
    assert env.parse_action(text, rule="format") == expected


def test_reply_parsing_lowercase_option():
    """The reference keeps the case of a search reply (search_projection), as the default does; env.parse.lowercase
    lower-cases the query too."""
    from environments.base import ParseStyle

    env = SearchQAEnv()
    env.reset(seed=0)
    reply = "<think>x</think><search>Veskand River</search>"
    assert env.parse_action(reply, rule="format") == ("search[Veskand River]", True)
    env.parse_style = ParseStyle(lowercase=True)
    assert env.parse_action(reply, rule="format") == ("search[veskand river]", True)
    assert env.parse_action(reply) == ("search[veskand river]", True)


def test_step_of_a_command_that_is_not_an_action_changes_nothing():
    """A raw reply given to step is an unmatched command (what the format rule may send): the turn is used, the
    state and the observation key stay; a command that normalises to an action is that action."""
    env = SearchQAEnv()
    obs0, info0 = env.reset(seed=0)
    obs, reward, terminated, _, info = env.step("<search>Veskand</search>")
    assert obs == f"{UNMATCHED_ACTION_TEXT}\n{obs0}" and reward == 0.0 and not terminated
    assert info["step"] == 1 and info["action_valid"] is False and info["anchor_key"] == info0["anchor_key"]
    _, _, _, _, info = env.step("search[  Veskand ]")
    assert info["action_valid"] is True and info["query"] == "Veskand"


# ---------------------------------------------------------------------------------------------- state and keys
def test_different_queries_same_passages_same_state(corpus):
    """Queries with different words that retrieve the same passages reach the same state; the observation key
    also matches when the order is the same, and a query retrieving other passages gives another state."""
    env = SearchQAEnv()

    def after(seed, query):
        env.reset(seed=seed)
        obs, *_ = env.step(f"search[{query}]")
        return env.anchor_key("state"), obs

    pair = None
    for seed, q in enumerate(corpus.questions["train"][:50]):
        a = after(seed, q.queries[0])
        b = after(seed, q.question)  # the whole question vs the bare entity name
        if a == b:
            pair = (seed, q)
            break
    assert pair is not None, "no question where the entity name and the question retrieve the same passages"
    seed, q = pair
    other = after(seed, "chess tournament newspaper")
    assert other[0] != after(seed, q.queries[0])[0] and other[1] != after(seed, q.queries[0])[1]


def test_state_is_the_set_of_passages_seen():
    env = SearchQAEnv(key_mode="state")
    env.reset(seed=0)
    env.step("search[Veskand]")
    env.step("search[Fixton river]")
    _, _, _, _, info_ab = env.step("search[Veskand]")
    env.reset(seed=0)
    env.step("search[Fixton river]")
    _, _, _, _, info_ba = env.step("search[Veskand]")
    assert info_ab["anchor_key"] == info_ba["anchor_key"]
    retrieved = json.loads(info_ab["anchor_key"])["retrieved"]
    assert retrieved == sorted(retrieved) and "doc0004" in retrieved

    env.reset(seed=0)
    obs, _, _, _, info = env.step(None)
    assert INVALID_ACTION_TEXT in obs and INVALID_ACTION_TEXT not in env.anchor_key("observation")
    assert json.loads(info["anchor_key"]) == {"question": info["task_id"], "retrieved": [], "answer": None}


# ---------------------------------------------------------------------------------------------- groups, determinism
def test_same_seed_same_task_across_instances():
    """An episode group: every member built separately from the same (seed, split) starts in the same state."""
    members = [SearchQAEnv() for _ in range(3)]
    starts = [env.reset(seed=11, options={"split": "train"}) for env in members]
    assert len({(obs, info["task_id"], info["anchor_key"]) for obs, info in starts}) == 1
    transcripts = []
    for env in members:
        steps = [env.step(a) for a in env.example_actions()[:2]]
        transcripts.append(json.dumps([(o, r, t, tr, i) for o, r, t, tr, i in steps], sort_keys=True))
    assert len(set(transcripts)) == 1

    env = members[0]
    ids = {env.reset(seed=s)[1]["task_id"] for s in range(20)}
    assert len(ids) == 20  # distinct seeds, distinct questions
    assert env.reset(seed=4, options={"split": "test"})[1]["task_id"] != env.reset(seed=4)[1]["task_id"]
    a, b = SearchQAEnv(), SearchQAEnv()
    for e in (a, b):
        e.reset(seed=5)
    assert [a.reset()[1]["task_id"] for _ in range(3)] == [b.reset()[1]["task_id"] for _ in range(3)]
    n_train = len(env.questions["train"])
    assert env.reset(seed=4 + n_train)[1]["task_id"] == env.reset(seed=4)[1]["task_id"]  # seed wraps mod n


def test_corpus_is_deterministic_and_splits_are_disjoint(corpus):
    again = generate_corpus(0)
    assert again == corpus
    assert generate_corpus(1).passages != corpus.passages
    train, test = corpus.questions["train"], corpus.questions["test"]
    assert not {q.id for q in train} & {q.id for q in test}
    assert not {q.question for q in train} & {q.question for q in test}
    stats = corpus.stats()
    assert 200 <= stats["passages"] <= 400 and stats["distractors"] == 60
    assert stats["test_questions"] == round(0.2 * (stats["train_questions"] + stats["test_questions"]))
    assert len({p.id for p in corpus.passages}) == len(corpus.passages)
    assert len({p.title for p in corpus.passages}) == len(corpus.passages)
    by_id = {p.id: p for p in corpus.passages}
    for q in train + test:
        assert q.hops == len(q.support) == len(q.queries) in (1, 2)
        assert by_id[q.support[0]].title == q.queries[0] and q.queries[0] in q.question
        assert any(a in by_id[q.support[-1]].text for a in q.answers)  # the last hop states the answer
        if q.hops == 2:
            assert q.queries[1] in by_id[q.support[0]].text  # the first hop names the bridge entity


def test_corpus_config_validation():
    with pytest.raises(ValueError, match="n_companies"):
        CorpusConfig(n_people=5, n_companies=6)
    with pytest.raises(ValueError, match="invalid corpus_config"):
        SearchQAEnv(corpus_config={"n_peple": 3})
    sizes = {"n_people": 10, "n_towns": 5, "n_companies": 2, "n_provinces": 2, "n_rivers": 3, "n_seas": 1}
    small = SearchQAEnv(corpus_config={**sizes, "n_distractors": 4})
    assert len(small.corpus.passages) == 10 + 5 + 2 + 2 + 3 + 1 + 4
    assert sum(len(qs) for qs in small.questions.values()) == 10 * 4 + 5 * 2 + 2 + 2 * 5


# ---------------------------------------------------------------------------------------------- user corpus files
def test_user_corpus_and_questions_jsonl(tmp_path):
    corpus_path = tmp_path / "corpus.jsonl"
    rows = [
        {"id": "a", "title": "Quillon", "text": "Quillon is a lighthouse keeper on Skerry Rock."},
        {"id": "b", "contents": '"Skerry Rock"\nSkerry Rock is an islet in the Grey Sound.'},  # Search-R1 layout
        {"title": "Grey Sound", "text": "The Grey Sound is a strait."},  # no id: the line number
    ]
    corpus_path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    questions_path = tmp_path / "questions.jsonl"
    questions = [
        {"question": "Where does Quillon keep a lighthouse?", "golden_answers": ["Skerry Rock"], "split": "test"},
        {"id": "t1", "question": "Which strait holds Skerry Rock?", "answers": "Grey Sound", "type": "bridge"},
    ]
    questions_path.write_text("\n".join(json.dumps(q) for q in questions))
    env = SearchQAEnv(corpus_path=corpus_path, questions_path=questions_path, top_k=2)
    obs, info = env.reset(seed=0, options={"split": "train"})
    assert info["task_id"] == "t1" and info["task_type"] == "bridge"
    obs, *_ = env.step("search[Skerry Rock strait]")
    assert "Doc 1 (Title: Skerry Rock) Skerry Rock is an islet in the Grey Sound." in obs
    assert env.step("answer[the grey sound]")[1] == 1.0
    _, info = env.reset(seed=0, options={"split": "test"})
    assert info["task_id"] == "test-1" and info["task_type"] is None
    env.step("search[lighthouse]")
    assert env.anchor_key("state") == json.dumps({"question": "test-1", "retrieved": ["a"], "answer": None})

    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(rows[0]) + "\n{not json\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:2"):
        BM25Retriever(bad)
    with pytest.raises(ValueError, match="corpus_path needs questions_path"):
        SearchQAEnv(corpus_path=corpus_path)
    with pytest.raises(ValueError, match=r"retriever, retriever_url and corpus_path.*got"):
        SearchQAEnv(corpus_path=corpus_path, questions_path=questions_path, retriever_url="http://127.0.0.1:1")
    with pytest.raises(ValueError, match="unique"):
        BM25Retriever([Passage("x", "a", "b"), Passage("x", "c", "d")])


def test_generated_corpus_round_trips_through_jsonl(tmp_path, corpus, bm25):
    """write_jsonl -> corpus_path/questions_path plays the same questions over the same passages."""
    corpus.write_jsonl(tmp_path / "corpus.jsonl", tmp_path / "questions.jsonl")
    from_files = SearchQAEnv(corpus_path=tmp_path / "corpus.jsonl", questions_path=tmp_path / "questions.jsonl")
    assert from_files.retriever.passages == bm25.passages
    for split in ("train", "test"):
        assert [(q.id, q.question, q.answers, q.kind) for q in from_files.questions[split]] == [
            (q.id, q.question, q.answers, q.kind) for q in corpus.questions[split]
        ]
    generated = SearchQAEnv()
    for env in (from_files, generated):
        env.reset(seed=2, options={"split": "test"})
    for action in generated.example_actions():
        assert from_files.step(action) == generated.step(action)


def test_bm25_retriever_behaviour(bm25, corpus):
    velora = next(q for q in corpus.questions["train"] if q.hops == 1 and " " in q.queries[0])
    name = velora.queries[0]
    (hits,) = bm25.search([name], top_k=3)
    assert hits[0].title == name and [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    assert bm25.search([name.upper(), " ".join(reversed(name.split()))], 3) == [hits, hits]
    assert bm25.search(["the of and", "zzqx"], 3) == [[], []]  # nothing in common: no passage
    assert bm25.search([], 3) == []
    with pytest.raises(ValueError, match="list of strings"):
        bm25.search(name, 3)
    with pytest.raises(ValueError, match="top_k"):
        bm25.search([name], 0)


# ---------------------------------------------------------------------------------------------- HTTP retriever
class _SearchR1Handler(BaseHTTPRequestHandler):
    """POST /retrieve in Search-R1's format, backed by a BM25Retriever; ``server.mode`` scripts failures."""

    def do_POST(self):  # noqa: N802 - http.server naming
        server = self.server
        with server.lock:
            server.requests += 1
            n = server.requests
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path != "/retrieve":
            return self._send(404, {"detail": "Not Found"})
        if server.mode == "sleep":
            server.release.wait(timeout=5)
            return None  # the client timed out long ago
        if server.mode == "fail_once" and n == 1:
            return self._send(500, {"detail": "index warming up"})
        if server.mode == "reject":
            return self._send(422, {"detail": "topk must be an integer"})
        if server.mode == "garbage":
            return self._send(200, {"error": "retriever crashed"})
        if server.mode in ("drip_body", "drip_headers"):
            return self._drip(server, headers=server.mode == "drip_headers")
        if server.mode == "nan":
            return self._send(200, {"result": [[{"document": {"id": "1", "contents": '"T"\nx'}, "score": math.nan}]]})
        if server.mode in ("keepalive", "keepalive_then_close"):  # a kept-alive HTTP/1.1 connection (then closed)
            self.protocol_version = "HTTP/1.1"
            self.close_connection = server.mode == "keepalive_then_close"
            with server.lock:
                server.peers.add(self.client_address)
        results = server.retriever.search(body["queries"], body["topk"])
        result = [
            [{"document": {"id": p.id, "contents": f'"{p.title}"\n{p.text}'}, "score": p.score} for p in hits]
            for hits in results
        ]
        return self._send(200, {"result": result})

    def _drip(self, server, *, headers):
        """A slow loris: a valid answer, one byte every 20 ms (in a header, or in the body); counts what it sent
        until the client hangs up."""
        body = json.dumps({"result": [[]]}).encode() + b" " * 200
        slow = b"X-Slow: " + b"a" * 200 + b"\r\n" if headers else b""
        head = b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n" % len(body)
        try:
            self.wfile.write(head)
            for byte in slow:
                self.wfile.write(bytes([byte]))
                server.dripped += 1
                time.sleep(0.02)
            self.wfile.write(b"\r\n")
            if headers:
                self.wfile.write(body)
            for byte in b"" if headers else body:
                self.wfile.write(bytes([byte]))
                server.dripped += 1
                time.sleep(0.02)
        except OSError:
            pass  # the client gave up and closed the connection
        finally:
            server.drip_done.set()

    def _send(self, status, payload):
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):  # keep pytest output clean
        return None


@pytest.fixture
def server(bm25):
    """Start a real threaded HTTP retrieval server on a free local port; yields it (``server.url``)."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _SearchR1Handler)
    httpd.daemon_threads = True
    httpd.retriever, httpd.mode, httpd.requests, httpd.peers = bm25, "ok", 0, set()
    httpd.lock, httpd.release = threading.Lock(), threading.Event()
    httpd.dripped, httpd.drip_done = 0, threading.Event()
    httpd.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield httpd
    httpd.release.set()
    httpd.shutdown()
    httpd.server_close()
    thread.join(timeout=5)


def test_http_retriever_matches_embedded_bm25(server, bm25, corpus):
    queries = [q.question for q in corpus.questions["test"][:20]] + ["zzqx nothing"]
    client = HTTPRetriever(server.url)
    try:
        assert client.search(queries, 3) == bm25.search(queries, 3)  # ids, titles, texts and scores
        assert server.requests == 1  # one batched request
    finally:
        client.close()
    # the whole environment over HTTP plays exactly like the embedded one
    remote, local = SearchQAEnv(retriever_url=server.url + "/retrieve"), SearchQAEnv()
    for env in (remote, local):
        env.reset(seed=7, options={"split": "test"})
    for action in local.example_actions():
        assert remote.step(action) == local.step(action)
    remote.close()


def _requests_seen(server, expected: int, wait_s: float = 5.0) -> int:
    """The server's request count once it reaches ``expected`` (or after ``wait_s``): a timed-out attempt's handler
    may count its request after the client has given up, when the machine is loaded."""
    deadline = time.monotonic() + wait_s
    while server.requests < expected and time.monotonic() < deadline:
        time.sleep(0.01)
    return server.requests


def test_http_timeout_retries_then_clear_error(server):
    server.mode = "sleep"
    client = HTTPRetriever(server.url, timeout=0.2, max_retries=2, backoff=0.01)
    with pytest.raises(RetrieverError) as err:
        client.search(["Veskand"], 3)
    message = str(err.value)
    assert server.url + "/retrieve" in message and "3 attempt(s)" in message and "timed out" in message.lower()
    assert err.value.attempts == 3 and err.value.url == server.url + "/retrieve"
    assert _requests_seen(server, 3) == 3
    client.close()


@pytest.mark.parametrize("where", ["body", "headers"])
def test_http_deadline_bounds_the_whole_request_against_a_dripping_server(server, where):
    # The server sends a valid answer one byte every 20 ms (~4 s): every socket read returns within the 0.3 s
    # timeout, so a per-read timeout never fires and the request used to take the full 4 s. The deadline must cut
    # it off, and the server must see the client hang up long before it has sent everything.
    server.mode = f"drip_{where}"
    client = HTTPRetriever(server.url, timeout=0.3, max_retries=0)
    with pytest.raises(RetrieverError) as err:
        client.search(["Veskand"], 3)
    client.close()
    message = str(err.value)
    assert "timed out: no complete answer within the 0.3 s deadline (waited" in message
    assert "failed after 1 attempt(s)" in message and err.value.attempts == 1
    assert server.drip_done.wait(timeout=10)
    assert server.dripped < 100  # of ~200 bytes: it stopped when the client closed the connection


def test_http_total_timeout_bounds_the_retries(server):
    server.mode = "sleep"  # never answers
    client = HTTPRetriever(server.url, timeout=0.2, max_retries=5, backoff=0.01, total_timeout=0.5)
    with pytest.raises(RetrieverError, match=r"\(deadline 0.2 s per attempt, 0.5 s in all\)") as err:
        client.search(["Veskand"], 3)
    client.close()
    assert 1 <= err.value.attempts <= 3 < 6  # 0.5 s holds at most three 0.2 s attempts, not six
    assert _requests_seen(server, err.value.attempts) == err.value.attempts


def test_http_non_finite_scores_are_rejected(server):
    server.mode = "nan"
    client = HTTPRetriever(server.url, max_retries=0)
    with pytest.raises(RetrieverError, match=r"unexpected format \(result\[0\]\[0\]: score nan is not finite\)"):
        client.search(["Veskand"], 3)
    client.close()


def test_http_keep_alive_connection_is_reused(server, bm25):
    # A server that keeps the connection open gets every search on one connection, and every search is answered on
    # its first try (no attempt is spent on a connection http.client thinks is still busy).
    server.mode = "keepalive"
    client = HTTPRetriever(server.url, max_retries=0)
    expected = bm25.search(["Veskand"], 3)
    for _ in range(3):
        assert client.search(["Veskand"], 3) == expected
    client.close()
    assert server.requests == 3
    assert len(server.peers) == 1, server.peers


def test_http_keep_alive_connection_closed_by_the_server_is_reopened(server, bm25):
    # The client keeps the connection for the next search; the server has closed it meanwhile. The request is sent
    # again on a fresh connection, within the same attempt.
    server.mode = "keepalive_then_close"
    client = HTTPRetriever(server.url, max_retries=0)
    expected = bm25.search(["Veskand"], 3)
    assert client.search(["Veskand"], 3) == expected
    assert client.search(["Veskand"], 3) == expected
    client.close()
    assert server.requests == 2


def test_http_500_is_retried(server, bm25):
    server.mode = "fail_once"
    client = HTTPRetriever(server.url, max_retries=2, backoff=0.01)
    assert client.search(["Veskand"], 3) == bm25.search(["Veskand"], 3)
    assert server.requests == 2
    client.close()


def test_http_client_errors_are_not_retried(server):
    server.mode = "reject"
    client = HTTPRetriever(server.url, max_retries=3, backoff=0.01)
    with pytest.raises(RetrieverError, match="HTTP 422") as err:
        client.search(["Veskand"], 3)
    assert err.value.attempts == 1 and server.requests == 1
    server.mode = "garbage"
    with pytest.raises(RetrieverError, match="unexpected format.*retriever crashed"):
        client.search(["Veskand"], 3)
    client.close()


def test_http_connection_refused_is_a_clear_error():
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    client = HTTPRetriever(f"http://127.0.0.1:{port}", timeout=2, max_retries=1, backoff=0.01)
    with pytest.raises(RetrieverError, match=rf"127\.0\.0\.1:{port}/retrieve failed after 2 attempt\(s\)") as err:
        client.search(["Veskand"], 3)
    assert "ConnectionError" in err.value.last_error
    env = SearchQAEnv(retriever=client)
    env.reset(seed=0)  # reset needs no retrieval
    with pytest.raises(EnvError, match="RetrieverError") as env_err:
        env.step("search[Veskand]")
    assert isinstance(env_err.value.cause, RetrieverError)


def test_http_retriever_argument_checks():
    with pytest.raises(ValueError, match="http://host:port"):
        HTTPRetriever("localhost:8000")
    with pytest.raises(ValueError, match="max_retries"):
        HTTPRetriever("http://127.0.0.1:8000", max_retries=-1)
    with pytest.raises(ValueError, match="invalid retriever_options"):
        SearchQAEnv(retriever_url="http://127.0.0.1:8000", retriever_options={"retries": 2})


# ---------------------------------------------------------------------------------------------- similarity grouping
def test_observation_keys_group_by_similarity():
    """Observations of one question showing the same passages in another order are different strings, yet
    ``similarity_groups`` at 0.9 puts them together; first observations of other questions stay apart."""
    from verl_gigpo.advantage.anchors import similarity_groups

    env = SearchQAEnv()
    near = None
    for seed in range(40):
        env.reset(seed=seed)
        q = env._question
        seen = {}
        for query in (
            q.queries[0],
            q.question,
            f"{q.queries[0]} river",
            f"{q.queries[0]} town",
            f"{q.queries[0]} born",
        ):
            env.reset(seed=seed)
            obs, *_ = env.step(f"search[{query}]")
            seen.setdefault(env.anchor_key("state"), set()).add(obs)
        near = next((sorted(v) for v in seen.values() if len(v) > 1), None)
        if near:
            break
    assert near is not None, "no question whose searches show the same passages in different orders"
    others = []
    for seed in range(60, 66):
        env.reset(seed=seed)
        obs, *_ = env.step(env.example_actions()[0])
        others.append(obs)
    labels = similarity_groups(near[:2] + others, 0.9)
    assert labels[0] == labels[1]
    assert len(set(labels[2:])) == len(others) and labels[0] not in set(labels[2:])
    assert len(set(similarity_groups(near[:2], 1.0))) == 2  # exact keys would split them


def test_checker_paths_respect_the_step_limit():
    """The checker's path pairs are real, different action sequences; pairs longer than max_steps are left out."""
    env = SearchQAEnv(max_steps=4)
    env.reset(seed=0)
    long_pairs = {len(a) for a, _ in env.checker_paths()}
    env = SearchQAEnv(max_steps=2)
    env.reset(seed=0)
    pairs = env.checker_paths()
    assert 3 in long_pairs and all(max(len(a), len(b)) <= 2 for a, b in pairs)
    assert any(a != b and None not in a + b for a, b in pairs)
