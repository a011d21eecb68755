"""A third held-out set of labeled questions: twelve more families with
their own templates, vocabulary and entities (time zones, founders, plant
care, wages, sorting code, cooking without an oven, records by country,
family trees of myth, trade, refunds, driving times, opening hours), frozen
before the cache was run on them.

Same shape and kinds as `heldout2_pairs` (a label names the answer's
meaning; negatives are `negation`, `swap`, `number`, `unit`, `reverse`,
`intent`, `entity`, `antonym`, `particle` or `comparative`). Some
negatives turn on words no other set uses ("am" / "pm", "second most",
who cancelled), and some paraphrases on wording that differs a lot
("Do I need an oven to make X?" asks what "Can I make X without an oven?"
asks).
"""

from __future__ import annotations

import random

from hybridkv.semantic.labeled_pairs import Family, Question, draw_groups, group_rows

ZONES = ("Osaka Phoenix Honolulu Anchorage Caracas Tehran Kabul Reykjavik Minsk Tbilisi "
         "Yerevan Baku Almaty").split()
FOUNDERS = (("Amazon", "Bezos"), ("Microsoft", "Gates"), ("Oracle", "Ellison"),
            ("Nike", "Knight"), ("IKEA", "Kamprad"), ("Zara", "Ortega"), ("Alibaba", "Ma"),
            ("Patagonia", "Chouinard"), ("Virgin", "Branson"), ("Facebook", "Zuckerberg"))
PLANTS = "fern orchid succulent bonsai monstera basil lavender ivy begonia aloe".split()
CHORES = (("repot", "repotting"), ("fertilize", "fertilizing"), ("prune", "pruning"))
PERIODS = ("week", "month", "year")
LANGS = ("PHP Dart MATLAB Bash TypeScript Zig OCaml Erlang Prolog Groovy Pascal "
         "COBOL").split()
DISHES = "lasagna cheesecake granola focaccia meringue flatbread pizza naan quiche".split()
RECORDS = ("volcanoes islands lakes pyramids castles billionaires glaciers deserts "
           "skyscrapers airports").split()
GODS = "Zeus Hera Apollo Athena Poseidon Hermes Ares Artemis Hades Kronos".split()
TRADERS = ("Bangladesh Ecuador Kazakhstan Zambia Senegal Cambodia Paraguay Tanzania "
           "Slovakia Estonia").split()
BOOKINGS = "hotel ferry concert cruise campsite spa tour festival".split()
VENUES = "museum library zoo aquarium cathedral observatory castle market".split()
RESORTS = "Kyoto Marrakesh Cusco Hobart Dubrovnik Tromso Galway Siena Bergen Brno".split()


def _time_zone(rng: random.Random) -> list[Question]:
    a, b, c = rng.sample(ZONES, 3)
    h, k = rng.sample(range(1, 12), 2)
    same = [f"When it is {h} pm in {a}, what's the time in {b}?",
            f"What time is it in {b} when it's {h} pm in {a}?",
            f"{h} pm in {a} is what time in {b}?",
            f"Convert {h} pm {a} time to {b} time."]
    return group_rows(f"zone:{h}pm:{a}>{b}", f"If it's {h} pm in {a}, what time is it in {b}?",
                 same, [
        ("swap", f"zone:{h}pm:{b}>{a}", f"If it's {h} pm in {b}, what time is it in {a}?"),
        ("antonym", f"zone:{h}am:{a}>{b}", f"If it's {h} am in {a}, what time is it in {b}?"),
        ("number", f"zone:{k}pm:{a}>{b}", f"If it's {k} pm in {a}, what time is it in {b}?"),
        ("entity", f"zone:{h}pm:{a}>{c}", f"If it's {h} pm in {a}, what time is it in {c}?")])


def _founder(rng: random.Random) -> list[Question]:
    (company, person), (other, _) = rng.sample(FOUNDERS, 2)
    same = [f"Who is the founder of {company}?", f"Who started the company {company}?",
            f"{company} was founded by whom?", f"Who set up {company}?"]
    return group_rows(f"founder:{company}", f"Who founded {company}?", same, [
        ("reverse", f"founded-by:{person}", f"Which company did {person} found?"),
        ("intent", f"founded-when:{company}", f"When was {company} founded?"),
        ("intent", f"runs-now:{company}", f"Who runs {company} today?"),
        ("entity", f"founder:{other}", f"Who founded {other}?")])


