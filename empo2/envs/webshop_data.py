"""WebShop's data: the product catalogue (read from WebShop's file formats), the prices products sell at, and the
goals built from the products' instructions, with their split into training and test variations."""

from __future__ import annotations

import itertools
import json
import random
import re
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any, Iterable

DATA_DIR = Path(__file__).resolve().parents[2] / "data" / "webshop"
"""Where the shipped WebShop data lives (the repository's ``data/webshop``)."""
DEFAULT_PRODUCTS = "products_100.jsonl"
DEFAULT_INSTRUCTIONS = "items_ins_v2_1000.json"
DEFAULT_HUMAN_GOALS = "items_human_ins.json"

PRICE_RANGE = [10.0 * i for i in range(1, 100)]
"""Candidate price bounds of a goal: $10 .. $990."""
NO_PRICE_BOUND = 1_000_000.0


def instruction_words(text: str) -> list[str]:
    """The distinct words of a goal instruction, lower-case, without the punctuation around them."""
    words = (w.strip(".,;:!?()[]\"'") for w in text.lower().split())
    return list(dict.fromkeys(w for w in words if w))


def read_json_or_jsonl(path: Path) -> Any:
    """The contents of a JSON file, or the records of a JSON Lines (``.jsonl``) file."""
    if not path.exists():
        raise FileNotFoundError(f"webshop: data file {path} does not exist")
    with path.open(encoding="utf-8") as handle:
        if path.suffix == ".jsonl":
            return [json.loads(line) for line in handle if line.strip()]
        return json.load(handle)


def data_path(path: str | Path | None, name: str) -> Path:
    """`path`, or else the shipped data file `name`."""
    if path is not None:
        return Path(path)
    default = DATA_DIR / name
    if not default.exists():
        raise FileNotFoundError(
            f"webshop: shipped data file {default} is missing; the repository's data/webshop/ "
            "folder should hold it (or pass products_path= / instructions_path= explicitly)"
        )
    return default


def _parse_pricing(raw: Any) -> list[float]:
    """WebShop's ``pricing``: a list of 1-2 floats from a list or a '$12.99 - $15.99' string."""
    if isinstance(raw, (int, float)):
        return [float(raw)]
    if isinstance(raw, (list, tuple)):
        values = []
        for item in raw:
            values += _parse_pricing(item)
        return values[:2]
    if isinstance(raw, str) and raw.strip():
        parts = raw.split("$")[1:] if "$" in raw else [raw]
        values = []
        for part in parts:
            digits = re.sub(r"[^\d.]", "", part)
            try:
                values.append(float(Decimal(digits)))
            except InvalidOperation:
                continue
        return values[:2]
    return []


def _price_tag(pricing: list[float]) -> str:
    return f"${pricing[0]}" if len(pricing) == 1 else f"${pricing[0]} to ${pricing[1]}"


def _parse_options(product: dict) -> dict[str, list[str]]:
    """Option name -> values: the loaded ``options``, else the raw ``customization_options``."""
    options = product.get("options")
    if isinstance(options, dict) and options:
        return {str(k).lower(): [str(v) for v in values] for k, values in options.items() if values}
    raw = product.get("customization_options")
    if not isinstance(raw, dict):
        return {}
    parsed = {}
    for name, contents in raw.items():
        if not contents:
            continue
        values = []
        for content in contents:
            value = content.get("value") if isinstance(content, dict) else content
            if value is None:
                continue
            values.append(str(value).strip().replace("/", " | ").lower())
        if values:
            parsed[str(name).lower()] = values
    return parsed


def _normalise_reviews(reviews: Any) -> list[dict]:
    result = []
    for review in reviews or []:
        if not isinstance(review, dict):
            continue
        result.append(
            {
                "title": str(review.get("title", "")),
                "score": review.get("score", review.get("stars", "")),
                "body": str(review.get("body", review.get("review", ""))),
            }
        )
    return result


