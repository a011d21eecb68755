"""Lexical checks that veto a candidate whose meaning differs in a way a
bag-of-words embedding cannot see.

Static embeddings average word vectors, so "Is London bigger than Paris?"
and "Is Paris bigger than London?" embed identically, and "not" moves a
sentence very little. Before a similar entry may answer a request, the two
texts must agree on:

- numbers (digits and number words, as a multiset): "5 km" is not "7 km";
  and what each number counts, where both texts say: "how many cups are in
  5 pints" is not "how many pints are in 5 cups";
- negation (the parity of negation cues): "is it safe" vs "is it not safe";
- the order of shared anchors (capitalised names, numbers, units, and the
  words beside "than", "to", "from", "into", "vs"): swapped entities and
  reversed conversions;
- opposite words: a word in one text that is another's with a negating
  prefix ("install" / "uninstall") or its opposite in any inflection
  ("heavier" / "lighter", "opens" / "closes"; tables in `lexicon`);
- particles: one text has more of "on", "in", "up", "before"... and the
  other more of "off", "out", "down", "after" ("turn on" / "turn off");
- comparisons: the same comparatives and superlatives, up to synonyms
  ("faster" is not "longer", "weighs more" is not "heavier");
- the question asked: the same who / when / where / why / how-much words;
- the same names, numbers and units (as sets);
- content words: none replaced by another that is not a synonym or an
  inflection of it ("install X" / "update X"). Function words do not count,
  nor "please" where it is politeness (first, or after "can you"),
  while "how do you say *please*" keeps it as the word asked about. When
  several words are replaced on both sides, the candidate must also be
  nearly identical in embedding (`REWORDED_SIMILARITY`).

A veto costs a miss, never a wrong answer; paraphrases that reorder names
or compare from the other side lose their hit, which is the side this errs
on.
"""

from __future__ import annotations

import re
from collections import Counter

from hybridkv.semantic.lexicon import (
    FUNCTION_WORDS,
    PARTICLE_OPPOSITES,
    POLITE_NEIGHBOURS,
    POLITENESS,
    are_opposites,
    are_synonyms,
    comparative,
)

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
PRONOUN_I = frozenset({"i", "i'm", "i've", "i'd", "i'll"})
WH_WORDS = frozenset({"who", "whom", "whose", "when", "where", "why", "much"})
DIRECTIONAL = frozenset({"than", "to", "from", "into", "vs", "versus", "against", "before",
                         "after", "over", "under", "above", "below"})
NEGATING_PREFIXES = ("un", "dis", "de", "in", "im", "non", "anti", "mis")
REWORDED_SIMILARITY = 0.97


def words(text: str) -> list[str]:
    """The text's words and numbers, in order, case kept: "Isn't 5 > 3?" ->
    ["Isn't", "5", "3"]."""
    return _WORD.findall(text)


def conflicts(a: str, b: str, similarity: float = 1.0) -> str | None:
    """Why `a` and `b` cannot share an answer ("numbers", "negation", "order",
    "opposite", "particle", "comparison", "question", "names", "substitution",
    "rewording"), or None when no lexical check objects. `similarity` is the
    two texts' embedding similarity (only the rewording check reads it)."""
    wa, wb = words(a), words(b)
    la, lb = [w.lower() for w in wa], [w.lower() for w in wb]
    if _numbers(la) != _numbers(lb):
        return "numbers"
    if _negations(la) % 2 != _negations(lb) % 2:
        return "negation"
    if _swapped(_anchors(wa, la), _anchors(wb, lb)):
        return "order"
    if _rebound(_counted(la), _counted(lb)):
        return "numbers"
    only_a, only_b = _difference(la, lb)
    if _opposite(only_a, only_b):
        return "opposite"
    if _particles(Counter(la), Counter(lb)):
        return "particle"
    if _unmatched([comparative(w) or "" for w in la], [comparative(w) or "" for w in lb],
                  both=False):
        return "comparison"
    if WH_WORDS.intersection(la) != WH_WORDS.intersection(lb):
        return "question"
    if _names(wa, la) != _names(wb, lb):
        return "names"
    return _reworded(_content(la), _content(lb), similarity)


def _difference(a: list[str], b: list[str]) -> tuple[list[str], list[str]]:
    """The words of each text that the other lacks (as multisets)."""
    ca, cb = Counter(a), Counter(b)
    return list((ca - cb).elements()), list((cb - ca).elements())


def _names(original: list[str], lower: list[str]) -> set[str]:
    """Names, numbers and units: capitalised words (not the first), digits, units."""
    found = {lw for i, (w, lw) in enumerate(zip(original, lower))
             if (i > 0 and w[0].isupper() and lw not in PRONOUN_I) or lw in UNITS}
    return found | set(_numbers(lower))


