"""WebShop text environment: pages, actions, goals, split, loader and reward."""

from __future__ import annotations

from pathlib import Path

import pytest

from empo2.envs import make_env
from empo2.envs.webshop import WebShopEnv
from empo2.envs.webshop_data import DATA_DIR, load_products
from empo2.envs.webshop_reward import normalize_color, title_words, token_set_ratio, webshop_reward

FIXTURES = Path(__file__).parent / "data"
MINI_PRODUCTS = FIXTURES / "webshop_items_shuffle_mini.json"
MINI_INSTRUCTIONS = FIXTURES / "webshop_items_ins_v2_mini.json"
MINI_HUMAN = FIXTURES / "webshop_items_human_ins_mini.json"


@pytest.fixture(scope="module")
def env():
    return WebShopEnv()


@pytest.fixture(scope="module")
def mini():
    return WebShopEnv(products_path=MINI_PRODUCTS, instructions_path=MINI_INSTRUCTIONS, n_test_goals=3)


def _open_target(env: WebShopEnv, variation: int):
    """Search with the goal instruction, page through the results, open the target."""
    _, info = env.reset(variation)
    goal = info["goal"]
    result = env.step(f"search[{info['task_description']}]")
    target = f"click[{goal['asin'].lower()}]"
    while target not in result.info["valid_actions"]:
        assert "click[next >]" in result.info["valid_actions"], "target product not found by the search"
        result = env.step("click[next >]")
    return goal, env.step(target)


def _buy_goal(env: WebShopEnv, variation: int):
    goal, result = _open_target(env, variation)
    assert result.info["page"] == "item"
    options = goal["goal_options"]
    for value in options.values() if isinstance(options, dict) else options:
        result = env.step(f"click[{value}]")
        assert not result.info["invalid"]
    return goal, env.step("click[buy now]")


def _product_clicks(actions: list[str]) -> list[str]:
    return [a for a in actions if a.startswith("click[b0")]


# ------------------------------------------------------------------ episodes


def test_defaults_goals_and_split(env):
    assert (DATA_DIR / "products_100.jsonl").exists() and (DATA_DIR / "LICENSE").exists()
    assert env.task_name == "webshop" and env.max_steps == 15
    assert len(env.products) == 100
    assert env.n_goals == 501
    assert len(env.test_variations) == 100 and len(env.train_variations) == 401
    assert isinstance(make_env("webshop", products_path=MINI_PRODUCTS, instructions_path=MINI_INSTRUCTIONS), WebShopEnv)


def test_reset_info(env):
    observation, info = env.reset(env.train_variations[0])
    goal = info["goal"]
    assert observation.startswith("WebShop [SEP] Instruction: [SEP] ")
    assert info["task_description"] == goal["instruction_text"] and goal["instruction_text"] in observation
    assert info["valid_actions"] == ["search[...]"]
    assert info["state_text"] == observation
    assert {"asin", "attributes", "goal_options", "price_upper", "query", "product_category"} <= set(goal)
    assert goal["price_upper"] > env.prices[goal["asin"]]


@pytest.mark.parametrize("which", [0, 1, 2, 3])
def test_scripted_purchase_of_the_goal_gets_reward_one(env, which):
    with_options = [v for v in env.test_variations if env.goals[v]["goal_options"]]
    variation = (with_options[:2] + env.train_variations[:2])[which]
    goal, result = _buy_goal(env, variation)
    assert result.done and not result.truncated
    assert result.info["webshop_reward"] == 1.0 and result.info["success"] is True
    assert result.score == 100.0 and result.reward == 100.0
    breakdown = result.info["reward_breakdown"]
    assert breakdown["reward"] == 1.0 and breakdown["r_type"] == 1.0 and breakdown["r_price"] is True
    assert breakdown["num_attr_matches"] == len(goal["attributes"])
    assert breakdown["num_option_matches"] == len(goal["goal_options"])
    assert result.observation.startswith("Thank you for shopping with us!")
    assert result.info["valid_actions"] == []
    with pytest.raises(RuntimeError):
        env.step("click[buy now]")


def test_results_page_lists_asin_title_price(env):
    _, info = env.reset(env.train_variations[0])
    result = env.step(f"search[{info['task_description']}]")
    assert len(env._results) == 50  # WebShop returns the top 50
    product = env.product_by_asin[env._results[0]]
    assert f"{product['asin']} [SEP] {product['Title']} [SEP] {product['Price']}" in result.observation
    assert "Page 1 (Total results: " in result.observation
    assert result.info["valid_actions"][:2] == ["click[back to search]", "click[next >]"]
    assert len(_product_clicks(result.info["valid_actions"])) == 10


