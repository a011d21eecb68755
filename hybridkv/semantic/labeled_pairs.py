"""A labeled set of questions for judging a semantic cache, generated from
templates (deterministic for a seed).

Each *family* instance has a base question and variants; a variant carries
the label of its answer: variants with the base's label are true
paraphrases, the others hard negatives of a named kind:

- `negation`: "Is coffee bad for you?" / "Is coffee not bad for you?"
- `swap`: entities exchanged ("Is Oslo bigger than Rome?" / "... Rome ... Oslo?")
- `number`: another number ("Convert 5 km to miles" / "Convert 7 km to miles")
- `unit`: another unit ("... to miles" / "... to feet")
- `reverse`: the question asked the other way ("Convert 5 miles to km")
- `intent`: the same keywords, another question ("How do I install X" /
  "How do I uninstall X", "What is the population of France?")
- `entity`: another entity in the same sentence ("capital of Peru" / "of Chile")

A label names the answer's meaning ("capital:Peru", "bigger:Oslo>Rome"), so
two questions of different groups that mean the same share it. `questions`
gives groups of (text, label, kind) rows, kind "base", "paraphrase" or a
negative kind.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

COUNTRIES = ("France Spain Italy Germany Peru Chile Kenya Egypt Japan Vietnam Canada Mexico "
             "Brazil Norway Sweden Poland Greece Turkey India Nepal Ghana Morocco Cuba "
             "Ireland Portugal Austria Hungary Finland Iceland Argentina").split()
CITIES = ("Paris Madrid Rome Berlin Lima Santiago Nairobi Cairo Tokyo Hanoi Ottawa Oslo "
          "Stockholm Warsaw Athens Ankara Delhi Dublin Lisbon Vienna Budapest Helsinki "
          "Boston Chicago Denver Seattle Houston Toronto Sydney Mumbai").split()
FOODS = ("coffee chocolate sugar butter cheese rice bread eggs milk tea wine beer salt "
         "honey bacon popcorn yogurt soda garlic avocado").split()
SOFTWARE = ("Python Docker Chrome Firefox Java Node Git Zoom Slack Spotify Steam Skype "
            "Photoshop Blender Postgres Redis Nginx Vim Emacs Anaconda").split()
SYSTEMS = ("Windows", "Ubuntu", "macOS", "Fedora", "Debian", "Android")
VERBS = (("install", "uninstall"), ("enable", "disable"), ("update", "downgrade"),
         ("start", "stop"), ("encrypt", "decrypt"))
UNITS = (("km", "miles", "feet"), ("kg", "pounds", "ounces"), ("liters", "gallons", "ml"),
         ("celsius", "fahrenheit", "kelvin"), ("meters", "feet", "inches"),
         ("hours", "minutes", "days"), ("dollars", "euros", "yen"))
BOOKS = (("Hamlet", "Shakespeare"), ("Ulysses", "Joyce"), ("Dracula", "Stoker"),
         ("Emma", "Austen"), ("Beloved", "Morrison"), ("Middlemarch", "Eliot"),
         ("Walden", "Thoreau"), ("Candide", "Voltaire"), ("Lolita", "Nabokov"),
         ("Persuasion", "Austen"), ("Frankenstein", "Shelley"), ("Rebecca", "Maurier"))


@dataclass(frozen=True)
class Question:
    text: str
    label: str
    kind: str


Family = Callable[[random.Random], list[Question]]


def _capital(rng: random.Random) -> list[Question]:
    c, other = rng.sample(COUNTRIES, 2)
    same = [f"What's the capital of {c}?", f"Which city is the capital of {c}?",
            f"Tell me the capital of {c}.", f"What is the capital city of {c}?",
            f"capital of {c}?", f"Can you tell me what the capital of {c} is?"]
    return group_rows(f"capital:{c}", f"What is the capital of {c}?", same, [
        ("intent", f"population:{c}", f"What is the population of {c}?"),
        ("intent", f"currency:{c}", f"What is the currency of {c}?"),
        ("intent", f"largest-city:{c}", f"What is the largest city in {c}?"),
        ("entity", f"capital:{other}", f"What is the capital of {other}?")])


def _compare(rng: random.Random) -> list[Question]:
    x, y = rng.sample(CITIES, 2)
    same = [f"Is {x} larger than {y}?", f"Is {x} a bigger city than {y}?",
            f"Is {x} bigger in size than {y}?", f"Is {y} smaller than {x}?"]
    return group_rows(f"bigger:{x}>{y}", f"Is {x} bigger than {y}?", same, [
        ("swap", f"bigger:{y}>{x}", f"Is {y} bigger than {x}?"),
        ("swap", f"bigger:{y}>{x}", f"Is {y} larger than {x}?"),
        ("negation", f"not-bigger:{x}>{y}", f"Is {x} not bigger than {y}?"),
        ("intent", f"bigger:{y}>{x}", f"Is {x} smaller than {y}?"),
        ("intent", f"older:{x}>{y}", f"Is {x} older than {y}?")])


def _convert(rng: random.Random) -> list[Question]:
    a, b, c = rng.choice(UNITS)
    n, m = rng.sample(range(2, 500), 2)
    same = [f"What is {n} {a} in {b}?", f"Please convert {n} {a} into {b}.",
            f"How many {b} is {n} {a}?", f"convert {n} {a} to {b}",
            f"Can you convert {n} {a} to {b}?"]
    return group_rows(f"convert:{n}{a}>{b}", f"Convert {n} {a} to {b}", same, [
        ("reverse", f"convert:{n}{b}>{a}", f"Convert {n} {b} to {a}"),
        ("reverse", f"convert:{n}{b}>{a}", f"What is {n} {b} in {a}?"),
        ("number", f"convert:{m}{a}>{b}", f"Convert {m} {a} to {b}"),
        ("number", f"convert:{m}{a}>{b}", f"What is {m} {a} in {b}?"),
        ("unit", f"convert:{n}{a}>{c}", f"Convert {n} {a} to {c}")])


def _howto(rng: random.Random) -> list[Question]:
    verb, anti = rng.choice(VERBS)
    thing, system, other = rng.choice(SOFTWARE), *rng.sample(SYSTEMS, 2)
    same = [f"How can I {verb} {thing} on {system}?",
            f"What are the steps to {verb} {thing} on {system}?",
            f"How to {verb} {thing} on {system}?",
            f"What's the way to {verb} {thing} on {system}?"]
    base = f"How do I {verb} {thing} on {system}?"
    return group_rows(f"how:{verb}:{thing}:{system}", base, same, [
        ("intent", f"how:{anti}:{thing}:{system}", f"How do I {anti} {thing} on {system}?"),
        ("intent", f"why:{verb}:{thing}:{system}", f"Why should I {verb} {thing} on {system}?"),
        ("negation", f"how-not:{verb}:{thing}:{system}",
         f"How do I not {verb} {thing} on {system}?"),
        ("entity", f"how:{verb}:{thing}:{other}", f"How do I {verb} {thing} on {other}?")])


def _health(rng: random.Random) -> list[Question]:
    food = rng.choice(FOODS)
    same = [f"Is {food} harmful to your health?", f"Is eating {food} bad for your health?",
            f"Is {food} bad for you?", f"Is {food} bad for the health?",
            f"Is {food} unhealthy?"]
    return group_rows(f"bad:{food}", f"Is {food} bad for your health?", same, [
        ("negation", f"not-bad:{food}", f"Is {food} not bad for your health?"),
        ("intent", f"good:{food}", f"Is {food} good for your health?"),
        ("intent", f"how-much-bad:{food}", f"How much {food} is bad for your health?"),
        ("intent", f"why-bad:{food}", f"Why is {food} bad for your health?")])


def _author(rng: random.Random) -> list[Question]:
    book, author = rng.choice(BOOKS)
    same = [f"Who is the author of {book}?", f"Who was {book} written by?",
            f"Who wrote the book {book}?", f"Which writer wrote {book}?"]
    return group_rows(f"author:{book}", f"Who wrote {book}?", same, [
        ("reverse", f"works:{author}", f"What did {author} write?"),
        ("reverse", f"works:{author}", f"Which books did {author} write?"),
        ("intent", f"written-when:{book}", f"When was {book} written?"),
        ("intent", f"publisher:{book}", f"Who published {book}?")])


def _arithmetic(rng: random.Random) -> list[Question]:
    a, b, c = rng.sample(range(2, 999), 3)
    same = [f"What is the sum of {a} and {b}?", f"Calculate {a} plus {b}.",
            f"What's {a} plus {b}?", f"What do you get when you add {a} and {b}?"]
    return group_rows(f"sum:{min(a, b)}+{max(a, b)}", f"What is {a} plus {b}?", same, [
        ("number", f"sum:{min(a, c)}+{max(a, c)}", f"What is {a} plus {c}?"),
        ("intent", f"diff:{a}-{b}", f"What is {a} minus {b}?"),
        ("intent", f"product:{min(a, b)}*{max(a, b)}", f"What is {a} times {b}?"),
        ("number", f"sum:{min(a, c)}+{max(a, c)}", f"What is the sum of {a} and {c}?")])


def _population(rng: random.Random) -> list[Question]:
    city = rng.choice(CITIES)
    year, other = rng.sample(range(1900, 2024), 2)
    same = [f"How many people lived in {city} in {year}?",
            f"What was {city}'s population in {year}?",
            f"What was the number of inhabitants of {city} in {year}?"]
    return group_rows(f"population:{city}:{year}", f"What was the population of {city} in {year}?",
                 same, [
        ("number", f"population:{city}:{other}",
         f"What was the population of {city} in {other}?"),
        ("intent", f"area:{city}:{year}", f"What was the area of {city} in {year}?"),
        ("intent", f"company:{city}:{year}",
         f"What was the largest company in {city} in {year}?")])


FAMILIES: dict[str, Family] = {"capital": _capital, "compare": _compare, "convert": _convert,
                               "howto": _howto, "health": _health, "author": _author,
                               "arithmetic": _arithmetic, "population": _population}


def group_rows(label: str, base: str, same: list[str], negatives: list[tuple[str, str, str]]
          ) -> list[Question]:
    """Labels name the meaning, so equal meanings in different groups agree."""
    rows = [Question(base, label, "base")] + [Question(t, label, "paraphrase") for t in same]
    return rows + [Question(text, meaning, kind) for kind, meaning, text in negatives]


def questions(seed: int = 0, families_per_template: int = 100) -> list[list[Question]]:
    """Groups of questions (base first), `families_per_template` of each family
    (fewer when its slots run out), deterministic for `seed`; no base twice."""
    return draw_groups(FAMILIES, seed, families_per_template)


def draw_groups(families: dict[str, Family], seed: int, families_per_template: int
                ) -> list[list[Question]]:
    """`families_per_template` groups from each of `families` in turn (fewer when
    its slots run out), deterministic for `seed`; no base question twice."""
    rng = random.Random(seed)
    groups, bases = [], set()
    for family in families.values():
        made = tries = 0
        while made < families_per_template and tries < 20 * families_per_template:
            tries += 1
            group = family(rng)
            if group[0].text not in bases:
                bases.add(group[0].text)
                groups.append(group)
                made += 1
    return groups


def pairs(seed: int = 0, families_per_template: int = 100) -> list[tuple[Question, Question]]:
    """(base, variant) pairs of every group: same label = true paraphrase."""
    return [(g[0], q) for g in questions(seed, families_per_template) for q in g[1:]]
