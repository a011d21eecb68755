"""Held-out labeled questions: families, templates and vocabulary that the
lexical checks were not written against, for judging the semantic cache on
traffic it was not tuned to. Same shape as `labeled_pairs` (groups of
`Question`, base first; a label names the answer's meaning), and the same
kinds of hard negatives, plus symmetric relations whose paraphrases reorder
the names ("distance from Oslo to Rome" / "from Rome to Oslo": one answer).

These templates were written once and frozen before any result was seen;
the evaluation reports them apart from the generated set the checks were
developed on. Changing them to fit the cache would void that.
"""

from __future__ import annotations

import random

from hybridkv.semantic.labeled_pairs import Family, Question, draw_groups, group_rows

PEOPLE = ("Einstein Curie Mozart Darwin Tesla Newton Picasso Beethoven Galileo Chopin "
          "Kepler Faraday Goethe Dickens Tolstoy Lincoln Gandhi Mandela Edison Bach").split()
WORDS = ("ephemeral ubiquitous serendipity melancholy pragmatic ambiguous resilient "
         "eloquent meticulous candid frugal gregarious lethargic nostalgia obsolete "
         "tenacious verbose whimsical zealous benevolent").split()
LANGUAGES = ("French German Spanish Italian Japanese Russian Swahili Dutch Korean Turkish "
             "Greek Polish").split()
GREETINGS = ("hello goodbye thanks please sorry friend water bread house love").split()
DEVICES = ("laptop phone printer router tablet monitor keyboard headset camera "
           "dishwasher").split()
DISHES = ("rice pasta potatoes broccoli salmon quinoa lentils carrots chicken shrimp").split()
METHODS = (("boil", "bake"), ("steam", "fry"), ("roast", "grill"), ("bake", "microwave"))
MONTHS = ("January February March April May June July August September October November "
          "December").split()
PLACES = ("Lagos Bogota Manila Jakarta Karachi Seoul Bangkok Havana Quito Dakar Riga "
          "Tallinn Zagreb Sofia Tunis Accra Muscat Doha Perth Auckland").split()
TOPICS = ("statistics calculus chemistry economics astronomy photography guitar painting "
          "accounting genetics").split()
ITEMS = ("perfume lighters matches knives batteries scissors medicine alcohol candles "
         "umbrellas").split()
ANIMALS = ("elephant horse cow lion bear tiger gorilla zebra moose camel").split()


def _birth(rng: random.Random) -> list[Question]:
    who, other = rng.sample(PEOPLE, 2)
    same = [f"What is {who}'s date of birth?", f"On what date was {who} born?",
            f"When is {who}'s birthday?", f"{who} was born when?",
            f"Could you tell me when {who} was born?"]
    return group_rows(f"born-when:{who}", f"When was {who} born?", same, [
        ("intent", f"died-when:{who}", f"When did {who} die?"),
        ("intent", f"born-where:{who}", f"Where was {who} born?"),
        ("intent", f"married-when:{who}", f"When did {who} get married?"),
        ("entity", f"born-when:{other}", f"When was {other} born?")])


def _define(rng: random.Random) -> list[Question]:
    word, other = rng.sample(WORDS, 2)
    same = [f"What is the meaning of the word {word}?", f"Define {word}.",
            f"Give me the definition of {word}.", f"What does the word {word} mean?",
            f"{word} meaning?"]
    return group_rows(f"define:{word}", f"What does {word} mean?", same, [
        ("intent", f"antonym:{word}", f"What is the opposite of {word}?"),
        ("intent", f"synonym:{word}", f"What is a synonym for {word}?"),
        ("intent", f"pronounce:{word}", f"How do you pronounce {word}?"),
        ("entity", f"define:{other}", f"What does {other} mean?")])