def _contents(product: dict) -> str:
    """The text WebShop's search engine indexes: title, description, first bullet, options."""
    option_text = ", and ".join(f"{name}: {', '.join(values)}" for name, values in product["options"].items())
    first_bullet = product["BulletPoints"][0] if product["BulletPoints"] else ""
    return " ".join([product["Title"], product["Description"], first_bullet, option_text]).lower()


def load_products(
    products_path: str | Path,
    instructions: dict | None = None,
    num_products: int | None = None,
) -> list[dict]:
    """Read a WebShop product file and return the products as WebShop's engine holds them.

    `products_path`: ``items_shuffle*.json`` (raw or loaded product dicts, a JSON
    list) or the search engine's ``documents.jsonl`` (``id``, ``contents``,
    ``product``). Each returned dict has ``asin``, ``name``, ``Title``,
    ``Description``, ``BulletPoints``, ``pricing`` (1-2 floats), ``Price`` (text),
    ``options`` ({name: [values]}), ``Attributes``, ``Reviews``, ``Rating``,
    ``category``, ``query`` (lower-cased), ``product_category``, ``contents`` (the
    indexed text) and any other field of the file. `instructions` (the contents of
    ``items_ins_v2*.json``) supplies ``Attributes`` for the products it lists.
    Products with a bad or repeated ASIN are skipped, as in WebShop.
    """
    raw = read_json_or_jsonl(Path(products_path))
    if isinstance(raw, dict):
        raw = list(raw.values())
    if not isinstance(raw, list):
        raise ValueError(f"webshop: {products_path} holds no list of products")
    if num_products is not None:
        raw = raw[:num_products]
    products, seen = [], set()
    for entry in raw:
        contents = None
        if isinstance(entry, dict) and "product" in entry and isinstance(entry["product"], dict):
            contents = entry.get("contents")
            product = dict(entry["product"])
            product.setdefault("asin", entry.get("id"))
        else:
            product = dict(entry)
        asin = str(product.get("asin") or "")
        if not asin or asin == "nan" or len(asin) > 10 or asin in seen:
            continue
        seen.add(asin)
        title = product.get("Title") or product.get("name") or ""
        product["asin"] = asin
        product["Title"] = str(title)
        product["name"] = str(product.get("name") or title)
        description = product.get("Description")
        if description is None:
            description = product.get("full_description") or ""
        product["Description"] = str(description)
        bullets = product.get("BulletPoints")
        if bullets is None:
            bullets = product.get("small_description") or []
        product["BulletPoints"] = [str(b) for b in (bullets if isinstance(bullets, list) else [bullets])]
        pricing = _parse_pricing(product.get("pricing"))
        if not pricing:
            pricing = _parse_pricing(product.get("Price")) or [100.0]
        product["pricing"] = pricing
        product["Price"] = _price_tag(pricing)
        product["options"] = _parse_options(product)
        if instructions and asin in instructions and "attributes" in instructions[asin]:
            product["Attributes"] = list(instructions[asin]["attributes"])
        elif not product.get("Attributes"):
            product["Attributes"] = ["DUMMY_ATTR"]
        product["Reviews"] = _normalise_reviews(product.get("Reviews"))
        product["Rating"] = product.get("Rating", "N.A.")
        product["category"] = str(product.get("category", ""))
        product["query"] = str(product.get("query", "")).lower().strip()
        product["product_category"] = str(product.get("product_category", ""))
        product["contents"] = contents if isinstance(contents, str) else _contents(product)
        products.append(product)
    if not products:
        raise ValueError(f"webshop: no products in {products_path}")
    return products


def product_prices(products: Iterable[dict], rng: random.Random) -> dict[str, float]:
    """The price each product sells at: its price, or a uniform draw in its price range."""
    prices = {}
    for product in products:
        pricing = product["pricing"]
        prices[product["asin"]] = pricing[0] if len(pricing) == 1 else rng.uniform(*pricing[:2])
    return prices


