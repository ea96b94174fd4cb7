"""WebShop's purchase reward, as a pure function.

This re-implements the reward of the WebShop benchmark (Yao et al., 2022; the
public release's `web_agent_site/engine/goal.py`, MIT licence, Copyright (c) 2023
Princeton Natural Language Processing) without its spaCy and thefuzz
dependencies.

    reward, breakdown = webshop_reward(goal, product, selected_options, price)

With A the goal's attributes, O the goal's options and ``r_type`` the
product-type factor::

    reward = r_type * (n_attr_matched + n_option_matched + price_ok) / (|A| + |O| + 1)

Term by term:

* **attributes** (``n_attr_matched`` of ``|A|``): a goal attribute is matched when
  some attribute of the bought product has a fuzzy token-set ratio > 85 with it
  (`token_set_ratio`), or else when it occurs as a substring of the product's
  lower-cased title, bullet points (features) or description.
* **options** (``n_option_matched`` of ``|O|``): every selected option value
  (colours first reduced to a base colour by `normalize_color`) counts once when
  it matches a goal option value: exactly for the option named ``size``, by
  token-set ratio > 85 for any other option; an unmatched selected value still
  counts when it occurs in the product's title, bullet points or description.
  The count is capped at ``|O|`` (the official code leaves it uncapped, which lets
  the reward exceed 1 when more options are selected than the goal asks for).
* **price** (``price_ok``, 0 or 1): the price paid is at most the goal's
  ``price_upper``. A goal without a bound (``price_upper`` None or <= 0) counts as
  satisfied.
* **product type** (``r_type``): 1.0, lowered when the bought product is of another
  type than the goal's product. ``query_match``: same search query the product
  was scraped under; ``category_match``: the two ``›``-separated category paths
  share at least 2 levels; ``title_score``: the fraction of the goal product
  name's words that occur in the bought product's name (0.2 when the goal name
  has none). Then ``r_type = 0.5`` when none of query_match, category_match,
  title_score > 0.2 holds; ``r_type = 0.1`` when title_score < 0.1; ``r_type = 0``
  when title_score == 0 (later rules win).

Deviation from the official code: WebShop keeps only the nouns and proper nouns
of the names (spaCy part-of-speech tags) for ``title_score``; here the words are
the lower-cased alphabetic tokens of two letters or more that are not English
stop words (`title_words`), so adjectives count too. The same product always
gets ``title_score = 1``. The fuzzy ratio is thefuzz's ``token_set_ratio``
(rapidfuzz's Indel-based ratio after thefuzz's default processing, rounded to an
integer), re-implemented in `token_set_ratio`.
"""

from __future__ import annotations

import re
from typing import Any, Mapping, Sequence

from bm25s.stopwords import STOPWORDS_EN_PLUS

FUZZY_THRESHOLD = 85
"""A fuzzy match needs a token-set ratio strictly above this (0..100)."""

EXACT_MATCH_OPTS = ("size",)
"""Option names whose values must match a goal option exactly."""

COLOR_SET = (
    "alabaster", "apricot", "aqua", "ash", "asphalt", "azure", "banana", "beige",
    "black", "blue", "blush", "bordeaux", "bronze", "brown", "burgundy", "camel",
    "camo", "caramel", "champagne", "charcoal", "cheetah", "chestnut", "chocolate",
    "christmas", "coffee", "cognac", "copper", "coral", "cranberry", "cream",
    "crystal", "dark", "denim", "eggplant", "elephant", "espresso", "fuchsia",
    "gold", "granite", "grape", "graphite", "grass", "gray", "green", "grey",
    "heather", "indigo", "ivory", "ivy", "khaki", "lavender", "lemon", "leopard",
    "light", "lilac", "lime", "magenta", "maroon", "mauve", "merlot", "midnight",
    "mint", "mocha", "multicolor", "mushroom", "mustard", "natural", "navy", "nude",
    "olive", "orange", "peach", "pewter", "pink", "plum", "purple", "rainbow", "red",
    "rose", "royal", "rust", "sand", "sapphire", "seashell", "silver", "skull",
    "slate", "steel", "stone", "stonewash", "sunflower", "tan", "taupe", "teal",
    "tiger", "turquoise", "violet", "walnut", "wheat", "white", "wine", "yellow",
)
"""WebShop's base colours, in its order (the first one contained in a value wins)."""