def _translate(rng: random.Random) -> list[Question]:
    (word, word2), (lang, other) = rng.sample(GREETINGS, 2), rng.sample(LANGUAGES, 2)
    same = [f"What is the {lang} word for {word}?", f"Translate {word} into {lang}.",
            f"What's {word} in {lang}?", f"How would I say {word} in {lang}?"]
    return group_rows(f"translate:{word}:{lang}", f"How do you say {word} in {lang}?", same, [
        ("entity", f"translate:{word}:{other}", f"How do you say {word} in {other}?"),
        ("entity", f"translate:{word2}:{lang}", f"How do you say {word2} in {lang}?"),
        ("intent", f"spell:{word}:{lang}", f"How do you spell {word} in {lang}?"),
        ("intent", f"pronounce:{word}:{lang}",
         f"How do you pronounce the {lang} word for {word}?")])


def _device(rng: random.Random) -> list[Question]:
    device, other = rng.sample(DEVICES, 2)
    same = [f"What can I do if my {device} does not turn on?",
            f"How do I fix a {device} that won't power on?",
            f"My {device} is not turning on, how can I fix it?",
            f"What should I do when my {device} won't switch on?"]
    return group_rows(f"fix-on:{device}", f"My {device} won't turn on, what should I do?", same, [
        ("intent", f"fix-off:{device}", f"My {device} won't turn off, what should I do?"),
        ("intent", f"fix-charge:{device}", f"My {device} won't charge, what should I do?"),
        ("intent", f"keeps-on:{device}",
         f"My {device} keeps turning on by itself, what should I do?"),
        ("entity", f"fix-on:{other}", f"My {other} won't turn on, what should I do?")])


def _cook(rng: random.Random) -> list[Question]:
    dish, other = rng.sample(DISHES, 2)
    method, alt = rng.choice(METHODS)
    same = [f"How many minutes should I {method} {dish} for?",
            f"What is the {method} time for {dish}?",
            f"For how long do you {method} {dish}?",
            f"How much time does it take to {method} {dish}?"]
    return group_rows(f"cook:{method}:{dish}", f"How long should I {method} {dish}?", same, [
        ("intent", f"cook:{alt}:{dish}", f"How long should I {alt} {dish}?"),
        ("entity", f"cook:{method}:{other}", f"How long should I {method} {other}?"),
        ("intent", f"temp:{method}:{dish}", f"At what temperature should I {method} {dish}?"),
        ("intent", f"keep:{dish}", f"How long can I keep cooked {dish} in the fridge?")])


def _distance(rng: random.Random) -> list[Question]:
    a, b, c = rng.sample(PLACES, 3)
    pair = ":".join(sorted((a, b)))
    same = [f"What is the distance between {a} and {b}?", f"How far apart are {a} and {b}?",
            f"How far is {b} from {a}?", f"What's the distance from {a} to {b}?"]
    return group_rows(f"distance:{pair}", f"How far is {a} from {b}?", same, [
        ("entity", f"distance:{':'.join(sorted((a, c)))}", f"How far is {a} from {c}?"),
        ("intent", f"flight-time:{a}>{b}", f"How long is the flight from {a} to {b}?"),
        ("intent", f"time-difference:{pair}",
         f"What is the time difference between {a} and {b}?"),
        ("intent", f"cheapest-way:{a}>{b}", f"What is the cheapest way to get from {a} to {b}?")])


def _climate(rng: random.Random) -> list[Question]:
    place, month, later = rng.choice(PLACES), *rng.sample(MONTHS, 2)
    same = [f"How warm is {place} in {month}?",
            f"What temperatures can I expect in {place} in {month}?",
            f"What is the typical temperature in {place} during {month}?",
            f"What's the usual temperature in {place} in {month}?"]
    return group_rows(f"temperature:{place}:{month}",
                 f"What is the average temperature in {place} in {month}?", same, [
        ("number", f"temperature:{place}:{later}",
         f"What is the average temperature in {place} in {later}?"),
        ("intent", f"rainfall:{place}:{month}",
         f"What is the average rainfall in {place} in {month}?"),
        ("intent", f"daylight:{place}:{month}",
         f"How many hours of daylight does {place} get in {month}?"),
        ("intent", f"visit:{place}:{month}", f"Is {month} a good time to visit {place}?")])


