"""A second held-out set of labeled questions: fourteen families with their
own templates, vocabulary and entities, written from how people phrase
everyday requests (cooking, accounts, devices, travel, money, dates,
health, grammar) and frozen before the cache was ever run on them.

Same shape as `labeled_pairs` (groups of `Question`, base first; a label
names the answer's meaning, so equal meanings in different groups agree).
Besides the negative kinds of the other sets (`negation`, `swap`, `number`,
`unit`, `reverse`, `intent`, `entity`) it names three more:

- `antonym`: an opposite word ("louder" / "quieter", "early" / "late");
- `particle`: a particle or preposition that flips the request ("turn on" /
  "turn off", "zoom in" / "zoom out", "before" / "after");
- `comparative`: another comparison between the same things ("easier to
  learn" / "faster").

Some paraphrases are hard on purpose: a comparison stated from the other
side ("Is Haskell harder to learn than Lua?" means "Is Lua easier to learn
than Haskell?").
"""

from __future__ import annotations

import random

from hybridkv.semantic.labeled_pairs import Family, Question, draw_groups, group_rows

INGREDIENTS = ("buttermilk cornstarch molasses tahini ricotta shallots mascarpone "
               "cardamom nutmeg semolina").split()
BAKES = "muffins pancakes brownies waffles scones biscuits crepes flapjacks".split()
SERVICES = ("Dropbox Netflix Instagram PayPal LinkedIn Reddit Discord Twitch Pinterest "
            "Etsy").split()
TV_BRANDS = "Samsung Sony Vizio Hisense Panasonic Philips Sharp Toshiba Roku Insignia".split()
APPS = "Word Excel PowerPoint Acrobat Notion Figma Outlook Keynote Evernote Illustrator".split()
CURRENCIES = "rupees pesos francs kronor baht won rand zloty dirhams shekels".split()
WEEKDAYS = "Monday Tuesday Wednesday Thursday Friday Saturday Sunday".split()
TOWNS = ("Lyon Porto Krakow Bruges Seville Munich Vilnius Ljubljana Bratislava Salzburg "
         "Geneva Florence Valencia Leeds Gdansk Bern").split()
MEASURES = "tablespoons teaspoons cups pints quarts".split()
PROGRAMMING = "Rust Haskell Kotlin Swift Ruby Perl Scala Elixir Lua Fortran Julia Clojure".split()
CONDITIONS = ("diabetes dehydration anemia scurvy burnout glaucoma measles shingles asthma "
              "gout").split()
SPORTS = "running swimming cycling hiking rowing skiing climbing skating".split()
HABITS = (("stretch", "stretching"), ("eat", "eating"), ("have caffeine", "having caffeine"),
          ("take a nap", "napping"))
PRODUCE = "vegetables fruits nuts seeds grains beans".split()
NUTRIENTS = "fiber iron protein potassium calcium magnesium zinc folate".split()
PLURALS = (("cactus", "cacti"), ("fungus", "fungi"), ("criterion", "criteria"),
           ("phenomenon", "phenomena"), ("thesis", "theses"), ("appendix", "appendices"),
           ("nucleus", "nuclei"), ("stimulus", "stimuli"), ("analysis", "analyses"),
           ("matrix", "matrices"))
DESTINATIONS = ("Bhutan Laos Oman Jordan Belize Fiji Mongolia Uruguay Namibia Malta "
                "Bolivia Rwanda").split()


def _substitute(rng: random.Random) -> list[Question]:
    item, other = rng.sample(INGREDIENTS, 2)
    bake = rng.choice(BAKES)
    same = [f"What's a good substitute for {item} in {bake}?",
            f"I'm out of {item}, what can I put in my {bake} instead?",
            f"Can I replace {item} with something else when making {bake}?",
            f"What could I swap in for {item} when I bake {bake}?"]
    return group_rows(f"substitute:{item}:{bake}", f"What can I use instead of {item} in {bake}?",
                 same, [
        ("entity", f"substitute:{other}:{bake}", f"What can I use instead of {other} in {bake}?"),
        ("intent", f"amount:{item}:{bake}", f"How much {item} goes into {bake}?"),
        ("intent", f"omit:{item}:{bake}", f"Can I leave {item} out of {bake} entirely?"),
        ("reverse", f"replaces:{item}", f"What ingredient can {item} be a substitute for?")])


