"""WebShop in text mode: search a product catalogue, open items, pick options, buy.

A pure-Python re-implementation of the text mode of WebShop (Yao et al., 2022,
"WebShop: Towards Scalable Real-World Web Interaction with Grounded Language
Agents"; MIT licence, Copyright (c) 2023 Princeton Natural Language Processing)
with the same pages, buttons, goals and reward, and no web server, Java or spaCy.

    env = make_env("webshop")                     # the shipped 100-product catalogue
    observation, info = env.reset(env.train_variations[0])
    result = env.step("search[men's tuxedo shirt]")
    result = env.step("click[b09nnmv9ln]")        # an ASIN listed on the results page
    result = env.step("click[xx-large]")          # an option value listed on the item page
    result = env.step("click[buy now]")           # reward terms in info["reward_breakdown"]

Pages and actions (``info["valid_actions"]`` lists what each page admits):

* search page: ``search[<any query>]`` (listed as ``search[...]``);
* results page, 10 products a page out of the top 50 BM25 hits: ``click[<asin>]``,
  ``click[next >]``, ``click[< prev]``, ``click[back to search]``;
* item page: ``click[<option value>]`` (one value per option name; a later click of
  the same option replaces it), ``click[description]``, ``click[features]``,
  ``click[reviews]``, ``click[attributes]`` (only with ``show_attrs=True``, as in
  WebShop), ``click[< prev]`` (back to the results page), ``click[back to search]``,
  ``click[buy now]`` (ends the episode);
* description / features / reviews / attributes sub-pages: ``click[< prev]`` (back
  to the item, options kept), ``click[back to search]``.

An action is the first ``search[...]`` / ``click[...]`` in the text (case and
surrounding words ignored). Anything not admissible on the current page is
answered with an ``Invalid action: ...`` observation, leaves the page as it is
and uses a step (``snap_actions=True`` instead searches for unparsable text on the
search page and snaps it to the most similar valid click elsewhere, as free text is
snapped in the other environments). After ``max_steps`` steps
(15) the episode ends with ``truncated=True`` and reward 0.

Reward at ``buy now``: `empo2.envs.webshop_reward.webshop_reward` (attributes,
options, price bound, product-type factor); score = 100 x reward, and
``StepResult.reward`` is the score change; ``info["success"]`` is reward == 1.

WebShop data
------------
The package ships real WebShop data in ``data/webshop/`` (MIT licence, see the
LICENSE file there): ``products_100.jsonl``, the first 100 products of WebShop's
1,000-product catalogue in the search engine's document format (``id``,
``contents``, ``product``), and ``items_ins_v2_1000.json``, the attributes and
crowd-written instructions of the 1,000 products. 44 of the 100 products have an
instruction; one synthetic goal per combination of their option values gives
501 goals. They are shuffled with ``seed`` and split into ``test_variations``
(the first ``n_test_goals``: by default 500 when there are at least 2,500 goals,
else a fifth, i.e. 100 here) and ``train_variations`` (the rest, 401 here);
``split_by="product"`` keeps all goals of one product on the same side.

With the official files of the WebShop release, point the environment at them:

    WebShopEnv(products_path="…/items_shuffle_1000.json",      # or items_shuffle.json
               instructions_path="…/items_ins_v2_1000.json",   # or items_ins_v2.json
               human_goals_path="…/items_human_ins.json",
               goal_source="human")                             # or "synthetic"

``products_path`` may be the raw product list (``items_shuffle*.json``: ``asin``,
``name``, ``full_description``, ``small_description``, ``pricing``,
``customization_options``, ``category``, ``query``, ``product_category``,
``images``, …), an already-loaded list (``Title``, ``Description``,
``BulletPoints``, ``pricing``, ``Price``, ``options``, ``Attributes``, …), or the
search engine's ``documents.jsonl`` (as shipped here); ``num_products`` keeps the
first N products, as WebShop's ``num_products`` does. ``instructions_path``
defaults to the shipped ``items_ins_v2_1000.json`` (enough for any subset of the
1,000-product catalogue; the full catalogue needs the full ``items_ins_v2.json``).
Human goals take the crowd-written instruction, its attributes and its options (a
list of values) for every product of the catalogue that has them; without
``human_goals_path`` they come from ``data/webshop/items_human_ins.json`` when it
exists, else from the ``instructions`` the products carry (one product of the
shipped 100 does: a single goal, so use the synthetic goals here).

Differences from the official environment: search is BM25 from ``bm25s``
(Lucene scoring, k1 = 0.9, b = 0.4 as Pyserini's defaults, Lucene's English stop
words) with a plural-only stemmer instead of Pyserini's Porter stemmer, so
rankings differ somewhat; ``search[...]`` is admissible on the search page only;
prices of products with a price range are drawn with ``seed`` (WebShop draws them
unseeded); the reward's title score uses content words instead of spaCy nouns
(see `empo2.envs.webshop_reward`); reviews are empty in the shipped data.

The environment is here; its parts live beside it: `empo2.envs.webshop_data` (the
catalogue, prices and goals), `empo2.envs.webshop_search` (the BM25 search),
`empo2.envs.webshop_reward` (the reward) and `empo2.envs.webshop_shopper` (a scripted
shopper, for scale).
"""

