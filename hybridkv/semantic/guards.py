"""Lexical checks that veto a candidate whose meaning differs in a way a
bag-of-words embedding cannot see.

Static embeddings average word vectors, so "Is London bigger than Paris?"
and "Is Paris bigger than London?" embed identically, and "not" moves a
sentence very little. Before a similar entry may answer a request, the two
texts must agree on:

- numbers (digits and number words, as a multiset): "5 km" is not "7 km";
- negation (the parity of negation cues): "is it safe" vs "is it not safe";
- the order of shared anchors (capitalised names, numbers, units, and the
  words beside "than", "to", "from", "into", "vs"): swapped entities and
  reversed conversions;
- opposite words: a word in one text that is another's with a negating
  prefix ("install" / "uninstall") or from a small antonym table;
- the question asked: the same who / when / where / why / how-much words;
- the same names, numbers and units (as sets);
- no single content word replaced by another that is not a listed synonym
  ("how do I *install* X" / "how do I *update* X").

A veto costs a miss, never a wrong answer; paraphrases that reorder names
lose their hit, which is the side this errs on.
"""

from __future__ import annotations

import re
from collections import Counter

_WORD = re.compile(r"[A-Za-z]+(?:'[a-z]+)?|\d+(?:[.,]\d+)*")
NEGATIONS = frozenset({"not", "no", "never", "none", "nobody", "nothing", "neither", "nor",
                       "without", "cannot", "n't", "isn't", "aren't", "wasn't", "weren't",
                       "don't", "doesn't", "didn't", "can't", "won't", "shouldn't",
                       "wouldn't", "couldn't", "hasn't", "haven't", "mustn't"})
NUMBER_WORDS = {w: str(i) for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
    "fifteen sixteen seventeen eighteen nineteen twenty".split())}
UNITS = frozenset("""km kilometers kilometres kilometer kilometre mile miles m meter meters
metre metres cm mm inch inches foot feet ft yard yards kg kilogram kilograms g gram grams lb
lbs pound pounds ounce ounces oz liter liters litre litres ml gallon gallons celsius
fahrenheit kelvin seconds second minutes minute hours hour days day weeks week months month
years year usd eur dollars dollar euros euro yen gb mb kb tb bytes byte percent""".split())
WH_WORDS = frozenset({"who", "whom", "whose", "when", "where", "why", "much"})
STOPWORDS = frozenset("""a an the is are was were be been am do does did can could would should
will shall may might must i me my you your we our it its this that these those of in on at
for to from by with about as into and or but if then so please tell what what's which how
there here have has had get got any some just very really""".split())
SYNONYMS = {frozenset(p) for p in (
    ("big", "large"), ("bigger", "larger"), ("biggest", "largest"), ("small", "little"),
    ("harmful", "bad"), ("begin", "start"), ("buy", "purchase"), ("fix", "repair"),
    ("quick", "fast"), ("quickly", "fast"), ("car", "automobile"), ("author", "writer"),
    ("wrote", "written"), ("steps", "way"), ("help", "assist"), ("error", "bug"),
    ("show", "display"), ("make", "create"), ("use", "utilize"), ("job", "work"))}
DIRECTIONAL = frozenset({"than", "to", "from", "into", "vs", "versus", "against", "before",
                         "after", "over", "under", "above", "below"})
NEGATING_PREFIXES = ("un", "dis", "de", "in", "im", "non", "anti", "mis")
ANTONYMS = {frozenset(p) for p in (
    ("good", "bad"), ("plus", "minus"), ("sum", "difference"), ("times", "plus"),
    ("increase", "decrease"), ("buy", "sell"), ("more", "less"), ("bigger", "smaller"),
    ("larger", "smaller"), ("higher", "lower"), ("faster", "slower"), ("older", "younger"),
    ("longer", "shorter"), ("heavier", "lighter"), ("hotter", "colder"), ("best", "worst"),
    ("better", "worse"), ("enable", "disable"), ("start", "stop"), ("open", "close"),
    ("add", "remove"), ("import", "export"), ("upload", "download"), ("encrypt", "decrypt"),
    ("compress", "decompress"), ("min", "max"), ("minimum", "maximum"), ("first", "last"),
    ("advantages", "disadvantages"), ("pros", "cons"), ("benefits", "risks"),
    ("cause", "cure"), ("prevent", "cause"), ("win", "lose"), ("true", "false"),
    ("north", "south"), ("east", "west"), ("left", "right"), ("up", "down"),
    ("lend", "borrow"), ("send", "receive"), ("push", "pull"), ("read", "write"),
    ("rise", "fall"), ("cheap", "expensive"), ("safe", "dangerous"), ("legal", "illegal"),
    ("always", "never"), ("all", "none"), ("allow", "block"), ("accept", "reject"),
    ("create", "delete"),
    ("join", "leave"), ("before", "after"), ("convert", "revert"), ("men", "women"),
    ("male", "female"), ("boys", "girls"), ("adults", "children"), ("mean", "median"))}