def _two_factor(rng: random.Random) -> list[Question]:
    service, other = rng.sample(SERVICES, 2)
    same = [f"How can I enable two-factor authentication on {service}?",
            f"Where do I switch on 2FA for my {service} account?",
            f"How do I set up two-step verification on {service}?",
            f"What are the steps to activate two-factor login for {service}?"]
    return group_rows(f"2fa-on:{service}",
                 f"How do I turn on two-factor authentication for my {service} account?", same, [
        ("particle", f"2fa-off:{service}",
         f"How do I turn off two-factor authentication for my {service} account?"),
        ("entity", f"2fa-on:{other}",
         f"How do I turn on two-factor authentication for my {other} account?"),
        ("intent", f"2fa-lost-phone:{service}",
         f"How do I get into {service} if I lost the phone I use for two-factor codes?"),
        ("intent", f"2fa-why:{service}",
         f"Why does {service} keep asking me for a two-factor code?")])


def _volume(rng: random.Random) -> list[Question]:
    brand, other = rng.sample(TV_BRANDS, 2)
    same = [f"How can I make my {brand} TV louder?",
            f"What's the way to increase the volume on a {brand} TV?",
            f"How do I raise the sound level on my {brand} television?",
            f"My {brand} TV is too quiet, how do I turn the volume up?"]
    return group_rows(f"louder:{brand}", f"How do I turn up the volume on my {brand} TV?", same, [
        ("particle", f"quieter:{brand}", f"How do I turn down the volume on my {brand} TV?"),
        ("antonym", f"quieter:{brand}", f"How can I make my {brand} TV quieter?"),
        ("intent", f"brighter:{brand}", f"How do I turn up the brightness on my {brand} TV?"),
        ("entity", f"louder:{other}", f"How do I turn up the volume on my {other} TV?")])


def _zoom(rng: random.Random) -> list[Question]:
    app, other = rng.sample(APPS, 2)
    same = [f"How can I magnify the page in {app}?", f"In {app}, how do I zoom in?",
            f"How do I enlarge the view in {app}?",
            f"What is the way to zoom in on a document in {app}?"]
    return group_rows(f"zoom-in:{app}", f"How can I zoom in while working in {app}?", same, [
        ("particle", f"zoom-out:{app}", f"How can I zoom out while working in {app}?"),
        ("antonym", f"zoom-out:{app}", f"How do I shrink the view in {app}?"),
        ("intent", f"zoom-reset:{app}", f"How do I reset the zoom level in {app}?"),
        ("entity", f"zoom-in:{other}", f"How can I zoom in while working in {other}?")])


def _exchange(rng: random.Random) -> list[Question]:
    a, b, c = rng.sample(CURRENCIES, 3)
    n, m = rng.sample(range(20, 5000, 10), 2)
    same = [f"What are {n} {a} worth in {b}?",
            f"If I exchange {n} {a}, how many {b} will I receive?",
            f"{n} {a} equals how many {b}?",
            f"How much is {n} {a} when changed into {b}?"]
    return group_rows(f"exchange:{n}{a}>{b}", f"How many {b} do I get for {n} {a}?", same, [
        ("reverse", f"exchange:{n}{b}>{a}", f"How many {a} do I get for {n} {b}?"),
        ("number", f"exchange:{m}{a}>{b}", f"How many {b} do I get for {m} {a}?"),
        ("unit", f"exchange:{n}{a}>{c}", f"How many {c} do I get for {n} {a}?"),
        ("intent", f"exchange-fee:{n}{a}>{b}",
         f"What fee will I pay to exchange {n} {a} into {b}?")])


