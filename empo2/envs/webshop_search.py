"""WebShop's search engine: BM25 over the products' indexed text, with a plural-only stemmer."""

from __future__ import annotations

import bm25s
import numpy as np
from bm25s.stopwords import STOPWORDS_EN

SEARCH_RETURN_N = 50
"""Products a search returns (WebShop's SEARCH_RETURN_N)."""


def _plural_stem(tokens: list[str]) -> list[str]:
    """Plural-only stemmer: Harman's S-stemmer ('ies' -> 'y', 'es' -> 'e', 's' -> '', not
    after 'ss', 'us', 'is'), with '-es' dropped after a sibilant ('dresses' -> 'dress')."""
    stems = []
    for token in tokens:
        if len(token) > 4 and token.endswith(("sses", "xes", "zes", "ches", "shes")):
            token = token[:-2]
        elif len(token) > 3 and token.endswith("ies") and not token.endswith(("eies", "aies")):
            token = token[:-3] + "y"
        elif len(token) > 3 and token.endswith("es") and not token.endswith(("aes", "ees", "oes")):
            token = token[:-1]
        elif len(token) > 3 and token.endswith("s") and not token.endswith(("us", "ss", "is")):
            token = token[:-1]
        stems.append(token)
    return stems


class ProductSearch:
    """BM25 (bm25s, Lucene variant) over the products' indexed ``contents``."""

    def __init__(self, products: list[dict], k1: float = 0.9, b: float = 0.4):
        self.asins = [p["asin"] for p in products]
        corpus = self._tokenize([p["contents"] for p in products])
        self.retriever = bm25s.BM25(k1=k1, b=b, method="lucene")
        self.retriever.index(corpus, show_progress=False)

    @staticmethod
    def _tokenize(texts: list[str]) -> list[list[str]]:
        return bm25s.tokenize(
            texts, stopwords=list(STOPWORDS_EN), stemmer=_plural_stem, return_ids=False, show_progress=False
        )

    def search(self, query: str, k: int = SEARCH_RETURN_N) -> list[str]:
        """ASINs of the products matching `query`, best first (ties by catalogue order)."""
        tokens = self._tokenize([query.lower()])[0]
        tokens = [t for t in tokens if t in self.retriever.vocab_dict]
        if not tokens:
            return []
        scores = np.asarray(self.retriever.get_scores(tokens), dtype=np.float64)
        order = np.argsort(-scores, kind="stable")
        return [self.asins[i] for i in order[:k] if scores[i] > 0]