def test_pagination_next_prev_and_back_to_search(env):
    _, info = env.reset(env.train_variations[0])
    first = env.step(f"search[{info['task_description']}]")
    assert "click[< prev]" not in first.info["valid_actions"]
    page1 = _product_clicks(first.info["valid_actions"])
    second = env.step("click[next >]")
    assert "Page 2 (Total results: 50)" in second.observation
    assert "click[< prev]" in second.info["valid_actions"]
    page2 = _product_clicks(second.info["valid_actions"])
    assert len(page2) == 10 and not set(page1) & set(page2)
    back = env.step("click[< prev]")
    assert back.observation == first.observation and back.info["valid_actions"] == first.info["valid_actions"]
    for _ in range(4):
        last = env.step("click[next >]")
    assert "Page 5 (Total results: 50)" in last.observation and "click[next >]" not in last.info["valid_actions"]
    home = env.step("click[back to search]")
    assert home.info["valid_actions"] == ["search[...]"] and home.observation.startswith("WebShop [SEP]")


def test_item_options_sub_pages_and_back(env):
    variation = next(v for v in env.train_variations if len(env.goals[v]["goal_options"]) >= 2)
    goal, item = _open_target(env, variation)
    product = env.product_by_asin[goal["asin"]]
    actions = item.info["valid_actions"]
    for button in ("back to search", "< prev", "description", "features", "reviews", "buy now"):
        assert f"click[{button}]" in actions
    assert "click[attributes]" not in actions  # WebShop hides it unless show_attrs
    assert f"Price: {product['Price']}" in item.observation and product["Title"] in item.observation
    name, value = next(iter(goal["goal_options"].items()))
    clicked = env.step(f"click[{value}]")
    assert f"You have clicked {value}." in clicked.observation and env._options == {name: value}

    description = env.step("click[description]")
    assert description.info["page"] == "sub"
    assert description.info["valid_actions"] == ["click[back to search]", "click[< prev]"]
    assert (product["Description"] or "(no description)") in description.observation
    again = env.step("click[< prev]")
    assert again.observation == clicked.observation  # back on the item, option kept
    features = env.step("click[features]")
    assert product["BulletPoints"][0].strip() in features.observation
    env.step("click[< prev]")
    assert "(no reviews)" in env.step("click[reviews]").observation
    env.step("click[< prev]")
    results = env.step("click[< prev]")  # item -> results page
    assert results.info["page"] == "results" and f"click[{goal['asin'].lower()}]" in results.info["valid_actions"]


def test_attributes_sub_page_with_show_attrs():
    shop = WebShopEnv(products_path=MINI_PRODUCTS, instructions_path=MINI_INSTRUCTIONS, show_attrs=True)
    shop.reset(0)
    shop.step("search[soy candle]")
    item = shop.step("click[b000000004]")
    assert "click[attributes]" in item.info["valid_actions"] and "Attributes" in item.observation
    page = shop.step("click[attributes]")
    assert page.observation.endswith("soy wax [SEP] lavender")
    reviews_item = (shop.step("click[back to search]"), shop.step("search[cotton t-shirt]"))[1]
    assert "click[b000000003]" in reviews_item.info["valid_actions"]
    shop.step("click[b000000003]")
    reviews = shop.step("click[reviews]")
    assert "Great fit [SEP] 5 [SEP] Soft and true to size." in reviews.observation


@pytest.mark.parametrize(
    "setup, action, reason",
    [
        ([], "click[buy now]", "no button 'buy now'"),
        ([], "search[]", "query is empty"),
        ([], "buy the cheapest one", "expected search[query] or click[button]"),
        (["search[shirt]"], "search[dress]", "only possible on the search page"),
        (["search[shirt]"], "click[b000000000]", "no button 'b000000000'"),
        (["search[shirt]"], "click[< prev]", "no button '< prev'"),
    ],
)
def test_invalid_actions_use_a_step_and_change_nothing(env, setup, action, reason):
    env.reset(env.train_variations[0])
    page = None
    for step in setup:
        page = env.step(step)
    before = env._state_text
    result = env.step(action)
    assert result.observation.startswith("Invalid action: ") and reason in result.observation
    assert result.info["invalid"] is True and result.info["executed_action"] is None
    assert result.reward == 0.0 and result.score == 0.0 and not result.done
    assert result.info["state_text"] == before
    assert env._steps == len(setup) + 1
    if page is not None:
        assert result.info["valid_actions"] == page.info["valid_actions"]


