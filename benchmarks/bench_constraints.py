"""Benchmark: our action trie vs grammar libraries, per environment step, on real ScienceWorld states.

    python benchmarks/bench_constraints.py [--tasks power-component chemistry-mix find-animal]
                                      [--walk 20] [--keep 5] [--repeats 7]

Constrained decoding pays two costs per environment step, because the admissible
actions change at every step:
  build  - turn this state's valid-action list into a constraint
           (ours: `ActionEncoder.constraint`, with the action-token cache warm, as in
           training where actions repeat, and cold, a new encoder; a library: compile
           the alternation of the action strings and make a matcher: xgrammar EBNF
           `root ::= "a1" | "a2" | ...`, llguidance one Lark lexeme `ACTION: "a1" | ...`);
  walk   - at each token of the one sampled action, produce the allowed-token mask over
           the whole vocabulary and advance (ours: `allowed_mask([cursor.allowed()], V)`
           + `cursor.advance`; a library: fill its token bitmask + accept the token).
It plays a few random (non-`focus on`) steps in 2-3 ScienceWorld tasks, keeps the
largest valid-action lists seen, times both costs (median of repeats) for our trie
and for xgrammar and llguidance (whichever are installed: `pip install xgrammar
llguidance`; neither is a dependency of empo2), and prints per-list times and the
library/ours ratio for a whole step (build + one action of average length).
It also compares the allowed sets position by position on a few actions. They need
not be equal: our trie allows only each action's own tokenisation, a grammar allows
every token whose text continues an action string.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

import torch

from empo2.llm.constrained import ActionEncoder
from empo2.llm.generation import allowed_mask


def collect_action_lists(tasks: list[str], walk: int, keep: int, seed: int) -> list[list[str]]:
    """The `keep` largest distinct valid-action lists seen on random walks of `walk` steps per task.

    Half the steps move (`go to`, `open door`) when a move is listed, to see more rooms."""
    from empo2.envs import make_env

    rng = random.Random(seed)
    seen: dict[tuple[str, ...], str] = {}
    for task in tasks:
        env = make_env("scienceworld", task, max_steps=40, n_test_variations=1)
        try:
            _, info = env.reset(env.train_variations[0])
            seen[tuple(info["valid_actions"])] = task
            for _ in range(walk):
                choices = [a for a in info["valid_actions"] if not a.startswith("focus on")]
                moves = [a for a in choices if a.startswith(("go to", "open door"))]
                if moves and rng.random() < 0.5:  # explore rooms: more objects, longer lists
                    choices = moves
                result = env.step(rng.choice(choices))
                info = result.info
                seen[tuple(info["valid_actions"])] = task
                if result.done:
                    break
        finally:
            env.close()
    largest = sorted(seen, key=len, reverse=True)[:keep]
    return [list(actions) for actions in largest]


def median_ms(run, setup=lambda: None, repeats: int = 7) -> float:
    """Median wall time of `run(setup())` in milliseconds (setup is not timed)."""
    times = []
    for _ in range(repeats):
        state = setup()
        start = time.perf_counter()
        run(state)
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def bitmask_to_set(bitmask: torch.Tensor, vocab: int) -> set[int]:
    """(1, ceil(V/32)) int32 bitmask, bit i%32 of word i//32 = token i -> the set of allowed ids."""
    shifts = torch.arange(32, dtype=torch.int32)  # (32,)
    bits = (bitmask[0].unsqueeze(1) >> shifts) & 1  # (V/32, 32)
    return set(bits.flatten()[:vocab].nonzero().flatten().tolist())


class Library:
    """One grammar library behind two calls: `build(actions)` -> matcher, `walk(matcher, ids)`."""

    def __init__(self, name: str, version: str, setup_ms: float):
        self.name, self.version, self.setup_ms = name, version, setup_ms

    def build(self, actions: list[str]):
        raise NotImplementedError

    def walk(self, matcher, ids: list[int], sets: list | None = None) -> None:
        """Mask then accept each token of `ids`; with `sets`, append each position's allowed set."""
        raise NotImplementedError


class XGrammar(Library):
    def __init__(self, tokenizer, vocab: int, end_id: int, threads: int):
        import xgrammar as xgr

        start = time.perf_counter()
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab, stop_token_ids=[end_id])
        # No compile cache: each state's list is new (our constraint cache is off too).
        self.compiler = xgr.GrammarCompiler(info, max_threads=threads, cache_enabled=False)
        super().__init__("xgrammar", _version("xgrammar"), 1000 * (time.perf_counter() - start))
        self.xgr, self.vocab = xgr, vocab
        self.bitmask = xgr.allocate_token_bitmask(1, vocab)  # (1, V/32) int32

    def build(self, actions):
        ebnf = "root ::= " + " | ".join(json.dumps(a) for a in actions)
        return self.xgr.GrammarMatcher(self.compiler.compile_grammar(ebnf))

    def walk(self, matcher, ids, sets=None):
        for token in ids:
            matcher.fill_next_token_bitmask(self.bitmask)
            if sets is not None:
                sets.append(bitmask_to_set(self.bitmask, self.vocab))
            if not matcher.accept_token(token):
                raise RuntimeError(f"xgrammar rejected token {token}")


