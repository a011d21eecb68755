"""The word lists and the small morphology behind the lexical vetoes.

Of the PyPI packages looked at, none ships English antonyms inside its
wheel (`nltk` and `wn` download WordNet at run time; `wordnet-lookup` holds
word lists and suffixes only), so the opposites here are a hand-written
table of common English pairs in their base forms. Inflected forms are
matched through `bases`, which undoes regular endings: "heavier" -> heavy,
"closes" -> close, "opened" -> open, "bigger" -> big. Comparatives are
found the same way: a word whose base is a listed adjective and whose
ending is -er / -est ("lighter", "fastest"), or one of the irregular ones
("more", "less", "better", "worst").
"""

from __future__ import annotations

FUNCTION_WORDS = frozenset("""a an the is are was were be been being am do does did done can
could would should will shall may might must i me my mine you your yours we us our it its they
them their he him his she her this that these those of at for by with about as and or but if
then so what what's whats which how there here have has had having get got any some just very
really also to in on from into onto over under up down out off before after tell know
want wonder wondering ask""".split())
POLITENESS = frozenset({"please", "kindly", "pls", "plz"})
POLITE_NEIGHBOURS = frozenset({"you", "can", "could", "would", "will", "me", "us"})
PARTICLE_OPPOSITES = (("on", "off"), ("in", "out"), ("up", "down"), ("into", "out"),
                      ("before", "after"), ("over", "under"), ("above", "below"),
                      ("inside", "outside"), ("forward", "backward"), ("for", "against"),
                      ("upstairs", "downstairs"), ("onto", "off"))
QUALITIES = (
    ("good", "bad"), ("big", "small"), ("large", "small"), ("long", "short"),
    ("tall", "short"), ("high", "low"), ("heavy", "light"), ("fast", "slow"),
    ("quick", "slow"), ("hot", "cold"), ("warm", "cool"), ("old", "young"), ("old", "new"),
    ("early", "late"), ("easy", "hard"), ("easy", "difficult"), ("simple", "complex"),
    ("cheap", "expensive"), ("rich", "poor"), ("strong", "weak"), ("thick", "thin"),
    ("wide", "narrow"), ("deep", "shallow"), ("loud", "quiet"), ("bright", "dark"),
    ("light", "dark"), ("full", "empty"), ("wet", "dry"), ("clean", "dirty"),
    ("safe", "dangerous"), ("happy", "sad"), ("near", "far"), ("close", "far"),
    ("hard", "soft"), ("sweet", "sour"), ("sharp", "dull"), ("public", "private"),
    ("positive", "negative"), ("active", "passive"), ("major", "minor"),
    ("inner", "outer"), ("upper", "lower"), ("internal", "external"), ("true", "false"),
    ("right", "wrong"), ("correct", "incorrect"), ("legal", "illegal"), ("odd", "even"),
    ("maximum", "minimum"), ("max", "min"), ("first", "last"), ("top", "bottom"),
    ("front", "back"), ("many", "few"), ("much", "little"), ("more", "less"),
    ("more", "fewer"), ("most", "least"), ("better", "worse"), ("best", "worst"),
    ("common", "rare"), ("frequent", "rare"), ("healthy", "sick"), ("alive", "dead"),
    ("same", "different"), ("similar", "different"), ("ascending", "descending"))
ACTIONS = (
    ("increase", "decrease"), ("increase", "reduce"), ("raise", "lower"), ("rise", "fall"),
    ("gain", "lose"), ("win", "lose"), ("buy", "sell"), ("give", "take"),
    ("send", "receive"), ("push", "pull"), ("open", "close"), ("open", "shut"),
    ("start", "stop"), ("start", "finish"), ("begin", "end"), ("enable", "disable"),
    ("add", "remove"), ("add", "subtract"), ("plus", "minus"), ("multiply", "divide"),
    ("include", "exclude"), ("import", "export"), ("upload", "download"),
    ("input", "output"), ("enter", "exit"), ("arrive", "leave"), ("arrive", "depart"),
    ("arrival", "departure"), ("come", "go"), ("accept", "reject"), ("allow", "deny"),
    ("allow", "forbid"), ("allow", "block"), ("permit", "forbid"), ("attach", "detach"),
    ("encrypt", "decrypt"), ("encode", "decode"), ("compress", "decompress"),
    ("expand", "collapse"), ("expand", "shrink"), ("enlarge", "shrink"), ("grow", "shrink"),
    ("maximize", "minimize"), ("show", "hide"), ("create", "delete"), ("create", "destroy"),
    ("build", "destroy"), ("hire", "fire"), ("lend", "borrow"), ("remember", "forget"),
    ("love", "hate"), ("save", "spend"), ("save", "delete"), ("win", "lose"),
    ("sleep", "wake"), ("fill", "empty"), ("heat", "cool"), ("freeze", "thaw"),
    ("speed", "slow"), ("join", "leave"), ("connect", "disconnect"), ("cause", "prevent"),
    ("cause", "cure"), ("convert", "revert"))