def test_actions_are_found_in_surrounding_text_and_case(env):
    env.reset(env.train_variations[0])
    result = env.step("Thought: look for shirts.\nAction: Search[Shirt]")
    assert result.info["executed_action"] == "search[Shirt]" and result.info["page"] == "results"
    asin = env._results[0]
    assert env.step(f"click[{asin}]").info["page"] == "item"  # upper-case ASIN accepted


def test_snap_actions_option():
    shop = WebShopEnv(products_path=MINI_PRODUCTS, instructions_path=MINI_INSTRUCTIONS, snap_actions=True)
    shop.reset(0)
    shop.step("search[soy candle]")
    shop.step("click[b000000004]")
    assert shop.step("buy now").info["executed_action"] == "click[buy now]"


def test_step_limit_truncates_with_zero_reward():
    shop = WebShopEnv(products_path=MINI_PRODUCTS, instructions_path=MINI_INSTRUCTIONS, max_steps=3)
    shop.reset(0)
    first = shop.step("search[protein]")
    second = shop.step("not an action")
    assert not first.done and not second.done
    last = shop.step("click[back to search]")
    assert last.done and last.truncated and last.reward == 0.0 and last.score == 0.0
    assert last.info["success"] is False and last.info["valid_actions"] == []
    with pytest.raises(RuntimeError):
        shop.step("search[protein]")


def test_buying_on_the_last_step_is_not_truncated():
    shop = WebShopEnv(products_path=MINI_PRODUCTS, instructions_path=MINI_INSTRUCTIONS, max_steps=3)
    variation = next(i for i, g in enumerate(shop.goals) if g["asin"] == "B000000004")
    shop.reset(variation)
    shop.step("search[soy wax candle]")
    shop.step("click[b000000004]")
    result = shop.step("click[buy now]")
    assert result.done and not result.truncated and result.info["success"] is True


def test_bad_variation(env):
    for bad in (-1, 501, 10_000, "3", 1.0, True):
        with pytest.raises(ValueError, match=r"allowed: 0\.\.500"):
            env.reset(bad)


def test_split_fixed_disjoint_and_seeded(env):
    again = WebShopEnv()
    assert again.test_variations == env.test_variations and again.train_variations == env.train_variations
    assert [g["instruction_text"] for g in again.goals] == [g["instruction_text"] for g in env.goals]
    assert not set(env.train_variations) & set(env.test_variations)
    assert sorted(env.train_variations + env.test_variations) == list(range(env.n_goals))
    other = WebShopEnv(seed=1)
    assert [g["instruction_text"] for g in other.goals] != [g["instruction_text"] for g in env.goals]
    by_product = WebShopEnv(split_by="product")
    train_asins = {by_product.goals[i]["asin"] for i in by_product.train_variations}
    test_asins = {by_product.goals[i]["asin"] for i in by_product.test_variations}
    assert not train_asins & test_asins and len(by_product.test_variations) >= 100


# -------------------------------------------------------------------- loader


def test_official_format_loader():
    instructions = {"B000000001": {"attributes": ["gluten free", "plant based", "dairy free"]}}
    products = load_products(MINI_PRODUCTS, instructions)
    by_asin = {p["asin"]: p for p in products}
    assert list(by_asin) == ["B000000001", "B000000002", "B000000003", "B000000004", "B000000005"]
    p1, p2, p3, p4, p5 = products
    assert p1["Title"] == p1["name"] == "Organic Vanilla Protein Powder, Gluten Free Plant Based Shake"
    assert p1["query"] == "protein powders"
    assert p1["options"] == {"flavor name": ["vanilla", "chocolate"], "size": ["1 pound", "2 pound"]}
    assert p1["pricing"] == [24.99] and p1["Price"] == "$24.99"
    assert p1["Attributes"] == ["gluten free", "plant based", "dairy free"]
    assert p2["pricing"] == [30.0, 40.0] and p2["Price"] == "$30.0 to $40.0"
    assert p2["BulletPoints"] == ["High protein whey isolate"]
    assert p2["Attributes"] == ["DUMMY_ATTR"]  # not in the instructions given
    assert p3["options"]["color"] == ["navy | white", "heather grey"]
    assert p3["Reviews"] == [{"title": "Great fit", "score": 5, "body": "Soft and true to size."}]
    assert p4["pricing"] == [100.0] and p4["options"] == {} and p4["Rating"] == "N.A."
    assert p5["pricing"] == [1299.0] and p5["Description"] == ""
    assert p1["contents"].startswith("organic vanilla protein powder, gluten free plant based shake a smooth")
    assert p1["contents"].endswith("flavor name: vanilla, chocolate, and size: 1 pound, 2 pound")
    assert len(load_products(MINI_PRODUCTS, num_products=2)) == 2