class LLGuidance(Library):
    def __init__(self, tokenizer, vocab: int, end_id: int, threads: int):
        import llguidance
        import llguidance.hf
        import llguidance.torch

        start = time.perf_counter()
        self.tokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab, eos_token=end_id)
        super().__init__("llguidance", _version("llguidance"), 1000 * (time.perf_counter() - start))
        self.llg, self.vocab = llguidance, vocab
        self.bitmask = llguidance.torch.allocate_token_bitmask(1, vocab)  # (1, V/32) int32

    def build(self, actions):
        # One lexeme (terminal) of alternatives, matched by the lexer. The parser-rule form,
        # grammar_from("choice", actions), stops at the default 2000 items per Earley row
        # ("ParserTooComplex" on a 2738-action list) and is slower with the limit raised.
        lark = "start: ACTION\nACTION: " + " | ".join(json.dumps(a) for a in actions)
        matcher = self.llg.LLMatcher(self.tokenizer, self.llg.grammar_from("lark", lark))
        if matcher.is_error():
            raise RuntimeError(f"llguidance: {matcher.get_error()}")
        return matcher

    def walk(self, matcher, ids, sets=None):
        for token in ids:
            self.llg.torch.fill_next_token_bitmask(matcher, self.bitmask, 0)
            if sets is not None:
                sets.append(bitmask_to_set(self.bitmask, self.vocab))
            if not matcher.consume_token(token):
                raise RuntimeError(f"llguidance rejected token {token}: {matcher.get_error()}")


def _version(package: str) -> str:
    from importlib.metadata import version

    return version(package)


def load_libraries(tokenizer, vocab: int, end_id: int, threads: int) -> list[Library]:
    libraries = []
    for cls, pip_name in ((XGrammar, "xgrammar"), (LLGuidance, "llguidance")):
        try:
            libraries.append(cls(tokenizer, vocab, end_id, threads))
        except ImportError as error:
            print(f"{pip_name}: not installed ({error}); `pip install {pip_name}` to measure it")
    return libraries


def our_walk(constraint, ids: list[int], vocab: int, sets: list | None = None) -> None:
    cursor = constraint.cursor()
    for token in ids:
        allowed = cursor.allowed()
        mask = allowed_mask([allowed], vocab)  # (1, V) additive: 0 allowed, -inf not
        if sets is not None:
            sets.append(set(allowed))
        cursor.advance(token)
    assert cursor.done and mask.shape == (1, vocab)


def compare_allowed_sets(lib, constraint, actions, sampled, tokenizer, count: list[int], examples: dict) -> None:
    """Walk each sampled action through our constraint and the library's matcher, counting positions where the
    allowed token sets are equal and where ours is a subset (`count`: equal, subset, positions); the first
    difference per library goes into `examples`."""
    vocab = len(tokenizer)
    for ids in sampled:
        ours_sets, lib_sets = [], []
        our_walk(constraint, ids, vocab, ours_sets)
        lib.walk(lib.build(actions), ids, lib_sets)
        for position, (a, b) in enumerate(zip(ours_sets, lib_sets)):
            count[0] += a == b
            count[1] += a <= b
            count[2] += 1
            if a != b and lib.name not in examples:
                text = tokenizer.decode(ids[:position])
                extra = sorted(b - a)[:4]
                examples[lib.name] = (f"after {text!r}: ours {len(a)} tokens, {lib.name} {len(b)} "
                                      f"(also e.g. {tokenizer.convert_ids_to_tokens(extra)})"
                                      + (f", ours not in it: {sorted(a - b)}" if a - b else ""))