from __future__ import annotations

import copy
import os
import random
import re
from pathlib import Path
from typing import Any

import numpy as np

from empo2.envs.base import StepResult, snap_action
from empo2.envs.webshop_data import (
    DATA_DIR,
    DEFAULT_HUMAN_GOALS,
    DEFAULT_INSTRUCTIONS,
    DEFAULT_PRODUCTS,
    data_path,
    human_goals,
    instruction_words,
    load_products,
    product_prices,
    read_json_or_jsonl,
    split_variations,
    synthetic_goals,
)
from empo2.envs.webshop_reward import webshop_reward
from empo2.envs.webshop_search import ProductSearch
from empo2.prompts import next_turn

PRODUCT_WINDOW = 10
"""Products a results page shows."""
SUB_PAGES = ("description", "features", "reviews", "attributes")

BACK_TO_SEARCH = "back to search"
NEXT_PAGE = "next >"
PREV_PAGE = "< prev"
BUY_NOW = "buy now"
SEARCH_ACTION = "search[...]"

_EXACT_ACTION = re.compile(r"^\s*(search|click)\s*\[(.*)\]\s*$", re.IGNORECASE | re.DOTALL)
_ANY_ACTION = re.compile(r"(search|click)\s*\[(.*?)\]", re.IGNORECASE | re.DOTALL)
_SPACES = re.compile(r"\s+")