def test_mini_catalogue_synthetic_goals(mini):
    assert len(mini.goals) == 4 + 4 + 1  # 2 flavours x 2 sizes, 2 colours x 2 sizes, no options
    assert len(mini.test_variations) == 3 and len(mini.train_variations) == 6
    goal = next(g for g in mini.goals if g["goal_options"] == {"flavor name": "vanilla", "size": "2 pound"})
    upper = goal["price_upper"]
    assert upper in (40.0, 50.0, 60.0)  # the larger of 2 drawn from $30, $40, $50, $60 (price $24.99)
    assert goal["instruction_text"] == (
        "i need a gluten free plant based protein powder with flavor name: vanilla, and size: 2 pound, "
        f"and price lower than {upper:.2f} dollars"
    )
    assert goal["attributes"] == ["gluten free", "plant based"]
    assert goal["name"] == "Organic Vanilla Protein Powder, Gluten Free Plant Based Shake"
    assert {g["asin"] for g in mini.goals} == {"B000000001", "B000000003", "B000000004"}


def test_mini_catalogue_human_goals():
    shop = WebShopEnv(
        products_path=MINI_PRODUCTS, instructions_path=MINI_INSTRUCTIONS,
        human_goals_path=MINI_HUMAN, goal_source="human",
    )
    assert len(shop.goals) == 2  # the instruction without attributes is skipped
    goal = next(g for g in shop.goals if g["asin"] == "B000000001")
    assert goal["goal_options"] == ["vanilla"] and goal["attributes"] == ["gluten free"]
    assert goal["instruction_text"].startswith("i am looking for a gluten free vanilla protein powder, and price")
    variation = shop.goals.index(goal)
    _, result = _buy_goal(shop, variation)
    assert result.info["success"] is True


def test_missing_goals_and_files_give_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        WebShopEnv(products_path=tmp_path / "nope.json")
    with pytest.raises(ValueError, match="no human goals"):
        WebShopEnv(products_path=MINI_PRODUCTS, instructions_path=MINI_INSTRUCTIONS, goal_source="human")


# -------------------------------------------------------------------- reward


def test_wrong_product_reward_hand_computed(mini):
    variation = next(
        i for i, g in enumerate(mini.goals) if g["goal_options"] == {"flavor name": "vanilla", "size": "2 pound"}
    )
    mini.reset(variation)
    mini.step("search[whey protein]")
    mini.step("click[b000000002]")  # the whey powder, not the goal's plant protein
    mini.step("click[2 pound]")
    result = mini.step("click[buy now]")
    b = result.info["reward_breakdown"]
    # attributes: "gluten free", "plant based" are neither near the whey powder's attributes
    #   ("high protein", "muscle gain": no common token, token-set ratios < 85) nor in its
    #   title / bullet points / description                                   -> 0 of 2
    assert b["attribute_matches"] == {"gluten free": False, "plant based": False}
    # options: size "2 pound" is exactly a goal value; no flavour was picked    -> 1 of 2
    assert b["option_matches"] == {"size": True} and b["num_option_matches"] == 1
    # price: drawn in [$30, $40], the goal's bound is $40, $50 or $60           -> 1
    assert 30.0 <= b["price"] <= 40.0 and b["r_price"] is True
    # type: same query "protein powders"; title words of the goal
    #   {organic, vanilla, protein, powder, gluten, free, plant, based, shake} share
    #   {protein, powder} with the whey powder's: 2/9 = 0.222 > 0.2             -> r_type 1
    assert b["query_match"] and b["category_match"] and b["title_score"] == pytest.approx(2 / 9)
    assert b["r_type"] == 1.0
    # reward = 1.0 * (0 + 1 + 1) / (2 attributes + 2 options + 1) = 2/5 = 0.4
    assert result.info["webshop_reward"] == pytest.approx(0.4)
    assert result.score == pytest.approx(40.0) and result.reward == pytest.approx(40.0)
    assert result.info["success"] is False


def _goal(**kw):
    goal = {
        "attributes": ["soy wax"], "goal_options": {}, "price_upper": 50.0, "query": "candles",
        "product_category": "Home › Decor › Candles", "name": "alpha bravo charlie delta echo foxtrot golf hotel india juliet",
    }
    return {**goal, **kw}