def print_summary(ratios: dict[str, list[float]], agreement: dict[str, list[int]], examples: dict[str, str]) -> None:
    """The allowed-set agreement per library and the verdict: who is cheaper per step (geometric mean)."""
    print("\nms per state-list build and per token (mask over the vocab + advance); step ratio = library "
          "(build + avg-length action) / ours, with our token cache warm / cold")
    for name, (equal, subset, total) in agreement.items():
        print(f"allowed sets vs {name}: equal at {equal}/{total} positions, ours a subset at {subset}/{total}"
              + (f"; first difference {examples[name]}" if name in examples else ""))
    verdicts = []
    for name, values in ratios.items():
        geomean = statistics.geometric_mean(values)
        who = "our trie" if geomean > 1 else name
        verdicts.append(f"{who} is {max(geomean, 1 / geomean):.1f}x cheaper per step than "
                        f"{'ours' if geomean <= 1 else name} (geomean; {min(values):.1f}-{max(values):.1f}x)")
    print("verdict: " + "; ".join(verdicts) + " (our token cache warm)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", nargs="+", default=["power-component", "chemistry-mix", "find-animal"])
    parser.add_argument("--walk", type=int, default=20, help="random steps per task")
    parser.add_argument("--keep", type=int, default=5, help="how many of the largest action lists to time")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--actions", type=int, default=8, help="sampled actions walked per list")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2, help="torch threads (the machines have 2 cores)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from empo2.llm.models import load_tokenizer

    tokenizer = load_tokenizer()
    vocab = len(tokenizer)
    end_id = ActionEncoder(tokenizer).end_id
    libraries = load_libraries(tokenizer, vocab, end_id, args.threads)
    if not libraries:
        print("no grammar library installed: only our trie would be timed, nothing to compare; stopping")
        return
    for lib in libraries:
        print(f"{lib.name} {lib.version}: tokenizer set-up {lib.setup_ms:.0f} ms (once per tokenizer)")

    start = time.perf_counter()
    lists = collect_action_lists(args.tasks, args.walk, args.keep, args.seed)
    print(f"collected {len(lists)} valid-action lists from {', '.join(args.tasks)} "
          f"in {time.perf_counter() - start:.0f} s; vocab {vocab}, end token {end_id}, "
          f"torch threads {torch.get_num_threads()}, median of {args.repeats}\n")

    rng = random.Random(args.seed)
    header = f"{'actions':>7} {'tok/act':>7} {'ours build warm/cold':>21} {'ours/tok':>8}"
    for lib in libraries:
        header += f" | {lib.name + ' build':>16} {'/tok':>6} {'step ratio w/c':>15}"
    print(header + "\n" + "-" * len(header))
    ratios: dict[str, list[float]] = {lib.name: [] for lib in libraries}  # step ratio vs ours warm
    agreement = {lib.name: [0, 0, 0] for lib in libraries}  # equal, ours ⊆ lib, positions
    examples: dict[str, str] = {}
    for actions in lists:
        warm = ActionEncoder(tokenizer, constraint_cache=0)  # no constraint cache: every build is real
        ids_of = dict(zip(actions, warm.encode(actions)))  # warms the token cache
        mean_len = statistics.mean(len(ids) + 1 for ids in ids_of.values())  # + end-of-turn token
        sampled = [list(ids_of[a]) + [end_id] for a in rng.sample(actions, min(args.actions, len(actions)))]
        n_walked = sum(len(ids) for ids in sampled)

        ours_warm = median_ms(lambda _: warm.constraint(actions), repeats=args.repeats)
        ours_cold = median_ms(lambda _: ActionEncoder(tokenizer, constraint_cache=0).constraint(actions),
                              repeats=args.repeats)
        constraint = warm.constraint(actions)
        ours_tok = median_ms(lambda _: [our_walk(constraint, ids, vocab) for ids in sampled],
                             repeats=args.repeats) / n_walked
        ours_step_warm = ours_warm + mean_len * ours_tok
        ours_step_cold = ours_cold + mean_len * ours_tok
        row = f"{len(actions):>7} {mean_len:>7.1f} {ours_warm:>10.2f} /{ours_cold:>9.2f} {ours_tok:>8.3f}"
        for lib in libraries:
            build = median_ms(lambda _: lib.build(actions), repeats=args.repeats)
            per_tok = median_ms(lambda matchers: [lib.walk(m, ids) for m, ids in zip(matchers, sampled)],
                                setup=lambda: [lib.build(actions) for _ in sampled],
                                repeats=args.repeats) / n_walked
            step = build + mean_len * per_tok
            ratios[lib.name].append(step / ours_step_warm)
            row += (f" | {build:>16.2f} {per_tok:>6.3f} "
                    f"{step / ours_step_warm:>7.1f} /{step / ours_step_cold:>6.1f}")
            compare_allowed_sets(lib, constraint, actions, sampled[:4], tokenizer, agreement[lib.name], examples)
        print(row)

    print_summary(ratios, agreement, examples)
    fill = median_ms(lambda _: torch.full((1, vocab), float("-inf")), repeats=51)  # (1, V), a few µs when quiet
    if fill > 0.5:
        print(f"note: a (1, {vocab}) torch.full took {fill:.1f} ms: another process holds a core and "
              f"{torch.get_num_threads()} torch threads wait for a time slice; timings are inflated, rerun "
              f"on a quiet machine or with --threads 1")


if __name__ == "__main__":
    main()