def _particles(a: Counter[str], b: Counter[str]) -> bool:
    """One text leans to one particle of an opposite pair, the other to the other."""
    for x, y in PARTICLE_OPPOSITES:
        if (a[x] > b[x] and b[y] > a[y]) or (b[x] > a[x] and a[y] > b[y]):
            return True
    return False


def _content(lower: list[str]) -> list[str]:
    """Content words: not function, question, negation or number words, and not
    "please" where it is politeness (first, or after "can you")."""
    out = []
    for i, w in enumerate(lower):
        if w in FUNCTION_WORDS or w in WH_WORDS or w in NEGATIONS or w in NUMBER_WORDS \
                or w[0].isdigit():
            continue
        if w in POLITENESS and (i == 0 or lower[i - 1] in POLITE_NEIGHBOURS):
            continue
        out.append(w)
    return out


def _unmatched(a: list[str], b: list[str], *, both: bool) -> bool:
    """Whether words remain once shared words and synonym pairs are paired off:
    on both sides (`both`) or on either."""
    only_a, only_b = _difference([w for w in a if w], [w for w in b if w])
    only_a, only_b = _pair_off(only_a, only_b)
    return bool(only_a and only_b) if both else bool(only_a or only_b)


def _pair_off(only_a: list[str], only_b: list[str]) -> tuple[list[str], list[str]]:
    """Remove synonym or same-base pairs ("meaning" / "mean") from both lists."""
    rest_b = list(only_b)
    rest_a = []
    for x in only_a:
        match = next((y for y in rest_b if are_synonyms(x, y)), None)
        if match is None:
            rest_a.append(x)
        else:
            rest_b.remove(match)
    return rest_a, rest_b


def _reworded(a: list[str], b: list[str], similarity: float) -> str | None:
    """"substitution" when one content word was replaced by an unrelated one,
    "rewording" when several were and the texts are not nearly identical."""
    only_a, only_b = _pair_off(*_difference(a, b))
    if not only_a or not only_b:
        return None
    if len(only_a) == 1 and len(only_b) == 1:
        return "substitution"
    return "rewording" if similarity < REWORDED_SIMILARITY else None


def _numbers(lower: list[str]) -> Counter[str]:
    return Counter(NUMBER_WORDS.get(w, w).replace(",", "") for w in lower
                   if w[0].isdigit() or w in NUMBER_WORDS)


def _counted(lower: list[str]) -> dict[str, str]:
    """Each number's counted word, where the word after it is a content word:
    "how many cups are in 5 pints" -> {"5": "pints"}."""
    found: dict[str, str] = {}
    for w, after in zip(lower, lower[1:]):
        if (w[0].isdigit() or w in NUMBER_WORDS) and after not in FUNCTION_WORDS and not (
                after[0].isdigit() or after in NUMBER_WORDS):
            found.setdefault(NUMBER_WORDS.get(w, w).replace(",", ""), after)
    return found


def _rebound(a: dict[str, str], b: dict[str, str]) -> bool:
    """A number that counts one thing in one text and another in the other
    ("5 pints" / "5 cups"), unless the two are synonyms or inflections."""
    return any(n in b and not are_synonyms(word, b[n]) for n, word in a.items())


def _negations(lower: list[str]) -> int:
    return sum(1 for w in lower if w in NEGATIONS or w.endswith("n't"))


def _anchors(original: list[str], lower: list[str]) -> list[str]:
    """Anchor words in order: names (capitalised, not first), numbers, units,
    and the neighbours of directional words."""
    found = []
    for i, (w, lw) in enumerate(zip(original, lower)):
        beside = (i > 0 and lower[i - 1] in DIRECTIONAL) or (
            i + 1 < len(lower) and lower[i + 1] in DIRECTIONAL)
        if (i > 0 and w[0].isupper() and lw not in PRONOUN_I) or w[0].isdigit() or (
                lw in UNITS) or (
                beside and lw not in DIRECTIONAL):
            found.append(lw)
    return found


def _swapped(a: list[str], b: list[str]) -> bool:
    """Whether the anchors both texts have appear in another order (first occurrences)."""
    shared = set(a) & set(b)
    return _first_order(a, shared) != _first_order(b, shared)


def _first_order(anchors: list[str], keep: set[str]) -> list[str]:
    return list(dict.fromkeys(w for w in anchors if w in keep))


def _opposite(only_a: list[str], only_b: list[str]) -> bool:
    """A word of one text is the other's opposite, or it with a negating prefix."""
    return any(are_opposites(x, y) or _prefixed(x, y) or _prefixed(y, x)
               for x in only_a for y in only_b)


def _prefixed(word: str, base: str) -> bool:
    return len(base) > 2 and any(word == p + base for p in NEGATING_PREFIXES)