def _product(name, **kw):
    product = {
        "name": name, "Title": name, "Attributes": ["soy wax candle"], "BulletPoints": [], "Description": "",
        "query": "lamps", "product_category": "Tools › Lighting › Lamps",
    }
    return {**product, **kw}


@pytest.mark.parametrize(
    "name, title_score, r_type",
    [
        ("juliet kilo lima mike", 1 / 10, 0.5),  # no query / category match, title 0.1 (not > 0.2)
        ("charlie delta echo", 3 / 10, 1.0),  # title 0.3 > 0.2
        ("zulu", 0.0, 0.0),  # nothing in common
    ],
)
def test_type_factor(name, title_score, r_type):
    reward, b = webshop_reward(_goal(), _product(name), {}, 20.0)
    assert b["title_score"] == pytest.approx(title_score) and b["r_type"] == r_type
    # attribute "soy wax" vs "soy wax candle": one token set contains the other -> ratio 100 -> 1 of 1
    # price 20 <= 50 -> 1; no goal options.   reward = r_type * (1 + 0 + 1) / (1 + 0 + 1)
    assert reward == pytest.approx(r_type * 2 / 2)


def test_type_factor_low_title_score():
    goal = _goal(name=" ".join(f"w{c}ord" for c in "abcdefghijk"))  # 11 words
    reward, b = webshop_reward(goal, _product("wbord other"), {}, 60.0)
    assert b["title_score"] == pytest.approx(1 / 11) and b["r_type"] == 0.1
    assert b["r_price"] is False  # 60 > 50
    assert reward == pytest.approx(0.1 * (1 + 0 + 0) / 2)


def test_option_and_attribute_matching_rules():
    goal = _goal(
        attributes=["gluten free", "high protein"], goal_options={"color": "black", "size": "large"},
        query="lamps", name="lamp",
    )
    product = _product("lamp", Attributes=["gluten-free"], BulletPoints=["Very HIGH PROTEIN snack"])
    # "plain black" -> base colour "black" matches; size needs an exact value: "x-large" != "large"
    reward, b = webshop_reward(goal, product, {"color": "plain black", "size": "x-large"}, 10.0)
    assert b["attribute_matches"] == {"gluten free": True, "high protein": True}  # fuzzy; text
    assert b["option_matches"] == {"color": True, "size": False}
    assert reward == pytest.approx((2 + 1 + 1) / (2 + 2 + 1))
    # options beyond the goal's count cannot push the reward above 1
    many = {"color": "black", "size": "large", "style": "black"}
    full, b = webshop_reward(goal, product, many, 10.0)
    assert full == 1.0 and b["num_option_matches"] == 2


def test_fuzzy_helpers():
    assert token_set_ratio("fuzzy was a bear", "fuzzy fuzzy was a bear") == 100
    # common "chocolate"; max(2*9/(9+14), 2*11/(14+14)) = max(78.3, 78.6) -> 79
    assert token_set_ratio("dark chocolate", "milk chocolate") == 79
    assert token_set_ratio("", "anything") == 0
    assert normalize_color("light blue") == "blue" and normalize_color("2 pound") == "2 pound"
    assert title_words("Men's Cotton Crew-Neck T-Shirt, 2 Pack") == ["men", "cotton", "crew", "neck", "shirt", "pack"]


def test_config_fields_point_the_trainer_at_official_files():
    from empo2.config import EMPO2Config
    from empo2.envs import env_from_config

    cfg = EMPO2Config.from_profile("ci", env="webshop", webshop_products=str(MINI_PRODUCTS),
                                   webshop_instructions=str(MINI_INSTRUCTIONS), webshop_goals="human",
                                   webshop_human_goals=str(MINI_HUMAN))
    env = env_from_config(cfg)
    assert env.goal_source == "human" and len(env.products) == 5 and env.max_steps == cfg.max_steps
    assert env.snap_actions
    with pytest.raises(ValueError, match="webshop_products: .* is not a file"):
        EMPO2Config.from_profile("ci", env="webshop", webshop_products="/no/such/items_shuffle.json")
    with pytest.raises(ValueError, match="webshop_goals: 'crowd' is not allowed; choose one of synthetic, human"):
        EMPO2Config.from_profile("ci", env="webshop", webshop_goals="crowd")


def test_scripted_reference_buys_the_goal_product_on_the_mini_catalogue(mini):
    from empo2.envs.webshop_shopper import scripted_reference

    rows = scripted_reference(mini, range(len(mini.goals)))
    assert len(rows) == len(mini.goals)
    assert all(0 <= row["score"] <= 100 for row in rows)
    assert any(row["success"] for row in rows)  # the first result is often the target there
