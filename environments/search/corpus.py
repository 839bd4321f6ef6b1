"""A seeded generator of a small corpus of FICTIONAL facts with single-hop and two-hop questions.

Nothing here is true of the real world, so a model cannot answer from memory: it has to search. The world has
provinces, towns, rivers, seas, people and companies with invented names (coined from syllables), linked by a
few relations; every entity has one passage (title = its name) stating its facts, e.g.

    Velora Quint was born in Marrowick. Velora Quint worked as a cartographer.
    Marrowick is a town in the province of Orvane. Marrowick lies on the river Tesh.

Questions are written from templates:

* single-hop (the answer is in the passage of the entity the question names): birthplace, occupation,
  town_river, town_province, province_capital, founder, headquarters;
* two-hop (the first passage names a bridge entity whose passage holds the answer): birthplace_river,
  birthplace_province, founder_birthplace, founder_occupation, headquarters_river.

Distractor passages make retrieval non-trivial: people share first names and surnames, and newspapers, regattas,
families and cups are named after towns, rivers, surnames and provinces without answering any question.

The questions are shuffled with the same seed and split into "train" and "test" (disjoint question sets).
``generate_corpus(seed)`` is deterministic: the same seed and config give the same passages, ids and questions.

User question files (``load_questions_jsonl``) have one JSON object per line: ``question`` (str), ``answers``
or Search-R1's ``golden_answers`` (str or list of str), and optionally ``id``, ``split`` ("train"/"test") and
``type`` (a task type string).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from environments.search.retriever import Passage, tokenize

__all__ = [
    "SPLITS",
    "CorpusConfig",
    "FictionalCorpus",
    "Question",
    "generate_corpus",
    "load_questions_jsonl",
]

SPLITS = ("train", "test")

_ONSETS = ("b", "br", "c", "d", "dr", "f", "g", "gr", "h", "k", "l", "m", "n", "p", "qu", "r", "s", "sh", "st", "t")
_ONSETS += ("th", "v", "w", "z")
_VOWELS = ("a", "e", "i", "o", "u", "a", "e", "o", "ai", "ei", "ou", "ia")
_CODAS = ("", "", "", "n", "r", "l", "s", "th", "m", "sk", "nd", "x", "rn")
_TOWN_SUFFIXES = ("wick", "ford", "holm", "by", "stead", "mere", "ton", "gate", "field", "haven", "moor", "bridge")
_PROVINCE_SUFFIXES = ("ia", "ane", "or", "esse", "and", "ary")
_COMPANY_KINDS = {
    "Works": "metalworking",
    "Foundry": "bell-casting",
    "Mills": "flour-milling",
    "Press": "printing",
    "Shipyards": "shipbuilding",
    "Brewery": "brewing",
    "Looms": "weaving",
    "Instruments": "instrument-making",
}
# occupation -> its plural
_OCCUPATIONS = {
    "cartographer": "cartographers",
    "glassblower": "glassblowers",
    "clockmaker": "clockmakers",
    "shipwright": "shipwrights",
    "botanist": "botanists",
    "bookbinder": "bookbinders",
    "astronomer": "astronomers",
    "stonemason": "stonemasons",
    "violinist": "violinists",
    "surveyor": "surveyors",
    "apothecary": "apothecaries",
    "beekeeper": "beekeepers",
}

# distractor passages: (title format, entity pool, text)
_DISTRACTORS = (
    (
        "{} Chronicle",
        "towns",
        "The {title} is a weekly newspaper first printed in {year}. It reports on markets and weather.",
    ),
    ("{} Regatta", "rivers", "The {title} is a rowing race first held in {year}. Crews from many towns take part."),
    ("{} family", "surnames", "The {title} is an old family of {occupations}, recorded since {year}."),
    ("{} Cup", "provinces", "The {title} is a chess tournament first played in {year}."),
)
# single-hop templates: kind -> question
_Q1 = {
    "birthplace": "Where was {person} born?",
    "occupation": "What was the occupation of {person}?",
    "town_river": "Which river does the town of {town} lie on?",
    "town_province": "Which province is the town of {town} in?",
    "province_capital": "What is the capital of the province of {province}?",
    "founder": "Who founded {company}?",
    "headquarters": "In which town does {company} have its headquarters?",
}
# two-hop templates
_Q2 = {
    "birthplace_river": "Which river flows through the town where {person} was born?",
    "birthplace_province": "In which province is the town where {person} was born?",
    "founder_birthplace": "Where was the founder of {company} born?",
    "founder_occupation": "What was the occupation of the founder of {company}?",
    "headquarters_river": "Which river flows through the town where {company} has its headquarters?",
}


#: Largest count of any one kind of entity in a generated world (each count of :class:`CorpusConfig`).
MAX_ENTITIES = 10_000


@dataclass(frozen=True)
class CorpusConfig:
    """Sizes of the generated world (defaults: ~270 passages, ~690 questions, generated in a few ms).

    n_people: people (each with a birthplace and an occupation); n_towns: towns (each in a province, on a river);
    n_companies: companies (each founded by a distinct person, headquartered in a town; <= n_people);
    n_provinces: provinces (<= n_towns; each has a capital); n_rivers: rivers; n_seas: seas rivers flow into;
    n_distractors: passages named after entities that answer no question; test_fraction: share of the questions
    in the "test" split.
    """

    n_people: int = 100
    n_towns: int = 40
    n_companies: int = 40
    n_provinces: int = 8
    n_rivers: int = 16
    n_seas: int = 4
    n_distractors: int = 60
    test_fraction: float = 0.2

    def __post_init__(self) -> None:
        for name in ("n_people", "n_towns", "n_companies", "n_provinces", "n_rivers", "n_seas", "n_distractors"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_ENTITIES:
                raise ValueError(
                    f"CorpusConfig.{name} must be an int in [0, {MAX_ENTITIES}], got {value!r} (the world is generated "
                    "in memory at construction)"
                )
        for name in ("n_people", "n_towns", "n_provinces", "n_rivers", "n_seas"):
            if getattr(self, name) < 1:
                raise ValueError(f"CorpusConfig.{name} must be at least 1")
        if self.n_companies > self.n_people:
            raise ValueError(
                f"CorpusConfig.n_companies ({self.n_companies}) must not exceed n_people ({self.n_people}): "
                "each company has its own founder"
            )
        if self.n_provinces > self.n_towns:
            raise ValueError(
                f"CorpusConfig.n_provinces ({self.n_provinces}) must not exceed n_towns ({self.n_towns}): "
                "each province needs a capital town"
            )
        if not (isinstance(self.test_fraction, int | float) and 0.0 < self.test_fraction < 1.0):
            raise ValueError(f"CorpusConfig.test_fraction must be in (0, 1), got {self.test_fraction!r}")


@dataclass(frozen=True)
class Question:
    """One question with its gold answers.

    id: unique id (``"q0042"`` for generated questions); question: the text; answers: accepted answers (exact
    match after normalisation against any of them); split: "train" or "test"; kind: ``"<hops>hop/<template>"``
    for generated questions (e.g. ``"2hop/birthplace_river"``; template names in the module docstring), else the
    ``type`` of a user question or None; hops: 1 or 2 (0 when unknown); support: ids of the passages that hold
    the needed facts, one per hop; queries: the entity names to search for, one per hop (the oracle's queries).
    """

    id: str
    question: str
    answers: tuple[str, ...]
    split: str
    kind: str | None = None
    hops: int = 0
    support: tuple[str, ...] = ()
    queries: tuple[str, ...] = ()


@dataclass(frozen=True)
class FictionalCorpus:
    """A generated corpus: ``passages`` (ids ``"doc0000"`` ...) and ``questions`` per split."""

    seed: int
    config: CorpusConfig
    passages: tuple[Passage, ...]
    questions: Mapping[str, tuple[Question, ...]] = field(default_factory=dict)

    def stats(self) -> dict[str, int]:
        """Counts: passages, distractor passages, questions per split and per hop count."""
        out = {"passages": len(self.passages), "distractors": self.config.n_distractors}
        for split, qs in self.questions.items():
            out[f"{split}_questions"] = len(qs)
            for hops in (1, 2):
                out[f"{split}_{hops}hop"] = sum(q.hops == hops for q in qs)
        return out

    def write_jsonl(self, corpus_path: str | Path, questions_path: str | Path) -> None:
        """Write the passages as corpus JSONL (``id``/``title``/``text``) and the questions as question JSONL
        (``id``/``question``/``golden_answers``/``split``/``type``), e.g. to serve them from a retrieval server."""
        with Path(corpus_path).open("w", encoding="utf-8") as fh:
            for p in self.passages:
                fh.write(json.dumps({"id": p.id, "title": p.title, "text": p.text}) + "\n")
        with Path(questions_path).open("w", encoding="utf-8") as fh:
            for split in SPLITS:
                for q in self.questions.get(split, ()):
                    row = {"id": q.id, "question": q.question, "golden_answers": list(q.answers), "split": split}
                    fh.write(json.dumps({**row, "type": q.kind}) + "\n")


class _Namer:
    """Coins fresh capitalised names from syllables; no name token is reused or clashes with template words."""

    def __init__(self, rng: np.random.Generator, reserved: set[str]):
        self.rng = rng
        self.used = set(reserved)

    def _syllable(self, coda: bool) -> str:
        pick = self.rng.choice
        return str(pick(_ONSETS)) + str(pick(_VOWELS)) + (str(pick(_CODAS)) if coda else "")

    def coin(self, n_syllables: tuple[int, int], suffixes: tuple[str, ...] = ("",), min_len: int = 3) -> str:
        for _ in range(10_000):
            n = int(self.rng.integers(n_syllables[0], n_syllables[1] + 1))
            word = "".join(self._syllable(coda=(i == n - 1)) for i in range(n)) + str(self.rng.choice(suffixes))
            if len(word) >= min_len and word not in self.used:
                self.used.add(word)
                return word.capitalize()
        raise RuntimeError("ran out of fresh names; reduce the corpus size")  # not reached for sane sizes


def _article(noun: str) -> str:
    return "an" if noun[0] in "aeiou" else "a"


def _template_words() -> set[str]:
    texts = list(_Q1.values()) + list(_Q2.values()) + list(_COMPANY_KINDS) + list(_COMPANY_KINDS.values())
    texts += list(_OCCUPATIONS) + ["town province river sea capital company headquarters founded born worked"]
    texts += [text.format(title="", year="", occupations="") for _, _, text in _DISTRACTORS]
    texts += [title_format.format("") for title_format, _, _ in _DISTRACTORS]
    return {tok for text in texts for tok in tokenize(text)}


def generate_corpus(seed: int = 0, config: CorpusConfig | None = None) -> FictionalCorpus:
    """Generate the fictional world, its passages and its questions from ``seed`` (see the module docstring).

    Raises:
        ValueError: a negative or non-int seed, or an invalid config.
    """
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise ValueError(f"corpus seed must be a non-negative int, got {seed!r}")
    config = config or CorpusConfig()
    rng = np.random.default_rng([int(seed), 0x5EA4C4])
    namer = _Namer(rng, _template_words())
    c = config

    provinces = [namer.coin((1, 2), _PROVINCE_SUFFIXES) for _ in range(c.n_provinces)]
    seas = [namer.coin((2, 2)) for _ in range(c.n_seas)]
    rivers = [namer.coin((1, 1), min_len=4) for _ in range(c.n_rivers)]
    towns = [namer.coin((1, 2), _TOWN_SUFFIXES) for _ in range(c.n_towns)]
    firsts = [namer.coin((2, 3)) for _ in range(max(4, c.n_people // 3))]
    surnames = [namer.coin((1, 2), min_len=4) for _ in range(max(4, c.n_people // 2))]
    # people: distinct (first, surname) pairs, so first names and surnames recur across people (hard negatives)
    pairs = rng.permutation(len(firsts) * len(surnames))[: c.n_people]
    people = [f"{firsts[int(i) // len(surnames)]} {surnames[int(i) % len(surnames)]}" for i in pairs]
    kinds = list(_COMPANY_KINDS)
    companies = [f"{namer.coin((2, 2))} {kinds[int(rng.integers(len(kinds)))]}" for _ in range(c.n_companies)]

    river_sea = {r: seas[int(rng.integers(c.n_seas))] for r in rivers}
    # the first n_provinces towns are the capitals, one per province; the others go to random provinces
    town_province = {
        t: provinces[i] if i < c.n_provinces else provinces[int(rng.integers(c.n_provinces))]
        for i, t in enumerate(towns)
    }
    capital = {p: towns[i] for i, p in enumerate(provinces)}
    town_river = {t: rivers[int(rng.integers(c.n_rivers))] for t in towns}
    birthplace = {p: towns[int(rng.integers(c.n_towns))] for p in people}
    occupation = {p: list(_OCCUPATIONS)[int(rng.integers(len(_OCCUPATIONS)))] for p in people}
    founders = [people[int(i)] for i in rng.permutation(c.n_people)[: c.n_companies]]
    founder = dict(zip(companies, founders, strict=True))
    founded_company = {f: co for co, f in founder.items()}
    founded_year = {co: int(rng.integers(1780, 1951)) for co in companies}
    headquarters = {co: towns[int(rng.integers(c.n_towns))] for co in companies}

    passages: list[Passage] = []
    pid: dict[str, str] = {}

    def add(title: str, text: str) -> None:
        pid[title] = f"doc{len(passages):04d}"
        passages.append(Passage(id=pid[title], title=title, text=text))

    for p in provinces:
        add(p, f"{p} is a province. The capital of {p} is {capital[p]}.")
    for s in seas:
        fed = [r for r in rivers if river_sea[r] == s]
        rivers_text = f" Rivers flowing into it include the {', the '.join(fed[:3])}." if fed else ""
        add(f"{s} Sea", f"The {s} Sea is an inland sea.{rivers_text}")
    for r in rivers:
        add(r, f"The {r} is a river. The {r} flows into the {river_sea[r]} Sea.")
    for t in towns:
        text = f"{t} is a town in the province of {town_province[t]}. {t} lies on the river {town_river[t]}."
        if capital[town_province[t]] == t:
            text += f" {t} is the capital of {town_province[t]}."
        add(t, text)
    for p in people:
        text = f"{p} was born in {birthplace[p]}. {p} worked as {_article(occupation[p])} {occupation[p]}."
        if p in founded_company:
            text += f" {p} founded {founded_company[p]} in {founded_year[founded_company[p]]}."
        add(p, text)
    for co in companies:
        industry = _COMPANY_KINDS[co.split()[-1]]
        add(
            co,
            f"{co} is {_article(industry)} {industry} company founded in {founded_year[co]} by {founder[co]}. "
            f"{co} has its headquarters in {headquarters[co]}.",
        )
    pools = {"towns": towns, "rivers": rivers, "surnames": surnames, "provinces": provinces}
    _add_distractors(rng, c.n_distractors, pools, add, set(pid))

    def river_answers(r: str) -> tuple[str, ...]:
        return (r, f"river {r}", f"{r} river")

    def province_answers(p: str) -> tuple[str, ...]:
        return (p, f"{p} province", f"province of {p}")

    raw: list[tuple[str, str, tuple[str, ...], int, tuple[str, ...]]] = []  # kind, question, answers, hops, chain

    def ask(kind: str, answers: tuple[str, ...], chain: tuple[str, ...], **names: str) -> None:
        template = _Q1.get(kind) or _Q2[kind]
        raw.append((f"{len(chain)}hop/{kind}", template.format(**names), answers, len(chain), chain))

    for p in people:
        t = birthplace[p]
        ask("birthplace", (t,), (p,), person=p)
        ask("occupation", (occupation[p],), (p,), person=p)
        ask("birthplace_river", river_answers(town_river[t]), (p, t), person=p)
        ask("birthplace_province", province_answers(town_province[t]), (p, t), person=p)
    for t in towns:
        ask("town_river", river_answers(town_river[t]), (t,), town=t)
        ask("town_province", province_answers(town_province[t]), (t,), town=t)
    for pr in provinces:
        ask("province_capital", (capital[pr],), (pr,), province=pr)
    for co in companies:
        f, hq = founder[co], headquarters[co]
        ask("founder", (f,), (co,), company=co)
        ask("headquarters", (hq,), (co,), company=co)
        ask("founder_birthplace", (birthplace[f],), (co, f), company=co)
        ask("founder_occupation", (occupation[f],), (co, f), company=co)
        ask("headquarters_river", river_answers(town_river[hq]), (co, hq), company=co)

    order = rng.permutation(len(raw))
    n_test = max(1, round(c.test_fraction * len(raw)))
    questions: dict[str, list[Question]] = {split: [] for split in SPLITS}
    for rank, i in enumerate(order):
        kind, text, answers, hops, chain = raw[int(i)]
        split = "test" if rank < n_test else "train"
        support = tuple(pid[name] for name in chain)
        questions[split].append(
            Question(f"q{int(i):04d}", text, answers, split, kind, hops, support=support, queries=chain)
        )
    return FictionalCorpus(
        seed=int(seed),
        config=config,
        passages=tuple(passages),
        questions={split: tuple(qs) for split, qs in questions.items()},
    )


def _add_distractors(rng: np.random.Generator, n: int, pools: dict[str, list[str]], add: Any, taken: set[str]) -> None:
    """Add ``n`` passages named after entities of the world that answer no question (hard negatives for BM25)."""
    made = 0
    for _ in range(50 * n):  # bounded: titles can run out for tiny worlds
        if made == n:
            break
        title_format, pool, text = _DISTRACTORS[int(rng.integers(len(_DISTRACTORS)))]
        title = title_format.format(pools[pool][int(rng.integers(len(pools[pool])))])
        year = int(rng.integers(1700, 1950))
        occupations = list(_OCCUPATIONS.values())[int(rng.integers(len(_OCCUPATIONS)))]
        if title in taken:
            continue
        taken.add(title)
        add(title, text.format(title=title, year=year, occupations=occupations))
        made += 1


def load_questions_jsonl(path: str | Path) -> dict[str, tuple[Question, ...]]:
    """Read a question JSONL file (format in the module docstring) into ``{"train": (...), "test": (...)}``.

    Lines without ``split`` go to "train". Ids default to ``"<split>-<line number>"``.

    Raises:
        FileNotFoundError: no such file.
        ValueError: a malformed line (the message names the line and field), an unknown split, duplicate ids,
            or a file without any question.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"questions file {path} does not exist (expected JSONL with question/answers)")
    out: dict[str, list[Question]] = {split: [] for split in SPLITS}
    seen: set[str] = set()
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                q = _question_from_record(json.loads(line), lineno)
            except (json.JSONDecodeError, ValueError) as exc:
                raise ValueError(f"{path}:{lineno}: invalid question row: {exc}") from exc
            if q.id in seen:
                raise ValueError(f"{path}:{lineno}: duplicate question id {q.id!r}")
            seen.add(q.id)
            out[q.split].append(q)
    if not seen:
        raise ValueError(f"{path} holds no questions")
    return {split: tuple(qs) for split, qs in out.items()}


def _question_from_record(record: Any, lineno: int) -> Question:
    if not isinstance(record, dict):
        raise ValueError(f"expected a JSON object, got {type(record).__name__}")
    text = record.get("question")
    if not isinstance(text, str) or not text.strip():
        raise ValueError("field 'question' must be a non-empty string")
    answers = record.get("answers", record.get("golden_answers"))
    if isinstance(answers, str):
        answers = [answers]
    if not isinstance(answers, list) or not answers or not all(isinstance(a, str) and a.strip() for a in answers):
        raise ValueError("field 'answers' (or 'golden_answers') must be a non-empty string or list of strings")
    split = record.get("split", "train")
    if split not in SPLITS:
        raise ValueError(f"field 'split' must be one of {list(SPLITS)}, got {split!r}")
    kind = record.get("type")
    if kind is not None and not isinstance(kind, str):
        raise ValueError(f"field 'type' must be a string, got {type(kind).__name__}")
    qid = record.get("id")
    qid = f"{split}-{lineno}" if qid is None else str(qid)
    return Question(qid, text.strip(), tuple(answers), split, kind)
