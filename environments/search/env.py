"""Search-augmented question answering (Search-R1 style), the GiGPO paper's search setting.

    env = make_env("search")                                    # generated fictional corpus, embedded BM25
    env = make_env("search", retriever_url="http://127.0.0.1:8000", questions_path="nq_hotpotqa.jsonl")
    env = make_env("search", corpus_path="corpus.jsonl", questions_path="questions.jsonl")
    obs, info = env.reset(seed=3, options={"split": "test"})   # question 3 of the test split

Each episode is one question. Every turn the agent either searches or answers:

* ``<search>query</search>`` runs the retriever and shows the top ``top_k`` passages inside
  ``<information>...</information>``; reward 0;
* ``<answer>text</answer>`` ends the episode (terminated) with reward 1.0 when the normalised answer equals a
  normalised gold answer (:func:`exact_match`), else 0.0; ``won`` = reward 1.0.

The episode is truncated after ``max_steps`` turns (4 by default, as in the paper's search setting) without an
answer: reward 0.

Action syntax (:meth:`SearchQAEnv.parse_action`, pure and total): the reply must hold exactly one action, written
as ``<search>q</search>``, ``<answer>a</answer>``, ``<action>search[q]</action>`` or ``<action>answer[a]</action>``
(tags case-insensitive), or, with no tags at all, the whole reply ``search[q]`` / ``answer[a]``. Text inside
``<think>...</think>`` and ``<information>...</information>`` is ignored (so is everything before a lone
``</think>``, for chat templates that open the thought in the prompt). Several actions, an unclosed or stray
action tag, a tag nested in an action, or empty content make the reply invalid. The canonical action is
``search[q]`` or ``answer[a]``, with whitespace collapsed and non-printable characters replaced by spaces; queries
and answers longer than :data:`MAX_QUERY_CHARS` / :data:`MAX_ANSWER_CHARS` characters are cut (at the last space
before the limit when there is one).

Observation: ``"Question: <question>\\n"`` followed by the information returned by the last search
(``Doc i (Title: t) text`` lines inside ``<information>``), or a start message before any search, or the final
answer and its verdict. Never the query, the turn count or past results, so two queries that retrieve the same
passages in the same order give the same observation.

The ``format`` invalid-action rule (``parse_action(text, rule="format")``, :func:`parse_search_format`) is the
reference's ``search_projection``: the reply is cut after its first ``</search>`` (else after its first
``</answer>``); the command is the first ``<search>...</search>`` block of what remains, else its first
``<answer>...</answer>`` block (tags any case), else none; the reply is invalid when it has neither block, has both
a ``<search>`` and an ``<answer>`` tag, or has either tag more than once (no ``<think>`` requirement). An invalid
reply's block is still sent, as in the reference. A block whose content is empty after cleaning sends nothing
(the invalid-action step: the turn is used), keeping the reference's validity flag.

State (``key_mode="state"``): the question id, the SORTED SET of passage ids retrieved so far (what the agent
has found, whatever the order and the queries), and the normalised answer once given. The observation key
(default) is finer in one way: it also tells which passages the last search displayed.
"""

from __future__ import annotations

import functools
import json
import re
import string
import unicodedata
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from environments.base import INVALID_ACTION_RULES, MAX_PARSE_CHARS, StepResult, TextEnv, extract_tag
from environments.search.corpus import (
    SPLITS,
    CorpusConfig,
    FictionalCorpus,
    Question,
    generate_corpus,
    load_questions_jsonl,
)
from environments.search.prompt import SEARCH_HISTORY_ITEM, SEARCH_PROMPT, SEARCH_STEP_LIMIT_PHRASES
from environments.search.retriever import STOPWORDS, BM25Retriever, HTTPRetriever, Passage, Retriever, RetrieverError

__all__ = [
    "MAX_ANSWER_CHARS",
    "MAX_QUERY_CHARS",
    "SearchQAEnv",
    "exact_match",
    "match_canonical",
    "normalize_answer",
    "parse_search_action",
    "parse_search_format",
]