def _weekday(rng: random.Random) -> list[Question]:
    day, other = rng.sample(WEEKDAYS, 2)
    n, m = rng.sample(range(2, 60), 2)
    same = [f"Today is {day}; what day of the week is it {n} days from now?",
            f"What weekday comes {n} days after a {day}?",
            f"Counting {n} days forward from a {day}, which day do I land on?",
            f"If it's {day} today, which weekday will it be in {n} days?"]
    return group_rows(f"weekday:{day}+{n}", f"If today is {day}, what day will it be in {n} days?",
                 same, [
        ("particle", f"weekday:{day}-{n}",
         f"If today is {day}, what day of the week was it {n} days before?"),
        ("number", f"weekday:{day}+{m}", f"If today is {day}, what day will it be in {m} days?"),
        ("entity", f"weekday:{other}+{n}",
         f"If today is {other}, what day will it be in {n} days?"),
        ("intent", f"until:{day}>{other}",
         f"If today is {day}, how many days are left until {other}?")])


def _last_train(rng: random.Random) -> list[Question]:
    a, b, c = rng.sample(TOWNS, 3)
    same = [f"What time is the final train from {a} to {b}?",
            f"What's the latest train I can catch from {a} to {b}?",
            f"At what time does the last {a} to {b} train depart?",
            f"When is the last departure by train from {a} to {b}?"]
    return group_rows(f"last-leave:{a}>{b}", f"When does the last train from {a} to {b} leave?",
                 same, [
        ("swap", f"last-leave:{b}>{a}", f"When does the last train from {b} to {a} leave?"),
        ("antonym", f"first-leave:{a}>{b}", f"When does the first train from {a} to {b} leave?"),
        ("antonym", f"last-arrive:{a}>{b}", f"When does the last train from {a} to {b} arrive?"),
        ("entity", f"last-leave:{a}>{c}", f"When does the last train from {a} to {c} leave?"),
        ("intent", f"last-price:{a}>{b}",
         f"How much is a ticket on the last train from {a} to {b}?")])


def _measures(rng: random.Random) -> list[Question]:
    a, b, c = rng.sample(MEASURES, 3)
    n, m = rng.sample(range(2, 40), 2)
    same = [f"{n} {a} is how many {b}?", f"How many {b} make up {n} {a}?",
            f"What's {n} {a} expressed in {b}?",
            f"If a recipe calls for {n} {a}, how many {b} is that?"]
    return group_rows(f"measure:{n}{a}>{b}", f"How many {b} are in {n} {a}?", same, [
        ("reverse", f"measure:{n}{b}>{a}", f"How many {a} are in {n} {b}?"),
        ("number", f"measure:{m}{a}>{b}", f"How many {b} are in {m} {a}?"),
        ("unit", f"measure:{n}{a}>{c}", f"How many {c} are in {n} {a}?"),
        ("intent", f"weigh:{n}{a}", f"How much does {n} {a} of flour weigh?")])


def _easier(rng: random.Random) -> list[Question]:
    x, y, z = rng.sample(PROGRAMMING, 3)
    same = [f"Would {x} be easier to pick up than {y}?",
            f"Is learning {x} simpler than learning {y}?",
            f"Is {y} harder to learn than {x}?",
            f"Does {x} have a gentler learning curve than {y}?"]
    return group_rows(f"easier:{x}>{y}", f"Is {x} easier to learn than {y}?", same, [
        ("swap", f"easier:{y}>{x}", f"Is {y} easier to learn than {x}?"),
        ("antonym", f"easier:{y}>{x}", f"Is {x} harder to learn than {y}?"),
        ("comparative", f"faster:{x}>{y}", f"Is {x} faster than {y}?"),
        ("entity", f"easier:{x}>{z}", f"Is {x} easier to learn than {z}?")])


def _symptoms(rng: random.Random) -> list[Question]:
    illness, other = rng.sample(CONDITIONS, 2)
    same = [f"What symptoms show up first with {illness}?",
            f"How can I tell if I'm in the early stages of {illness}?",
            f"What are the first symptoms of {illness}?",
            f"Which warning signs point to early {illness}?"]
    return group_rows(f"early-signs:{illness}", f"What are the early signs of {illness}?", same, [
        ("antonym", f"late-signs:{illness}", f"What are the late signs of {illness}?"),
        ("intent", f"treat:{illness}", f"How is {illness} treated?"),
        ("intent", f"prevent:{illness}", f"How can I avoid getting {illness}?"),
        ("entity", f"early-signs:{other}", f"What are the early signs of {other}?")])


