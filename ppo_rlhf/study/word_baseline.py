"""A yardstick for the proxy reward model: how well do word counts alone rank the same held-out pairs?

A logistic regression on the difference of the two replies' bag-of-words vectors (each word present or not), trained
on the reward model's own training pairs, at 1/8, 1/4, 1/2 and all of them. The offline gold judge is itself made of
word-level classifiers (VADER's lexicon, profanity-check's linear model on word counts), so this baseline says how
much of the labels' signal a few thousand pairs carry: a reward model near it, with its curve still rising, is
limited by the number of pairs rather than by its backbone. Seconds on a CPU; scikit-learn comes with
profanity-check.
"""

from __future__ import annotations

import random

# The learning curve's points, as fractions of the training pairs (during the reward model's first pass, and here);
# all pairs are always measured too.
CURVE_FRACTIONS = (0.125, 0.25, 0.5)


def word_baseline(train: list[dict], heldout: list[dict], seed: int = 0) -> list[dict]:
    """[{"pairs": n, "accuracy": held-out accuracy}] for the first n of the shuffled training pairs."""
    return [{"pairs": n, "accuracy": float((margins > 0).mean())}
            for n, margins in word_margins(train, heldout, seed).items()]


def word_margins(train: list[dict], heldout: list[dict], seed: int = 0) -> dict:
    """{n: decision value of every held-out pair (> 0: the chosen reply preferred), as a numpy array} of the model
    trained on the first n of the shuffled training pairs, n at CURVE_FRACTIONS of them and all."""
    import numpy as np  # lazy: only the demo's report stage needs scikit-learn
    from scipy import sparse
    from sklearn.feature_extraction.text import CountVectorizer
    from sklearn.linear_model import LogisticRegression

    order = list(range(len(train)))
    random.Random(seed).shuffle(order)
    vectorizer = CountVectorizer(binary=True).fit([p[side] for p in train for side in ("chosen", "rejected")])

    def differences(pairs: list[dict]):
        return vectorizer.transform([p["chosen"] for p in pairs]) - vectorizer.transform([p["rejected"] for p in pairs])

    heldout_x = differences(heldout)
    margins = {}
    for n in sorted({max(1, round(f * len(train))) for f in CURVE_FRACTIONS} | {len(train)}):
        x = differences([train[i] for i in order[:n]])
        # each pair both ways round: a symmetric problem, no intercept (a tie scores 0)
        model = LogisticRegression(C=10.0, max_iter=3000, fit_intercept=False)
        model.fit(sparse.vstack([x, -x]), np.r_[np.ones(n), np.zeros(n)])
        margins[n] = model.decision_function(heldout_x)
    return margins