#: Longest query kept (characters); longer ones are cut. Real queries are a few words; Search-R1 queries are short.
MAX_QUERY_CHARS = 256
#: Longest answer kept (characters); gold answers are short, so a longer answer could not match anyway.
MAX_ANSWER_CHARS = 256
#: Most passages a search may show (every passage goes into the prompt).
MAX_TOP_K = 100

START_TEXT = "No search yet. Search with <search>query</search>, or answer with <answer>answer</answer>."
NO_RESULTS_TEXT = "No passage matched the query."

_ACTIVE = ("search", "answer", "action")  # tags that hold an action
_PASSIVE = ("think", "information")  # tags whose content is ignored
_TAG = re.compile(r"<(/?)(think|information|search|answer|action)>", re.IGNORECASE)
_CANONICAL = re.compile(r"(search|answer)\s*\[(.*)\]", re.IGNORECASE | re.DOTALL)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_ENTITY = re.compile(r"[A-Z][\w'-]*(?:\s+[A-Z][\w'-]*)*")
_QUESTION_WORDS = frozenset("where which who whom whose what when why how in on at".split())


# ---------------------------------------------------------------------------------------------- reward
def normalize_answer(text: str) -> str:
    """Normalise an answer for exact match (as in SQuAD / Search-R1): lower-case, delete punctuation (ASCII
    punctuation and every Unicode ``P*`` character), replace the articles a/an/the by spaces, collapse whitespace.
    ``"The River  Tesh."`` -> ``"river tesh"``."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in string.punctuation and not unicodedata.category(ch).startswith("P"))
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def exact_match(prediction: str, answers: Sequence[str]) -> float:
    """1.0 when ``normalize_answer(prediction)`` equals the normalised form of any gold answer, else 0.0.
    An answer that normalises to the empty string never matches."""
    pred = normalize_answer(prediction)
    return 1.0 if pred and any(pred == normalize_answer(a) for a in answers) else 0.0


# ---------------------------------------------------------------------------------------------- parsing
def _clean(content: str, limit: int) -> str:
    text = "".join(ch if ch.isprintable() else " " for ch in content)
    text = " ".join(text.split())
    if len(text) > limit:
        cut = text.rfind(" ", 0, limit + 1)
        text = text[: cut if cut > limit // 2 else limit].rstrip()
    return text


def _canonical(verb: str, content: str) -> str | None:
    content = _clean(content, MAX_QUERY_CHARS if verb == "search" else MAX_ANSWER_CHARS)
    return f"{verb}[{content}]" if content else None


def match_canonical(candidate: str) -> str | None:
    """``"search[q]"`` / ``"answer[a]"`` (verb case-insensitive, content cleaned) -> the canonical action, else None."""
    match = _CANONICAL.fullmatch(candidate.strip())
    return _canonical(match.group(1).lower(), match.group(2)) if match else None


def _blocks(text: str) -> tuple[list[tuple[str, str]], str] | None:
    """Split ``text`` into action blocks ``[(tag, content)]`` and the text outside any block, in one linear scan.
    Returns None when the tags are malformed (a stray or unclosed action tag, or a tag inside an action)."""
    tags = list(_TAG.finditer(text))
    pos = 0
    first_open = next((m.start() for m in tags if m.group(2).lower() == "think" and not m.group(1)), len(text))
    lone_close = next((m for m in tags if m.group(2).lower() == "think" and m.group(1)), None)
    if lone_close is not None and lone_close.start() < first_open:
        pos = lone_close.end()  # the reply starts inside a thought opened by the prompt
        tags = [m for m in tags if m.start() >= pos]
    blocks: list[tuple[str, str]] = []
    outside: list[str] = []
    open_name, open_end = None, 0
    for m in tags:
        closing, name = bool(m.group(1)), m.group(2).lower()
        if open_name is None:
            if closing and name in _ACTIVE:
                return None  # a closing action tag with nothing open
            outside.append(text[pos : m.start()])
            pos = m.end()
            if not closing:
                open_name, open_end = name, m.end()
        elif closing and name == open_name:
            if name in _ACTIVE:
                blocks.append((name, text[open_end : m.start()]))
            open_name, pos = None, m.end()
        elif open_name in _ACTIVE:
            return None  # a tag inside an action
        # else: any tag inside a thought or an information block is plain text
    if open_name in _ACTIVE:
        return None  # an unclosed action
    if open_name is None:
        outside.append(text[pos:])
    return blocks, "".join(outside)  # an unclosed thought swallows the rest of the reply


def parse_search_action(llm_text: Any) -> tuple[str | None, bool]:
    """Map an LLM reply to ``("search[q]" | "answer[a]", True)`` or ``(None, False)``; the rules are in the module
    docstring. Pure and total: never raises, whatever ``llm_text`` is (bytes are decoded as UTF-8 with
    replacement; other non-strings are invalid); only the first ``MAX_PARSE_CHARS`` characters are read."""
    if isinstance(llm_text, bytes | bytearray):
        llm_text = bytes(llm_text).decode("utf-8", errors="replace")
    if not isinstance(llm_text, str):
        return None, False
    parsed = _blocks(llm_text[:MAX_PARSE_CHARS])
    if parsed is None:
        return None, False
    blocks, outside = parsed
    if len(blocks) > 1:
        return None, False
    if not blocks:
        action = match_canonical(outside)
    elif blocks[0][0] == "action":
        action = match_canonical(blocks[0][1])
    else:
        action = _canonical(*blocks[0])
    return (action, True) if action is not None else (None, False)


_SEARCH_OPEN = re.compile("<search>", re.IGNORECASE)
_ANSWER_OPEN = re.compile("<answer>", re.IGNORECASE)


def parse_search_format(text: str) -> tuple[str | None, bool]:
    """The ``format`` rule (the reference's ``search_projection``; see the module docstring): ``(command, valid)``
    with the command ``"search[q]"``, ``"answer[a]"`` or None. Linear in ``len(text)``."""
    for closing in ("</search>", "</answer>"):  # the reference cuts at the first closing tag, exact case
        cut = text.find(closing)
        if cut != -1:
            trimmed = text[: cut + len(closing)]
            break
    else:
        trimmed = text
    command, found = None, False
    for verb in ("search", "answer"):
        blocks = extract_tag(trimmed, verb)  # the first block is the reference's non-greedy regex match
        if blocks:
            command, found = _canonical(verb, blocks[0]), True
            break
    n_search, n_answer = len(_SEARCH_OPEN.findall(text)), len(_ANSWER_OPEN.findall(text))
    valid = found and not (n_search and n_answer) and n_search <= 1 and n_answer <= 1
    return command, valid


# ---------------------------------------------------------------------------------------------- environment
@functools.lru_cache(maxsize=8)
def _generated(seed: int, config: CorpusConfig) -> tuple[FictionalCorpus, BM25Retriever]:
    """The generated corpus and its BM25 index, built once per process and shared (both are read-only)."""
    corpus = generate_corpus(seed, config)
    return corpus, BM25Retriever(corpus.passages)


class SearchQAEnv(TextEnv):
    """Search-augmented QA: search a corpus, then answer; exact-match reward (details in the module docstring).

    Args:
        retriever: a :class:`Retriever` to use as is (not closed by :meth:`close`).
        retriever_url: a Search-R1-style retrieval server (``http://host:port``); an :class:`HTTPRetriever` is
            made with ``retriever_options`` (timeout per attempt, total_timeout, max_retries, backoff, backoff_max,
            max_response_bytes).
        corpus_path: a corpus JSONL file (``id``/``title``/``text`` per line) indexed with BM25
            (``retriever_options``: k1, b); needs ``questions_path``.
        questions_path: a question JSONL file (``question``, ``answers`` or ``golden_answers``, optional ``id``,
            ``split``, ``type``). Without it, the questions of the generated corpus are used.
        At most one of ``retriever``, ``retriever_url`` and ``corpus_path``; with none of them, BM25 over the
        generated fictional corpus (``corpus_seed``, ``corpus_config``: a :class:`CorpusConfig` or its fields).
        top_k: passages returned per search (3, as Search-R1).
        max_steps: turns per episode (4, as the paper's search setting).
        key_mode: anchor key mode; "observation" by default (the paper's choice).

    ``reset(seed=i)`` plays question ``i mod n`` of the split (``n`` questions); ``reset(seed=None)`` draws one
    from the environment's random stream. ``task_type`` is the question's kind: ``"1hop/<template>"`` or
    ``"2hop/<template>"`` for generated questions (group metrics by the prefix for single- vs two-hop), the
    ``type`` field for user questions.
    """

    name = "search"
    splits = SPLITS
    prompt_template = SEARCH_PROMPT
    history_item_template = SEARCH_HISTORY_ITEM
    step_limit_phrases = SEARCH_STEP_LIMIT_PHRASES

    def __init__(
        self,
        *,
        retriever: Retriever | None = None,
        retriever_url: str | None = None,
        corpus_path: str | Path | None = None,
        questions_path: str | Path | None = None,
        top_k: int = 3,
        max_steps: int = 4,
        key_mode: str = "observation",
        corpus_seed: int = 0,
        corpus_config: CorpusConfig | Mapping[str, Any] | None = None,
        retriever_options: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(key_mode=key_mode, max_steps=max_steps)
        if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= MAX_TOP_K:
            raise ValueError(
                f"top_k must be an int in [1, {MAX_TOP_K}] (passages shown per search; Search-R1 uses 3), got {top_k!r}"
            )
        sources = {"retriever": retriever, "retriever_url": retriever_url, "corpus_path": corpus_path}
        given = [name for name, value in sources.items() if value is not None]
        if len(given) > 1:
            raise ValueError(f"give at most one of retriever, retriever_url and corpus_path; got {given}")
        if corpus_path is not None and questions_path is None:
            raise ValueError(
                "corpus_path needs questions_path (a JSONL file of question/answers about that corpus): the "
                "generated questions are about the generated corpus only"
            )
        if retriever is not None and not isinstance(retriever, Retriever):
            raise ValueError(f"retriever must be a Retriever, got {type(retriever).__name__}")
        options = dict(retriever_options or {})
        if options and retriever_url is None and corpus_path is None:
            raise ValueError("retriever_options apply to retriever_url (HTTP) or corpus_path (BM25) only")
        self.top_k = top_k
        self._owns_retriever = False

        corpus = None
        if questions_path is not None and given and corpus_config is not None:
            raise ValueError("corpus_config is unused when questions_path and a retriever source are given")
        if questions_path is None or not given:
            config = _corpus_config(corpus_config)
            if isinstance(corpus_seed, bool) or not isinstance(corpus_seed, int) or corpus_seed < 0:
                raise ValueError(f"corpus_seed must be a non-negative int, got {corpus_seed!r}")
            corpus, default_retriever = _generated(corpus_seed, config)
        try:
            if retriever is not None:
                self.retriever: Retriever = retriever
            elif retriever_url is not None:
                self.retriever = HTTPRetriever(retriever_url, **options)
                self._owns_retriever = True
            elif corpus_path is not None:
                self.retriever = BM25Retriever(corpus_path, **options)
            else:
                self.retriever = default_retriever
        except TypeError as exc:
            raise ValueError(f"invalid retriever_options {sorted(options)}: {exc}") from exc
        self.questions: dict[str, tuple[Question, ...]] = (
            load_questions_jsonl(questions_path) if questions_path is not None else dict(corpus.questions)
        )
        self.corpus = corpus
        self._question: Question | None = None
        self._retrieved: set[str] = set()
        self._answer: str | None = None

    @classmethod
    def setup_problems(cls, kwargs: Mapping[str, Any]) -> list[tuple[str | None, str]]:
        """``corpus_path`` and ``questions_path``, when given, must be existing files; nothing is read."""
        return [
            (name, f"{kwargs[name]} is not a file: give the path of an existing JSONL file")
            for name in ("corpus_path", "questions_path")
            if kwargs.get(name) is not None and not Path(kwargs[name]).is_file()
        ]

    # ------------------------------------------------------------------ hooks
    def _reset(self, split: str, options: dict[str, Any]) -> str:
        questions = self.questions.get(split, ())
        if not questions:
            raise ValueError(f"search: the {split!r} split has no questions; give questions with that split")
        index = self.seed % len(questions) if self.seed is not None else int(self.np_random.integers(len(questions)))
        q = questions[index]
        self._question = q
        self._retrieved = set()
        self._answer = None
        self.task_description = q.question
        self.task_id = q.id
        self.task_type = q.kind
        return self._observation(START_TEXT)

    def _step(self, action: str) -> StepResult:
        question = self._question
        if question is None:  # unreachable through step(), which requires reset()
            raise RuntimeError("search: no question; call reset() first")
        if match_canonical(action) != action:
            raise ValueError(
                f"not a canonical action {action!r:.100}: use parse_action() to get search[...]/answer[...]"
            )
        match = _CANONICAL.fullmatch(action)
        verb, content = match.group(1), match.group(2)
        if verb == "search":
            results = self.retriever.search([content], self.top_k)
            if not isinstance(results, list) or len(results) != 1:
                raise RetrieverError(
                    f"{type(self.retriever).__name__}.search returned {results!r:.200} for 1 query; expected a list "
                    "holding one list of passages"
                )
            passages = results[0][: self.top_k]
            self._retrieved.update(p.id for p in passages)
            return StepResult(
                observation=self._observation(_information(passages)),
                extra={"query": content, "retrieved_ids": [p.id for p in passages]},
            )
        reward = exact_match(content, question.answers)
        self._answer = content
        verdict = "The answer is correct." if reward == 1.0 else "The answer is not correct."
        return StepResult(
            observation=self._observation(f"Final answer: {content}\n{verdict}"),
            reward=reward,
            terminated=True,
            won=reward == 1.0,
            extra={"answer": content, "gold_answers": list(question.answers)},
        )

    def _state_digest(self) -> str:
        qid = self._question.id if self._question is not None else None
        answer = normalize_answer(self._answer) if self._answer is not None else None
        return json.dumps({"question": qid, "retrieved": sorted(self._retrieved), "answer": answer})

    def _match_action(self, candidate: str) -> str | None:
        return match_canonical(candidate)

    def parse_action(self, llm_text: str, rule: str = "admissible") -> tuple[str | None, bool]:
        """Extract ``search[q]`` / ``answer[a]`` from an LLM reply under ``rule`` (``"admissible"``:
        :func:`parse_search_action`; ``"format"``: :func:`parse_search_format`; rules in the module docstring);
        pure and total in ``llm_text``.

        Raises:
            ValueError: ``rule`` is not one of :data:`~environments.base.INVALID_ACTION_RULES`.
        """
        if rule not in INVALID_ACTION_RULES:
            raise ValueError(f"unknown invalid-action rule {rule!r}; use one of {list(INVALID_ACTION_RULES)}")
        if isinstance(llm_text, bytes | bytearray):
            llm_text = bytes(llm_text).decode("utf-8", errors="replace")
        if isinstance(llm_text, str) and self.parse_style.lowercase:  # env.parse.lowercase (the reference: off here)
            llm_text = llm_text.lower()
        if rule == "admissible":
            return parse_search_action(llm_text)
        if not isinstance(llm_text, str):
            return None, False
        return parse_search_format(llm_text[:MAX_PARSE_CHARS])

    def example_reply(self, action: str) -> str:
        """A well-formed reply taking ``action`` (``search[q]`` or ``answer[a]``) under both rules:
        ``<think>...</think><search>q</search>`` (or ``<answer>a</answer>``); any other string goes into a search
        block."""
        match = _CANONICAL.fullmatch(action.strip())
        verb, content = (match.group(1).lower(), match.group(2)) if match else ("search", action)
        return f"<think>I choose {verb}.</think><{verb}>{content}</{verb}>"

    def task_type_of(self, seed: int, split: str) -> str | None:
        """The kind of question ``reset(seed=seed)`` plays in ``split`` (``questions[split][seed mod n]``).

        Raises:
            ValueError: unknown ``split``, or a split without questions.
        """
        self._check_split(split)
        questions = self.questions.get(split, ())
        if not questions:
            raise ValueError(f"search: the {split!r} split has no questions; give questions with that split")
        return questions[int(seed) % len(questions)].kind

    def example_actions(self) -> list[str]:
        """A few concrete actions for the current question, built from its words only (never from the gold
        answer): a search for each of the first two capitalised names, a search with all its content words, and
        an answer naming the last capitalised name (or the last content word)."""
        if self._question is None:
            return []
        text = self._question.question
        entities = []
        for run in _ENTITY.findall(text):
            words = run.split()
            while words and words[0].lower() in _QUESTION_WORDS:
                words = words[1:]
            if words:
                entities.append(" ".join(words))
        content = [w for w in re.findall(r"\w[\w'-]*", text) if w.lower() not in STOPWORDS | _QUESTION_WORDS]
        candidates = [_canonical("search", e) for e in entities[:2]]
        candidates.append(_canonical("search", " ".join(content) or text))
        candidates.append(_canonical("answer", entities[-1] if entities else (content or [text])[-1]))
        return list(dict.fromkeys(a for a in candidates if a is not None))

    def checker_paths(self) -> list[tuple[list[str | None], list[str | None]]]:
        """Pairs of action sequences that reach the same state from the current question (for the checker):
        an invalid step changes nothing; repeating a search adds nothing; the state is the SET of passages seen
        and the observation shows the last search (``A, B, A`` == ``B, A``); and, for bag-of-words retrievers,
        the same words in another order and case retrieve the same passages. Pairs longer than ``max_steps``
        are left out."""
        pairs: list[tuple[list[str | None], list[str | None]]] = [([], [None])]
        searches = [a for a in self.example_actions() if a.startswith("search[")]
        if searches:
            a, b = searches[0], searches[-1]
            pairs += [([a], [None, a]), ([a], [a, a])]
            if b != a:
                pairs.append(([a, b, a], [b, a]))
            if self.retriever.order_invariant:
                query = a[len("search[") : -1]
                shuffled = " ".join(reversed(query.split())).swapcase()
                if shuffled != query:
                    pairs.append(([a], [f"search[{shuffled}]"]))
        return [(x, y) for x, y in pairs if max(len(x), len(y)) <= self.max_steps]

    def close(self) -> None:
        """Close the HTTP retriever this environment made (a retriever passed in is left open)."""
        if self._owns_retriever:
            self.retriever.close()

    # ------------------------------------------------------------------ rendering
    def _observation(self, body: str) -> str:
        return f"Question: {self.task_description}\n{body}"


def _information(passages: Sequence[Passage]) -> str:
    if not passages:
        return f"<information>\n{NO_RESULTS_TEXT}\n</information>"
    lines = [
        f"Doc {i} (Title: {' '.join(p.title.split())}) {' '.join(p.text.split())}" for i, p in enumerate(passages, 1)
    ]
    return "<information>\n" + "\n".join(lines) + "\n</information>"


def _corpus_config(value: CorpusConfig | Mapping[str, Any] | None) -> CorpusConfig:
    if value is None:
        return CorpusConfig()
    if isinstance(value, CorpusConfig):
        return value
    if isinstance(value, Mapping):
        try:
            return CorpusConfig(**value)
        except TypeError as exc:
            raise ValueError(f"invalid corpus_config {dict(value)}: {exc}") from exc
    raise ValueError(f"corpus_config must be a CorpusConfig or a dict of its fields, got {type(value).__name__}")