_NON_ALNUM = re.compile(r"[^a-zA-Z0-9]+")
_ALPHA_WORD = re.compile(r"[a-z]+")
_TITLE_STOPWORDS = frozenset(STOPWORDS_EN_PLUS)


def normalize_color(value: str) -> str:
    """The first WebShop base colour that occurs in `value` (substring test), else `value`."""
    for color in COLOR_SET:
        if color in value:
            return color
    return value


def _process(text: str) -> str:
    """thefuzz's default processing: ASCII only, non-alphanumerics to spaces, lower, strip."""
    text = text.encode("ascii", "ignore").decode()
    return _NON_ALNUM.sub(" ", text).lower().strip()


def _lcs_length(a: str, b: str) -> int:
    if len(a) < len(b):
        a, b = b, a
    previous = [0] * (len(b) + 1)
    for char_a in a:
        current = [0]
        for j, char_b in enumerate(b, 1):
            current.append(previous[j - 1] + 1 if char_a == char_b else max(previous[j], current[j - 1]))
        previous = current
    return previous[-1]


def _ratio(a: str, b: str) -> float:
    """Indel similarity in 0..100: 100 * 2 * LCS(a, b) / (|a| + |b|); 0 when both are empty."""
    total = len(a) + len(b)
    return 100.0 * 2 * _lcs_length(a, b) / total if total else 0.0


def token_set_ratio(s1: str, s2: str) -> int:
    """thefuzz's ``fuzz.token_set_ratio``: 0..100, 100 when one token set contains the other.

    With I the sorted common tokens and D1, D2 the sorted tokens only in s1 / s2,
    the maximum of ratio(I, I+D1), ratio(I, I+D2), ratio(I+D1, I+D2).
    """
    tokens1, tokens2 = set(_process(s1).split()), set(_process(s2).split())
    if not tokens1 or not tokens2:
        return 0
    common = tokens1 & tokens2
    only1, only2 = tokens1 - tokens2, tokens2 - tokens1
    if common and (not only1 or not only2):
        return 100
    base = " ".join(sorted(common))
    with1 = " ".join(filter(None, [base, " ".join(sorted(only1))]))
    with2 = " ".join(filter(None, [base, " ".join(sorted(only2))]))
    scores = [_ratio(with1, with2)]
    if base:
        scores += [_ratio(base, with1), _ratio(base, with2)]
    return int(round(max(scores)))


def title_words(name: str) -> list[str]:
    """Lower-cased alphabetic words (2+ letters) of a product name, without English stop words.

    Stands in for the spaCy noun / proper-noun tokens of the official reward.
    """
    return [w for w in _ALPHA_WORD.findall(name.lower()) if len(w) > 1 and w not in _TITLE_STOPWORDS]


def _name(record: Mapping[str, Any]) -> str:
    return str(record.get("name") or record.get("Title") or "")


def _product_text(product: Mapping[str, Any]) -> tuple[str, str, str]:
    bullets = product.get("BulletPoints") or []
    if isinstance(bullets, str):
        bullets = [bullets]
    return (
        str(product.get("Title") or product.get("name") or "").lower(),
        " ".join(str(b) for b in bullets).lower(),
        str(product.get("Description") or "").lower(),
    )


def type_reward(goal: Mapping[str, Any], product: Mapping[str, Any]) -> dict:
    """The product-type factor ``r_type`` and what it was computed from."""
    query_match = str(product.get("query", "")).strip().lower() == str(goal.get("query", "")).strip().lower()
    bought_path = {level.strip() for level in str(product.get("product_category", "")).split("›")}
    goal_path = {level.strip() for level in str(goal.get("product_category", "")).split("›")}
    category_match = len((bought_path & goal_path) - {""}) >= 2
    desired = set(title_words(_name(goal)))
    bought = set(title_words(_name(product)))
    title_score = len(desired & bought) / len(desired) if desired else 0.2
    r_type = 1.0
    if not (query_match or category_match or title_score > 0.2):
        r_type = 0.5
    if title_score < 0.1:
        r_type = 0.1
    if title_score == 0.0:
        r_type = 0.0
    return {
        "r_type": r_type,
        "query_match": query_match,
        "category_match": category_match,
        "title_score": title_score,
    }