class WebShopEnv:
    """WebShop's text mode over a product catalogue; one goal (variation) per episode.

    Variations are indices into the seeded, shuffled goal list: the first
    `n_test_goals` are `test_variations`, the rest `train_variations` (or, with
    ``split_by="product"``, whole products go to test until it holds
    `n_test_goals` goals).
    """

    task_name = "webshop"
    parallel_steps = False  # pure Python: threads would only contend for the GIL

    def __init__(
        self,
        *,
        products_path: str | Path | None = None,
        instructions_path: str | Path | None = None,
        human_goals_path: str | Path | None = None,
        goal_source: str = "synthetic",
        max_steps: int = 15,
        n_test_goals: int | None = None,
        split_by: str = "goal",
        seed: int = 0,
        num_products: int | None = None,
        show_attrs: bool = False,
        snap_actions: bool = False,
        query_words: bool = False,
        buy_first: bool = False,
    ):
        if goal_source not in ("synthetic", "human"):
            raise ValueError(f"webshop: goal_source must be 'synthetic' or 'human', not {goal_source!r}")
        if split_by not in ("goal", "product"):
            raise ValueError(f"webshop: split_by must be 'goal' or 'product', not {split_by!r}")
        self.max_steps = max_steps
        self.goal_source = goal_source
        self.seed = seed
        self.show_attrs = show_attrs
        self.query_words = query_words
        """List the goal instruction's words on the search page (`info["query_words"]`), the only words a
        constrained query may use, and describe the search action without a placeholder to copy."""
        self.buy_first = buy_first
        """List `click[buy now]` first on an item's page and say in a chat prompt's first turn what it does:
        the untrained 135M policy, choosing among admissible actions, otherwise buys almost never (its chance
        of choosing it on its first item page at temperature 1: 0.9% as the page reads, 6.5% listed first
        with the hint; `python benchmarks/webshop_buy_chance.py`)."""
        self.snap_actions = snap_actions
        self._load_products_and_goals(products_path, instructions_path, human_goals_path, num_products)
        self.test_variations, self.train_variations = split_variations(self.goals, n_test_goals, split_by)
        self.search_engine = ProductSearch(self.products)
        self._goal: dict | None = None
        self._done = True

    def _load_products_and_goals(
        self,
        products_path: str | Path | None,
        instructions_path: str | Path | None,
        human_goals_path: str | Path | None,
        num_products: int | None,
    ) -> None:
        """The catalogue, its prices and the shuffled goals (`goal_source`'s), from the files given or shipped."""
        products_file = data_path(products_path, DEFAULT_PRODUCTS)
        instructions_file = data_path(instructions_path, DEFAULT_INSTRUCTIONS)
        instructions = read_json_or_jsonl(instructions_file)
        self.products = load_products(products_file, instructions, num_products)
        self.product_by_asin = {p["asin"]: p for p in self.products}
        rng = random.Random(self.seed)
        self.prices = product_prices(self.products, rng)

        if self.goal_source == "synthetic":
            goals = synthetic_goals(self.products, instructions, self.prices, rng)
        else:
            if human_goals_path is None and (DATA_DIR / DEFAULT_HUMAN_GOALS).exists():
                human_goals_path = DATA_DIR / DEFAULT_HUMAN_GOALS
            human = read_json_or_jsonl(Path(human_goals_path)) if human_goals_path is not None else {}
            goals = human_goals(self.products, human, self.prices, rng)
        if not goals:
            raise ValueError(
                f"webshop: no {self.goal_source} goals for the {len(self.products)} products of {products_file} "
                f"(instructions: {instructions_file}, human goals: {human_goals_path})"
            )
        random.Random(self.seed).shuffle(goals)
        self.goals = goals

    # ------------------------------------------------------------------ pages

    def _results_window(self) -> list[str]:
        start = (self._page_num - 1) * PRODUCT_WINDOW
        return self._results[start : start + PRODUCT_WINDOW]

    def _clickables(self) -> dict[str, tuple[str, str | None]]:
        """Lower-cased button text -> (kind, argument) on the current page."""
        page = self._page
        buttons: dict[str, tuple[str, str | None]] = {}
        if page == "results":
            buttons[BACK_TO_SEARCH] = ("back", None)
            if self._page_num > 1:
                buttons[PREV_PAGE] = ("prev", None)
            if self._page_num * PRODUCT_WINDOW < len(self._results):
                buttons[NEXT_PAGE] = ("next", None)
            for asin in self._results_window():
                buttons[asin.lower()] = ("item", asin)
        elif page == "item":
            if self.buy_first:
                buttons[BUY_NOW] = ("buy", None)
            buttons[BACK_TO_SEARCH] = ("back", None)
            buttons[PREV_PAGE] = ("prev", None)
            for name, values in self._product["options"].items():
                for value in values:
                    buttons[_SPACES.sub(" ", value.lower()).strip()] = ("option", name + "\x00" + value)
            for sub in SUB_PAGES:
                if sub != "attributes" or self.show_attrs:
                    buttons[sub] = ("sub", sub)
            buttons.setdefault(BUY_NOW, ("buy", None))
        elif page == "sub":
            buttons[BACK_TO_SEARCH] = ("back", None)
            buttons[PREV_PAGE] = ("prev", None)
        return buttons

    def _snap(self, text: str, clickables: dict[str, tuple[str, str | None]]) -> str:
        """The valid click most similar to `text`; a product is matched by its ASIN and the title shown."""
        described = {}  # what the snapping compares -> the action it stands for
        for button, (kind, argument) in clickables.items():
            title = self.product_by_asin[argument]["Title"] if kind == "item" else ""
            described[f"click[{button}] {title}".strip()] = f"click[{button}]"
        return described[snap_action(text, list(described))]

    def _valid_actions(self) -> list[str]:
        if self._done:
            return []
        if self._page == "search":
            return [SEARCH_ACTION]
        return [f"click[{text}]" for text in self._clickables()]

    def _render(self) -> str:
        instruction = f"Instruction: [SEP] {self._goal['instruction_text']}"
        if self._page == "search":
            return f"WebShop [SEP] {instruction} [SEP] Search"
        parts = [instruction, "Back to Search"]
        if self._page == "results":
            parts.append(f"Page {self._page_num} (Total results: {len(self._results)})")
            if self._page_num > 1:
                parts.append("< Prev")
            if self._page_num * PRODUCT_WINDOW < len(self._results):
                parts.append("Next >")
            for asin in self._results_window():
                product = self.product_by_asin[asin]
                parts += [asin, product["Title"], product["Price"]]
            return " [SEP] ".join(parts)
        product = self._product
        parts.append("< Prev")
        if self._page == "item":
            clicked = [f"You have clicked {value}." for value in self._options.values()]
            for name, values in product["options"].items():
                parts += [name, *values]
            parts += [product["Title"], f"Price: {product['Price']}", f"Rating: {product['Rating']}"]
            parts += [sub.capitalize() for sub in SUB_PAGES if sub != "attributes" or self.show_attrs]
            parts.append("Buy Now")
            return " [SEP] ".join(clicked + parts)
        if self._sub == "description":
            parts.append(product["Description"] or "(no description)")
        elif self._sub == "features":
            parts += product["BulletPoints"] or ["(no features)"]
        elif self._sub == "reviews":
            for review in product["Reviews"]:
                parts += [review["title"], str(review["score"]), review["body"]]
            if not product["Reviews"]:
                parts.append("(no reviews)")
        else:
            parts += product["Attributes"]
        return " [SEP] ".join(parts)

    @property
    def _product(self) -> dict:
        return self.product_by_asin[self._asin]

    def _info(self, **extra) -> dict:
        return {
            "task_description": self._goal["instruction_text"],
            "valid_actions": self._valid_actions(),
            "state_text": self._state_text,
            "goal": copy.deepcopy(self._goal),
            "page": self._page,
            **({"query_words": instruction_words(self._goal["instruction_text"])}
               if self.query_words and self._page == "search" and not self._done else {}),
            **extra,
        }

    # ------------------------------------------------------------------- API

    @property
    def n_goals(self) -> int:
        return len(self.goals)

    @classmethod
    def from_config(cls, cfg, task: str = "webshop") -> "WebShopEnv":
        """WebShop as an `EMPO2Config` describes it: its goal source and data files (empty: the shipped data)."""
        paths = {name: os.path.expanduser(getattr(cfg, field)) for field, name in (
            ("webshop_products", "products_path"), ("webshop_instructions", "instructions_path"),
            ("webshop_human_goals", "human_goals_path")) if getattr(cfg, field)}
        # Small policies rarely write exact click[...] syntax; snap unparsable text to the
        # most similar admissible click, as free text is snapped in ScienceWorld.
        small_policy = cfg.webshop_query == "words"
        return cls(snap_actions=True, goal_source=cfg.webshop_goals, query_words=small_policy, buy_first=small_policy,
                   **({"max_steps": cfg.max_steps} if cfg.max_steps else {}), **paths)

    def first_turn_text(self, task_description: str, observation: str, info: dict) -> str:
        """The goal, the two action forms, the page, and the page's admissible actions."""
        search = ("search[...] with words of the task as the query" if self.query_words
                  else "search[your query]")
        buy = " click[buy now] on an item's page buys it and ends the task." if self.buy_first else ""
        return (
            f"Task: {task_description}\n"
            f"Actions: {search} on the search page, click[button] for a button shown in brackets.{buy}\n"
            f"Observation: {observation.strip()}\n"
            f"Admissible actions: {', '.join(info.get('valid_actions', []))}\n"
            "Your action:"
        )

    def next_turn_text(self, observation: str, info: dict, step: int, max_steps: int) -> str:
        return next_turn(observation, step, max_steps, f"Admissible actions: {', '.join(info.get('valid_actions', []))}\n")

    def reset(self, variation: int) -> tuple[str, dict]:
        n = len(self.goals)
        if isinstance(variation, bool) or not isinstance(variation, (int, np.integer)) or not 0 <= variation < n:
            raise ValueError(
                f"variation {variation!r} is not valid for webshop; allowed: 0..{n - 1} "
                f"({len(self.train_variations)} train, {len(self.test_variations)} test)"
            )
        self._variation = int(variation)
        self._goal = self.goals[self._variation]
        self._page = "search"
        self._keywords: str | None = None
        self._results: list[str] = []
        self._page_num = 1
        self._asin: str | None = None
        self._options: dict[str, str] = {}
        self._sub: str | None = None
        self._steps = 0
        self._score = 0.0
        self._done = False
        self._state_text = self._render()
        return self._state_text, self._info()

    def _parse(self, text: str) -> tuple[str, str] | None:
        match = _EXACT_ACTION.match(text) or _ANY_ACTION.search(text)
        if match is None:
            return None
        return match.group(1).lower(), _SPACES.sub(" ", match.group(2)).strip()

    def step(self, text: str) -> StepResult:
        if self._goal is None:
            raise RuntimeError("webshop: call reset() before step()")
        if self._done:
            raise RuntimeError("webshop: the episode is over; call reset()")
        self._steps += 1
        previous_score = self._score
        clickables = self._clickables()
        parsed = self._parse(text)
        if parsed is None and self.snap_actions:
            if self._page == "search":  # any text is a query there: search for it
                query = _SPACES.sub(" ", text).strip()[:200]
                parsed = ("search", query) if query else None
            else:
                parsed = self._parse(self._snap(text, clickables))
        extra: dict[str, Any] = {}
        error = None
        executed = None
        if parsed is None:
            error = "expected search[query] or click[button]."
        elif parsed[0] == "search":
            if self._page != "search":
                error = "search is only possible on the search page; click[back to search] first."
            elif not parsed[1]:
                error = "the search query is empty."
            else:
                executed = f"search[{parsed[1]}]"
                self._keywords = parsed[1]
                self._results = self.search_engine.search(parsed[1])
                self._page, self._page_num, self._asin, self._options = "results", 1, None, {}
        else:
            button = parsed[1].lower()
            if button not in clickables:
                error = f"there is no button {button!r} on this page."
            else:
                executed = f"click[{button}]"
                extra = self._click(*clickables[button])

        if error is not None:
            observation = f"Invalid action: {text.strip()!r}: {error} Valid actions: {', '.join(self._valid_actions())}"
        elif self._done:
            observation = extra.pop("observation")
        else:
            self._state_text = self._render()
            observation = self._state_text
        truncated = not self._done and self._steps >= self.max_steps
        if truncated:
            self._done = True
            extra["success"] = False
        return StepResult(
            observation=observation,
            reward=self._score - previous_score,
            score=self._score,
            done=self._done,
            truncated=truncated,
            info=self._info(raw_action=text, executed_action=executed, invalid=error is not None, **extra),
        )

    def _click(self, kind: str, argument: str | None) -> dict:
        if kind == "back":
            self._page, self._keywords, self._results = "search", None, []
            self._asin, self._options, self._sub = None, {}, None
        elif kind == "next":
            self._page_num += 1
        elif kind == "prev":
            if self._page == "results":
                self._page_num -= 1
            elif self._page == "item":
                self._page, self._asin, self._options = "results", None, {}
            else:
                self._page, self._sub = "item", None
        elif kind == "item":
            self._page, self._asin, self._options = "item", argument, {}
        elif kind == "option":
            name, value = argument.split("\x00", 1)
            self._options[name] = value
        elif kind == "sub":
            self._page, self._sub = "sub", argument
        elif kind == "buy":
            return self._buy()
        return {}

    def _buy(self) -> dict:
        product = self._product
        price = self.prices[self._asin]
        reward, breakdown = webshop_reward(self._goal, product, self._options, price)
        self._score = 100.0 * reward
        self._done = True
        self._page = "done"
        options = ", ".join(f"{k}: {v}" for k, v in self._options.items()) or "none"
        self._state_text = " [SEP] ".join(
            [
                "Thank you for shopping with us!",
                f"Purchased: {product['asin']}",
                product["Title"],
                f"Options: {options}",
                f"Price: ${price:.2f}",
                "Your score (min 0.0, max 1.0)",
                f"{reward:.4f}",
            ]
        )
        return {
            "observation": self._state_text,
            "reward_breakdown": breakdown,
            "webshop_reward": reward,
            "success": reward == 1.0,
            "purchased": {"asin": product["asin"], "options": dict(self._options), "price": price},
        }

    def close(self) -> None:
        self._goal = None
        self._done = True