def _percent(rng: random.Random) -> list[Question]:
    p, n, m = rng.choice((5, 10, 15, 20, 25, 30, 40, 75)), *rng.sample(range(40, 2000), 2)
    same = [f"Calculate {p} percent of {n}.", f"How much is {p} percent of {n}?",
            f"Find {p}% of {n}.", f"What do you get if you take {p}% of {n}?"]
    return group_rows(f"percent:{p}of{n}", f"What is {p}% of {n}?", same, [
        ("number", f"percent:{p}of{m}", f"What is {p}% of {m}?"),
        ("reverse", f"ratio:{p}/{n}", f"What percentage of {n} is {p}?"),
        ("intent", f"increase:{n}by{p}", f"What is {n} increased by {p}%?"),
        ("intent", f"decrease:{n}by{p}", f"What is {n} reduced by {p}%?")])


def _learn(rng: random.Random) -> list[Question]:
    topic = rng.choice(TOPICS)
    same = [f"Can you recommend some books for learning {topic}?",
            f"Which books should I read to learn {topic}?",
            f"What books are good for learning {topic}?",
            f"Recommend good books to learn {topic}."]
    return group_rows(f"books:{topic}", f"What are some good books for learning {topic}?", same, [
        ("intent", f"videos:{topic}", f"What are some good videos for learning {topic}?"),
        ("intent", f"teach-books:{topic}", f"What are some good books for teaching {topic}?"),
        ("intent", f"careers:{topic}", f"What jobs can I get after learning {topic}?"),
        ("intent", f"time:{topic}", f"How long does it take to learn {topic}?")])


def _heavier(rng: random.Random) -> list[Question]:
    x, y, z = rng.sample(ANIMALS, 3)
    pair = ":".join(sorted((x, y)))
    same = [f"Which weighs more, a {x} or a {y}?", f"Which is heavier: a {y} or a {x}?",
            f"Between a {x} and a {y}, which one is heavier?",
            f"Which animal is heavier, the {x} or the {y}?"]
    return group_rows(f"heavier:{pair}", f"Which is heavier, a {x} or a {y}?", same, [
        ("intent", f"faster:{pair}", f"Which is faster, a {x} or a {y}?"),
        ("intent", f"lighter:{pair}", f"Which is lighter, a {x} or a {y}?"),
        ("entity", f"heavier:{':'.join(sorted((x, z)))}",
         f"Which is heavier, a {x} or a {z}?"),
        ("intent", f"lives-longer:{pair}", f"Which lives longer, a {x} or a {y}?")])


def _allowed(rng: random.Random) -> list[Question]:
    item, other = rng.sample(ITEMS, 2)
    same = [f"Am I allowed to take {item} on a plane?",
            f"Is it permitted to carry {item} on a flight?",
            f"Can {item} be brought onto an airplane?",
            f"Are passengers allowed to bring {item} on board a plane?"]
    return group_rows(f"allowed:{item}", f"Can I bring {item} on a plane?", same, [
        ("negation", f"forbidden:{item}", f"Is {item} forbidden on a plane?"),
        ("negation", f"forbidden:{item}", f"Is it not allowed to bring {item} on a plane?"),
        ("entity", f"allowed:{other}", f"Can I bring {other} on a plane?"),
        ("intent", f"how-much:{item}", f"How much {item} can I bring on a plane?")])


HELDOUT_FAMILIES: dict[str, Family] = {
    "birth": _birth, "define": _define, "translate": _translate, "device": _device,
    "cook": _cook, "distance": _distance, "climate": _climate, "percent": _percent,
    "learn": _learn, "heavier": _heavier, "allowed": _allowed}


def questions(seed: int = 0, families_per_template: int = 30) -> list[list[Question]]:
    """Groups of held-out questions (base first), deterministic for `seed`; no
    base twice."""
    return draw_groups(HELDOUT_FAMILIES, seed, families_per_template)