def _workout(rng: random.Random) -> list[Question]:
    sport, other = rng.sample(SPORTS, 2)
    (habit, gerund), (habit2, _) = rng.sample(HABITS, 2)
    same = [f"Is it a good idea to {habit} before {sport}?",
            f"Is {gerund} before {sport} recommended?",
            f"Do I need to {habit} before I go {sport}?",
            f"Before {sport}, should I {habit}?"]
    return group_rows(f"before:{habit}:{sport}", f"Should I {habit} before {sport}?", same, [
        ("particle", f"after:{habit}:{sport}", f"Should I {habit} after {sport}?"),
        ("negation", f"skip:{habit}:{sport}",
         f"What happens if I don't {habit} before {sport}?"),
        ("entity", f"before:{habit}:{other}", f"Should I {habit} before {other}?"),
        ("intent", f"before:{habit2}:{sport}", f"Should I {habit2} before {sport}?")])


def _nutrients(rng: random.Random) -> list[Question]:
    kind, kind2 = rng.sample(PRODUCE, 2)
    food, other = rng.sample(NUTRIENTS, 2)
    same = [f"What {kind} contain a lot of {food}?", f"Name some {kind} that are rich in {food}.",
            f"Which {kind} have plenty of {food}?",
            f"What are good {kind} to eat for {food}?"]
    return group_rows(f"high:{kind}:{food}", f"Which {kind} are high in {food}?", same, [
        ("antonym", f"low:{kind}:{food}", f"Which {kind} are low in {food}?"),
        ("negation", f"none:{kind}:{food}", f"Which {kind} have no {food} at all?"),
        ("entity", f"high:{kind}:{other}", f"Which {kind} are high in {other}?"),
        ("entity", f"high:{kind2}:{food}", f"Which {kind2} are high in {food}?")])


def _plural(rng: random.Random) -> list[Question]:
    (one, many), (other, _) = rng.sample(PLURALS, 2)
    same = [f"What's the plural form of {one}?", f"How do I make {one} plural?",
            f"What do you call more than one {one}?", f"{one} in the plural is what?"]
    return group_rows(f"plural:{one}", f"What is the plural of {one}?", same, [
        ("reverse", f"singular:{many}", f"What is the singular of {many}?"),
        ("entity", f"plural:{other}", f"What is the plural of {other}?"),
        ("intent", f"origin:{one}", f"Where does the word {one} come from?"),
        ("intent", f"use:{one}", f"Can you use {one} in a sentence?")])


def _visa(rng: random.Random) -> list[Question]:
    country, other = rng.sample(DESTINATIONS, 2)
    same = [f"Is a visa required to enter {country}?",
            f"Will I need a visa for a trip to {country}?",
            f"Does {country} require tourists to have a visa?",
            f"Do tourists have to get a visa before going to {country}?"]
    return group_rows(f"visa:{country}", f"Do I need a visa to travel to {country}?", same, [
        ("intent", f"visa-time:{country}", f"How long does it take to get a visa for {country}?"),
        ("intent", f"vaccine:{country}", f"Do I need any vaccines to travel to {country}?"),
        ("negation", f"visa-free:{country}",
         f"Which passports don't need a visa to enter {country}?"),
        ("entity", f"visa:{other}", f"Do I need a visa to travel to {other}?")])


HELDOUT2_FAMILIES: dict[str, Family] = {
    "substitute": _substitute, "two_factor": _two_factor, "volume": _volume, "zoom": _zoom,
    "exchange": _exchange, "weekday": _weekday, "last_train": _last_train,
    "measures": _measures, "easier": _easier, "symptoms": _symptoms, "workout": _workout,
    "nutrients": _nutrients, "plural": _plural, "visa": _visa}


def questions(seed: int = 0, families_per_template: int = 30) -> list[list[Question]]:
    """Groups of questions (base first), deterministic for `seed`; no base twice."""
    return draw_groups(HELDOUT2_FAMILIES, seed, families_per_template)