def words(text: str) -> list[str]:
    """The text's words and numbers, in order, case kept: "Isn't 5 > 3?" ->
    ["Isn't", "5", "3"]."""
    return _WORD.findall(text)


def conflicts(a: str, b: str) -> str | None:
    """Why `a` and `b` cannot share an answer ("numbers", "negation", "order",
    "opposite"), or None when no lexical check objects."""
    wa, wb = words(a), words(b)
    la, lb = [w.lower() for w in wa], [w.lower() for w in wb]
    if _numbers(la) != _numbers(lb):
        return "numbers"
    if _negations(la) % 2 != _negations(lb) % 2:
        return "negation"
    if _swapped(_anchors(wa, la), _anchors(wb, lb)):
        return "order"
    if _opposite(set(la), set(lb)):
        return "opposite"
    if WH_WORDS.intersection(la) != WH_WORDS.intersection(lb):
        return "question"
    if _names(wa, la) != _names(wb, lb):
        return "names"
    if _substituted(set(la), set(lb)):
        return "substitution"
    return None


def _names(original: list[str], lower: list[str]) -> set[str]:
    """Names, numbers and units: capitalised words (not the first), digits, units."""
    found = {lw for i, (w, lw) in enumerate(zip(original, lower))
             if (i > 0 and w[0].isupper()) or lw in UNITS}
    return found | set(_numbers(lower))


def _substituted(a: set[str], b: set[str]) -> bool:
    """Exactly one content word replaced by another that is not a known synonym."""
    only_a, only_b = (a - b) - STOPWORDS, (b - a) - STOPWORDS
    if len(only_a) != 1 or len(only_b) != 1:
        return False
    pair = frozenset((next(iter(only_a)), next(iter(only_b))))
    return pair not in SYNONYMS


def _numbers(lower: list[str]) -> Counter[str]:
    return Counter(NUMBER_WORDS.get(w, w).replace(",", "") for w in lower
                   if w[0].isdigit() or w in NUMBER_WORDS)


def _negations(lower: list[str]) -> int:
    return sum(1 for w in lower if w in NEGATIONS or w.endswith("n't"))


def _anchors(original: list[str], lower: list[str]) -> list[str]:
    """Anchor words in order: names (capitalised, not first), numbers, units,
    and the neighbours of directional words."""
    found = []
    for i, (w, lw) in enumerate(zip(original, lower)):
        beside = (i > 0 and lower[i - 1] in DIRECTIONAL) or (
            i + 1 < len(lower) and lower[i + 1] in DIRECTIONAL)
        if (i > 0 and w[0].isupper()) or w[0].isdigit() or lw in UNITS or (
                beside and lw not in DIRECTIONAL):
            found.append(lw)
    return found


def _swapped(a: list[str], b: list[str]) -> bool:
    """Whether the anchors both texts have appear in another order (first occurrences)."""
    shared = set(a) & set(b)
    return _first_order(a, shared) != _first_order(b, shared)


def _first_order(anchors: list[str], keep: set[str]) -> list[str]:
    return list(dict.fromkeys(w for w in anchors if w in keep))


def _opposite(a: set[str], b: set[str]) -> bool:
    only_a, only_b = a - b, b - a
    for x in only_a:
        for y in only_b:
            if frozenset((x, y)) in ANTONYMS or _prefixed(x, y) or _prefixed(y, x):
                return True
    return False


def _prefixed(word: str, base: str) -> bool:
    return len(base) > 2 and any(word == p + base for p in NEGATING_PREFIXES)