SIDES = (  # times, places, people, and the two sides of a question
    ("past", "future"), ("am", "pm"), ("yesterday", "tomorrow"), ("morning", "evening"),
    ("day", "night"),
    ("summer", "winter"), ("north", "south"), ("east", "west"), ("left", "right"),
    ("always", "never"), ("everything", "nothing"), ("all", "none"), ("everyone", "nobody"),
    ("male", "female"), ("man", "woman"), ("men", "women"), ("boy", "girl"),
    ("husband", "wife"), ("mother", "father"), ("son", "daughter"), ("brother", "sister"),
    ("adult", "child"), ("adults", "children"), ("pro", "con"), ("advantage", "disadvantage"),
    ("benefit", "drawback"), ("benefit", "risk"), ("strength", "weakness"),
    ("profit", "loss"), ("income", "expense"), ("credit", "debit"), ("supply", "demand"),
    ("buyer", "seller"), ("teacher", "student"), ("employer", "employee"),
    ("question", "answer"), ("singular", "plural"), ("synonym", "antonym"),
    ("mean", "median"), ("sum", "difference"), ("times", "plus"))
OPPOSITES = QUALITIES + ACTIONS + SIDES
SYNONYMS = (
    ("big", "large"), ("small", "little"), ("harmful", "bad"), ("begin", "start"),
    ("buy", "purchase"), ("fix", "repair"), ("quick", "fast"), ("quickly", "fast"),
    ("car", "automobile"), ("author", "writer"), ("write", "written"), ("step", "way"),
    ("help", "assist"), ("error", "bug"), ("show", "display"), ("make", "create"),
    ("use", "utilize"), ("job", "work"), ("meaning", "mean"), ("define", "definition"),
    ("weigh", "weight"), ("permit", "allow"), ("enable", "activate"), ("switch", "turn"),
    ("final", "last"), ("latest", "last"), ("enlarge", "magnify"), ("recommend", "suggest"),
    ("cost", "price"), ("airplane", "plane"), ("flight", "plane"), ("usual", "typical"),
    ("average", "typical"), ("need", "require"), ("required", "need"))
COMPARABLE = frozenset({a for pair in QUALITIES for a in pair} | {
    "cheap", "rich", "warm", "nice", "smart", "clever", "wise", "pretty", "ugly", "busy",
    "calm", "crazy", "dense", "fair", "fine", "firm", "fresh", "funny", "great", "green",
    "healthy", "heavy", "humid", "hungry", "lazy", "lucky", "mild", "noisy", "polite",
    "pure", "rare", "rough", "sad", "scary", "sick", "silly", "smooth", "spicy", "steep",
    "strict", "sunny", "tasty", "tight", "tiny", "tough", "windy", "cool",
    "salty", "safe", "loose", "hard", "soft"})
IRREGULAR_COMPARATIVES = {"more": "more", "most": "more", "less": "less", "least": "less",
                          "fewer": "less", "fewest": "less", "better": "good", "best": "good",
                          "worse": "bad", "worst": "bad", "further": "far",
                          "farther": "far", "furthest": "far", "farthest": "far",
                          "elder": "old", "eldest": "old"}


def bases(word: str) -> set[str]:
    """The word and what it may be an inflection of: "heavier" -> {"heavier",
    "heavi", "heavy", ...}. Over-generates; only look-ups in the tables use it."""
    out = {word}
    for ending in ("iest", "ier", "ies", "ied"):
        if word.endswith(ending) and len(word) > len(ending) + 1:
            out.add(word[: -len(ending)] + "y")
    for ending in ("est", "er", "ed", "es", "ing", "s", "d", "r", "st"):
        if word.endswith(ending) and len(word) > len(ending) + 2:
            stem = word[: -len(ending)]
            out.add(stem)
            if len(stem) > 2 and stem[-1] == stem[-2] and stem[-1] not in "ls":
                out.add(stem[:-1])  # bigger -> big, stopped -> stop
            if ending in ("ing", "ed", "er", "est"):
                out.add(stem + "e")  # closing -> close, later -> late
    return out


def _index(pairs: tuple[tuple[str, str], ...]) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for x, y in pairs:
        found.setdefault(x, set()).add(y)
        found.setdefault(y, set()).add(x)
    return found


OPPOSITE_OF = _index(OPPOSITES)
SYNONYM_OF = _index(SYNONYMS)


def are_opposites(x: str, y: str) -> bool:
    """Whether some base of `x` is listed as the opposite of some base of `y`."""
    bx, by = bases(x), bases(y)
    return any(OPPOSITE_OF.get(b, set()) & by for b in bx)


def are_synonyms(x: str, y: str) -> bool:
    """Same base, or bases listed as synonyms ("meaning" / "mean", "weighs" / "weight")."""
    bx, by = bases(x), bases(y)
    return bool(bx & by) or any(SYNONYM_OF.get(b, set()) & by for b in bx)


def comparative(word: str) -> str | None:
    """The adjective `word` compares ("heavier" -> heavy, "most" -> more), or
    None when it is not a comparative or superlative."""
    if word in IRREGULAR_COMPARATIVES:
        return IRREGULAR_COMPARATIVES[word]
    if not (word.endswith("er") or word.endswith("est")):
        return None
    found = sorted(b for b in bases(word) - {word} if b in COMPARABLE)
    return found[0] if found else None