def _watering(rng: random.Random) -> list[Question]:
    plant, other = rng.sample(PLANTS, 2)
    chore, _ = rng.choice(CHORES)
    same = [f"How frequently does a {plant} need watering?",
            f"What's the right watering schedule for a {plant}?",
            f"How often do I need to water my {plant}?",
            f"How regularly should a {plant} be watered?"]
    return group_rows(f"water-often:{plant}", f"How often should I water a {plant}?", same, [
        ("intent", f"water-amount:{plant}", f"How much water does a {plant} need?"),
        ("intent", f"{chore}-often:{plant}", f"How often should I {chore} a {plant}?"),
        ("antonym", f"overwatered:{plant}", f"What are the signs of an overwatered {plant}?"),
        ("entity", f"water-often:{other}", f"How often should I water a {other}?")])


def _wage(rng: random.Random) -> list[Question]:
    n, m = rng.sample(range(12, 90), 2)
    period, other = rng.sample(PERIODS, 2)
    same = [f"If I earn {n} dollars an hour, how much is that per {period}?",
            f"How much do I make per {period} at {n} dollars an hour?",
            f"{n} dollars an hour is how much a {period}?",
            f"What does an hourly wage of {n} dollars come to per {period}?"]
    return group_rows(f"wage:{n}/h>{period}", f"What is {n} dollars an hour per {period}?", same, [
        ("reverse", f"wage:{n}/{period}>h", f"What is {n} dollars a {period} per hour?"),
        ("number", f"wage:{m}/h>{period}", f"What is {m} dollars an hour per {period}?"),
        ("unit", f"wage:{n}/h>{other}", f"What is {n} dollars an hour per {other}?"),
        ("intent", f"wage-tax:{n}/h", f"How much tax do I pay on {n} dollars an hour?")])


def _sorting(rng: random.Random) -> list[Question]:
    lang, other = rng.sample(LANGS, 2)
    same = [f"In {lang}, how can I sort a list from smallest to largest?",
            f"What's the way to sort a list in increasing order in {lang}?",
            f"How do you order a list ascending in {lang}?",
            f"How to sort a list in ascending order using {lang}?"]
    return group_rows(f"sort-asc:{lang}", f"How do I sort a list in ascending order in {lang}?",
                 same, [
        ("antonym", f"sort-desc:{lang}", f"How do I sort a list in descending order in {lang}?"),
        ("swap", f"sort-desc:{lang}",
         f"In {lang}, how can I sort a list from largest to smallest?"),
        ("intent", f"shuffle:{lang}", f"How do I shuffle a list in {lang}?"),
        ("intent", f"sort-dict:{lang}", f"How do I sort a dictionary by value in {lang}?"),
        ("entity", f"sort-asc:{other}", f"How do I sort a list in ascending order in {other}?")])


def _no_oven(rng: random.Random) -> list[Question]:
    dish, other = rng.sample(DISHES, 2)
    same = [f"Is it possible to make {dish} with no oven?",
            f"How can I cook {dish} if I don't have an oven?",
            f"Do I need an oven to make {dish}?",
            f"Is there a way to bake {dish} without using an oven?"]
    return group_rows(f"no-oven:{dish}", f"Can I make {dish} without an oven?", same, [
        ("intent", f"oven-time:{dish}", f"How long do I bake {dish} in the oven?"),
        ("entity", f"no-microwave:{dish}", f"Can I make {dish} without a microwave?"),
        ("intent", f"freeze:{dish}", f"Can I freeze {dish}?"),
        ("entity", f"no-oven:{other}", f"Can I make {other} without an oven?")])


def _record(rng: random.Random) -> list[Question]:
    thing, other = rng.sample(RECORDS, 2)
    same = [f"What country has the largest number of {thing}?",
            f"Which nation has more {thing} than any other?",
            f"In which country are there the most {thing}?",
            f"Which country is home to the most {thing}?"]
    return group_rows(f"most:{thing}", f"Which country has the most {thing}?", same, [
        ("antonym", f"fewest:{thing}", f"Which country has the fewest {thing}?"),
        ("number", f"second-most:{thing}", f"Which country has the second most {thing}?"),
        ("intent", f"count:{thing}", f"How many {thing} are there in the world?"),
        ("entity", f"most:{other}", f"Which country has the most {other}?")])


def _parent(rng: random.Random) -> list[Question]:
    god, other = rng.sample(GODS, 2)
    same = [f"Who was {god}'s father?", f"Who is {god}'s dad?",
            f"Name the father of {god}.", f"In Greek myth, who fathered {god}?"]
    return group_rows(f"father:{god}", f"Who is the father of {god}?", same, [
        ("antonym", f"mother:{god}", f"Who is the mother of {god}?"),
        ("reverse", f"children:{god}", f"Who are the children of {god}?"),
        ("intent", f"siblings:{god}", f"Who are the siblings of {god}?"),
        ("entity", f"father:{other}", f"Who is the father of {other}?")])