def attribute_matches(goal_attributes: Sequence[str], product: Mapping[str, Any]) -> list[bool]:
    """For each goal attribute: is it matched by the product (attribute list, else text)?"""
    product_attributes = [str(a) for a in product.get("Attributes") or []]
    texts = _product_text(product)
    matched = []
    for goal_attribute in goal_attributes:
        hit = any(token_set_ratio(a, goal_attribute) > FUZZY_THRESHOLD for a in product_attributes)
        if not hit:
            hit = any(goal_attribute in text for text in texts)
        matched.append(hit)
    return matched


def _goal_option_values(goal_options: Mapping[str, str] | Sequence[str] | None) -> list[str]:
    if not goal_options:
        return []
    if isinstance(goal_options, Mapping):
        return [str(v) for v in goal_options.values()]
    return [str(v) for v in goal_options]


def option_matches(
    goal_options: Mapping[str, str] | Sequence[str] | None,
    selected_options: Mapping[str, str],
    product: Mapping[str, Any],
) -> dict[str, bool]:
    """For each selected option name: does its value count as matching a goal option?"""
    goal_values = [normalize_color(v) for v in _goal_option_values(goal_options)]
    texts = _product_text(product)
    result = {}
    for name, raw_value in selected_options.items():
        value = normalize_color(str(raw_value))
        if name.lower() in EXACT_MATCH_OPTS:
            hit = value in goal_values
        else:
            hit = any(token_set_ratio(g, value) > FUZZY_THRESHOLD for g in goal_values)
        if not hit:
            hit = any(value in text for text in texts)
        result[name] = hit
    return result


def webshop_reward(
    goal: Mapping[str, Any],
    product: Mapping[str, Any],
    selected_options: Mapping[str, str] | None,
    price: float,
) -> tuple[float, dict]:
    """WebShop's reward in [0, 1] for buying `product` with `selected_options` at `price`.

    `goal` needs ``attributes`` (list), ``goal_options`` (dict name -> value, or a list
    of values for human goals), ``price_upper``, ``query``, ``product_category`` and
    ``name`` (the target product's name). `product` needs ``Attributes``, ``Title``,
    ``BulletPoints``, ``Description``, ``query``, ``product_category`` and ``name``
    (or ``Title``). See the module docstring for each term. The breakdown holds
    every term (counts, fractions, weights, the type-factor inputs) and ``reward``.
    """
    selected_options = dict(selected_options or {})
    goal_attributes = [str(a) for a in goal.get("attributes") or []]
    n_options = len(_goal_option_values(goal.get("goal_options")))
    denominator = len(goal_attributes) + n_options + 1

    type_info = type_reward(goal, product)
    attr_hits = attribute_matches(goal_attributes, product)
    option_hits = option_matches(goal.get("goal_options"), selected_options, product)
    n_attr = sum(attr_hits)
    n_option = min(sum(option_hits.values()), n_options)
    price_upper = goal.get("price_upper")
    price_ok = price_upper is None or price_upper <= 0 or float(price) <= float(price_upper)

    reward = type_info["r_type"] * (n_attr + n_option + int(price_ok)) / denominator
    reward = min(1.0, max(0.0, reward))
    breakdown = {
        "reward": reward,
        **type_info,
        "r_att": n_attr / len(goal_attributes) if goal_attributes else None,
        "num_attr_matches": n_attr,
        "num_attrs": len(goal_attributes),
        "attribute_matches": dict(zip(goal_attributes, attr_hits)),
        "r_option": n_option / n_options if n_options else None,
        "num_option_matches": n_option,
        "num_options": n_options,
        "option_matches": option_hits,
        "r_price": price_ok,
        "price": float(price),
        "price_upper": price_upper,
        "w_att": len(goal_attributes) / denominator,
        "w_option": n_options / denominator,
        "w_price": 1 / denominator,
    }
    return reward, breakdown
