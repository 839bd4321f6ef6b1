"""Search-augmented question answering: retrievers (embedded BM25, Search-R1 HTTP client), a generated corpus
of fictional facts with single- and two-hop questions, and the :class:`SearchQAEnv` environment."""

from environments.search.corpus import CorpusConfig, FictionalCorpus, Question, generate_corpus, load_questions_jsonl
from environments.search.env import SearchQAEnv, exact_match, normalize_answer, parse_search_action
from environments.search.retriever import (
    BM25Retriever,
    HTTPRetriever,
    Passage,
    Retriever,
    RetrieverError,
    load_corpus_jsonl,
)

__all__ = [
    "BM25Retriever",
    "CorpusConfig",
    "FictionalCorpus",
    "HTTPRetriever",
    "Passage",
    "Question",
    "Retriever",
    "RetrieverError",
    "SearchQAEnv",
    "exact_match",
    "generate_corpus",
    "load_corpus_jsonl",
    "load_questions_jsonl",
    "normalize_answer",
    "parse_search_action",
]