def _exports(rng: random.Random) -> list[Question]:
    country, other = rng.sample(TRADERS, 2)
    same = [f"What does {country} export the most?",
            f"Which product is {country}'s biggest export?",
            f"What is the top export of {country}?",
            f"What goods does {country} mainly sell abroad?"]
    return group_rows(f"export:{country}", f"What is {country}'s main export?", same, [
        ("antonym", f"import:{country}", f"What is {country}'s main import?"),
        ("intent", f"partner:{country}", f"Who is {country}'s largest trading partner?"),
        ("intent", f"industry:{country}", f"What is {country}'s main industry?"),
        ("entity", f"export:{other}", f"What is {other}'s main export?")])


def _refund(rng: random.Random) -> list[Question]:
    booking, other = rng.sample(BOOKINGS, 2)
    same = [f"Will I be refunded if I cancel my {booking} reservation?",
            f"If I cancel a {booking} booking, do I get my money back?",
            f"Is a {booking} booking refundable after I cancel it?",
            f"Do I get a refund when I cancel a {booking} booking?"]
    return group_rows(f"refund-mine:{booking}",
                 f"Can I get a refund if I cancel my {booking} booking?", same, [
        ("reverse", f"refund-theirs:{booking}",
         f"Can I get a refund if the {booking} is cancelled by the organiser?"),
        ("negation", f"why-no-refund:{booking}",
         f"Why can't I get a refund for my cancelled {booking} booking?"),
        ("intent", f"change-date:{booking}", f"Can I change the date of my {booking} booking?"),
        ("entity", f"refund-mine:{other}",
         f"Can I get a refund if I cancel my {other} booking?")])


def _drive(rng: random.Random) -> list[Question]:
    n, m, k = rng.sample(range(20, 400, 5), 3)
    speed = rng.choice((30, 40, 50, 55, 60, 65, 70))
    same = [f"If I drive {n} miles at {speed} miles per hour, how long will it take?",
            f"How many hours to drive {n} miles at {speed} miles an hour?",
            f"At {speed} miles per hour, how long does a {n} mile drive take?",
            f"How much time does driving {n} miles at {speed} miles per hour take?"]
    return group_rows(f"drive:{n}mi@{speed}",
                 f"How long does it take to drive {n} miles at {speed} miles per hour?", same, [
        ("number", f"drive:{m}mi@{speed}",
         f"How long does it take to drive {m} miles at {speed} miles per hour?"),
        ("unit", f"drive:{n}km@{speed}",
         f"How long does it take to drive {n} km at {speed} km per hour?"),
        ("intent", f"fuel:{n}mi@{speed}",
         f"How much fuel do I need to drive {n} miles at {speed} miles per hour?"),
        ("number", f"drive:{k}mi@{speed}", f"How long does it take to drive {k} miles at "
                                           f"{speed} miles per hour?")])


def _opening(rng: random.Random) -> list[Question]:
    venue, town, other = rng.choice(VENUES), *rng.sample(RESORTS, 2)
    same = [f"When does the {venue} in {town} open its doors on Sundays?",
            f"What's the Sunday opening time of the {venue} in {town}?",
            f"At what time can I get into the {venue} in {town} on a Sunday?",
            f"On Sundays, what time does the {town} {venue} open?"]
    return group_rows(f"opens-sunday:{venue}:{town}",
                 f"What time does the {venue} in {town} open on Sundays?", same, [
        ("antonym", f"closes-sunday:{venue}:{town}",
         f"What time does the {venue} in {town} close on Sundays?"),
        ("entity", f"opens-monday:{venue}:{town}",
         f"What time does the {venue} in {town} open on Mondays?"),
        ("intent", f"holidays:{venue}:{town}",
         f"Is the {venue} in {town} open on public holidays?"),
        ("entity", f"opens-sunday:{venue}:{other}",
         f"What time does the {venue} in {other} open on Sundays?")])


HELDOUT3_FAMILIES: dict[str, Family] = {
    "time_zone": _time_zone, "founder": _founder, "watering": _watering, "wage": _wage,
    "sorting": _sorting, "no_oven": _no_oven, "record": _record, "parent": _parent,
    "exports": _exports, "refund": _refund, "drive": _drive, "opening": _opening}


def questions(seed: int = 0, families_per_template: int = 30) -> list[list[Question]]:
    """Groups of questions (base first), deterministic for `seed`; no base twice."""
    return draw_groups(HELDOUT3_FAMILIES, seed, families_per_template)