def _price_bound(price: float, rng: random.Random) -> tuple[float, str]:
    """WebShop's goal price bound: the larger of two of the 4 round prices above `price`."""
    candidates = [p for p in PRICE_RANGE if p > price][:4]
    if len(candidates) < 2:
        return NO_PRICE_BOUND, ""
    upper = max(rng.sample(candidates, 2))
    return upper, f", and price lower than {upper:.2f} dollars"


def _goal_base(product: dict) -> dict:
    return {
        "asin": product["asin"],
        "category": product["category"],
        "query": product["query"],
        "product_category": product["product_category"],
        "name": product["Title"],
    }


def synthetic_goals(
    products: list[dict], instructions: dict, prices: dict[str, float], rng: random.Random
) -> list[dict]:
    """WebShop's synthetic goals: per product with an instruction, one goal per option combination.

    The goal text is ``<instruction> with <name>: <value>, and ... , and price lower
    than <bound> dollars``; ``attributes`` are the instruction's attributes,
    ``goal_options`` the combination ({name: value}), ``price_upper`` the bound.
    """
    goals = []
    for product in products:
        entry = instructions.get(product["asin"], {})
        text = entry.get("instruction") or product.get("instruction_text")
        attributes = entry.get("instruction_attributes") or product.get("instruction_attributes")
        if not text or not attributes:
            continue
        price_upper, price_text = _price_bound(prices[product["asin"]], rng)
        names = sorted(product["options"])
        for combination in itertools.product(*(product["options"][name] for name in names)):
            goal_options = dict(zip(names, combination))
            option_text = ", and ".join(f"{k}: {v}" for k, v in goal_options.items())
            option_text = f" with {option_text}" if option_text else ""
            goals.append(
                {
                    **_goal_base(product),
                    "instruction_text": f"{text}{option_text}{price_text}",
                    "attributes": list(attributes),
                    "goal_options": goal_options,
                    "price_upper": price_upper,
                    "source": "synthetic",
                }
            )
    return goals


def human_goals(
    products: list[dict], human_instructions: dict, prices: dict[str, float], rng: random.Random
) -> list[dict]:
    """WebShop's human goals: every crowd-written instruction (with attributes) of a catalogue product.

    ``goal_options`` is the instruction's list of option values. Instructions
    without attributes are skipped, as in WebShop.
    """
    goals = []
    for product in products:
        entries = human_instructions.get(product["asin"])
        if entries is None:
            entries = product.get("instructions") or []
        for entry in entries:
            attributes = entry.get("instruction_attributes") or []
            if not attributes:
                continue
            price_upper, price_text = _price_bound(prices[product["asin"]], rng)
            goals.append(
                {
                    **_goal_base(product),
                    "instruction_text": str(entry["instruction"]).strip(".") + price_text,
                    "attributes": list(attributes),
                    "goal_options": [str(o) for o in entry.get("instruction_options") or []],
                    "price_upper": price_upper,
                    "source": "human",
                }
            )
    return goals


def split_variations(goals: list[dict], n_test_goals: int | None, split_by: str) -> tuple[list[int], list[int]]:
    """The test and training variations, as indices into `goals`: the first `n_test_goals` goals (by default 500
    when there are at least 2,500 goals, else a fifth) are the test ones, or, with ``split_by="product"``,
    whole products go to test until it holds `n_test_goals` goals."""
    n = len(goals)
    if n_test_goals is None:
        n_test_goals = 500 if n >= 2500 else n // 5
    if not 0 <= n_test_goals <= n:
        raise ValueError(f"webshop: n_test_goals must be in 0..{n}, not {n_test_goals}")
    if split_by == "goal":
        test = list(range(n_test_goals))
    else:
        per_asin: dict[str, int] = {}
        for goal in goals:  # products in order of first appearance in the shuffled goals
            per_asin[goal["asin"]] = per_asin.get(goal["asin"], 0) + 1
        test_asins, n_test = set(), 0
        for asin, count in per_asin.items():
            if n_test >= n_test_goals:
                break
            test_asins.add(asin)
            n_test += count
        test = [i for i, g in enumerate(goals) if g["asin"] in test_asins]
    test_set = set(test)
    return test, [i for i in range(n) if i not in test_set]
